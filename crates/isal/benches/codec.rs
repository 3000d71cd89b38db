//! Cost of erasure-coding one 4 KiB page as 8+2 (512-byte splits).
//!
//! Measures, in one run: `Codec::encode`; `Codec::reconstruct` with two data
//! splits lost (decode tables cached); the same two operations as direct
//! `ffi::ec_encode_data` calls with pre-built tables and pointer arrays (so
//! `Codec / direct` is the wrapper overhead); and a 4 KiB `memcpy` with hot
//! buffers and with cold ones (pages picked with a large prime stride from a
//! buffer many times the last-level cache), as the yardstick the coding cost
//! is compared with. Times are per page (one iteration = one page).
//!
//! Criterion reports means, which on a shared machine absorb interference
//! from other tenants. So after the Criterion groups the bench also prints a
//! summary measured the robust way: the variants run interleaved in short
//! batches and each keeps its fastest batch, so a noisy moment hits all of
//! them alike and the wrapper/direct ratios stay meaningful.

// `criterion_group!` generates a public function without a doc comment.
#![allow(missing_docs)]

use std::hint::black_box;
use std::os::raw::c_int;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion, Throughput};
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

/// A zeroed buffer that lives for the rest of the process, so fixtures can
/// hold plain slices and raw pointers into it without lifetimes.
fn leak(len: usize) -> &'static mut [u8] {
    Box::leak(vec![0u8; len].into_boxed_slice())
}

/// ISA-L tables for `rows` (each `K` coefficients), as `Codec` builds them.
fn tables_for(rows: &[u8]) -> *mut u8 {
    let n_rows = rows.len() / K;
    let mut coeffs = rows.to_vec();
    let tables = leak(32 * K * n_rows);
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
    tables.as_mut_ptr()
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

/// Everything the measured operations touch, built once. The wrapper and
/// the direct call of each pair read and write the very same buffers, so
/// their difference is the wrapper alone (kernel speed varies by tens of
/// percent with buffer placement, e.g. 4 KiB aliasing between sources and
/// destinations).
struct Fixture {
    codec: Codec,
    /// The page's data splits (slices of one 4 KiB buffer).
    data: [&'static [u8]; K],
    /// `PRESENT` splits with their contents.
    present: [(usize, &'static [u8]); K],
    /// Output buffers, as raw pointers: both variants write them, so no
    /// `&mut` to them is kept across calls.
    parity_out: [*mut u8; R],
    lost_out: [*mut u8; 2],
    /// Direct-call inputs.
    enc_tables: *mut u8,
    enc_src: [*mut u8; K],
    dec_tables: *mut u8,
    dec_src: [*mut u8; K],
    /// memcpy buffers.
    hot_src: &'static [u8],
    hot_dst: &'static mut [u8],
}

impl Fixture {
    fn new() -> Fixture {
        let codec = Codec::new(K, R).expect("8+2 is a valid code");
        let page = leak(PAGE);
        for (i, b) in page.iter_mut().enumerate() {
            *b = (i * 131 + i / 7) as u8;
        }
        let page: &'static [u8] = page;
        let data: [&'static [u8]; K] = std::array::from_fn(|i| &page[i * SPLIT..(i + 1) * SPLIT]);

        let mut parity: [&'static mut [u8]; R] = std::array::from_fn(|_| leak(SPLIT));
        codec.encode(&data, &mut parity).expect("encode");
        let parity: [&'static [u8]; R] = parity.map(|p| &*p);
        let split = |i: usize| -> &'static [u8] {
            match i < K {
                true => data[i],
                false => parity[i - K],
            }
        };

        let g = generator();
        Fixture {
            data,
            present: PRESENT.map(|i| (i, split(i))),
            parity_out: std::array::from_fn(|_| leak(SPLIT).as_mut_ptr()),
            lost_out: std::array::from_fn(|_| leak(SPLIT).as_mut_ptr()),
            enc_tables: tables_for(&g[K * K..]),
            enc_src: data.map(|d| d.as_ptr().cast_mut()),
            dec_tables: tables_for(&decode_rows(&g)),
            dec_src: PRESENT.map(|i| split(i).as_ptr().cast_mut()),
            hot_src: page,
            hot_dst: leak(PAGE),
            codec,
        }
    }

    fn encode_codec(&mut self) {
        // SAFETY: each pointer is the start of its own leaked SPLIT-byte
        // buffer, and no other reference to it is alive during the call.
        let mut parity = self
            .parity_out
            .map(|p| unsafe { std::slice::from_raw_parts_mut(p, SPLIT) });
        let r = self
            .codec
            .encode(black_box(&self.data), black_box(&mut parity));
        black_box(r).expect("encode");
    }

    fn encode_direct(&mut self) {
        // SAFETY: K source and R destination buffers of SPLIT bytes that
        // live for the whole process, and tables for exactly 8 x 2.
        unsafe {
            ffi::ec_encode_data(
                SPLIT as c_int,
                K as c_int,
                R as c_int,
                black_box(self.enc_tables),
                black_box(self.enc_src.as_mut_ptr()),
                black_box(self.parity_out.as_mut_ptr()),
            )
        }
    }

    fn decode_codec(&mut self) {
        let [a, b] = self.lost_out;
        // SAFETY: each pointer is the start of its own leaked SPLIT-byte
        // buffer, and no other reference to it is alive during the call.
        let mut lost = unsafe {
            [
                (LOST[0], std::slice::from_raw_parts_mut(a, SPLIT)),
                (LOST[1], std::slice::from_raw_parts_mut(b, SPLIT)),
            ]
        };
        let r = self
            .codec
            .reconstruct(black_box(&self.present), black_box(&mut lost));
        black_box(r).expect("reconstruct");
    }

    fn decode_direct(&mut self) {
        // SAFETY: K present and 2 output buffers of SPLIT bytes that live
        // for the whole process, and decode tables for exactly 8 x 2.
        unsafe {
            ffi::ec_encode_data(
                SPLIT as c_int,
                K as c_int,
                2,
                black_box(self.dec_tables),
                black_box(self.dec_src.as_mut_ptr()),
                black_box(self.lost_out.as_mut_ptr()),
            )
        }
    }

    fn memcpy_hot(&mut self) {
        black_box(&mut *self.hot_dst).copy_from_slice(black_box(self.hot_src));
    }

    /// Checks that every variant computed the right thing.
    fn verify(&mut self) {
        type Op = fn(&mut Fixture);
        let encodes: [Op; 2] = [Fixture::encode_codec, Fixture::encode_direct];
        let decodes: [Op; 2] = [Fixture::decode_codec, Fixture::decode_direct];
        let parity = [self.present[K - R].1, self.present[K - 1].1];
        let lost = LOST.map(|i| self.data[i]);
        for (ops, outs, wants) in [
            (encodes, self.parity_out, parity),
            (decodes, self.lost_out, lost),
        ] {
            for op in ops {
                for p in outs {
                    // SAFETY: a leaked SPLIT-byte buffer, not borrowed now.
                    unsafe { std::ptr::write_bytes(p, 0, SPLIT) };
                }
                op(self);
                for (j, (out, want)) in outs.iter().zip(wants).enumerate() {
                    // SAFETY: a leaked buffer of SPLIT initialised bytes.
                    let got = unsafe { std::slice::from_raw_parts(*out, SPLIT) };
                    assert_eq!(got, want, "output {j}");
                }
            }
        }
    }
}

fn bench(c: &mut Criterion) {
    let mut fx = Fixture::new();
    fx.verify();

    let mut group = c.benchmark_group("page4k_8+2");
    group.throughput(Throughput::Elements(1));
    group.bench_function("encode/Codec", |b| b.iter(|| fx.encode_codec()));
    group.bench_function("encode/isal_direct", |b| b.iter(|| fx.encode_direct()));
    group.bench_function("decode_2lost/Codec", |b| b.iter(|| fx.decode_codec()));
    group.bench_function("decode_2lost/isal_direct", |b| {
        b.iter(|| fx.decode_direct())
    });
    group.bench_function("memcpy/hot", |b| b.iter(|| fx.memcpy_hot()));

    // Non-zero fill so every page is backed by its own physical memory.
    let arena = leak(COLD_BYTES);
    arena.fill(0x5A);
    let pages = COLD_BYTES / PAGE;
    // Prime stride: consecutive copies land on unrelated pages, so neither
    // the caches nor the next-page prefetcher help.
    let stride = 7919;
    let mut i = 0usize;
    group.bench_function("memcpy/cold_1GiB", |b| {
        b.iter(|| {
            i = (i + stride) % pages;
            let from = i * PAGE;
            let to = ((i + pages / 2) % pages) * PAGE;
            arena.copy_within(from..from + PAGE, to);
            black_box(&arena[to]);
        })
    });
    group.finish();
    fx.verify();
}

/// Fastest-batch ns/page for each variant, run interleaved.
fn interleaved_min(fx: &mut Fixture) -> [f64; 5] {
    type Op = fn(&mut Fixture);
    let ops: [Op; 5] = [
        Fixture::encode_codec,
        Fixture::encode_direct,
        Fixture::decode_codec,
        Fixture::decode_direct,
        Fixture::memcpy_hot,
    ];
    let mut best = [f64::MAX; 5];
    const BATCH: u32 = 2_000;
    for _ in 0..300 {
        for (op, best) in ops.iter().zip(best.iter_mut()) {
            let t = Instant::now();
            for _ in 0..BATCH {
                op(fx);
            }
            *best = best.min(t.elapsed().as_nanos() as f64 / f64::from(BATCH));
        }
    }
    best
}

fn summary() {
    let mut fx = Fixture::new();
    fx.verify();
    let [enc, enc_direct, dec, dec_direct, hot] = interleaved_min(&mut fx);
    fx.verify();
    println!();
    println!("summary (fastest of 300 interleaved batches of 2000 pages, ns/page):");
    println!(
        "  encode        Codec {enc:6.1}   direct {enc_direct:6.1}   ratio {:.2}x",
        enc / enc_direct
    );
    println!(
        "  decode 2 lost Codec {dec:6.1}   direct {dec_direct:6.1}   ratio {:.2}x",
        dec / dec_direct
    );
    println!("  memcpy 4 KiB hot {hot:6.1}");
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50);
    targets = bench
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    // Skip the extra summary for `cargo test --benches` and `--list`.
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--list") {
        summary();
    }
}
