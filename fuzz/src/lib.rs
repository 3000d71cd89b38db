//! Oracles shared by the fuzz targets: what a correct peer must answer to a given input,
//! computed from the protocol's rules rather than from the code under test, and checks of
//! the bytes the code really sent against that answer.
//!
//! Invariants: an oracle reads only its inputs (no global state, no randomness), so a crash
//! reproduces from its input file alone; every check that fails panics with what was
//! expected, what was found and where, which libFuzzer reports as a crash with the input
//! that caused it.

pub mod nbd;
