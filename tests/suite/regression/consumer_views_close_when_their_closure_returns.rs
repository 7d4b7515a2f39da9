//! A consumer's views stop working the moment its closure returns, not
//! only once `consume` itself returns: the fence still works on the
//! consumer's stream after the closure (it records the reader's completion),
//! and a view's span, which is `Copy` and may be kept past the closure,
//! must be refused there, as it is after `consume` returned. A backend of
//! the program's own that uses such a span inside its `record_event` is
//! the code that runs in that window.

use crate::support::capture_view;
use std::sync::{Arc, Mutex};

use replay_arena::backend::{
    Allocate, ArenaDesc, Backend, Capture, GraphRejection, Launch, Streams, Temporaries,
};
use replay_arena::sim::{self, AsSpan, Span};
use replay_arena::{
    BackendError, DType, Discovering, Domain, Misuse, PlanConfig, Policy, Request, RunnerId,
};

const N: usize = 64;
const REQ: Request = Request::new(Domain::Device, DType::F32, N as u64);

/// What the hook saw: a span kept from a consumer's closure, and what
/// reading it gave at each event record that came after the closure
/// handed it over.
#[derive(Default)]
struct Kept {
    span: Option<Span>,
    into: Option<Span>,
    reads: Vec<Result<(), BackendError>>,
}

/// The `sim` model, with a hook in `record_event`: once the event is
/// recorded, it reads the kept span on the recording stream.
#[derive(Clone)]
struct Hooked {
    sim: sim::Device,
    kept: Arc<Mutex<Kept>>,
}

impl Streams for Hooked {
    type Event = sim::Event;
    type Stream = sim::Stream;

    fn create_event(&self) -> Result<sim::Event, BackendError> {
        self.sim.create_event()
    }

    fn stream_id(&self, stream: &sim::Stream) -> u64 {
        self.sim.stream_id(stream)
    }

    fn wait_event(&self, stream: &sim::Stream, event: &sim::Event) -> Result<(), BackendError> {
        self.sim.wait_event(stream, event)
    }

    fn record_event(&self, stream: &sim::Stream, event: &sim::Event) -> Result<(), BackendError> {
        self.sim.record_event(stream, event)?;
        let mut kept = self.kept.lock().unwrap();
        if let (Some(span), Some(into)) = (kept.span.take(), kept.into) {
            let read = self.sim.launch(stream, sim::Kernel::copy(&span, &into), 1);
            kept.reads.push(read);
        }
        Ok(())
    }

    fn synchronize_event(&self, event: &sim::Event) -> Result<(), BackendError> {
        self.sim.synchronize_event(event)
    }

    fn is_capturing(&self, stream: &sim::Stream) -> Result<bool, BackendError> {
        self.sim.is_capturing(stream)
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        Streams::synchronize(&self.sim)
    }
}

impl Allocate for Hooked {
    type Arena = sim::Arena;

    fn allocate_arena(&self, desc: &ArenaDesc) -> Result<sim::Arena, BackendError> {
        self.sim.allocate_arena(desc)
    }
}

impl Capture for Hooked {
    type Graph = sim::Graph;

    fn begin_capture(&self, stream: &sim::Stream) -> Result<(), BackendError> {
        self.sim.begin_capture(stream)
    }

    unsafe fn end_capture(&self, stream: &sim::Stream) -> Result<sim::Graph, BackendError> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.sim.end_capture(stream) }
    }

    unsafe fn abort_capture(&self, stream: &sim::Stream) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.sim.abort_capture(stream) }
    }

    fn record_event_node(
        &self,
        stream: &sim::Stream,
        event: &sim::Event,
    ) -> Result<(), BackendError> {
        self.sim.record_event_node(stream, event)
    }

    fn validate_graph(&self, graph: &sim::Graph) -> Result<(), GraphRejection> {
        self.sim.validate_graph(graph)
    }

    fn graph_temporaries(&self, graph: &sim::Graph) -> Result<Temporaries, BackendError> {
        self.sim.graph_temporaries(graph)
    }
}

impl Launch for Hooked {
    unsafe fn launch(&self, graph: &sim::Graph, stream: &sim::Stream) -> Result<(), BackendError> {
        // SAFETY: the caller's contract, passed on.
        unsafe { Launch::launch(&self.sim, graph, stream) }
    }
}

impl Backend for Hooked {
    fn name(&self) -> &'static str {
        "sim with a record hook"
    }
}

#[test]
fn a_span_kept_from_a_consumer_is_refused_once_its_closure_returned() {
    let sim = sim::Device::new();
    let hooked = Hooked {
        sim: sim.clone(),
        kept: Arc::default(),
    };
    let (pool, side) = (sim.new_stream(), sim.new_stream());
    let planned = Discovering::from_runners(PlanConfig::new(), [(RunnerId(0), [REQ])])
        .unwrap()
        .plan(Policy::Generations(1))
        .unwrap();
    let mut capturing = planned.allocate(hooked.clone()).unwrap();
    capture_view(&mut capturing, RunnerId(0), REQ, &pool, |s, view| {
        sim.launch(s, sim::Kernel::fill(&view, 2.0), 5)
    });
    let mut replayable = capturing.seal().unwrap();
    let out = sim.alloc_f32(N).unwrap();
    hooked.kept.lock().unwrap().into = Some(out.span());
    replayable.replay(RunnerId(0), &pool).unwrap();
    replayable
        .consume(RunnerId(0), &side, |s, v| {
            // Inside the closure the span works; it is kept for later.
            sim.launch(s, sim::Kernel::copy(&v[0], &out), 5)?;
            hooked.kept.lock().unwrap().span = Some(v[0].span());
            Ok::<(), BackendError>(())
        })
        .unwrap();
    let kept = std::mem::take(&mut *hooked.kept.lock().unwrap());
    // The consumer's completion was recorded after its closure returned,
    // and the span was refused there.
    assert_eq!(kept.reads.len(), 1, "no event record after the closure");
    match &kept.reads[0] {
        Err(BackendError::InvalidView {
            reason: Misuse::OutsideClosure { runner, .. },
        }) => assert_eq!(*runner, RunnerId(0)),
        other => panic!("the kept span worked after its closure returned: {other:?}"),
    }
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    assert_eq!(sim.read_f32(&out).unwrap(), vec![2.0; N]);
}
