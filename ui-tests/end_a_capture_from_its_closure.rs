//! Proves: safe code cannot end the stream capture `stream_capture` opened
//! (its work on the runner's views would then run at once, unfenced).
use replay_arena::sim;
use replay_arena::{RunnerCapture};
use replay_arena::backend::Capture;

fn steal(cap: &RunnerCapture<'_, sim::Device>, sim: &sim::Device) {
    let stream = sim.new_stream();
    let _ = cap.stream_capture(&stream, |s| sim.end_capture(s).map(drop));
}

fn main() {}
