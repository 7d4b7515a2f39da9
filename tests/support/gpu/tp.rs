//! The tensor-parallel backward example's model (`examples/tp_backward`) on
//! the small configuration of its GPU tests, and the eager run a graphed
//! run of it is compared with.

#[path = "../../../examples/tp_backward/model.rs"]
pub mod model;

use replay_arena::{cuda, Discovering};

use model::{MainGrads, Model, Shape};

pub const SHAPE: Shape = Shape {
    hidden: 256,
    ffn: 1024,
    tokens: 128,
    layers: 3,
    workspace: 8 << 20,
};

/// An eager run of a model and what its graphed run needs: the eager run's
/// stream, a pool of two streams to replay on and a side stream for the
/// consumers; the eager main grads and zeroed ones for the graphed run;
/// the discovery.
pub struct Eager {
    pub stream: cuda::Stream,
    pub pool: [cuda::Stream; 2],
    pub side: cuda::Stream,
    pub main: MainGrads,
    pub graphed: MainGrads,
    pub discovery: Discovering,
}

impl Eager {
    /// `steps` eager steps of `model`; the first is the discovery step.
    pub fn run(cuda: &cuda::Device, model: &mut Model, steps: usize) -> Eager {
        let stream = cuda.new_stream().unwrap();
        let pool = [cuda.new_stream().unwrap(), cuda.new_stream().unwrap()];
        let side = cuda.new_stream().unwrap();
        let main = model.main_grads().unwrap();
        let graphed = model.main_grads().unwrap();
        let discovery = model.discover(&main, &stream).unwrap();
        for _ in 1..steps {
            model.eager_step(&main, &stream).unwrap();
        }
        Eager {
            stream,
            pool,
            side,
            main,
            graphed,
            discovery,
        }
    }
}
