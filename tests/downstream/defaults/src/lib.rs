//! Compiles the adoption path against this crate's cudarc choices.

#[path = "../../interop.rs"]
pub mod interop;
