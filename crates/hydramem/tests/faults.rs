//! Injected faults on live node processes: refused unless allowed, and each one met by the
//! client the way the data path promises (no wrong bytes, reads past stalled or lost nodes,
//! placement around nodes that refuse slabs).

mod common;

use std::time::{Duration, Instant};

use hydramem::bench::fill_page;
use hydramem::client::{ClientConfig, RemoteMemory};
use hydramem::wire::{Fault, Status};
use hydramem::PAGE_SIZE;

use common::{HYDRA, SLAB};

fn faulty(nodes: usize) -> hydramem::embedded::EmbeddedCluster {
    common::cluster_with(nodes, SLAB, 16, &["--allow-fault-injection"])
}

fn client(c: &hydramem::embedded::EmbeddedCluster, pages: u64) -> std::sync::Arc<RemoteMemory> {
    let mut cfg = ClientConfig::new(HYDRA, pages * PAGE_SIZE as u64);
    cfg.straggler_after = Duration::from_millis(2);
    RemoteMemory::connect(c.cluster(), cfg).unwrap()
}

fn write_all(mem: &RemoteMemory, pages: u64, version: u64) {
    let mut page = [0u8; PAGE_SIZE];
    for p in 0..pages {
        fill_page(&mut page, 11, p, version);
        mem.write_page(p * PAGE_SIZE as u64, &page).unwrap();
    }
}

fn check_all(mem: &RemoteMemory, pages: u64, version: u64) {
    let mut page = [0u8; PAGE_SIZE];
    let mut want = [0u8; PAGE_SIZE];
    for p in 0..pages {
        mem.read_page(p * PAGE_SIZE as u64, &mut page)
            .unwrap_or_else(|e| panic!("page {p}: {e}"));
        fill_page(&mut want, 11, p, version);
        assert!(page == want, "page {p} read back wrong");
    }
}

#[test]
fn faults_are_refused_unless_allowed() {
    let c = common::cluster(1, SLAB, 4);
    let e = c.inject(0, Fault::Crash).unwrap_err();
    assert_eq!(e.refused(), Some(Status::Forbidden), "{e}");
    assert!(e.to_string().contains("--allow-fault-injection"), "{e}");
    // The node is still alive and serving.
    assert!(hydramem::status::fetch(
        c.cluster().nodes[0].addr,
        &hydramem::rpc::Access::open(),
        Duration::from_secs(2)
    )
    .is_ok());
}

#[test]
fn stalled_and_slow_nodes_do_not_hold_reads() {
    let c = faulty(12);
    let mem = client(&c, 256);
    write_all(&mem, 256, 1);
    let g = mem.group_of(0).unwrap();
    let (stalled, slow) = (g.nodes[2] as usize, g.nodes[7] as usize);
    c.inject(stalled, Fault::StopAnswering).unwrap();
    c.inject(slow, Fault::DelayReplies(20_000)).unwrap();
    check_all(&mem, 256, 1);
    assert!(
        mem.stats()
            .reissued
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
    // Cleared, the stalled node answers again: a write needing all 10 splits goes through.
    c.inject(stalled, Fault::Clear).unwrap();
    c.inject(slow, Fault::Clear).unwrap();
    write_all(&mem, 16, 2);
    check_all(&mem, 16, 2);
}

#[test]
fn dropped_connections_mark_the_node_down_and_reads_go_on() {
    let c = faulty(12);
    let mem = client(&c, 128);
    write_all(&mem, 128, 3);
    let victim = mem.group_of(0).unwrap().nodes[4];
    c.inject(victim as usize, Fault::DropConnections).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    // Reads keep working while the loss is noticed, and after.
    while mem.transport().is_up(victim) {
        check_all(&mem, 8, 3);
        assert!(
            Instant::now() < deadline,
            "client never noticed the dropped connection"
        );
    }
    check_all(&mem, 128, 3);
}

#[test]
fn nodes_refusing_slabs_are_placed_around() {
    let c = faulty(12);
    c.inject(0, Fault::RefuseAlloc).unwrap();
    c.inject(1, Fault::RefuseAlloc).unwrap();
    let range = 8 * SLAB;
    let mem = client(&c, 2 * range / PAGE_SIZE as u64);
    mem.write_page(0, &[1u8; PAGE_SIZE]).unwrap();
    let g = mem.group_of(0).unwrap();
    assert!(
        !g.nodes[..10].contains(&0) && !g.nodes[..10].contains(&1),
        "{:?}",
        &g.nodes[..10]
    );
    // A third refusing node leaves 9 of the 10 a range needs: a clear capacity error.
    c.inject(2, Fault::RefuseAlloc).unwrap();
    let e = mem
        .write_page(range, &[2u8; PAGE_SIZE])
        .unwrap_err()
        .to_string();
    assert!(e.contains("out of capacity") && e.contains("node 2"), "{e}");
}

#[test]
fn a_crashed_node_is_survived() {
    let mut c = faulty(10);
    let mem = client(&c, 64);
    write_all(&mem, 64, 4);
    c.inject(3, Fault::Crash).unwrap_err(); // the connection dies with the process
    let deadline = Instant::now() + Duration::from_secs(5);
    while c.try_wait_any().is_none() {
        assert!(Instant::now() < deadline, "node 3 did not crash");
        std::thread::sleep(Duration::from_millis(20));
    }
    check_all(&mem, 64, 4);
}

/// Every corruption injection reaches a reader that speaks the protocol directly: memory at
/// rest, stored copies after writes, reply data on the wire and misdirected reads, each only
/// while enabled (and only on the slab it names), and none unless the node allows faults.
#[test]
fn injected_corruption_reaches_a_raw_reader() {
    use common::Raw;
    use hydramem::wire::{ClientId, Corruption};
    let differs = |a: &[u8], b: &[u8]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x ^ y).count_ones())
            .sum::<u32>()
    };
    let c = faulty(1);
    let mut raw = Raw::connect(c.cluster().nodes[0].addr);
    raw.hello(ClientId::random());
    let (slab, other) = (raw.alloc(512), raw.alloc(512));
    let split = |i: u64| [i as u8 + 1; 512];
    for i in 0..4 {
        assert_eq!(
            raw.write_split(slab, i * 512, &split(i), 10 + i),
            Status::Ok
        );
    }
    let read = |raw: &mut Raw, s: u32, i: u64| raw.read_split(s, i * 512, 512);
    // On the wire: every reply of that slab has one bit flipped, the stored split none.
    let on_slab = Corruption {
        ppm: 1_000_000,
        slab: Some(slab),
    };
    c.inject(0, Fault::CorruptReplies(on_slab)).unwrap();
    let (st, data, v) = read(&mut raw, slab, 1);
    assert_eq!((st, v, differs(&data, &split(1))), (Status::Ok, 11, 1));
    assert_eq!(read(&mut raw, other, 0).1, [0; 512], "another slab was hit");
    c.inject(0, Fault::Clear).unwrap();
    assert_eq!(read(&mut raw, slab, 1).1, split(1));
    // Misdirected: the neighbouring slot's bytes under the requested version.
    c.inject(0, Fault::MisdirectReads(Corruption::ALWAYS))
        .unwrap();
    assert_eq!(read(&mut raw, slab, 2), (Status::Ok, split(3).to_vec(), 12));
    c.inject(0, Fault::Clear).unwrap();
    // At rest: one bit of every written split, for good.
    c.inject(0, Fault::CorruptSlab(slab)).unwrap();
    c.inject(0, Fault::Clear).unwrap();
    for i in 0..4 {
        let (_, data, v) = read(&mut raw, slab, i);
        assert_eq!((v, differs(&data, &split(i))), (10 + i, 1), "split {i}");
    }
    assert_eq!(read(&mut raw, other, 0).1, [0; 512]);
    assert_eq!(
        c.inject(0, Fault::CorruptSlab(other ^ 0x5555))
            .unwrap_err()
            .refused(),
        Some(Status::NoSuchSlab)
    );
    // After writes: the stored copy is flipped, the version is the written one.
    c.inject(0, Fault::CorruptWrites(Corruption::ALWAYS))
        .unwrap();
    assert_eq!(raw.write_split(other, 512, &[9; 512], 5), Status::Ok);
    c.inject(0, Fault::Clear).unwrap();
    let (_, data, v) = read(&mut raw, other, 1);
    assert_eq!((v, differs(&data, &[9; 512])), (5, 1));
    // A node without --allow-fault-injection refuses them all.
    let plain = common::cluster(1, SLAB, 4);
    for f in [
        Fault::CorruptSlab(0),
        Fault::CorruptWrites(Corruption::ALWAYS),
        Fault::CorruptReplies(Corruption::ALWAYS),
        Fault::MisdirectReads(Corruption::ALWAYS),
    ] {
        assert_eq!(
            plain.inject(0, f).unwrap_err().refused(),
            Some(Status::Forbidden)
        );
    }
}
