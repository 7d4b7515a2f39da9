//! The scope registry: which capture's or consumer's work closure is open,
//! on which thread and stream, and the checks backends make against it
//! before they put device work on a view. Process-wide (`STREAMS`, the
//! streams open scopes claim) and per thread (`OPEN`, `SPARE`). A leaf
//! module: it knows views and the vocabulary only.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};

use crate::view::ViewTag;
use crate::vocab::RunnerId;

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

/// Checks that `view` may be used on the device on the stream with
/// backend id `stream` (and written, if `write`): its closure runs on this
/// thread, on that stream, is the innermost scope open on that stream, and
/// is not a reader's when writing.
///
/// # Errors
///
/// Why not, naming the view, its runner and the streams.
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
