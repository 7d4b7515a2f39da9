//! A `sim` graph launch that fails enqueues nothing of the graph.

use replay_arena::sim;

#[test]
fn a_failed_sim_graph_launch_enqueues_nothing() {
    use replay_arena::backend::{Capture, Launch};
    let sim = sim::Device::new();
    let [capture, other] = crate::support::streams(&sim);
    let kept = sim.alloc_f32(64).unwrap();
    let dropped = sim.alloc_f32(64).unwrap();
    sim.begin_capture(&capture).unwrap();
    sim.launch(&capture, sim::Kernel::fill(&kept, 1.0), 10)
        .unwrap();
    sim.launch(&capture, sim::Kernel::fill(&dropped, 2.0), 10)
        .unwrap();
    // SAFETY: the capture this test began.
    let graph = unsafe { sim.end_capture(&capture) }.unwrap();
    drop(dropped);
    // SAFETY: the graph touches the program's own buffers only.
    let err = unsafe { Launch::launch(&sim, &graph, &other) }.unwrap_err();
    assert!(
        err.to_string().contains("outside every live allocation"),
        "{err}"
    );
    assert_eq!(sim.stream_time(&other), 0, "the first op was not enqueued");
    assert_eq!(sim.read_f32(&kept).unwrap(), vec![0.0; 64]);
}
