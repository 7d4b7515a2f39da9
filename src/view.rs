//! Views into arenas, and the marker that keeps an open capture on its
//! thread. A leaf module: phases and backends both use it.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};

use crate::vocab::{DType, Domain, Key, ParamId, Purpose, Request, RunnerId};

/// Makes a type `!Send` and `!Sync` without naming a backend's types (so
/// compile-fail diagnostics name this crate's types only).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct NotSend(PhantomData<*const ()>);

/// A fixed-address, aligned view into a runner's arena. It borrows the
/// capture (or the [`Replayable`](crate::Replayable)) that handed it out, so
/// it cannot outlive the memory it points at.
///
/// Device work can be put on a view only inside the work closure of the
/// capture or consumer that handed it out, on that closure's stream
/// ([`RunnerCapture::stream_capture`](crate::RunnerCapture::stream_capture),
/// [`Replayable::consume`](crate::Replayable::consume)): there the fence
/// orders it. Elsewhere (another plan's capture, another stream, after the
/// closure returned) every backend refuses it with a typed error; see
/// `docs/safety.md`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View<'a> {
    pub(crate) addr: u64,
    pub(crate) arena: usize,
    pub(crate) offset: u64,
    pub(crate) request: Request,
    pub(crate) runner: RunnerId,
    /// The capture or consumer whose closure may use it on the device (0:
    /// none, a view for reading addresses only).
    pub(crate) scope: u64,
    /// A handoff its reader received: the capture may only read it.
    pub(crate) read_only: bool,
    /// The handoff it is, if any: unusable once its writer marked it ready.
    pub(crate) handoff: Option<u32>,
    pub(crate) _owner: PhantomData<&'a ()>,
}

/// What a backend needs to check a view's use: its scope, and what to name
/// in the error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ViewTag {
    pub(crate) scope: u64,
    pub(crate) request: Request,
    pub(crate) runner: RunnerId,
    pub(crate) read_only: bool,
    pub(crate) handoff: Option<u32>,
}

impl<'a> View<'a> {
    /// Its scope and names, for backends' checks.
    pub(crate) fn tag(&self) -> ViewTag {
        ViewTag {
            scope: self.scope,
            request: self.request,
            runner: self.runner,
            read_only: self.read_only,
            handoff: self.handoff,
        }
    }

    /// Device address of the first element (host address on `sim`), aligned
    /// to the domain's alignment.
    pub fn device_ptr(&self) -> u64 {
        self.addr
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        usize::try_from(self.request.elements).unwrap_or(usize::MAX)
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

    /// Whether work may only read it: a handoff its reader received
    /// ([`RunnerCapture::receive`](crate::RunnerCapture::receive)). A
    /// consumer's views are read-only too, by their consumer's kind.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// The runner that owns it (for a handoff, the runner whose capture
    /// took it).
    pub fn runner(&self) -> RunnerId {
        self.runner
    }

    /// Index of its arena in [`Planned::arenas`](crate::Planned::arenas).
    pub fn arena(&self) -> usize {
        self.arena
    }

    /// Byte offset inside its arena.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The largest power of two (up to its domain's alignment) its address
    /// is a multiple of: the domain's alignment for a view a capture handed
    /// out, possibly less for a sub-view.
    pub fn alignment(&self) -> u64 {
        let domain = self.request.domain.alignment();
        if self.addr == 0 {
            return domain;
        }
        (1u64 << self.addr.trailing_zeros()).min(domain)
    }

    /// Elements `range` of this view, as a view of its own: same dtype,
    /// domain, runner and closure (so the same fence), at the address of
    /// element `range.start` (a flat bucket cut into per-parameter pieces,
    /// as a bucketed reduce-scatter does).
    ///
    /// # Errors
    ///
    /// [`SliceError`] for an empty or reversed range, or one past the end.
    ///
    /// ```
    /// use replay_arena::{Discovering, PlanConfig, Policy, Request, Domain, DType, RunnerId};
    /// let q = Request::new(Domain::Device, DType::BF16, 1000);
    /// let mut capturing = Discovering::from_runners(PlanConfig::new(), [(RunnerId(0), [q])])?
    ///     .plan(Policy::Generations(1))?
    ///     .allocate(replay_arena::sim::SimBackend::new())?;
    /// let cap = capturing.capture(RunnerId(0))?;
    /// let bucket = cap.take(q)?;
    /// let (w1, w2) = bucket.split_at(384)?;
    /// assert_eq!((w1.len(), w2.len()), (384, 616));
    /// assert_eq!(w2.device_ptr(), bucket.device_ptr() + 768);
    /// assert_eq!(w2.alignment(), 256);
    /// assert!(bucket.slice(900..1001).is_err());
    /// # Ok::<(), replay_arena::Error>(())
    /// ```
    pub fn slice(&self, range: std::ops::Range<usize>) -> Result<View<'a>, SliceError> {
        let len = self.len();
        if range.start >= range.end || range.end > len {
            return Err(SliceError {
                start: range.start,
                end: range.end,
                len,
            });
        }
        let skip = range.start as u64 * self.request.dtype.size_bytes();
        let mut request = self.request;
        request.elements = (range.end - range.start) as u64;
        Ok(View {
            addr: self.addr + skip,
            offset: self.offset + skip,
            request,
            ..*self
        })
    }

    /// The first `mid` elements and the rest, as two views (see
    /// [`View::slice`]).
    ///
    /// # Errors
    ///
    /// [`SliceError`] unless `0 < mid < len`.
    pub fn split_at(&self, mid: usize) -> Result<(View<'a>, View<'a>), SliceError> {
        Ok((self.slice(0..mid)?, self.slice(mid..self.len())?))
    }
}

/// A sub-view outside its view ([`View::slice`], [`View::split_at`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("elements {start}..{end} of a view of {len} elements: a sub-view must be a non-empty range inside the view")]
pub struct SliceError {
    /// First element asked for.
    pub start: usize,
    /// One past the last element asked for.
    pub end: usize,
    /// Elements of the view.
    pub len: usize,
}

/// Finding views by what they are for, in the slice a consumer (or
/// [`Replayable::views`](crate::Replayable::views)) hands out, without
/// positional indices and without allocating.
pub trait ViewsExt<'a> {
    /// The first view that answers `request` (domain, dtype, elements,
    /// purpose and parameter all equal).
    fn find(&self, request: &Request) -> Option<View<'a>>;
    /// The views of one purpose, in request order.
    fn with_purpose(&self, purpose: Purpose) -> impl Iterator<Item = View<'a>> + '_;
    /// The views of one parameter, in request order.
    fn of_param(&self, param: ParamId) -> impl Iterator<Item = View<'a>> + '_;
}

impl<'a> ViewsExt<'a> for [View<'a>] {
    fn find(&self, request: &Request) -> Option<View<'a>> {
        self.iter().find(|v| v.request == *request).copied()
    }

    fn with_purpose(&self, purpose: Purpose) -> impl Iterator<Item = View<'a>> + '_ {
        self.iter()
            .filter(move |v| v.request.purpose == purpose)
            .copied()
    }

    fn of_param(&self, param: ParamId) -> impl Iterator<Item = View<'a>> + '_ {
        self.iter()
            .filter(move |v| v.request.param == Some(param))
            .copied()
    }
}

/// What a scope's closure may do with its views.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ScopeKind {
    /// A runner's capture: its graph reads and writes the views.
    Capture,
    /// A consumer (`consume`, `consume_many`): it reads the views, beside
    /// other readers on other streams.
    Read,
    /// A consumer that writes (`consume_mut`): alone with the bytes.
    Write,
}

/// Where the views of one capture or consumer may be used on the device:
/// inside that capture's (or consumer's) work closure, on its stream.
///
/// Every [`View`] handed out by [`RunnerCapture::take`](crate::RunnerCapture::take)
/// or passed to a [`Replayable::consume`](crate::Replayable::consume) closure
/// names the scope it belongs to; the scope is *open* only while that closure
/// runs. Backends check a view against its scope at each use (a `sim` op, a
/// typed cudarc view, a reduce-scatter), so a view cannot put work on
/// another plan's graph, on a stream the fence does not follow, or after its
/// closure returned; and a reader's views cannot be written.
#[derive(Debug)]
pub(crate) struct Scope {
    /// Unique in the process; 0 is never issued.
    pub(crate) id: u64,
    /// The backend's [`stream_id`](crate::Backend::stream_id) of the stream
    /// the closure runs on.
    pub(crate) stream: u64,
    pub(crate) kind: ScopeKind,
    /// The runner whose capture it is (or the first runner consumed).
    pub(crate) runner: RunnerId,
    open: AtomicBool,
    /// The first use refused after the view left the closure's checks (a
    /// typed view used on another stream), reported when the closure ends.
    misuse: Mutex<Option<String>>,
    /// Handoffs marked ready in this capture: its work may no longer use
    /// them.
    retired: Mutex<Vec<u32>>,
}

impl Scope {
    /// Whether its closure is still running.
    pub(crate) fn is_open(&self) -> bool {
        self.open.load(AtomicOrdering::Acquire)
    }

    /// Keeps the first refused use, for the capture or consumer to report.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn record_misuse(&self, what: String) {
        if let Ok(mut m) = self.misuse.lock() {
            m.get_or_insert(what);
        }
    }

    /// The first refused use, if any.
    pub(crate) fn take_misuse(&self) -> Option<String> {
        self.misuse.lock().ok().and_then(|mut m| m.take())
    }

    /// Whether the view may still be used in this scope: a handoff its
    /// writer marked ready may not. (Fails closed on a poisoned lock.)
    pub(crate) fn in_use(&self, view: &ViewTag) -> bool {
        match view.handoff {
            None => true,
            Some(h) => self.retired.lock().is_ok_and(|r| !r.contains(&h)),
        }
    }
}

thread_local! {
    /// Scopes open on this thread, innermost last.
    static OPEN: RefCell<Vec<Arc<Scope>>> = const { RefCell::new(Vec::new()) };
    /// Closed scopes nobody holds any more, reused so that opening one
    /// allocates nothing in a steady loop of replays and consumers.
    static SPARE: RefCell<Vec<Arc<Scope>>> = const { RefCell::new(Vec::new()) };
}

/// Closed scopes kept for reuse per thread.
const SPARE_SCOPES: usize = 8;

/// Every open scope's stream, in the whole process: (stream, scope, is a
/// capture). A capture may not open on a stream a scope of any thread works
/// on, nor a consumer on a stream a capture records.
static STREAMS: Mutex<Vec<(u64, u64, bool)>> = Mutex::new(Vec::new());

/// A new scope id (never 0, never reused).
pub(crate) fn new_scope_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, AtomicOrdering::Relaxed)
}

/// Why a scope could not open on its stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamBusy {
    /// A capture was asked for on a stream another scope works on.
    InUse,
    /// A consumer was asked for on a stream a capture records.
    Capturing,
}

/// An open scope; closing it (on drop, unwinding included) makes its views
/// unusable on the device again and frees its stream.
pub(crate) struct OpenScope {
    scope: Arc<Scope>,
}

impl OpenScope {
    /// Opens scope `id` on this thread for views used on `stream`.
    ///
    /// # Errors
    ///
    /// [`StreamBusy`] when the stream conflicts with another open scope of
    /// any thread.
    pub(crate) fn enter(
        id: u64,
        stream: u64,
        kind: ScopeKind,
        runner: RunnerId,
    ) -> Result<OpenScope, StreamBusy> {
        {
            let mut streams = STREAMS.lock().unwrap_or_else(|p| p.into_inner());
            let capture = kind == ScopeKind::Capture;
            for &(s, _, c) in streams.iter() {
                if s == stream {
                    if capture {
                        return Err(StreamBusy::InUse);
                    }
                    if c {
                        return Err(StreamBusy::Capturing);
                    }
                }
            }
            streams.push((stream, id, capture));
        }
        let reused = SPARE
            .try_with(|spare| spare.try_borrow_mut().ok()?.pop())
            .ok()
            .flatten()
            .and_then(|mut arc| {
                // Only a scope no typed view still holds can be reused.
                let s = Arc::get_mut(&mut arc)?;
                s.id = id;
                s.stream = stream;
                s.kind = kind;
                s.runner = runner;
                *s.open.get_mut() = true;
                *s.misuse.get_mut().ok()? = None;
                s.retired.get_mut().ok()?.clear();
                Some(arc)
            });
        let scope = reused.unwrap_or_else(|| {
            Arc::new(Scope {
                id,
                stream,
                kind,
                runner,
                open: AtomicBool::new(true),
                misuse: Mutex::new(None),
                retired: Mutex::new(Vec::new()),
            })
        });
        OPEN.with(|open| open.borrow_mut().push(scope.clone()));
        Ok(OpenScope { scope })
    }

    /// The scope.
    pub(crate) fn scope(&self) -> &Scope {
        &self.scope
    }
}

impl Drop for OpenScope {
    fn drop(&mut self) {
        self.scope.open.store(false, AtomicOrdering::Release);
        let id = self.scope.id;
        {
            let mut streams = STREAMS.lock().unwrap_or_else(|p| p.into_inner());
            streams.retain(|&(_, scope, _)| scope != id);
        }
        // `try_with`: during thread teardown the list may be gone already.
        let _ = OPEN.try_with(|open| {
            if let Ok(mut open) = open.try_borrow_mut() {
                open.retain(|s| s.id != id);
            }
        });
        let _ = SPARE.try_with(|spare| {
            if let Ok(mut spare) = spare.try_borrow_mut() {
                if spare.len() < SPARE_SCOPES {
                    spare.push(self.scope.clone());
                }
            }
        });
    }
}

/// The capture open on this thread on `stream` (the innermost scope there),
/// as (scope id, runner): where a graph's temporaries belong.
pub(crate) fn capture_on(stream: u64) -> Option<(u64, RunnerId)> {
    OPEN.try_with(|open| {
        let open = open.try_borrow().ok()?;
        let s = open
            .iter()
            .rev()
            .find(|s| s.stream == stream && s.is_open())?;
        (s.kind == ScopeKind::Capture).then_some((s.id, s.runner))
    })
    .ok()
    .flatten()
}

/// Why a view may not be used on the device here.
pub(crate) fn out_of_scope(view: &ViewTag) -> String {
    if view.scope == 0 {
        format!(
            "{} of {} was not handed out by a capture or consumer (views from `Replayable::views` \
             are for reading addresses; put device work on them inside `Replayable::consume`)",
            view.request, view.runner
        )
    } else {
        format!(
            "{} of {} is used outside the work closure of the capture or consumer that handed \
             it out (a view works only inside its own `stream_capture` or `consume` closure)",
            view.request, view.runner
        )
    }
}

/// Why a consumer's view may not be written.
pub(crate) fn read_only(view: &ViewTag) -> String {
    if view.read_only && view.handoff.is_some() {
        return format!(
            "{} of {} is a handoff it received, which it reads (the writer's next replay and \
             other readers rely on that); write handoffs in their writer's graph",
            view.request, view.runner
        );
    }
    format!(
        "{} of {} is a consumer's view, which it reads (consumers on other streams may read \
         it at the same time); write a runner's views in its graph, or in `consume_mut`",
        view.request, view.runner
    )
}

/// The open scope `view` belongs to, on this thread.
///
/// # Errors
///
/// Why not (see [`out_of_scope`]) when its closure is not running here.
pub(crate) fn scope_of(view: &ViewTag) -> Result<Arc<Scope>, String> {
    let id = view.scope;
    let found = OPEN
        .try_with(|open| {
            open.try_borrow()
                .ok()
                .and_then(|open| open.iter().rev().find(|s| s.id == id).cloned())
        })
        .ok()
        .flatten();
    match found {
        Some(scope) if id != 0 && scope.is_open() => Ok(scope),
        _ => Err(out_of_scope(view)),
    }
}

/// Checks that `view` may be used on the device on the stream with
/// backend id `stream` (and written, if `write`): its closure runs on this
/// thread, on that stream, is the innermost scope open on that stream, and
/// is not a reader's when writing.
///
/// # Errors
///
/// Why not, naming the view, its runner and the streams.
/// Handoff `handoff` was marked ready in the open scope `scope`: its views
/// no longer work there. `false` when no such scope is open on this thread.
pub(crate) fn retire(scope: u64, handoff: u32) -> bool {
    OPEN.try_with(|open| {
        let open = open.try_borrow().ok()?;
        let s = open.iter().rev().find(|s| s.id == scope && s.is_open())?;
        s.retired.lock().ok()?.push(handoff);
        Some(())
    })
    .ok()
    .flatten()
    .is_some()
}

/// Why a handoff view was refused after its ready point.
pub(crate) fn retired(view: &ViewTag) -> String {
    format!(
        "{} of {} is a handoff its capture marked ready; after that point of the graph, \
         readers and the next writer may use it, so the writer's graph leaves it alone",
        view.request, view.runner
    )
}

pub(crate) fn check_use(view: &ViewTag, stream: u64, write: bool) -> Result<Arc<Scope>, String> {
    let scope = scope_of(view)?;
    if !scope.in_use(view) {
        return Err(retired(view));
    }
    let innermost = OPEN
        .try_with(|open| {
            open.try_borrow().ok().and_then(|open| {
                open.iter()
                    .rev()
                    .find(|s| s.stream == stream && s.is_open())
                    .map(|s| s.id)
            })
        })
        .ok()
        .flatten();
    if scope.stream != stream || innermost != Some(scope.id) {
        return Err(format!(
            "{} of {} is used on another stream than its {} runs on (a view works on the stream \
             of its own `stream_capture` or `consume` closure)",
            view.request,
            view.runner,
            if scope.kind == ScopeKind::Capture {
                "capture"
            } else {
                "consumer"
            }
        ));
    }
    if write && (scope.kind == ScopeKind::Read || view.read_only) {
        return Err(read_only(view));
    }
    Ok(scope)
}
