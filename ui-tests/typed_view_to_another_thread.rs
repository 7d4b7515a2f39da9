// A typed cudarc view stays on the thread of the closure that made it:
// another thread could use it after that closure returned (its capture
// ended, or its consumer's completion recorded), between its checks and
// cudarc's enqueue.
use replay_arena::cuda::TypedView;

fn on_another_thread<T: Send>(_: T) {}

fn handed_over(view: TypedView<'_, f32>) {
    on_another_thread(view);
}

fn main() {}
