//! Regeneration spoken to directly: a node rebuilds a slab by runs from sources chosen at
//! random among those named, and a source that fails mid-way is replaced by another.

mod common;

use common::Raw;
use hydramem::wire::{ClientId, Op, Regen, RegenSource, Status};
use hydramem_isal::Codec;

const SPLIT: usize = 512;
/// Pages written: more than one chunk of a source's reply (1 MiB of 512-byte splits).
const PAGES: u64 = 3000;

/// The k = 2 data splits of page `p` (the page's bytes are a function of `p`).
fn page(p: u64) -> [Vec<u8>; 2] {
    [0u8, 1].map(|j| {
        (0..SPLIT)
            .map(|i| (p as usize * 31 + i * 7 + j as usize * 101) as u8)
            .collect()
    })
}

#[test]
fn a_slab_is_rebuilt_by_runs_and_a_failing_source_is_replaced() {
    let c = common::cluster(5, 4 << 20, 4);
    let nodes = &c.cluster().nodes;
    let id = ClientId::random();
    let codec = Codec::new(2, 2).unwrap();
    // Splits 1, 2 and 3 of a 2 + 2 group on nodes 1, 2 and 3 (split 0 is the lost one);
    // pages written in runs of 100, page p at version p + 1 (page 7 never written).
    let mut raws: Vec<Raw> = (1..4).map(|n| Raw::connect(nodes[n].addr)).collect();
    let mut slabs = Vec::new();
    for r in &mut raws {
        r.hello(id);
        slabs.push(r.alloc(SPLIT as u32));
    }
    for first in (0..PAGES).step_by(100) {
        let pages: Vec<u64> = (first..first + 100).collect();
        let splits: Vec<[Vec<u8>; 4]> = pages
            .iter()
            .map(|&p| {
                let [d0, d1] = page(p);
                let (mut p0, mut p1) = (vec![0; SPLIT], vec![0; SPLIT]);
                codec.encode(&[&d0, &d1], &mut [&mut p0, &mut p1]).unwrap();
                [d0, d1, p0, p1]
            })
            .collect();
        for (j, r) in raws.iter_mut().enumerate() {
            let run: Vec<(u64, u32, &[u8])> = pages
                .iter()
                .zip(&splits)
                .map(|(&p, s)| (if p == 7 { 0 } else { p + 1 }, 0, &s[j + 1][..]))
                .collect();
            // Page 7 carries the invalid version 0: refused, so it stays unwritten.
            let at = first * SPLIT as u64;
            let got = r.write_run(slabs[j], at, SPLIT as u32, &run);
            assert!(got
                .iter()
                .all(|(st, _)| matches!(st, Status::Ok | Status::BadRequest)));
        }
    }
    // Three sources named for k = 2: the third names a slab that does not exist, so its node
    // refuses every run. The node picks two at random; whenever it picks the bad one, that
    // source fails at its first chunk and the other good one takes over. Rebuilding ten
    // times picks it with probability 1 - (1/3)^10; every rebuild must be exact.
    let source = |split: u8, n: usize, slab: u32| RegenSource {
        split,
        copy: false,
        slab,
        node: nodes[n].id,
    };
    let mut target = Raw::connect(nodes[0].addr);
    target.hello(id);
    for _ in 0..10 {
        let slab = target.alloc(SPLIT as u32);
        let req = Regen {
            client: id,
            k: 2,
            r: 2,
            target: 0,
            split_len: SPLIT as u32,
            slab,
            pages: PAGES,
            range: 0,
            checksums: false,
            sources: vec![
                source(1, 1, slabs[0]),
                source(2, 2, slabs[1]),
                source(3, 3, slabs[2] ^ 0x5555),
            ],
        };
        let mut body = Vec::new();
        req.put(&mut body);
        let (h, reply) = target.call(Op::Regen, &body);
        assert_eq!(h.status, Status::Ok);
        assert_eq!(reply, (PAGES - 1).to_le_bytes(), "pages rebuilt");
        for first in (0..PAGES).step_by(1000) {
            let n = 1000.min(PAGES - first) as u32;
            let (st, stamps, data) = target.read_run(slab, first * SPLIT as u64, SPLIT as u32, n);
            assert_eq!(st, Status::Ok);
            for (i, split) in data.chunks(SPLIT).enumerate() {
                let p = first + i as u64;
                if p == 7 {
                    assert_eq!(stamps[i].0, 0, "an unwritten page is not rebuilt");
                    continue;
                }
                assert_eq!(stamps[i].0, p + 1, "page {p} rebuilt with its version");
                assert_eq!(split, &page(p)[0][..], "page {p} rebuilt wrong");
            }
        }
        assert_eq!(
            target.call(Op::Free, &slab.to_le_bytes()).0.status,
            Status::Ok
        );
    }
}
