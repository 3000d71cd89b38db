//! Unit tests of [`Codec`] against a slow, obviously-correct GF(2^8)
//! reference written in Rust, plus argument-validation and cache tests.
//!
//! The reference multiplies with shift-and-xor over ISA-L's polynomial
//! (0x11d) and builds the Cauchy matrix the way ISA-L documents it, so a
//! match shows both the kernels and the matrix algebra are right.

use super::*;
use std::sync::Arc;

/// GF(2^8) multiply, polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d).
fn mul_ref(mut a: u8, mut b: u8) -> u8 {
    let mut p = 0u8;
    while b != 0 {
        if b & 1 != 0 {
            p ^= a;
        }
        let carry = a & 0x80 != 0;
        a <<= 1;
        if carry {
            a ^= 0x1d;
        }
        b >>= 1;
    }
    p
}

fn inv_ref(a: u8) -> u8 {
    (1..=255u8)
        .find(|&b| mul_ref(a, b) == 1)
        .expect("0 has no inverse")
}

/// ISA-L's documented systematic Cauchy matrix: identity on top, then
/// `1 / (i ^ j)` for parity row `i` and column `j`.
fn cauchy_ref(k: usize, r: usize) -> Vec<Vec<u8>> {
    (0..k + r)
        .map(|i| {
            (0..k)
                .map(|j| match i < k {
                    true => u8::from(i == j),
                    false => inv_ref((i ^ j) as u8),
                })
                .collect()
        })
        .collect()
}

/// `rows x k` matrix applied to `k` sources.
fn apply_ref(rows: &[Vec<u8>], src: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let len = src[0].len();
    rows.iter()
        .map(|row| {
            (0..len)
                .map(|b| {
                    row.iter()
                        .zip(src)
                        .fold(0, |acc, (&c, s)| acc ^ mul_ref(c, s[b]))
                })
                .collect()
        })
        .collect()
}

/// Deterministic pseudo-random bytes (xorshift), distinct per seed.
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn data_splits(k: usize, len: usize, seed: u64) -> Vec<Vec<u8>> {
    (0..k).map(|i| bytes(seed * 100 + i as u64, len)).collect()
}

fn encode_vec(codec: &Codec, data: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let len = data[0].len();
    let mut parity = vec![vec![0u8; len]; codec.r()];
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
    codec.encode(&refs, &mut outs).expect("encode");
    parity
}

/// All splits (data then parity) of a page.
fn all_splits(codec: &Codec, len: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut all = data_splits(codec.k(), len, seed);
    let parity = encode_vec(codec, &all);
    all.extend(parity);
    all
}

/// Rebuilds `missing` from `present` and returns the rebuilt splits.
fn rebuild(
    codec: &Codec,
    splits: &[Vec<u8>],
    present: &[usize],
    missing: &[usize],
) -> Result<Vec<Vec<u8>>, CodecError> {
    let len = splits[0].len();
    let pres: Vec<(usize, &[u8])> = present.iter().map(|&i| (i, splits[i].as_slice())).collect();
    let mut out = vec![vec![0xEEu8; len]; missing.len()];
    let mut miss: Vec<(usize, &mut [u8])> = missing
        .iter()
        .copied()
        .zip(out.iter_mut().map(Vec::as_mut_slice))
        .collect();
    codec.reconstruct(&pres, &mut miss)?;
    Ok(out)
}

fn subsets(n: usize, size: usize) -> Vec<Vec<usize>> {
    (0u32..1 << n)
        .filter(|m| m.count_ones() as usize == size)
        .map(|m| bits(m).collect())
        .collect()
}

#[test]
fn codec_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Codec>();
    check::<Arc<Codec>>();
}

#[test]
fn generator_is_systematic_cauchy() {
    for (k, r) in [(1, 0), (1, 1), (8, 2), (4, 4), (16, 16), (31, 1), (1, 31)] {
        let codec = Codec::new(k, r).expect("valid geometry");
        let expected = cauchy_ref(k, r);
        for (i, row) in expected.iter().enumerate() {
            assert_eq!(codec.generator_row(i), row.as_slice(), "{k}+{r} row {i}");
        }
    }
}

#[test]
fn new_rejects_bad_geometry() {
    for (k, r) in [(0, 0), (0, 2), (33, 0), (31, 2), (16, 17), (1, usize::MAX)] {
        let err = Codec::new(k, r).expect_err("must be rejected");
        assert_eq!(err, CodecError::InvalidGeometry { k, r, max: 32 });
        let msg = err.to_string();
        assert!(msg.contains(&format!("{k}+{r}")), "{msg}");
        assert!(msg.contains("k + r <= 32"), "{msg}");
    }
    assert!(Codec::new(32, 0).is_ok());
    assert!(Codec::new(1, 31).is_ok());
}

#[test]
fn accessors_and_debug() {
    let c = Codec::new(8, 2).expect("8+2");
    assert_eq!((c.k(), c.r()), (8, 2));
    let dbg = format!("{c:?}");
    assert!(dbg.contains("k: 8") && dbg.contains("r: 2"), "{dbg}");
}

#[test]
fn encode_matches_reference_for_every_short_length() {
    // 7 parity rows exercises ISA-L's 6-rows-at-a-time loop plus a tail.
    for (k, r) in [(8, 2), (1, 1), (3, 5), (10, 4), (20, 7), (16, 16)] {
        let codec = Codec::new(k, r).expect("valid geometry");
        let rows = &cauchy_ref(k, r)[k..];
        let lens = (1..=200).chain([255, 256, 257, 511, 512, 513, 1000, 4096]);
        for len in lens {
            let data = data_splits(k, len, len as u64);
            assert_eq!(
                encode_vec(&codec, &data),
                apply_ref(rows, &data),
                "{k}+{r} len {len}"
            );
        }
    }
}

#[test]
fn encode_with_no_parity_writes_nothing() {
    let codec = Codec::new(4, 0).expect("4+0");
    let data = data_splits(4, 64, 1);
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    codec.encode(&refs, &mut []).expect("encode");
    let mut none: [(usize, &mut [u8]); 0] = [];
    let present: Vec<(usize, &[u8])> = refs.iter().copied().enumerate().collect();
    codec
        .reconstruct(&present, &mut none)
        .expect("nothing to rebuild");
}

#[test]
fn reconstruct_every_pattern_small_codes() {
    for (k, r) in [(1, 1), (2, 1), (4, 2), (3, 3), (8, 2)] {
        let codec = Codec::new(k, r).expect("valid geometry");
        for len in [1, 15, 16, 17, 63, 64, 65, 100, 512] {
            let splits = all_splits(&codec, len, (k * 1000 + len) as u64);
            for present in subsets(k + r, k) {
                let absent: Vec<usize> = (0..k + r).filter(|i| !present.contains(i)).collect();
                let absent_mask = absent.iter().fold(0u32, |m, &i| m | 1 << i);
                // Every non-empty subset of the absent splits.
                for miss_mask in (1..=absent_mask).filter(|m| m & !absent_mask == 0) {
                    let missing: Vec<usize> = bits(miss_mask).collect();
                    let got = rebuild(&codec, &splits, &present, &missing).expect("rebuild");
                    for (m, out) in missing.iter().zip(&got) {
                        assert_eq!(out, &splits[*m], "{k}+{r} len {len} present {present:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn reconstruct_is_order_independent() {
    let codec = Codec::new(8, 2).expect("8+2");
    let splits = all_splits(&codec, 512, 7);
    let a = rebuild(&codec, &splits, &[9, 0, 7, 2, 3, 4, 5, 8], &[6, 1]).expect("rebuild");
    let b = rebuild(&codec, &splits, &[0, 2, 3, 4, 5, 7, 8, 9], &[1, 6]).expect("rebuild");
    assert_eq!(a[0], splits[6]);
    assert_eq!(a[1], splits[1]);
    assert_eq!(b[0], splits[1]);
    assert_eq!(b[1], splits[6]);
    // Both orders are the same pattern: one cache entry.
    assert_eq!(codec.cached_patterns(), 1);
}

#[test]
fn decode_tables_are_cached_per_pattern() {
    let codec = Codec::new(8, 2).expect("8+2");
    let splits = all_splits(&codec, 64, 3);
    let present = [0, 1, 2, 3, 4, 5, 8, 9];
    assert_eq!(codec.cached_patterns(), 0);
    for _ in 0..3 {
        rebuild(&codec, &splits, &present, &[6, 7]).expect("rebuild");
    }
    assert_eq!(codec.cached_patterns(), 1);
    rebuild(&codec, &splits, &present, &[7]).expect("rebuild");
    assert_eq!(codec.cached_patterns(), 2);
    // The full pattern space of 8+2 fits: C(10, 8) * (2^2 - 1) = 135.
    for present in subsets(10, 8) {
        let absent: Vec<usize> = (0..10).filter(|i| !present.contains(i)).collect();
        for missing in [vec![absent[0]], vec![absent[1]], absent.clone()] {
            let got = rebuild(&codec, &splits, &present, &missing).expect("rebuild");
            for (m, out) in missing.iter().zip(&got) {
                assert_eq!(out, &splits[*m]);
            }
        }
    }
    assert_eq!(codec.cached_patterns(), 135);
}

#[test]
fn reconstruct_beyond_cache_capacity_is_still_correct() {
    // 16+4 has 72,675 patterns, more than the cache holds; the ones that do
    // not fit are rebuilt uncached on every call.
    let codec = Codec::new(16, 4).expect("16+4");
    let cap = codec.cache.capacity();
    // The figure `reconstruct`'s documentation quotes.
    assert_eq!(cap, 12_288);
    let splits = all_splits(&codec, 33, 11);
    let mut done = 0;
    'outer: for present in subsets(20, 16) {
        let absent: Vec<usize> = (0..20).filter(|i| !present.contains(i)).collect();
        for missing in [vec![absent[0]], vec![absent[3]], absent.clone()] {
            let got = rebuild(&codec, &splits, &present, &missing).expect("rebuild");
            for (m, out) in missing.iter().zip(&got) {
                assert_eq!(out, &splits[*m]);
            }
            done += 1;
            if done > cap + 50 {
                break 'outer;
            }
        }
    }
    assert_eq!(codec.cached_patterns(), cap);
}

#[test]
fn concurrent_use_from_many_threads() {
    let codec = Arc::new(Codec::new(8, 2).expect("8+2"));
    let splits = Arc::new(all_splits(&codec, 512, 5));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let codec = Arc::clone(&codec);
            let splits = Arc::clone(&splits);
            std::thread::spawn(move || {
                for present in subsets(10, 8).into_iter().skip(t).step_by(2) {
                    let missing: Vec<usize> = (0..10).filter(|i| !present.contains(i)).collect();
                    let got = rebuild(&codec, &splits, &present, &missing).expect("rebuild");
                    assert_eq!(got[0], splits[missing[0]]);
                    assert_eq!(got[1], splits[missing[1]]);
                    assert_eq!(encode_vec(&codec, &splits[..8]), splits[8..].to_vec());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("worker panicked");
    }
    assert_eq!(codec.cached_patterns(), 45);
}

#[test]
fn encode_rejects_bad_arguments_without_writing() {
    let codec = Codec::new(3, 2).expect("3+2");
    let d = [vec![1u8; 8], vec![2u8; 8], vec![3u8; 8]];
    let short = vec![4u8; 7];
    let mut p0 = vec![0xAAu8; 8];
    let mut p1 = vec![0xAAu8; 8];
    let mut p_short = vec![0xAAu8; 7];

    let err = codec
        .encode(&[&d[0], &d[1]], &mut [&mut p0, &mut p1])
        .expect_err("too few data");
    assert!(matches!(
        err,
        CodecError::WrongSplitCount {
            what: "data",
            expected: 3,
            got: 2,
            ..
        }
    ));
    assert!(err.to_string().contains("got 2 data splits"), "{err}");

    let err = codec
        .encode(&[&d[0], &d[1], &d[2]], &mut [&mut p0])
        .expect_err("too few parity");
    assert!(matches!(
        err,
        CodecError::WrongSplitCount {
            what: "parity",
            expected: 2,
            got: 1,
            ..
        }
    ));

    let err = codec
        .encode(&[&d[0], &short, &d[2]], &mut [&mut p0, &mut p1])
        .expect_err("short data");
    assert_eq!(
        err,
        CodecError::LengthMismatch {
            op: "encode",
            what: "data",
            position: 1,
            len: 7,
            expected: 8
        }
    );

    let err = codec
        .encode(&[&d[0], &d[1], &d[2]], &mut [&mut p0, &mut p_short])
        .expect_err("short parity");
    assert!(matches!(
        err,
        CodecError::LengthMismatch {
            what: "parity",
            position: 1,
            ..
        }
    ));

    let empty: [u8; 0] = [];
    let err = codec
        .encode(&[&empty, &empty, &empty], &mut [&mut [], &mut []])
        .expect_err("zero length");
    assert!(matches!(err, CodecError::InvalidLength { len: 0, .. }));
    assert!(err.to_string().contains("1..="), "{err}");

    assert_eq!(p0, vec![0xAA; 8]);
    assert_eq!(p1, vec![0xAA; 8]);
    assert_eq!(p_short, vec![0xAA; 7]);
}

#[test]
fn reconstruct_rejects_bad_arguments_without_writing() {
    let codec = Codec::new(3, 2).expect("3+2");
    let s = all_splits(&codec, 8, 9);
    let short = vec![0u8; 7];
    let mut out = vec![0xAAu8; 8];
    let mut out_short = vec![0xAAu8; 7];
    let p = |i: usize| (i, s[i].as_slice());

    let err = codec
        .reconstruct(&[p(0), p(1)], &mut [(2, &mut out)])
        .expect_err("too few present");
    assert!(matches!(
        err,
        CodecError::WrongSplitCount {
            what: "present",
            expected: 3,
            got: 2,
            ..
        }
    ));
    let err = codec
        .reconstruct(&[p(0), p(1), p(3), p(4)], &mut [(2, &mut out)])
        .expect_err("too many present");
    assert!(matches!(err, CodecError::WrongSplitCount { got: 4, .. }));

    let err = codec
        .reconstruct(&[p(0), p(1), (5, &s[4])], &mut [(2, &mut out)])
        .expect_err("present out of range");
    assert_eq!(
        err,
        CodecError::IndexOutOfRange {
            what: "present",
            index: 5,
            k: 3,
            r: 2
        }
    );
    assert!(err.to_string().contains("0..5"), "{err}");

    let err = codec
        .reconstruct(&[p(0), p(1), p(3)], &mut [(usize::MAX, &mut out)])
        .expect_err("missing out of range");
    assert!(matches!(
        err,
        CodecError::IndexOutOfRange {
            what: "missing",
            index: usize::MAX,
            ..
        }
    ));

    let err = codec
        .reconstruct(&[p(0), p(1), p(1)], &mut [(2, &mut out)])
        .expect_err("duplicate present");
    assert_eq!(
        err,
        CodecError::DuplicateIndex {
            what: "present",
            index: 1
        }
    );

    let mut out2 = vec![0xAAu8; 8];
    let err = codec
        .reconstruct(&[p(0), p(1), p(3)], &mut [(2, &mut out), (2, &mut out2)])
        .expect_err("duplicate missing");
    assert_eq!(
        err,
        CodecError::DuplicateIndex {
            what: "missing",
            index: 2
        }
    );

    let err = codec
        .reconstruct(&[p(0), p(1), p(3)], &mut [(2, &mut out), (1, &mut out2)])
        .expect_err("present and missing");
    assert_eq!(err, CodecError::PresentAndMissing { index: 1 });

    let err = codec
        .reconstruct(&[p(0), (1, &short), p(3)], &mut [(2, &mut out)])
        .expect_err("short present");
    assert!(matches!(
        err,
        CodecError::LengthMismatch {
            what: "present",
            position: 1,
            len: 7,
            expected: 8,
            ..
        }
    ));

    let err = codec
        .reconstruct(
            &[p(0), p(1), p(3)],
            &mut [(2, &mut out), (4, &mut out_short)],
        )
        .expect_err("short missing");
    assert!(matches!(
        err,
        CodecError::LengthMismatch {
            what: "missing",
            position: 1,
            ..
        }
    ));

    let err = codec
        .reconstruct(&[(usize::MAX, &s[0]), p(1), p(3)], &mut [(2, &mut out)])
        .expect_err("huge present index");
    assert!(matches!(
        err,
        CodecError::IndexOutOfRange {
            what: "present",
            index: usize::MAX,
            ..
        }
    ));

    // More missing entries than a code can have splits.
    let mut many: Vec<Vec<u8>> = vec![vec![0xAAu8; 8]; MAX_SPLITS + 8];
    let mut too_many: Vec<(usize, &mut [u8])> = many
        .iter_mut()
        .enumerate()
        .map(|(i, b)| (i % 2 + 3, b.as_mut_slice()))
        .collect();
    let err = codec
        .reconstruct(&[p(0), p(1), p(2)], &mut too_many)
        .expect_err("too many missing");
    assert_eq!(
        err,
        CodecError::DuplicateIndex {
            what: "missing",
            index: 3
        }
    );
    assert!(many.iter().all(|b| b.iter().all(|&x| x == 0xAA)));

    let empty: &[u8] = &[];
    let err = codec
        .reconstruct(&[(0, empty), (1, empty), (3, empty)], &mut [])
        .expect_err("zero length");
    assert!(matches!(
        err,
        CodecError::InvalidLength {
            op: "reconstruct",
            len: 0,
            ..
        }
    ));

    assert_eq!(out, vec![0xAA; 8]);
    assert_eq!(out2, vec![0xAA; 8]);
    assert_eq!(out_short, vec![0xAA; 7]);
    assert_eq!(codec.cached_patterns(), 0);
}

#[test]
fn error_messages_say_what_and_how_to_fix() {
    let e = CodecError::PresentAndMissing { index: 4 };
    assert!(e.to_string().contains("index 4"), "{e}");
    let e = CodecError::LengthMismatch {
        op: "reconstruct",
        what: "missing",
        position: 2,
        len: 10,
        expected: 512,
    };
    let msg = e.to_string();
    assert!(msg.starts_with("reconstruct:"), "{msg}");
    assert!(msg.contains("same length"), "{msg}");
    let e = CodecError::SingularMatrix { present_mask: 0x3f };
    assert!(e.to_string().contains("0x3f"), "{e}");
}

#[test]
fn binomial_values() {
    assert_eq!(binomial(10, 8), 45);
    assert_eq!(binomial(20, 16), 4845);
    assert_eq!(binomial(32, 16), 601_080_390);
    assert_eq!(binomial(5, 0), 1);
    assert_eq!(binomial(3, 4), 0);
}

/// Every x86 kernel family that ISA-L's dispatcher may pick on *some* CPU,
/// checked directly (with the matching table format) for every short length
/// and the first lengths past each vector width, on the CPUs that can run
/// it. This backs the claim that `Codec` is correct for any `len >= 1`
/// wherever it runs, not only on the CPU of the test machine.
#[cfg(target_arch = "x86_64")]
mod kernels {
    use super::*;
    use std::os::raw::{c_int, c_uchar};

    type EncodeFn = unsafe extern "C" fn(
        c_int,
        c_int,
        c_int,
        *mut c_uchar,
        *mut *mut c_uchar,
        *mut *mut c_uchar,
    );

    // These per-ISA entry points are exported by the static libisal built by
    // isal-sys (nasm >= 2.14 assembles the AVX-512 and GFNI ones).
    extern "C" {
        fn ec_init_tables_base(k: c_int, rows: c_int, a: *mut c_uchar, g: *mut c_uchar);
        fn ec_init_tables_gfni(k: c_int, rows: c_int, a: *mut c_uchar, g: *mut c_uchar);
        fn ec_encode_data_base(
            len: c_int,
            k: c_int,
            rows: c_int,
            g: *mut c_uchar,
            d: *mut *mut c_uchar,
            c: *mut *mut c_uchar,
        );
        fn ec_encode_data_sse(
            len: c_int,
            k: c_int,
            rows: c_int,
            g: *mut c_uchar,
            d: *mut *mut c_uchar,
            c: *mut *mut c_uchar,
        );
        fn ec_encode_data_avx(
            len: c_int,
            k: c_int,
            rows: c_int,
            g: *mut c_uchar,
            d: *mut *mut c_uchar,
            c: *mut *mut c_uchar,
        );
        fn ec_encode_data_avx2(
            len: c_int,
            k: c_int,
            rows: c_int,
            g: *mut c_uchar,
            d: *mut *mut c_uchar,
            c: *mut *mut c_uchar,
        );
        fn ec_encode_data_avx512(
            len: c_int,
            k: c_int,
            rows: c_int,
            g: *mut c_uchar,
            d: *mut *mut c_uchar,
            c: *mut *mut c_uchar,
        );
        fn ec_encode_data_avx2_gfni(
            len: c_int,
            k: c_int,
            rows: c_int,
            g: *mut c_uchar,
            d: *mut *mut c_uchar,
            c: *mut *mut c_uchar,
        );
        fn ec_encode_data_avx512_gfni(
            len: c_int,
            k: c_int,
            rows: c_int,
            g: *mut c_uchar,
            d: *mut *mut c_uchar,
            c: *mut *mut c_uchar,
        );
    }

    fn avx512_g1() -> bool {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512cd")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx512vl")
    }

    fn check(name: &str, gfni_tables: bool, encode: EncodeFn) {
        for (k, r) in [(8, 2), (1, 1), (5, 6), (10, 7)] {
            let rows = &cauchy_ref(k, r)[k..];
            let mut coeffs: Vec<u8> = rows.iter().flatten().copied().collect();
            let mut tables = vec![0u8; 32 * k * r];
            // SAFETY: r x k coefficients in, 32 * k * r table bytes out.
            unsafe {
                match gfni_tables {
                    true => ec_init_tables_gfni(
                        k as c_int,
                        r as c_int,
                        coeffs.as_mut_ptr(),
                        tables.as_mut_ptr(),
                    ),
                    false => ec_init_tables_base(
                        k as c_int,
                        r as c_int,
                        coeffs.as_mut_ptr(),
                        tables.as_mut_ptr(),
                    ),
                }
            };
            for len in (1..=300).chain([511, 512, 513, 4096]) {
                let data = data_splits(k, len, (len * 7 + k) as u64);
                let mut parity = vec![vec![0u8; len]; r];
                let mut src: Vec<*mut u8> = data.iter().map(|d| d.as_ptr().cast_mut()).collect();
                let mut dst: Vec<*mut u8> = parity.iter_mut().map(|p| p.as_mut_ptr()).collect();
                // SAFETY: k readable and r writable buffers of `len` bytes,
                // tables in the format this kernel family expects, and the
                // caller checked that the CPU supports the kernel's ISA.
                unsafe {
                    encode(
                        len as c_int,
                        k as c_int,
                        r as c_int,
                        tables.as_mut_ptr(),
                        src.as_mut_ptr(),
                        dst.as_mut_ptr(),
                    )
                };
                assert_eq!(parity, apply_ref(rows, &data), "{name} {k}+{r} len {len}");
            }
        }
    }

    #[test]
    fn every_kernel_family_handles_every_length() {
        let mut ran = vec!["base"];
        check("base", false, ec_encode_data_base);
        if is_x86_feature_detected!("sse4.2") {
            check("sse", false, ec_encode_data_sse);
            ran.push("sse");
        }
        if is_x86_feature_detected!("avx") {
            check("avx", false, ec_encode_data_avx);
            ran.push("avx");
        }
        if is_x86_feature_detected!("avx2") {
            check("avx2", false, ec_encode_data_avx2);
            ran.push("avx2");
        }
        if avx512_g1() {
            check("avx512", false, ec_encode_data_avx512);
            ran.push("avx512");
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("gfni") {
            check("avx2_gfni", true, ec_encode_data_avx2_gfni);
            ran.push("avx2_gfni");
        }
        if avx512_g1() && is_x86_feature_detected!("gfni") {
            check("avx512_gfni", true, ec_encode_data_avx512_gfni);
            ran.push("avx512_gfni");
        }
        eprintln!("kernel families checked on this CPU: {ran:?}");
    }
}
