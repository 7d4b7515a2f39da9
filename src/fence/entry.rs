//! The one entry into the fence. Every public operation that uses a plan
//! on a stream (replay, consume, `consume_mut`, `consume_many`, waits, step
//! graph launches and waits, a step graph's last wait before it is freed)
//! enters here first: the stream is claimed (no capture of any thread can
//! begin on it until the operation is done, and a capture that holds it
//! refuses the claim), a stream that is capturing by the program's own
//! means is refused too, and the operation gets the stream with its
//! identity ([`On`]), which every fence operation takes. Both refusals are
//! one error, [`StreamCapturing`] naming the operation.

use super::{On, Operation, Refused, StreamCapturing};
use crate::backend::Streams;
use crate::scope::{new_scope_id, OpenScope, ScopeKind, StreamBusy, StreamClaim};

/// An operation inside the fence: the stream it works on, held for it
/// until this is dropped.
pub(crate) struct Entered<'s, S> {
    /// The stream and its identity.
    pub(crate) on: On<'s, S>,
    hold: Hold,
}

/// What keeps captures off the stream while the operation works on it.
enum Hold {
    /// A replay's, a wait's or a step launch's claim.
    Claim { _claim: StreamClaim },
    /// A consumer's scope: its views work on the device only while it is
    /// open, on this stream.
    Scope { id: u64, open: OpenScope },
}

impl<S> Entered<'_, S> {
    /// The consumer's scope: its id, and the open scope (`None` for an
    /// operation without views).
    pub(crate) fn scope(&self) -> Option<(u64, &OpenScope)> {
        match &self.hold {
            Hold::Scope { id, open } => Some((*id, open)),
            Hold::Claim { .. } => None,
        }
    }

    /// Closes the consumer's scope (its views stop working on the device);
    /// the stream stays held until `self` is dropped.
    pub(crate) fn close_views(&self) {
        if let Hold::Scope { open, .. } = &self.hold {
            open.close_views();
        }
    }
}

/// Enters the fence for `op` on `stream`: claims the stream, then refuses
/// it if it is capturing.
///
/// # Errors
///
/// [`StreamCapturing`]; the capture status query's own
/// failure ([`Operation::failed`]).
pub(crate) fn enter<'s, B: Streams>(
    backend: &B,
    stream: &'s B::Stream,
    op: Operation,
) -> Result<Entered<'s, B::Stream>, Refused> {
    let entered = enter_replay(backend, stream, op).map_err(Refused::Capturing)?;
    refuse_capturing(backend, stream, op)?;
    Ok(entered)
}

/// [`enter`] for a replay, without asking the backend whether the stream
/// captures: the stream is claimed (no capture of the crate's, on any
/// thread, can begin on it until the replay is done), and a capture the
/// program began on it by its own means is met at the launch, which the
/// driver refuses on a capturing stream in every capture mode
/// (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`; the `Launch` contract, and
/// `tests/gpu/fence/soundness.rs`). The replay's transaction rolls back on
/// that refusal; [`refused_by_capture`] then names it. A query per replay
/// would cost as much as a launch's own host work.
///
/// # Errors
///
/// [`StreamCapturing`] while a capture of the crate's holds the stream.
pub(crate) fn enter_replay<'s, B: Streams>(
    backend: &B,
    stream: &'s B::Stream,
    op: Operation,
) -> Result<Entered<'s, B::Stream>, StreamCapturing> {
    let on = on(backend, stream);
    let claim = StreamClaim::enter(on.id).map_err(|_| StreamCapturing { op })?;
    Ok(Entered {
        on,
        hold: Hold::Claim { _claim: claim },
    })
}

/// After a replay entered with [`enter_replay`] failed: [`StreamCapturing`]
/// when the stream is capturing by the program's own means (the launch, or
/// a wait before it, was refused for it), else `None` (the failure stands;
/// a failed query leaves it standing too).
pub(crate) fn refused_by_capture<B: Streams>(
    backend: &B,
    stream: &B::Stream,
    op: Operation,
) -> Option<StreamCapturing> {
    matches!(backend.is_capturing(stream), Ok(true)).then_some(StreamCapturing { op })
}

/// [`enter`] for a consumer: the stream is held by a new scope of `kind`
/// for its views (a capture may not record the stream while it is open,
/// and a capture holding the stream refuses it).
///
/// # Errors
///
/// As [`enter`].
pub(crate) fn enter_scope<'s, B: Streams>(
    backend: &B,
    stream: &'s B::Stream,
    op: Operation,
    kind: ScopeKind,
) -> Result<Entered<'s, B::Stream>, Refused> {
    let on = on(backend, stream);
    let runner = op.runner().unwrap_or(crate::vocab::RunnerId(u32::MAX));
    let id = new_scope_id();
    let open = match OpenScope::enter(id, on.id, kind, runner) {
        Ok(open) => open,
        Err(StreamBusy::Capturing | StreamBusy::InUse) => {
            return Err(Refused::Capturing(StreamCapturing { op }))
        }
    };
    refuse_capturing(backend, stream, op)?;
    Ok(Entered {
        on,
        hold: Hold::Scope { id, open },
    })
}

/// [`StreamCapturing`] when `stream` is capturing by means the
/// crate's claims cannot see (the program's own capture): a launch there
/// would be recorded into that graph instead of running.
fn refuse_capturing<B: Streams>(
    backend: &B,
    stream: &B::Stream,
    op: Operation,
) -> Result<(), Refused> {
    match backend.is_capturing(stream) {
        Ok(false) => Ok(()),
        Ok(true) => Err(Refused::Capturing(StreamCapturing { op })),
        Err(error) => Err(Refused::Failed(op.failed(error))),
    }
}

/// `stream` with its identity on `backend`.
fn on<'s, B: Streams>(backend: &B, stream: &'s B::Stream) -> On<'s, B::Stream> {
    On {
        stream,
        id: backend.stream_id(stream),
    }
}
