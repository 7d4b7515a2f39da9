//! Phase 3: [`Capturing`]. Arenas exist; each runner's capture hands out
//! fixed-address views by bump allocation and must consume exactly what
//! discovery recorded.

use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;

use crate::backend::{Arena, Backend};
use crate::discover::Discovering;
use crate::error::{Error, Result};
use crate::plan::Planned;
use crate::replay::Replayable;
use crate::vocab::{DType, Domain, Key, Request, RunnerId};

/// Makes a type `!Send` and `!Sync` without naming a backend's types.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct NotSend(PhantomData<*const ()>);

/// Where a runner's capture stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CaptureState {
    NotCaptured,
    Finished,
    Failed(String),
}

impl fmt::Display for CaptureState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaptureState::NotCaptured => f.write_str("was never captured"),
            CaptureState::Finished => f.write_str("finished"),
            CaptureState::Failed(reason) => write!(f, "failed: {reason}"),
        }
    }
}

/// What a plan owns on a backend. Dropping it synchronizes, then frees graphs
/// first, then events, then arenas (field order).
pub(crate) struct Resources<B: Backend> {
    pub(crate) graphs: Vec<Option<B::Graph>>,
    pub(crate) events: Vec<B::Event>,
    pub(crate) arenas: Vec<B::Arena>,
    pub(crate) backend: B,
}

impl<B: Backend> Resources<B> {
    /// Synchronizes, frees everything, and starts discovery again with the
    /// plan's config. Everything is freed even when synchronizing fails.
    pub(crate) fn release(self, plan: Planned) -> Result<Discovering> {
        let synced = self.backend.synchronize();
        drop(self);
        synced.map(|()| Discovering::new(plan.config))
    }
}

impl<B: Backend> Drop for Resources<B> {
    fn drop(&mut self) {
        // Nothing may be freed while work that uses it is in flight. A failed
        // synchronize (a sticky device error) leaves nothing to wait for.
        let _ = self.backend.synchronize();
    }
}

/// Phase 3 of 4: arenas are allocated; runners are captured one at a time.
///
/// Only one [`RunnerCapture`] can be open at once (it borrows the
/// `Capturing` mutably), and [`Capturing::seal`] cannot be called while one
/// is open:
///
/// ```compile_fail
/// use replay_arena::{Discovering, PlanConfig, Policy, RunnerId, sim::SimBackend};
/// let planned = Discovering::new(PlanConfig::new()).plan(Policy::Generations(1)).unwrap();
/// let mut capturing = planned.allocate(SimBackend::new()).unwrap();
/// let cap = capturing.capture(RunnerId(0)).unwrap();
/// let replayable = capturing.seal(); // `capturing` is still borrowed by `cap`
/// drop(cap);
/// ```
pub struct Capturing<B: Backend> {
    pub(crate) plan: Planned,
    pub(crate) states: Vec<CaptureState>,
    pub(crate) res: Resources<B>,
}

impl<B: Backend> fmt::Debug for Capturing<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Capturing")
            .field("backend", &self.res.backend.name())
            .field("runners", &self.plan.runners.len())
            .field(
                "captured",
                &self
                    .states
                    .iter()
                    .filter(|s| **s == CaptureState::Finished)
                    .count(),
            )
            .finish_non_exhaustive()
    }
}

impl<B: Backend> fmt::Debug for RunnerCapture<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunnerCapture")
            .field("runner", &self.runner())
            .field("next_request", &self.cursor.borrow().next)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Capturing<B> {
    pub(crate) fn new(plan: Planned, backend: B) -> Result<Capturing<B>> {
        let mut res = Resources {
            graphs: Vec::new(),
            events: Vec::new(),
            arenas: Vec::with_capacity(plan.arenas.len()),
            backend,
        };
        // On any error below, `res` drops and frees what was allocated.
        for a in &plan.arenas {
            res.arenas.push(res.backend.allocate_arena(a)?);
        }
        for r in &plan.runners {
            if r.position.is_some() {
                res.events.push(res.backend.create_event()?);
            }
        }
        res.graphs = plan.runners.iter().map(|_| None).collect();
        Ok(Capturing {
            states: vec![CaptureState::NotCaptured; plan.runners.len()],
            plan,
            res,
        })
    }

    /// The plan.
    pub fn plan(&self) -> &Planned {
        &self.plan
    }

    /// The backend, to submit work while capturing.
    pub fn backend(&self) -> &B {
        &self.res.backend
    }

    /// Opens `runner`'s capture. Each runner is captured once.
    pub fn capture(&mut self, runner: RunnerId) -> Result<RunnerCapture<'_, B>> {
        let index = self
            .plan
            .runner_index(runner)
            .ok_or(Error::UnknownRunner { runner })?;
        if self.states[index] != CaptureState::NotCaptured {
            return Err(Error::AlreadyCaptured {
                runner,
                state: self.states[index].to_string(),
            });
        }
        let slices = self.plan.runners[index].slices.len();
        Ok(RunnerCapture {
            owner: self,
            index,
            cursor: RefCell::new(Cursor {
                next: 0,
                consumed: vec![0; slices],
            }),
            failure: RefCell::new(None),
            closed: false,
            _not_send: NotSend::default(),
        })
    }

    /// Ends capture: succeeds only when every buffer-using runner's capture
    /// finished. On error everything is synchronized and freed.
    pub fn seal(self) -> Result<Replayable<B>> {
        let unfinished: Vec<(RunnerId, String)> = self
            .plan
            .runners
            .iter()
            .zip(&self.states)
            .filter(|(r, s)| match s {
                CaptureState::Finished => false,
                CaptureState::Failed(_) => true,
                CaptureState::NotCaptured => r.position.is_some(),
            })
            .map(|(r, s)| (r.id(), s.to_string()))
            .collect();
        if !unfinished.is_empty() {
            return Err(Error::Unfinished {
                runners: unfinished,
            });
        }
        Ok(Replayable::new(self.plan, self.res))
    }

    /// Gives up on this plan (after a failed capture, say): synchronizes,
    /// frees everything, and returns a fresh discovery with the same config.
    pub fn replan(self) -> Result<Discovering> {
        let Capturing { plan, res, .. } = self;
        res.release(plan)
    }
}

struct Cursor {
    /// Index of the next request.
    next: usize,
    /// Bytes consumed per slice of the runner.
    consumed: Vec<u64>,
}

/// One runner's open capture. Views borrow it, so they cannot outlive it;
/// [`RunnerCapture::finish`] checks exact consumption and hands the graph to
/// the plan. Dropping it unfinished marks the runner failed.
///
/// A view cannot be used after its capture closed:
///
/// ```compile_fail
/// use replay_arena::{Discovering, PlanConfig, Policy, Request, Domain, DType, RunnerId, sim::SimBackend};
/// let mut d = Discovering::new(PlanConfig::new());
/// d.arm(RunnerId(0)).unwrap().record(Request::new(Domain::Device, DType::F32, 64)).unwrap();
/// let sim = SimBackend::new();
/// let stream = sim.stream();
/// let mut capturing = d.plan(Policy::Generations(1)).unwrap().allocate(sim).unwrap();
/// let cap = capturing.capture(RunnerId(0)).unwrap();
/// let view = cap.take(Request::new(Domain::Device, DType::F32, 64)).unwrap();
/// let graph = cap.record(&stream, |_| Ok::<(), replay_arena::Error>(())).unwrap();
/// cap.finish(graph).unwrap();
/// println!("{:x}", view.device_ptr()); // `cap` was moved while borrowed
/// ```
pub struct RunnerCapture<'c, B: Backend> {
    owner: &'c mut Capturing<B>,
    index: usize,
    cursor: RefCell<Cursor>,
    failure: RefCell<Option<String>>,
    closed: bool,
    _not_send: NotSend,
}

impl<B: Backend> RunnerCapture<'_, B> {
    /// The runner being captured.
    pub fn runner(&self) -> RunnerId {
        self.owner.plan.runners[self.index].id()
    }

    /// The backend, to submit work while capturing.
    pub fn backend(&self) -> &B {
        &self.owner.res.backend
    }

    /// Hands out the next fixed-address view. Requests must come in the same
    /// order, with the same domain, dtype, element count and purpose, as in
    /// discovery.
    pub fn take(&self, request: Request) -> Result<View<'_>> {
        let plan = &self.owner.plan.runners[self.index];
        let runner = plan.id();
        let key = request.key();
        if request.elements == 0 {
            return Err(Error::ZeroElements { runner, key });
        }
        let requested = request.aligned_bytes().ok_or(Error::SizeOverflow {
            runner,
            key,
            what: "request size",
            elements: request.elements,
            dtype: request.dtype,
        })?;
        let mut cursor = self.cursor.borrow_mut();
        let index = cursor.next;
        let slot = plan.slices.iter().position(|s| s.key == key);
        let (capacity, consumed) = match slot {
            Some(i) => (plan.slices[i].bytes, cursor.consumed[i]),
            None => (0, 0),
        };
        let expected = plan.record.requests.get(index);
        if requested > capacity - consumed || expected.is_none() {
            return Err(Error::CapacityExceeded {
                runner,
                key,
                index,
                request,
                requested,
                consumed,
                capacity,
            });
        }
        if let Some(&expected) = expected.filter(|&&e| e != request) {
            return Err(Error::RequestMismatch {
                runner,
                index,
                request,
                expected,
                requested,
                consumed,
                capacity,
            });
        }
        let slot = slot.expect("capacity > 0 implies a slice");
        let slice = plan.slices[slot];
        let offset = slice.offset + consumed;
        cursor.consumed[slot] += requested;
        cursor.next += 1;
        Ok(View {
            addr: self.owner.res.arenas[slice.arena].base() + offset,
            arena: slice.arena,
            offset,
            request,
            runner,
            _capture: PhantomData,
        })
    }

    /// Captures the work `submit` puts on `stream` into a graph. If `submit`
    /// fails, the stream capture is ended and discarded and the runner is
    /// marked failed.
    pub fn record<E: fmt::Display>(
        &self,
        stream: &B::Stream,
        submit: impl FnOnce(&B::Stream) -> std::result::Result<(), E>,
    ) -> Result<B::Graph> {
        let backend = &self.owner.res.backend;
        let runner = self.runner();
        let fail = |reason: String| {
            *self.failure.borrow_mut() = Some(reason.clone());
            Error::CaptureFailed { runner, reason }
        };
        backend
            .begin_capture(stream)
            .map_err(|e| fail(e.to_string()))?;
        if let Err(e) = submit(stream) {
            backend.abort_capture(stream);
            return Err(fail(e.to_string()));
        }
        backend.end_capture(stream).map_err(|e| fail(e.to_string()))
    }

    /// Closes the capture: checks that every key's capacity was consumed
    /// exactly and that the graph allocates no memory, then hands the graph
    /// to the plan to own.
    pub fn finish(mut self, graph: B::Graph) -> Result<()> {
        let plan = &self.owner.plan.runners[self.index];
        let runner = plan.id();
        let result = (|| {
            // A failed `record` fails the runner for good: whatever graph is
            // handed in, it is not the one whose capture failed.
            if let Some(reason) = self.failure.borrow().clone() {
                return Err(Error::CaptureFailed { runner, reason });
            }
            let cursor = self.cursor.borrow();
            for (slice, &consumed) in plan.slices.iter().zip(&cursor.consumed) {
                if consumed != slice.bytes {
                    return Err(Error::ConsumptionMismatch {
                        runner,
                        key: slice.key,
                        consumed,
                        capacity: slice.bytes,
                    });
                }
            }
            self.owner
                .res
                .backend
                .validate_graph(&graph)
                .map_err(|reason| Error::GraphRejected { runner, reason })
        })();
        self.closed = true;
        match result {
            Ok(()) => {
                self.owner.res.graphs[self.index] = Some(graph);
                self.owner.states[self.index] = CaptureState::Finished;
                Ok(())
            }
            Err(e) => {
                self.owner.states[self.index] = CaptureState::Failed(e.to_string());
                Err(e)
            }
        }
    }
}

impl<B: Backend> Drop for RunnerCapture<'_, B> {
    fn drop(&mut self) {
        if !self.closed {
            let reason = self
                .failure
                .borrow_mut()
                .take()
                .unwrap_or_else(|| "capture dropped before finish".to_string());
            self.owner.states[self.index] = CaptureState::Failed(reason);
        }
    }
}

/// A fixed-address, aligned view into a runner's arena. It borrows the
/// capture (or the [`Replayable`]) that handed it out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View<'a> {
    pub(crate) addr: u64,
    pub(crate) arena: usize,
    pub(crate) offset: u64,
    pub(crate) request: Request,
    pub(crate) runner: RunnerId,
    pub(crate) _capture: PhantomData<&'a ()>,
}

impl View<'_> {
    /// Device address of the first element (host address on `sim`), aligned
    /// to the domain's alignment.
    pub fn device_ptr(&self) -> u64 {
        self.addr
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.request.elements as usize
    }

    /// Always false: requests have at least one element.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Bytes of the elements (without alignment padding).
    pub fn bytes(&self) -> u64 {
        self.request.elements * self.request.dtype.size_bytes()
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.request.dtype
    }

    /// Domain.
    pub fn domain(&self) -> Domain {
        self.request.domain
    }

    /// (domain, dtype).
    pub fn key(&self) -> Key {
        self.request.key()
    }

    /// The request this view answers.
    pub fn request(&self) -> Request {
        self.request
    }

    /// The runner that owns it.
    pub fn runner(&self) -> RunnerId {
        self.runner
    }

    /// Index of its arena in [`Planned::arenas`].
    pub fn arena(&self) -> usize {
        self.arena
    }

    /// Byte offset inside its arena.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}
