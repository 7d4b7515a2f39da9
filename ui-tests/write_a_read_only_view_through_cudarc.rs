//! Proves: a view that may only be read (a consumer's, a received handoff)
//! cannot be written through cudarc. Its typed form implements `DevicePtr`
//! only; cudarc's writing calls (a copy's destination, `memset_zeros`, a
//! GEMM's output) take `DevicePtrMut`, as `write` below does. The crate's
//! own writing calls say the view is read-only.
use replay_arena::cuda::cudarc::driver::{DevicePtr, DevicePtrMut};
use replay_arena::cuda::{self, ViewExt};
use replay_arena::{Error, ReadOnly, Replayable, RunnerId, View};

/// What cudarc's writing calls ask of their destination.
fn write<D: DevicePtrMut<f32>>(_dst: &mut D) {}

fn consumer(replayable: &mut Replayable<cuda::Device>, stream: &cuda::Stream) {
    let _ = replayable.consume(RunnerId(0), stream, |s, views| {
        let mut typed = views[0].as_cuda::<f32>(s)?;
        write(&mut typed);
        Ok::<(), Error>(())
    });
}

fn received(handoff: View<'_, ReadOnly>, stream: &cuda::Stream, src: &impl DevicePtr<f32>) {
    let mut typed = handoff.as_cuda::<f32>(stream).unwrap();
    write(&mut typed);
    let _ = handoff.copy_from(stream, src);
}

fn main() {}
