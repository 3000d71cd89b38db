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

fn check(s: &SpanStore, last: &HashMap<u64, u64>) {
    let mut got = [0u8; PAGE_SIZE];
    for (&p, &v) in last {
        s.read_page(p * PAGE, &mut got)
            .unwrap_or_else(|e| panic!("read of page {p}: {e}"));
        assert!(got == page(p, v), "page {p} does not hold write {v}");
    }
}

#[test]
fn span_rows_survive_a_kill_regenerate_and_then_r_more_losses() {
    let slab = 256 << 10; // 64 rows per range
    let mut c = common::cluster(13, slab, 64);
    let pages = 2048u64;
    let mem = RemoteMemory::connect(
        c.cluster(),
        ClientConfig::new(Resilience::Span { k: 8, r: 2 }, pages * PAGE),
    )
    .expect("connects");
    let s = SpanStore::new(mem.clone());
    let mut last = HashMap::new();
    // Full rows, then partial ones, then overwrites.
    for first in (0..1024).step_by(64) {
        write(&s, first, 64, 1, &mut last);
    }
    for first in (1024..1200).step_by(3) {
        write(&s, first, 3, 1, &mut last);
    }
    for i in 0..300u64 {
        write(&s, (i * 37) % 1200, 1 + i % 5, 2 + i, &mut last);
    }
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
