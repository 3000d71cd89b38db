//! Property tests of the public API: encode, lose splits, reconstruct.
//!
//! For random `k` in 1..=16, `r` in 0..=4, split lengths that include the
//! awkward small ones (1, 15, 17) and page-sized ones (512, 4096 / k), random
//! data and random loss patterns (any `k` of the `k + r` splits present, in
//! random order; any subset of the others, data or parity, rebuilt in random
//! order), `reconstruct` must return exactly the original splits. Argument
//! errors are checked against the same random shapes.

use hydramem_isal::{Codec, CodecError, MAX_SPLITS};
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};

/// One loss pattern: a random order of all split indices (the first `k` are
/// present) and a bitmask choosing which of the rest to rebuild.
type Pattern = (Vec<usize>, u32);

/// `(k, r, len, seed, patterns)`.
fn cases() -> impl Strategy<Value = (usize, usize, usize, u64, Vec<Pattern>)> {
    (1usize..=16, 0usize..=4)
        .prop_flat_map(|(k, r)| {
            let len = prop_oneof![
                Just(1usize),
                Just(15),
                Just(17),
                Just(512),
                Just(4096 / k),
                1usize..=1100,
            ];
            let all: Vec<usize> = (0..k + r).collect();
            let pattern = (Just(all).prop_shuffle(), any::<u32>());
            (
                Just(k),
                Just(r),
                len,
                any::<u64>(),
                prop::collection::vec(pattern, 1..=4),
            )
        })
        .prop_filter("k + r <= MAX_SPLITS", |(k, r, ..)| k + r <= MAX_SPLITS)
}

fn random_splits(k: usize, len: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..k)
        .map(|_| {
            let mut v = vec![0u8; len];
            rng.fill_bytes(&mut v);
            v
        })
        .collect()
}

fn encode_all(codec: &Codec, data: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let len = data[0].len();
    let mut parity = vec![vec![0u8; len]; codec.r()];
    {
        let d: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let mut p: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
        codec.encode(&d, &mut p).expect("encode of valid arguments");
    }
    let mut all = data;
    all.extend(parity);
    all
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn reconstruct_returns_the_original_splits((k, r, len, seed, patterns) in cases()) {
        let codec = Codec::new(k, r).expect("valid geometry");
        let splits = encode_all(&codec, random_splits(k, len, seed));

        for (order, choose) in &patterns {
            let (present_idx, rest) = order.split_at(k);
            let missing_idx: Vec<usize> = rest
                .iter()
                .enumerate()
                .filter(|(j, _)| choose & (1 << j) != 0)
                .map(|(_, &i)| i)
                .collect();

            let present: Vec<(usize, &[u8])> =
                present_idx.iter().map(|&i| (i, splits[i].as_slice())).collect();
            let mut outs = vec![vec![0xA5u8; len]; missing_idx.len()];
            let mut missing: Vec<(usize, &mut [u8])> = missing_idx
                .iter()
                .copied()
                .zip(outs.iter_mut().map(Vec::as_mut_slice))
                .collect();
            codec.reconstruct(&present, &mut missing).expect("reconstruct of valid arguments");
            for (i, out) in missing_idx.iter().zip(&outs) {
                prop_assert_eq!(out, &splits[*i], "split {} of {}+{} len {}", i, k, r, len);
            }
        }
    }

    #[test]
    fn geometry_is_validated(k in 0usize..40, r in 0usize..40) {
        let ok = k >= 1 && k + r <= MAX_SPLITS;
        match Codec::new(k, r) {
            Ok(c) => {
                prop_assert!(ok);
                prop_assert_eq!((c.k(), c.r()), (k, r));
            }
            Err(e) => {
                prop_assert!(!ok);
                prop_assert_eq!(e, CodecError::InvalidGeometry { k, r, max: MAX_SPLITS });
            }
        }
    }

    #[test]
    fn bad_reconstruct_arguments_are_rejected(
        (k, r, len, seed, patterns) in cases(),
        bad_index in 0usize..1000,
        which in 0usize..4,
    ) {
        let codec = Codec::new(k, r).expect("valid geometry");
        let n = k + r;
        let splits = encode_all(&codec, random_splits(k, len, seed));
        let order = &patterns[0].0;
        let mut present: Vec<(usize, &[u8])> =
            order[..k].iter().map(|&i| (i, splits[i].as_slice())).collect();
        let mut out = vec![0x5Au8; len];
        let short = vec![0u8; len + 1];

        let expected = match which {
            // An out-of-range index replaces the first present one.
            0 => {
                let index = n + bad_index;
                present[0].0 = index;
                CodecError::IndexOutOfRange { what: "present", index, k, r }
            }
            // A duplicate of the first present index (needs k >= 2).
            1 if k >= 2 => {
                present[1].0 = present[0].0;
                CodecError::DuplicateIndex { what: "present", index: present[0].0 }
            }
            // A split of the wrong length.
            2 if k >= 2 => {
                present[k - 1].1 = &short;
                CodecError::LengthMismatch {
                    op: "reconstruct", what: "present", position: k - 1, len: len + 1, expected: len,
                }
            }
            // One present split too few.
            _ => {
                present.pop();
                CodecError::WrongSplitCount {
                    op: "reconstruct", what: "present", expected: k, got: k - 1, k, r,
                }
            }
        };
        let target = if n > k { order[k] } else { 0 };
        let err = codec
            .reconstruct(&present, &mut [(target, &mut out)])
            .expect_err("bad arguments must be rejected");
        prop_assert_eq!(err, expected);
        prop_assert!(out.iter().all(|&b| b == 0x5A), "output written despite the error");
    }
}
