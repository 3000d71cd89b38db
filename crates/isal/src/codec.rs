//! [`Codec`]: a `k + r` Reed-Solomon code over GF(2^8) driven by ISA-L.
//!
//! Concept: the `(k + r) x k` generator matrix `G` maps the `k` data splits
//! to all `k + r` splits (row `i` of `G` produces split `i`). `G` is ISA-L's
//! systematic Cauchy matrix, so rows `0..k` are the identity and any `k` rows
//! form an invertible matrix. Encoding multiplies the data by the parity rows
//! `G[k..k+r]`. Decoding from a set `P` of `k` present splits inverts the
//! submatrix `G[P]`: data split `d` is row `d` of `G[P]^-1` applied to the
//! present splits, and parity split `p` is `G[p] * G[P]^-1` applied to them.
//! Both are a single `ec_encode_data` call with the right tables.
//!
//! Invariants:
//! - arguments are validated completely before any buffer is written;
//! - split pointers handed to ISA-L live in fixed `[_; MAX_SPLITS]` stack
//!   arrays, ordered by ascending split index (the order the cached decode
//!   tables were built in), so the hot paths never touch the heap;
//! - decode tables are cached per `(present mask, missing mask)` in an
//!   insert-only cache with lock-free lookups that lives as long as the
//!   `Codec`.

use std::mem::MaybeUninit;
use std::os::raw::c_int;
use std::sync::Once;

use crate::cache::{pattern_key, DecodeCache, Tables};
use crate::error::CodecError;
use crate::ffi;

/// Most splits (`k + r`) a code may have. Split sets are `u32` bitmasks and
/// pointer arrays of this size live on the stack.
pub const MAX_SPLITS: usize = 32;

/// Bytes of ISA-L table per generator coefficient (the size contract of
/// `ec_init_tables`, whatever format the dispatched version writes).
const TABLE_BYTES_PER_COEFF: usize = 32;

/// Longest split ISA-L can take (its lengths are C `int`).
const MAX_LEN: usize = i32::MAX as usize;

/// An unset entry of a split-pointer array.
const UNSET: MaybeUninit<*mut u8> = MaybeUninit::uninit();

/// An erasure code with `k` data and `r` parity splits.
///
/// Thread safety: `Codec` is `Send + Sync`; all methods take `&self` and may
/// run concurrently from any number of threads (share it with `Arc`).
/// Concurrent first uses of the same loss pattern may each build the decode
/// tables, but only one copy is kept and all results are identical.
pub struct Codec {
    k: usize,
    r: usize,
    /// `(k + r) x k` generator, row-major; only the first `(k + r) * k`
    /// bytes are used. Kept inline: it is read only on cache misses.
    generator: [u8; MAX_SPLITS * MAX_SPLITS],
    /// ISA-L tables for the parity rows `G[k..k+r]` (`32 * k * r` bytes).
    encode_tables: Tables,
    /// Decode tables per loss pattern.
    cache: DecodeCache,
}

impl std::fmt::Debug for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Codec")
            .field("k", &self.k)
            .field("r", &self.r)
            .finish_non_exhaustive()
    }
}

/// Resolves ISA-L's multibinary dispatch once, before any `Codec` is used.
///
/// ISA-L resolves each dispatched function on its first call by storing a
/// function pointer in a global. Two threads making that first call at once
/// store the same value, which is benign on x86, but doing it under a `Once`
/// makes every later call (ordered after `Codec::new` by whatever shared the
/// `Codec`) read a settled pointer.
fn init_dispatch() {
    static DISPATCH: Once = Once::new();
    DISPATCH.call_once(|| {
        let mut coeff = [1u8];
        let mut tables = [0u8; TABLE_BYTES_PER_COEFF];
        let mut src_buf = [0x5au8];
        let mut dst_buf = [0u8];
        let mut src = [src_buf.as_mut_ptr()];
        let mut dst = [dst_buf.as_mut_ptr()];
        // SAFETY: a 1x1 coefficient matrix, a 32-byte table buffer
        // (32 * k * rows with k = rows = 1), and one source and one
        // destination buffer of `len` = 1 byte, all live for the calls.
        unsafe {
            ffi::ec_init_tables(1, 1, coeff.as_mut_ptr(), tables.as_mut_ptr());
            ffi::ec_encode_data(
                1,
                1,
                1,
                tables.as_mut_ptr(),
                src.as_mut_ptr(),
                dst.as_mut_ptr(),
            );
        }
        debug_assert_eq!(dst_buf, src_buf, "ISA-L identity encode is broken");
    });
}

/// GF(2^8) product (ISA-L's field, polynomial 0x11d).
#[inline]
fn gf_mul(a: u8, b: u8) -> u8 {
    // SAFETY: `gf_mul` is a pure function of two bytes; no pointers.
    unsafe { ffi::gf_mul(a, b) }
}

/// Binomial coefficient, saturating at `usize::MAX`.
fn binomial(n: usize, k: usize) -> usize {
    if k > n {
        return 0;
    }
    let k = k.min(n - k);
    let mut acc: u128 = 1;
    for i in 0..k {
        // acc * (n - i) / (i + 1) stays integral at every step.
        acc = acc * (n - i) as u128 / (i + 1) as u128;
        if acc > usize::MAX as u128 {
            return usize::MAX;
        }
    }
    acc as usize
}

/// Iterates over the set bits of `mask`, lowest first, as indices.
#[inline]
fn bits(mut mask: u32) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if mask == 0 {
            return None;
        }
        let i = mask.trailing_zeros() as usize;
        mask &= mask - 1;
        Some(i)
    })
}

/// Checks the common split length of a call.
#[inline]
fn check_len(op: &'static str, len: usize) -> Result<c_int, CodecError> {
    if len == 0 || len > MAX_LEN {
        return Err(CodecError::InvalidLength {
            op,
            len,
            max: MAX_LEN,
        });
    }
    // Cannot fail after the range check above.
    c_int::try_from(len).map_err(|_| CodecError::InvalidLength {
        op,
        len,
        max: MAX_LEN,
    })
}

impl Codec {
    /// Builds a `k + r` code: the Cauchy generator and its encode tables.
    ///
    /// Needs `k >= 1` and `k + r <= MAX_SPLITS`; `r = 0` is allowed (no
    /// redundancy; `encode` then writes nothing). Allocates; call it once
    /// per code shape and share the result.
    pub fn new(k: usize, r: usize) -> Result<Codec, CodecError> {
        let n = match k.checked_add(r) {
            Some(n) if k >= 1 && n <= MAX_SPLITS => n,
            _ => {
                return Err(CodecError::InvalidGeometry {
                    k,
                    r,
                    max: MAX_SPLITS,
                })
            }
        };
        init_dispatch();

        let mut generator = [0u8; MAX_SPLITS * MAX_SPLITS];
        // SAFETY: the buffer holds MAX_SPLITS^2 >= n * k bytes, which is all
        // that `gf_gen_cauchy1_matrix(a, m = n, k)` writes; n, k <= 32 fit
        // in `int`.
        unsafe { ffi::gf_gen_cauchy1_matrix(generator.as_mut_ptr(), n as c_int, k as c_int) };

        let mut encode_tables = Tables::zeroed(TABLE_BYTES_PER_COEFF * k * r);
        if r > 0 {
            // Copy so that the `*mut` ISA-L asks for cannot alias anything.
            let mut parity_rows = [0u8; MAX_SPLITS * MAX_SPLITS];
            parity_rows[..r * k].copy_from_slice(&generator[k * k..n * k]);
            // SAFETY: `parity_rows` holds the r x k coefficients read by
            // `ec_init_tables(k, rows = r, ..)`, and `encode_tables` was
            // sized to the 32 * k * r bytes it writes.
            unsafe {
                ffi::ec_init_tables(
                    k as c_int,
                    r as c_int,
                    parity_rows.as_mut_ptr(),
                    encode_tables.as_mut_ptr(),
                )
            };
        }

        // Every loss pattern: a k-subset present, a non-empty subset of the
        // other r splits missing.
        let patterns = binomial(n, k).saturating_mul((1usize << r) - 1);
        Ok(Codec {
            k,
            r,
            generator,
            encode_tables,
            cache: DecodeCache::with_patterns(patterns),
        })
    }

    /// Number of data splits.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Number of parity splits.
    pub fn r(&self) -> usize {
        self.r
    }

    /// Computes the `r` parity splits of the `k` data splits.
    ///
    /// `data` must hold exactly `k` slices and `parity` exactly `r`, all of
    /// the same length `>= 1` (any length; no alignment needed). Does not
    /// allocate. On error nothing is written.
    pub fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), CodecError> {
        const OP: &str = "encode";
        if data.len() != self.k {
            return Err(self.wrong_count(OP, "data", self.k, data.len()));
        }
        if parity.len() != self.r {
            return Err(self.wrong_count(OP, "parity", self.r, parity.len()));
        }
        let len = data.first().map_or(0, |d| d.len());
        let c_len = check_len(OP, len)?;

        // Uninitialised: zeroing 2 x 256 bytes per call would be a visible
        // part of a ~60 ns call; only the first k (r) entries are read.
        let mut src = [UNSET; MAX_SPLITS];
        for (position, (split, slot)) in data.iter().zip(src.iter_mut()).enumerate() {
            if split.len() != len {
                return Err(mismatch(OP, "data", position, split.len(), len));
            }
            // ISA-L takes `unsigned char **` but only reads the sources.
            *slot = MaybeUninit::new(split.as_ptr().cast_mut());
        }
        let mut dst = [UNSET; MAX_SPLITS];
        for (position, (split, slot)) in parity.iter_mut().zip(dst.iter_mut()).enumerate() {
            if split.len() != len {
                return Err(mismatch(OP, "parity", position, split.len(), len));
            }
            *slot = MaybeUninit::new(split.as_mut_ptr());
        }
        if self.r == 0 {
            return Ok(());
        }
        // SAFETY: `src[..k]` were initialised (the loop above ran over all k
        // = data.len() entries) and point to k live, readable slices;
        // likewise `dst[..r]` to r live, writable slices; all are `len` >= 1
        // bytes long and ISA-L reads no further entries. The
        // destinations are `&mut` so they alias neither each other nor the
        // sources. `encode_tables` holds 32 * k * r bytes built by the
        // dispatched `ec_init_tables` for exactly (k, r), which ISA-L only
        // reads. k, r <= 32 fit in `int`.
        unsafe {
            ffi::ec_encode_data(
                c_len,
                self.k as c_int,
                self.r as c_int,
                self.encode_tables.as_ptr(),
                src.as_mut_ptr().cast(),
                dst.as_mut_ptr().cast(),
            )
        };
        Ok(())
    }

    /// Rebuilds the `missing` splits from `k` `present` ones.
    ///
    /// `present` holds exactly `k` distinct split indices (`0..k` data,
    /// `k..k+r` parity) with their contents, in any order. `missing` holds
    /// split indices (data or parity, none of them present, each once) with
    /// the buffers to write them into, in any order; it may be empty. All
    /// slices have the same length `>= 1`.
    ///
    /// The first call for a given (present set, missing set) inverts a
    /// matrix and builds ISA-L tables (allocates, microseconds); later calls
    /// with the same sets reuse them and do not allocate. The cache holds
    /// every pattern of small codes (8+2 has 135); only wide codes exceed
    /// its 12,288 entries (16+4 has 72,675 patterns), and patterns beyond
    /// that are rebuilt, allocating, on every call. Passing both lists in
    /// ascending index order saves a re-sorting pass. On error nothing is
    /// written.
    pub fn reconstruct(
        &self,
        present: &[(usize, &[u8])],
        missing: &mut [(usize, &mut [u8])],
    ) -> Result<(), CodecError> {
        const OP: &str = "reconstruct";
        if present.len() != self.k {
            return Err(self.wrong_count(OP, "present", self.k, present.len()));
        }
        let len = present.first().map_or(0, |p| p.1.len());
        let c_len = check_len(OP, len)?;

        // ISA-L wants the pointers in ascending split index order (the order
        // the decode tables are built in). Callers usually pass them sorted,
        // so write them in place while validating and only re-place them by
        // rank if the input turned out to be unsorted. The arrays are left
        // uninitialised for speed (see `encode`); only the first k (rows)
        // entries are written and read.
        //
        // This loop is most of the wrapper's cost, so it keeps the checks
        // lean: one branch for range and length, and the duplicate test
        // only for out-of-order input (ascending order rules duplicates
        // out). Any problem goes to `argument_error`, which rescans the
        // arguments to report the first one precisely. Nothing is written
        // to the caller's buffers before the ISA-L call.
        let mut src = [UNSET; MAX_SPLITS];
        let mut present_mask = 0u32;
        let mut sorted = true;
        let n = self.k + self.r;
        for (&(index, split), slot) in present.iter().zip(src.iter_mut()) {
            if (index >= n) | (split.len() != len) {
                return Err(self.argument_error(present, missing, len));
            }
            let bit = 1u32 << index;
            // Ascending so far iff every earlier index is below this one,
            // which also rules out a duplicate.
            if present_mask >= bit {
                if present_mask & bit != 0 {
                    return Err(self.argument_error(present, missing, len));
                }
                sorted = false;
            }
            present_mask |= bit;
            // ISA-L takes `unsigned char **` but only reads the sources.
            *slot = MaybeUninit::new(split.as_ptr().cast_mut());
        }

        let mut dst = [UNSET; MAX_SPLITS];
        let mut missing_mask = 0u32;
        for ((index, split), slot) in missing.iter_mut().zip(dst.iter_mut()) {
            let index = *index;
            if (index >= n) | (split.len() != len) {
                return Err(self.argument_error(present, missing, len));
            }
            let bit = 1u32 << index;
            if present_mask & bit != 0 {
                return Err(CodecError::PresentAndMissing { index });
            }
            if missing_mask >= bit {
                if missing_mask & bit != 0 {
                    return Err(self.argument_error(present, missing, len));
                }
                sorted = false;
            }
            missing_mask |= bit;
            *slot = MaybeUninit::new(split.as_mut_ptr());
        }
        let rows = missing.len();
        if rows > MAX_SPLITS {
            // Cannot be valid: there are only k + r <= MAX_SPLITS splits.
            return Err(self.argument_error(present, missing, len));
        }
        if missing_mask == 0 {
            return Ok(());
        }
        if !sorted {
            place_by_rank(
                &mut src,
                present_mask,
                present.iter().map(|(i, s)| (*i, s.as_ptr().cast_mut())),
            );
            place_by_rank(
                &mut dst,
                missing_mask,
                missing.iter_mut().map(|(i, s)| (*i, s.as_mut_ptr())),
            );
        }

        let Some(tables) = self.cache.get(pattern_key(present_mask, missing_mask)) else {
            return self.reconstruct_uncached(c_len, present_mask, missing_mask, &src, &dst);
        };
        // SAFETY: `src[..k]` were all written (the validation loop covered
        // all k = present.len() entries, and re-placing by rank writes each
        // of the k distinct ranks once) and point to the present slices;
        // likewise `dst[..rows]` to the `rows` missing output slices (`&mut`,
        // so unaliased); all are live and `len` >= 1 bytes long, each array
        // is in ascending split index order, and ISA-L reads no further
        // entries. `tables` were built by the dispatched `ec_init_tables`
        // for (k, rows) from exactly this present/missing pattern in that
        // same order (see `decode_tables`), are 32 * k * rows bytes that the
        // cache keeps alive while `self` is borrowed, and are only read.
        // k, rows <= 32 fit in `int`.
        unsafe {
            ffi::ec_encode_data(
                c_len,
                self.k as c_int,
                rows as c_int,
                tables.as_ptr(),
                src.as_ptr().cast_mut().cast(),
                dst.as_ptr().cast_mut().cast(),
            )
        };
        Ok(())
    }

    /// The cache-miss half of [`Codec::reconstruct`]: builds the decode
    /// tables for the pattern, caches them (or, if the cache is full, keeps
    /// them just for this call) and runs the decode. Kept out of line so
    /// the hit path stays small.
    #[cold]
    #[inline(never)]
    fn reconstruct_uncached(
        &self,
        c_len: c_int,
        present_mask: u32,
        missing_mask: u32,
        src: &[MaybeUninit<*mut u8>; MAX_SPLITS],
        dst: &[MaybeUninit<*mut u8>; MAX_SPLITS],
    ) -> Result<(), CodecError> {
        let built = self.decode_tables(present_mask, missing_mask)?;
        let uncached: Tables;
        let tables = match self
            .cache
            .insert(pattern_key(present_mask, missing_mask), built)
        {
            Ok(cached) => cached.as_ptr(),
            Err(built) => {
                uncached = built;
                uncached.as_ptr()
            }
        };
        // SAFETY: as in `reconstruct`, which passes `src` with its first k
        // and `dst` with its first `rows` = popcount(missing_mask) entries
        // written, pointing to live, unaliased slices of `c_len` >= 1 bytes
        // in ascending split index order. `tables` were just built for this
        // pattern (32 * k * rows bytes) and live in the cache (borrowed via
        // `&self`) or in `uncached` until the end of this function.
        unsafe {
            ffi::ec_encode_data(
                c_len,
                self.k as c_int,
                missing_mask.count_ones() as c_int,
                tables,
                src.as_ptr().cast_mut().cast(),
                dst.as_ptr().cast_mut().cast(),
            )
        };
        Ok(())
    }

    /// The bit of split `index`, or an error if it is out of range.
    #[inline]
    fn bit(&self, index: usize, what: &'static str) -> Result<u32, CodecError> {
        if index >= self.k + self.r {
            return Err(CodecError::IndexOutOfRange {
                what,
                index,
                k: self.k,
                r: self.r,
            });
        }
        Ok(1u32 << index)
    }

    #[cold]
    fn wrong_count(
        &self,
        op: &'static str,
        what: &'static str,
        expected: usize,
        got: usize,
    ) -> CodecError {
        CodecError::WrongSplitCount {
            op,
            what,
            expected,
            got,
            k: self.k,
            r: self.r,
        }
    }

    /// Finds the first problem with `reconstruct`'s arguments, checking
    /// `present` then `missing` in order: index range, repeats, overlap with
    /// `present`, length. Only called once the fast scan saw a problem.
    #[cold]
    #[inline(never)]
    fn argument_error(
        &self,
        present: &[(usize, &[u8])],
        missing: &[(usize, &mut [u8])],
        len: usize,
    ) -> CodecError {
        const OP: &str = "reconstruct";
        let mut present_mask = 0u32;
        for (position, &(index, split)) in present.iter().enumerate() {
            let bit = match self.bit(index, "present") {
                Ok(bit) => bit,
                Err(e) => return e,
            };
            if present_mask & bit != 0 {
                return CodecError::DuplicateIndex {
                    what: "present",
                    index,
                };
            }
            if split.len() != len {
                return mismatch(OP, "present", position, split.len(), len);
            }
            present_mask |= bit;
        }
        let mut missing_mask = 0u32;
        for (position, (index, split)) in missing.iter().enumerate() {
            let index = *index;
            let bit = match self.bit(index, "missing") {
                Ok(bit) => bit,
                Err(e) => return e,
            };
            if present_mask & bit != 0 {
                return CodecError::PresentAndMissing { index };
            }
            if missing_mask & bit != 0 {
                return CodecError::DuplicateIndex {
                    what: "missing",
                    index,
                };
            }
            if split.len() != len {
                return mismatch(OP, "missing", position, split.len(), len);
            }
            missing_mask |= bit;
        }
        // Unreachable: the fast scan only flags what the checks above find
        // (more than MAX_SPLITS missing entries must repeat an index or hit
        // a present or out-of-range one). Still answer rather than panic.
        self.wrong_count(OP, "missing", self.r, missing.len())
    }

    /// Row `index` of the generator.
    fn generator_row(&self, index: usize) -> &[u8] {
        &self.generator[index * self.k..(index + 1) * self.k]
    }

    /// Builds the decode tables for one loss pattern (the cache-miss path).
    #[cold]
    #[inline(never)]
    fn decode_tables(&self, present_mask: u32, missing_mask: u32) -> Result<Tables, CodecError> {
        let k = self.k;
        // G[P]: generator rows of the present splits, ascending.
        let mut sub = [0u8; MAX_SPLITS * MAX_SPLITS];
        for (row, index) in bits(present_mask).enumerate() {
            sub[row * k..(row + 1) * k].copy_from_slice(self.generator_row(index));
        }
        let mut inverse = [0u8; MAX_SPLITS * MAX_SPLITS];
        // SAFETY: both buffers hold MAX_SPLITS^2 >= k * k bytes, the extent
        // `gf_invert_matrix` reads and writes for n = k; k <= 32 fits `int`.
        let rc =
            unsafe { ffi::gf_invert_matrix(sub.as_mut_ptr(), inverse.as_mut_ptr(), k as c_int) };
        if rc != 0 {
            return Err(CodecError::SingularMatrix { present_mask });
        }

        // One coefficient row per missing split, ascending.
        let mut coeffs = [0u8; MAX_SPLITS * MAX_SPLITS];
        let mut rows = 0;
        for (row, index) in bits(missing_mask).enumerate() {
            let out = &mut coeffs[row * k..(row + 1) * k];
            if index < k {
                // Data split: its row of G[P]^-1.
                out.copy_from_slice(&inverse[index * k..(index + 1) * k]);
            } else {
                // Parity split: G[index] * G[P]^-1.
                let g = self.generator_row(index);
                for (j, o) in out.iter_mut().enumerate() {
                    *o = g
                        .iter()
                        .enumerate()
                        .fold(0, |acc, (l, &c)| acc ^ gf_mul(c, inverse[l * k + j]));
                }
            }
            rows = row + 1;
        }

        let mut tables = Tables::zeroed(TABLE_BYTES_PER_COEFF * k * rows);
        // SAFETY: `coeffs` holds the rows x k coefficients that
        // `ec_init_tables(k, rows, ..)` reads (rows <= r < 32, so within
        // MAX_SPLITS^2 bytes) and `tables` the 32 * k * rows bytes it
        // writes.
        unsafe {
            ffi::ec_init_tables(
                k as c_int,
                rows as c_int,
                coeffs.as_mut_ptr(),
                tables.as_mut_ptr(),
            )
        };
        Ok(tables)
    }

    /// Number of loss patterns whose decode tables are cached.
    #[cfg(test)]
    fn cached_patterns(&self) -> usize {
        self.cache.len()
    }
}

/// Writes each pointer to the slot of its rank among the indices of `mask`
/// (ascending split index order). Indices were validated: distinct, set in
/// `mask`, and below `MAX_SPLITS`.
#[cold]
fn place_by_rank(
    slots: &mut [MaybeUninit<*mut u8>; MAX_SPLITS],
    mask: u32,
    entries: impl Iterator<Item = (usize, *mut u8)>,
) {
    for (index, p) in entries {
        let below = mask & ((1u32 << (index % MAX_SPLITS)) - 1);
        if let Some(slot) = slots.get_mut(below.count_ones() as usize) {
            *slot = MaybeUninit::new(p);
        }
    }
}

#[cold]
fn mismatch(
    op: &'static str,
    what: &'static str,
    position: usize,
    len: usize,
    expected: usize,
) -> CodecError {
    CodecError::LengthMismatch {
        op,
        what,
        position,
        len,
        expected,
    }
}

#[cfg(test)]
mod tests;
