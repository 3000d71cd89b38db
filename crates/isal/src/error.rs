//! The one error type of this crate.
//!
//! Every fallible call validates its arguments completely *before* touching
//! any buffer or calling into ISA-L, so an `Err` means nothing was written.
//! Messages name the operation and argument that was wrong, the offending
//! value, and what the caller should pass instead.

use thiserror::Error;

/// What went wrong in [`crate::Codec::new`], [`crate::Codec::encode`] or
/// [`crate::Codec::reconstruct`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The requested code shape cannot be built.
    #[error(
        "cannot create a {k}+{r} erasure code: need k >= 1 data splits and k + r <= {max} \
         splits in total; choose a smaller k or r"
    )]
    InvalidGeometry {
        /// Requested number of data splits.
        k: usize,
        /// Requested number of parity splits.
        r: usize,
        /// Largest supported `k + r`.
        max: usize,
    },

    /// A slice of splits had the wrong number of entries.
    #[error(
        "{op}: got {got} {what} splits but this {k}+{r} code needs exactly {expected}; \
         pass one buffer per {what} split"
    )]
    WrongSplitCount {
        /// The operation (`encode` or `reconstruct`).
        op: &'static str,
        /// Which argument (`data`, `parity`, `present`).
        what: &'static str,
        /// Number of entries required.
        expected: usize,
        /// Number of entries passed.
        got: usize,
        /// Data splits of the code.
        k: usize,
        /// Parity splits of the code.
        r: usize,
    },

    /// The split length is zero or too large for ISA-L's `int` length.
    #[error("{op}: split length {len} is not supported; splits must be 1..={max} bytes long")]
    InvalidLength {
        /// The operation (`encode` or `reconstruct`).
        op: &'static str,
        /// The length of the first split.
        len: usize,
        /// Largest supported length (`i32::MAX`).
        max: usize,
    },

    /// Not all splits of one call have the same length.
    #[error(
        "{op}: {what} split at position {position} is {len} bytes but the first split is \
         {expected} bytes; all splits of one page must have the same length"
    )]
    LengthMismatch {
        /// The operation (`encode` or `reconstruct`).
        op: &'static str,
        /// Which argument (`data`, `parity`, `present`, `missing`).
        what: &'static str,
        /// Position of the offending entry in that argument.
        position: usize,
        /// Its length.
        len: usize,
        /// Length of the first split of the call.
        expected: usize,
    },

    /// A split index is not below `k + r`.
    #[error(
        "reconstruct: {what} split index {index} is out of range for a {k}+{r} code; valid \
         indices are 0..{n} (0..k data, k..k+r parity)",
        n = k + r
    )]
    IndexOutOfRange {
        /// Which argument (`present` or `missing`).
        what: &'static str,
        /// The offending index.
        index: usize,
        /// Data splits of the code.
        k: usize,
        /// Parity splits of the code.
        r: usize,
    },

    /// The same split index was listed twice in one argument.
    #[error("reconstruct: split index {index} is listed twice in {what}; list each split once")]
    DuplicateIndex {
        /// Which argument (`present` or `missing`).
        what: &'static str,
        /// The repeated index.
        index: usize,
    },

    /// A split index was listed both as present and as missing.
    #[error(
        "reconstruct: split index {index} is listed both in present and in missing; a split \
         is either available or to be rebuilt, remove it from one of the two"
    )]
    PresentAndMissing {
        /// The index found in both arguments.
        index: usize,
    },

    /// The `k x k` generator submatrix of the present splits could not be
    /// inverted. Cannot happen with the Cauchy generator used by `Codec`;
    /// seeing it means a bug in this crate or in ISA-L.
    #[error(
        "reconstruct: the generator rows of present splits (bitmask {present_mask:#x}) form a \
         singular matrix, so the data cannot be decoded; this is a bug in hydramem-isal, \
         please report it"
    )]
    SingularMatrix {
        /// Bitmask of the present split indices.
        present_mask: u32,
    },
}
