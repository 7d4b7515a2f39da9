//! The scope registry: which capture's or consumer's work closure is open,
//! on which thread and stream, and the checks backends make against it
//! before they put device work on a view. Process-wide (`STREAMS`, the
//! streams open scopes claim) and per thread (`OPEN`, `SPARE`). A leaf
//! module: it knows views and the vocabulary only.
//!
//! Under `--cfg loom` its locks, atomics, `Arc`s, statics and thread-locals
//! are loom's, and the `loom_model` tests below explore every interleaving
//! of a few threads claiming, opening, checking and closing scopes
//! (`docs/fuzzing.md`).

use std::cell::RefCell;
use std::sync::atomic::Ordering as AtomicOrdering;

use self::sync::{yield_now, Arc, AtomicBool, AtomicU64, Mutex};
use crate::view::{Misuse, ViewTag};
use crate::vocab::RunnerId;

/// The registry's synchronization: std's, or loom's models of it under
/// `--cfg loom`.
mod sync {
    #[cfg(loom)]
    pub(super) use loom::{
        sync::{
            atomic::{AtomicBool, AtomicU64},
            Arc, Mutex,
        },
        thread::yield_now,
    };
    #[cfg(not(loom))]
    pub(super) use std::{
        sync::{
            atomic::{AtomicBool, AtomicU64},
            Arc, Mutex,
        },
        thread::yield_now,
    };
}

/// Process-wide statics: plain (const-initialized) statics, or loom's
/// `lazy_static!` under `--cfg loom` (loom's types have no `const fn new`,
/// and loom gives each explored execution fresh values).
macro_rules! process_statics {
    ($($(#[$attr:meta])* static $name:ident: $t:ty = $init:expr;)*) => {
        $(
            #[cfg(not(loom))]
            $(#[$attr])*
            static $name: $t = $init;
        )*
        #[cfg(loom)]
        loom::lazy_static! {
            $($(#[$attr])* static ref $name: $t = $init;)*
        }
    };
}

/// Thread-locals: std's `thread_local!` with a `const` initializer, or
/// loom's `thread_local!` under `--cfg loom`.
macro_rules! thread_locals {
    ($($(#[$attr:meta])* static $name:ident: $t:ty = $init:expr;)*) => {
        #[cfg(not(loom))]
        std::thread_local! {
            $($(#[$attr])* static $name: $t = const { $init };)*
        }
        #[cfg(loom)]
        loom::thread_local! {
            $($(#[$attr])* static $name: $t = $init;)*
        }
    };
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
/// runs. Backends check a view against its scope at each use (a `sim` kernel, a
/// typed cudarc view, a reduce-scatter), so a view cannot put work on
/// another plan's graph, on a stream the fence does not follow, or after its
/// closure returned; and a reader's views cannot be written.
#[derive(Debug)]
pub(crate) struct Scope {
    /// Unique in the process; 0 is never issued.
    pub(crate) id: u64,
    /// The backend's [`stream_id`](crate::backend::Streams::stream_id) of the stream
    /// the closure runs on.
    pub(crate) stream: u64,
    pub(crate) kind: ScopeKind,
    /// The runner whose capture it is (or the first runner consumed).
    pub(crate) runner: RunnerId,
    open: AtomicBool,
    /// The first use refused after the view left the closure's checks (a
    /// typed view used on another stream), reported when the closure ends.
    misuse: Mutex<Option<Misuse>>,
    /// Handoffs marked ready in this capture: its work may no longer use
    /// them.
    retired: Mutex<Vec<u32>>,
}

/// A scope as the checks hand it out: what a typed view keeps, and may
/// check from any thread it is sent to.
pub(crate) type SharedScope = Arc<Scope>;

impl Scope {
    /// Whether its closure is still running.
    pub(crate) fn is_open(&self) -> bool {
        self.open.load(AtomicOrdering::Acquire)
    }

    /// Keeps the first refused use, for the capture or consumer to report.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn record_misuse(&self, what: Misuse) {
        if let Ok(mut m) = self.misuse.lock() {
            m.get_or_insert(what);
        }
    }

    /// The first refused use, if any.
    pub(crate) fn take_misuse(&self) -> Option<Misuse> {
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

thread_locals! {
    /// Scopes open on this thread, innermost last.
    static OPEN: RefCell<Vec<Arc<Scope>>> = RefCell::new(Vec::new());
    /// Closed scopes nobody holds any more, reused so that opening one
    /// allocates nothing in a steady loop of replays and consumers.
    static SPARE: RefCell<Vec<Arc<Scope>>> = RefCell::new(Vec::new());
}

/// Closed scopes kept for reuse per thread.
const SPARE_SCOPES: usize = 8;

process_statics! {
    /// Every open scope's stream, in the whole process: (stream, scope, is a
    /// capture). A capture may not open on a stream a scope of any thread
    /// works on, nor a consumer on a stream a capture records.
    static STREAMS: Mutex<Vec<(u64, u64, bool)>> = Mutex::new(Vec::new());
    /// The next scope id.
    static NEXT_SCOPE_ID: AtomicU64 = AtomicU64::new(1);
    /// One word for two counts, so that a claim counts itself and reads the
    /// captures in one read-modify-write: the low 32 bits count claims held
    /// without an entry in `STREAMS` (taken while no capture was counted),
    /// the high 32 bits the captures opening or open in the process (each
    /// holds, or is about to take, an entry in `STREAMS`). While there are
    /// no captures, a [`StreamClaim`] needs no entry of its own: nothing
    /// could refuse it. A capture counts itself, then waits until no quick
    /// claim is held: a claim counted before it is waited for, one counted
    /// after it sees the capture and takes an entry. One variable has one
    /// modification order, so no ordering between two atomics is needed
    /// (which loom would not model).
    static GATE: AtomicU64 = AtomicU64::new(0);
}

/// A new scope id (never 0, never reused).
pub(crate) fn new_scope_id() -> u64 {
    NEXT_SCOPE_ID.fetch_add(1, AtomicOrdering::Relaxed)
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
        let capture = kind == ScopeKind::Capture;
        if capture {
            GATE.fetch_add(ONE_CAPTURE, AtomicOrdering::AcqRel);
            // A quick claim is held only inside the crate's own enqueueing
            // (no program code runs while it is), for a few driver calls
            // (and, at a lazily instantiated graph's first launch, its
            // instantiation). A load reads no older value than this
            // thread's own count above: a claim counted before it is seen
            // until it is released (and the release is acquired).
            while GATE.load(AtomicOrdering::Acquire) & QUICK_CLAIMS != 0 {
                yield_now();
            }
        }
        {
            let mut streams = STREAMS.lock().unwrap_or_else(|p| p.into_inner());
            let busy = streams.iter().find_map(|&(s, _, c)| match s == stream {
                true if capture => Some(StreamBusy::InUse),
                true if c => Some(StreamBusy::Capturing),
                _ => None,
            });
            if let Some(busy) = busy {
                drop(streams);
                if capture {
                    GATE.fetch_sub(ONE_CAPTURE, AtomicOrdering::AcqRel);
                }
                return Err(busy);
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
                s.open = AtomicBool::new(true);
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

    /// Closes the scope for its views (they no longer work on the device)
    /// while it keeps its stream: a capture keeps the stream to itself
    /// until the stream capture has ended, after its work closure returned.
    pub(crate) fn close_views(&self) {
        self.scope.open.store(false, AtomicOrdering::Release);
        let id = self.scope.id;
        // `try_with`: during thread teardown the list may be gone already.
        let _ = OPEN.try_with(|open| {
            if let Ok(mut open) = open.try_borrow_mut() {
                open.retain(|s| s.id != id);
            }
        });
    }
}

impl Drop for OpenScope {
    fn drop(&mut self) {
        // Closed before the stream is given up (a capture on it may open
        // only once this scope reads closed).
        self.close_views();
        let id = self.scope.id;
        {
            let mut streams = STREAMS.lock().unwrap_or_else(|p| p.into_inner());
            streams.retain(|&(_, scope, _)| scope != id);
        }
        if self.scope.kind == ScopeKind::Capture {
            // After its entry went: a claim that reads 0 finds no entry.
            GATE.fetch_sub(ONE_CAPTURE, AtomicOrdering::AcqRel);
        }
        let _ = SPARE.try_with(|spare| {
            if let Ok(mut spare) = spare.try_borrow_mut() {
                if spare.len() < SPARE_SCOPES {
                    spare.push(self.scope.clone());
                }
            }
        });
    }
}

/// The crate working on a stream outside any scope (a replay's waits and
/// launch, an event record the fence makes): while it is held, no capture
/// of any thread can begin on the stream, and it cannot be taken while a
/// capture holds the stream. Released on drop.
pub(crate) struct StreamClaim {
    token: u64,
}

impl StreamClaim {
    /// Claims the stream with backend id `stream`.
    ///
    /// # Errors
    ///
    /// [`StreamBusy::Capturing`] while a capture of any thread holds it.
    #[inline]
    pub(crate) fn enter(stream: u64) -> Result<StreamClaim, StreamBusy> {
        // The hot path (a replay's claim): no capture anywhere, so no lock.
        // Counted, and the captures read, in one step (`GATE`).
        if GATE.fetch_add(1, AtomicOrdering::AcqRel) < ONE_CAPTURE {
            return Ok(StreamClaim { token: QUICK });
        }
        StreamClaim::enter_listed(stream)
    }

    /// [`StreamClaim::enter`] while a capture opens or is open: an entry
    /// in `STREAMS`, under its lock.
    #[cold]
    fn enter_listed(stream: u64) -> Result<StreamClaim, StreamBusy> {
        // Not a quick claim after all.
        GATE.fetch_sub(1, AtomicOrdering::AcqRel);
        let token = new_scope_id();
        let mut streams = STREAMS.lock().unwrap_or_else(|p| p.into_inner());
        if streams
            .iter()
            .any(|&(s, _, capture)| s == stream && capture)
        {
            return Err(StreamBusy::Capturing);
        }
        streams.push((stream, token, false));
        Ok(StreamClaim { token })
    }

    /// Drops a claim with an entry in `STREAMS`.
    #[cold]
    fn leave_listed(&self) {
        let mut streams = STREAMS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = streams.iter().rposition(|&(_, t, _)| t == self.token) {
            streams.swap_remove(i);
        }
    }
}

/// The token of a claim with no entry in `STREAMS` (scope ids start at 1).
const QUICK: u64 = 0;

/// One capture in `GATE`'s high half.
const ONE_CAPTURE: u64 = 1 << 32;

/// `GATE`'s low half: the quick claims held.
const QUICK_CLAIMS: u64 = ONE_CAPTURE - 1;

impl Drop for StreamClaim {
    #[inline]
    fn drop(&mut self) {
        if self.token == QUICK {
            GATE.fetch_sub(1, AtomicOrdering::AcqRel);
            return;
        }
        self.leave_listed();
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
pub(crate) fn out_of_scope(view: &ViewTag) -> Misuse {
    let (request, runner) = (view.request, view.runner);
    if view.scope == 0 {
        Misuse::NoScope { request, runner }
    } else {
        Misuse::OutsideClosure { request, runner }
    }
}

/// Why a consumer's view may not be written.
pub(crate) fn read_only(view: &ViewTag) -> Misuse {
    Misuse::ReadOnly {
        request: view.request,
        runner: view.runner,
        handoff: view.read_only && view.handoff.is_some(),
    }
}

/// The open scope `view` belongs to, on this thread.
///
/// # Errors
///
/// Why not (see [`out_of_scope`]) when its closure is not running here.
pub(crate) fn scope_of(view: &ViewTag) -> Result<SharedScope, Misuse> {
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

/// Closes the open scope `scope` on this thread for its views (they no
/// longer work on the device), as its closure's end will: after a failure
/// that may have taken its stream out of capture.
pub(crate) fn close_scope(scope: u64) {
    let _ = OPEN.try_with(|open| {
        if let Ok(open) = open.try_borrow() {
            for s in open.iter().filter(|s| s.id == scope) {
                s.open.store(false, AtomicOrdering::Release);
            }
        }
    });
}

/// Why a handoff view was refused after its ready point.
pub(crate) fn retired(view: &ViewTag) -> Misuse {
    Misuse::Retired {
        request: view.request,
        runner: view.runner,
    }
}

/// Checks that `view` may be used on the device on the stream with
/// backend id `stream` (and written, if `write`): its closure runs on this
/// thread, on that stream, is the innermost scope open on that stream, and
/// is not a reader's when writing.
///
/// # Errors
///
/// The [`Misuse`] it would be, naming the view and its runner.
pub(crate) fn check_use(view: &ViewTag, stream: u64, write: bool) -> Result<SharedScope, Misuse> {
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
        return Err(Misuse::OtherStream {
            request: view.request,
            runner: view.runner,
            capture: scope.kind == ScopeKind::Capture,
        });
    }
    if write && (scope.kind == ScopeKind::Read || view.read_only) {
        return Err(read_only(view));
    }
    Ok(scope)
}

/// Model tests of the registry under every interleaving of two or three
/// threads (`RUSTFLAGS="--cfg loom" cargo test --lib scope::loom`;
/// `docs/fuzzing.md`). Each names the property it checks, and the outcomes
/// the interleavings must reach: a model that never reaches a race fails
/// too. "Open" means `OpenScope::enter` returned, "closed" that the
/// `OpenScope` was dropped.
#[cfg(all(test, loom))]
mod loom_model {
    use std::collections::BTreeSet;
    use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
    use std::sync::atomic::Ordering::{Acquire, Release, SeqCst};

    use loom::sync::atomic::{AtomicBool as Flag, AtomicUsize};
    use loom::thread;

    use super::*;
    use crate::vocab::{DType, Domain, Request};

    const STREAM_A: u64 = 1;
    const STREAM_B: u64 = 2;
    const RUNNER: RunnerId = RunnerId(3);

    /// Explores every interleaving of `f` (up to `LOOM_MAX_PREEMPTIONS`
    /// preemptions per execution when that is set) and checks that the
    /// outcomes `f` names, over all of them, are exactly `expected`.
    fn model(expected: &[&str], f: impl Fn() -> String + Sync + Send + 'static) {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(BTreeSet::new()));
        let record = seen.clone();
        loom::model::Builder::new().check(move || {
            let outcome = f();
            record.lock().unwrap().insert(outcome);
        });
        let expected: BTreeSet<String> = expected.iter().map(|e| e.to_string()).collect();
        assert_eq!(
            *seen.lock().unwrap(),
            expected,
            "outcomes over all interleavings"
        );
    }

    /// A view of scope `scope`, as a backend sees it.
    fn tag(scope: u64) -> ViewTag {
        ViewTag {
            scope,
            request: Request::new(Domain::Device, DType::F32, 1),
            runner: RUNNER,
            read_only: false,
            handoff: None,
        }
    }

    /// Opens a new scope of `kind` on `stream` on this thread.
    fn open(stream: u64, kind: ScopeKind) -> Result<(u64, OpenScope), StreamBusy> {
        let id = new_scope_id();
        OpenScope::enter(id, stream, kind, RUNNER).map(|scope| (id, scope))
    }

    /// Opens a scope of `kind` on `stream` and, while it is open, checks
    /// that no other scope counted in `inside` is (the caller counts the
    /// scopes that may not share the stream) and that its own view works.
    /// `Ok` when it opened, else why not.
    fn open_alone(stream: u64, kind: ScopeKind, inside: &AtomicUsize) -> Result<(), StreamBusy> {
        let (id, scope) = open(stream, kind)?;
        assert_eq!(
            inside.fetch_add(1, SeqCst),
            0,
            "two scopes that may not share stream {stream} are open at once"
        );
        assert!(check_use(&tag(id), stream, kind != ScopeKind::Read).is_ok());
        inside.fetch_sub(1, SeqCst);
        drop(scope);
        Ok(())
    }

    #[test]
    fn two_captures_on_one_stream_are_never_open_at_once() {
        let expected = [
            "both, one after the other",
            "mine refused",
            "theirs refused",
        ];
        model(&expected, || {
            let inside = Arc::new(AtomicUsize::new(0));
            let other = {
                let inside = inside.clone();
                thread::spawn(move || open_alone(STREAM_A, ScopeKind::Capture, &inside))
            };
            let mine = open_alone(STREAM_A, ScopeKind::Capture, &inside);
            let theirs = other.join().unwrap();
            assert!(
                open(STREAM_A, ScopeKind::Capture).is_ok(),
                "claim left behind"
            );
            match (mine, theirs) {
                (Ok(()), Ok(())) => "both, one after the other",
                (Err(StreamBusy::InUse), Ok(())) => "mine refused",
                (Ok(()), Err(StreamBusy::InUse)) => "theirs refused",
                other => panic!("{other:?}"),
            }
            .to_string()
        });
    }

    /// A replay's claim (quick while no capture is open anywhere, an entry
    /// of `STREAMS` while one is) and a capture racing for one stream:
    /// never held at once, whichever way each goes; on other streams they
    /// never refuse each other; nothing is left behind.
    #[test]
    fn a_claim_and_a_capture_racing_for_one_stream_exclude_each_other() {
        for stream in [STREAM_A, STREAM_B] {
            let expected: &[&str] = if stream == STREAM_A {
                &[
                    "both, one after the other",
                    "the capture refused: InUse",
                    "the claim refused: Capturing",
                ]
            } else {
                &["both, one after the other"]
            };
            model(expected, move || {
                let inside = Arc::new(AtomicUsize::new(0));
                let capture = {
                    let inside = inside.clone();
                    thread::spawn(move || open_alone(STREAM_A, ScopeKind::Capture, &inside))
                };
                let claimed = StreamClaim::enter(stream).map(|claim| {
                    if stream == STREAM_A {
                        assert_eq!(inside.fetch_add(1, SeqCst), 0, "a claim inside a capture");
                        inside.fetch_sub(1, SeqCst);
                    }
                    drop(claim);
                });
                let captured = capture.join().unwrap();
                assert!(
                    open(STREAM_A, ScopeKind::Capture).is_ok(),
                    "claim left behind"
                );
                assert!(StreamClaim::enter(STREAM_A).is_ok(), "capture left behind");
                match (claimed, captured) {
                    (Ok(()), Ok(())) => "both, one after the other",
                    (Ok(()), Err(e)) => return format!("the capture refused: {e:?}"),
                    (Err(e), Ok(())) => return format!("the claim refused: {e:?}"),
                    other => panic!("{other:?}"),
                }
                .to_string()
            });
        }
    }

    #[test]
    fn a_capture_and_a_consumer_racing_for_one_stream_exclude_each_other() {
        let expected = [
            "both, one after the other",
            "the capture refused: InUse",
            "the consumer refused: Capturing",
        ];
        model(&expected, || {
            let inside = Arc::new(AtomicUsize::new(0));
            let consumer = {
                let inside = inside.clone();
                thread::spawn(move || open_alone(STREAM_A, ScopeKind::Read, &inside))
            };
            let capture = open_alone(STREAM_A, ScopeKind::Capture, &inside);
            let consumer = consumer.join().unwrap();
            assert!(
                open(STREAM_A, ScopeKind::Capture).is_ok(),
                "claim left behind"
            );
            match (capture, consumer) {
                (Ok(()), Ok(())) => "both, one after the other",
                (Err(StreamBusy::InUse), Ok(())) => "the capture refused: InUse",
                (Ok(()), Err(StreamBusy::Capturing)) => "the consumer refused: Capturing",
                other => panic!("{other:?}"),
            }
            .to_string()
        });
    }

    #[test]
    fn consumers_share_a_stream_and_a_capture_on_another_stream_opens_beside_them() {
        model(&["all three open"], || {
            let reader = thread::spawn(|| {
                let (id, _scope) = open(STREAM_A, ScopeKind::Read).unwrap();
                assert!(check_use(&tag(id), STREAM_A, false).is_ok());
            });
            let capture = thread::spawn(|| {
                let (id, _scope) = open(STREAM_B, ScopeKind::Capture).unwrap();
                assert!(check_use(&tag(id), STREAM_B, true).is_ok());
                assert_eq!(capture_on(STREAM_B), Some((id, RUNNER)));
            });
            let (id, _scope) = open(STREAM_A, ScopeKind::Write).unwrap();
            assert!(check_use(&tag(id), STREAM_A, true).is_ok());
            assert_eq!(capture_on(STREAM_A), None);
            reader.join().unwrap();
            capture.join().unwrap();
            "all three open".to_string()
        });
    }

    #[test]
    fn a_view_works_only_on_its_own_thread_while_its_scope_is_open() {
        let expected = [
            "refused beside the other thread's own capture",
            "the other thread's capture refused: InUse",
        ];
        model(&expected, || {
            let (id, scope) = open(STREAM_A, ScopeKind::Capture).unwrap();
            let view = tag(id);
            let other = thread::spawn(move || {
                // The view, copied to another thread, works there in no
                // scope: not in that thread's own capture on the same
                // stream either (once the first one closed).
                let refused = |when: &str| {
                    assert!(scope_of(&view).is_err(), "{when}: scope_of");
                    assert!(
                        check_use(&view, STREAM_A, false).is_err(),
                        "{when}: check_use"
                    );
                    assert!(!retire(id, 0), "{when}: retire");
                };
                refused("in no scope");
                assert_eq!(capture_on(STREAM_A), None);
                match open(STREAM_A, ScopeKind::Capture) {
                    Ok((own, _scope)) => {
                        assert!(check_use(&tag(own), STREAM_A, true).is_ok());
                        refused("beside its own capture");
                        "refused beside the other thread's own capture"
                    }
                    Err(StreamBusy::InUse) => "the other thread's capture refused: InUse",
                    Err(busy) => panic!("{busy:?}"),
                }
            });
            assert!(check_use(&view, STREAM_A, true).is_ok());
            assert!(check_use(&view, STREAM_B, false).is_err(), "another stream");
            assert_eq!(capture_on(STREAM_A), Some((id, RUNNER)));
            assert!(retire(id, 7));
            let handoff = ViewTag {
                handoff: Some(7),
                ..view
            };
            assert!(check_use(&handoff, STREAM_A, false).is_err(), "retired");
            drop(scope);
            assert!(scope_of(&view).is_err(), "closed");
            assert!(check_use(&view, STREAM_A, false).is_err(), "closed");
            assert_eq!(capture_on(STREAM_A), None);
            assert!(!retire(id, 8), "closed");
            other.join().unwrap().to_string()
        });
    }

    #[test]
    fn a_thread_that_panics_inside_its_scope_releases_the_stream() {
        let expected = [
            "opened after the panic",
            "opened before the panicking thread's capture",
            "refused while the panicking thread's capture was open",
        ];
        model(&expected, || {
            let other = thread::spawn(|| {
                let id = new_scope_id();
                let unwound = catch_unwind(AssertUnwindSafe(|| {
                    if let Ok(_scope) = OpenScope::enter(id, STREAM_A, ScopeKind::Capture, RUNNER) {
                        // `resume_unwind`: a panic that skips the hook
                        // (thousands of interleavings would print it).
                        resume_unwind(Box::new("the work closure panicked"));
                    }
                }));
                assert!(scope_of(&tag(id)).is_err(), "open after unwinding");
                assert_eq!(capture_on(STREAM_A), None);
                unwound.is_err()
            });
            let mine = open(STREAM_A, ScopeKind::Capture).map(|_| ());
            let panicked = other.join().unwrap();
            let (id, _scope) = open(STREAM_A, ScopeKind::Capture).expect("claim left behind");
            assert!(check_use(&tag(id), STREAM_A, true).is_ok());
            match (mine, panicked) {
                (Ok(()), true) => "opened after the panic",
                (Ok(()), false) => "opened before the panicking thread's capture",
                (Err(StreamBusy::InUse), true) => {
                    "refused while the panicking thread's capture was open"
                }
                other => panic!("{other:?}"),
            }
            .to_string()
        });
    }

    #[test]
    fn a_closed_scope_a_typed_view_holds_never_reads_open_again_nor_is_reused() {
        let expected = [
            "read closed; reopened on a fresh scope",
            "read closed; reopened on the spare scope",
            "read open; reopened on a fresh scope",
            "read open; reopened on the spare scope",
        ];
        model(&expected, || {
            let (id, scope) = open(STREAM_A, ScopeKind::Capture).unwrap();
            // What a typed view keeps: the scope itself, which it checks
            // from any thread it is sent to.
            let held = check_use(&tag(id), STREAM_A, true).unwrap();
            let held_at = Arc::as_ptr(&held) as usize;
            let closed = Arc::new(Flag::new(false));
            let released = Arc::new(Flag::new(false));
            let holder = {
                let (closed, released) = (closed.clone(), released.clone());
                thread::spawn(move || {
                    let saw_closed = closed.load(Acquire);
                    let first = held.is_open();
                    let second = held.is_open();
                    assert!(!(saw_closed && first), "reads open after its close");
                    assert!(first || !second, "read closed, then open again");
                    assert_eq!((held.id, held.stream), (id, STREAM_A), "reused while held");
                    released.store(true, Release);
                    drop(held);
                    first
                })
            };
            drop(scope);
            closed.store(true, Release);
            // Reopening on this thread takes the spare scope only once no
            // view holds it.
            let (again, reopened) = open(STREAM_A, ScopeKind::Capture).unwrap();
            let reused = std::ptr::from_ref(reopened.scope()) as usize == held_at;
            if reused {
                assert!(released.load(Acquire), "spare reused while a view held it");
            }
            assert!(check_use(&tag(again), STREAM_A, true).is_ok());
            assert!(check_use(&tag(id), STREAM_A, true).is_err());
            let read_open = holder.join().unwrap();
            format!(
                "read {}; reopened on {}",
                if read_open { "open" } else { "closed" },
                if reused {
                    "the spare scope"
                } else {
                    "a fresh scope"
                }
            )
        });
    }

    #[test]
    fn a_capture_claims_a_stream_only_once_its_consumers_read_closed() {
        let expected = [
            "the capture opened after the close",
            "the capture refused: InUse",
        ];
        model(&expected, || {
            let (id, scope) = open(STREAM_A, ScopeKind::Read).unwrap();
            let held = check_use(&tag(id), STREAM_A, false).unwrap();
            let capture = thread::spawn(move || match open(STREAM_A, ScopeKind::Capture) {
                Ok((own, _scope)) => {
                    assert!(!held.is_open(), "a consumer still open beside a capture");
                    assert!(check_use(&tag(own), STREAM_A, true).is_ok());
                    "the capture opened after the close"
                }
                Err(StreamBusy::InUse) => "the capture refused: InUse",
                Err(busy) => panic!("{busy:?}"),
            });
            drop(scope);
            capture.join().unwrap().to_string()
        });
    }
}
