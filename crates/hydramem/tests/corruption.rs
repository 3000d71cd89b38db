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
    let c = common::cluster_with(12, SLAB, 16, &["--allow-fault-injection"]);
    let mut cfg = ClientConfig::new(scheme, PAGES * PAGE_SIZE as u64);
    cfg.checksums = checksums;
    cfg.op_timeout = std::time::Duration::from_secs(3);
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
        hydramem::status::fetch(c.cluster().nodes[n].addr, Duration::from_secs(5)).unwrap()
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
    let (mut c, mem) = setup(true);
    let g = mem.group_of(0).unwrap();
    // Split 2 rots at rest, then the node of split 0 dies: its replacement is rebuilt from
    // the other nine, and the rotten split must not be one of the eight it decodes from.
    c.inject(g.nodes[2] as usize, Fault::CorruptSlab(g.slabs[2]))
        .unwrap();
    c.kill(g.nodes[0] as usize).unwrap();
    common::wait_regenerated(&mem, 1);
    let replacement = mem.group_of(0).unwrap().nodes[0] as usize;
    assert_ne!(replacement, g.nodes[0] as usize);
    c.inject(g.nodes[2] as usize, Fault::StopAnswering).unwrap();
    let (exact, wrong, errors) = read_all(&mem);
    assert_eq!((exact, wrong), (PAGES, 0), "{errors:?}");
    assert_eq!(mem.corrupt_splits()[replacement], 0);
}

/// Random corruption patterns on live nodes: on each case, some splits of the group are
/// corrupted by a random kind (after the write, at rest, on the wire, misdirected) at a random
/// rate. With checksums, within r corrupted splits every page reads back exact; beyond r a
/// read may fail, but it never returns wrong bytes.
#[test]
fn random_corruption_patterns_never_yield_wrong_bytes() {
    corruption_patterns(HYDRA, true, 2);
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
    corruption_patterns(scheme, false, 1);
}

/// Runs random patterns; `tolerated`: patterns of up to this many corrupted splits must read
/// exact with checksums, or exact or a detected corruption without.
fn corruption_patterns(scheme: Resilience, checksums: bool, tolerated: usize) {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let (c, mem) = setup_with(scheme, checksums);
    let g = mem.group_of(0).unwrap();
    let width = 10usize;
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
                    Err(IoError::Corrupt { .. }) if !checksums => {}
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
    for (j, fault) in [
        (2, Fault::CorruptReplies(Corruption::ALWAYS)),
        (9, Fault::MisdirectReads(Corruption::ALWAYS)),
        (5, Fault::CorruptSlab(g.slabs[5])),
    ] {
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
