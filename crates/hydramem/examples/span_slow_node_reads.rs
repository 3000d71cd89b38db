//! Reproduces an open tail-latency problem of span coding (docs/benchmarks.md §11, "A slow
//! node and a killed one"): with one memory node answering 10 ms late, QD1 reads of a span
//! store right after a burst of single-page writes take 2–15 ms now and then — reads of pages
//! on healthy nodes too, not only those decoded around the slow one — while the same reads
//! without the burst, or without the slow node, stay under a millisecond.
//!
//! ```sh
//! cargo build --release -p hydramem --example span_slow_node_reads
//! target/release/examples/span_slow_node_reads target/release/hydramem [burst|none] [slow|healthy]
//! ```
//!
//! Prints the read latencies (p50, p99, max) and the slow reads: when, whether decoded, where.

use std::time::{Duration, Instant};

use hydramem::client::{ClientConfig, RemoteMemory, Resilience};
use hydramem::embedded::{EmbeddedCluster, EmbeddedOptions};
use hydramem::nbd::PageStore;
use hydramem::span::SpanStore;
use hydramem::PAGE_SIZE;

const PAGES: u64 = 8192;
const PAGE: u64 = PAGE_SIZE as u64;

fn main() {
    let mut args = std::env::args().skip(1);
    let binary = std::path::PathBuf::from(args.next().expect("the hydramem binary to run nodes"));
    let burst = args.next().as_deref() != Some("none");
    let slow = args.next().as_deref() != Some("healthy");
    let slab = 64u64 << 20;
    let cluster = EmbeddedCluster::start(EmbeddedOptions::fault_injecting(
        binary,
        11,
        slab,
        64 * slab,
    ))
    .expect("the nodes start");
    let config = ClientConfig::new(Resilience::Span { k: 8, r: 2 }, PAGES * PAGE);
    let mem = RemoteMemory::connect(cluster.cluster(), config).expect("connects");
    let store = SpanStore::new(mem.clone()).expect("a fresh store");
    // Full rows first; then, with `burst`, single-page writes: each a partial row, garbage
    // for the compaction that follows.
    let full: Vec<[u8; PAGE_SIZE]> = (0..64).map(|i| [i as u8; PAGE_SIZE]).collect();
    for first in (0..PAGES).step_by(64) {
        store.write_pages(first * PAGE, &full).expect("writes");
    }
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % PAGES
    };
    if burst {
        for _ in 0..3000 {
            store
                .write_page(next() * PAGE, &[7; PAGE_SIZE])
                .expect("writes");
        }
    }
    let victim = mem.group_of(0).expect("mapped").nodes[0] as usize;
    if slow {
        cluster
            .inject(victim, hydramem::wire::Fault::DelayReplies(10_000))
            .expect("the node takes the fault");
    }
    let start = Instant::now();
    let mut reads = Vec::new();
    let mut buf = [0u8; PAGE_SIZE];
    for _ in 0..3000 {
        let page = next();
        let decoded = store.stats().reads_decoded;
        let t = Instant::now();
        store.read_page(page * PAGE, &mut buf).expect("reads");
        let took = t.elapsed();
        let was_decoded = store.stats().reads_decoded > decoded;
        let at = store.location(page * PAGE).unwrap_or_default();
        reads.push((took, start.elapsed(), was_decoded, at));
    }
    let mut sorted: Vec<Duration> = reads.iter().map(|r| r.0).collect();
    sorted.sort();
    let slow_reads: Vec<_> = reads
        .iter()
        .filter(|r| r.0 > Duration::from_millis(2))
        .collect();
    println!(
        "burst {burst}, node {victim} slow {slow}: read p50 {:?} p99 {:?} max {:?}; {} reads over 2 ms ({} decoded); compactions {}",
        sorted[1500],
        sorted[2970],
        sorted[2999],
        slow_reads.len(),
        slow_reads.iter().filter(|r| r.2).count(),
        store.stats().compactions
    );
    for (took, at, decoded, on) in slow_reads.iter().take(12) {
        println!("  {took:?} at {at:?}, decoded {decoded}, {on}");
    }
}
