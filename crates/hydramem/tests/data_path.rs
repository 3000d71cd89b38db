//! End-to-end data path against real memory node processes: every scheme reads back exactly
//! what was written, from many threads, with nodes lost, after reconnecting.

mod common;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use hydramem::bench::fill_page;
use hydramem::client::{ClientConfig, ClientError, IoError, Mode, RemoteMemory, Resilience};
use hydramem::wire::ClientId;
use hydramem::PAGE_SIZE;
use rand::{Rng, SeedableRng};

const SLAB: u64 = 1 << 20;

fn schemes() -> Vec<Resilience> {
    vec![
        Resilience::Hydra {
            k: 8,
            r: 2,
            delta: 1,
            mode: Mode::FailureRecovery,
        },
        Resilience::Hydra {
            k: 8,
            r: 2,
            delta: 0,
            mode: Mode::EcOnly,
        },
        // k that does not divide 4096: tail splits padded in the side buffer.
        Resilience::Hydra {
            k: 6,
            r: 3,
            delta: 2,
            mode: Mode::FailureRecovery,
        },
        Resilience::Hydra {
            k: 1,
            r: 1,
            delta: 1,
            mode: Mode::FailureRecovery,
        },
        Resilience::Replication { copies: 2 },
        Resilience::Replication { copies: 3 },
        Resilience::Replication { copies: 1 },
    ]
}

/// Random writes and overwrites from `threads` threads (each owning pages p ≡ t mod threads, so
/// the last value of a page is well defined), interleaved with reads that must see that value.
fn workload(
    mem: &RemoteMemory,
    pages: u64,
    threads: u64,
    ops: u64,
    seed: u64,
) -> HashMap<u64, u64> {
    let last = Mutex::new(HashMap::new());
    std::thread::scope(|s| {
        for t in 0..threads {
            let last = &last;
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ t);
                let mut mine: HashMap<u64, u64> = HashMap::new();
                let mut page = [0u8; PAGE_SIZE];
                let mut want = [0u8; PAGE_SIZE];
                for i in 0..ops {
                    let p = rng.random_range(0..pages / threads) * threads + t;
                    if rng.random_bool(0.6) {
                        let v = i + 1;
                        fill_page(&mut page, seed, p, v);
                        mem.write_page(p * PAGE_SIZE as u64, &page).unwrap();
                        mine.insert(p, v);
                    } else {
                        mem.read_page(p * PAGE_SIZE as u64, &mut page).unwrap();
                        match mine.get(&p) {
                            Some(v) => fill_page(&mut want, seed, p, *v),
                            None => want = [0u8; PAGE_SIZE],
                        }
                        assert!(
                            page == want,
                            "page {p} read back wrong (thread {t}, op {i})"
                        );
                    }
                }
                last.lock().unwrap().extend(mine);
            });
        }
    });
    last.into_inner().unwrap()
}

fn verify_all(mem: &RemoteMemory, pages: u64, seed: u64, last: &HashMap<u64, u64>) {
    let mut page = [0u8; PAGE_SIZE];
    let mut want = [0u8; PAGE_SIZE];
    for p in 0..pages {
        mem.read_page(p * PAGE_SIZE as u64, &mut page)
            .unwrap_or_else(|e| panic!("page {p}: {e}"));
        match last.get(&p) {
            Some(v) => fill_page(&mut want, seed, p, *v),
            None => want = [0u8; PAGE_SIZE],
        }
        assert!(page == want, "page {p} read back wrong");
    }
}

#[test]
fn every_scheme_reads_back_exactly_across_threads() {
    let c = common::cluster(12, SLAB, 64);
    for (i, s) in schemes().into_iter().enumerate() {
        // Spans several address ranges for every scheme.
        let pages = 3 * SLAB / 512 + 17;
        let mem =
            RemoteMemory::connect(c.cluster(), ClientConfig::new(s, pages * PAGE_SIZE as u64))
                .unwrap();
        let last = workload(&mem, pages, 8, 600, 100 + i as u64);
        verify_all(&mem, pages, 100 + i as u64, &last);
        mem.free_all().unwrap();
    }
}

#[test]
fn reads_survive_r_killed_and_r_paused_nodes() {
    let mut c = common::cluster(12, SLAB, 64);
    let s = Resilience::Hydra {
        k: 8,
        r: 2,
        delta: 1,
        mode: Mode::FailureRecovery,
    };
    let pages = 2048;
    let mut cfg = ClientConfig::new(s, pages * PAGE_SIZE as u64);
    cfg.straggler_after = Duration::from_millis(2);
    let mem = RemoteMemory::connect(c.cluster(), cfg).unwrap();
    let last = workload(&mem, pages, 4, 800, 7);
    let g = mem.group_of(0).unwrap();
    // Two members of the first range's coding group stop answering (SIGSTOP): they keep their
    // connections, so only the straggler re-issue gets the read past them.
    c.pause(g.nodes[0] as usize).unwrap();
    c.pause(g.nodes[5] as usize).unwrap();
    verify_all(&mem, pages, 7, &last);
    c.resume(g.nodes[0] as usize).unwrap();
    c.resume(g.nodes[5] as usize).unwrap();
    // The heartbeat may have declared them failed meanwhile: wait until they are reconnected
    // (with them down too, 4 > r splits would be missing and reads would rightly fail).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !(mem.transport().is_up(g.nodes[0]) && mem.transport().is_up(g.nodes[5])) {
        assert!(
            std::time::Instant::now() < deadline,
            "resumed nodes not reconnected"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Declared failed while stopped, their splits were moved to the spare nodes and are being
    // regenerated there; once that is done, two more losses leave k splits of every page.
    common::wait_regenerated(&mem, 0);
    let g = mem.group_of(0).unwrap();
    // Two others die: their slabs are gone for good.
    c.kill(g.nodes[1] as usize).unwrap();
    c.kill(g.nodes[9] as usize).unwrap();
    verify_all(&mem, pages, 7, &last);
    assert!(
        mem.stats()
            .decodes
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
}

#[test]
fn more_than_r_lost_nodes_fail_reads_clearly() {
    let mut c = common::cluster(10, SLAB, 64);
    let s = Resilience::Hydra {
        k: 8,
        r: 2,
        delta: 1,
        mode: Mode::FailureRecovery,
    };
    let mem =
        RemoteMemory::connect(c.cluster(), ClientConfig::new(s, 64 * PAGE_SIZE as u64)).unwrap();
    let page = [5u8; PAGE_SIZE];
    mem.write_page(0, &page).unwrap();
    for n in 0..3 {
        c.kill(n).unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    let mut out = [0u8; PAGE_SIZE];
    let e = mem.read_page(0, &mut out).unwrap_err();
    assert!(matches!(e, IoError::Unavailable { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("page 0x0") && msg.contains("needs") && msg.contains("down"),
        "{msg}"
    );
    // A write cannot move three splits onto the 7 survivors of 10 nodes without putting two
    // on one node: it fails, naming the range.
    let e = mem.write_page(0, &page).unwrap_err().to_string();
    assert!(
        e.contains("address range 0") && e.contains("replace"),
        "{e}"
    );
    // Once enough nodes are back (restarted empty here), writes and reads work again.
    for n in 0..3 {
        c.restart(n).unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !(0..3).all(|n| mem.transport().is_up(n)) {
        assert!(
            std::time::Instant::now() < deadline,
            "restarted nodes not reconnected"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let page2 = [6u8; PAGE_SIZE];
    mem.write_page(0, &page2).unwrap();
    mem.read_page(0, &mut out).unwrap();
    assert_eq!(out, page2);
}

#[test]
fn a_client_that_reconnects_reads_its_data() {
    let c = common::cluster(12, SLAB, 64);
    let s = Resilience::Hydra {
        k: 8,
        r: 2,
        delta: 1,
        mode: Mode::FailureRecovery,
    };
    let pages = 3000;
    let cfg = ClientConfig::new(s, pages * PAGE_SIZE as u64);
    let id = cfg.client_id;
    let last = {
        let mem = RemoteMemory::connect(c.cluster(), cfg.clone()).unwrap();
        workload(&mem, pages, 4, 1500, 3)
    };
    let mem = RemoteMemory::connect(c.cluster(), cfg).unwrap();
    verify_all(&mem, pages, 3, &last);
    // Other parameters with the same identity are refused, not misread.
    let mut other = ClientConfig::new(
        Resilience::Replication { copies: 2 },
        pages * PAGE_SIZE as u64,
    );
    other.client_id = id;
    match RemoteMemory::connect(c.cluster(), other) {
        Err(e @ ClientError::LayoutMismatch { .. }) => {
            assert!(e.to_string().contains("same k and r"))
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("connected with a mismatched layout"),
    }
}

#[test]
fn an_identity_is_not_reconnected_smaller_than_its_data_and_can_be_released() {
    let c = common::cluster(4, SLAB, 16);
    let s = Resilience::Replication { copies: 2 };
    let cfg = |size: u64, id| {
        let mut cfg = ClientConfig::new(s, size);
        cfg.client_id = id;
        cfg
    };
    let (mine, theirs) = (ClientId::random(), ClientId::random());
    let range = {
        let mem = RemoteMemory::connect(c.cluster(), cfg(3 * SLAB, mine)).unwrap();
        let range = mem.layout().range_bytes();
        for r in 0..3 {
            mem.write_page(r * range, &[r as u8 + 1; PAGE_SIZE])
                .unwrap();
        }
        range
    };
    let other = RemoteMemory::connect(c.cluster(), cfg(SLAB, theirs)).unwrap();
    other.write_page(0, &[9u8; PAGE_SIZE]).unwrap();
    // Smaller than the data: refused, naming the highest range held, and nothing is lost.
    let e = RemoteMemory::connect(c.cluster(), cfg(range, mine))
        .err()
        .expect("connected smaller than the data it holds");
    assert!(
        matches!(e, ClientError::SmallerThanHeld { range: 2, start, .. } if start == 2 * range),
        "{e}"
    );
    assert!(e.to_string().contains("hydramem free"), "{e}");
    let mem = RemoteMemory::connect(c.cluster(), cfg(2 * range + 1, mine)).unwrap();
    let mut page = [0u8; PAGE_SIZE];
    mem.read_page(2 * range, &mut page).unwrap();
    assert_eq!(page, [3u8; PAGE_SIZE]);
    drop(mem);
    // Released: every slab of the identity (3 ranges × 2 copies), and only those.
    let report = hydramem::release::release(c.cluster(), mine, Duration::from_secs(5));
    let freed: u64 = report.iter().map(|n| n.result.as_ref().unwrap()).sum();
    assert_eq!(freed, 6);
    let again = hydramem::release::release(c.cluster(), mine, Duration::from_secs(5));
    assert!(again.iter().all(|n| matches!(n.result, Ok(0))), "{again:?}");
    let mem = RemoteMemory::connect(c.cluster(), cfg(range, mine)).unwrap();
    mem.read_page(0, &mut page).unwrap();
    assert_eq!(page, [0u8; PAGE_SIZE]);
    other.read_page(0, &mut page).unwrap();
    assert_eq!(page, [9u8; PAGE_SIZE]);
}

#[test]
fn a_second_client_sees_only_zeros() {
    let c = common::cluster(12, SLAB, 64);
    let s = Resilience::Replication { copies: 2 };
    let a = RemoteMemory::connect(c.cluster(), ClientConfig::new(s, 1 << 20)).unwrap();
    a.write_page(4096, &[9u8; PAGE_SIZE]).unwrap();
    let b = RemoteMemory::connect(c.cluster(), ClientConfig::new(s, 1 << 20)).unwrap();
    let mut out = [1u8; PAGE_SIZE];
    b.read_page(4096, &mut out).unwrap();
    assert_eq!(out, [0u8; PAGE_SIZE]);
}

#[test]
fn capacity_exhaustion_is_a_clear_error() {
    // 10 nodes with 2 slabs each: exactly 2 ranges of 8+2.
    let c = common::cluster(10, SLAB, 2);
    let s = Resilience::Hydra {
        k: 8,
        r: 2,
        delta: 1,
        mode: Mode::FailureRecovery,
    };
    let range = 8 * SLAB;
    let mem = RemoteMemory::connect(c.cluster(), ClientConfig::new(s, 3 * range)).unwrap();
    let page = [1u8; PAGE_SIZE];
    mem.write_page(0, &page).unwrap();
    mem.write_page(range, &page).unwrap();
    let e = mem.write_page(2 * range, &page).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("out of capacity") && msg.contains("--capacity"),
        "{msg}"
    );
    // Nothing was lost by the refusal.
    let mut out = [0u8; PAGE_SIZE];
    mem.read_page(range, &mut out).unwrap();
    assert_eq!(out, page);
}

#[test]
fn bad_addresses_are_refused() {
    let c = common::cluster(2, SLAB, 4);
    let mem = RemoteMemory::connect(
        c.cluster(),
        ClientConfig::new(Resilience::Replication { copies: 2 }, 1 << 20),
    )
    .unwrap();
    let mut p = [0u8; PAGE_SIZE];
    assert!(matches!(
        mem.read_page(100, &mut p),
        Err(IoError::Unaligned { .. })
    ));
    assert!(matches!(
        mem.write_page(1 << 20, &p),
        Err(IoError::OutOfRange { .. })
    ));
    // Too wide a scheme for the cluster is refused at connect with the numbers.
    let e = RemoteMemory::connect(
        c.cluster(),
        ClientConfig::new(
            Resilience::Hydra {
                k: 8,
                r: 2,
                delta: 1,
                mode: Mode::EcOnly,
            },
            1 << 20,
        ),
    )
    .err()
    .unwrap();
    assert!(
        e.to_string().contains("needs 10 memory nodes but only 2"),
        "{e}"
    );
}

/// A page whose first 8 bytes name its version and whose rest is derived from (page, version):
/// a page assembled from splits of two different writes cannot pass `check_versioned`.
fn versioned_page(page: &mut [u8; PAGE_SIZE], p: u64, v: u64) {
    fill_page(page, 77, p, v);
    page[..8].copy_from_slice(&v.to_le_bytes());
}

fn check_versioned(page: &[u8; PAGE_SIZE], p: u64) -> u64 {
    let v = u64::from_le_bytes(page[..8].try_into().unwrap());
    if v == 0 {
        assert!(
            page.iter().all(|b| *b == 0),
            "page {p}: neither zeros nor a write"
        );
        return 0;
    }
    let mut want = [0u8; PAGE_SIZE];
    versioned_page(&mut want, p, v);
    assert!(
        *page == want,
        "page {p}: bytes of different writes mixed (claims version {v})"
    );
    v
}

/// Writers overwrite the same few pages while readers read them: every read returns exactly one
/// write's bytes (or zeros before the first), never a mix, in failure-recovery mode and in
/// EC-only mode (whose writes return before their last splits land), the latter while a node
/// is killed under load.
#[test]
fn concurrent_overwrites_never_read_mixed() {
    let mut c = common::cluster(12, SLAB, 64);
    for (mode, kill) in [(Mode::FailureRecovery, false), (Mode::EcOnly, true)] {
        let s = Resilience::Hydra {
            k: 8,
            r: 2,
            delta: 1,
            mode,
        };
        let pages = 16u64;
        let mem = RemoteMemory::connect(c.cluster(), ClientConfig::new(s, 1 << 20)).unwrap();
        let next = std::sync::atomic::AtomicU64::new(1);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let reads = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|sc| {
            for t in 0..3u64 {
                let (mem, next, stop) = (&mem, &next, &stop);
                sc.spawn(move || {
                    let mut page = [0u8; PAGE_SIZE];
                    let mut i = t;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let p = i % pages;
                        let v = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        versioned_page(&mut page, p, v);
                        mem.write_page(p * PAGE_SIZE as u64, &page).unwrap();
                        i += 3;
                    }
                });
            }
            for t in 0..3u64 {
                let (mem, stop, reads) = (&mem, &stop, &reads);
                sc.spawn(move || {
                    let mut page = [0u8; PAGE_SIZE];
                    let mut i = t;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let p = i % pages;
                        mem.read_page(p * PAGE_SIZE as u64, &mut page).unwrap();
                        check_versioned(&page, p);
                        reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        i += 5;
                    }
                });
            }
            std::thread::sleep(Duration::from_millis(700));
            if kill {
                let victim = mem.group_of(0).unwrap().nodes[3] as usize;
                c.kill(victim).unwrap();
            }
            std::thread::sleep(Duration::from_millis(700));
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        assert!(reads.load(std::sync::atomic::Ordering::Relaxed) > 100);
        eprintln!(
            "{mode:?}: {} reads, {} repeated for mixed versions",
            reads.load(std::sync::atomic::Ordering::Relaxed),
            mem.stats()
                .retries
                .load(std::sync::atomic::Ordering::Relaxed)
        );
    }
}

#[test]
fn placement_sees_other_clients_allocations_within_heartbeats() {
    // Two clients connect before either allocates; then one maps ranges. The other must learn
    // the nodes' new loads from its heartbeats, not keep the all-zero view it connected with
    // (or every client that started together would pick the same "emptiest" group).
    let c = common::cluster(24, common::SLAB, 16);
    let cfg = || hydramem::client::ClientConfig::new(common::HYDRA, 64 << 20);
    let a = hydramem::client::RemoteMemory::connect(c.cluster(), cfg()).unwrap();
    let b = hydramem::client::RemoteMemory::connect(c.cluster(), cfg()).unwrap();
    let page = [3u8; hydramem::PAGE_SIZE];
    let rb = a.layout().range_bytes();
    for r in 0..3 {
        a.write_page(r * rb, &page).unwrap();
    }
    let truth = || -> Vec<u64> {
        c.cluster()
            .nodes
            .iter()
            .map(|n| {
                hydramem::status::fetch(
                    n.addr,
                    &hydramem::rpc::Access::open(),
                    std::time::Duration::from_secs(2),
                )
                .unwrap()
                .slabs
                .len() as u64
            })
            .collect()
    };
    assert_eq!(truth().iter().sum::<u64>(), 30);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while b.placement_loads() != truth() {
        assert!(
            std::time::Instant::now() < deadline,
            "client b still assumes loads {:?}, the nodes hold {:?}",
            b.placement_loads(),
            truth()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
