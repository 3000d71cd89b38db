//! The multi-page API against real memory node processes: batches read back exactly what was
//! written (by batches or single pages), across address-range boundaries and unwritten
//! ranges, with nodes lost, from many threads with fewer slots than their batches' pages.

mod common;

use std::time::Duration;

use hydramem::bench::fill_page;
use hydramem::client::{Ablation, ClientConfig, IoError, Mode, Page, RemoteMemory, Resilience};
use hydramem::PAGE_SIZE;

use common::HYDRA;

const SLAB: u64 = 1 << 20;
const PAGE: u64 = PAGE_SIZE as u64;

/// `n` pages whose contents name their page number and `seed`.
fn pages(first: u64, n: usize, seed: u64) -> Vec<Page> {
    (0..n as u64)
        .map(|i| {
            let mut p = [0u8; PAGE_SIZE];
            fill_page(&mut p, seed, (first + i) * PAGE, 0);
            p
        })
        .collect()
}

fn assert_pages(got: &[Page], want: &[Page], what: &str) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g == w, "{what}: page {i} differs");
    }
}

#[test]
fn batches_read_back_exactly_for_every_scheme() {
    let c = common::cluster(12, SLAB, 64);
    for scheme in [
        HYDRA,
        Resilience::Hydra {
            k: 6,
            r: 3,
            delta: 2,
            mode: Mode::FailureRecovery,
        },
        Resilience::Hydra {
            k: 8,
            r: 3,
            delta: 1,
            mode: Mode::Correction,
        },
        Resilience::Replication { copies: 2 },
    ] {
        let probe = RemoteMemory::connect(c.cluster(), ClientConfig::new(scheme, PAGE)).unwrap();
        let ppr = probe.layout().pages_per_range;
        drop(probe);
        // Three address ranges: the batch below crosses the first boundary, the last range
        // is never written.
        let size = 3 * ppr * PAGE;
        let mem = RemoteMemory::connect(c.cluster(), ClientConfig::new(scheme, size)).unwrap();
        // A batch that starts 3 pages before a range boundary and spans up to 600 pages (three
        // windows), two ranges mapped by the batch itself.
        let first = ppr - 3;
        let n = 600.min(ppr as usize + 3);
        let want = pages(first, n, 1);
        mem.write_pages(first * PAGE, &want).unwrap();
        let mut got = vec![[0u8; PAGE_SIZE]; n];
        mem.read_pages(first * PAGE, &mut got).unwrap();
        assert_pages(&got, &want, &format!("{scheme:?} batch read"));
        // Single-page reads see the batch's writes, batch reads see single-page writes.
        let mut one = [0u8; PAGE_SIZE];
        mem.read_page((first + 199) * PAGE, &mut one).unwrap();
        assert!(one == want[199]);
        let single = pages(first + 10, 1, 2);
        mem.write_page((first + 10) * PAGE, &single[0]).unwrap();
        mem.read_pages(first * PAGE, &mut got[..20]).unwrap();
        assert!(
            got[10] == single[0],
            "{scheme:?}: batch read after single write"
        );
        // A batch over a range never written reads zeros without asking any node.
        let unwritten = (size / PAGE) - 40;
        let mut z = vec![[7u8; PAGE_SIZE]; 40];
        mem.read_pages(unwritten * PAGE, &mut z).unwrap();
        assert!(z.iter().all(|p| p.iter().all(|&b| b == 0)));
        mem.free_all().unwrap();
    }
}

#[test]
fn lists_of_scattered_pages_read_back_exactly() {
    let c = common::cluster(12, SLAB, 64);
    for scheme in [HYDRA, Resilience::Replication { copies: 2 }] {
        let mem = RemoteMemory::connect(c.cluster(), ClientConfig::new(scheme, 4 << 20)).unwrap();
        // Scattered pages, a consecutive stretch among them, one page named twice (the later
        // entry wins), in no particular order.
        let addrs: Vec<u64> = [700u64, 3, 4, 5, 6, 200, 999, 1, 4, 512, 513]
            .iter()
            .map(|p| p * PAGE)
            .collect();
        let data: Vec<Page> = addrs
            .iter()
            .enumerate()
            .map(|(i, &a)| pages(a / PAGE, 1, 10 + i as u64)[0])
            .collect();
        let list: Vec<(u64, &Page)> = addrs.iter().copied().zip(data.iter()).collect();
        mem.write_list(&list).unwrap();
        let mut got = vec![[9u8; PAGE_SIZE]; addrs.len() + 1];
        let mut read: Vec<(u64, &mut Page)> = addrs
            .iter()
            .copied()
            .chain([2 * PAGE])
            .zip(got.iter_mut())
            .collect();
        mem.read_list(&mut read).unwrap();
        for (i, &a) in addrs.iter().enumerate() {
            // The last entry for an address is what it holds.
            let last = addrs.iter().rposition(|&b| b == a).unwrap();
            assert!(got[i] == data[last], "{scheme:?}: page at {a} (entry {i})");
        }
        assert!(got[addrs.len()].iter().all(|&b| b == 0), "never written");
        // Each page as a single-page read sees the same.
        let mut one = [0u8; PAGE_SIZE];
        mem.read_page(513 * PAGE, &mut one).unwrap();
        assert!(one == data[10]);
        assert!(matches!(
            mem.read_list(&mut [(PAGE + 1, &mut one)]),
            Err(IoError::Unaligned { .. })
        ));
        assert!(matches!(
            mem.write_list(&[(4 << 20, &data[0])]),
            Err(IoError::OutOfRange { .. })
        ));
        mem.free_all().unwrap();
    }
}

#[test]
fn every_design_choice_turned_off_still_reads_back_exactly() {
    let c = common::cluster(12, SLAB, 64);
    for ablation in [
        Ablation {
            encode_first: true,
            ..Ablation::default()
        },
        Ablation {
            bounce: true,
            ..Ablation::default()
        },
        Ablation {
            unbatched: true,
            ..Ablation::default()
        },
    ] {
        let mut cfg = ClientConfig::new(HYDRA, 2 << 20);
        cfg.ablation = ablation;
        let mem = RemoteMemory::connect(c.cluster(), cfg).unwrap();
        let want = pages(0, 40, 3);
        mem.write_pages(0, &want[..32]).unwrap();
        for (i, p) in want.iter().enumerate().skip(32) {
            mem.write_page(i as u64 * PAGE, p).unwrap();
        }
        let mut got = vec![[0u8; PAGE_SIZE]; 40];
        mem.read_pages(0, &mut got).unwrap();
        assert_pages(&got, &want, &format!("{ablation:?}"));
        let mut one = [0u8; PAGE_SIZE];
        mem.read_page(5 * PAGE, &mut one).unwrap();
        assert!(one == want[5], "{ablation:?}: single-page read");
        mem.free_all().unwrap();
    }
}

#[test]
fn bad_spans_are_refused() {
    let c = common::cluster(12, SLAB, 16);
    let mem = RemoteMemory::connect(c.cluster(), ClientConfig::new(HYDRA, 1 << 20)).unwrap();
    let mut buf = vec![[0u8; PAGE_SIZE]; 4];
    assert!(matches!(
        mem.read_pages(100, &mut buf),
        Err(IoError::Unaligned { addr: 100 })
    ));
    // Ends one page past the end; and an address whose span overflows u64.
    assert!(matches!(
        mem.write_pages((1 << 20) - 3 * PAGE, &buf),
        Err(IoError::OutOfRange { .. })
    ));
    assert!(matches!(
        mem.read_pages(u64::MAX - PAGE + 1, &mut buf),
        Err(IoError::OutOfRange { .. })
    ));
    // Empty batches are fine anywhere inside.
    mem.read_pages(0, &mut []).unwrap();
}

#[test]
fn batches_survive_lost_nodes() {
    let mut c = common::cluster(12, SLAB, 64);
    let mut cfg = ClientConfig::new(HYDRA, 2 << 20);
    cfg.straggler_after = Duration::from_millis(2);
    let mem = RemoteMemory::connect(c.cluster(), cfg).unwrap();
    let want = pages(0, 512, 3);
    mem.write_pages(0, &want).unwrap();
    let g = mem.group_of(0).unwrap();
    // One member stops answering (a straggler, still connected), another dies.
    c.pause(g.nodes[2] as usize).unwrap();
    c.kill(g.nodes[7] as usize).unwrap();
    let mut got = vec![[0u8; PAGE_SIZE]; 512];
    mem.read_pages(0, &mut got).unwrap();
    assert_pages(&got, &want, "read with a straggler and a dead node");
    // Writes go on: the dead node's split moves to a spare (the per-page way out of a batch),
    // and the straggler is waited for or routed around as the mode requires.
    c.resume(g.nodes[2] as usize).unwrap();
    let want = pages(0, 512, 4);
    mem.write_pages(0, &want).unwrap();
    mem.read_pages(0, &mut got).unwrap();
    assert_pages(&got, &want, "batch written after a node died");
}

#[test]
fn concurrent_batches_with_fewer_slots_than_pages_do_not_deadlock() {
    let c = common::cluster(12, SLAB, 64);
    let mut cfg = ClientConfig::new(HYDRA, 4 << 20);
    // 4 threads × 200-page batches over 24 slots: every batch gets only part of its window.
    cfg.max_in_flight = 24;
    let mem = RemoteMemory::connect(c.cluster(), cfg).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let mem = &mem;
            s.spawn(move || {
                let first = t * 200;
                for round in 0..3 {
                    let want = pages(first, 200, round * 10 + t);
                    mem.write_pages(first * PAGE, &want).unwrap();
                    let mut got = vec![[0u8; PAGE_SIZE]; 200];
                    mem.read_pages(first * PAGE, &mut got).unwrap();
                    assert_pages(&got, &want, "concurrent batch");
                }
            });
        }
    });
}
