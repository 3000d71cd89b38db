//! A confused or hostile peer: every reproduction of issue 12 against real node processes.
//! Each ends in a clear error or a correct retry, with 0 lost and 0 wrong bytes.
//!
//! - a client reattached with a clock behind the stored versions, and a Stale reply: the write
//!   is written again past the stored version, never acknowledged as written;
//! - a version no write can pass: a clear error, never a silent loss;
//! - a node that answers with another operation's cookies, or heartbeats it was never sent:
//!   dropped and counted, nothing lands, the node is judged failed;
//! - requests that used to panic a node, leak its connection or blow up its memory;
//! - a second process with a running client's identity: refused by every node until the
//!   client is gone, never writing into its slabs.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{Raw, HYDRA, SLAB};
use hydramem::client::{ClientConfig, IoError, RemoteMemory, Resilience};
use hydramem::cluster::Cluster;
use hydramem::integrity;
use hydramem::wire::{
    self, ClientId, FrameBuilder, Header, Op, ReadReply, Regen, RegenSource, SplitFields, Status,
    HEADER_LEN, MAX_VERSION,
};

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

fn page(seed: u64) -> [u8; 4096] {
    let mut p = [0u8; 4096];
    for (i, b) in p.iter_mut().enumerate() {
        *b = (seed.wrapping_mul(31) as usize + i * 7) as u8;
    }
    p[..8].copy_from_slice(&seed.to_le_bytes());
    p
}

fn config(resilience: Resilience, id: ClientId) -> ClientConfig {
    let mut c = ClientConfig::new(resilience, 4 * SLAB);
    c.client_id = id;
    c
}

/// Polls `cond` (a counter or a state moving) for up to 20 s.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_stale_write_is_never_acknowledged_a_reattached_client_continues_past_the_stored_versions() {
    // The reproduction: write 'A' with the clock a day ahead, reconnect the same identity
    // with the real clock, write 'B' → reads 'B' (it used to read 'AAAAAAAA').
    let c = common::cluster(4, SLAB, 8);
    let id = ClientId::random();
    let rep = Resilience::Replication { copies: 2 };
    let a = [b'A'; 4096];
    {
        let mem = RemoteMemory::connect(c.cluster(), config(rep, id)).unwrap();
        mem.write_page(0, &a).unwrap();
        // What a client with its clock a day ahead stores: the page at a version a day in
        // the future, with the checksum bound to that version.
        let ahead = now_nanos() + 86_400_000_000_000;
        let g = mem.group_of(0).unwrap();
        for j in 0..2 {
            let mut raw = Raw::connect(c.cluster().nodes[g.nodes[j] as usize].addr);
            raw.hello(id);
            let crc = integrity::split_crc(&a, 0, 0, j, ahead);
            assert_eq!(raw.write_stamped(g.slabs[j], 0, &a, ahead, crc), Status::Ok);
        }
    }
    let mem = RemoteMemory::connect(c.cluster(), config(rep, id)).unwrap();
    mem.write_page(0, &[b'B'; 4096]).unwrap();
    let mut got = [0u8; 4096];
    mem.read_page(0, &mut got).unwrap();
    assert_eq!(got, [b'B'; 4096], "an acknowledged write was lost");
}

#[test]
fn a_stale_reply_carries_the_stored_version_and_the_client_writes_again_past_it() {
    let c = common::cluster(12, SLAB, 8);
    let id = ClientId::random();
    let mem = RemoteMemory::connect(c.cluster(), config(HYDRA, id)).unwrap();
    let addr = 5 * 4096;
    mem.write_page(addr, &page(1)).unwrap();
    // After this client connected, something with a faster clock wrote split 3 of the page.
    let g = mem.group_of(addr).unwrap();
    let offset = mem.layout().split_offset(5);
    let len = mem.layout().split_len;
    let ahead = now_nanos() + 3_600_000_000_000;
    let mut raw = Raw::connect(c.cluster().nodes[g.nodes[3] as usize].addr);
    raw.hello(id);
    assert_eq!(
        raw.write_reply(g.slabs[3], offset, &vec![0xEE; len], ahead, 0),
        (Status::Ok, ahead)
    );
    // An older write is refused as Stale and told the version stored.
    assert_eq!(
        raw.write_reply(g.slabs[3], offset, &vec![0xDD; len], ahead - 1, 0),
        (Status::Stale, ahead)
    );
    mem.write_page(addr, &page(2)).unwrap();
    assert!(mem.stats().stale_rewrites.load(Ordering::Relaxed) >= 1);
    let mut got = [0u8; 4096];
    mem.read_page(addr, &mut got).unwrap();
    assert_eq!(got, page(2));
    // The page now carries a version past the one that refused it, on every split.
    let (st, _, v) = raw.read_split(g.slabs[3], offset, len as u32);
    assert_eq!(st, Status::Ok);
    assert!(v > ahead, "split 3 still holds version {v} <= {ahead}");
    // Versions only grow: the next write of another page goes past it too.
    mem.write_page(0, &page(3)).unwrap();
    let (_, _, v0) = raw.read_split(g.slabs[3], 0, len as u32);
    assert!(v0 > v);
}

#[test]
fn a_version_no_write_can_pass_gives_a_clear_error_and_invalid_versions_are_refused() {
    let c = common::cluster(4, SLAB, 8);
    let id = ClientId::random();
    let rep = Resilience::Replication { copies: 2 };
    let mem = RemoteMemory::connect(c.cluster(), config(rep, id)).unwrap();
    mem.write_page(0, &page(1)).unwrap();
    let g = mem.group_of(0).unwrap();
    let mut raw = Raw::connect(c.cluster().nodes[g.nodes[0] as usize].addr);
    raw.hello(id);
    // Versions beyond the valid range (a pin no write could ever pass) and 0 are refused.
    for bad in [MAX_VERSION + 1, u64::MAX, 0] {
        assert_eq!(
            raw.write_reply(g.slabs[0], 0, &[1; 4096], bad, 0),
            (Status::BadRequest, 0)
        );
    }
    // The largest valid version pins the page: the client says so instead of acknowledging.
    assert_eq!(
        raw.write_reply(g.slabs[0], 0, &[1; 4096], MAX_VERSION, 0).0,
        Status::Ok
    );
    match mem.write_page(0, &page(2)) {
        Err(e @ IoError::VersionsExhausted { .. }) => {
            assert!(e.to_string().contains("hydramem free"), "{e}")
        }
        other => panic!("expected VersionsExhausted, got {other:?}"),
    }
}

/// How the hostile proxy in front of a node misbehaves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mischief {
    /// Before every WRITEV reply, a forged READV reply carrying the write's cookies.
    ForgeReads,
    /// Swallows heartbeats and answers each with a PING reply of id u64::MAX.
    FakePongs,
    /// Replaces the first READV reply with a header that does not parse (the client's
    /// owner, polling for that read, may be the one that reads it).
    GarbageRead,
}

/// Runs a proxy to `node` on a fresh port; returns its address. `forged` counts the frames
/// it made up, `accepted` the connections it took.
fn hostile_proxy(
    node: SocketAddr,
    mischief: Mischief,
    forged: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(client) = conn else { return };
            accepted.fetch_add(1, Ordering::Relaxed);
            let Ok(upstream) = TcpStream::connect(node) else {
                return;
            };
            let (c2, u2) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
            let (f, f2) = (forged.clone(), forged.clone());
            let to_client = Arc::new(std::sync::Mutex::new(client));
            let tc = to_client.clone();
            // Client → node: PINGs may be answered here instead.
            std::thread::spawn(move || {
                let (mut from, mut to) = (c2, upstream);
                while let Some((h, body)) = read_frame(&mut from) {
                    if mischief == Mischief::FakePongs && h.op == Op::Ping {
                        let mut out = Vec::new();
                        FrameBuilder::begin(&mut out, Op::Ping, true, Status::Ok, u64::MAX)
                            .finish(&mut out)
                            .unwrap();
                        let _ = tc.lock().unwrap().write_all(&out);
                        f.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    if write_frame(&mut to, &h, &body).is_err() {
                        return;
                    }
                }
            });
            // Node → client: forged READV replies ahead of WRITEV replies.
            std::thread::spawn(move || {
                let mut from = u2;
                while let Some((h, body)) = read_frame(&mut from) {
                    let mut out = Vec::new();
                    if mischief == Mischief::ForgeReads && h.op == Op::WriteV && h.reply {
                        out = forged_reads(&h, &body);
                        f2.fetch_add(1, Ordering::Relaxed);
                    }
                    if mischief == Mischief::GarbageRead
                        && h.op == Op::ReadV
                        && h.reply
                        && f2.fetch_add(1, Ordering::Relaxed) == 0
                    {
                        let _ = to_client.lock().unwrap().write_all(&[0xEE; HEADER_LEN]);
                        continue;
                    }
                    let mut frame = Vec::new();
                    frame.extend_from_slice(&h.encode());
                    frame.extend_from_slice(&body);
                    out.extend_from_slice(&frame);
                    if to_client.lock().unwrap().write_all(&out).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A READV reply frame with the cookies of a WRITEV reply, each a run of one split of junk.
fn forged_reads(h: &Header, body: &[u8]) -> Vec<u8> {
    let mut splits = Vec::new();
    wire::parse_vectored_reply(h, body, |_, s, _| {
        splits.push(SplitFields {
            cookie: s.cookie,
            version: s.version,
            ..SplitFields::default()
        })
    })
    .unwrap();
    let mut out = Vec::new();
    let mut reply = ReadReply::begin(&mut out, h);
    for s in &splits {
        reply.put_run(&mut out, Status::Ok, std::slice::from_ref(s), &[0x5A; 512]);
    }
    reply.finish(&mut out).unwrap();
    out
}

fn read_frame(s: &mut TcpStream) -> Option<(Header, Vec<u8>)> {
    let mut hb = [0u8; HEADER_LEN];
    s.read_exact(&mut hb).ok()?;
    let h = Header::parse(&hb).ok()?;
    let mut body = vec![0u8; h.body_len as usize];
    s.read_exact(&mut body).ok()?;
    Some((h, body))
}

fn write_frame(s: &mut TcpStream, h: &Header, body: &[u8]) -> std::io::Result<()> {
    let mut f = h.encode().to_vec();
    f.extend_from_slice(body);
    s.write_all(&f)
}

/// The cluster file with node 0 reached through a proxy.
fn behind_proxy(c: &Cluster, proxy: SocketAddr) -> Cluster {
    let mut c = c.clone();
    c.nodes[0].addr = proxy;
    c
}

#[test]
fn read_replies_carrying_write_cookies_are_dropped_counted_and_never_land() {
    // The reproduction: a READV reply with a write's cookie made read completion copy to
    // null + offset (`hydramem nbd` died with a segfault).
    // Exactly k + r nodes, so that every coding group has node 0 (behind the proxy) in it.
    let c = common::cluster(10, SLAB, 8);
    let forged = Arc::new(AtomicU64::new(0));
    let proxy = hostile_proxy(
        c.cluster().nodes[0].addr,
        Mischief::ForgeReads,
        forged.clone(),
        Arc::default(),
    );
    let cluster = behind_proxy(c.cluster(), proxy);
    let mut cfg = config(HYDRA, ClientId::random());
    // Every write waits for node 0's real reply, so each forged frame reaches an open write
    // (a write that left a late split behind would drop it as a late reply, uncounted).
    cfg.write_straggler_after = Duration::from_secs(3600);
    let mem = RemoteMemory::connect(&cluster, cfg).unwrap();
    let pages = 4 * SLAB / 4096;
    for p in 0..pages {
        mem.write_page(p * 4096, &page(p)).unwrap();
    }
    assert!(forged.load(Ordering::Relaxed) > 0, "node 0 took no write");
    for p in 0..pages {
        let mut got = [0u8; 4096];
        mem.read_page(p * 4096, &mut got).unwrap();
        assert_eq!(got, page(p), "page {p} read back wrong");
    }
    assert!(
        mem.foreign_replies() >= forged.load(Ordering::Relaxed),
        "{} foreign replies counted for {} forged frames",
        mem.foreign_replies(),
        forged.load(Ordering::Relaxed)
    );
}

#[test]
fn a_reply_that_does_not_parse_closes_its_connection_and_the_read_is_served_by_the_other_copy() {
    // Replication ×2 reads wait on one node: the owner reads that node's socket itself
    // (`client/tcp/receive.rs`), so the garbage is met by the owner or by the receiver
    // thread, whichever reads first. Either way the connection is closed (and reopened:
    // the proxy sees a second connection), the read is answered by the other copy, and no
    // byte is wrong.
    let c = common::cluster(4, SLAB, 8);
    let (garbage, accepted) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let proxy = hostile_proxy(
        c.cluster().nodes[0].addr,
        Mischief::GarbageRead,
        garbage.clone(),
        accepted.clone(),
    );
    let cluster = behind_proxy(c.cluster(), proxy);
    let rep2 = Resilience::Replication { copies: 2 };
    let mem = RemoteMemory::connect(&cluster, config(rep2, ClientId::random())).unwrap();
    let pages = 2 * SLAB / 4096;
    for p in 0..pages {
        mem.write_page(p * 4096, &page(p)).unwrap();
    }
    for p in 0..pages {
        let mut got = [0u8; 4096];
        mem.read_page(p * 4096, &mut got).unwrap();
        assert_eq!(got, page(p), "page {p} read back wrong");
    }
    assert!(garbage.load(Ordering::Relaxed) > 0, "node 0 served no read");
    // The broken connection was closed and the node reconnected through the proxy.
    eventually("node 0 reconnected", || {
        accepted.load(Ordering::Relaxed) >= 2 && mem.transport().is_up(0)
    });
    for p in 0..pages {
        let mut got = [0u8; 4096];
        mem.read_page(p * 4096, &mut got).unwrap();
        assert_eq!(
            got,
            page(p),
            "page {p} read back wrong after the reconnection"
        );
    }
}

#[test]
fn a_node_that_answers_heartbeats_it_was_never_sent_is_judged_failed() {
    // The reproduction: a PING reply with id u64::MAX used to satisfy heartbeats forever.
    let c = common::cluster(12, SLAB, 8);
    let forged = Arc::new(AtomicU64::new(0));
    let proxy = hostile_proxy(
        c.cluster().nodes[0].addr,
        Mischief::FakePongs,
        forged.clone(),
        Arc::default(),
    );
    let cluster = behind_proxy(c.cluster(), proxy);
    let mem = RemoteMemory::connect(&cluster, config(HYDRA, ClientId::random())).unwrap();
    eventually("node 0 judged failed", || !mem.transport().is_up(0));
    assert!(forged.load(Ordering::Relaxed) > 0);
}

#[test]
fn a_node_that_says_it_is_another_node_is_not_used_as_that_node() {
    let c = common::cluster(12, SLAB, 8);
    let mut cluster = c.cluster().clone();
    // Nodes 0 and 1 swapped in the file: each answers with the other's id.
    let (a0, a1) = (cluster.nodes[0].addr, cluster.nodes[1].addr);
    cluster.nodes[0].addr = a1;
    cluster.nodes[1].addr = a0;
    let mem = RemoteMemory::connect(&cluster, config(HYDRA, ClientId::random())).unwrap();
    assert!(!mem.transport().is_up(0) && !mem.transport().is_up(1));
    mem.write_page(0, &page(9)).unwrap();
    let g = mem.group_of(0).unwrap();
    assert!(!g.nodes[..10].contains(&0) && !g.nodes[..10].contains(&1));
}

#[test]
fn no_request_panics_a_node_or_leaks_its_connection() {
    // The reproduction: on a slab of 1-byte splits, WRITEV at offset 2^64 - 1 overflowed the
    // slot arithmetic and panicked the connection's thread, which then leaked its socket and
    // its count (64 of them: STATS said 64 clients with none connected). Since protocol 4 a
    // run that reaches past 2^64 is malformed (its connection is closed); the largest offsets
    // that do not are out of the slab's range.
    let c = common::cluster(1, SLAB, 4);
    let addr = c.cluster().nodes[0].addr;
    for _ in 0..64 {
        let mut raw = Raw::connect(addr);
        raw.hello(ClientId::random());
        let slab = raw.alloc(1);
        let (st, stored) = raw.write_reply(slab, u64::MAX - 1, &[1], 5, 0);
        assert_eq!((st, stored), (Status::OutOfRange, 0));
        // The connection is still served.
        assert_eq!(raw.read_split(slab, 0, 1).0, Status::Ok);
        assert_eq!(raw.call(Op::Free, &slab.to_le_bytes()).0.status, Status::Ok);
        // A run from offset 2^64 - 1: malformed, that connection is closed.
        raw.s.write_all(&writev_run_from(u64::MAX)).unwrap();
        let mut b = [0u8; 1];
        assert_eq!(raw.s.read(&mut b).unwrap_or(0), 0, "connection not closed");
    }
    eventually("every connection uncounted", || {
        hydramem::status::fetch(addr, &hydramem::rpc::Access::open(), Duration::from_secs(5))
            .map(|s| s.clients == 0)
            .unwrap_or(false)
    });
    // Splits longer than a node serves are refused at ALLOC.
    let mut raw = Raw::connect(addr);
    raw.hello(ClientId::random());
    let body = [&1u64.to_le_bytes()[..], &(1u32 << 20).to_le_bytes()].concat();
    assert_eq!(raw.call(Op::Alloc, &body).0.status, Status::BadRequest);
}

/// A WRITEV frame of one run of one 1-byte split at `offset`, written byte by byte (a sender
/// that keeps the bounds cannot build it when the run reaches past 2^64).
fn writev_run_from(offset: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let fb = FrameBuilder::begin(&mut out, Op::WriteV, false, Status::Ok, 7);
    for v in [1u32, 0, 1] {
        out.extend_from_slice(&v.to_le_bytes()); // count 1, slab 0, split_len 1
    }
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes()); // n
    out.extend_from_slice(&[0; 8]); // cookie
    out.extend_from_slice(&5u64.to_le_bytes()); // version
    out.extend_from_slice(&[0; 4]); // crc
    out.push(1); // data
    fb.finish(&mut out).unwrap();
    out
}

fn regen(client: ClientId, slab: u32, split_len: u32, pages: u64, sources: &[u32]) -> Vec<u8> {
    let req = Regen {
        client,
        k: 2,
        r: 1,
        target: 2,
        split_len,
        slab,
        pages,
        range: 0,
        checksums: false,
        sources: sources
            .iter()
            .enumerate()
            .map(|(i, &node)| RegenSource {
                split: i as u8,
                copy: false,
                slab: 1,
                node,
            })
            .collect(),
    };
    let mut b = Vec::new();
    req.put(&mut b);
    b
}

#[test]
fn regen_is_checked_against_the_slab_and_the_membership_before_it_allocates_or_connects() {
    let c = common::cluster(3, SLAB, 4);
    let addr = c.cluster().nodes[0].addr;
    let id = ClientId::random();
    let mut raw = Raw::connect(addr);
    raw.hello(id);
    let slab = raw.alloc(512);
    let rss = || {
        hydramem::status::fetch(addr, &hydramem::rpc::Access::open(), Duration::from_secs(5))
            .unwrap()
            .rss
    };
    let before = rss();
    // The reproduction: a ~200-byte REGEN whose split length is not the slab's took a node
    // from 5.5 MB to 1.05 GB resident.
    let (h, _) = raw.call(Op::Regen, &regen(id, slab, 64 << 20, 1 << 20, &[1, 2]));
    assert_eq!(h.status, Status::BadRequest);
    // More pages than the slab holds.
    let (h, _) = raw.call(Op::Regen, &regen(id, slab, 512, SLAB / 512 + 1, &[1, 2]));
    assert_eq!(h.status, Status::BadRequest);
    // A source that is not a member: the node never connects where a request says.
    let (h, _) = raw.call(Op::Regen, &regen(id, slab, 512, 16, &[1, 999]));
    assert_eq!(h.status, Status::BadRequest);
    assert!(
        rss() < before + (64 << 20),
        "REGEN grew the node from {before} to {} bytes",
        rss()
    );
    // More sources than k + r: a malformed frame, that connection only is closed.
    raw.s
        .write_all(&{
            let mut out = Vec::new();
            let fb = FrameBuilder::begin(&mut out, Op::Regen, false, Status::Ok, 99);
            out.extend_from_slice(&regen(id, slab, 512, 16, &[1, 2, 1, 2]));
            fb.finish(&mut out).unwrap();
            out
        })
        .unwrap();
    let mut b = [0u8; 1];
    assert_eq!(raw.s.read(&mut b).unwrap_or(0), 0, "connection not closed");
    assert!(
        hydramem::status::fetch(addr, &hydramem::rpc::Access::open(), Duration::from_secs(5))
            .is_ok()
    );
    // A well-formed REGEN from members works (here: nothing written, 0 pages rebuilt).
    let mut raw = Raw::connect(addr);
    raw.hello(id);
    let target = raw.alloc(512);
    let mut srcs = Vec::new();
    for n in 1..3 {
        let mut r = Raw::connect(c.cluster().nodes[n].addr);
        r.hello(id);
        srcs.push(r.alloc(512));
    }
    let req = Regen {
        client: id,
        k: 2,
        r: 1,
        target: 2,
        split_len: 512,
        slab: target,
        pages: 16,
        range: 0,
        checksums: false,
        sources: (0..2)
            .map(|i| RegenSource {
                split: i as u8,
                copy: false,
                slab: srcs[i],
                node: c.cluster().nodes[i + 1].id,
            })
            .collect(),
    };
    let mut body = Vec::new();
    req.put(&mut body);
    let (h, reply) = raw.call(Op::Regen, &body);
    assert_eq!(h.status, Status::Ok);
    assert_eq!(reply, 0u64.to_le_bytes());
}

/// A second process that uses a running client's identity (a `--client-id` started twice by
/// mistake) would take the client's splits for its own and write into them. Every node
/// refuses it while the client's connections are open, and the client's data is untouched;
/// once the client is gone, the identity is the next process's.
#[test]
fn a_second_process_with_a_running_clients_identity_is_refused_until_the_client_is_gone() {
    let c = common::cluster(4, SLAB, 8);
    let id = ClientId::random();
    let rep = Resilience::Replication { copies: 2 };
    let mem = RemoteMemory::connect(c.cluster(), config(rep, id)).unwrap();
    mem.write_page(0, &page(1)).unwrap();
    let other = hydramem::rpc::process_instance() ^ 1;
    for n in &c.cluster().nodes {
        let mut raw = Raw::connect(n.addr);
        assert_eq!(raw.hello_as(id, other), Status::IdentityInUse, "{}", n.addr);
        // ... and closed that connection.
        raw.s
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        assert_eq!(raw.s.read(&mut [0u8; 1]).unwrap(), 0, "{}", n.addr);
    }
    // A client of that other process is refused with the way out.
    let mut second = config(rep, id);
    second.instance = other;
    let e = RemoteMemory::connect(c.cluster(), second.clone())
        .err()
        .expect("refused");
    let text = e.to_string();
    assert!(
        text.contains("another process holds this client identity") && text.contains("--client-id"),
        "{text}"
    );
    let mut got = [0u8; 4096];
    mem.read_page(0, &mut got).unwrap();
    assert_eq!(got, page(1));
    // The client is gone: the next process takes the identity and finds the data.
    drop(mem);
    let next = RemoteMemory::connect(c.cluster(), second).unwrap();
    next.read_page(0, &mut got).unwrap();
    assert_eq!(got, page(1), "the identity's data, for its next process");
}

/// `hydramem free` while a process holds the identity on one node only (it has no connection
/// to the others just then): nothing is released anywhere, and every node says why.
#[test]
fn a_release_refused_by_one_node_releases_nothing_on_the_others() {
    let c = common::cluster(3, SLAB, 8);
    let id = ClientId::random();
    let mut kept = Raw::connect(c.cluster().nodes[1].addr);
    assert_eq!(kept.hello_as(id, 7), Status::Ok);
    let slab = kept.alloc(512);
    drop(kept);
    let mut holder = Raw::connect(c.cluster().nodes[0].addr);
    assert_eq!(holder.hello_as(id, 7), Status::Ok);
    let report = hydramem::release::release(c.cluster(), id, Duration::from_secs(5));
    assert!(
        report
            .iter()
            .all(|n| n.result.as_ref().is_err_and(|e| e.in_use())),
        "{report:?}"
    );
    assert!(report[0]
        .result
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("in use by another process"));
    assert!(report[1]
        .result
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("another node says"));
    // Node 1 still holds the slab (asked as the holding process, which is not refused once
    // the node has seen the release's own connection close).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut look = loop {
        let mut r = Raw::connect(c.cluster().nodes[1].addr);
        match r.hello_as(id, 7) {
            Status::Ok => break r,
            Status::IdentityInUse if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            st => panic!("node 1 answered the holding process {st:?}"),
        }
    };
    assert!(
        look.list().iter().any(|l| l.slab == slab),
        "released on a node that admitted it"
    );
    drop((holder, look));
    // Once the holder has gone, the identity is released everywhere.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let report = hydramem::release::release(c.cluster(), id, Duration::from_secs(5));
        if report.iter().all(|n| n.result.is_ok()) {
            assert_eq!(
                report
                    .iter()
                    .map(|n| *n.result.as_ref().unwrap())
                    .sum::<u64>(),
                1
            );
            break;
        }
        assert!(Instant::now() < deadline, "{report:?}");
    }
}
