//! A few seeded fault runs (the soak runs many: `scripts/soak`): nodes killed, paused,
//! restarted and slowed at random, never more than r at once, under a write-heavy workload;
//! not one acknowledged write may be lost and no read may return bytes nobody wrote; also with
//! the key and TLS, and with membership on etcd.

use std::time::Duration;

use hydramem::client::Resilience;
use hydramem::faultrun::{run, FaultRunOptions, FaultRunReport, HYDRA_8_2};

/// One seeded run; nothing may be lost, wrong or failed, and span must have compacted.
fn run_seed(seed: u64, corruption: bool, scheme: Resilience) -> FaultRunReport {
    run_secured(seed, corruption, scheme, None, None, None)
}

/// [`run_seed`] with a cluster key file and a TLS member directory for nodes and client.
fn run_secured(
    seed: u64,
    corruption: bool,
    scheme: Resilience,
    key_file: Option<std::path::PathBuf>,
    tls_dir: Option<std::path::PathBuf>,
    etcd: Option<hydramem::membership::EtcdConfig>,
) -> FaultRunReport {
    let report = run(&FaultRunOptions {
        binary: env!("CARGO_BIN_EXE_hydramem").into(),
        seed,
        nodes: 12,
        threads: 6,
        pages: 3072,
        slab_size: 1 << 20,
        duration: Duration::from_secs(3),
        max_faults: 2,
        corruption,
        scheme,
        key_file,
        tls_dir,
        etcd,
    })
    .unwrap();
    eprintln!("{}", serde_json::to_string(&report).unwrap());
    assert!(
        !report.faults.is_empty(),
        "seed {seed}: no fault was injected"
    );
    assert!(
        report.acked_writes > 200,
        "seed {seed}: too little work: {report:?}"
    );
    assert_eq!(report.wrong_reads, 0, "seed {seed}: {report:?}");
    assert_eq!(report.lost_writes, 0, "seed {seed}: {report:?}");
    assert_eq!(report.failed_writes, 0, "seed {seed}: {report:?}");
    assert_eq!(report.read_errors, 0, "seed {seed}: {report:?}");
    assert_eq!(
        report.compacted_pages > 0,
        matches!(scheme, Resilience::Span { .. }),
        "seed {seed}: span compacts under the faults: {report:?}"
    );
    report
}

/// Runs the seeds (see [`run_seed`]). With `corruption`, corrupting nodes are among the
/// faults and corrupted splits must have been met (and read around) in every run.
fn runs_lose_nothing(seeds: &[u64], corruption: bool, scheme: Resilience) {
    let mut evacuated = 0;
    for &seed in seeds {
        let report = run_seed(seed, corruption, scheme);
        assert_eq!(
            report.corrupt_splits > 0,
            corruption,
            "seed {seed}: corrupted splits met: {report:?}"
        );
        evacuated += report.evacuated;
    }
    // A fifth of a corrupting node's replies is far above the slab-regeneration limit: the
    // client moved splits off such nodes while the checker watched every byte.
    assert_eq!(
        evacuated > 0,
        corruption,
        "splits moved off corrupting nodes"
    );
}

#[test]
fn seeded_fault_runs_lose_nothing() {
    runs_lose_nothing(&[1, 2, 3], false, HYDRA_8_2);
}

/// Span coding under the same chaos: rows written, compacted and regenerated while nodes are
/// killed, paused, restarted and slowed; nothing lost, nothing wrong.
#[test]
fn seeded_span_fault_runs_lose_nothing() {
    runs_lose_nothing(&[21, 22], false, Resilience::Span { k: 8, r: 2 });
}

/// The same chaos with corrupting nodes among the faults and checksums on: corrupted splits
/// are met and read around, the error limits move splits off the corrupting nodes, and the
/// checker finds no wrong byte and no lost write.
#[test]
fn seeded_fault_runs_with_corruption_return_no_wrong_bytes() {
    runs_lose_nothing(&[11, 12], true, HYDRA_8_2);
}

/// Span coding with corrupting and misdirecting nodes among the faults: a corrupted page (or
/// parity piece) is caught by its checksum and decoded around from the rest of its row;
/// nothing wrong, nothing lost. Whether a run meets corruption depends on where the fault
/// schedule lands (a span read asks one node), so it is required of the seeds together.
#[test]
fn seeded_span_fault_runs_with_corruption_return_no_wrong_bytes() {
    let met: u64 = [31, 32, 33]
        .iter()
        .map(|&seed| run_seed(seed, true, Resilience::Span { k: 8, r: 2 }).corrupt_splits)
        .sum();
    assert!(met > 0, "no run met a corrupted piece");
}

/// The same chaos on a cluster with the cluster key and TLS on every connection (the
/// client's data path, the fault injector's operator connections, the nodes' regeneration
/// reads): nothing lost, nothing wrong.
#[test]
fn seeded_fault_runs_with_the_key_and_tls_lose_nothing() {
    let d = tempfile::tempdir().unwrap();
    let key = d.path().join("cluster.key");
    hydramem::auth::ClusterKey::generate().save(&key).unwrap();
    hydramem::tls::new_ca(&d.path().join("ca")).unwrap();
    hydramem::tls::issue(&d.path().join("ca"), "soak", &d.path().join("member")).unwrap();
    // run_secured checks the run: faults injected, work done, 0 lost, 0 wrong, 0 failed.
    run_secured(
        41,
        false,
        HYDRA_8_2,
        Some(key),
        Some(d.path().join("member")),
        None,
    );
}

/// The same chaos with membership on etcd (leases of 2 s): killed and paused nodes also
/// leave the membership, restarted ones register again, and the client suspects and verifies
/// them as they come and go: nothing lost, nothing wrong.
#[test]
fn seeded_fault_runs_with_etcd_membership_lose_nothing() {
    let etcd = hydramem::membership::server::EtcdServer::start()
        .expect("etcd (scripts/setup installs etcd-server)");
    run_secured(43, false, HYDRA_8_2, None, None, Some(etcd.config(2)));
}
