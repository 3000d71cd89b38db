//! Membership on etcd with real processes: an etcd server, memory nodes that register in it,
//! and a client that follows it. A node started after the client gets the client's next
//! ranges; etcd killed costs the data path nothing (every write and read succeeds), and what
//! changed while it was down reaches the client when it is back; a record deleted under a
//! live node makes the client verify the node, which stays in use.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hydramem::client::{ClientConfig, RemoteMemory};
use hydramem::cluster::Cluster;
use hydramem::embedded::{EmbeddedCluster, EmbeddedOptions};
use hydramem::membership::server::EtcdServer;
use hydramem::membership::Registry;

const SLAB: u64 = 256 << 10;
const PAGE: u64 = 4096;

/// Starts `nodes` nodes registered in `etcd` (lease `ttl` s).
fn cluster(etcd: &EtcdServer, nodes: usize, ttl: u64) -> EmbeddedCluster {
    EmbeddedCluster::start(EmbeddedOptions {
        etcd: Some(etcd.config(ttl)),
        binary: env!("CARGO_BIN_EXE_hydramem").into(),
        nodes,
        slab_size: SLAB,
        capacity: SLAB * 64,
        extra_args: vec!["--log".into(), common::test_log_level()],
        cluster_file: None,
        key_file: None,
        tls_dir: None,
    })
    .expect("start memory nodes")
}

/// A node process started by hand with the cluster file (as an operator adds a machine).
struct Extra(Child);

impl Extra {
    fn start(c: &EmbeddedCluster, id: u32) -> Extra {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hydramem"))
            .args([
                "node",
                "--listen",
                "127.0.0.1:0",
                "--announce",
                "--log",
                "error",
            ])
            .args(["--id", &id.to_string()])
            .args(["--capacity", &(SLAB * 64).to_string()])
            .args(["--slab-size", &SLAB.to_string()])
            .arg("--cluster")
            .arg(c.cluster_file())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a node");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("listening "), "{line}");
        Extra(child)
    }
}

impl Drop for Extra {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn client(c: &EmbeddedCluster, pages: u64) -> Arc<RemoteMemory> {
    let cluster = Cluster::load(c.cluster_file()).unwrap();
    assert!(cluster.etcd.is_some());
    let mut config = ClientConfig::new("hydra-4+2-d1".parse().unwrap(), pages * PAGE);
    config.seed = Some(5);
    RemoteMemory::connect(&cluster, config).expect("connect")
}

/// Waits for `cond` (polled every 20 ms) up to `limit`; the time it took.
fn until(limit: Duration, what: &str, cond: impl Fn() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

fn page(addr: u64, stamp: u64) -> [u8; 4096] {
    let mut p = [0u8; 4096];
    for (i, b) in p.iter_mut().enumerate() {
        *b = (addr / PAGE)
            .wrapping_mul(31)
            .wrapping_add(stamp * 7 + i as u64) as u8;
    }
    p
}

/// Writes pages `range` with `stamp` and reads them back: every one must succeed and match.
fn write_and_check(mem: &RemoteMemory, range: std::ops::Range<u64>, stamp: u64) {
    for p in range.clone() {
        mem.write_page(p * PAGE, &page(p * PAGE, stamp))
            .unwrap_or_else(|e| panic!("write of page {p}: {e}"));
    }
    let mut got = [0u8; 4096];
    for p in range {
        mem.read_page(p * PAGE, &mut got)
            .unwrap_or_else(|e| panic!("read of page {p}: {e}"));
        assert!(got == page(p * PAGE, stamp), "page {p} read back wrong");
    }
}

#[test]
fn a_node_started_later_gets_new_ranges_and_an_etcd_outage_costs_no_io() {
    let mut etcd = EtcdServer::start().expect("etcd (scripts/setup installs etcd-server)");
    let c = cluster(&etcd, 6, 2);
    // 4+2: slabs of 256 KiB hold 256 splits of 1 KiB, so 256 pages per range.
    let per_range = 256;
    let mem = client(&c, 8 * per_range);
    assert_eq!(mem.member_ids().len(), 6);
    write_and_check(&mem, 0..per_range, 1);

    // A seventh and eighth node, started with the cluster file, join the running client.
    let _n7 = Extra::start(&c, 100);
    let _n8 = Extra::start(&c, 101);
    let took = until(Duration::from_secs(30), "nodes 100 and 101 join", || {
        let ids = mem.member_ids();
        ids.contains(&100) && ids.contains(&101)
    });
    eprintln!("two nodes joined the client {took:?} after they announced");
    write_and_check(&mem, per_range..2 * per_range, 2);
    let g = mem.group_of(per_range * PAGE).unwrap();
    let width = mem.layout().width;
    assert!(
        g.nodes[..width].contains(&6) && g.nodes[..width].contains(&7),
        "the next range goes to the new, empty nodes: {g:?}"
    );

    // etcd dies: the data path does not notice.
    etcd.kill();
    write_and_check(&mem, 0..4 * per_range, 3);
    // A node started while etcd is down cannot register; it joins once etcd is back.
    let _n9 = Extra::start(&c, 102);
    write_and_check(&mem, 4 * per_range..8 * per_range, 4);
    etcd.restart().unwrap();
    until(
        Duration::from_secs(60),
        "node 102 joins after etcd's return",
        || mem.member_ids().contains(&102),
    );
    write_and_check(&mem, 0..8 * per_range, 5);
    assert!((0..mem.transport().nodes() as u16).all(|n| mem.transport().is_up(n)));
}

#[test]
fn a_record_deleted_under_a_live_node_only_makes_it_suspect() {
    let etcd = EtcdServer::start().expect("etcd (scripts/setup installs etcd-server)");
    let c = cluster(&etcd, 6, 2);
    let mem = client(&c, 256);
    write_and_check(&mem, 0..256, 1);
    let cfg = etcd.config(2);
    let reg = hydramem::membership::etcd::EtcdRegistry::connect(&cfg).unwrap();
    let key = cfg.member_key(3);
    // As `etcdctl del` would: the lease stays, the key goes.
    let (entries, _) = reg.list(&key).unwrap();
    assert_eq!(entries.len(), 1);
    etcd_delete(&etcd, &key);
    // The node is verified, answers, and stays in use; its registration writes it again.
    until(
        Duration::from_secs(30),
        "node 3's record is written again",
        || reg.list(&key).map(|(e, _)| e.len() == 1).unwrap_or(false),
    );
    assert!(mem.transport().is_up(3));
    write_and_check(&mem, 0..256, 2);
}

/// Deletes `key` with etcdctl (Debian's etcd-client), as an operator would.
fn etcd_delete(etcd: &EtcdServer, key: &str) {
    let st = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &etcd.endpoint(), "del", key])
        .stdout(Stdio::null())
        .status()
        .expect("etcdctl (Debian: etcd-client)");
    assert!(st.success());
}
