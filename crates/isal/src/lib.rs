//! Reed-Solomon erasure coding of memory pages with Intel ISA-L.
//!
//! Hydra splits every page into `k` data splits and computes `r` parity
//! splits, so that any `k` of the `k + r` splits rebuild the page. This crate
//! is the only FFI boundary of hydramem: it wraps ISA-L's `erasure_code`
//! (linked statically from the source that `isal-sys` vendors and builds,
//! with ISA-L's run-time dispatch picking the AVX-512 GFNI kernels where the
//! CPU has them) behind the safe, allocation-free [`Codec`].
//!
//! Invariants:
//! - `1 <= k` and `k + r <=` [`MAX_SPLITS`]; split `i` is data for `i < k`
//!   and parity for `k <= i < k + r`;
//! - the generator is systematic Cauchy (identity on top), so every `k x k`
//!   submatrix is invertible and *any* `k` splits suffice to decode;
//! - all splits of one call have the same length, at least 1 byte; there is
//!   no alignment or multiple-of requirement;
//! - [`Codec::encode`] and cache-hit [`Codec::reconstruct`] never allocate;
//!   a [`Codec`] is `Send + Sync` and meant to be shared through an `Arc`.
//!
//! ```
//! use hydramem_isal::Codec;
//!
//! let codec = Codec::new(2, 1)?;
//! let (a, b) = ([1u8; 16], [2u8; 16]);
//! let mut p = [0u8; 16];
//! codec.encode(&[&a, &b], &mut [&mut p])?;
//! let mut lost = [0u8; 16];
//! codec.reconstruct(&[(1, &b), (2, &p)], &mut [(0, &mut lost)])?;
//! assert_eq!(lost, a);
//! # Ok::<(), hydramem_isal::CodecError>(())
//! ```

// `isal-sys` is used only for its build script, which compiles ISA-L and
// emits the link directives for the static `libisal`; naming the crate keeps
// it (and those directives) in the link.
use isal_sys as _;

mod cache;
mod codec;
mod error;
pub mod ffi;

pub use codec::{Codec, MAX_SPLITS};
pub use error::CodecError;
