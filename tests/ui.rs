//! Compile-time misuse: every case under `ui-tests/` must fail to compile, with
//! the diagnostic in its `.stderr` file (bless with
//! `TRYBUILD=overwrite cargo test --test ui`, then read every diff).

#[test]
fn ui() {
    trybuild::TestCases::new().compile_fail("ui-tests/*.rs");
}
