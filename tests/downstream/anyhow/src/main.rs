//! Runs the lifecycle on device 0, or says in one line that there is no
//! usable CUDA driver. With cudarc's default features (dynamic loading) and
//! no libcuda, the probe is a typed error, not a panic inside cudarc.

use replay_arena::BackendError;

fn main() -> anyhow::Result<()> {
    match downstream_anyhow::run() {
        Ok(()) => println!("ran on the GPU"),
        Err(e) => match e.downcast_ref::<BackendError>() {
            Some(BackendError::Unavailable { reason }) => println!("no CUDA: {reason}"),
            _ => return Err(e),
        },
    }
    Ok(())
}
