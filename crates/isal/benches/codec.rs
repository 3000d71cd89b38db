//! Cost of erasure-coding one 4 KiB page as 8+2 (512-byte splits).
//!
//! Measures, in one run: `Codec::encode`; `Codec::reconstruct` with two data
//! splits lost (decode tables cached); the same two operations as direct
//! `ffi::ec_encode_data` calls with pre-built tables and pointer arrays (so
//! `Codec / direct` is the wrapper overhead); and a 4 KiB `memcpy` with hot
//! buffers and with cold ones (pages picked with a large prime stride from a
//! buffer many times the last-level cache), as the yardstick the coding cost
//! is compared with. Times are per page (one iteration = one page).

// `criterion_group!` generates a public function without a doc comment.
#![allow(missing_docs)]

use std::hint::black_box;
use std::os::raw::c_int;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hydramem_isal::{ffi, Codec};

const PAGE: usize = 4096;
const K: usize = 8;
const R: usize = 2;
const SPLIT: usize = PAGE / K;
/// Data splits lost in the decode benchmarks.
const LOST: [usize; 2] = [3, 6];
/// Splits available for decoding: the other data splits plus both parity.
const PRESENT: [usize; K] = [0, 1, 2, 4, 5, 7, 8, 9];
/// Cold-memcpy arena: ~10x the 105 MiB L3 of the reference machine, so
/// nearly every page touched is a cache miss.
const COLD_BYTES: usize = 1 << 30;

/// ISA-L tables for `rows` (each `K` coefficients), as `Codec` builds them.
fn tables_for(rows: &[u8]) -> Vec<u8> {
    let n_rows = rows.len() / K;
    let mut coeffs = rows.to_vec();
    let mut tables = vec![0u8; 32 * K * n_rows];
    // SAFETY: `coeffs` holds n_rows x K coefficients, `tables` the
    // 32 * K * n_rows bytes ec_init_tables writes.
    unsafe {
        ffi::ec_init_tables(
            K as c_int,
            n_rows as c_int,
            coeffs.as_mut_ptr(),
            tables.as_mut_ptr(),
        )
    };
    tables
}

/// The Cauchy generator, row-major `(K + R) x K`.
fn generator() -> Vec<u8> {
    let mut g = vec![0u8; (K + R) * K];
    // SAFETY: `g` holds the (K + R) x K bytes written.
    unsafe { ffi::gf_gen_cauchy1_matrix(g.as_mut_ptr(), (K + R) as c_int, K as c_int) };
    g
}

/// Decode coefficients for `LOST` from `PRESENT` (rows of `G[P]^-1`).
fn decode_rows(g: &[u8]) -> Vec<u8> {
    let mut sub: Vec<u8> = PRESENT
        .iter()
        .flat_map(|&i| g[i * K..(i + 1) * K].to_vec())
        .collect();
    let mut inv = vec![0u8; K * K];
    // SAFETY: both matrices are K x K.
    let rc = unsafe { ffi::gf_invert_matrix(sub.as_mut_ptr(), inv.as_mut_ptr(), K as c_int) };
    assert_eq!(rc, 0, "Cauchy submatrix must be invertible");
    LOST.iter()
        .flat_map(|&d| inv[d * K..(d + 1) * K].to_vec())
        .collect()
}

fn bench(c: &mut Criterion) {
    let codec = Codec::new(K, R).expect("8+2 is a valid code");

    // One page, split in place, as the client library will pass it.
    let page: Vec<u8> = (0..PAGE).map(|i| (i * 131 + i / 7) as u8).collect();
    let data: Vec<&[u8]> = page.chunks(SPLIT).collect();
    let mut parity = vec![[0u8; SPLIT]; R];
    {
        let mut p: Vec<&mut [u8]> = parity.iter_mut().map(|p| &mut p[..]).collect();
        codec.encode(&data, &mut p).expect("encode");
    }
    let split = |i: usize| -> &[u8] {
        match i < K {
            true => data[i],
            false => &parity[i - K],
        }
    };

    let mut group = c.benchmark_group("page4k_8+2");
    group.throughput(Throughput::Elements(1));

    // --- encode -----------------------------------------------------------
    let mut p_out = [[0u8; SPLIT]; R];
    {
        let [a, b] = &mut p_out;
        let mut parity_bufs: [&mut [u8]; R] = [a, b];
        group.bench_function("encode/Codec", |bench| {
            bench.iter(|| codec.encode(black_box(&data), black_box(&mut parity_bufs)))
        });
    }
    assert_eq!(&p_out[..], &parity[..]);

    let g = generator();
    let enc_tables = tables_for(&g[K * K..]);
    p_out = [[0u8; SPLIT]; R];
    {
        let mut src: [*mut u8; K] = std::array::from_fn(|i| data[i].as_ptr().cast_mut());
        let [a, b] = &mut p_out;
        let mut dst: [*mut u8; R] = [a.as_mut_ptr(), b.as_mut_ptr()];
        let tables = enc_tables.as_ptr().cast_mut();
        group.bench_function("encode/isal_direct", |bench| {
            bench.iter(|| {
                // SAFETY: K source and R destination buffers of SPLIT bytes
                // that outlive the benchmark, and 8+2 encode tables.
                unsafe {
                    ffi::ec_encode_data(
                        SPLIT as c_int,
                        K as c_int,
                        R as c_int,
                        black_box(tables),
                        black_box(src.as_mut_ptr()),
                        black_box(dst.as_mut_ptr()),
                    )
                }
            })
        });
    }
    assert_eq!(&p_out[..], &parity[..]);

    // --- decode, 2 data splits lost --------------------------------------
    let mut lost = [[0u8; SPLIT]; 2];
    {
        let present: [(usize, &[u8]); K] = std::array::from_fn(|j| (PRESENT[j], split(PRESENT[j])));
        let [a, b] = &mut lost;
        let mut missing: [(usize, &mut [u8]); 2] = [(LOST[0], a), (LOST[1], b)];
        group.bench_function("decode_2lost/Codec", |bench| {
            bench.iter(|| codec.reconstruct(black_box(&present), black_box(&mut missing)))
        });
    }
    assert_eq!(&lost[0][..], data[LOST[0]]);
    assert_eq!(&lost[1][..], data[LOST[1]]);

    let dec_tables = tables_for(&decode_rows(&g));
    lost = [[0u8; SPLIT]; 2];
    {
        let mut src: [*mut u8; K] = std::array::from_fn(|j| split(PRESENT[j]).as_ptr().cast_mut());
        let [a, b] = &mut lost;
        let mut dst: [*mut u8; 2] = [a.as_mut_ptr(), b.as_mut_ptr()];
        let tables = dec_tables.as_ptr().cast_mut();
        group.bench_function("decode_2lost/isal_direct", |bench| {
            bench.iter(|| {
                // SAFETY: K present and 2 output buffers of SPLIT bytes that
                // outlive the benchmark, and decode tables for 8 x 2.
                unsafe {
                    ffi::ec_encode_data(
                        SPLIT as c_int,
                        K as c_int,
                        2,
                        black_box(tables),
                        black_box(src.as_mut_ptr()),
                        black_box(dst.as_mut_ptr()),
                    )
                }
            })
        });
    }
    assert_eq!(&lost[0][..], data[LOST[0]]);
    assert_eq!(&lost[1][..], data[LOST[1]]);

    // --- memcpy yardsticks -----------------------------------------------
    let mut dst_page = vec![0u8; PAGE];
    group.bench_function("memcpy/hot", |bench| {
        bench.iter(|| black_box(&mut dst_page[..]).copy_from_slice(black_box(&page)))
    });

    // Non-zero fill so every page is backed by its own physical memory.
    let mut arena = vec![0x5Au8; COLD_BYTES];
    let pages = COLD_BYTES / PAGE;
    // Prime stride: consecutive copies land on unrelated pages, so neither
    // the caches nor the next-page prefetcher help.
    let stride = 7919;
    let mut i = 0usize;
    group.bench_function("memcpy/cold_1GiB", |bench| {
        bench.iter(|| {
            i = (i + stride) % pages;
            let from = i * PAGE;
            let to = ((i + pages / 2) % pages) * PAGE;
            arena.copy_within(from..from + PAGE, to);
            black_box(&arena[to]);
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50);
    targets = bench
}
criterion_main!(benches);
