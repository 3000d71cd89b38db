//! Corruption injected on live node processes, met by per-split checksums: up to r corrupted
//! splits per page are read around to the exact bytes and the nodes that returned them are
//! named; beyond r a read fails with a clear error; without checksums the same corruption
//! reaches the caller (which is why they exist).

mod common;

use hydramem::bench::fill_page;
use hydramem::client::{ClientConfig, IoError, Mode, RemoteMemory, Resilience};
use hydramem::embedded::EmbeddedCluster;
use hydramem::wire::{Corruption, Fault};
use hydramem::PAGE_SIZE;

use common::{HYDRA, SLAB};

const PAGES: u64 = 64;

fn setup(checksums: bool) -> (EmbeddedCluster, std::sync::Arc<RemoteMemory>) {
    setup_with(HYDRA, checksums)
}

fn setup_with(
    scheme: Resilience,
    checksums: bool,
) -> (EmbeddedCluster, std::sync::Arc<RemoteMemory>) {
    setup_nodes(scheme, checksums, 12)
}

fn setup_nodes(
    scheme: Resilience,
    checksums: bool,
    nodes: usize,
) -> (EmbeddedCluster, std::sync::Arc<RemoteMemory>) {
    let c = common::cluster_with(nodes, SLAB, 16, &["--allow-fault-injection"]);
    let mut cfg = ClientConfig::new(scheme, PAGES * PAGE_SIZE as u64);
    cfg.checksums = checksums;
    cfg.op_timeout = std::time::Duration::from_secs(3);
    // These tests aim corruption at fixed slabs: the client must not move them away (the
    // limits have tests of their own below).
    cfg.slab_regeneration_limit = 1.0;
    let mem = RemoteMemory::connect(c.cluster(), cfg).unwrap();
    let mut page = [0u8; PAGE_SIZE];
    for p in 0..PAGES {
        fill_page(&mut page, 5, p, 1);
        mem.write_page(p * PAGE_SIZE as u64, &page).unwrap();
    }
    (c, mem)
}

/// Reads every page: how many came back exact, wrong, or as errors (with the last error).
fn read_all(mem: &RemoteMemory) -> (u64, u64, Vec<String>) {
    let (mut exact, mut wrong, mut errors) = (0, 0, Vec::new());
    let mut page = [0u8; PAGE_SIZE];
    let mut want = [0u8; PAGE_SIZE];
    for p in 0..PAGES {
        fill_page(&mut want, 5, p, 1);
        match mem.read_page(p * PAGE_SIZE as u64, &mut page) {
            Ok(()) if page == want => exact += 1,
            Ok(()) => wrong += 1,
            Err(e) => errors.push(e.to_string()),
        }
    }
    (exact, wrong, errors)
}

#[test]
fn checksums_read_around_up_to_r_corrupted_splits_and_name_the_nodes() {
    let (c, mem) = setup(true);
    let g = mem.group_of(0).unwrap();
    // A data split flipped on the wire, a parity split misdirected (right version, wrong page).
    let (wire, misdirect) = (g.nodes[1] as usize, g.nodes[8] as usize);
    c.inject(wire, Fault::CorruptReplies(Corruption::ALWAYS))
        .unwrap();
    c.inject(misdirect, Fault::MisdirectReads(Corruption::ALWAYS))
        .unwrap();
    let (exact, wrong, errors) = read_all(&mem);
    assert_eq!((exact, wrong), (PAGES, 0), "{errors:?}");
    let counts = mem.corrupt_splits();
    assert!(counts[wire] > 0 && counts[misdirect] > 0, "{counts:?}");
    let others: u64 = (0..counts.len())
        .filter(|n| ![wire, misdirect].contains(n))
        .map(|n| counts[n])
        .sum();
    assert_eq!(others, 0, "{counts:?}");
    // At rest: every written split of another data slab flipped for good.
    c.inject(wire, Fault::Clear).unwrap();
    c.inject(misdirect, Fault::Clear).unwrap();
    let rest = g.nodes[3] as usize;
    c.inject(rest, Fault::CorruptSlab(g.slabs[3])).unwrap();
    let before = mem.corrupt_splits()[rest];
    let (exact, wrong, errors) = read_all(&mem);
    assert_eq!((exact, wrong), (PAGES, 0), "{errors:?}");
    assert!(mem.corrupt_splits()[rest] > before);
}

#[test]
fn corrupted_splits_are_reported_to_the_node_that_returned_them() {
    use std::time::{Duration, Instant};
    let (c, mem) = setup(true);
    let g = mem.group_of(0).unwrap();
    let bad = g.nodes[1] as usize;
    let slab = g.slabs[1];
    c.inject(
        bad,
        Fault::CorruptReplies(Corruption {
            ppm: hydramem::wire::PPM_ALL,
            slab: Some(slab),
        }),
    )
    .unwrap();
    let (exact, wrong, errors) = read_all(&mem);
    assert_eq!((exact, wrong), (PAGES, 0), "{errors:?}");
    let found = mem.corrupt_splits()[bad];
    assert!(found > 0, "no read asked the corrupting node");
    let stats = |n: usize| {
        hydramem::status::fetch(
            c.cluster().nodes[n].addr,
            &hydramem::rpc::Access::open(),
            Duration::from_secs(5),
        )
        .unwrap()
    };
    // The maintenance thread reports within a round or two.
    let deadline = Instant::now() + Duration::from_secs(10);
    while stats(bad).corrupt_reported < found {
        assert!(
            Instant::now() < deadline,
            "the node never heard of its corrupted splits"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let s = stats(bad);
    assert_eq!(
        s.corrupt_reported, found,
        "reported more than the client found"
    );
    let per_slab =
        |s: &hydramem::wire::Stats, id| s.slabs.iter().find(|x| x.slab == id).map(|x| x.corrupt);
    assert_eq!(per_slab(&s, slab), Some(found));
    assert_eq!(s.slabs.iter().map(|x| x.corrupt).sum::<u64>(), found);
    for n in (0..c.cluster().nodes.len()).filter(|n| *n != bad) {
        let s = stats(n);
        assert_eq!(s.corrupt_reported, 0, "node {n}");
        assert!(s.slabs.iter().all(|x| x.corrupt == 0), "node {n}");
    }
    // The table shows it too.
    let text = hydramem::status::table(c.cluster(), &hydramem::status::collect(c.cluster()));
    assert!(
        text.contains(&format!("{found} corrupted splits reported by clients")),
        "{text}"
    );
}

#[test]
fn beyond_r_corrupted_splits_is_a_clear_error_never_wrong_bytes() {
    let (c, mem) = setup(true);
    let g = mem.group_of(0).unwrap();
    for j in [0, 4, 9] {
        c.inject(
            g.nodes[j] as usize,
            Fault::CorruptReplies(Corruption::ALWAYS),
        )
        .unwrap();
    }
    let (exact, wrong, errors) = read_all(&mem);
    assert_eq!((exact, wrong), (0, 0));
    assert!(errors[0].contains("failed its checksum"), "{}", errors[0]);
}

#[test]
fn without_checksums_the_same_corruption_reaches_the_caller() {
    let (c, mem) = setup(false);
    let g = mem.group_of(0).unwrap();
    c.inject(
        g.nodes[1] as usize,
        Fault::CorruptReplies(Corruption::ALWAYS),
    )
    .unwrap();
    let (_, wrong, _) = read_all(&mem);
    assert!(wrong > 0, "no corrupted split was ever used");
}

#[test]
fn regeneration_decodes_around_a_corrupted_source() {
    // The regenerating node decodes from k sources drawn at random among the nine survivors,
    // so one regeneration in nine leaves the rotten one out and has nothing to report: the
    // scenario runs again (on a fresh cluster) until the rotten source was drawn, at most
    // six times (all six missing it: about two in a million).
    for attempt in 1..=6 {
        if rebuild_around_a_rotten_source() {
            return;
        }
        eprintln!("attempt {attempt}: the rotten source was not drawn; again");
    }
    panic!("in six regenerations the rotten source never heard about its corrupted split");
}

/// Split 2 rots at rest, then the node of split 0 dies: its replacement is rebuilt from the
/// other nine, and every page reads back exact without the rotten node. Returns whether the
/// rotten node was told what the regeneration found (it is when it was a source).
fn rebuild_around_a_rotten_source() -> bool {
    let (mut c, mem) = setup(true);
    let g = mem.group_of(0).unwrap();
    c.inject(g.nodes[2] as usize, Fault::CorruptSlab(g.slabs[2]))
        .unwrap();
    c.kill(g.nodes[0] as usize).unwrap();
    common::wait_regenerated(&mem, 1);
    let replacement = mem.group_of(0).unwrap().nodes[0] as usize;
    assert_ne!(replacement, g.nodes[0] as usize);
    let rotten = hydramem::status::fetch(
        c.cluster().nodes[g.nodes[2] as usize].addr,
        &hydramem::rpc::Access::open(),
        std::time::Duration::from_secs(5),
    )
    .unwrap();
    c.inject(g.nodes[2] as usize, Fault::StopAnswering).unwrap();
    let (exact, wrong, errors) = read_all(&mem);
    assert_eq!((exact, wrong), (PAGES, 0), "{errors:?}");
    assert_eq!(mem.corrupt_splits()[replacement], 0);
    rotten.corrupt_reported > 0
}

/// Random corruption patterns on live nodes: on each case, some splits of the group are
/// corrupted by a random kind (after the write, at rest, on the wire, misdirected) at a random
/// rate. With checksums, within r corrupted splits every page reads back exact; beyond r a
/// read may fail, but it never returns wrong bytes.
#[test]
fn random_corruption_patterns_never_yield_wrong_bytes() {
    corruption_patterns(HYDRA, true, 2, true);
}

/// The paper's correction mode (8+3, Δ = 1: k + 2Δ + 1 = 11 splits): within Δ every read is
/// corrected to the exact bytes; beyond it a read may fail, never with wrong bytes.
#[test]
fn correction_mode_corrects_random_patterns_within_delta() {
    corruption_patterns(CORRECTION, false, 1, true);
}

/// The same patterns under the paper's detection mode (8+2, Δ = 1): within Δ a read is exact
/// or a corruption error; beyond Δ a read may fail otherwise; never wrong bytes.
#[test]
fn detection_mode_never_yields_wrong_bytes_under_random_patterns() {
    let scheme = Resilience::Hydra {
        k: 8,
        r: 2,
        delta: 1,
        mode: Mode::Detection,
    };
    corruption_patterns(scheme, false, 1, false);
}

/// One split corrupted on the wire, one misdirected, one flipped at rest (last: it stays).
fn three_corruptions(g: &hydramem::client::Group) -> [(usize, Fault); 3] {
    [
        (2, Fault::CorruptReplies(Corruption::ALWAYS)),
        (9, Fault::MisdirectReads(Corruption::ALWAYS)),
        (5, Fault::CorruptSlab(g.slabs[5])),
    ]
}

/// The paper's correction mode with one more parity split than it needs: 8+3, Δ = 1.
const CORRECTION: Resilience = Resilience::Hydra {
    k: 8,
    r: 3,
    delta: 1,
    mode: Mode::Correction,
};

/// Runs random patterns; `tolerated`: patterns of up to this many corrupted splits must read
/// exact when `exact` (checksums, correction), or exact or a detected corruption otherwise.
fn corruption_patterns(scheme: Resilience, checksums: bool, tolerated: usize, exact: bool) {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let (c, mem) = setup_with(scheme, checksums);
    let g = mem.group_of(0).unwrap();
    let width = mem.layout().width;
    let pattern = (
        proptest::collection::btree_map(0..width, (0u8..4, 1u32..=1_000_000), 1..=4),
        any::<u64>(),
    );
    let mut runner = TestRunner::new(Config {
        cases: 24,
        ..Config::default()
    });
    // Fn closure: counters in cells. Each case writes a version of its own.
    let case = std::cell::Cell::new(1u64);
    let (within, beyond) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    runner
        .run(&pattern, |(hits, seed)| {
            case.set(case.get() + 1);
            let case = case.get();
            let on = |j: usize, kind: u8, ppm: u32| {
                let slab = Some(g.slabs[j]);
                let f = match kind {
                    0 => Fault::CorruptWrites(Corruption { ppm, slab }),
                    1 => Fault::CorruptSlab(g.slabs[j]),
                    2 => Fault::CorruptReplies(Corruption { ppm, slab }),
                    _ => Fault::MisdirectReads(Corruption { ppm, slab }),
                };
                c.inject(g.nodes[j] as usize, f).unwrap();
            };
            for (&j, &(kind, ppm)) in &hits {
                if kind == 0 {
                    on(j, kind, ppm);
                }
            }
            let mut page = [0u8; PAGE_SIZE];
            for p in 0..PAGES {
                fill_page(&mut page, seed, p, case);
                mem.write_page(p * PAGE_SIZE as u64, &page).unwrap();
            }
            for (&j, &(kind, ppm)) in &hits {
                if kind != 0 {
                    on(j, kind, ppm);
                }
            }
            let mut want = [0u8; PAGE_SIZE];
            let (mut failed, mut wrong) = (Vec::new(), Vec::new());
            for p in 0..PAGES {
                fill_page(&mut want, seed, p, case);
                match mem.read_page(p * PAGE_SIZE as u64, &mut page) {
                    Ok(()) if page != want => wrong.push(p),
                    Ok(()) => {}
                    // Detection's answer within its guarantee.
                    Err(IoError::Corrupt { .. }) if !exact => {}
                    Err(e) => failed.push(e.to_string()),
                }
            }
            // Cleared before any verdict, so that a failing case leaves nothing behind for
            // the cases that shrink it.
            for j in hits.keys() {
                c.inject(g.nodes[*j] as usize, Fault::Clear).unwrap();
            }
            prop_assert!(wrong.is_empty(), "pages {:?} wrong under {:?}", wrong, hits);
            if hits.len() <= tolerated {
                within.set(within.get() + 1);
                prop_assert!(
                    failed.is_empty(),
                    "within the guarantee, under {:?}: {:?}",
                    hits,
                    failed
                );
            } else {
                beyond.set(beyond.get() + 1);
            }
            Ok(())
        })
        .unwrap();
    let (within, beyond) = (within.get(), beyond.get());
    assert!(
        within > 0 && beyond > 0,
        "{within} cases within r, {beyond} beyond"
    );
}

/// The paper's detection mode (k + Δ splits per read, decoded from k and re-encoded against
/// the rest): with Δ = 1 and one node corrupting every reply, each read that includes that
/// node's split fails with a corruption error and the others are exact; nothing wrong is
/// returned. Without corruption every page reads exact.
#[test]
fn detection_mode_reports_up_to_delta_corrupted_splits_and_never_returns_them() {
    let scheme = Resilience::Hydra {
        k: 8,
        r: 2,
        delta: 1,
        mode: Mode::Detection,
    };
    let (c, mem) = setup_with(scheme, false);
    let (exact, wrong, errors) = read_all(&mem);
    assert_eq!((exact, wrong), (PAGES, 0), "{errors:?}");
    let g = mem.group_of(0).unwrap();
    for (j, fault) in three_corruptions(&g) {
        let node = g.nodes[j] as usize;
        c.inject(node, fault).unwrap();
        let mut page = [0u8; PAGE_SIZE];
        let mut want = [0u8; PAGE_SIZE];
        let (mut detected, mut exact) = (0, 0);
        for p in 0..PAGES {
            fill_page(&mut want, 5, p, 1);
            match mem.read_page(p * PAGE_SIZE as u64, &mut page) {
                Ok(()) => {
                    assert!(page == want, "split {j}: page {p} read back wrong");
                    exact += 1;
                }
                Err(IoError::Corrupt { nodes, .. }) => {
                    assert!(nodes.contains(&format!("node {node} ")), "{nodes}");
                    detected += 1;
                }
                Err(e) => panic!("split {j}: page {p}: {e}"),
            }
        }
        assert!(
            detected > 0,
            "split {j}: no corruption detected ({exact} exact)"
        );
        c.inject(node, Fault::Clear).unwrap();
        if j == 5 {
            break; // at rest: stays until rewritten
        }
        let (exact, wrong, errors) = read_all(&mem);
        assert_eq!(
            (exact, wrong),
            (PAGES, 0),
            "after clearing split {j}: {errors:?}"
        );
    }
}

/// Correction mode against one node that corrupts every reply, one that misdirects every read
/// and one whose stored slab is flipped: each read that meets it asks Δ + 1 more splits,
/// outvotes the corrupted one and returns the exact page; the corrupted splits are charged to
/// the node that returned them, and to no other.
#[test]
fn correction_mode_outvotes_a_corrupted_split_and_names_its_node() {
    let (c, mem) = setup_with(CORRECTION, false);
    let g = mem.group_of(0).unwrap();
    for (j, fault) in three_corruptions(&g) {
        let node = g.nodes[j] as usize;
        let before = mem.corrupt_splits();
        let corrected = mem
            .stats()
            .corrected
            .load(std::sync::atomic::Ordering::Relaxed);
        c.inject(node, fault).unwrap();
        let (exact, wrong, errors) = read_all(&mem);
        assert_eq!((exact, wrong), (PAGES, 0), "split {j}: {errors:?}");
        let after = mem.corrupt_splits();
        assert!(after[node] > before[node], "split {j}: {after:?}");
        for n in (0..after.len()).filter(|n| *n != node) {
            assert_eq!(
                after[n], before[n],
                "split {j}: node {n} charged: {after:?}"
            );
        }
        assert!(
            mem.stats()
                .corrected
                .load(std::sync::atomic::Ordering::Relaxed)
                > corrected
        );
        c.inject(node, Fault::Clear).unwrap();
        if j == 5 {
            // At rest the flips stay until the pages are rewritten: still corrected.
            let (exact, wrong, errors) = read_all(&mem);
            assert_eq!((exact, wrong), (PAGES, 0), "{errors:?}");
        }
    }
}

/// A random workload of single-writer pages (each thread owns the pages ≡ its index modulo the
/// thread count), checking every read byte for byte against the last acknowledged write, as
/// the fault-run harness does. Runs until `until` says stop; returns (reads, wrong, errors).
fn workload(
    mem: &RemoteMemory,
    pages: u64,
    seed: u64,
    until: impl Fn() -> bool + Sync,
) -> (u64, u64, Vec<String>) {
    use rand::{Rng, SeedableRng};
    const THREADS: u64 = 2;
    let results: Vec<(u64, u64, Vec<String>)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let until = &until;
                s.spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(seed + t);
                    let mut last = std::collections::HashMap::<u64, u64>::new();
                    let (mut reads, mut wrong, mut errors) = (0, 0, Vec::new());
                    let mut page = [0u8; PAGE_SIZE];
                    let mut want = [0u8; PAGE_SIZE];
                    let mut v = 1 + (t << 32);
                    while !until() {
                        let p = rng.random_range(0..pages / THREADS) * THREADS + t;
                        let addr = p * PAGE_SIZE as u64;
                        if rng.random_bool(0.4) || !last.contains_key(&p) {
                            v += 1;
                            fill_page(&mut page, seed, p, v);
                            match mem.write_page(addr, &page) {
                                Ok(()) => {
                                    last.insert(p, v);
                                }
                                Err(e) => errors.push(format!("write {p}: {e}")),
                            }
                        } else {
                            reads += 1;
                            fill_page(&mut want, seed, p, last[&p]);
                            match mem.read_page(addr, &mut page) {
                                Ok(()) if page == want => {}
                                Ok(()) => wrong += 1,
                                Err(e) => errors.push(format!("read {p}: {e}")),
                            }
                        }
                    }
                    // Every acknowledged write reads back exactly at the end.
                    for (&p, &v) in &last {
                        fill_page(&mut want, seed, p, v);
                        reads += 1;
                        match mem.read_page(p * PAGE_SIZE as u64, &mut page) {
                            Ok(()) if page == want => {}
                            Ok(()) => wrong += 1,
                            Err(e) => errors.push(format!("final read {p}: {e}")),
                        }
                    }
                    (reads, wrong, errors)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    results
        .into_iter()
        .fold((0, 0, Vec::new()), |(r, w, mut e), (r2, w2, e2)| {
            e.extend(e2);
            (r + r2, w + w2, e)
        })
}

/// A client with small accounting windows, over enough nodes that a corrupting one can be
/// left out of every group; three address ranges.
fn limits_setup(
    scheme: Resilience,
    checksums: bool,
    ecl: f64,
    srl: f64,
) -> (EmbeddedCluster, std::sync::Arc<RemoteMemory>, u64) {
    let c = common::cluster_with(14, SLAB, 16, &["--allow-fault-injection"]);
    let pages_per_range = SLAB / 512;
    let pages = 3 * pages_per_range;
    let mut cfg = ClientConfig::new(scheme, pages * PAGE_SIZE as u64);
    cfg.checksums = checksums;
    cfg.op_timeout = std::time::Duration::from_secs(5);
    cfg.error_window = 100;
    cfg.error_correction_limit = ecl;
    cfg.slab_regeneration_limit = srl;
    let mem = RemoteMemory::connect(c.cluster(), cfg).unwrap();
    (c, mem, pages)
}

/// The node holding most of the client's splits (so it is in every range's group).
fn busiest_node(mem: &RemoteMemory, pages: u64) -> usize {
    let mut count = std::collections::HashMap::<u16, usize>::new();
    let ranges = pages * PAGE_SIZE as u64 / mem.layout().range_bytes();
    for r in 0..ranges {
        let g = mem.group_of(r * mem.layout().range_bytes()).unwrap();
        for &n in &g.nodes[..mem.layout().width] {
            *count.entry(n).or_default() += 1;
        }
    }
    *count.iter().max_by_key(|(_, c)| **c).unwrap().0 as usize
}

/// Above the ErrorCorrectionLimit (and below the SlabRegenerationLimit), reads that involve
/// the corrupting node start with all k + 2Δ + 1 splits, every page stays exact, and once the
/// node behaves again a window later reads go back to k + Δ.
#[test]
fn error_correction_limit_starts_reads_wide_while_a_node_corrupts() {
    let (c, mem, pages) = limits_setup(CORRECTION, false, 0.01, 1.0);
    let stats = mem.stats();
    let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let t0 = std::time::Instant::now();
    let warm = workload(&mem, pages, 1, || t0.elapsed().as_millis() > 300);
    assert_eq!((warm.1, warm.2.len()), (0, 0), "{:?}", warm.2);
    let bad = busiest_node(&mem, pages);
    c.inject(
        bad,
        Fault::CorruptReplies(Corruption {
            ppm: 200_000,
            slab: None,
        }),
    )
    .unwrap();
    let t0 = std::time::Instant::now();
    let (reads, wrong, errors) = workload(&mem, pages, 2, || {
        mem.integrity()[bad].suspect && load(&stats.wide_reads) > 200 || t0.elapsed().as_secs() > 20
    });
    assert_eq!((wrong, errors.len()), (0, 0), "{errors:?}");
    let health = mem.integrity();
    assert!(health[bad].suspect, "{health:?} after {reads} reads");
    assert!(load(&stats.wide_reads) > 0 && load(&stats.corrected) > 0);
    assert!(!health[bad].avoided, "below the slab-regeneration limit");
    for (n, h) in health.iter().enumerate().filter(|(n, _)| *n != bad) {
        assert!(!h.suspect && h.corrupt_splits == 0, "node {n}: {h:?}");
    }
    c.inject(bad, Fault::Clear).unwrap();
    let t0 = std::time::Instant::now();
    let (_, wrong, errors) = workload(&mem, pages, 3, || {
        !mem.integrity()[bad].suspect || t0.elapsed().as_secs() > 20
    });
    assert_eq!((wrong, errors.len()), (0, 0), "{errors:?}");
    assert!(
        !mem.integrity()[bad].suspect,
        "a clean window clears the suspicion"
    );
}

/// Above the SlabRegenerationLimit the client regenerates its slabs on the corrupting node
/// elsewhere (never from that node) and places nothing new there: afterwards no group holds
/// it, every acknowledged write reads back exactly while it still corrupts, and ranges mapped
/// later avoid it. Run with checksums (failure-recovery 8+2) and with correction mode.
#[test]
fn slab_regeneration_limit_moves_slabs_off_a_corrupting_node_and_avoids_it() {
    for (scheme, checksums) in [(HYDRA, true), (CORRECTION, false)] {
        let (c, mem, pages) = limits_setup(scheme, checksums, 0.01, 0.05);
        // Map two of the three ranges now, the third after the node is avoided.
        let mapped = 2 * (pages / 3);
        let t0 = std::time::Instant::now();
        let warm = workload(&mem, mapped, 1, || t0.elapsed().as_millis() > 300);
        assert_eq!((warm.1, warm.2.len()), (0, 0), "{:?}", warm.2);
        let bad = busiest_node(&mem, mapped);
        c.inject(bad, Fault::CorruptReplies(Corruption::ALWAYS))
            .unwrap();
        let holds = |mem: &RemoteMemory, ranges: u64| {
            (0..ranges).any(|r| {
                let g = mem.group_of(r * mem.layout().range_bytes()).unwrap();
                g.nodes[..mem.layout().width].contains(&(bad as u16))
            })
        };
        let t0 = std::time::Instant::now();
        let (_, wrong, errors) = workload(&mem, mapped, 2, || {
            (mem.integrity()[bad].avoided && !holds(&mem, 2)) || t0.elapsed().as_secs() > 30
        });
        assert_eq!((wrong, errors.len()), (0, 0), "{scheme:?}: {errors:?}");
        assert!(
            mem.integrity()[bad].avoided,
            "{scheme:?}: {:?}",
            mem.integrity()
        );
        assert!(
            !holds(&mem, 2),
            "{scheme:?}: a group still holds node {bad}"
        );
        assert!(
            mem.stats()
                .evacuated
                .load(std::sync::atomic::Ordering::Relaxed)
                > 0
        );
        // The whole address space, including a range mapped only now, reads exact and avoids
        // the node (which still corrupts everything it returns).
        let t0 = std::time::Instant::now();
        let (_, wrong, errors) = workload(&mem, pages, 3, || t0.elapsed().as_millis() > 500);
        assert_eq!((wrong, errors.len()), (0, 0), "{scheme:?}: {errors:?}");
        assert!(
            !holds(&mem, 3),
            "{scheme:?}: the new range was placed on node {bad}"
        );
        drop(c);
    }
}

/// Both corruption modes recover from failures as failure recovery does: writes re-route the
/// splits of dead nodes and complete, the lost splits are regenerated, and every page reads
/// back exactly, during (where the mode can still check, or checksums verify) and after.
#[test]
fn corruption_modes_recover_from_failures_like_failure_recovery() {
    let detection = Resilience::Hydra {
        k: 8,
        r: 1,
        delta: 1,
        mode: Mode::Detection,
    };
    // (scheme, checksums, nodes to kill, reads exact while degraded)
    for (scheme, checksums, kill, during) in [
        (CORRECTION, false, 2, true),
        (detection, true, 1, true),
        (detection, false, 1, false),
    ] {
        // Room for a replacement of every killed node outside the group.
        let (mut c, mem) = setup_nodes(scheme, checksums, 12 + kill);
        let g = mem.group_of(0).unwrap();
        for j in 0..kill {
            c.kill(g.nodes[3 * j + 1] as usize).unwrap();
        }
        // The pages written before the failure, while their lost splits are regenerated.
        if during {
            let (exact, wrong, errors) = read_all(&mem);
            assert_eq!(
                (exact, wrong),
                (PAGES, 0),
                "{scheme:?} degraded: {errors:?}"
            );
        }
        // Writes complete, re-routed around the dead nodes; then everything is whole again.
        let mut page = [0u8; PAGE_SIZE];
        for p in 0..PAGES / 2 {
            fill_page(&mut page, 5, p, 1);
            mem.write_page(p * PAGE_SIZE as u64, &page)
                .unwrap_or_else(|e| panic!("{scheme:?}: write {p}: {e}"));
        }
        if kill > 1 {
            common::wait_regenerated_with_retries(&mem, kill as u64);
        } else {
            common::wait_regenerated(&mem, kill as u64);
        }
        let (exact, wrong, errors) = read_all(&mem);
        assert_eq!(
            (exact, wrong),
            (PAGES, 0),
            "{scheme:?} regenerated: {errors:?}"
        );
    }
}
