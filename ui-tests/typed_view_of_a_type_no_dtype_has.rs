//! Proves: a view is typed only as an element type of a dtype; `u32` (no
//! dtype of the crate's) is refused at compile time, and the message names
//! the element types there are.
use replay_arena::cuda::{self, ViewExt};
use replay_arena::View;

fn typed(view: &View<'_>, stream: &cuda::Stream) {
    let _ = view.as_cuda::<u32>(stream);
}

fn main() {}
