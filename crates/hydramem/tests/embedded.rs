//! The embedded cluster's membership file: every node it starts, and every node it restarts,
//! is given `--cluster FILE`, and that file lists every node's announced address by the time
//! `start` returns. Without a file from the caller it lives in a private directory that is
//! removed with the cluster; a caller's file is written where asked and left in place.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use hydramem::cluster::Cluster;
use hydramem::embedded::{EmbeddedCluster, EmbeddedOptions};

/// The `--cluster` argument of a running process.
fn cluster_arg(pid: u32) -> PathBuf {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let args: Vec<&[u8]> = raw.split(|&b| b == 0).collect();
    let at = args
        .iter()
        .position(|a| *a == b"--cluster")
        .unwrap_or_else(|| panic!("node {pid} has no --cluster: {args:?}"));
    PathBuf::from(String::from_utf8(args[at + 1].to_vec()).unwrap())
}

/// Starts `nodes` nodes that are given `file` as their cluster file.
fn start_with_file(
    nodes: usize,
    file: PathBuf,
) -> Result<EmbeddedCluster, hydramem::embedded::EmbeddedError> {
    EmbeddedCluster::start(EmbeddedOptions {
        etcd: None,
        binary: env!("CARGO_BIN_EXE_hydramem").into(),
        nodes,
        slab_size: common::SLAB,
        capacity: 4 * common::SLAB,
        extra_args: vec!["--log".into(), common::test_log_level()],
        cluster_file: Some(file),
        key_file: None,
        tls_dir: None,
    })
}

fn assert_every_node_reads(c: &EmbeddedCluster, file: &Path) {
    for i in 0..c.len() {
        assert_eq!(cluster_arg(c.pid(i).unwrap()), file, "node {i}");
    }
}

#[test]
fn nodes_get_a_private_cluster_file_that_goes_with_the_cluster() {
    let mut c = common::cluster(3, common::SLAB, 4);
    let file = c.cluster_file().to_path_buf();
    assert!(file.is_absolute(), "{}", file.display());
    assert_eq!(&Cluster::load(&file).unwrap(), c.cluster());
    let dir = file.parent().unwrap().to_path_buf();
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "{} is not private", dir.display());
    assert_every_node_reads(&c, &file);
    c.restart(1).unwrap();
    assert_every_node_reads(&c, &file);
    drop(c);
    assert!(!dir.exists(), "{} left behind", dir.display());
}

#[test]
fn a_callers_cluster_file_is_written_and_kept() {
    let dir = std::env::temp_dir().join(format!("hm-embedded-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("members.toml");
    let c = start_with_file(2, file.clone()).unwrap();
    assert_eq!(c.cluster_file(), file);
    assert_eq!(&Cluster::load(&file).unwrap(), c.cluster());
    assert_every_node_reads(&c, &file);
    // A copy elsewhere, for callers that want one.
    let copy = dir.join("copy.toml");
    c.write_cluster_file(&copy).unwrap();
    assert_eq!(&Cluster::load(&copy).unwrap(), c.cluster());
    drop(c);
    assert!(file.exists(), "the caller's cluster file was removed");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_cluster_file_that_cannot_be_written_is_a_clear_error() {
    let file = PathBuf::from("/nonexistent-hydramem-dir/cluster.toml");
    let e = start_with_file(1, file)
        .err()
        .expect("start wrote a cluster file where none can be");
    let e = e.to_string();
    assert!(
        e.contains("cannot write cluster file /nonexistent-hydramem-dir/cluster.toml")
            && e.contains("they were stopped"),
        "{e}"
    );
}
