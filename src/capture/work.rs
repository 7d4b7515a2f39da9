//! The one stream capture of a closure's work ([`capture_work`]), for a
//! runner's graph and a step graph's consumer alike.

use crate::backend::{Backend, BackendError};
use crate::scope::{OpenScope, ScopeKind, StreamBusy};
use crate::view::Misuse;
use crate::vocab::RunnerId;

/// Why [`capture_work`] captured no graph.
pub(crate) enum Uncaptured<E> {
    /// Another scope of any thread works on the stream (nothing begun).
    Busy(StreamBusy),
    /// The backend could not begin the capture (nothing begun).
    Begin(BackendError),
    /// The work closure failed; the capture was aborted.
    Work(E),
    /// The work used a view where the fence cannot order it; the capture
    /// was aborted.
    Misuse(Misuse),
    /// The backend could not end the capture.
    End(BackendError),
}

/// The one stream capture of a closure's work, for a runner's graph and a
/// step graph's consumer alike. It claims the stream (id `sid`) for scope
/// `scope` first: no other capture or consumer of any thread works on it
/// until the capture has ended. Then it begins the capture, runs `work`
/// with the scope open (its views work on the device only there), closes
/// the scope for the views, and ends the capture, or aborts it when `work`
/// failed or misused a view. If `work` unwinds, the capture is aborted and
/// `unwound` runs, before the stream is given up. A `part` is a graph only
/// ever composed into a step graph ([`Capture::end_capture_part`]).
pub(crate) fn capture_work<B: Backend, T, E>(
    backend: &B,
    (stream, part): (&B::Stream, bool),
    (sid, scope, runner): (u64, u64, RunnerId),
    unwound: impl FnOnce(),
    work: impl FnOnce() -> std::result::Result<T, E>,
) -> std::result::Result<(T, B::Graph), Uncaptured<E>> {
    let claim =
        OpenScope::enter(scope, sid, ScopeKind::Capture, runner).map_err(Uncaptured::Busy)?;
    backend.begin_capture(stream).map_err(Uncaptured::Begin)?;
    let mut guard = AbortOnUnwind {
        backend,
        stream,
        unwound: Some(unwound),
    };
    let out = work();
    let misuse = claim.scope().take_misuse();
    claim.close_views();
    guard.unwound = None;
    let abort = || {
        // SAFETY: the capture this call began on `stream`.
        unsafe { backend.abort_capture(stream) }
    };
    let out = match out {
        Ok(out) => out,
        Err(e) => {
            abort();
            return Err(Uncaptured::Work(e));
        }
    };
    if let Some(reason) = misuse {
        abort();
        return Err(Uncaptured::Misuse(reason));
    }
    // SAFETY: the capture this call began (if the work ended it, this fails).
    let ended = unsafe {
        if part {
            backend.end_capture_part(stream)
        } else {
            backend.end_capture(stream)
        }
    };
    let graph = match ended {
        Ok(graph) => graph,
        Err(e) => {
            // An end that failed may leave the capture open (CUDA ends an
            // invalidated one, not every other): end it, so the stream is
            // usable again.
            abort();
            return Err(Uncaptured::End(e));
        }
    };
    drop(claim);
    Ok((out, graph))
}

/// Aborts the stream capture [`capture_work`] began when its work unwinds
/// (then runs `unwound`); disarmed once the work returned. Declared after
/// the stream's claim, so it runs before the claim is given up.
struct AbortOnUnwind<'a, B: Backend, F: FnOnce()> {
    backend: &'a B,
    stream: &'a B::Stream,
    unwound: Option<F>,
}

impl<B: Backend, F: FnOnce()> Drop for AbortOnUnwind<'_, B, F> {
    fn drop(&mut self) {
        if let Some(unwound) = self.unwound.take() {
            // SAFETY: the capture `capture_work` began on this stream.
            unsafe { self.backend.abort_capture(self.stream) };
            unwound();
        }
    }
}
