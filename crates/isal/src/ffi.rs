//! Raw `extern "C"` declarations for the part of ISA-L's erasure-code API that
//! this crate uses.
//!
//! The `isal-sys` crate builds the whole ISA-L v2.31 as a static library but
//! only generates Rust bindings for igzip, so the erasure-code entry points
//! are declared here by hand, copied from `include/erasure_code.h` of the
//! vendored source. The signatures keep ISA-L's non-const pointers; ISA-L
//! only *reads* `gftbls` and the source buffers in [`ec_encode_data`], so
//! callers may pass pointers derived from shared references cast to `*mut`.
//!
//! Invariants the C side relies on (and that [`crate::Codec`] upholds):
//! - tables built by [`ec_init_tables`] are only ever passed to
//!   [`ec_encode_data`] (both are dispatched by ISA-L's multibinary on the
//!   same CPU feature test, so their table formats always agree; the
//!   `_base` encoder must *not* be fed tables from the dispatched
//!   [`ec_init_tables`], whose GFNI format differs);
//! - a table buffer is `32 * k * rows` bytes (the GFNI format uses only the
//!   first `8 * k * rows`, but the size contract is the same for all paths);
//! - `len >= 1`: every dispatched path of [`ec_encode_data`] handles any
//!   positive length (SSE/AVX fall back to the scalar code below 16 bytes,
//!   AVX2 below 32, AVX-512 below 64, and the GFNI kernels use masked tail
//!   loads/stores), and none of them requires aligned buffers.

use std::os::raw::{c_int, c_uchar};

extern "C" {
    /// Expands a `rows x k` coefficient matrix `a` into the lookup tables
    /// used by [`ec_encode_data`]; `gftbls` must hold `32 * k * rows` bytes.
    /// Dispatched at run time (GFNI format on AVX-512 GFNI/AVX2 GFNI CPUs).
    pub fn ec_init_tables(k: c_int, rows: c_int, a: *mut c_uchar, gftbls: *mut c_uchar);

    /// Computes `rows` output vectors of `len` bytes, each the GF(2^8) dot
    /// product of the `k` source vectors with one row of the coefficients
    /// that `gftbls` was built from. Dispatched at run time to the best
    /// kernel (AVX-512 GFNI where available).
    pub fn ec_encode_data(
        len: c_int,
        k: c_int,
        rows: c_int,
        gftbls: *mut c_uchar,
        data: *mut *mut c_uchar,
        coding: *mut *mut c_uchar,
    );

    /// Fills the `m x k` matrix `a` with an identity on top of a Cauchy
    /// block `1 / (i ^ j)`; every `k x k` submatrix of it is invertible,
    /// which is what makes any `k` of the `m` splits sufficient.
    pub fn gf_gen_cauchy1_matrix(a: *mut c_uchar, m: c_int, k: c_int);

    /// Inverts the `n x n` matrix `in_` into `out`, destroying `in_`.
    /// Returns 0 on success and non-zero if the matrix is singular.
    pub fn gf_invert_matrix(in_: *mut c_uchar, out: *mut c_uchar, n: c_int) -> c_int;

    /// Multiplies two elements of GF(2^8) (polynomial 0x11d).
    pub fn gf_mul(a: c_uchar, b: c_uchar) -> c_uchar;
}
