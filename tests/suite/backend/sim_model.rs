//! The `sim` backend as a reference model: its hazard detector finds the
//! first hazard of any schedule, as a detector that keeps every access would;
//! ops take effect in the order they end; its bookkeeping stays bounded
//! however long it runs; and it refuses what is not its own.

use crate::support::capture_view;
use crate::support::steps::allocate_discovered;
use proptest::prelude::*;
use replay_arena::backend::{Capture, Launch, Streams};
use replay_arena::sim::{self, AsSpan, Span};
use replay_arena::{
    BackendError, DType, Discovering, Domain, PlanConfig, Policy, ReplayError, Replayable, Request,
    RunnerId,
};

const STREAMS: usize = 3;
const EVENTS: usize = 3;
const BUFFERS: usize = 3;
const LEN: usize = 16;

/// `len` elements at element `offset` of buffer `buffer`.
#[derive(Clone, Copy, Debug)]
struct Region {
    buffer: usize,
    offset: usize,
    len: usize,
}

impl Region {
    fn overlaps(&self, other: &Region) -> bool {
        self.buffer == other.buffer
            && self.offset < other.offset + other.len
            && other.offset < self.offset + self.len
    }

    fn span(&self, buffers: &[sim::HostBuffer]) -> Span {
        let base = buffers[self.buffer].span();
        Span::new(base.addr() + 4 * self.offset as u64, self.len)
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Fill(Region, f32),
    Copy(Region, Region),
    Add(Region, Region),
    Scale(Region),
}

impl Op {
    /// (region, written?) for every region the op touches.
    fn accesses(&self) -> Vec<(Region, bool)> {
        match *self {
            Op::Fill(dst, _) | Op::Scale(dst) => vec![(dst, true)],
            Op::Copy(src, dst) | Op::Add(src, dst) => vec![(src, false), (dst, true)],
        }
    }

    fn sim(&self, buffers: &[sim::HostBuffer]) -> sim::Kernel {
        match *self {
            Op::Fill(dst, value) => sim::Kernel::fill(&dst.span(buffers), value),
            Op::Copy(src, dst) => sim::Kernel::copy(&src.span(buffers), &dst.span(buffers)),
            Op::Add(src, dst) => sim::Kernel::add(&src.span(buffers), &dst.span(buffers)),
            Op::Scale(dst) => sim::Kernel::scale(&dst.span(buffers), 2.0),
        }
    }

    /// Applies the op to host copies of the buffers.
    fn apply(&self, data: &mut [Vec<f32>]) {
        let mut binary = |src: Region, dst: Region, f: &dyn Fn(f32, f32) -> f32| {
            let n = src.len.min(dst.len);
            let s: Vec<f32> = data[src.buffer][src.offset..src.offset + n].to_vec();
            for (i, &x) in s.iter().enumerate() {
                let d = &mut data[dst.buffer][dst.offset + i];
                *d = f(*d, x);
            }
        };
        match *self {
            Op::Fill(dst, value) => binary(dst, dst, &|_, _| value),
            Op::Copy(src, dst) => binary(src, dst, &|_, s| s),
            Op::Add(src, dst) => binary(src, dst, &|d, s| d + s),
            Op::Scale(dst) => binary(dst, dst, &|d, _| d * 2.0),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Act {
    Launch {
        stream: usize,
        op: Op,
        duration: u64,
    },
    Record {
        stream: usize,
        event: usize,
    },
    Wait {
        stream: usize,
        event: usize,
    },
    Synchronize,
}

fn region() -> impl Strategy<Value = Region> {
    (0..BUFFERS, 0..LEN).prop_flat_map(|(buffer, offset)| {
        (1..=LEN - offset).prop_map(move |len| Region {
            buffer,
            offset,
            len,
        })
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (region(), 1u8..8).prop_map(|(r, v)| Op::Fill(r, f32::from(v))),
        (region(), region()).prop_map(|(s, d)| Op::Copy(s, d)),
        (region(), region()).prop_map(|(s, d)| Op::Add(s, d)),
        region().prop_map(Op::Scale),
    ]
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        6 => (0..STREAMS, op(), 0u64..20).prop_map(|(stream, op, duration)| Act::Launch { stream, op, duration }),
        2 => (0..STREAMS, 0..EVENTS).prop_map(|(stream, event)| Act::Record { stream, event }),
        2 => (0..STREAMS, 0..EVENTS).prop_map(|(stream, event)| Act::Wait { stream, event }),
        1 => Just(Act::Synchronize),
    ]
}

/// The reference: vector clocks, every access since the last synchronize,
/// ops applied in (end, submission) order at synchronize.
#[derive(Default)]
struct Reference {
    tails: [u64; STREAMS],
    clocks: [[u64; STREAMS]; STREAMS],
    events: [(u64, [u64; STREAMS]); EVENTS],
    /// (region, written?, stream, sequence number on that stream).
    history: Vec<(Region, bool, usize, u64)>,
    pending: Vec<(u64, usize, Op)>,
    submitted: usize,
    data: Vec<Vec<f32>>,
}

impl Reference {
    /// Submits an op; returns the (stream, wrote?) of every earlier access
    /// it is unordered with.
    fn launch(&mut self, stream: usize, op: Op, duration: u64) -> Vec<(usize, bool)> {
        self.tails[stream] += duration;
        self.clocks[stream][stream] += 1;
        let clock = self.clocks[stream];
        let mut unordered = Vec::new();
        for (region, write) in op.accesses() {
            for &(r, w, s, seq) in &self.history {
                if clock[s] < seq && (w || write) && r.overlaps(&region) {
                    unordered.push((s, w));
                }
            }
            self.history.push((region, write, stream, clock[stream]));
        }
        self.pending.push((self.tails[stream], self.submitted, op));
        self.submitted += 1;
        unordered
    }

    fn synchronize(&mut self) {
        let mut pending = std::mem::take(&mut self.pending);
        pending.sort_by_key(|&(end, order, _)| (end, order));
        for (_, _, op) in pending {
            op.apply(&mut self.data);
        }
        let now = self.tails.iter().copied().max().unwrap_or(0);
        let mut all = [0; STREAMS];
        for clock in &self.clocks {
            for (a, &b) in all.iter_mut().zip(clock) {
                *a = (*a).max(b);
            }
        }
        self.tails = [now; STREAMS];
        self.clocks = [all; STREAMS];
        self.history.clear();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The shadow-memory detector reports its first hazard at the op where
    /// a detector keeping every access finds its first, with accesses that
    /// one finds too; and the data match ops applied in the order they end.
    #[test]
    fn the_detector_and_the_data_match_a_full_history_model(
        acts in prop::collection::vec(act(), 1..80),
    ) {
        let sim = sim::Device::new();
        let streams: Vec<sim::Stream> = (0..STREAMS).map(|_| sim.new_stream()).collect();
        let events: Vec<_> = (0..EVENTS).map(|_| sim.create_event().unwrap()).collect();
        let buffers: Vec<sim::HostBuffer> = (0..BUFFERS).map(|_| sim.alloc_f32(LEN).unwrap()).collect();
        let mut model = Reference { data: vec![vec![0.0; LEN]; BUFFERS], ..Reference::default() };
        let mut first_seen = false;
        for (i, act) in acts.iter().enumerate() {
            match *act {
                Act::Launch { stream, op, duration } => {
                    sim.launch(&streams[stream], op.sim(&buffers), duration).unwrap();
                    let expected = model.launch(stream, op, duration);
                    let reported = sim.hazards();
                    if !first_seen {
                        prop_assert_eq!(
                            reported.is_empty(), expected.is_empty(),
                            "act {}: sim reported {:?}, the full history {:?}", i, reported, expected
                        );
                        for h in &reported {
                            prop_assert_eq!(h.second_stream, stream);
                            prop_assert!(expected.contains(&(h.first_stream, h.first_writes)), "act {}: {:?} not in {:?}", i, h, expected);
                        }
                        first_seen = !reported.is_empty();
                    }
                }
                Act::Record { stream, event } => {
                    sim.record_event(&streams[stream], &events[event]).unwrap();
                    model.events[event] = (model.tails[stream], model.clocks[stream]);
                }
                Act::Wait { stream, event } => {
                    sim.wait_event(&streams[stream], &events[event]).unwrap();
                    let (time, clock) = model.events[event];
                    model.tails[stream] = model.tails[stream].max(time);
                    for (a, b) in model.clocks[stream].iter_mut().zip(clock) {
                        *a = (*a).max(b);
                    }
                }
                Act::Synchronize => {
                    sim.synchronize().unwrap();
                    model.synchronize();
                }
            }
        }
        model.synchronize();
        for (b, buffer) in buffers.iter().enumerate() {
            prop_assert_eq!(sim.read_f32(buffer).unwrap(), model.data[b].clone());
        }
    }
}

/// Four runners, `G = 2`, captured to fill their view.
fn four_runners(sim: &sim::Device, stream: &sim::Stream) -> Replayable<sim::Device> {
    let req = Request::new(Domain::Device, DType::F32, 64);
    let mut discovery = Discovering::new(PlanConfig::new());
    for r in 0..4 {
        discovery.arm(RunnerId(r)).unwrap().record(req).unwrap();
    }
    let mut capturing = allocate_discovered(sim, discovery, Policy::Generations(2));
    for r in 0..4 {
        capture_view(&mut capturing, RunnerId(r), req, stream, |s, view| {
            sim.launch(s, sim::Kernel::fill(&view, r as f32), 3)
        });
    }
    capturing.seal().unwrap()
}

#[test]
fn streams_that_never_wait_for_each_other_keep_the_detector_bounded() {
    // Generation 0 (runners 0 and 2) replays on stream 0, generation 1 on
    // stream 1: every wait is implied by stream order, so neither stream is
    // ever ordered after the other's work, and nothing is ever synchronized.
    let sim = sim::Device::new();
    let streams = [sim.new_stream(), sim.new_stream()];
    let mut replayable = four_runners(&sim, &streams[0]);
    for _step in 0..20_000 {
        for r in 0..4u32 {
            replayable
                .replay(RunnerId(r), &streams[r as usize % 2])
                .unwrap();
        }
    }
    assert_eq!(replayable.fence_stats().waits, 0);
    assert!(sim.hazards().is_empty());
    let (intervals, pending, _) = sim.bookkeeping();
    // A full access history would hold 80,000 entries here.
    assert!(intervals <= 8, "{intervals} shadow intervals");
    assert!(pending <= 512, "{pending} ops pending");
}

#[test]
fn replan_rounds_free_every_event_and_arena() {
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    for _round in 0..2_000 {
        let mut replayable = four_runners(&sim, &stream);
        for r in 0..4 {
            replayable.replay(RunnerId(r), &stream).unwrap();
        }
        assert_eq!(sim.live_events(), 4);
        drop(replayable.replan().unwrap());
        assert_eq!(sim.live_events(), 0);
        assert_eq!(sim.live_allocations(), 0);
    }
    let (intervals, pending, event_slots) = sim.bookkeeping();
    assert!(
        event_slots <= 4,
        "{event_slots} event slots after 2,000 rounds"
    );
    assert_eq!((intervals, pending), (0, 0));
}

#[test]
fn dropping_an_event_frees_its_slot() {
    let sim = sim::Device::new();
    for _ in 0..10_000 {
        let event = sim.create_event().unwrap();
        assert_eq!(sim.live_events(), 1);
        drop(event);
    }
    assert_eq!(sim.live_events(), 0);
    assert_eq!(sim.bookkeeping().2, 1);
}

fn assert_refused<T: std::fmt::Debug>(result: Result<T, BackendError>, reason: &str) {
    match result {
        Err(BackendError::Refused { reason: r, .. }) => {
            assert!(r.contains(reason), "refused for {r:?}, expected {reason:?}")
        }
        other => panic!("expected a refusal ({reason}), got {other:?}"),
    }
}

#[test]
fn a_span_whose_byte_length_overflows_is_refused_at_launch() {
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let buffer = sim.alloc_f32(16).unwrap();
    // 4 * len overflows 64 bits.
    let huge = Span::new(buffer.span().addr(), usize::MAX);
    assert_refused(
        sim.launch(&stream, sim::Kernel::fill(&huge, 1.0), 1),
        "outside",
    );
    assert_refused(sim.read_f32(&huge), "outside");
    assert_refused(sim.write_f32(&huge, &[1.0]), "outside");
}

#[test]
fn a_span_whose_end_wraps_around_the_address_space_is_refused_at_launch() {
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let buffer = sim.alloc_f32(16).unwrap();
    // 4 * len fits in 64 bits, but addr + 4 * len wraps to just below addr.
    let wrapping = Span::new(buffer.span().addr(), (u64::MAX / 4) as usize);
    assert_refused(
        sim.launch(&stream, sim::Kernel::copy(&buffer, &wrapping), 1),
        "outside",
    );
    assert_refused(sim.read_f32(&wrapping), "outside");
    assert_eq!(sim.read_f32(&buffer).unwrap(), vec![0.0; 16]);
}

#[test]
fn a_stream_of_another_backend_with_an_index_that_exists_here_is_refused() {
    let sim = sim::Device::new();
    let other = sim::Device::new();
    let _ours = [sim.new_stream(), sim.new_stream()];
    let theirs = other.new_stream(); // index 0, which `sim` has too
    let buffer = sim.alloc_f32(4).unwrap();
    let graph = {
        let s = sim.new_stream();
        sim.begin_capture(&s).unwrap();
        sim.launch(&s, sim::Kernel::fill(&buffer, 1.0), 1).unwrap();
        // SAFETY: the capture this test began.
        unsafe { sim.end_capture(&s) }.unwrap()
    };
    let event = sim.create_event().unwrap();
    let foreign = "stream belongs to another sim::Device";
    assert_refused(
        sim.launch(&theirs, sim::Kernel::fill(&buffer, 2.0), 1),
        foreign,
    );
    // SAFETY: the graph writes a buffer of the program's, used by nothing else.
    assert_refused(unsafe { Launch::launch(&sim, &graph, &theirs) }, foreign);
    assert_refused(sim.wait_event(&theirs, &event), foreign);
    assert_refused(sim.record_event(&theirs, &event), foreign);
    assert_refused(sim.begin_capture(&theirs), foreign);
    // SAFETY: refused before anything ends.
    assert_refused(unsafe { sim.end_capture(&theirs) }, foreign);
    assert_eq!(sim.read_f32(&buffer).unwrap(), vec![0.0; 4]);
    assert_eq!(other.makespan(), 0);
}

#[test]
fn an_event_of_another_backend_is_refused() {
    let sim = sim::Device::new();
    let other = sim::Device::new();
    let stream = sim.new_stream();
    let theirs = other.create_event().unwrap();
    let foreign = "event belongs to another sim::Device";
    assert_refused(sim.wait_event(&stream, &theirs), foreign);
    assert_refused(sim.record_event(&stream, &theirs), foreign);
    assert_refused(sim.synchronize_event(&theirs), foreign);
}

#[test]
fn a_replay_on_a_stream_of_another_backend_is_a_backend_error() {
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let mut replayable = four_runners(&sim, &stream);
    let theirs = sim::Device::new().new_stream();
    match replayable.replay(RunnerId(0), &theirs) {
        Err(ReplayError::Backend(replay_arena::BackendFailure {
            runner: Some(runner),
            error: BackendError::Refused { reason, .. },
            ..
        })) => {
            assert_eq!(runner, RunnerId(0));
            assert!(reason.contains("another sim::Device"), "{reason}");
        }
        other => panic!("expected a refused replay, got {other:?}"),
    }
    assert_eq!(sim.makespan(), 0);
}

#[test]
fn streams_of_one_backend_are_equal_only_to_their_clones() {
    let sim = sim::Device::new();
    let a = sim.new_stream();
    let b = sim.new_stream();
    assert_eq!(a, a.clone());
    assert_ne!(a, b);
    assert_ne!(a, sim::Device::new().new_stream());
}

#[test]
fn ops_take_effect_in_the_order_they_end_even_when_applied_early() {
    let sim = sim::Device::new();
    let (slow, fast) = (sim.new_stream(), sim.new_stream());
    let buffer = sim.alloc_f32(4).unwrap();
    let other = sim.alloc_f32(4).unwrap();
    // The slow fill is submitted first but ends last: it wins.
    sim.launch(&slow, sim::Kernel::fill(&buffer, 1.0), 100)
        .unwrap();
    sim.launch(&fast, sim::Kernel::fill(&buffer, 2.0), 10)
        .unwrap();
    // Both streams move far past both ends, with no synchronize: the fills
    // are settled and applied while the streams run on.
    for _ in 0..1_000 {
        sim.launch(&fast, sim::Kernel::scale(&other, 1.0), 10)
            .unwrap();
        sim.launch(&slow, sim::Kernel::scale(&other, 1.0), 10)
            .unwrap();
    }
    let pending = sim.bookkeeping().1;
    assert!(pending <= 512, "{pending} ops pending");
    assert_eq!(sim.read_f32(&buffer).unwrap(), vec![1.0; 4]);
}

#[test]
fn a_step_node_that_depends_on_a_later_node_is_refused_and_its_graphs_kept() {
    use replay_arena::backend::{Compose, NodeGraph, StepNode};
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let mut r = four_runners(&sim, &stream);
    let (g0, g1) = (r.graph(RunnerId(0)).unwrap(), r.graph(RunnerId(1)).unwrap());
    // Node 0 after node 1, and a node after itself.
    let later = sim.compose(
        vec![
            StepNode::new(NodeGraph::Copy(g0), &[1], 0),
            StepNode::new(NodeGraph::Copy(g1), &[], 1),
        ],
        None,
    );
    assert_refused(later, "not before it");
    let itself = sim.compose(vec![StepNode::new(NodeGraph::Copy(g0), &[0], 0)], None);
    assert_refused(itself, "not before it");
    // The copied graphs are the plan's still: the runners replay.
    for k in 0..4 {
        r.replay(RunnerId(k), &stream).unwrap();
    }
    sim.synchronize().unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
}
