//! Uses the `nccl` backend without one of replay-arena's NCCL version
//! features.

pub use replay_arena::nccl::available;
