//! Cost of the integrity layer per 4 KiB page, against the coding it protects.
//!
//! Measures, in one run: the CRC32C of one 512-byte split bound to its page and version
//! (`integrity::split_crc`, what a write computes per split and a read verifies), ten of them
//! (one 8+2 page), encoding the page's parity (the work checksums add to), and the correction
//! search of an 8+3 page with one corrupted split (`client::correct::correct`, the rare path
//! a correcting read takes). Times are per operation; `cargo bench -p hydramem --bench
//! integrity` reproduces them.

// `criterion_group!` generates a public function without a doc comment.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hydramem::client::correct::correct;
use hydramem::integrity::split_crc;
use hydramem_isal::Codec;

const SPLIT: usize = 512;

fn bench(c: &mut Criterion) {
    let page: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761u32) >> 13) as u8)
        .collect();
    let mut g = c.benchmark_group("integrity");
    g.throughput(Throughput::Bytes(SPLIT as u64));
    g.bench_function("crc32c of one 512 B split, bound", |b| {
        b.iter(|| split_crc(black_box(&page[..SPLIT]), 3, 17, 2, 99))
    });
    g.bench_function("crc32c of one 512 B split, bytes only", |b| {
        b.iter(|| {
            crc_fast::checksum(
                crc_fast::CrcAlgorithm::Crc32Iscsi,
                black_box(&page[..SPLIT]),
            )
        })
    });
    g.throughput(Throughput::Bytes(10 * SPLIT as u64));
    g.bench_function("crc32c of an 8+2 page (10 splits)", |b| {
        b.iter(|| {
            (0..10).fold(0u32, |acc, j| {
                acc ^ split_crc(black_box(&page[(j % 8) * SPLIT..][..SPLIT]), 3, 17, j, 99)
            })
        })
    });
    let codec = Codec::new(8, 2).unwrap();
    let mut parity = vec![0u8; 2 * SPLIT];
    g.throughput(Throughput::Bytes(4096));
    g.bench_function("encode 8+2 parity of a page", |b| {
        b.iter(|| {
            let data: Vec<&[u8]> = page.chunks_exact(SPLIT).collect();
            let mut p: Vec<&mut [u8]> = parity.chunks_exact_mut(SPLIT).collect();
            codec.encode(black_box(&data), &mut p).unwrap();
        })
    });
    let codec3 = Codec::new(8, 3).unwrap();
    let mut word = page.clone();
    word.resize(11 * SPLIT, 0);
    {
        let (d, p) = word.split_at_mut(4096);
        let data: Vec<&[u8]> = d.chunks_exact(SPLIT).collect();
        let mut par: Vec<&mut [u8]> = p.chunks_exact_mut(SPLIT).collect();
        codec3.encode(&data, &mut par).unwrap();
    }
    for (what, bad) in [("data split 0", 0), ("parity split 10", 10)] {
        let mut corrupted = word.clone();
        corrupted[bad * SPLIT + 100] ^= 4;
        let received: Vec<Option<&[u8]>> = corrupted.chunks_exact(SPLIT).map(Some).collect();
        g.bench_function(format!("correct 8+3 with {what} corrupted"), |b| {
            b.iter(|| correct(&codec3, black_box(&received), SPLIT).unwrap())
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(300))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
