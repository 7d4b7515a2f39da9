//! The three workloads the sixth hostile review found growing in square
//! time, at 100,000 entries each: discovery and planning must stay near
//! linear. No test asserts on time; a quadratic regression makes each of
//! them take minutes instead of a fraction of a second (the timed figures
//! are `cargo bench --bench planner -- review`, in docs/BENCHMARKS.md).

use replay_arena::{
    DType, Discovering, Domain, HandoffId, PlanConfig, Planned, Policy, Request, RunnerId,
};

/// Entries in each workload.
const N: u32 = 100_000;

fn small() -> Request {
    Request::new(Domain::Device, DType::F32, 64)
}

/// `n` runners, each with a small buffer of its own and a handoff of 512
/// bytes that the last runner reads, so every handoff is live at once;
/// runner 0 also hands off 256 bytes that runner 1 reads, which leaves a
/// gap at the bottom of the arena that no later handoff fits in.
fn fragmented_handoffs(n: u32) -> Discovering {
    let mut d = Discovering::new(PlanConfig::new());
    let long = Request::new(Domain::Device, DType::BF16, 256);
    let short = Request::new(Domain::Device, DType::BF16, 128);
    let mut held: Vec<HandoffId> = Vec::with_capacity(n as usize);
    let mut brief = None;
    for r in 0..n {
        let mut armed = d.arm(RunnerId(r)).unwrap();
        armed.record(small()).unwrap();
        if r == 0 {
            brief = Some(armed.hand_off(short).unwrap());
        }
        if r == 1 {
            armed.receive(brief.unwrap()).unwrap();
        }
        if r + 1 < n {
            held.push(armed.hand_off(long).unwrap());
        } else {
            for &h in &held {
                armed.receive(h).unwrap();
            }
        }
    }
    d
}

/// `n` shape buckets of one runner each, every name distinct.
fn many_buckets(n: u32) -> Discovering {
    let mut d = Discovering::new(PlanConfig::new());
    for r in 0..n {
        d.bucket(format!("bucket{r}")).unwrap();
        d.arm(RunnerId(r)).unwrap().record(small()).unwrap();
    }
    d
}

/// One handoff that runner 0 writes and the `n` runners after it read.
fn many_readers(n: u32) -> Discovering {
    let mut d = Discovering::new(PlanConfig::new());
    let grad = Request::new(Domain::Device, DType::BF16, 4096);
    let h = {
        let mut armed = d.arm(RunnerId(0)).unwrap();
        armed.record(small()).unwrap();
        armed.hand_off(grad).unwrap()
    };
    for r in 1..=n {
        let mut armed = d.arm(RunnerId(r)).unwrap();
        armed.record(small()).unwrap();
        armed.receive(h).unwrap();
    }
    d
}

/// `d` planned at two generations, round-robin and packed.
fn round_robin_and_packed(d: &Discovering) -> [Planned; 2] {
    [
        Policy::Generations(2).round_robin(),
        Policy::Generations(2).packed(),
    ]
    .map(|policy| d.clone().plan(policy).unwrap())
}

#[test]
fn a_hundred_thousand_handoffs_live_at_once_above_a_low_gap_are_planned() {
    let d = fragmented_handoffs(N);
    for planned in round_robin_and_packed(&d) {
        assert_eq!(planned.handoffs().count(), N as usize);
    }
}

#[test]
fn a_hundred_thousand_buckets_are_declared_and_planned() {
    let d = many_buckets(N);
    assert_eq!(d.buckets().count(), N as usize);
    let mut again = d.clone();
    assert!(again.bucket("bucket77").is_err());
    for planned in round_robin_and_packed(&d) {
        assert_eq!(planned.buckets().count(), N as usize);
    }
}

#[test]
fn a_handoff_with_a_hundred_thousand_readers_is_planned() {
    let d = many_readers(N);
    let (_, _, _, readers) = d.handoffs().next().unwrap();
    assert_eq!(readers.len(), N as usize);
    for planned in round_robin_and_packed(&d) {
        assert_eq!(planned.handoffs().count(), 1);
    }
}
