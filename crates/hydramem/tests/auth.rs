//! The cluster key against real node processes: a client with the key works and the nodes
//! never see its identity; a peer without it is refused every operation; a wrong key is
//! refused and disconnected; no silent downgrade either way; DRAIN and FAULT need an
//! operator; quotas refuse the slab too many; a lease frees a vanished client's slabs.

mod common;

use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hydramem::auth::{ClusterKey, AUTH_HMAC};
use hydramem::client::{ClientConfig, RemoteMemory};
use hydramem::embedded::{EmbeddedCluster, EmbeddedOptions};
use hydramem::rpc::{self, Access, Connection, Greeting};
use hydramem::wire::{
    self, ClientId, CorruptCause, CorruptReport, Fault, Hello, HelloReply, Op, OpenRuns, Regen,
    RegenSource, Run, SplitFields, Status, HEADER_LEN,
};
use hydramem::PAGE_SIZE;

use common::{Raw, HYDRA, SLAB};

const WAIT: Duration = Duration::from_secs(10);

/// A key file in a fresh directory (kept alive by the returned guard).
fn key_file() -> (tempfile::TempDir, PathBuf, ClusterKey) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.key");
    let key = ClusterKey::generate();
    key.save(&path).unwrap();
    (dir, path, key)
}

fn start(nodes: usize, key_file: Option<PathBuf>, extra: &[&str]) -> EmbeddedCluster {
    let mut extra_args: Vec<String> = vec!["--log".into(), common::test_log_level()];
    extra_args.extend(extra.iter().map(|s| s.to_string()));
    EmbeddedCluster::start(EmbeddedOptions {
        etcd: None,
        binary: env!("CARGO_BIN_EXE_hydramem").into(),
        nodes,
        slab_size: SLAB,
        capacity: SLAB * 16,
        extra_args,
        cluster_file: None,
        key_file,
        tls_dir: None,
    })
    .expect("start memory nodes")
}

#[test]
fn a_client_with_the_key_works_and_the_nodes_see_only_its_owner_handle() {
    let (_d, path, key) = key_file();
    let c = start(10, Some(path), &[]);
    assert_eq!(c.cluster().key.as_ref(), Some(&key));
    let mut config = ClientConfig::new(HYDRA, 64 * PAGE_SIZE as u64);
    let id = config.client_id;
    config.checksums = true;
    let mem = RemoteMemory::connect(c.cluster(), config).unwrap();
    mem.write_page(0, &[7u8; PAGE_SIZE]).unwrap();
    let mut back = [0u8; PAGE_SIZE];
    mem.read_page(0, &mut back).unwrap();
    assert_eq!(back, [7u8; PAGE_SIZE]);
    let st =
        hydramem::status::fetch(c.cluster().nodes[0].addr, &Access::key(Some(&key)), WAIT).unwrap();
    let owners: Vec<u32> = st.slabs.iter().map(|s| s.owner).collect();
    assert!(!owners.is_empty());
    assert!(owners.iter().all(|&o| o == key.owner(&id).fingerprint()));
    assert_eq!(mem.owner(), key.owner(&id));
    assert!(
        !owners.contains(&id.fingerprint()),
        "a node saw the client's identity"
    );
}

/// A minimal well-formed body of every operation but HELLO and AUTH.
fn body_of(op: Op) -> Vec<u8> {
    let mut b = Vec::new();
    match op {
        Op::Ping | Op::Stats | Op::List | Op::Reclaims => {}
        Op::Alloc => wire::put_alloc(&mut b, 1, 512),
        Op::Free => wire::put_free(&mut b, 1),
        Op::Discard => wire::put_discard(&mut b, 1, 0, 1),
        Op::Stamps => wire::put_stamps(&mut b, 1, 0, 1),
        Op::Drain => wire::put_drain(&mut b, true),
        Op::Fault => Fault::Clear.put(&mut b),
        Op::Corrupt => wire::put_corrupt(
            &mut b,
            &[CorruptReport {
                slab: 1,
                splits: 1,
                cause: CorruptCause::Checksum,
            }],
        ),
        Op::Regen => Regen {
            client: ClientId([1; 16]),
            k: 1,
            r: 1,
            target: 1,
            split_len: 512,
            slab: 1,
            pages: 1,
            range: 0,
            checksums: false,
            sources: vec![RegenSource {
                split: 0,
                copy: true,
                slab: 2,
                node: 0,
            }],
        }
        .put(&mut b),
        Op::WriteV | Op::ReadV => {
            let run = Run {
                slab: 1,
                split_len: 512,
                offset: 0,
                n: 1,
            };
            let mut out = Vec::new();
            let mut f = OpenRuns::begin(&mut out, op, 0).unwrap();
            if op == Op::WriteV {
                let mut w = f.write_run(&mut out, run).unwrap();
                w.split(SplitFields::default(), &[1u8; 512]).unwrap();
                w.finish().unwrap();
            } else {
                f.read_run(&mut out, run, &mut (1..2)).unwrap();
            }
            b.extend_from_slice(&out[HEADER_LEN..]);
        }
        Op::Hello | Op::Auth => unreachable!("not asked"),
    }
    b
}

fn hello_body(flags: u32) -> Vec<u8> {
    let mut b = Vec::new();
    Hello {
        client: ClientId([3; 16]),
        flags,
        nonce: [4; hydramem::auth::NONCE_LEN],
        instance: 1,
    }
    .put(&mut b);
    b
}

#[test]
fn a_peer_without_the_key_is_refused_every_operation() {
    let (_d, path, _key) = key_file();
    let c = start(1, Some(path), &["--allow-fault-injection"]);
    let addr = c.cluster().nodes[0].addr;
    let ops = Op::ALL
        .into_iter()
        .filter(|op| !matches!(op, Op::Hello | Op::Auth));
    for op in ops {
        // Before HELLO, and after a HELLO with no AUTH (the reply asks for it), alike.
        for hello_first in [false, true] {
            let mut raw = Raw::connect(addr);
            if hello_first {
                let (h, body) = raw.call(Op::Hello, &hello_body(0));
                assert_eq!(h.status, Status::Ok);
                assert_eq!(HelloReply::parse(&body).unwrap().auth, AUTH_HMAC);
            }
            let (h, _) = raw.call(op, &body_of(op));
            assert_eq!(
                h.status,
                Status::NotIdentified,
                "{op:?} without the key (HELLO first: {hello_first}) was not refused"
            );
        }
    }
    // A client with another key refuses the node's proof before it proves anything.
    let e = hydramem::status::fetch(addr, &Access::key(Some(&ClusterKey::generate())), WAIT)
        .unwrap_err();
    assert!(
        e.to_string().contains("proof of the cluster key is wrong"),
        "{e}"
    );
}

#[test]
fn a_wrong_proof_is_refused_and_the_connection_closed() {
    let (_d, path, _key) = key_file();
    let c = start(1, Some(path), &[]);
    let mut raw = Raw::connect(c.cluster().nodes[0].addr);
    let (h, _) = raw.call(Op::Hello, &hello_body(0));
    assert_eq!(h.status, Status::Ok);
    let mut proof = Vec::new();
    wire::put_auth(&mut proof, &[0x5A; hydramem::auth::PROOF_LEN]);
    let (h, _) = raw.call(Op::Auth, &proof);
    assert_eq!(h.status, Status::Unauthenticated);
    let mut rest = Vec::new();
    assert_eq!(
        raw.s.read_to_end(&mut rest).unwrap(),
        0,
        "the node closed the connection"
    );
}

#[test]
fn there_is_no_silent_downgrade_either_way() {
    let (_d, path, key) = key_file();
    let keyed = start(1, Some(path), &[]);
    let open = start(1, None, &[]);
    let e = hydramem::status::fetch(
        keyed.cluster().nodes[0].addr,
        &hydramem::rpc::Access::open(),
        WAIT,
    )
    .unwrap_err();
    assert!(e.to_string().contains("requires the cluster key"), "{e}");
    let e = hydramem::status::fetch(
        open.cluster().nodes[0].addr,
        &hydramem::rpc::Access::key(Some(&key)),
        WAIT,
    )
    .unwrap_err();
    assert!(e.to_string().contains("runs without a cluster key"), "{e}");
}

#[test]
fn drain_and_fault_need_an_operator() {
    let (_d, path, key) = key_file();
    let c = start(1, Some(path), &["--allow-fault-injection"]);
    let addr = c.cluster().nodes[0].addr;
    // An authenticated client that is not an operator.
    let client = Greeting::client(&ClientId::random(), 0, Some(&key));
    let mut conn = Connection::open(addr, Some(&client), WAIT, WAIT).unwrap();
    for op in [Op::Drain, Op::Fault] {
        let e = conn.request(op, &body_of(op)).unwrap_err();
        assert_eq!(e.refused(), Some(Status::Unauthenticated), "{op:?}: {e}");
    }
    // The operator's greeting may.
    rpc::inject(
        addr,
        Fault::Clear,
        &hydramem::rpc::Access::key(Some(&key)),
        WAIT,
    )
    .unwrap();
    hydramem::status::drain(addr, true, &hydramem::rpc::Access::key(Some(&key)), WAIT).unwrap();
    assert!(
        hydramem::status::fetch(addr, &hydramem::rpc::Access::key(Some(&key)), WAIT)
            .unwrap()
            .draining
    );
}

#[test]
fn an_identity_gets_its_quota_and_a_vanished_one_loses_its_slabs_after_its_lease() {
    let c = start(
        1,
        None,
        &["--quota", "2", "--lease", "1s", "--control-period", "100ms"],
    );
    let addr = c.cluster().nodes[0].addr;
    let slabs = || {
        hydramem::status::fetch(addr, &hydramem::rpc::Access::open(), WAIT)
            .unwrap()
            .slabs
            .len()
    };
    let mut a = Raw::connect(addr);
    a.hello(ClientId([1; 16]));
    a.alloc(512);
    a.alloc(512);
    let (h, _) = a.call(Op::Alloc, &body_of(Op::Alloc));
    assert_eq!(
        h.status,
        Status::OverQuota,
        "the third slab of one identity"
    );
    // Another identity has a quota of its own.
    let mut b = Raw::connect(addr);
    b.hello(ClientId([2; 16]));
    b.alloc(512);
    assert_eq!(slabs(), 3);
    // While a connection is open, the lease holds; once `a` closes, its slabs go after 1 s.
    drop(a);
    let t0 = Instant::now();
    while slabs() != 1 {
        assert!(
            t0.elapsed() < WAIT,
            "the lease of a vanished identity never ran out"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // `b` is still connected: its slab stays.
    let (h, body) = b.call(Op::List, &[]);
    assert_eq!(h.status, Status::Ok);
    assert_eq!(wire::parse_list(&body).unwrap().len(), 1);
}

#[test]
fn a_keyed_cluster_regenerates_a_lost_slab_node_to_node() {
    // The regenerating node reads its sources as the client's owner handle, proving its own
    // key to each of them.
    let (_d, path, _key) = key_file();
    let mut c = start(12, Some(path), &[]);
    let pages = 256u64;
    let mem = RemoteMemory::connect(
        c.cluster(),
        ClientConfig::new(HYDRA, pages * PAGE_SIZE as u64),
    )
    .unwrap();
    common::regenerate_and_read_back(&mut c, &mem, pages);
}

#[test]
fn with_a_key_a_second_process_is_refused_the_identity_at_auth_and_told_why() {
    // The refusal of a held identity comes at AUTH on a keyed node: it must read as an
    // identity in use, not as a key mismatch.
    let (_d, path, key) = key_file();
    let c = start(1, Some(path), &[]);
    let addr = c.cluster().nodes[0].addr;
    let id = ClientId::random();
    let holder = Greeting::client(&id, 0, Some(&key)).with_instance(1);
    let _held = Connection::open(addr, Some(&holder), WAIT, WAIT).unwrap();
    let second = Greeting::client(&id, 0, Some(&key)).with_instance(2);
    let e = Connection::open(addr, Some(&second), WAIT, WAIT).unwrap_err();
    assert!(e.in_use(), "{e}");
    assert!(e.to_string().contains("in use by another process"), "{e}");
    // Its own second connection is welcome.
    Connection::open(addr, Some(&holder), WAIT, WAIT).unwrap();
}
