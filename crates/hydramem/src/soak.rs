//! `hydramem soak`: many seeded fault runs (see `hydramem::faultrun`), a count of runs and of
//! acknowledged writes lost (must be 0).

use std::time::Duration;

use anyhow::{bail, Result};
use hydramem::faultrun::{run as fault_run, FaultRunOptions};

#[derive(clap::Args)]
pub struct SoakArgs {
    /// Fault runs to do.
    #[arg(long, env = "HYDRAMEM_RUNS", default_value_t = 20)]
    runs: u64,
    /// Seconds of faults per run.
    #[arg(long, env = "HYDRAMEM_SECONDS", default_value_t = 10.0)]
    seconds: f64,
    /// Seed of the first run (run i uses seed + i).
    #[arg(long, env = "HYDRAMEM_SEED", default_value_t = 1000)]
    seed: u64,
    /// Memory nodes per run.
    #[arg(long, env = "HYDRAMEM_NODES", default_value_t = 12)]
    nodes: usize,
    /// Also make nodes corrupt their replies (bit flips, misdirected reads), with per-split
    /// checksums on in the client.
    #[arg(long, env = "HYDRAMEM_CORRUPTION")]
    corruption: bool,
    /// The scheme of the client under test: hydra-8+2-d1 or span-8+2 (the faults assume r = 2).
    #[arg(long, env = "HYDRAMEM_SCHEME", default_value = "hydra-8+2-d1")]
    scheme: hydramem::client::Resilience,
    /// Run the nodes and the client with this cluster key file (`hydramem key new`).
    #[arg(long, env = "HYDRAMEM_CLUSTER_KEY_FILE")]
    cluster_key: Option<std::path::PathBuf>,
    /// Run the nodes and the client with TLS from this member directory (`hydramem tls
    /// issue`).
    #[arg(long = "tls", env = "HYDRAMEM_TLS_DIR")]
    tls_dir: Option<std::path::PathBuf>,
    /// Membership on etcd: start an etcd (Debian's etcd-server) whose members the nodes of
    /// every run register in (leases of 2 s, a prefix per run) and the client follows.
    #[arg(long)]
    etcd: bool,
}

pub fn run(a: SoakArgs) -> Result<()> {
    use hydramem::client::Resilience;
    if !matches!(
        a.scheme,
        Resilience::Hydra { r: 2, .. } | Resilience::Span { r: 2, .. }
    ) {
        bail!(
            "--scheme {}: the fault runs inject up to two faults at once, so they need a code \
             with r = 2 (hydra-8+2-d1, span-8+2)",
            a.scheme
        );
    }
    let etcd = if a.etcd {
        Some(hydramem::membership::server::EtcdServer::start()?)
    } else {
        None
    };
    let (mut acked, mut lost, mut wrong, mut failed, mut read_errors, mut faults) =
        (0, 0, 0, 0, 0, 0);
    for i in 0..a.runs {
        let r = fault_run(&FaultRunOptions {
            binary: hydramem::embedded::self_exe()?,
            seed: a.seed + i,
            nodes: a.nodes,
            threads: 6,
            pages: 3072,
            slab_size: 1 << 20,
            duration: Duration::from_secs_f64(a.seconds),
            max_faults: 2,
            corruption: a.corruption,
            scheme: a.scheme,
            key_file: a.cluster_key.clone(),
            tls_dir: a.tls_dir.clone(),
            etcd: etcd.as_ref().map(|e| hydramem::membership::EtcdConfig {
                prefix: format!("/hydramem/soak-{}", a.seed + i),
                ..e.config(2)
            }),
        })
        .map_err(anyhow::Error::msg)?;
        println!(
            "run {:>3} seed {}: {} faults, {} writes acknowledged, {} lost, {} wrong reads, {} failed writes, {} read errors, {} regenerations{}",
            i + 1,
            r.seed,
            r.faults.len(),
            r.acked_writes,
            r.lost_writes,
            r.wrong_reads,
            r.failed_writes,
            r.read_errors,
            r.regenerations,
            if a.corruption {
                format!(
                    ", {} corrupted splits read around, {} splits moved off corrupting nodes",
                    r.corrupt_splits, r.evacuated
                )
            } else {
                String::new()
            }
        );
        acked += r.acked_writes;
        lost += r.lost_writes;
        wrong += r.wrong_reads;
        failed += r.failed_writes;
        read_errors += r.read_errors;
        faults += r.faults.len();
    }
    println!(
        "soak: {} runs, {faults} faults injected, {acked} acknowledged writes, {lost} lost, {wrong} wrong reads ({failed} writes and {read_errors} reads returned errors)",
        a.runs
    );
    if lost + wrong > 0 {
        bail!("{lost} acknowledged writes lost and {wrong} wrong reads");
    }
    Ok(())
}
