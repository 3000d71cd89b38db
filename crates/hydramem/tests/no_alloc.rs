//! The data path allocates nothing per page: a counting global allocator sees zero heap
//! allocations across thousands of page writes and reads (including decoding reads) once the
//! client is warm. Covers the calling thread and the transport's receiver thread alike, since
//! the counter is process-wide.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use hydramem::client::{ClientConfig, Mode, RemoteMemory, Resilience};
use hydramem::PAGE_SIZE;

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: delegates to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn run(mem: &RemoteMemory, pages: u64, rounds: u64) {
    let mut page = [0u8; PAGE_SIZE];
    for i in 0..rounds {
        let p = (i * 31) % pages;
        page[..8].copy_from_slice(&i.to_le_bytes());
        mem.write_page(p * PAGE_SIZE as u64, &page).unwrap();
        mem.read_page(p * PAGE_SIZE as u64, &mut page).unwrap();
        assert_eq!(page[..8], i.to_le_bytes());
    }
}

/// The failure detector's verification of a suspect (which allocates: it opens a connection)
/// is not the data path; on a loaded test machine a heartbeat can miss a short timeout, so
/// the timeouts are long here.
fn quiet(mut cfg: ClientConfig) -> ClientConfig {
    cfg.tcp.heartbeat_timeout = std::time::Duration::from_secs(5);
    cfg.tcp.verify_timeout = std::time::Duration::from_secs(5);
    cfg
}

#[test]
fn page_io_does_not_allocate() {
    let mut c = common::cluster(11, 1 << 20, 16);
    let ec = Resilience::Hydra {
        k: 8,
        r: 2,
        delta: 1,
        mode: Mode::EcOnly,
    };
    for (s, checksums) in [
        (ec, false),
        (ec, true),
        (
            Resilience::Hydra {
                k: 8,
                r: 2,
                delta: 1,
                mode: Mode::Detection,
            },
            false,
        ),
        (Resilience::Replication { copies: 2 }, true),
    ] {
        let pages = 256;
        let mut cfg = quiet(ClientConfig::new(s, pages * PAGE_SIZE as u64));
        cfg.checksums = checksums;
        let mem = RemoteMemory::connect(c.cluster(), cfg).unwrap();
        // Warm up: map every range, grow buffers, fill the decode-table cache for the patterns
        // we will see, start thread-locals.
        run(&mem, pages, 2000);
        COUNTING.store(true, Ordering::SeqCst);
        run(&mem, pages, 3000);
        COUNTING.store(false, Ordering::SeqCst);
        let n = ALLOCS.swap(0, Ordering::SeqCst);
        assert_eq!(
            n,
            0,
            "{} (checksums {checksums}): {n} heap allocations in 6000 page operations",
            s.label()
        );
    }
    // With a node gone and its split regenerated elsewhere, reads still decode whenever a
    // parity split is among those asked: no allocation once the loss patterns are cached.
    // With checksums, which the regenerated split must carry too.
    let s = Resilience::Hydra {
        k: 8,
        r: 2,
        delta: 2,
        mode: Mode::EcOnly,
    };
    let mut cfg = quiet(ClientConfig::new(s, 256 * PAGE_SIZE as u64));
    cfg.checksums = true;
    let mem = RemoteMemory::connect(c.cluster(), cfg).unwrap();
    run(&mem, 256, 500);
    let victim = mem.group_of(0).unwrap().nodes[0] as usize;
    c.kill(victim).unwrap();
    // The loss is detected, the split moved to the spare node and regenerated there (all of
    // which may allocate: it is not the data path); then reads decode at steady state.
    common::wait_regenerated(&mem, 1);
    let mut page = [0u8; PAGE_SIZE];
    for _ in 0..3 {
        for p in 0..256u64 {
            mem.read_page(p * PAGE_SIZE as u64, &mut page).unwrap();
        }
    }
    COUNTING.store(true, Ordering::SeqCst);
    for _ in 0..4 {
        for p in 0..256u64 {
            mem.read_page(p * PAGE_SIZE as u64, &mut page).unwrap();
        }
    }
    COUNTING.store(false, Ordering::SeqCst);
    assert!(mem.stats().decodes.load(Ordering::Relaxed) > 0);
    assert_eq!(ALLOCS.load(Ordering::SeqCst), 0, "decoding reads allocated");
    assert_eq!(
        mem.stats().corrupt.load(Ordering::Relaxed),
        0,
        "a regenerated split failed its checksum"
    );
}
