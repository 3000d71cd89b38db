//! Shared helpers of the integration tests: real node processes on loopback port 0.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use hydramem::embedded::{EmbeddedCluster, EmbeddedOptions};
use hydramem::wire::{
    self, ClientId, FrameBuilder, Header, Hello, Op, OpenRuns, ReplyRuns, Run, Status, HEADER_LEN,
};

/// The slab size most tests use.
pub const SLAB: u64 = 1 << 20;

/// Hydra 8+2, Δ = 1, failure-recovery mode: the paper's default scheme.
pub const HYDRA: hydramem::client::Resilience = hydramem::client::Resilience::Hydra {
    k: 8,
    r: 2,
    delta: 1,
    mode: hydramem::client::Mode::FailureRecovery,
};

/// Starts `nodes` memory node processes with small slabs.
pub fn cluster(nodes: usize, slab_size: u64, slabs_per_node: u64) -> EmbeddedCluster {
    cluster_with(nodes, slab_size, slabs_per_node, &[])
}

/// Like [`cluster`], with extra node arguments.
pub fn cluster_with(
    nodes: usize,
    slab_size: u64,
    slabs_per_node: u64,
    extra: &[&str],
) -> EmbeddedCluster {
    cluster_in(nodes, slab_size, slabs_per_node, extra, None)
}

/// Like [`cluster_with`], with the nodes' cluster file at `cluster_file` (`None`: a private
/// one that goes with the cluster).
pub fn cluster_in(
    nodes: usize,
    slab_size: u64,
    slabs_per_node: u64,
    extra: &[&str],
    cluster_file: Option<std::path::PathBuf>,
) -> EmbeddedCluster {
    let mut extra_args: Vec<String> = vec!["--log".into(), test_log_level()];
    extra_args.extend(extra.iter().map(|s| s.to_string()));
    EmbeddedCluster::start(EmbeddedOptions {
        etcd: None,
        binary: env!("CARGO_BIN_EXE_hydramem").into(),
        nodes,
        slab_size,
        capacity: slab_size * slabs_per_node,
        extra_args,
        cluster_file,
        key_file: None,
        tls_dir: None,
    })
    .expect("start memory nodes")
}

/// The log level of the nodes a test starts and of the client in the test itself: `error`,
/// or what `HYDRAMEM_TEST_LOG` says (`info`, `debug`, a filter such as
/// `hydramem::client=debug`) — to see what happened in a failing test:
/// `HYDRAMEM_TEST_LOG=debug cargo test -p hydramem --test span -- --nocapture NAME`. With the
/// variable set, the first call also sends the test process's own log to the test's output.
pub fn test_log_level() -> String {
    match std::env::var("HYDRAMEM_TEST_LOG") {
        Ok(level) => {
            // Once per test process; later calls find it installed.
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(&level))
                .with_test_writer()
                .try_init();
            level
        }
        Err(_) => "error".into(),
    }
}

/// Waits until every regeneration the client started has finished (none may fail) and, when
/// `at_least` > 0, until at least that many were started.
pub fn wait_regenerated(mem: &hydramem::client::RemoteMemory, at_least: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (started, done, failed) = mem.regenerations();
        assert_eq!(failed, 0, "a regeneration failed");
        if started >= at_least && done == started {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "regeneration did not finish"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Waits until at least `at_least` regenerations completed, none is in flight and no range
/// is degraded, allowing attempts that failed and were retried: for tests that kill several
/// nodes at once, where an attempt started between two deaths may name a node that is dead
/// but not yet detected, fail, and be retried (as the client does: the range stays degraded
/// until a retry succeeds). The test's own read-back then checks that nothing was lost.
pub fn wait_regenerated_with_retries(mem: &hydramem::client::RemoteMemory, at_least: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (started, done, failed) = mem.regenerations();
        if done >= at_least && done + failed == started && mem.degraded_ranges() == 0 {
            assert!(
                failed <= done,
                "more regeneration attempts failed ({failed}) than completed ({done})"
            );
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "regeneration did not finish: {started} started, {done} done, {failed} failed, \
             {} ranges degraded",
            mem.degraded_ranges()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `n` nodes of a range's group now (`after`) that were already members before a slab of it
/// moved (`before`): the original members a test kills next, leaving the moved slab's
/// regenerated copy among the survivors.
pub fn original_members(
    before: &hydramem::client::Group,
    after: &hydramem::client::Group,
    width: usize,
    n: usize,
) -> Vec<u16> {
    after.nodes[..width]
        .iter()
        .copied()
        .filter(|m| before.nodes[..width].contains(m))
        .take(n)
        .collect()
}

/// A raw protocol connection for tests that speak to a node directly.
pub struct Raw {
    pub s: TcpStream,
    id: u64,
}

impl Raw {
    pub fn connect(addr: SocketAddr) -> Raw {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        Raw { s, id: 0 }
    }

    /// Sends one frame and returns the reply header and body.
    pub fn call(&mut self, op: Op, body: &[u8]) -> (Header, Vec<u8>) {
        self.id += 1;
        let mut out = Vec::new();
        let fb = FrameBuilder::begin(&mut out, op, false, Status::Ok, self.id);
        out.extend_from_slice(body);
        fb.finish(&mut out).unwrap();
        self.s.write_all(&out).unwrap();
        self.read_reply()
    }

    pub fn read_reply(&mut self) -> (Header, Vec<u8>) {
        let mut hb = [0u8; HEADER_LEN];
        self.s.read_exact(&mut hb).unwrap();
        let h = Header::parse(&hb).unwrap();
        let mut body = vec![0u8; h.body_len as usize];
        self.s.read_exact(&mut body).unwrap();
        (h, body)
    }

    /// HELLO as `client`, as this process (which the test's clients are too: a raw peer
    /// with a client's identity is that client's own process to the nodes).
    pub fn hello(&mut self, client: ClientId) {
        let st = self.hello_as(client, hydramem::rpc::process_instance());
        assert_eq!(st, Status::Ok);
    }

    /// HELLO as `client` and `instance`; the status the node answered.
    pub fn hello_as(&mut self, client: ClientId, instance: u64) -> Status {
        let mut b = Vec::new();
        Hello {
            client,
            flags: 0,
            nonce: [0; hydramem::auth::NONCE_LEN],
            instance,
        }
        .put(&mut b);
        self.call(Op::Hello, &b).0.status
    }

    /// Allocates a slab for splits of `split_len` bytes.
    pub fn alloc(&mut self, split_len: u32) -> u32 {
        self.alloc_tagged(1, split_len)
    }

    /// Allocates a slab with tag `tag` for splits of `split_len` bytes.
    pub fn alloc_tagged(&mut self, tag: u64, split_len: u32) -> u32 {
        let body = [&tag.to_le_bytes()[..], &split_len.to_le_bytes()].concat();
        let (h, body) = self.call(Op::Alloc, &body);
        assert_eq!(h.status, Status::Ok);
        u32::from_le_bytes(body.try_into().unwrap())
    }

    /// The slabs the node holds for this connection's identity (LIST).
    pub fn list(&mut self) -> Vec<wire::Listed> {
        let (h, body) = self.call(Op::List, &[]);
        assert_eq!(h.status, Status::Ok);
        wire::parse_list(&body).unwrap()
    }

    /// One WRITEV entry of `version` (checksum 0); returns its status.
    pub fn write_split(&mut self, slab: u32, offset: u64, data: &[u8], version: u64) -> Status {
        self.write_stamped(slab, offset, data, version, 0)
    }

    /// One WRITEV entry of `version` with checksum `crc`; returns its status.
    pub fn write_stamped(
        &mut self,
        slab: u32,
        offset: u64,
        data: &[u8],
        version: u64,
        crc: u32,
    ) -> Status {
        self.write_reply(slab, offset, data, version, crc).0
    }

    /// One WRITEV split of `version` with checksum `crc`; returns its status and the version
    /// the node holds for the split afterwards.
    pub fn write_reply(
        &mut self,
        slab: u32,
        offset: u64,
        data: &[u8],
        version: u64,
        crc: u32,
    ) -> (Status, u64) {
        self.write_run(slab, offset, data.len() as u32, &[(version, crc, data)])[0]
    }

    /// One WRITEV run of splits of `split_len` bytes from `offset`, each given as (version,
    /// crc, data); returns every split's status and the version the node holds afterwards.
    pub fn write_run(
        &mut self,
        slab: u32,
        offset: u64,
        split_len: u32,
        splits: &[(u64, u32, &[u8])],
    ) -> Vec<(Status, u64)> {
        let run = Run {
            slab,
            split_len,
            offset,
            n: splits.len() as u32,
        };
        let mut out = Vec::new();
        let mut f = OpenRuns::begin(&mut out, Op::WriteV, 0).unwrap();
        let mut w = f.write_run(&mut out, run).unwrap();
        for (i, (version, crc, data)) in splits.iter().enumerate() {
            let fields = wire::SplitFields {
                cookie: 5 + i as u64,
                version: *version,
                crc: *crc,
                tag: 0,
            };
            w.split(fields, data).unwrap();
        }
        w.finish().unwrap();
        let (h, body) = self.call(Op::WriteV, &out[HEADER_LEN..]);
        let mut got = Vec::new();
        wire::parse_vectored_reply(&h, &body, |st, s, _| {
            assert_eq!(
                s.cookie,
                5 + got.len() as u64,
                "reply entries in split order"
            );
            got.push((st, s.version))
        })
        .unwrap();
        assert_eq!(got.len(), splits.len());
        got
    }

    /// One READV split; returns its status, data and the version the node stored.
    pub fn read_split(&mut self, slab: u32, offset: u64, len: u32) -> (Status, Vec<u8>, u64) {
        let (st, data, version, _) = self.read_stamped(slab, offset, len);
        (st, data, version)
    }

    /// One READV split; returns its status, data and the version and checksum the node stored.
    pub fn read_stamped(
        &mut self,
        slab: u32,
        offset: u64,
        len: u32,
    ) -> (Status, Vec<u8>, u64, u32) {
        let (st, stamps, data) = self.read_run(slab, offset, len, 1);
        (st, data, stamps[0].0, stamps[0].1)
    }

    /// One READV run of `n` splits of `split_len` bytes; returns the run's status, every
    /// split's (version, crc) and the run's data.
    pub fn read_run(
        &mut self,
        slab: u32,
        offset: u64,
        split_len: u32,
        n: u32,
    ) -> (Status, Vec<(u64, u32)>, Vec<u8>) {
        let run = Run {
            slab,
            split_len,
            offset,
            n,
        };
        let mut out = Vec::new();
        let mut f = OpenRuns::begin(&mut out, Op::ReadV, 0).unwrap();
        f.read_run(&mut out, run, &mut (77..77 + u64::from(n)))
            .unwrap();
        let (h, body) = self.call(Op::ReadV, &out[HEADER_LEN..]);
        assert_eq!(h.status, Status::Ok);
        let mut runs = ReplyRuns::new(&body).unwrap();
        assert_eq!(runs.remaining(), 1);
        let got = runs.next_run().unwrap().unwrap();
        assert!(runs.next_run().unwrap().is_none());
        assert_eq!(got.n, n as usize);
        let stamps = (0..got.n)
            .map(|i| {
                let s = got.split(i);
                assert_eq!(s.cookie, 77 + i as u64);
                (s.version, s.crc)
            })
            .collect();
        (got.status, stamps, got.data().to_vec())
    }
}

/// Reads until the peer closes `s` (or 30 s pass); how long that took.
pub fn closed_after(s: &mut TcpStream) -> std::time::Duration {
    let t0 = std::time::Instant::now();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut b = [0u8; 256];
    loop {
        match s.read(&mut b) {
            Ok(0) | Err(_) => return t0.elapsed(),
            Ok(_) => {}
        }
    }
}

/// Writes `pages` pages, kills a node of range 0's group and waits for its slab to be
/// regenerated elsewhere (a node reading its sources), then kills two more original members
/// so that the regenerated slab must serve, and reads every page back.
pub fn regenerate_and_read_back(
    c: &mut EmbeddedCluster,
    mem: &hydramem::client::RemoteMemory,
    pages: u64,
) {
    use hydramem::PAGE_SIZE;
    for p in 0..pages {
        mem.write_page(p * PAGE_SIZE as u64, &[p as u8; PAGE_SIZE])
            .unwrap();
    }
    let g = mem.group_of(0).unwrap();
    c.kill(g.nodes[2] as usize).unwrap();
    wait_regenerated(mem, 1);
    let g2 = mem.group_of(0).unwrap();
    for n in original_members(&g, &g2, 10, 2) {
        c.kill(n as usize).unwrap();
    }
    let mut back = [0u8; PAGE_SIZE];
    for p in 0..pages {
        mem.read_page(p * PAGE_SIZE as u64, &mut back).unwrap();
        assert_eq!(back, [p as u8; PAGE_SIZE], "page {p}");
    }
}
