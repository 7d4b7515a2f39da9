//! Views lent to framework code as cudarc's own borrowed types
//! ([`CudaView`], [`CudaViewMut`]) for the duration of a closure, and copies
//! between a view and the program's own device memory.
//!
//! A lent view is built over a `CudaSlice` that is never dropped (it is
//! leaked back to a raw address when the closure returns, unwinding
//! included), so it never frees arena bytes; the closure receives a view
//! that borrows that local slice, so the borrow checker keeps it inside the
//! closure.

use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use cudarc::driver::{CudaView, CudaViewMut, DevicePtr, DevicePtrMut};

use super::arena::note_lent;
use super::device::{capturing, Stream};
use super::element::Element;
use super::typed_view::typed;
use super::{sys, Result};
use crate::backend::BackendError;
use crate::scope::{check_use, retired, ScopeKind, SharedScope};
use crate::view::{Access, Misuse, ReadWrite, View};
use crate::vocab::Domain;

/// The checks a typed view makes at each use, made once for a lend or a
/// copy: the right dtype, the view's closure running on this thread on
/// `stream` (innermost there), writable when `write`, and `stream` in the
/// capture state of the closure (capturing for a capture, not for a
/// consumer).
pub(super) fn check_lend<T: Element, A: Access>(
    view: &View<'_, A>,
    stream: &Stream,
    write: bool,
) -> Result<SharedScope> {
    if view.dtype() != T::DTYPE {
        return Err(BackendError::DTypeMismatch {
            view: view.dtype(),
            requested: T::DTYPE,
            type_name: std::any::type_name::<T>(),
        });
    }
    let tag = view.tag();
    let scope = check_use(&tag, stream.serial, write)
        .map_err(|reason| BackendError::InvalidView { reason })?;
    let capture = scope.kind == ScopeKind::Capture;
    if capturing(stream.cudarc().cu_stream())? != capture {
        // A capture's stream no longer capturing (the program ended the
        // capture under the crate), or a consumer's stream captured by
        // someone else.
        return Err(BackendError::InvalidView {
            reason: Misuse::TypedViewElsewhere {
                request: tag.request,
                runner: tag.runner,
                address: view.device_address(),
                returned: false,
            },
        });
    }
    Ok(scope)
}

/// After a lend: a handoff its capture marked ready while the lent view
/// was alive may have been used past its ready point, which the crate can
/// no longer see. The capture (or consumer) then reports it, so the graph
/// is never kept.
fn after_lend<A: Access>(view: &View<'_, A>, scope: &SharedScope) {
    let tag = view.tag();
    if !scope.in_use(&tag) {
        scope.record_misuse(retired(&tag));
    }
}

/// Checks for a lend: [`check_lend`], a device-domain view, and cudarc's
/// event tracking off on the stream's context (a view over arena bytes
/// must not carry cudarc events: they would wait on work outside the
/// capture, and cudarc panics when it cannot create them).
fn lend_address<T: Element, A: Access>(
    view: &View<'_, A>,
    stream: &Stream,
    write: bool,
) -> Result<(sys::CUdeviceptr, SharedScope)> {
    let scope = check_lend::<T, A>(view, stream, write)?;
    if view.domain() != Domain::Device {
        return Err(BackendError::Refused {
            call: "lend a cudarc view",
            reason: format!(
                "{} of {} is in {}: only device-domain views are lent as cudarc views (use \
                 `as_cuda` for symmetric ones)",
                view.request(),
                view.runner(),
                view.domain()
            ),
        });
    }
    if stream.cudarc().context().is_event_tracking() {
        return Err(BackendError::EventTracking);
    }
    let ptr = view.device_address();
    note_lent(ptr);
    Ok((ptr, scope))
}

/// Lends `view` read-only as a cudarc [`CudaView`] for `f`.
pub(super) fn with_cudarc<T: Element, R, E: From<BackendError>, A: Access>(
    view: &View<'_, A>,
    stream: &Stream,
    f: impl FnOnce(CudaView<'_, T>) -> std::result::Result<R, E>,
) -> std::result::Result<R, E> {
    let (ptr, scope) = lend_address::<T, A>(view, stream, false)?;
    // SAFETY: `ptr` addresses `view.len()` elements of `T` in an arena that
    // outlives the view (the view borrows its owner), checked above to be
    // lent inside the view's open closure, on its stream. `T` is an
    // `Element`: every bit pattern is a value. The slice is never dropped
    // (`ManuallyDrop`, then `leak`), so it never frees the arena's bytes;
    // with event tracking off (checked above) it carries no events.
    let slice =
        ManuallyDrop::new(unsafe { stream.cudarc().upgrade_device_ptr::<T>(ptr, view.len()) });
    let out = catch_unwind(AssertUnwindSafe(|| f(slice.as_view())));
    ManuallyDrop::into_inner(slice).leak();
    after_lend(view, &scope);
    out.unwrap_or_else(|panic| resume_unwind(panic))
}

/// Lends `view` writable as a cudarc [`CudaViewMut`] for `f`.
pub(super) fn with_cudarc_mut<T: Element, R, E: From<BackendError>, A: Access>(
    view: &View<'_, A>,
    stream: &Stream,
    f: impl FnOnce(CudaViewMut<'_, T>) -> std::result::Result<R, E>,
) -> std::result::Result<R, E> {
    let (ptr, scope) = lend_address::<T, A>(view, stream, true)?;
    // SAFETY: as in `with_cudarc`; the closure may write: checked above
    // that the view is writable here.
    let mut slice =
        ManuallyDrop::new(unsafe { stream.cudarc().upgrade_device_ptr::<T>(ptr, view.len()) });
    let out = catch_unwind(AssertUnwindSafe(|| f(slice.as_view_mut())));
    ManuallyDrop::into_inner(slice).leak();
    after_lend(view, &scope);
    out.unwrap_or_else(|panic| resume_unwind(panic))
}

fn same_length<A: Access>(view: &View<'_, A>, other: usize, op: &'static str) -> Result<()> {
    if view.len() == other {
        return Ok(());
    }
    Err(BackendError::Refused {
        call: op,
        reason: format!(
            "{} of {} has {} elements, the program's buffer {other}: a copy between a view and \
             a buffer needs equal lengths (slice the longer one)",
            view.request(),
            view.runner(),
            view.len()
        ),
    })
}

/// `view = src`, on `stream`.
pub(super) fn copy_from<T: Element, A: Access>(
    view: &View<'_, A>,
    stream: &Stream,
    src: &impl DevicePtr<T>,
) -> Result<()> {
    check_lend::<T, A>(view, stream, true)?;
    same_length(view, src.len(), "copy_from")?;
    // Writable: checked above (and by the caller's `Writable` bound).
    let mut dst = typed::<T, ReadWrite>(&view.with_access(), stream)?;
    stream.cudarc().memcpy_dtod(src, &mut dst)?;
    Ok(())
}

/// `dst = view`, on `stream`.
pub(super) fn copy_into<T: Element, A: Access>(
    view: &View<'_, A>,
    stream: &Stream,
    dst: &mut impl DevicePtrMut<T>,
) -> Result<()> {
    check_lend::<T, A>(view, stream, false)?;
    same_length(view, dst.len(), "copy_into")?;
    let src = typed::<T, A>(view, stream)?;
    stream.cudarc().memcpy_dtod(&src, dst)?;
    Ok(())
}
