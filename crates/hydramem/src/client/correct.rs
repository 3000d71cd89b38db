//! Corruption correction: finding the one codeword that most of a page's received splits agree
//! with, and so which splits were corrupted (paper 4.1.2, Table 1).
//!
//! Reed-Solomon codes are MDS: any k splits of a page determine all k + r, so two different
//! codewords agree in at most k − 1 positions. Given m received splits of which e are
//! corrupted, a codeword that agrees with a of them is therefore the *only* such codeword when
//! 2a ≥ m + k (two of them would share at least a + a − m ≥ k positions). The true codeword
//! agrees with m − e, so it is found and accepted whenever e ≤ (m − k) / 2: with the paper's
//! k + 2Δ + 1 splits, up to Δ corruptions are corrected, and Δ + 1 never produce wrong bytes
//! either (an accepted codeword agrees with at least k + Δ + 1 splits, so with at least k
//! intact ones, so it is the true one). More corruptions than that yield an error unless they
//! happen to form a codeword, which random bit flips, stale splits and misdirected splits do
//! with negligible probability; a checksum per split ([`crate::integrity`]) closes even that.
//!
//! The search decodes candidate sets of k splits and counts how many of the others the result
//! reproduces. ISA-L does encoding and decoding but no error *location* (Berlekamp-Welch or
//! Berlekamp-Massey over the whole page), and no well-kept Rust crate offers error location for
//! ISA-L's Cauchy matrices, so it is written here; this path runs only for reads whose splits
//! failed the consistency check, so its allocations and C(m, k) worst case (165 decodes for
//! 8 + 3) do not touch the fast path, and [`MAX_TRIALS`] bounds it for wide codes.

use hydramem_isal::Codec;

use super::layout::MAX_WIDTH;

/// Most candidate sets the search decodes before it gives up (an error, never wrong bytes).
/// C(11, 8) = 165 for 8 + 3; wide codes with many corruptions would otherwise take seconds.
pub const MAX_TRIALS: usize = 20_000;

/// The codeword a page's received splits were found to agree with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corrected {
    /// All `width` splits of the codeword, `split_len` bytes each, in split order.
    pub splits: Vec<u8>,
    /// The received splits that agree with it.
    pub agree: u32,
    /// The received splits that do not: the corrupted ones.
    pub corrupt: u32,
}

/// Why no codeword could be accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Uncorrectable {
    /// k or fewer splits were received: k decode, but nothing checks them.
    TooFew {
        /// How many were.
        received: usize,
    },
    /// No codeword agrees with enough of the received splits to be the unique nearest one:
    /// more corruptions than the received splits can correct.
    TooManyErrors {
        /// How many were received.
        received: usize,
        /// The most that agreed with one codeword.
        best: usize,
    },
    /// The search hit [`MAX_TRIALS`].
    TooManyTrials,
}

/// Finds the codeword that the received splits (`received[j]` is split j, `None` if it was
/// not received; `width` = k + r entries of `split_len` bytes) uniquely agree with, as the
/// module doc describes. Tries the sets of k received splits in order, data splits first.
pub fn correct(
    codec: &Codec,
    received: &[Option<&[u8]>],
    split_len: usize,
) -> Result<Corrected, Uncorrectable> {
    let k = codec.k();
    let width = received.len();
    let have: Vec<usize> = (0..width).filter(|&j| received[j].is_some()).collect();
    let m = have.len();
    if m <= k {
        return Err(Uncorrectable::TooFew { received: m });
    }
    let mut trial = vec![0u8; width * split_len];
    let mut choose: Vec<usize> = (0..k).collect();
    let mut best = 0;
    for _ in 0..MAX_TRIALS {
        let subset: u32 = choose.iter().map(|&i| 1u32 << have[i]).sum();
        let present: Vec<(usize, &[u8])> = choose
            .iter()
            .map(|&i| (have[i], received[have[i]].expect("received")))
            .collect();
        let mut missing: Vec<(usize, &mut [u8])> = trial
            .chunks_exact_mut(split_len)
            .enumerate()
            .filter(|(j, _)| subset & (1 << j) == 0)
            .collect();
        codec
            .reconstruct(&present, &mut missing)
            .expect("k distinct received splits of the codec's geometry decode");
        drop(missing);
        let mut agree = subset;
        for &j in &have {
            if subset & (1 << j) == 0
                && trial[j * split_len..(j + 1) * split_len] == *received[j].expect("received")
            {
                agree |= 1 << j;
            }
        }
        let a = agree.count_ones() as usize;
        best = best.max(a);
        if 2 * a >= m + k {
            for (j, split) in present {
                trial[j * split_len..(j + 1) * split_len].copy_from_slice(split);
            }
            let all: u32 = have.iter().map(|&j| 1u32 << j).sum();
            return Ok(Corrected {
                splits: trial,
                agree,
                corrupt: all & !agree,
            });
        }
        if !next_combination(&mut choose, m) {
            return Err(Uncorrectable::TooManyErrors { received: m, best });
        }
    }
    Err(Uncorrectable::TooManyTrials)
}

/// Advances `c` (k increasing indices below `n`) to the next combination in lexicographic
/// order; false after the last.
fn next_combination(c: &mut [usize], n: usize) -> bool {
    let k = c.len();
    let Some(i) = (0..k).rev().find(|&i| c[i] < n - k + i) else {
        return false;
    };
    c[i] += 1;
    for t in i + 1..k {
        c[t] = c[t - 1] + 1;
    }
    true
}

const _: () = assert!(MAX_WIDTH <= 32, "masks are u32");

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn codeword(codec: &Codec, data: &[u8], s: usize) -> Vec<u8> {
        let (k, r) = (codec.k(), codec.r());
        let mut out = data.to_vec();
        out.resize((k + r) * s, 0);
        let (d, p) = out.split_at_mut(k * s);
        let data: Vec<&[u8]> = d.chunks_exact(s).collect();
        let mut parity: Vec<&mut [u8]> = p.chunks_exact_mut(s).collect();
        codec.encode(&data, &mut parity).unwrap();
        out
    }

    #[test]
    fn combinations_are_enumerated_once_each() {
        let mut c = vec![0, 1, 2];
        let mut n = 1;
        while next_combination(&mut c, 6) {
            n += 1;
        }
        assert_eq!(n, 20);
        assert_eq!(c, vec![3, 4, 5]);
    }

    #[test]
    fn too_few_splits_are_refused() {
        let codec = Codec::new(4, 3).unwrap();
        let word = codeword(&codec, &[7; 4 * 64], 64);
        let received: Vec<Option<&[u8]>> = word
            .chunks_exact(64)
            .enumerate()
            .map(|(j, c)| (j < 4).then_some(c))
            .collect();
        assert_eq!(
            correct(&codec, &received, 64),
            Err(Uncorrectable::TooFew { received: 4 })
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Within (m − k) / 2 corrupted splits the exact codeword comes back and the corrupted
        /// splits are named; beyond it, never a wrong codeword. Each corrupted split has one
        /// byte changed, in a column of its own, as independent bit flips almost always do
        /// (a pattern built to form another codeword cannot be told from a real write: that is
        /// what checksums are for).
        #[test]
        fn corrects_within_the_bound_and_never_returns_a_wrong_codeword(
            (k, r) in (2usize..=8, 1usize..=5),
            data in proptest::collection::vec(any::<u8>(), 8 * 64),
            missing_mask in any::<u32>(),
            corrupt_mask in any::<u32>(),
            flip in 1u8..=255,
            at in 0usize..64,
        ) {
            let s = 64;
            let codec = Codec::new(k, r).unwrap();
            let width = k + r;
            let word = codeword(&codec, &data[..k * s], s);
            let mut bad = word.clone();
            let mut received: Vec<Option<&[u8]>> = Vec::new();
            let corrupt_mask = corrupt_mask & !missing_mask & ((1 << width) - 1);
            for j in 0..width {
                if corrupt_mask & (1 << j) != 0 {
                    bad[j * s + (at + j) % s] ^= flip;
                }
            }
            for (j, c) in bad.chunks_exact(s).enumerate() {
                received.push((missing_mask & (1 << j) == 0).then_some(c));
            }
            let m = received.iter().filter(|x| x.is_some()).count();
            let e = corrupt_mask.count_ones() as usize;
            match correct(&codec, &received, s) {
                Ok(c) => {
                    prop_assert_eq!(&c.splits, &word, "a wrong codeword was accepted");
                    prop_assert_eq!(c.corrupt, corrupt_mask);
                }
                Err(err) => {
                    prop_assert!(m <= k || 2 * e > m - k, "{e} of {m} corrupted must be corrected: {err:?}");
                }
            }
        }
    }
}
