//! Span coding against live node processes: rows written in full and partial batches and
//! overwritten survive a killed node (reads decode around it, writes re-route its pieces), the
//! lost slab is regenerated from the rows' other pieces, and then r more original members can
//! die with every page still reading back its last acknowledged write.

mod common;

use std::collections::HashMap;

use hydramem::bench::fill_page;
use hydramem::client::{ClientConfig, Page, RemoteMemory, Resilience};
use hydramem::nbd::PageStore;
use hydramem::span::SpanStore;
use hydramem::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;

fn page(p: u64, v: u64) -> Page {
    let mut b = [0u8; PAGE_SIZE];
    fill_page(&mut b, 9, p, v);
    b
}

/// Writes pages `first..first + n` as version `v` in one call and records them.
fn write(s: &SpanStore, first: u64, n: u64, v: u64, last: &mut HashMap<u64, u64>) {
    let pages: Vec<Page> = (first..first + n).map(|p| page(p, v)).collect();
    s.write_pages(first * PAGE, &pages)
        .unwrap_or_else(|e| panic!("write of pages {first}..{}: {e}", first + n));
    for p in first..first + n {
        last.insert(p, v);
    }
}

/// Full rows, then partial ones, then overwrites, of pages 0..1200.
fn fill(s: &SpanStore, last: &mut HashMap<u64, u64>) {
    for first in (0..1024).step_by(64) {
        write(s, first, 64, 1, last);
    }
    for first in (1024..1200).step_by(3) {
        write(s, first, 3, 1, last);
    }
    for i in 0..300u64 {
        write(s, (i * 37) % 1200, 1 + i % 5, 2 + i, last);
    }
}

fn check(s: &SpanStore, last: &HashMap<u64, u64>) {
    let mut got = [0u8; PAGE_SIZE];
    for (&p, &v) in last {
        s.read_page(p * PAGE, &mut got)
            .unwrap_or_else(|e| panic!("read of page {p}: {e}"));
        assert!(got == page(p, v), "page {p} does not hold write {v}");
    }
}

/// A span 8+2 client of `pages` pages on `c`, and its store.
fn span_client(
    c: &hydramem::embedded::EmbeddedCluster,
    pages: u64,
) -> (std::sync::Arc<RemoteMemory>, std::sync::Arc<SpanStore>) {
    let mem = RemoteMemory::connect(
        c.cluster(),
        ClientConfig::new(Resilience::Span { k: 8, r: 2 }, pages * PAGE),
    )
    .expect("connects");
    let s = SpanStore::new(mem.clone()).expect("a fresh span store");
    (mem, s)
}

#[test]
fn span_rows_survive_a_kill_regenerate_and_then_r_more_losses() {
    let slab = 256 << 10; // 64 rows per range
    let mut c = common::cluster(13, slab, 64);
    let pages = 2048u64;
    let (mem, s) = span_client(&c, pages);
    let mut last = HashMap::new();
    fill(&s, &mut last);
    check(&s, &last);
    let g = mem.group_of(0).expect("row 0 is mapped");
    c.kill(g.nodes[3] as usize).unwrap();
    // Reads decode around the dead node; writes re-route its pieces.
    check(&s, &last);
    for i in 0..200u64 {
        write(&s, (i * 53) % 1200, 1 + i % 9, 1000 + i, &mut last);
    }
    common::wait_regenerated(&mem, 1);
    let g2 = mem.group_of(0).expect("mapped");
    assert!(!g2.nodes[..10].contains(&g.nodes[3]), "the lost slab moved");
    // Two more of the original members die: with the regenerated slab, 8 pieces remain.
    let others = common::original_members(&g, &g2, 10, 2);
    for n in &others {
        c.kill(*n as usize).unwrap();
    }
    check(&s, &last);
    let st = s.stats();
    assert!(
        st.reads_decoded > 0,
        "reads decoded around lost nodes: {st:?}"
    );
}

#[test]
fn span_refuses_the_page_calls_of_its_rows() {
    let c = common::cluster(10, 256 << 10, 8);
    let mem = RemoteMemory::connect(
        c.cluster(),
        ClientConfig::new(Resilience::Span { k: 8, r: 2 }, 64 * PAGE),
    )
    .expect("connects");
    let err = mem
        .write_page(0, &[1u8; PAGE_SIZE])
        .expect_err("a span client's own page calls are refused");
    assert!(err.to_string().contains("span store"), "{err}");
}

#[test]
fn a_span_client_that_reattaches_rebuilds_its_page_map_from_the_nodes() {
    let slab = 256 << 10; // 64 rows per range
    let mut c = common::cluster(13, slab, 64);
    let pages = 2048u64;
    let cfg = ClientConfig::new(Resilience::Span { k: 8, r: 2 }, pages * PAGE);
    let mut last = HashMap::new();
    let (g, g2) = {
        let mem = RemoteMemory::connect(c.cluster(), cfg.clone()).expect("connects");
        let s = SpanStore::new(mem.clone()).expect("a fresh span store");
        fill(&s, &mut last);
        s.compact().expect("compacts");
        // One member of the first range dies; its slab is regenerated elsewhere, tags and all.
        let g = mem.group_of(0).expect("row 0 is mapped");
        c.kill(g.nodes[3] as usize).unwrap();
        for i in 0..100u64 {
            write(&s, (i * 53) % 1200, 1 + i % 9, 1000 + i, &mut last);
        }
        common::wait_regenerated(&mem, 1);
        check(&s, &last);
        (g, mem.group_of(0).expect("mapped"))
    };
    // The client is gone. Two more original members die: every row of the first range is
    // left with k pieces, one of them regenerated.
    for n in common::original_members(&g, &g2, 10, 2) {
        c.kill(n as usize).unwrap();
    }
    let mem = RemoteMemory::connect(c.cluster(), cfg.clone()).expect("reconnects");
    let s = SpanStore::new(mem.clone()).expect("the page map is rebuilt");
    check(&s, &last);
    let st = s.stats();
    assert_eq!(st.live_pages, last.len() as u64, "{st:?}");
    assert!(
        st.reads_decoded > 0,
        "reads decoded around lost nodes: {st:?}"
    );
    // Writes after reattaching win over every older row of their pages, here and at the
    // next reattach; compaction moves pages of the rebuilt rows.
    // Writes race compactions: no compaction's copy of a page may outrank a write of it at
    // the next reattach.
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let mut mine = HashMap::new();
            for i in 0..300u64 {
                write(&s, (i * 71) % 1400, 1 + i % 7, 5000 + i, &mut mine);
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            mine
        });
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            s.compact().expect("compacts");
        }
        last.extend(writer.join().expect("the writer"));
    });
    check(&s, &last);
    drop(s);
    drop(mem);
    let mem = RemoteMemory::connect(c.cluster(), cfg.clone()).expect("reconnects");
    let s = SpanStore::new(mem).expect("the page map is rebuilt");
    check(&s, &last);
    assert_eq!(s.stats().live_pages, last.len() as u64);
    drop(s);
    // A smaller size than the pages held is refused, not silently cut.
    let mut small = ClientConfig::new(Resilience::Span { k: 8, r: 2 }, 1024 * PAGE);
    small.client_id = cfg.client_id;
    let mem = RemoteMemory::connect(c.cluster(), small).expect("the ranges fit");
    let err = SpanStore::new(mem)
        .err()
        .expect("pages beyond the size are refused");
    assert!(err.to_string().contains("beyond its size"), "{err}");
}

#[test]
fn a_drained_span_node_hands_its_pieces_over_while_rows_are_written() {
    let slab = 256 << 10; // 64 rows per range
    let args = ["--control-period", "100ms", "--prealloc", "0"];
    let mut c = common::cluster_with(13, slab, 64, &args);
    let pages = 2048u64;
    let (mem, s) = span_client(&c, pages);
    let mut last = HashMap::new();
    fill(&s, &mut last);
    let g = mem.group_of(0).expect("row 0 is mapped");
    let x = g.nodes[3];
    let ranges = pages * PAGE / mem.layout().range_bytes();
    let held_on_x = |mem: &RemoteMemory| {
        (0..ranges)
            .filter(|&r| {
                mem.group_of(r * mem.layout().range_bytes())
                    .is_some_and(|g| g.nodes[..10].contains(&x))
            })
            .count() as u64
    };
    let held = held_on_x(&mem);
    let addr = c.cluster().nodes[x as usize].addr.to_string();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (out, last) = std::thread::scope(|sc| {
        // Rows keep being written (and compacted) while the node hands its pieces over.
        let writer = sc.spawn(|| {
            let mut last = last;
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                write(&s, (i * 41) % 1200, 1 + i % 7, 10_000 + i, &mut last);
                i += 1;
            }
            last
        });
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hydramem"))
            .args(["node", "drain", &addr, "--timeout", "60s"])
            .output()
            .expect("hydramem node drain runs");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (out, writer.join().expect("the writer did not panic"))
    });
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("holds no slabs"),
        "drain failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    common::wait_regenerated(&mem, held);
    assert_eq!(
        held_on_x(&mem),
        0,
        "no range keeps a piece on the drained node"
    );
    check(&s, &last);
    // The drained node stops, and two more original members of range 0 die: every page still
    // reads, from the 8 pieces left of each row, among them the moved ones.
    c.kill(x as usize).unwrap();
    let g2 = mem.group_of(0).expect("mapped");
    for n in common::original_members(&g, &g2, 10, 2) {
        c.kill(n as usize).unwrap();
    }
    check(&s, &last);
}
