//! Failure handling against live node processes: writes in failure-recovery mode keep going
//! through r lost nodes by moving splits to replacement slabs; a node that stops answering is
//! detected by heartbeat, verified and declared failed; a node that comes back is reconnected,
//! reconsidered for placement, and its stale slabs are released. Every acknowledged write reads
//! back exactly.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hydramem::bench::fill_page;
use hydramem::client::{layout, ClientConfig, RemoteMemory};
use hydramem::wire::{Op, Status};
use hydramem::PAGE_SIZE;
use hydramem_isal::Codec;

use common::{Raw, HYDRA, SLAB};

fn write_round(mem: &RemoteMemory, pages: u64, v: u64, last: &mut HashMap<u64, u64>) {
    let mut page = [0u8; PAGE_SIZE];
    for p in 0..pages {
        fill_page(&mut page, 5, p, v);
        mem.write_page(p * PAGE_SIZE as u64, &page)
            .unwrap_or_else(|e| panic!("write of page {p}, round {v}: {e}"));
        last.insert(p, v);
    }
}

fn check(mem: &RemoteMemory, last: &HashMap<u64, u64>) {
    let mut page = [0u8; PAGE_SIZE];
    let mut want = [0u8; PAGE_SIZE];
    for (&p, &v) in last {
        mem.read_page(p * PAGE_SIZE as u64, &mut page)
            .unwrap_or_else(|e| panic!("read of page {p}: {e}"));
        fill_page(&mut want, 5, p, v);
        assert!(
            page == want,
            "page {p} does not hold its last acknowledged write {v}"
        );
    }
}

fn connect(c: &hydramem::embedded::EmbeddedCluster, pages: u64) -> std::sync::Arc<RemoteMemory> {
    RemoteMemory::connect(
        c.cluster(),
        ClientConfig::new(HYDRA, pages * PAGE_SIZE as u64),
    )
    .unwrap()
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn writes_go_on_through_r_killed_nodes() {
    let mut c = common::cluster(12, SLAB, 64);
    let pages = 1024;
    let mem = connect(&c, pages);
    let mut last = HashMap::new();
    write_round(&mem, pages, 1, &mut last);
    let g = mem.group_of(0).unwrap();
    let (a, b) = (g.nodes[0], g.nodes[9]);
    c.kill(a as usize).unwrap();
    c.kill(b as usize).unwrap();
    // The next writes find the members dead (or the maintenance thread, every 100 ms, does
    // first: on a loaded machine it may), their splits move to the two spare nodes, and the
    // writes complete with all 10 splits acknowledged.
    write_round(&mem, pages, 2, &mut last);
    let g2 = mem.group_of(0).unwrap();
    assert!(
        !g2.nodes[..10].contains(&a) && !g2.nodes[..10].contains(&b),
        "{:?}",
        &g2.nodes[..10]
    );
    let mut members = g2.nodes[..10].to_vec();
    members.sort();
    members.dedup();
    assert_eq!(members.len(), 10, "two splits of one range on one node");
    // Each move starts a regeneration of the split, whoever made it.
    assert!(mem.regen_stats().started >= 2, "{:?}", mem.regen_stats());
    check(&mem, &last);
}

#[test]
fn a_silent_node_is_detected_and_a_revived_one_is_reconsidered() {
    let c = common::cluster(11, SLAB, 64);
    let pages = 256;
    let mem = connect(&c, pages);
    let mut last = HashMap::new();
    write_round(&mem, pages, 1, &mut last);
    let victim = mem.group_of(0).unwrap().nodes[4];
    // SIGSTOP: the connection stays open; only the heartbeat can tell.
    c.pause(victim as usize).unwrap();
    wait_until("the stopped node is declared failed", || {
        !mem.transport().is_up(victim)
    });
    write_round(&mem, pages, 2, &mut last);
    assert!(!mem.group_of(0).unwrap().nodes[..10].contains(&victim));
    check(&mem, &last);
    // Back: reconnected, its stale slab released, usable for placement again.
    c.resume(victim as usize).unwrap();
    wait_until("the node is reconnected", || mem.transport().is_up(victim));
    mem.release_orphans();
    let st = hydramem::status::fetch(
        c.cluster().nodes[victim as usize].addr,
        &hydramem::rpc::Access::open(),
        Duration::from_secs(2),
    )
    .unwrap();
    assert!(
        st.slabs.is_empty(),
        "stale slab not released: {:?}",
        st.slabs
    );
    check(&mem, &last);
}

#[test]
fn a_restarted_empty_node_loses_nothing() {
    let mut c = common::cluster(11, SLAB, 64);
    let pages = 256;
    let mem = connect(&c, pages);
    let mut last = HashMap::new();
    write_round(&mem, pages, 1, &mut last);
    let victim = mem.group_of(0).unwrap().nodes[2] as usize;
    // Killed and restarted on the same address, empty: the client reconnects and finds the
    // slab gone; writes move the split elsewhere, reads never take the empty node's zeros.
    c.restart(victim).unwrap();
    wait_until("the node is reconnected", || {
        mem.transport().is_up(victim as u16)
    });
    check(&mem, &last);
    write_round(&mem, pages, 2, &mut last);
    check(&mem, &last);
}

/// A lost slab is rebuilt on its replacement node from the surviving splits while a writer
/// keeps overwriting pages of the range: afterwards the range survives r more lost nodes with
/// every page — written before the loss, during regeneration, or after — reading back its
/// last acknowledged value. Without regeneration the pages written before the loss would be
/// unreadable after the last two kills (three splits gone).
#[test]
fn a_lost_slab_is_regenerated_while_writes_go_on() {
    let slab = 8u64 << 20; // 16384 pages per range: regeneration takes a while
    let mut c = common::cluster_with(13, slab, 8, &[]);
    let pages = 16384u64;
    let mem = connect(&c, pages);
    let mut last = HashMap::new();
    write_round(&mem, pages, 1, &mut last);
    let g = mem.group_of(0).unwrap();
    c.kill(g.nodes[3] as usize).unwrap();
    let last = std::sync::Mutex::new(last);
    std::thread::scope(|s| {
        s.spawn(|| {
            // Overwrites during the remap and the regeneration it starts.
            let mut page = [0u8; PAGE_SIZE];
            for i in 0..3000u64 {
                let p = (i * 7919) % pages;
                fill_page(&mut page, 5, p, 100 + i);
                mem.write_page(p * PAGE_SIZE as u64, &page).unwrap();
                last.lock().unwrap().insert(p, 100 + i);
            }
        });
    });
    common::wait_regenerated(&mem, 1);
    let g2 = mem.group_of(0).unwrap();
    // Two more of the original members die: with the regenerated slab, 8 splits remain.
    let others = common::original_members(&g, &g2, 10, 2);
    for n in &others {
        c.kill(*n as usize).unwrap();
    }
    check(&mem, &last.into_inner().unwrap());
}

#[test]
fn a_lost_replica_is_copied_from_a_surviving_one() {
    let mut c = common::cluster(4, SLAB, 8);
    let pages = 1024u64; // 4 ranges of 256 whole-page copies per 1 MiB slab
    let mem = RemoteMemory::connect(
        c.cluster(),
        ClientConfig::new(
            hydramem::client::Resilience::Replication { copies: 2 },
            pages * PAGE_SIZE as u64,
        ),
    )
    .unwrap();
    let mut last = HashMap::new();
    write_round(&mem, pages, 1, &mut last);
    let g = mem.group_of(0).unwrap();
    c.kill(g.nodes[0] as usize).unwrap();
    common::wait_regenerated(&mem, 1);
    // The other original copy dies too: only the regenerated copy is left.
    let g2 = mem.group_of(0).unwrap();
    assert!(!g2.nodes[..2].contains(&g.nodes[0]));
    c.kill(g.nodes[1] as usize).unwrap();
    check(&mem, &last);
}

#[test]
fn a_node_restarted_within_the_heartbeat_is_repaired_without_writes() {
    // Exactly k + r nodes: no spare, so the lost split can only be rebuilt on the restarted
    // node itself, and only if the client notices it is a new process (its incarnation).
    let mut c = common::cluster(10, SLAB, 64);
    let pages = 2048;
    let mem = connect(&c, pages);
    let mut last = HashMap::new();
    write_round(&mem, pages, 1, &mut last);
    let g = mem.group_of(0).unwrap();
    let victim = g.nodes[3];
    c.restart(victim as usize).unwrap();
    // No writes: the repair must come from the restart being noticed.
    common::wait_regenerated(&mem, 1);
    wait_until("the range is whole again", || mem.degraded_ranges() == 0);
    // Two other members die: reads now need the regenerated split on the restarted node.
    for n in g.nodes[..10].iter().filter(|n| **n != victim).take(2) {
        c.kill(*n as usize).unwrap();
    }
    check(&mem, &last);
}

#[test]
fn a_straggling_node_does_not_hold_writes_and_its_splits_catch_up() {
    let mut c = common::cluster(11, SLAB, 64);
    let pages = 64;
    let mut cfg = ClientConfig::new(HYDRA, pages * PAGE_SIZE as u64);
    // The failure detector stays out of it: the stopped node is slow, not failed.
    cfg.tcp.heartbeat_timeout = Duration::from_secs(600);
    cfg.op_timeout = Duration::from_secs(30);
    let mem = RemoteMemory::connect(c.cluster(), cfg).unwrap();
    let mut last = HashMap::new();
    write_round(&mem, pages, 1, &mut last);
    let group = mem.group_of(0).unwrap();
    let victim = group.nodes[3];
    c.pause(victim as usize).unwrap();
    // SIGSTOP is delivered asynchronously: wait until the process is stopped.
    let pid = c.pid(victim as usize).unwrap();
    wait_until("the node is stopped", || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit(')')
                    .next()
                    .map(|r| r.trim_start().starts_with('T'))
            })
            .unwrap_or(false)
    });
    // Every write completes without the stopped node (it would otherwise wait for it as long
    // as op_timeout), each leaving its split there behind.
    write_round(&mem, pages, 2, &mut last);
    assert!(mem.transport().is_up(victim), "the detector acted");
    assert_eq!(
        mem.stats()
            .left_behind
            .load(std::sync::atomic::Ordering::Relaxed),
        pages
    );
    assert_eq!(mem.lagging_splits(), pages as usize);
    check(&mem, &last);
    // Back: the maintenance thread resends the splits until the node has them all.
    c.resume(victim as usize).unwrap();
    wait_until("the splits left behind are acknowledged", || {
        mem.lagging_splits() == 0
    });
    // Now the page survives the loss of r = 2 other nodes of its group: only if the
    // straggler's splits of round 2 are there (8 splits of one version are needed).
    for j in [0, 7] {
        c.kill(group.nodes[j] as usize).unwrap();
    }
    check(&mem, &last);
}

/// A client of `c` whose audit runs every 200 ms, with 256 pages written (one range); what
/// it wrote.
fn audited(
    c: &hydramem::embedded::EmbeddedCluster,
) -> (std::sync::Arc<RemoteMemory>, HashMap<u64, u64>) {
    let pages = 256;
    let mut config = ClientConfig::new(HYDRA, pages * PAGE_SIZE as u64);
    config.audit_interval = Duration::from_millis(200);
    let mem = RemoteMemory::connect(c.cluster(), config).unwrap();
    let mut last = HashMap::new();
    write_round(&mem, pages, 1, &mut last);
    (mem, last)
}

#[test]
fn a_slab_its_node_no_longer_holds_is_regenerated_while_pages_are_only_read() {
    let mut c = common::cluster(12, SLAB, 64);
    let (mem, last) = audited(&c);
    let g = mem.group_of(0).unwrap();
    // A peer holding the client's identity frees the slab of parity split 9 behind the
    // client's back, as a node drops a reclaimed slab at its deadline; the node stays up.
    let (node, slab) = (g.nodes[9], g.slabs[9]);
    let mut raw = common::Raw::connect(c.cluster().nodes[node as usize].addr);
    raw.hello(mem.owner());
    assert_eq!(raw.call(Op::Free, &slab.to_le_bytes()).0.status, Status::Ok);
    // Reads go on as before: one that asks split 9 reads around the node's answer that the
    // slab is gone, and repairs nothing. The audit notices, and the split is regenerated on
    // another slab.
    check(&mem, &last);
    common::wait_regenerated(&mem, 1);
    let g2 = mem.group_of(0).unwrap();
    assert!(
        (g2.nodes[9], g2.slabs[9]) != (node, slab),
        "split 9 still on the freed slab"
    );
    // Redundancy is whole again: with two more members of the group lost, every page still
    // reads back exactly (without the repair, 7 splits of 10 would be left, under k = 8).
    c.kill(g2.nodes[0] as usize).unwrap();
    c.kill(g2.nodes[1] as usize).unwrap();
    check(&mem, &last);
}

#[test]
fn a_slab_of_ours_that_nothing_uses_is_freed_and_the_others_are_kept() {
    let c = common::cluster(12, SLAB, 64);
    let (mem, last) = audited(&c);
    let g = mem.group_of(0).unwrap();
    // What an ALLOC whose reply was lost leaves on a node: a slab of the client's layout for
    // a split it placed elsewhere, never written. Beside it a slab of the layout that holds a
    // write (what a node that was down when the client connected brings back: it may be the
    // only copy of its pages), and one whose tag is not this layout's (another version's,
    // say), which is not the client's to judge.
    let node = g.nodes[3];
    let mut raw = common::Raw::connect(c.cluster().nodes[node as usize].addr);
    raw.hello(mem.owner());
    let split_len = (PAGE_SIZE / 8) as u32;
    let leaked = raw.alloc_tagged(layout::tag(mem.layout().code(), 0, 3), split_len);
    let written = raw.alloc_tagged(layout::tag(mem.layout().code(), 0, 4), split_len);
    let data = vec![9u8; split_len as usize];
    assert_eq!(raw.write_split(written, 0, &data, 1), Status::Ok);
    let foreign = raw.alloc_tagged(7, split_len);
    let deadline = Instant::now() + Duration::from_secs(20);
    while raw.list().iter().any(|l| l.slab == leaked) {
        assert!(Instant::now() < deadline, "the unused slab was never freed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let listed: Vec<u32> = raw.list().iter().map(|l| l.slab).collect();
    assert!(
        listed.contains(&foreign),
        "a slab of another layout was freed"
    );
    assert!(
        listed.contains(&written),
        "a slab holding a write was freed"
    );
    // Every slab the range uses (the pages fill one) is still held, and reads come back
    // exact, with nothing regenerated.
    let now = mem.group_of(0).unwrap();
    assert_eq!((now.nodes, now.slabs), (g.nodes, g.slabs));
    for j in 0..10 {
        let mut r = common::Raw::connect(c.cluster().nodes[g.nodes[j] as usize].addr);
        r.hello(mem.owner());
        assert!(
            r.list().iter().any(|l| l.slab == g.slabs[j]),
            "split {j} lost its slab"
        );
    }
    assert_eq!(mem.regenerations().0, 0, "nothing in use was touched");
    check(&mem, &last);
}

#[test]
fn a_split_two_slabs_claim_is_regenerated_whole_when_its_identity_reconnects() {
    let mut c = common::cluster(12, SLAB, 64);
    let pages = 256;
    let cfg = ClientConfig::new(HYDRA, pages * PAGE_SIZE as u64);
    let mut last = HashMap::new();
    let g = {
        let mem = RemoteMemory::connect(c.cluster(), cfg.clone()).unwrap();
        write_round(&mem, pages, 1, &mut last);
        mem.group_of(0).unwrap()
    };
    // What a move cut short by the process's end leaves: a second slab for split j on a node
    // outside the group, which got the writes made after the switch (here one: the last page
    // again, one version on, to the other splits' own slabs and to the second one) and not
    // yet the copy of the others. The split is the one on the lowest node and the second
    // slab on the highest, so that it is listed last: taking the last one found, a
    // reconnecting client would read split j from a slab that lacks every other page.
    let j = (0..10).min_by_key(|&j| g.nodes[j]).unwrap();
    let spare = (0..12u16)
        .rev()
        .find(|n| !g.nodes[..10].contains(n))
        .unwrap();
    let split_len = PAGE_SIZE / 8;
    let raw = |node: u16| {
        let mut r = Raw::connect(c.cluster().nodes[node as usize].addr);
        r.hello(cfg.client_id);
        r
    };
    let mut own = raw(g.nodes[j]);
    let tag = own
        .list()
        .iter()
        .find(|l| l.slab == g.slabs[j])
        .expect("the split's slab is listed")
        .tag;
    let p = pages - 1;
    let at = p * split_len as u64;
    let version = own.read_stamped(g.slabs[j], at, split_len as u32).2;
    let second = raw(spare).alloc_tagged(tag, split_len as u32);
    let mut page = [0u8; PAGE_SIZE];
    fill_page(&mut page, 5, p, last[&p]);
    let mut splits: Vec<Vec<u8>> = page.chunks(split_len).map(<[u8]>::to_vec).collect();
    let (mut p0, mut p1) = (vec![0; split_len], vec![0; split_len]);
    let data: Vec<&[u8]> = splits.iter().map(Vec::as_slice).collect();
    Codec::new(8, 2)
        .unwrap()
        .encode(&data, &mut [&mut p0, &mut p1])
        .unwrap();
    splits.extend([p0, p1]);
    for (i, split) in splits.iter().enumerate() {
        let (node, slab) = if i == j {
            (spare, second)
        } else {
            (g.nodes[i], g.slabs[i])
        };
        let crc = hydramem::integrity::split_crc(split, 0, p, i, version + 1);
        assert_eq!(
            raw(node).write_stamped(slab, at, split, version + 1, crc),
            Status::Ok
        );
    }
    // The reconnecting client keeps the slab with the newest write, regenerates it whole,
    // and frees the other.
    let mem = RemoteMemory::connect(c.cluster(), cfg).unwrap();
    common::wait_regenerated(&mem, 1);
    let g2 = mem.group_of(0).unwrap();
    assert_eq!((g2.nodes[j], g2.slabs[j]), (spare, second));
    wait_until("the other slab is freed", || {
        !own.list().iter().any(|l| l.slab == g.slabs[j])
    });
    check(&mem, &last);
    // With two more members of the group lost, every page still reads back exactly: the
    // kept slab holds every page.
    let others: Vec<u16> = (0..10).filter(|&i| i != j).map(|i| g2.nodes[i]).collect();
    c.kill(others[0] as usize).unwrap();
    c.kill(others[1] as usize).unwrap();
    check(&mem, &last);
}

/// A node regenerating a slab for a client that dies stops at the next chunk instead of
/// pulling the whole slab for nobody, and the dead client's identity is free for its successor
/// at once: the regeneration's connections no longer hold it on any node.
#[test]
fn a_regeneration_whose_requester_died_stops_and_frees_the_identity() {
    use hydramem::wire::{Fault, Regen, RegenSource};
    use std::io::Write;
    const BIG: u64 = 16 << 20;
    const SPLIT: u32 = 512;
    let pages = BIG / u64::from(SPLIT);
    let c = common::cluster_with(3, BIG, 2, &["--allow-fault-injection"]);
    let id = hydramem::wire::ClientId::random();
    let requester_instance = 0x5eed;
    let mut raw = Raw::connect(c.cluster().nodes[0].addr);
    assert_eq!(raw.hello_as(id, requester_instance), Status::Ok);
    let target = raw.alloc(SPLIT);
    let mut sources = Vec::new();
    for n in 1..3 {
        let mut r = Raw::connect(c.cluster().nodes[n].addr);
        assert_eq!(r.hello_as(id, requester_instance), Status::Ok);
        sources.push(RegenSource {
            split: (n - 1) as u8,
            copy: false,
            slab: r.alloc(SPLIT),
            node: c.cluster().nodes[n].id,
        });
    }
    // Every source answers each chunk (1 MiB of splits) a second late: the whole slab would
    // take 16 s.
    for n in 1..3 {
        c.inject(n, Fault::DelayReplies(1_000_000)).unwrap();
    }
    let req = Regen {
        client: id,
        k: 2,
        r: 1,
        target: 2,
        split_len: SPLIT,
        slab: target,
        pages,
        range: 0,
        checksums: false,
        sources,
    };
    let mut body = Vec::new();
    req.put(&mut body);
    let mut frame = Vec::new();
    let fb = hydramem::wire::FrameBuilder::begin(&mut frame, Op::Regen, false, Status::Ok, 1);
    frame.extend_from_slice(&body);
    fb.finish(&mut frame).unwrap();
    raw.s.write_all(&frame).unwrap();
    let stats = || {
        hydramem::status::fetch(
            c.cluster().nodes[0].addr,
            &hydramem::rpc::Access::open(),
            Duration::from_secs(5),
        )
        .unwrap()
    };
    wait_until("the regeneration starts", || stats().regenerating == 1);
    // The requester dies.
    drop(raw);
    wait_until("the regeneration ends", || stats().regenerating == 0);
    let landed = stats().regen_pages;
    assert!(
        landed < pages,
        "the regeneration went on to its end ({landed} of {pages} pages) for a requester that was gone"
    );
    // Its successor (another process) is admitted on every node (a refused HELLO closes its
    // connection: each try is a new one).
    for n in 0..3 {
        c.inject(n, Fault::Clear).unwrap();
        let addr = c.cluster().nodes[n].addr;
        wait_until("the identity is free for the next process", || {
            Raw::connect(addr).hello_as(id, requester_instance + 1) == Status::Ok
        });
    }
}
