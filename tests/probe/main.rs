//! The backends' probes on any machine: with no driver (or no NCCL) they
//! return a typed error and never panic; on a GPU machine (`REQUIRE_GPU=1`)
//! they find the device and open.

mod backend {
    mod cuda;
    mod nccl;
}
