//! Memory-node memory management against live node processes: a node whose machine runs short
//! of memory reclaims its least active slabs and their owner moves them away with no data lost;
//! a drained node hands every slab over; a reclaimed slab its owner could not move is dropped
//! at its deadline and repaired from the other splits. The machine's memory is simulated with
//! FAULT `MemoryTotal`/`MemoryAvailable`; everything else is real.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hydramem::bench::fill_page;
use hydramem::client::{ClientConfig, RemoteMemory};
use hydramem::embedded::EmbeddedCluster;
use hydramem::wire::{Fault, Stats};
use hydramem::PAGE_SIZE;

use common::{HYDRA, SLAB};

const MIB: u64 = 1 << 20;

fn node_args(grace: &str) -> Vec<String> {
    [
        "--allow-fault-injection",
        "--control-period",
        "100ms",
        "--prealloc",
        "0",
        "--reclaim-grace",
        grace,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn start(nodes: usize, grace: &str) -> EmbeddedCluster {
    let args = node_args(grace);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    common::cluster_with(nodes, SLAB, 16, &args)
}

fn connect(c: &EmbeddedCluster, pages: u64) -> std::sync::Arc<RemoteMemory> {
    RemoteMemory::connect(
        c.cluster(),
        ClientConfig::new(HYDRA, pages * PAGE_SIZE as u64),
    )
    .unwrap()
}

fn stats(c: &EmbeddedCluster, node: usize) -> Stats {
    hydramem::status::fetch(
        c.cluster().nodes[node].addr,
        &hydramem::rpc::Access::open(),
        Duration::from_secs(2),
    )
    .unwrap()
}

/// Sets the flag when dropped, so that a failed assertion stops the workload threads of a
/// scope instead of leaving the scope waiting for them forever.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn write_pages(
    mem: &RemoteMemory,
    pages: std::ops::Range<u64>,
    v: u64,
    last: &Mutex<HashMap<u64, u64>>,
) {
    let mut page = [0u8; PAGE_SIZE];
    for p in pages {
        fill_page(&mut page, 9, p, v);
        mem.write_page(p * PAGE_SIZE as u64, &page)
            .unwrap_or_else(|e| panic!("write of page {p}: {e}"));
        last.lock().unwrap().insert(p, v);
    }
}

fn check(mem: &RemoteMemory, last: &HashMap<u64, u64>) {
    let (mut page, mut want) = ([0u8; PAGE_SIZE], [0u8; PAGE_SIZE]);
    for (&p, &v) in last {
        mem.read_page(p * PAGE_SIZE as u64, &mut page)
            .unwrap_or_else(|e| panic!("read of page {p}: {e}"));
        fill_page(&mut want, 9, p, v);
        assert!(
            page == want,
            "page {p} does not hold its last acknowledged write {v}"
        );
    }
}

/// Overwrites random pages of `0..pages` until `stop`, recording every acknowledged write.
fn overwrite_until(
    mem: &RemoteMemory,
    pages: u64,
    stop: &AtomicBool,
    last: &Mutex<HashMap<u64, u64>>,
) {
    let mut page = [0u8; PAGE_SIZE];
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let p = (i * 7919 + 13) % pages;
        let v = 1000 + i;
        fill_page(&mut page, 9, p, v);
        mem.write_page(p * PAGE_SIZE as u64, &page)
            .unwrap_or_else(|e| panic!("overwrite of page {p}: {e}"));
        last.lock().unwrap().insert(p, v);
        i += 1;
    }
}

/// (range, split, slab) of every slab `node` holds for this client.
fn held_on(mem: &RemoteMemory, ranges: u64, node: u16) -> Vec<(u64, usize, u32)> {
    let rb = mem.layout().range_bytes();
    (0..ranges)
        .filter_map(|r| {
            let g = mem.group_of(r * rb)?;
            let j = (0..10).find(|&j| g.nodes[j] == node)?;
            Some((r, j, g.slabs[j]))
        })
        .collect()
}

/// Kills two members of `range`'s group other than `spare`, so that reads of that range need
/// every one of the 8 that remain — including the split that was moved or regenerated.
fn kill_two_of(c: &mut EmbeddedCluster, mem: &RemoteMemory, range: u64, spare: &[u16]) {
    let g = mem.group_of(range * mem.layout().range_bytes()).unwrap();
    let victims: Vec<u16> = g.nodes[..10]
        .iter()
        .copied()
        .filter(|n| !spare.contains(n))
        .take(2)
        .collect();
    for n in victims {
        c.kill(n as usize).unwrap();
    }
}

#[test]
fn memory_pressure_moves_the_least_active_slab_and_loses_nothing() {
    let mut c = start(13, "30s");
    let ranges = 3u64;
    let ppr = SLAB / 512; // pages per range: 8 + 2 with 512-byte splits
    let pages = ranges * ppr;
    let mem = connect(&c, pages);
    let last = Mutex::new(HashMap::new());
    write_pages(&mem, 0..pages, 1, &last);
    let x = mem.group_of(0).unwrap().nodes[0];
    let held = held_on(&mem, ranges, x);
    assert!(
        held.len() >= 2,
        "node {x} should hold slabs of several ranges: {held:?}"
    );
    let hot = held[0]; // range 0
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        // Range 0 is read all the time; the others only see the overwriter's few writes.
        s.spawn(|| {
            let mut page = [0u8; PAGE_SIZE];
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                mem.read_page((i % ppr) * PAGE_SIZE as u64, &mut page)
                    .unwrap();
                i += 1;
            }
        });
        std::thread::sleep(Duration::from_millis(1500)); // idle slabs' activity decays
        s.spawn(|| overwrite_until(&mem, pages, &stop, &last));
        // Simulated machine: 100 MiB, of which 24 + h MiB would be free without the node's h
        // slabs of 1 MiB: a budget of (24 + h − 25) MiB = h − 1 slabs, so one slab must go.
        c.inject(x as usize, Fault::MemoryTotal(100 * MIB)).unwrap();
        c.inject(
            x as usize,
            Fault::MemoryAvailable((24 + held.len() as u64) * MIB),
        )
        .unwrap();
        wait_until("the reclaimed slab is moved away", 30, || {
            let st = stats(&c, x as usize);
            st.evicted_moved == 1 && st.reclaiming == 0
        });
        std::thread::sleep(Duration::from_millis(300)); // writes go on after the move
        stop.store(true, Ordering::Relaxed);
    });
    common::wait_regenerated(&mem, 1);
    let st = stats(&c, x as usize);
    assert_eq!(
        st.evicted_forced, 0,
        "nothing may be dropped: the owner moved it"
    );
    assert_eq!(
        st.slabs.len(),
        held.len() - 1,
        "exactly one slab left the node"
    );
    let now = held_on(&mem, ranges, x);
    assert!(
        now.contains(&hot),
        "the hot slab {hot:?} was reclaimed instead of an idle one"
    );
    let moved = held.iter().find(|h| !now.contains(h)).copied().unwrap();
    // The moved split must hold every page: with two other members dead, reads need it.
    let g = mem.group_of(moved.0 * mem.layout().range_bytes()).unwrap();
    let new_home = g.nodes[moved.1];
    assert_ne!(new_home, x);
    kill_two_of(&mut c, &mem, moved.0, &[new_home, x]);
    check(&mem, &last.into_inner().unwrap());
}

#[test]
fn a_drained_node_hands_every_slab_over() {
    let mut c = start(13, "30s");
    let ranges = 3u64;
    let ppr = SLAB / 512;
    let pages = ranges * ppr;
    let mem = connect(&c, pages);
    let last = Mutex::new(HashMap::new());
    // Two of three ranges mapped; the third is mapped after the drain.
    write_pages(&mem, 0..2 * ppr, 1, &last);
    let x = mem.group_of(0).unwrap().nodes[0];
    let held = held_on(&mem, ranges, x).len() as u64;
    let addr = c.cluster().nodes[x as usize].addr.to_string();
    let stop = AtomicBool::new(false);
    let out = std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        s.spawn(|| overwrite_until(&mem, 2 * ppr, &stop, &last));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hydramem"))
            .args(["node", "drain", &addr, "--timeout", "60s"])
            .output()
            .unwrap();
        stop.store(true, Ordering::Relaxed);
        out
    });
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "drain failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(&format!("draining node {x}")), "{stdout}");
    assert!(stdout.contains("holds no slabs"), "{stdout}");
    common::wait_regenerated(&mem, held);
    let st = stats(&c, x as usize);
    assert!(st.draining);
    assert_eq!(
        (st.slabs.len() as u64, st.evicted_moved, st.evicted_forced),
        (0, held, 0)
    );
    // A draining node takes no new slabs.
    write_pages(&mem, 2 * ppr..3 * ppr, 2, &last);
    assert!(held_on(&mem, ranges, x).is_empty());
    // The node can stop; with two more members of range 0 dead, every page still reads.
    c.kill(x as usize).unwrap();
    kill_two_of(&mut c, &mem, 0, &[]);
    check(&mem, &last.into_inner().unwrap());
}

#[test]
fn a_reclaimed_slab_that_cannot_move_is_dropped_at_its_deadline_and_repaired() {
    // 11 nodes: one range on 10 of them, one spare that refuses allocation at first.
    let mut c = start(11, "1s");
    let ppr = SLAB / 512;
    let mem = connect(&c, ppr);
    let last = Mutex::new(HashMap::new());
    write_pages(&mem, 0..ppr, 1, &last);
    let g = mem.group_of(0).unwrap();
    let spare = (0..11u16).find(|n| !g.nodes[..10].contains(n)).unwrap();
    let x = g.nodes[4];
    c.inject(spare as usize, Fault::RefuseAlloc).unwrap();
    c.inject(x as usize, Fault::MemoryTotal(100 * MIB)).unwrap();
    c.inject(x as usize, Fault::MemoryAvailable(10 * MIB))
        .unwrap();
    wait_until("the node drops the slab", 20, || {
        stats(&c, x as usize).evicted_forced == 1
    });
    // One split short: every page still reads exactly.
    check(&mem, &last.lock().unwrap());
    // The spare takes slabs again: the lost split is regenerated there.
    c.inject(spare as usize, Fault::Clear).unwrap();
    wait_until("the dropped split is repaired", 20, || {
        mem.group_of(0).unwrap().nodes[4] == spare
    });
    common::wait_regenerated(&mem, 1);
    kill_two_of(&mut c, &mem, 0, &[spare, x]);
    check(&mem, &last.into_inner().unwrap());
}

#[test]
fn a_full_cluster_refuses_a_new_range_as_out_of_capacity_also_once_its_nodes_said_so() {
    // 10 nodes of 2 slabs: two ranges fill them. A third is refused by the nodes' allocation
    // at first, and once their heartbeats say they take no new slabs, by the placement: both
    // must say the cluster is out of capacity (the file front end's ENOSPC), not that nodes
    // are missing.
    let c = common::cluster_with(10, SLAB, 2, &[]);
    let ppr = SLAB / 512;
    let mem = connect(&c, 3 * ppr);
    let last = Mutex::new(HashMap::new());
    write_pages(&mem, 0..1, 1, &last);
    write_pages(&mem, ppr..ppr + 1, 1, &last);
    let page = [7u8; PAGE_SIZE];
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        match mem.write_page(2 * ppr * PAGE_SIZE as u64, &page) {
            Err(hydramem::client::IoError::Map(hydramem::client::ClientError::OutOfCapacity {
                ..
            })) => {}
            r => panic!("a write to a range the full cluster cannot map: {r:?}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    check(&mem, &last.into_inner().unwrap());
}
