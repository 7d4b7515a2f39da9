//! Turns the NCCL backend on only when `nccl` comes with an NCCL version
//! feature (cfg `replay_arena_nccl`); `src/lib.rs` stops the build with a
//! `compile_error!` naming the fix otherwise, instead of cudarc's missing
//! `nccl` module showing up deep inside this crate.

const NCCL_VERSIONS: [&str; 2] = ["NCCL_02028", "NCCL_VERSION_FROM_CUDARC"];

fn main() {
    println!("cargo::rustc-check-cfg=cfg(replay_arena_nccl)");
    println!("cargo::rerun-if-changed=build.rs");
    let on = |feature: &str| std::env::var_os(format!("CARGO_FEATURE_{feature}")).is_some();
    if on("NCCL") && NCCL_VERSIONS.iter().any(|v| on(v)) {
        println!("cargo::rustc-cfg=replay_arena_nccl");
    }
}
