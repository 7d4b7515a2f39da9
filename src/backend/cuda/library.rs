//! The driver and NCCL libraries opened by name, as cudarc's dynamic
//! loading opens them, and their entry points looked up without calling
//! anything: what the probes check before cudarc is asked, and where the
//! entry points cudarc does not bind for every CUDA version come from.

/// File names for a library `stem` (`"cuda"`, `"nvcuda"`, `"nccl"`) in the
/// order cudarc's dynamic loading tries them: the plain name, its numbered
/// Windows-style names and the sonames `.so.13` to `.so.1`, for each CUDA
/// major version cudarc has bindings for (cudarc tries its own major's).
fn library_candidates(stem: &str) -> Vec<String> {
    use std::env::consts::{DLL_PREFIX, DLL_SUFFIX};
    let base = format!("{DLL_PREFIX}{stem}{DLL_SUFFIX}");
    let mut names = vec![base.clone(), format!("{DLL_PREFIX}{stem}64{DLL_SUFFIX}")];
    for major in [13, 12, 11] {
        names.push(format!("{DLL_PREFIX}{stem}64_{major}{DLL_SUFFIX}"));
        names.push(format!("{DLL_PREFIX}{stem}64_{major}0_0{DLL_SUFFIX}"));
    }
    for major in [13, 12, 11, 10, 9, 1] {
        names.push(format!("{base}.{major}"));
    }
    names
}

/// The first library among the `stems`' [`library_candidates`] that the
/// dynamic loader opens. Checked before cudarc is asked for anything, in
/// every cudarc configuration: cudarc's own dynamic loading (its
/// `dynamic-loading` feature, or `fallback-dynamic-loading` from its default
/// features) panics when it finds no library, and under a linking mode the
/// loader bound the library at start-up, so opening it again finds it.
pub(crate) fn open_library(stems: &[&str]) -> Option<libloading::Library> {
    stems
        .iter()
        .flat_map(|stem| library_candidates(stem))
        // SAFETY: a CUDA or NCCL library's initializers have no
        // preconditions; nothing in the library is called.
        .find_map(|name| unsafe { libloading::Library::new(name) }.ok())
}

/// The names among `required` that `lib` does not export (cudarc panics on
/// the first call of a missing one; the probes ask first).
pub(crate) fn missing_symbols<'n>(lib: &libloading::Library, required: &[&'n str]) -> Vec<&'n str> {
    required
        .iter()
        .copied()
        // SAFETY: looking a symbol up calls nothing.
        .filter(|name| unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err())
        .collect()
}
