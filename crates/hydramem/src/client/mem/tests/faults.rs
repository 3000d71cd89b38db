//! The client under injected faults, over the in-memory transport: nodes down (up to r, and
//! one more), a straggler, lost requests and replies, corrupted replies, reordered replies and
//! a restart. Whatever happens, a read never returns bytes the [`Model`] does not allow.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{start, written, Model, PAGE};
use crate::client::{ClientError, IoError, RemoteMemory};
use crate::wire::PPM_ALL;

/// The nodes of the group holding page 0.
fn members(mem: &RemoteMemory) -> Vec<u16> {
    let g = mem.group_of(0).expect("page 0 is mapped");
    g.nodes[..mem.layout().width].to_vec()
}

/// Waits until `done` holds, for at most five seconds; whether it did.
fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    done()
}

#[test]
fn a_lost_single_copy_is_not_regenerated_over_and_over() {
    let pages = 8;
    let (mem, ctl, mut model) = written("single", 2, pages, |c| {
        c.op_timeout = Duration::from_millis(200)
    });
    ctl.node(members(&mem)[0]).down();
    // The write moves the copy to the other node; nothing survives to rebuild it from.
    model.write(&mem, 0, 1, false).unwrap();
    for _ in 0..3 {
        mem.maintain();
    }
    let r = mem.regen_stats();
    assert_eq!((r.started, r.failed), (0, 0), "{r:?}");
    model.read(&mem, 0, 1, false).unwrap();
}

#[test]
fn with_r_nodes_down_reads_and_writes_go_on() {
    for (scheme, nodes, r) in [("hydra-8+2-d1", 12, 2), ("rep2", 4, 1)] {
        let pages = 64;
        let (mem, ctl, mut model) = written(scheme, nodes, pages, |_| {});
        let lost = members(&mem)[..r].to_vec();
        for &node in &lost {
            ctl.node(node).down();
        }
        model.read_all(&mem, pages);
        // Writes move the lost splits to spare nodes and go on (the write path or the
        // maintenance thread, whichever sees the loss first, moves them).
        model.write(&mem, 0, pages / 2, true).unwrap();
        model
            .write(&mem, pages / 2 * PAGE, pages / 2, false)
            .unwrap();
        model.read_all(&mem, pages);
        let now = members(&mem);
        assert!(
            lost.iter().all(|n| !now.contains(n)),
            "{lost:?} still in {now:?}"
        );
    }
}

/// r + 1 nodes of a group down: reads fail with a clear error, never with wrong bytes, and
/// with one of them back every page reads back.
fn one_more_down(scheme: &str, nodes: usize, r: usize) {
    let pages = 32;
    let (mem, ctl, mut model) = written(scheme, nodes, pages, |c| {
        c.op_timeout = Duration::from_millis(100)
    });
    let lost = &members(&mem)[..=r];
    for &node in lost {
        ctl.node(node).down();
    }
    for batch in [false, true] {
        match model.read(&mem, 0, 4, batch) {
            Err(IoError::Unavailable { what: "read", .. }) => {}
            other => panic!("{scheme}: a read with r + 1 nodes down gave {other:?}"),
        }
    }
    // No spare node: a write cannot place its lost splits, and says so.
    match model.write(&mem, 0, 1, false) {
        Err(IoError::Map(ClientError::Placement { range: 0, .. })) => {}
        other => panic!("{scheme}: a write with r + 1 nodes down gave {other:?}"),
    }
    // One node comes back with its memory: the pages not written meanwhile read back exactly;
    // the one written may be inconsistent (its write landed on the nodes that were up: splits
    // of two versions, never mixed).
    ctl.node(lost[0]).up();
    model.read(&mem, PAGE, pages - 1, true).unwrap();
    // (Its repeated inconsistent reads may also run out of the 100 ms op timeout first, on a
    // loaded machine.)
    match model.read(&mem, 0, 1, false) {
        Ok(()) | Err(IoError::Inconsistent { .. } | IoError::Timeout { .. }) => {}
        Err(e) => panic!("{scheme}: {e}"),
    }
}

#[test]
fn hydra_with_r_plus_one_nodes_down_fails_clearly_and_never_returns_wrong_bytes() {
    one_more_down("hydra-8+2-d1", 10, 2);
}

#[test]
fn rep2_with_both_copies_down_fails_clearly_and_never_returns_wrong_bytes() {
    one_more_down("rep2", 2, 1);
}

#[test]
fn single_with_its_node_down_fails_clearly_and_never_returns_wrong_bytes() {
    one_more_down("single", 1, 0);
}

/// Writes `pages` pages of a client of `scheme` on 10 nodes, then makes two nodes stragglers
/// (every group has splits on them; their replies are held far longer than a test runs) and
/// runs `work`, which must not wait for them. Returns the client.
fn with_two_stragglers(
    scheme: &str,
    pages: u64,
    work: impl FnOnce(&RemoteMemory, &mut Model),
) -> Arc<RemoteMemory> {
    let (mem, ctl, mut model) = written(scheme, 10, pages, |_| {});
    for node in [3, 7] {
        ctl.node(node).delay(Duration::from_secs(60));
    }
    let started = Instant::now();
    work(&mem, &mut model);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{scheme}: the stragglers held the client up for {:?}",
        started.elapsed()
    );
    mem
}

#[test]
fn stragglers_do_not_hold_reads_up() {
    // A read asks k + 1 splits: late binding absorbs one straggler, the second makes it ask
    // the split it left out.
    let mem = with_two_stragglers("hydra-8+2-d1", 32, |mem, model| model.read_all(mem, 32));
    let reissued = mem.stats().reissued.load(Ordering::Relaxed);
    assert!(reissued > 0, "no read asked past the stragglers");
}

#[test]
fn lost_replies_and_requests_time_writes_out_and_reads_ask_again() {
    let pages = 16;
    let timeout = Duration::from_millis(100);
    let (mem, ctl, mut model) = written("hydra-8+2-d1", 10, pages, |c| c.op_timeout = timeout);
    // One node's acknowledgements lost: a write completes without it after
    // write_straggler_after, leaving that split behind (failure recovery may leave one).
    ctl.node(2).drop_replies(PPM_ALL);
    model.read_all(&mem, pages);
    model.write(&mem, 0, 1, false).unwrap();
    assert_eq!(mem.stats().left_behind.load(Ordering::Relaxed), 1);
    model.read(&mem, 0, 1, false).unwrap();
    // A second node losing requests: two missing acknowledgements are more than a write may
    // leave behind, so it times out.
    ctl.node(6).drop_requests(PPM_ALL);
    let started = Instant::now();
    match model.write(&mem, PAGE, 1, true) {
        Err(IoError::Timeout { what: "write", .. }) => {}
        other => panic!("a write with two acknowledgements lost gave {other:?}"),
    }
    assert!(started.elapsed() < 10 * timeout);
    // Reads ask past both.
    model.read_all(&mem, pages);
    for node in [2, 6] {
        ctl.node(node).clear();
    }
    model.write(&mem, 0, pages, true).unwrap();
    model.read_all(&mem, pages);
    // The split left behind reaches its node once it answers again.
    assert!(
        eventually(|| mem.lagging_splits() == 0),
        "the split left behind was never acknowledged"
    );
    assert!(ctl.counts(2).dropped_replies > 0 && ctl.counts(6).dropped_requests > 0);
}

#[test]
fn some_lost_frames_on_two_nodes_never_give_wrong_bytes() {
    let pages = 48;
    let (mem, ctl, mut model) = written("hydra-8+2-d1", 12, pages, |c| {
        c.op_timeout = Duration::from_millis(100)
    });
    for &node in &members(&mem)[..2] {
        ctl.node(node).drop_replies(PPM_ALL / 20);
        ctl.node(node).drop_requests(PPM_ALL / 20);
    }
    for round in 0..3 {
        // A write whose acknowledgement is lost times out (it may have landed or not).
        let _ = model.write(&mem, round * 10 * PAGE, 2, round % 2 == 0);
        // Reads ask past the lost frames: two lost splits leave the k a read needs.
        model.read(&mem, 0, pages, round % 2 == 1).unwrap();
    }
    let lost = ctl.total();
    assert!(lost.dropped_replies + lost.dropped_requests > 0);
}

#[test]
fn corrupted_replies_are_caught_by_checksums_and_read_around() {
    for (scheme, nodes) in [("hydra-8+2-d1", 10), ("rep2", 2)] {
        let pages = 32;
        let (mem, ctl, model) = written(scheme, nodes, pages, |_| {});
        let bad = members(&mem)[0];
        ctl.node(bad).corrupt_replies(PPM_ALL);
        model.read_all(&mem, pages);
        model.read_all(&mem, pages);
        let corrupt = mem.stats().corrupt.load(Ordering::Relaxed);
        assert!(ctl.counts(bad).corrupted > 0, "{scheme}: nothing corrupted");
        assert!(corrupt > 0, "{scheme}: corruption went unnoticed");
        assert_eq!(mem.corrupt_splits()[bad as usize], corrupt, "{scheme}");
    }
}

#[test]
fn reordered_replies_keep_every_page_right() {
    let pages = 64;
    let (mem, ctl) = start("hydra-8+2-d1", 12, pages, |_| {});
    for node in 0..12 {
        ctl.node(node).reorder(Duration::from_millis(2));
    }
    // Four writers, each on pages of its own, page by page and in batches.
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let mem = &mem;
            s.spawn(move || {
                let mut model = Model::default();
                let first = t * 16 * PAGE;
                for round in 0..4 {
                    model.write(mem, first, 16, round % 2 == 1).unwrap();
                    model.write(mem, first + round * PAGE, 2, false).unwrap();
                    model.read(mem, first, 16, round % 2 == 0).unwrap();
                }
            });
        }
    });
    assert!(ctl.total().reordered > 0, "no reply was reordered");
}

#[test]
fn a_restarted_node_loses_its_slabs_and_every_page_still_reads_back() {
    for (scheme, nodes) in [("hydra-8+2-d1", 10), ("rep2", 3)] {
        let pages = 32;
        let (mem, ctl, mut model) = written(scheme, nodes, pages, |_| {});
        let node = members(&mem)[0];
        let old = mem.group_of(0).unwrap();
        ctl.node(node).restart();
        // Before and after the client repairs the split the node lost.
        model.read_all(&mem, pages);
        let moved = eventually(|| {
            let g = mem.group_of(0).unwrap();
            (0..mem.layout().width)
                .any(|j| g.slabs[j] != old.slabs[j] || g.nodes[j] != old.nodes[j])
        });
        assert!(moved, "{scheme}: the lost split was never repaired");
        model.read_all(&mem, pages);
        model.write(&mem, 0, pages, true).unwrap();
        model.read_all(&mem, pages);
    }
}

#[test]
fn without_checksums_the_code_detects_or_corrects_corrupted_replies() {
    for (scheme, corrects) in [("hydra-8+2-d1-det", false), ("hydra-8+3-d1-cor", true)] {
        let pages = 32;
        let (mem, ctl, model) = written(scheme, 11, pages, |c| c.checksums = false);
        let bad = members(&mem)[0];
        ctl.node(bad).corrupt_replies(PPM_ALL);
        for batch in [false, true] {
            for i in 0..pages {
                match model.read(&mem, i * PAGE, 1, batch) {
                    Ok(()) => {}
                    Err(IoError::Corrupt { .. }) if !corrects => {}
                    Err(e) => panic!("{scheme}: page {i}: {e}"),
                }
            }
        }
        assert!(ctl.counts(bad).corrupted > 0, "{scheme}: nothing corrupted");
        assert!(
            mem.corrupt_splits()[bad as usize] > 0,
            "{scheme}: unnoticed"
        );
    }
}

#[test]
fn ec_only_writes_are_not_held_by_stragglers() {
    // An EC-only write needs k of its k + r acknowledgements.
    let mem = with_two_stragglers("hydra-8+2-d1-ec", 16, |mem, model| {
        model.write(mem, 0, 16, true).unwrap();
        model.write(mem, 0, 16, false).unwrap();
        model.read_all(mem, 16);
    });
    assert!(mem.stats().writes.load(Ordering::Relaxed) >= 48);
}
#[test]
fn readers_racing_a_writer_see_each_page_whole_and_never_older_than_acknowledged() {
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    let pages = 8;
    let (mem, ctl) = start("hydra-8+2-d1", 12, pages, |_| {});
    for node in 0..12 {
        ctl.node(node).reorder(Duration::from_millis(1));
    }
    // The writer rewrites pages 0..8 with stamps 1, 2, ...: `started` is the newest stamp a
    // write began with, `acked` the newest acknowledged.
    let (started, acked) = (AtomicU64::new(0), AtomicU64::new(0));
    let page = |stamp| super::content(0, stamp);
    std::thread::scope(|s| {
        s.spawn(|| {
            for stamp in 1..=40 {
                started.store(stamp, SeqCst);
                let all: Vec<_> = (0..pages)
                    .map(|i| super::content(i * PAGE, stamp))
                    .collect();
                if stamp % 2 == 0 {
                    mem.write_pages(0, &all).unwrap();
                } else {
                    mem.write_page(0, &page(stamp)).unwrap();
                    mem.write_pages(PAGE, &all[1..]).unwrap();
                }
                acked.store(stamp, SeqCst);
            }
        });
        for batch in [false, true] {
            let (mem, started, acked) = (&mem, &started, &acked);
            s.spawn(move || {
                let mut got = vec![[0u8; crate::PAGE_SIZE]; 2];
                while acked.load(SeqCst) < 40 {
                    let low = acked.load(SeqCst);
                    if batch {
                        mem.read_pages(0, &mut got).unwrap();
                    } else {
                        mem.read_page(0, &mut got[0]).unwrap();
                    }
                    let high = started.load(SeqCst);
                    assert!(
                        (low..=high).any(|s| got[0] == page(s)),
                        "page 0 is none of writes {low}..={high}"
                    );
                }
            });
        }
    });
    assert!(ctl.total().reordered > 0);
}

#[test]
fn a_single_copy_moved_off_a_lost_node_reads_back_what_was_written_since() {
    // One copy per page: a write to a range whose node is lost moves the copy to another node
    // (fresh, with no other copy to regenerate it from) and is acknowledged there.
    let pages = 16;
    let (mem, ctl, mut model) = written("single", 2, pages, |_| {});
    let lost = members(&mem)[0];
    ctl.node(lost).down();
    model.write(&mem, 0, 2, false).unwrap();
    // What was written since reads back; what was lost with the node is an error, not zeros.
    model.read(&mem, 0, 2, false).unwrap();
    model.read(&mem, 0, 2, true).unwrap();
    for batch in [false, true] {
        match model.read(&mem, 2 * PAGE, 1, batch) {
            Err(e @ IoError::Unavailable { what: "read", .. }) => {
                assert!(e.to_string().contains("not regenerated yet"), "{e}");
            }
            other => panic!("a page lost with its only copy gave {other:?}"),
        }
    }
}

#[test]
fn a_node_that_keeps_corrupting_is_evacuated_and_every_page_reads_back() {
    let pages = 64;
    let (mem, ctl, model) = written("hydra-8+2-d1", 12, pages, |c| c.error_window = 40);
    let bad = members(&mem)[0];
    ctl.node(bad).corrupt_replies(PPM_ALL);
    // Reads go around the corrupted splits, and count them against the node; above the
    // SlabRegenerationLimit the maintenance thread moves every split of ours off it.
    let evacuated = eventually(|| {
        model.read(&mem, 0, pages, true).unwrap();
        let on_bad = (0..pages).any(|p| {
            let g = mem.group_of(p * PAGE).unwrap();
            g.nodes[..mem.layout().width].contains(&bad)
        });
        mem.integrity()[bad as usize].avoided && !on_bad
    });
    assert!(evacuated, "the corrupting node kept our splits");
    model.read_all(&mem, pages);
    assert!(mem.stats().evacuated.load(Ordering::Relaxed) > 0);
}

#[test]
fn nodes_failing_and_restarting_under_io_never_give_wrong_bytes() {
    use rand::{Rng, SeedableRng};
    use std::sync::atomic::AtomicBool;
    let pages = 32;
    let (mem, ctl, mut model) = written("hydra-8+2-d1", 14, pages, |c| {
        c.op_timeout = Duration::from_millis(200)
    });
    let done = AtomicBool::new(false);
    let (mut reads, mut failed) = (0, 0);
    std::thread::scope(|s| {
        // At most r = 2 nodes are down at once; a node comes back with its memory or empty.
        s.spawn(|| {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
            let mut down: Vec<u16> = Vec::new();
            while !done.load(Ordering::SeqCst) {
                let node = rng.random_range(0..14u16);
                match rng.random_range(0..3) {
                    0 if down.len() < 2 && !down.contains(&node) => {
                        ctl.node(node).down();
                        down.push(node);
                    }
                    1 if !down.is_empty() => ctl.node(down.remove(0)).up(),
                    2 if !down.contains(&node) => ctl.node(node).restart(),
                    _ => {}
                }
                std::thread::sleep(Duration::from_millis(3));
            }
        });
        for round in 0..12 {
            let _ = model.write(&mem, 0, pages, round % 2 == 0);
            for batch in [true, false] {
                reads += 1;
                match model.read(&mem, 0, pages, batch) {
                    Ok(()) => {}
                    Err(IoError::Inconsistent { .. } | IoError::Unavailable { .. }) => failed += 1,
                    Err(e) => panic!("round {round}: {e}"),
                }
            }
        }
        done.store(true, Ordering::SeqCst);
    });
    assert!(failed < reads, "no read succeeded");
}
