//! TLS on the node protocol against real node processes: a cluster's members (nodes, a
//! client, the tools) talk over TLS with certificates from the cluster's CA; a node
//! regenerates a lost slab over TLS to its sources; a plain peer and a member of another CA
//! get nothing from a node; TLS and the cluster key work together.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hydramem::auth::ClusterKey;
use hydramem::client::{ClientConfig, RemoteMemory};
use hydramem::embedded::{EmbeddedCluster, EmbeddedOptions};
use hydramem::rpc::Access;
use hydramem::tls::{self, Tls};
use hydramem::PAGE_SIZE;

use common::{HYDRA, SLAB};

const WAIT: Duration = Duration::from_secs(10);

/// A CA in `root`/ca and a member directory per name.
fn members(root: &Path, names: &[&str]) -> Vec<PathBuf> {
    tls::new_ca(&root.join("ca")).unwrap();
    names
        .iter()
        .map(|n| {
            let out = root.join(n);
            tls::issue(&root.join("ca"), n, &out).unwrap();
            out
        })
        .collect()
}

fn start(nodes: usize, tls_dir: &Path, key_file: Option<PathBuf>) -> EmbeddedCluster {
    EmbeddedCluster::start(EmbeddedOptions {
        etcd: None,
        binary: env!("CARGO_BIN_EXE_hydramem").into(),
        nodes,
        slab_size: SLAB,
        capacity: SLAB * 16,
        extra_args: vec!["--log".into(), common::test_log_level()],
        cluster_file: None,
        key_file,
        tls_dir: Some(tls_dir.to_path_buf()),
    })
    .expect("start memory nodes with TLS")
}

#[test]
fn members_work_over_tls_and_a_node_regenerates_over_it() {
    let d = tempfile::tempdir().unwrap();
    let m = members(d.path(), &["nodes", "client"]);
    let mut c = start(12, &m[0], None);
    // The client has a member directory of its own (another certificate of the same CA).
    let mut cluster = c.cluster().clone();
    cluster.tls = Some(Tls::load(&m[1]).unwrap());
    let pages = 256u64;
    let mem = RemoteMemory::connect(&cluster, ClientConfig::new(HYDRA, pages * PAGE_SIZE as u64))
        .unwrap();
    let st = hydramem::status::fetch(cluster.nodes[0].addr, &Access::of(&cluster), WAIT).unwrap();
    assert!(st.capacity > 0);
    // A node lost: another rebuilds its slab, reading its sources over TLS.
    common::regenerate_and_read_back(&mut c, &mem, pages);
}

#[test]
fn a_plain_peer_and_a_member_of_another_ca_get_nothing() {
    let d = tempfile::tempdir().unwrap();
    let m = members(d.path(), &["nodes"]);
    let c = start(10, &m[0], None);
    let addr = c.cluster().nodes[0].addr;
    // A plain HELLO: the node reads it as a broken TLS hello and closes; no frame comes back.
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.set_read_timeout(Some(WAIT)).unwrap();
    let mut hello = Vec::new();
    hydramem::wire::Hello {
        client: hydramem::wire::ClientId([1; 16]),
        flags: 0,
        nonce: [0; hydramem::auth::NONCE_LEN],
        instance: 1,
    }
    .put(&mut hello);
    let mut frame = Vec::new();
    let fb = hydramem::wire::FrameBuilder::begin(
        &mut frame,
        hydramem::wire::Op::Hello,
        false,
        hydramem::wire::Status::Ok,
        1,
    );
    frame.extend_from_slice(&hello);
    fb.finish(&mut frame).unwrap();
    raw.write_all(&frame).unwrap();
    let mut got = Vec::new();
    let _ = raw.read_to_end(&mut got);
    assert!(
        !got.starts_with(b"HYDM"),
        "a plain peer got a frame from a TLS node"
    );
    // A client without TLS, and one with a certificate of another CA: no node accepts them.
    let mut plain = c.cluster().clone();
    plain.tls = None;
    assert!(RemoteMemory::connect(&plain, ClientConfig::new(HYDRA, 1 << 20)).is_err());
    let other = tempfile::tempdir().unwrap();
    let o = members(other.path(), &["stranger"]);
    let mut stranger = c.cluster().clone();
    stranger.tls = Some(Tls::load(&o[0]).unwrap());
    assert!(RemoteMemory::connect(&stranger, ClientConfig::new(HYDRA, 1 << 20)).is_err());
    let e = hydramem::status::fetch(addr, &Access::of(&stranger), WAIT).unwrap_err();
    assert!(e.to_string().contains("TLS"), "{e}");
    // The cluster's own members still get in.
    hydramem::status::fetch(addr, &Access::of(c.cluster()), WAIT).unwrap();
}

#[test]
fn tls_and_the_cluster_key_work_together() {
    let d = tempfile::tempdir().unwrap();
    let m = members(d.path(), &["nodes"]);
    let key_path = d.path().join("cluster.key");
    ClusterKey::generate().save(&key_path).unwrap();
    let c = start(10, &m[0], Some(key_path));
    let mem = RemoteMemory::connect(c.cluster(), ClientConfig::new(HYDRA, 1 << 20)).unwrap();
    mem.write_page(0, &[5u8; PAGE_SIZE]).unwrap();
    let mut back = [0u8; PAGE_SIZE];
    mem.read_page(0, &mut back).unwrap();
    assert_eq!(back, [5u8; PAGE_SIZE]);
    // TLS without the key is not enough.
    let mut keyless = c.cluster().clone();
    keyless.key = None;
    assert!(RemoteMemory::connect(&keyless, ClientConfig::new(HYDRA, 1 << 20)).is_err());
}
