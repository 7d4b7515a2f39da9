//! The `cuda` backend: the CUDA driver through cudarc.
//!
//! - [`probe`] / [`probe_device`] say whether a usable driver and device exist,
//!   without panicking in any of cudarc's linking modes: they first check
//!   that `libcuda` and every entry point used can be loaded, by the names
//!   cudarc's dynamic loading tries (cudarc panics when they cannot).
//! - [`Device::new`] retains a device's primary context in a cudarc
//!   context of its own; [`Device::from_context`] adopts the program's
//!   `Arc<CudaContext>` (candle's, cubecl's, a hand-written cudarc
//!   program's). cudarc's automatic event tracking must be off on an adopted
//!   context (it inserts waits on events recorded outside a capture): a
//!   context that tracks is refused with [`BackendError::EventTracking`],
//!   unless adopted through
//!   [`Device::from_context_disabling_event_tracking`].
//! - [`Device::new_stream`] makes non-blocking streams;
//!   [`Device::wrap_stream`] adopts the program's, the per-thread
//!   default stream included. Only the legacy NULL stream is refused
//!   ([`BackendError::LegacyStream`]): the driver cannot capture it.
//! - Arenas come from the device's default memory pool (`cuMemAllocAsync`,
//!   `cuMemAlloc` where pools are unsupported), outside every graph memory
//!   pool, aligned to [`ARENA_ALIGNMENT`] and zeroed; they are freed with
//!   `cuMemFreeAsync`, which does not wait for the program's other streams.
//!   Events are created with `CU_EVENT_DISABLE_TIMING` and recorded once at
//!   creation; only a trace's timing marks ([`Mark`]) keep timing on.
//! - Captures use the [`CaptureMode`] of the backend handle the plan was
//!   allocated with (thread-local unless chosen with
//!   [`Device::with_capture_mode`]); a captured graph is instantiated at
//!   once, uploaded to the device on the capture stream (so the first replay
//!   does not pay the upload; see [`Device::with_graph_upload`]) and owned by a
//!   [`Graph`], whose raw `CUgraphExec` stays reachable.
//! - Views become typed cudarc device pointers through [`ViewExt::as_cuda`]:
//!   a [`TypedView`] implements cudarc's `DevicePtr`, and `DevicePtrMut`
//!   when its view is writable (a [`ReadOnly`](crate::ReadOnly) view's
//!   typed form is only read, as cudarc's `CudaView`), so
//!   `memcpy_dtod`, `memset_zeros`, cuBLAS and `launch_builder().arg(..)`
//!   take it. It never frees arena memory.
//!
//! Every raw driver call goes through one checked wrapper per entry point
//! (`result.rs`, as cudarc's `driver/result.rs`; `tests/suite/architecture/layering.rs`
//! checks that no other file calls `sys::cu*`). Driver errors are stored as
//! the raw `CUresult`, formatted by this crate: formatting a cudarc
//! `DriverError` calls into `libcuda`.

mod library;
mod result;
mod probe;
mod device;
mod arena;
mod graph;
mod element;
mod typed_view;
mod lend;
mod view_ext;
mod backend;
mod timing;

pub use cudarc;
use cudarc::driver::sys;

pub use arena::Arena;
#[cfg(replay_arena_nccl)]
pub(crate) use backend::sealed::Sealed;
pub use backend::AsDevice;
pub use device::{CaptureMode, Device, Event, InstantiateFlags, Stream, StreamPriorities};
pub use element::{Element, F8E4M3, F8E5M2};
pub use graph::Graph;
#[cfg(replay_arena_nccl)]
pub(crate) use library::{missing_symbols, open_library};
pub use probe::{probe, probe_device, DeviceInfo};
pub use timing::Mark;
pub use typed_view::TypedView;
pub use view_ext::ViewExt;

use crate::backend::BackendError;

type Result<T> = std::result::Result<T, BackendError>;

/// Every arena's base address is a multiple of this (at least the largest
/// domain alignment).
pub const ARENA_ALIGNMENT: u64 = 4096;

/// A cudarc error as this crate's error, without formatting it through cudarc.
fn driver_error(op: &'static str, error: cudarc::driver::DriverError) -> BackendError {
    BackendError::Driver {
        call: op,
        code: error.0,
    }
}

fn unavailable(reason: impl Into<String>) -> BackendError {
    BackendError::Unavailable {
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::Replayable;
    use cudarc::driver::{DevicePtr, DevicePtrMut};
    use static_assertions::{assert_impl_all, assert_not_impl_any};

    assert_impl_all!(Device: Send, Sync, Clone);
    assert_impl_all!(Stream: Send, Sync, Clone);
    assert_impl_all!(Arena: Send, Sync);
    assert_impl_all!(Event: Send, Sync);
    assert_impl_all!(Mark: Send);
    assert_impl_all!(Graph: Send);
    assert_not_impl_any!(Graph: Sync, Clone);
    assert_impl_all!(Replayable<Device>: Send);
    assert_impl_all!(TypedView<'static, f32>: DevicePtr<f32>, DevicePtrMut<f32>);
    // A read-only view's typed form is read through cudarc, never written.
    assert_impl_all!(TypedView<'static, f32, crate::view::ReadOnly>: DevicePtr<f32>);
    assert_not_impl_any!(TypedView<'static, f32, crate::view::ReadOnly>: DevicePtrMut<f32>);
    // A typed view stays on its closure's thread: another thread could use
    // it after the closure returned, between its checks and the enqueue.
    assert_not_impl_any!(TypedView<'static, f32>: Send, Sync);
}
