//! The `sim` model's graph memory nodes come only from `alloc_async` and
//! `free_async`, so its use-after-free check knows every free in a graph.
//! A program cannot build a memory node and launch it (no `sim::Kernel` is
//! one, and `launch` takes no `sim::Node`:
//! `ui-tests/launch_a_sim_memory_node.rs`); this checks the runtime side:
//! the nodes a capture records are the ones its calls made, and a
//! temporary used after its free is refused.

use crate::support::record_and_finish;
use replay_arena::sim::{self, AsSpan};
use replay_arena::{
    BackendError, DType, Discovering, Domain, PlanConfig, Policy, Request, RunnerId,
};

const N: usize = 64;
const REQ: Request = Request::new(Domain::Device, DType::F32, N as u64);

#[test]
fn a_graphs_memory_nodes_are_its_alloc_and_free_calls_and_a_use_after_free_is_refused() {
    let planned = Discovering::from_runners(PlanConfig::new(), [(RunnerId(0), [REQ])])
        .unwrap()
        .plan(Policy::Generations(1))
        .unwrap();
    let sim = sim::Device::new();
    let pool = sim.new_stream();
    let mut capturing = planned.allocate(sim.clone()).unwrap();
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let view = cap.take(REQ).unwrap();
    let mut temp = None;
    let mut after_free = None;
    record_and_finish!(cap, &pool, |s| {
        let t = sim.alloc_async(s, N)?;
        sim.launch(s, sim::Kernel::fill(&t, 3.0), 1)?;
        sim.launch(s, sim::Kernel::copy(&t, &view), 1)?;
        sim.free_async(s, &t)?;
        after_free = Some(sim.launch(s, sim::Kernel::copy(&t, &view), 1));
        temp = Some(t.span());
        Ok::<(), BackendError>(())
    });
    let refused = after_free.unwrap().unwrap_err().to_string();
    assert!(refused.contains("freed (free_async) before"), "{refused}");
    let t = temp.unwrap();
    let replayable = capturing.seal().unwrap();
    let nodes: Vec<sim::Node> = replayable
        .graph(RunnerId(0))
        .unwrap()
        .ops()
        .iter()
        .map(|&(node, _)| node)
        .collect();
    assert!(
        matches!(
            nodes.as_slice(),
            [
                sim::Node::Alloc { addr: a, bytes: 256 },
                sim::Node::Kernel(sim::Kernel::Fill { .. }),
                sim::Node::Kernel(sim::Kernel::Copy { .. }),
                sim::Node::Free { addr: f },
            ] if *a == t.addr() && *f == t.addr()
        ),
        "{nodes:?}"
    );
}
