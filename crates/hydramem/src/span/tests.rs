//! Span coding over the in-memory transport: pages read back after writes of every size and
//! overwrites, a healthy read is one request to one node, reads survive r lost nodes (decoded
//! from the rest of the row) and fail cleanly beyond, a slow node is hedged around, and
//! compaction brings the memory cost back to the code's while every page still reads back —
//! also with writers, readers and compaction running at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};

use super::{SpanStore, PAGE};
use crate::client::mem::{cluster, connect, MemControl, MemOptions};
use crate::client::{ClientConfig, IoError, Page};
use crate::nbd::PageStore;
use crate::PAGE_SIZE;

/// Slabs of 64 KiB: 16 rows per range.
const SLAB: u64 = 64 << 10;

fn start(scheme: &str, nodes: usize, pages: u64) -> (Arc<SpanStore>, MemControl) {
    start_waiting(scheme, nodes, pages, Duration::from_secs(5))
}

/// [`start`], with operations that give up after `op_timeout`.
fn start_waiting(
    scheme: &str,
    nodes: usize,
    pages: u64,
    op_timeout: Duration,
) -> (Arc<SpanStore>, MemControl) {
    let (store, ctl) = open(scheme, nodes, pages, |c| c.op_timeout = op_timeout);
    (store.expect("a fresh span store"), ctl)
}

/// Opens a span store over `nodes` in-memory nodes with the configuration `edit` makes.
fn open(
    scheme: &str,
    nodes: usize,
    pages: u64,
    edit: impl FnOnce(&mut ClientConfig),
) -> (Result<Arc<SpanStore>, IoError>, MemControl) {
    let mut config = ClientConfig::new(scheme.parse().expect("a scheme"), pages * PAGE);
    config.seed = Some(3);
    edit(&mut config);
    let options = MemOptions {
        slabs_per_node: 256,
        seed: 5,
        spare: 0,
    };
    let (mem, ctl) = connect(&cluster(nodes, SLAB), config, options).expect("connects");
    (SpanStore::new(mem), ctl)
}

/// A page whose bytes say which page and which write it is.
fn content(page: u64, stamp: u64) -> Page {
    let mut p = [0u8; PAGE_SIZE];
    let mut x =
        page.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ stamp.wrapping_mul(0xd6e8_feb8_6659_fd93);
    for chunk in p.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    p
}

fn read(s: &SpanStore, page: u64) -> Page {
    let mut p = [0u8; PAGE_SIZE];
    s.read_page(page * PAGE, &mut p).expect("the page reads");
    p
}

/// Writes pages `first..first + n` with `stamp` in one call.
fn write(s: &SpanStore, first: u64, n: u64, stamp: u64) {
    let pages: Vec<Page> = (first..first + n).map(|p| content(p, stamp)).collect();
    s.write_pages(first * PAGE, &pages)
        .expect("the pages write");
}

#[test]
fn pages_read_back_after_writes_of_every_size_and_overwrites() {
    let (s, _ctl) = start("span-4+2", 8, 256);
    assert_eq!(read(&s, 7), [0u8; PAGE_SIZE], "never written: zeros");
    assert!(s.known_zero(7 * PAGE));
    // 1, 3 (partial rows), 4 (a full row), 13 (three full and a partial one).
    write(&s, 0, 1, 1);
    write(&s, 10, 3, 1);
    write(&s, 20, 4, 1);
    write(&s, 40, 13, 1);
    write(&s, 11, 20, 2);
    let mut expect = std::collections::HashMap::new();
    let firsts = std::iter::once(0).chain(10..13).chain(20..24).chain(40..53);
    expect.extend(firsts.map(|p| (p, 1)));
    expect.extend((11..31).map(|p| (p, 2)));
    for (p, stamp) in &expect {
        assert_eq!(read(&s, *p), content(*p, *stamp), "page {p}");
    }
    assert!(!s.known_zero(11 * PAGE));
    // The same pages in one batched read (pages never written among them read as zeros).
    let mut pages = vec![[1u8; PAGE_SIZE]; 60];
    s.read_pages(0, &mut pages).expect("a batched read");
    for (p, got) in pages.iter().enumerate() {
        let want = expect
            .get(&(p as u64))
            .map_or([0; PAGE_SIZE], |st| content(p as u64, *st));
        assert_eq!(*got, want, "page {p} of the batch");
    }
    let st = s.stats();
    assert_eq!(st.live_pages, expect.len() as u64);
    assert!(st.partial_rows >= 2, "{st:?}");
    assert!(s.location(11 * PAGE).is_some_and(|l| l.contains("node")));
}

#[test]
fn a_healthy_read_is_one_request_to_one_node() {
    let (s, ctl) = start("span-8+2", 12, 512);
    write(&s, 0, 64, 1);
    // Eight full rows in one range: piece j of all of them is one run to piece j's node.
    let t = ctl.total();
    assert_eq!((t.runs, t.splits), (10, 80), "one run per node: {t:?}");
    let reissued = || {
        s.mem()
            .stats()
            .reissued
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = reissued();
    ctl.reset_counts();
    for p in 0..64 {
        assert_eq!(read(&s, p), content(p, 1));
    }
    let t = ctl.total();
    // A read asks more only when its piece is late (a hedge): on a loaded machine some are.
    let hedged = reissued() - before;
    assert_eq!(
        t.splits - hedged,
        64,
        "one piece per page, besides hedges: {t:?}"
    );
    // Read back together, the pages at one position of consecutive rows are one run.
    ctl.reset_counts();
    let before = reissued();
    let mut pages = vec![[0u8; PAGE_SIZE]; 64];
    s.read_pages(0, &mut pages).expect("a batched read");
    for (p, got) in pages.iter().enumerate() {
        assert_eq!(*got, content(p as u64, 1), "page {p} of the batch");
    }
    let t = ctl.total();
    let hedged = reissued() - before;
    assert_eq!(
        (t.runs - hedged, t.splits - hedged),
        (8, 64),
        "a run per data node, besides hedges: {t:?}"
    );
}

#[test]
fn reads_decode_around_r_lost_nodes_and_fail_cleanly_beyond() {
    let (s, ctl) = start("span-4+2", 8, 256);
    write(&s, 0, 64, 1);
    let group = s.mem().group_of(0).expect("row 0 is mapped");
    // Two of the first row's nodes, one holding page 0 and one holding page 1.
    ctl.node(group.nodes[0]).down();
    ctl.node(group.nodes[1]).down();
    for p in 0..64 {
        assert_eq!(read(&s, p), content(p, 1), "page {p} with two nodes down");
    }
    let mut pages = vec![[0u8; PAGE_SIZE]; 64];
    s.read_pages(0, &mut pages)
        .expect("a batched read with two nodes down");
    for (p, got) in pages.iter().enumerate() {
        assert_eq!(*got, content(p as u64, 1), "page {p} of the batch");
    }
    assert!(s.stats().reads_decoded > 0);
    ctl.node(group.nodes[2]).down();
    let mut buf = [7u8; PAGE_SIZE];
    let err = s
        .read_page(0, &mut buf)
        .expect_err("three of six pieces lost");
    assert!(
        err.to_string().contains("read of page 0x0"),
        "names the page: {err}"
    );
}

#[test]
fn a_slow_node_is_hedged_around() {
    let (s, ctl) = start("span-4+2", 8, 256);
    write(&s, 0, 4, 1);
    let group = s.mem().group_of(0).expect("mapped");
    ctl.node(group.nodes[0]).delay(Duration::from_millis(300));
    let t = std::time::Instant::now();
    assert_eq!(read(&s, 0), content(0, 1));
    assert!(s.stats().reads_decoded >= 1, "decoded instead of waiting");
    // Not a timing assertion on the read's speed: only that it did not wait for the node.
    assert!(t.elapsed() < Duration::from_millis(300));
}

#[test]
fn compaction_brings_the_cost_back_and_every_page_reads_back() {
    let pages = 512;
    let (s, _ctl) = start("span-8+2", 12, pages);
    write(&s, 0, pages, 0);
    let mut rng = rand::rngs::SmallRng::seed_from_u64(9);
    let mut stamp = vec![0u64; pages as usize];
    for round in 1..=2000u64 {
        let p = rng.random_range(0..pages);
        write(&s, p, 1, round);
        stamp[p as usize] = round;
    }
    s.compact().expect("compaction runs");
    let st = s.stats();
    assert!(st.compacted_pages > 0, "{st:?}");
    assert!(
        st.cost() <= 1.25 * super::compact::LOW + 1e-9,
        "after compaction: {:.3} remote bytes per byte ({st:?})",
        st.cost()
    );
    for p in 0..pages {
        assert_eq!(read(&s, p), content(p, stamp[p as usize]), "page {p}");
    }
    // The rows moved down and the top of the row space went back to the nodes.
    assert!(
        st.rows_touched <= st.rows_in_use + st.rows_in_use / 8 + super::compact::VICTIMS as u64,
        "rows ever used {} for {} in use",
        st.rows_touched,
        st.rows_in_use
    );
    // So did the holes below the top: the nodes hold the rows in use, and fewer free rows
    // than one discard's minimum — counted by the nodes themselves.
    assert!(
        st.rows_held < st.rows_in_use + super::compact::MIN_DISCARD,
        "{} rows held for {} in use",
        st.rows_held,
        st.rows_in_use
    );
    assert_eq!(
        held_by_nodes(&s),
        st.rows_held * st.width * PAGE,
        "the nodes hold every piece of the rows held, and nothing else ({st:?})"
    );
}

/// Forgotten pages (a pager's freed ones) stop being live at once: compaction,
/// running meanwhile, moves none of them, every other page reads back its last write, and a
/// forgotten page written again reads back that write.
#[test]
fn forgotten_pages_are_garbage_at_once_and_nothing_else_changes() {
    let pages = 512;
    let (s, _ctl) = start("span-8+2", 12, pages);
    write(&s, 0, pages, 0);
    let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
    let mut stamp: Vec<Option<u64>> = vec![Some(0); pages as usize];
    for round in 1..=3000u64 {
        let p = rng.random_range(0..pages);
        if rng.random_range(0..4) == 0 {
            s.forget(&[p * PAGE]);
            stamp[p as usize] = None;
        } else {
            write(&s, p, 1, round);
            stamp[p as usize] = Some(round);
        }
    }
    s.compact().expect("compaction runs");
    let st = s.stats();
    let live = stamp.iter().filter(|x| x.is_some()).count() as u64;
    assert_eq!(st.live_pages, live, "{st:?}");
    assert!(st.forgotten > 0 && st.compacted_pages > 0, "{st:?}");
    assert!(
        st.cost() <= 1.25 * super::compact::LOW + 1e-9,
        "after compaction: {:.3} remote bytes per byte ({st:?})",
        st.cost()
    );
    for p in 0..pages {
        match stamp[p as usize] {
            Some(x) => assert_eq!(read(&s, p), content(p, x), "page {p}"),
            None => assert!(s.known_zero(p * PAGE), "page {p} forgotten"),
        }
    }
}

#[test]
fn discarded_pages_read_as_zeros_unless_the_identity_is_kept() {
    let pages = 64;
    let (s, _ctl) = start("span-8+2", 12, pages);
    write(&s, 0, pages, 1);
    let gone: Vec<u64> = (8..40).map(|p| p * PAGE).collect();
    assert!(
        s.discard(&gone),
        "a store no successor reattaches to discards"
    );
    for p in 0..pages {
        if (8..40).contains(&p) {
            assert_eq!(read(&s, p), [0u8; PAGE_SIZE], "page {p} discarded");
            assert!(s.known_zero(p * PAGE));
        } else {
            assert_eq!(read(&s, p), content(p, 1), "page {p}");
        }
    }
    assert_eq!(s.stats().live_pages, pages - 32);
    // A kept identity's successor would find the copies again: nothing is discarded, the
    // caller writes zeros instead.
    let (kept, _ctl) = open("span-8+2", 12, pages, |c| c.kept = true);
    let kept = kept.expect("a fresh span store");
    write(&kept, 0, pages, 1);
    assert!(!kept.discard(&gone));
    assert_eq!(read(&kept, 8), content(8, 1));
    assert_eq!(kept.stats().live_pages, pages);
}

/// A store of 512 pages on 12 nodes that answer after 2 ms, written until its background
/// compaction runs a pass (single-page writes leave a partial row each).
fn compacting() -> (Arc<SpanStore>, MemControl) {
    let pages = 512;
    let (s, ctl) = start("span-8+2", 12, pages);
    write(&s, 0, pages, 0);
    for node in 0..12 {
        ctl.node(node).delay(Duration::from_millis(2));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut p = 0;
    while !s.core().compactor.busy() {
        assert!(
            std::time::Instant::now() < deadline,
            "no compaction started"
        );
        write(&s, p % pages, 1, 1 + p);
        p += 1;
    }
    (s, ctl)
}

#[test]
fn dropping_the_store_waits_for_the_compaction_pass_under_way() {
    let (s, _ctl) = compacting();
    // The pass under way holds the shared state; the drop ends it before returning, so a
    // successor with this identity never meets this client's rows changing under it.
    let core = Arc::downgrade(&s.core);
    drop(s);
    assert!(
        core.upgrade().is_none(),
        "the compaction thread still runs after the store was dropped"
    );
}

#[test]
fn stopping_compaction_while_handles_remain_waits_for_the_pass_under_way() {
    let (s, ctl) = compacting();
    // A front end closing before it frees the client's memory still holds the store.
    let other = s.clone();
    s.stop_compaction();
    assert!(!s.core().compactor.busy(), "a compaction pass still runs");
    assert_eq!(
        Arc::strong_count(&s.core),
        1,
        "the compaction thread still holds the store's state"
    );
    for node in 0..12 {
        ctl.node(node).delay(Duration::ZERO);
    }
    // Writes go on, compaction does not, and every page reads back.
    for n in 0..64 {
        write(&other, n, 1, 100_000 + n);
    }
    let compactions = s.stats().compactions;
    s.core().compactor.wake();
    for n in 0..64 {
        assert_eq!(read(&s, n), content(n, 100_000 + n));
    }
    assert_eq!(s.stats().compactions, compactions);
}

#[test]
fn free_rows_go_back_to_the_nodes_once_writes_pause() {
    let pages = 512;
    let (s, _ctl) = start("span-8+2", 12, pages);
    write(&s, 0, pages, 0);
    // The first half again: its 32 old rows are free, and still held by the nodes.
    write(&s, 0, pages / 2, 1);
    let before = s.stats();
    assert_eq!(before.rows_in_use, 64, "{before:?}");
    let now = std::time::Instant::now();
    assert!(
        !super::compact::give_back_if_idle(s.core(), now),
        "a write just happened: the free rows are where the next ones land"
    );
    assert!(super::compact::give_back_if_idle(
        s.core(),
        now + super::compact::IDLE
    ));
    let st = s.stats();
    assert_eq!(st.rows_held, st.rows_in_use, "{st:?}");
    assert_eq!(held_by_nodes(&s), st.rows_held * st.width * PAGE);
    // A write reuses given-back rows, and the nodes hold them again; the rows its pages left
    // are free and held. (64 pages: the block of 8 rows they were written in, see `place`.)
    write(&s, 0, 64, 2);
    let st = s.stats();
    assert_eq!(
        st.rows_touched, before.rows_touched,
        "given-back rows were reused"
    );
    assert_eq!(st.rows_held, st.rows_in_use + 8, "{st:?}");
    assert_eq!(held_by_nodes(&s), st.rows_held * st.width * PAGE);
    for p in 0..pages {
        let stamp = if p < 64 {
            2
        } else if p < pages / 2 {
            1
        } else {
            0
        };
        assert_eq!(read(&s, p), content(p, stamp), "page {p}");
    }
}

/// Overwrites a row's worth of random pages of `stamp`'s (one list write), as write number
/// `round` + 1, and records it in `stamp`. Panics if it is called 100,000 times: the cost a
/// caller waits for never came.
fn overwrite_a_row(
    s: &SpanStore,
    rng: &mut rand::rngs::SmallRng,
    stamp: &mut [u64],
    round: &mut u64,
) {
    *round += 1;
    assert!(
        *round < 100_000,
        "the cost never came where the test waits for it: {:?}",
        s.stats()
    );
    let r = *round;
    let pages = stamp.len() as u64;
    let list: Vec<(u64, Page)> = (0..8)
        .map(|_| rng.random_range(0..pages))
        .map(|p| (p, content(p, r)))
        .collect();
    let refs: Vec<(u64, &Page)> = list.iter().map(|(p, c)| (p * PAGE, c)).collect();
    s.write_list(&refs).expect("the pages write");
    for (p, _) in &list {
        stamp[*p as usize] = r;
    }
}

#[test]
fn while_writes_flow_compaction_stops_short_and_goes_deep_once_they_pause() {
    use super::compact::{BUSY_LOW, HIGH, IDLE, LOW};
    let pages = 8192;
    let (s, _ctl) = start("span-8+2", 12, pages);
    write(&s, 0, pages, 0);
    let base = 10.0 / 8.0;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(11);
    let mut stamp = vec![0u64; pages as usize];
    // Random overwrites, a row's worth at a time, until the rows in use cost more than the
    // threshold (the write that crosses it wakes the background thread).
    let mut round = 0;
    while s.stats().cost() <= base * HIGH {
        overwrite_a_row(&s, &mut rng, &mut stamp, &mut round);
    }
    let last_write = std::time::Instant::now();
    // Writes just happened: compaction stops at the busy target, short of the deep one.
    super::compact::run(s.core(), false).expect("compaction runs");
    let busy = s.stats();
    assert!(busy.compacted_pages > 0, "{busy:?}");
    assert!(
        busy.cost() <= base * BUSY_LOW + 1e-9,
        "compaction stopped above the busy target: {:.3} ({busy:?})",
        busy.cost()
    );
    // (Unless the machine stalled for a whole IDLE since the last write, which makes it deep.)
    if last_write.elapsed() < IDLE {
        assert!(
            busy.cost() > base * LOW,
            "compaction went to {:.3} while writes flowed: moves the writes did not need",
            busy.cost()
        );
    }
    // Once writes have paused, the background thread compacts down to the deep target.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while s.stats().cost() > base * LOW + 1e-9 {
        assert!(
            std::time::Instant::now() < deadline,
            "writes paused but the cost stayed at {:.3} ({:?})",
            s.stats().cost(),
            s.stats()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for p in 0..pages {
        assert_eq!(read(&s, p), content(p, stamp[p as usize]), "page {p}");
    }
}

#[test]
fn a_higher_max_cost_holds_more_garbage_before_compaction_starts() {
    let pages = 4096;
    let (s, _ctl) = open("span-8+2", 12, pages, |c| c.span_max_cost = Some(1.8));
    let s = s.expect("a span store with a ceiling of 1.8");
    write(&s, 0, pages, 0);
    let mut rng = rand::rngs::SmallRng::seed_from_u64(12);
    let mut stamp = vec![0u64; pages as usize];
    // Random overwrites, a row's worth at a time, past the default ceiling (1.45) and on
    // until the cost crosses 1.8 (the write that crosses it wakes the background thread).
    let mut round = 0;
    let mut passed_default = None;
    while s.stats().cost() <= 1.8 {
        overwrite_a_row(&s, &mut rng, &mut stamp, &mut round);
        if passed_default.is_none() && s.stats().cost() > 1.5 {
            passed_default = Some(s.stats());
        }
    }
    let at_1_5 = passed_default.expect("the cost went past 1.5 on its way to 1.8");
    assert_eq!(
        at_1_5.compacted_pages, 0,
        "compaction ran below the configured ceiling: {at_1_5:?}"
    );
    // Compaction, once it runs while writes flow, stops the default's fraction below it.
    let busy_low = super::compact::Thresholds::new(8, 10, Some(1.8))
        .expect("1.8 is a valid ceiling")
        .busy_low;
    assert!((busy_low - 1.8 * 1.12 / 1.16).abs() < 1e-9, "{busy_low}");
    super::compact::run(s.core(), false).expect("compaction runs");
    assert!(s.stats().compacted_pages > 0, "{:?}", s.stats());
    assert!(s.stats().cost() <= busy_low + 1e-9, "{:?}", s.stats());
    for p in 0..pages {
        assert_eq!(read(&s, p), content(p, stamp[p as usize]), "page {p}");
    }
}

#[test]
fn a_max_cost_without_room_above_the_compaction_target_is_refused() {
    for bad in [1.3, 0.5, f64::NAN, f64::INFINITY] {
        let (s, _ctl) = open("span-8+2", 12, 256, |c| c.span_max_cost = Some(bad));
        let e = s.err().expect("the ceiling is refused").to_string();
        assert!(
            e.contains("give at least 1.375") && e.contains("span-8+2"),
            "{bad}: {e}"
        );
    }
    let (s, _ctl) = open("span-8+2", 12, 256, |c| c.span_max_cost = Some(1.375));
    assert!(s.is_ok(), "the least ceiling is allowed");
    // Other schemes have no compaction: any ceiling is theirs to ignore.
    let rep2 = "rep2".parse().expect("a scheme");
    assert_eq!(
        super::compact::Thresholds::of_scheme(rep2, Some(0.5)).expect("ignored"),
        None
    );
    let d = super::compact::Thresholds::new(8, 10, None).expect("the default");
    assert!(
        (d.high - 1.45).abs() < 1e-9
            && (d.busy_low - 1.4).abs() < 1e-9
            && (d.low - 1.3).abs() < 1e-9,
        "{d:?}"
    );
}

/// The bytes every node says it holds for the store's client (STATS).
fn held_by_nodes(s: &SpanStore) -> u64 {
    let t = s.mem().transport();
    (0..t.nodes())
        .map(|n| {
            let reply = t
                .call(n as u16, crate::wire::Op::Stats, &[])
                .expect("STATS");
            let st = crate::wire::Stats::parse(&reply).expect("a STATS reply");
            st.slabs.iter().map(|x| x.held).sum::<u64>()
        })
        .sum()
}

#[test]
fn writers_readers_and_compaction_at_once_never_read_wrong_bytes() {
    let pages = 256u64;
    let (s, _ctl) = start("span-4+2", 8, pages);
    write(&s, 0, pages, 0);
    // Writer w owns the pages p with p % 2 == w, so each page's acknowledged writes are in
    // order: a read must return the last write acknowledged before it started, or a newer
    // one, and never bytes of no write of that page.
    let done = Arc::new(AtomicBool::new(false));
    let acked: Arc<Vec<std::sync::atomic::AtomicU64>> =
        Arc::new((0..pages).map(|_| Default::default()).collect());
    const WRITES: u64 = 400;
    let mut writers = Vec::new();
    for w in 0..2u64 {
        let (s, acked) = (s.clone(), acked.clone());
        writers.push(std::thread::spawn(move || {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(w);
            for stamp in 1..=WRITES {
                let n = rng.random_range(1..=3u64);
                let list: Vec<u64> = (0..n)
                    .map(|_| rng.random_range(0..pages / 2) * 2 + w)
                    .collect();
                let bytes: Vec<Page> = list.iter().map(|p| content(*p, stamp)).collect();
                let pairs: Vec<(u64, &Page)> =
                    list.iter().map(|p| p * PAGE).zip(bytes.iter()).collect();
                s.write_list(&pairs).expect("write");
                for p in &list {
                    acked[*p as usize].store(stamp, Ordering::SeqCst);
                }
            }
        }));
    }
    let compactor = {
        let (s, done) = (s.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                s.compact().expect("compaction");
                std::thread::yield_now();
            }
        })
    };
    let stamp_of = |p: u64, got: &Page| (0..=WRITES).find(|st| *got == content(p, *st));
    let reader = {
        let (s, done, acked) = (s.clone(), done.clone(), acked.clone());
        std::thread::spawn(move || {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(99);
            let mut reads = 0;
            while !done.load(Ordering::SeqCst) {
                let p = rng.random_range(0..pages);
                let before = acked[p as usize].load(Ordering::SeqCst);
                let got = read(&s, p);
                let st = stamp_of(p, &got);
                assert!(
                    st.is_some_and(|st| st >= before),
                    "page {p}: read write {st:?}, but write {before} was acknowledged before"
                );
                reads += 1;
            }
            reads
        })
    };
    for w in writers {
        w.join().expect("writer");
    }
    done.store(true, Ordering::SeqCst);
    compactor.join().expect("compactor");
    assert!(reader.join().expect("reader") > 0);
    // Moved by the explicit calls or by the store's own thread, which they take turns with.
    let st = s.stats();
    assert!(st.compacted_pages > 0, "compaction moved pages: {st:?}");
    for p in 0..pages {
        let got = read(&s, p);
        assert_eq!(
            stamp_of(p, &got),
            Some(acked[p as usize].load(Ordering::SeqCst)),
            "page {p}: the last acknowledged write"
        );
    }
}

#[test]
fn pages_written_together_fill_full_rows_column_by_column() {
    for k in 1..=10usize {
        for n in 1..=100usize {
            let full = n / k;
            let mut seen = std::collections::HashSet::new();
            let mut count = vec![0usize; n.div_ceil(k)];
            for i in 0..n {
                let (r, pos) = super::place(i, n, k);
                assert!(pos < k, "k {k} n {n} i {i}: position {pos}");
                assert!(
                    seen.insert((r, pos)),
                    "k {k} n {n}: two pages at {r}, {pos}"
                );
                count[r] += 1;
                // Consecutive pages of the full rows share a position (one node) on
                // consecutive rows, but where a column of a block ends; a row's pages lie
                // within one block of COLUMN rows.
                let (col, block) = (super::COLUMN, i / (super::COLUMN * k));
                let height = col.min(full.saturating_sub(block * col));
                if i + 1 < full * k && (i + 1 - block * col * k) % height != 0 {
                    assert_eq!(super::place(i + 1, n, k), (r + 1, pos), "k {k} n {n} i {i}");
                }
                if i < full * k {
                    assert_eq!(
                        r / col,
                        block,
                        "k {k} n {n} i {i}: row {r} outside its block"
                    );
                }
            }
            // The rows hold what take_rows takes for them: k each, the last the rest.
            let mut want = vec![k; full];
            if n % k > 0 {
                want.push(n % k);
            }
            assert_eq!(count, want, "k {k} n {n}");
        }
    }
}

#[test]
fn a_row_piece_newer_than_the_page_it_holds_is_read_around_not_chased() {
    // The remains of a write never acknowledged: a client with this identity stopped while
    // its row write had reached one node. Here the write reaches only the node of page 0's
    // piece; the others lose it, and the write fails.
    let (s, ctl) = start_waiting("span-4+2", 8, 256, Duration::from_millis(500));
    write(&s, 0, 160, 1);
    let loc = s.core().map.get(0).expect("page 0 is mapped");
    let group = s.mem().group_of(0).expect("row 0 is mapped");
    for &node in &group.nodes[1..] {
        ctl.node(node).drop_requests(1_000_000);
    }
    let newer = content(0, 2);
    let pages: [&Page; 1] = [&newer];
    let version = s.mem().take_version().expect("a version");
    assert!(version > loc.version);
    let row = crate::client::RowWrite {
        row: loc.row,
        pages: &pages,
        ids: &[0],
    };
    s.mem()
        .write_rows_at(&[row], Some(version))
        .expect_err("five of six pieces lost");
    for &node in &group.nodes[1..] {
        ctl.node(node).clear();
    }
    // Page 0 is still where the map says; its own piece carries the newer version. The read
    // must neither return those bytes nor chase a move that never happened.
    assert_eq!(s.core().map.get(0), Some(loc));
    assert_eq!(read(&s, 0), content(0, 1), "page 0 as acknowledged");
    for p in 1..4 {
        assert_eq!(read(&s, p), content(p, 1), "page {p}");
    }
    let st = s.stats();
    assert!(
        st.reads_decoded >= 1,
        "decoded around the stale piece: {st:?}"
    );
    assert!(
        st.moved_retries <= 2,
        "looked again once, not forever: {st:?}"
    );
    // Compaction too: the other pages of the rows of pages 0–95 rewritten elsewhere leave
    // each of those rows one page, and compaction empties them, page 0's included —
    // reading it around the stale piece.
    let again: Vec<(u64, Page)> = (1..96)
        .filter(|&p| s.core().map.get(p).is_some_and(|l| l.pos != loc.pos))
        .map(|p| (p * PAGE, content(p, 2)))
        .collect();
    let list: Vec<(u64, &Page)> = again.iter().map(|(a, b)| (*a, b)).collect();
    s.write_list(&list).expect("the pages write");
    // The background thread may compact first (the writes wake it); either way the pass
    // that empties these rows must move page 0.
    s.compact().expect("compaction runs");
    assert_ne!(
        s.core().map.get(0),
        Some(loc),
        "page 0 moved out of its sparse row"
    );
    assert_eq!(read(&s, 0), content(0, 1), "page 0 after compaction");
}

/// Batches in flight together never carry one page (group commit, `gather`), so the live map
/// is what a client that reattaches finds: the newest version of each page. Each round, four
/// writers write the same four pages at once (a full row each, which would otherwise go out
/// together), their replies held a random time so that batches in flight finish in any
/// order; the live map and a rebuilt one must agree after every round.
#[test]
fn concurrent_writes_of_one_page_leave_the_map_a_reattach_would_find() {
    let (s, ctl) = start("span-4+2", 8, 64);
    for n in 0..8 {
        ctl.node(n).reorder(Duration::from_millis(2));
    }
    s.stop_compaction();
    let core = s.core();
    let rows = s.mem().layout().space(s.mem().size()) / PAGE;
    const WRITERS: u64 = 4;
    for round in 0..20u64 {
        let start = Arc::new(std::sync::Barrier::new(WRITERS as usize));
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (s, start) = (s.clone(), start.clone());
                std::thread::spawn(move || {
                    let stamp = round * WRITERS + w;
                    let bytes: Vec<Page> = (0..4).map(|p| content(p, stamp)).collect();
                    start.wait();
                    s.write_pages(0, &bytes).expect("write");
                })
            })
            .collect();
        for w in writers {
            w.join().expect("writer");
        }
        let rebuilt = super::map::PageMap::new(core.map.pages());
        let (table, found) = super::reattach::rebuild(s.mem(), &rebuilt, rows).expect("rebuilds");
        assert_eq!(found, 4);
        for p in 0..4 {
            assert_eq!(
                rebuilt.get(p),
                core.map.get(p),
                "round {round}, page {p}: the live map and the nodes' newest copy disagree"
            );
        }
        assert_eq!(
            table.occupancy().rows_in_use,
            core.table.lock().occupancy().rows_in_use,
            "round {round}: the rows in use are those the nodes' newest copies are in"
        );
    }
}
