//! Faults while capturing, building and launching split writers: a fault
//! at each `BeginCapture`, `EndCapture` and every call of the writer's
//! capture, a fault at each call of building and launching its step
//! graphs, and seeded faults over whole programs. Guards that the writer
//! fails typed (no stream left capturing, nothing leaked) or works as the
//! reference, and that no library code panics. An attack that found no
//! hole.

use std::panic::{catch_unwind, AssertUnwindSafe};

use replay_arena::sim::{self, Call, Faults};
use replay_arena::RunnerId;

use crate::support::attacks::{assert_hazard_free, chained};
use crate::support::faults::fan::{all, fan, fan_faulty, fan_with, identity, Fan, Item};

/// Faults at every `call` of the writer's capture: either the writer
/// fails (typed, stream left capturing never, nothing leaked) or the plan
/// works as the reference.
fn fault_at_cuts(call: Option<Call>) {
    let spec = chained(3, 2);
    let items = all(&spec);
    let mut reference = fan(&spec, &identity(3));
    for _ in 0..4 {
        reference.per_runner(&items);
    }
    let expected = reference.values();
    reference.teardown();
    let max = if call.is_some() { 12 } else { 80 };
    let mut failures = 0;
    for n in 0..max {
        let faults = match call {
            Some(c) => Faults::nth(c, n),
            None => Faults::at(n),
        };
        let sim = sim::Device::new();
        let res = catch_unwind(AssertUnwindSafe(|| {
            fan_faulty(sim.clone(), &spec, &identity(3), Some(faults))
        }));
        let mut f = res.unwrap_or_else(|_| panic!("panic at {call:?} {n}"));
        if f.r.is_some() {
            f.per_runner(&items);
            let mut kept = f.build(&items, false).unwrap();
            let mut kept2 = f.build(&items, false).unwrap();
            let s = f.streams.clone();
            f.r().launch_kept(&mut kept, &s[1]).unwrap();
            f.r().launch_kept(&mut kept2, &s[2]).unwrap();
            drop(kept);
            std::mem::forget(kept2);
            f.per_runner(&items);
            f.hazard_free();
            assert_eq!(f.values(), expected, "{call:?} {n}");
            // A forgotten kept step may keep its graph memory: check
            // hazards only.
            let sim = f.sim.clone();
            f.r.take();
            assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
        } else {
            failures += 1;
            assert!(
                f.errors.iter().any(|e| e.contains("injected")),
                "{call:?} {n}: {:?}",
                f.errors
            );
            f.teardown();
        }
    }
    assert!(failures > 0, "{call:?}: no fault hit");
}

#[test]
fn a_fault_at_each_end_capture_of_the_cut_writer() {
    fault_at_cuts(Some(Call::EndCapture));
}

#[test]
fn a_fault_at_each_begin_capture_of_the_cut_writer() {
    fault_at_cuts(Some(Call::BeginCapture));
}

#[test]
fn a_fault_at_every_call_of_the_cut_writers_capture() {
    fault_at_cuts(None);
}

/// Builds `items` (overlapping or not) into a kept step and launches it
/// on the first `launches` streams; every error goes to `errs`.
fn build_and_launch(
    f: &mut Fan,
    items: &[Item],
    overlapping: bool,
    launches: usize,
    errs: &mut Vec<String>,
) {
    let s = f.streams.clone();
    match f.build(items, overlapping) {
        Ok(mut k) => {
            for stream in &s[..launches] {
                if let Err(e) = f.r().launch_kept(&mut k, stream) {
                    errs.push(e.to_string());
                }
            }
        }
        Err(e) => errs.push(e.to_string()),
    }
}

#[test]
fn a_fault_at_every_call_of_building_and_launching_cut_step_graphs() {
    let spec = chained(3, 3);
    let items = all(&spec);
    let program = |f: &mut Fan| -> Vec<String> {
        let mut errs = Vec::new();
        let s = f.streams.clone();
        build_and_launch(f, &items, false, 2, &mut errs);
        build_and_launch(f, &items, true, 3, &mut errs);
        for it in &items {
            if let Item::Replay(r, st) = *it {
                if let Err(e) = f.r().replay(RunnerId(r), &s[st]) {
                    errs.push(e.to_string());
                }
            }
        }
        errs
    };
    let mut probe = fan(&spec, &identity(3));
    probe.sim.inject(Faults::none());
    assert!(program(&mut probe).is_empty());
    let calls = probe.sim.fault_log().calls;
    probe.sim.inject(Faults::none());
    probe.teardown();
    assert!(calls > 20, "{calls}");
    for n in 0..calls {
        let mut f = fan(&spec, &identity(3));
        f.sim.inject(Faults::at(n));
        let res = catch_unwind(AssertUnwindSafe(|| program(&mut f)));
        let inj = f.sim.fault_log().injected.clone();
        f.sim.inject(Faults::none());
        assert!(res.is_ok(), "panic in library, fault at {n}: {inj:?}");
        assert_hazard_free(&f.sim, format!("fault at {n} {inj:?}"));
        // The plan goes on after the fault.
        let _ = program(&mut f);
        let _ = f.r().synchronize();
        assert_hazard_free(&f.sim, format!("after fault at {n} {inj:?}"));
        f.teardown();
    }
}

#[test]
fn seeded_faults_over_whole_programs_of_split_writers() {
    let mut spec = chained(3, 3);
    spec.reader_temps = true;
    spec.g = 3;
    let mut items = all(&spec);
    items.push(Item::Consume(0));
    // Writers with a temporary per part make more backend calls, so more
    // of the seeded programs fail before they seal: 160 seeds.
    for seed in 0..160u64 {
        let sim = sim::Device::new();
        let res = catch_unwind(AssertUnwindSafe(|| {
            let mut f = fan_with(
                sim.clone(),
                &spec,
                &identity(3),
                Some(Faults::seeded(seed, 40)),
                None,
            );
            sim.inject(Faults::seeded(seed.wrapping_mul(31), 25));
            if f.r.is_some() {
                SEALED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let s = f.streams.clone();
                for overlapping in [false, true, false] {
                    if let Ok(mut k) = f.try_build(&items, overlapping) {
                        for i in 0..3 {
                            let _ = f.r().launch_kept(&mut k, &s[i]);
                        }
                        if overlapping {
                            std::mem::forget(k);
                        }
                    }
                    for it in &items {
                        if let Item::Replay(r, st) = *it {
                            let _ = f.r().replay(RunnerId(r), &s[st]);
                        }
                    }
                }
                let _ = f.r().synchronize();
            }
            sim.inject(Faults::none());
            f
        }));
        let f = res.unwrap_or_else(|_| panic!("panic in library, seed {seed}"));
        assert!(sim.hazards().is_empty(), "seed {seed}: {:?}", sim.hazards());
        drop(f);
        assert!(sim.hazards().is_empty(), "seed {seed}: {:?}", sim.hazards());
    }
    let sealed = SEALED.load(std::sync::atomic::Ordering::Relaxed);
    assert!(sealed > 5, "only {sealed} programs ran");
}

static SEALED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
