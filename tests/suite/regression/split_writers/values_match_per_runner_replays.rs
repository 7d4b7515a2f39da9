//! Writers split at every ready point (two to four handoffs, with or
//! without temporaries, readers that hand on, readers scheduled first,
//! the writer twice in one step, subsets and reorders of ready points):
//! step graphs give the values of per-runner replays, with one node per
//! part. An attack that found no hole.

use replay_arena::sim;

use crate::support::attacks::{chained, replays};
use crate::support::faults::fan::{all, fan, fan_custom, identity, Item, Spec, N, W};
use crate::support::faults::{assert_nodes_inside_launches, R};

/// Runs `items` as a step graph `steps` times, with per-runner replays
/// of `items` before and after, and compares against a fan replayed per
/// runner alone.
fn check_step(spec: &Spec, items: &[Item], overlapping: bool, steps: usize) {
    check_step_primed(spec, &[], items, overlapping, steps)
}

/// `check_step` after `prime` replayed per runner.
fn check_step_primed(spec: &Spec, prime: &[Item], items: &[Item], overlapping: bool, steps: usize) {
    let streams: Vec<usize> = (0..steps).map(|i| i % spec.runners()).collect();
    let launches = Launches {
        prime,
        items,
        overlapping,
        streams: &streams,
    };
    launches.match_replays(spec, &identity(spec.k));
}

/// A kept step of `items` (overlapping or not) launched on each of
/// `streams` in turn, after `prime` and `items` replayed per runner and
/// before `items` replayed per runner again.
struct Launches<'a> {
    prime: &'a [Item],
    items: &'a [Item],
    overlapping: bool,
    streams: &'a [usize],
}

impl Launches<'_> {
    /// The launches on a fan of `spec` whose writer marks its ready points
    /// in `order` give the values of the same fan replayed per runner.
    fn match_replays(&self, spec: &Spec, order: &dyn Fn(usize) -> Vec<usize>) {
        let Launches {
            prime,
            items,
            overlapping,
            streams,
        } = *self;
        let mut reference = fan(spec, order);
        assert!(reference.errors.is_empty(), "{:?}", reference.errors);
        reference.per_runner(prime);
        for _ in 0..streams.len() + 2 {
            reference.per_runner(items);
        }
        let mut f = fan(spec, order);
        assert!(f.errors.is_empty(), "{:?}", f.errors);
        f.per_runner(prime);
        f.per_runner(items);
        let mut kept = f.build(items, overlapping).unwrap();
        let lanes = f.streams.clone();
        for &i in streams {
            f.r().launch_kept(&mut kept, &lanes[i]).unwrap();
        }
        f.per_runner(items);
        drop(kept);
        f.hazard_free();
        assert_eq!(
            f.values(),
            reference.values(),
            "spec k={} items {items:?} overlapping {overlapping}",
            spec.k
        );
        reference.teardown();
        f.teardown();
    }
}

/// Writers of two to four handoffs, each with and without a temporary
/// per part.
fn writers() -> Vec<Spec> {
    let mut specs = Vec::new();
    for k in 2..=4 {
        for temps in [false, true] {
            let mut spec = Spec::new(k);
            spec.writer_temps = temps;
            specs.push(spec);
        }
    }
    specs
}

#[test]
fn writers_of_two_to_four_handoffs_match_per_runner_replays() {
    for spec in writers() {
        check_step(&spec, &all(&spec), false, 5);
    }
}

#[test]
fn the_step_graph_has_one_node_per_part() {
    for spec in writers() {
        let (k, temps) = (spec.k, spec.writer_temps);
        let mut f = fan(&spec, &identity(k));
        let kept = f.build(&all(&spec), false).unwrap();
        // The writer in k + 1 parts and k readers.
        assert_eq!(kept.nodes(), (k + 1) + k, "k={k} temps={temps}");
        drop(kept);
        f.teardown();
    }
}

#[test]
fn readers_that_write_other_handoffs_and_readers_with_temporaries() {
    for k in 2..=4 {
        for reader_temps in [false, true] {
            let mut spec = chained(k, 1);
            spec.reader_temps = reader_temps;
            check_step(&spec, &all(&spec), false, 4);
        }
    }
}

#[test]
fn readers_scheduled_before_the_writer_and_on_shared_streams() {
    let spec = chained(3, 1);
    // Readers of later ready points scheduled first, sharing the
    // writer's stream and one another's.
    let items = replays(&[(0, 0), (3, 0), (2, 1), (1, 1), (4, 0)]);
    check_step_primed(&spec, &all(&spec), &items, false, 4);
    let items = replays(&[(0, 2), (3, 2), (1, 2), (4, 2), (2, 2)]);
    check_step(&spec, &items, false, 4);
}

#[test]
fn the_writer_replayed_twice_in_a_step() {
    for temps in [false, true] {
        let mut spec = chained(3, 2);
        spec.writer_temps = temps;
        let items = replays(&[(0, 0), (1, 1), (2, 2), (0, 3), (3, 3), (4, 4), (2, 0)]);
        check_step(&spec, &items, false, 3);
    }
}

#[test]
fn overlapping_step_graphs_of_split_writers() {
    for temps in [false, true] {
        for k in [2, 4] {
            let mut spec = chained(k, 2);
            spec.writer_temps = temps;
            check_step(&spec, &all(&spec), true, 6);
        }
    }
}

#[test]
fn consumers_of_the_split_writer() {
    for temps in [false, true] {
        for overlapping in [false, true] {
            let mut spec = Spec::new(3);
            spec.copies = 2;
            spec.g = 4;
            spec.writer_temps = temps;
            let mut items = all(&spec);
            items.insert(1, Item::Consume(0));
            items.push(Item::Consume(0));
            items.push(Item::Consume(2));
            check_step(&spec, &items, overlapping, 4);
        }
    }
}

#[test]
fn subsets_of_ready_points_match_per_runner_replays() {
    // The first run and copy mark the same subset of ready points: the
    // others' readers wait for the whole writer.
    for order in [vec![1], vec![2], vec![0, 2], vec![1, 2], vec![]] {
        let spec = Spec::new(3);
        let launches = Launches {
            prime: &[],
            items: &all(&spec),
            overlapping: false,
            streams: &[0, 1],
        };
        launches.match_replays(&spec, &move |_| order.clone());
    }
}

#[test]
fn a_reordered_but_consistent_ready_order_matches_per_runner_replays() {
    // Ready points in another order than the handoffs were declared.
    let spec = Spec::new(4);
    let launches = Launches {
        prime: &[],
        items: &all(&spec),
        overlapping: false,
        streams: &[4, 3, 2],
    };
    launches.match_replays(&spec, &|_| vec![3, 1, 0, 2]);
}

#[test]
fn kept_steps_and_per_runner_replays_interleaved_around_split_writers() {
    let spec = chained(3, 4);
    let items = all(&spec);
    let mut reference = fan(&spec, &identity(3));
    let mut f = fan(&spec, &identity(3));
    let mut a = f.build(&items, false).unwrap();
    let mut b = f.build(&items, true).unwrap();
    let mut c = f.build(&items, false).unwrap();
    let s = f.streams.clone();
    let mut n = 0;
    for round in 0..4 {
        f.r().launch_kept(&mut a, &s[round % 3]).unwrap();
        f.per_runner(&items);
        f.r().launch_kept(&mut b, &s[(round + 1) % 5]).unwrap();
        f.r().launch_kept(&mut c, &s[4]).unwrap();
        f.r().launch_kept(&mut b, &s[0]).unwrap();
        n += 5;
    }
    drop(b);
    // A trace around the rest.
    f.r().start_trace().unwrap();
    f.r().launch_kept(&mut a, &s[2]).unwrap();
    f.per_runner(&items);
    n += 2;
    let t = f.r().finish_trace().unwrap();
    assert_nodes_inside_launches(&t);
    drop(a);
    std::mem::forget(c);
    for _ in 0..n {
        reference.per_runner(&items);
    }
    f.hazard_free();
    assert_eq!(f.values(), reference.values());
    reference.teardown();
    let sim = f.sim.clone();
    f.r.take();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
}

/// A writer whose temporaries live in different parts: `a` across every
/// ready point, `b` between the first and the second, `c` after the last.
fn temps_across_parts(w: &W, s: &sim::Stream) -> R {
    let sim = w.sim;
    let a = sim.alloc_async(s, N)?;
    sim.launch(s, sim::Kernel::fill(&a, 1.0), 1)?;
    sim.launch(s, sim::Kernel::copy(&a, &w.xs[0]), 5)?;
    w.cap.ready(w.hs[0], s)?;
    let b = sim.alloc_async(s, N)?;
    sim.launch(s, sim::Kernel::copy(&a, &b), 5)?;
    sim.launch(s, sim::Kernel::scale(&b, 2.0), 5)?;
    sim.launch(s, sim::Kernel::copy(&b, &w.xs[1]), 5)?;
    sim.free_async(s, &b)?;
    w.cap.ready(w.hs[1], s)?;
    sim.launch(s, sim::Kernel::copy(&a, &w.xs[2]), 5)?;
    sim.launch(s, sim::Kernel::scale(&w.xs[2], 3.0), 5)?;
    w.cap.ready(w.hs[2], s)?;
    let c = sim.alloc_async(s, N)?;
    sim.launch(s, sim::Kernel::copy(&a, &c), 50)?;
    sim.free_async(s, &a)?;
    sim.launch(s, sim::Kernel::add(&c, w.own), 50)?;
    sim.free_async(s, &c)?;
    Ok(())
}

/// [`temps_across_parts`] without `a`: the first part's temporary is freed
/// before the first ready point, so none lives across one.
fn temps_within_parts(w: &W, s: &sim::Stream) -> R {
    let sim = w.sim;
    let a = sim.alloc_async(s, N)?;
    sim.launch(s, sim::Kernel::fill(&a, 1.0), 1)?;
    sim.launch(s, sim::Kernel::copy(&a, &w.xs[0]), 5)?;
    sim.free_async(s, &a)?;
    w.cap.ready(w.hs[0], s)?;
    let b = sim.alloc_async(s, N)?;
    sim.launch(s, sim::Kernel::fill(&b, 2.0), 5)?;
    sim.launch(s, sim::Kernel::scale(&b, 2.0), 5)?;
    sim.launch(s, sim::Kernel::copy(&b, &w.xs[1]), 5)?;
    sim.free_async(s, &b)?;
    w.cap.ready(w.hs[1], s)?;
    sim.launch(s, sim::Kernel::fill(&w.xs[2], 1.0), 5)?;
    sim.launch(s, sim::Kernel::scale(&w.xs[2], 3.0), 5)?;
    w.cap.ready(w.hs[2], s)?;
    let c = sim.alloc_async(s, N)?;
    sim.launch(s, sim::Kernel::fill(&c, 4.0), 50)?;
    sim.launch(s, sim::Kernel::add(&c, w.own), 50)?;
    sim.free_async(s, &c)?;
    Ok(())
}

#[test]
fn temporaries_living_in_different_parts_of_a_cut_copy() {
    // `a` lives across every ready point: the writer's copies stay whole
    // there (a cut would pass it from part to part, several times the
    // graph memory on CUDA); with it freed before the first, they are cut
    // at all three. Both match per-runner replays.
    for (writer, writer_nodes) in [
        (temps_across_parts as fn(&W, &sim::Stream) -> R, 1),
        (temps_within_parts, 4),
    ] {
        temporaries_in_parts(writer, writer_nodes);
    }
}

fn temporaries_in_parts(mut writer: fn(&W, &sim::Stream) -> R, writer_nodes: usize) {
    let spec = chained(3, 3);
    let items = all(&spec);
    let mut reference = fan_custom(&spec, &mut writer);
    assert!(reference.errors.is_empty(), "{:?}", reference.errors);
    let mut f = fan_custom(&spec, &mut writer);
    assert!(f.errors.is_empty(), "{:?}", f.errors);
    let mut plain = f.build(&items, false).unwrap();
    // The writer (whole, or in four parts), the readers, reader 0 cut at
    // its own ready point, and the collector.
    assert_eq!(plain.nodes(), writer_nodes + (2 + 1 + 1) + 1);
    let mut over = f.build(&items, true).unwrap();
    let s = f.streams.clone();
    for i in 0..3 {
        f.r().launch_kept(&mut plain, &s[i]).unwrap();
        f.per_runner(&items);
        f.r().launch_kept(&mut over, &s[4 - i]).unwrap();
        f.r().launch_kept(&mut over, &s[i]).unwrap();
    }
    drop(plain);
    drop(over);
    for _ in 0..12 {
        reference.per_runner(&items);
    }
    f.hazard_free();
    assert_eq!(f.values(), reference.values());
    reference.teardown();
    f.teardown();
}
