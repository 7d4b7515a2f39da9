//! Proves: views cannot be forged with an arbitrary address; only a capture
//! or a `Replayable` hands them out.
use replay_arena::{DType, Domain, Request, RunnerId, View};

fn main() {
    let _view = View {
        addr: 0xdead_0000,
        arena: 0,
        offset: 0,
        request: Request::new(Domain::Device, DType::F32, 64),
        runner: RunnerId(0),
        _owner: std::marker::PhantomData,
    };
}
