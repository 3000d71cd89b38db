//! `hydramem up`: the embedded cluster in the foreground, until Ctrl-C or SIGTERM.
//!
//! It starts N memory nodes on loopback, writes the cluster file (which the nodes also read as
//! their membership), lists every node with its pid, and then supervises them: a node that dies
//! is reported on stdout and the others keep serving, since surviving lost machines is what the
//! cluster is for; with `--restart always` the node comes back on its old address, empty.
//! Only Ctrl-C or SIGTERM ends `up`, which then stops every node and removes the cluster file.
//!
//! With `--etcd` it first starts an etcd of its own on loopback (or, with `--etcd-endpoints`,
//! uses one that runs), writes its `[etcd]` table into the cluster file, and the nodes
//! register there: clients then see nodes that are started later with the same cluster file
//! (`hydramem node --cluster FILE --listen ...`) without a restart.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hydramem::embedded::{EmbeddedCluster, EmbeddedOptions};
use hydramem::supervisor::{RestartPolicy, Supervisor};
use hydramem::units::{human, parse_size, Size};

#[derive(clap::Args)]
pub struct UpArgs {
    /// Number of memory nodes.
    #[arg(long, env = "HYDRAMEM_NODES", default_value_t = 12)]
    nodes: usize,
    /// Where to write the cluster file (the nodes read it too, as their membership).
    #[arg(
        long,
        env = "HYDRAMEM_CLUSTER",
        default_value = "hydramem.cluster.toml"
    )]
    cluster: PathBuf,
    /// Slab size of the cluster.
    #[arg(long, env = "HYDRAMEM_SLAB_SIZE", default_value = "64MiB", value_parser = parse_size)]
    slab_size: Size,
    /// Memory each node may donate.
    #[arg(long, env = "HYDRAMEM_CAPACITY", default_value = "2GiB", value_parser = parse_size)]
    capacity: Size,
    /// What to do when a node process exits: leave it down, or start it again on its old
    /// address, empty (after 0.1 s, doubling up to 5 s while it keeps dying at once).
    #[arg(long, env = "HYDRAMEM_RESTART", value_enum, default_value = "never")]
    restart: RestartPolicy,
    /// A cluster key file (`hydramem key new FILE`): every node is started with it and the
    /// cluster file names it (key_file), so the clients that read the cluster file prove it.
    #[arg(long, env = "HYDRAMEM_CLUSTER_KEY_FILE")]
    cluster_key: Option<PathBuf>,
    /// A TLS member directory (`hydramem tls issue`): every node is started with it and the
    /// cluster file names it (tls_dir), so the clients that read the cluster file use TLS.
    #[arg(long = "tls", env = "HYDRAMEM_TLS_DIR")]
    tls_dir: Option<PathBuf>,
    /// Membership on etcd: start an etcd on loopback (Debian's etcd-server) for the nodes to
    /// register in; stopped with `up`.
    #[arg(long)]
    etcd: bool,
    /// Membership on an etcd that runs already (its client URLs, comma-separated).
    #[arg(
        long,
        env = "HYDRAMEM_ETCD_ENDPOINTS",
        value_delimiter = ',',
        conflicts_with = "etcd"
    )]
    etcd_endpoints: Vec<String>,
    /// Seconds a node's etcd registration outlives its last renewal.
    #[arg(long, default_value_t = 10)]
    etcd_lease_ttl: u64,
}

/// How often `up` looks for nodes that exited and restarts due.
const POLL: Duration = Duration::from_millis(50);

pub fn run(a: UpArgs, log: &str) -> Result<()> {
    if a.nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    let etcd_server = if a.etcd {
        Some(hydramem::membership::server::EtcdServer::start()?)
    } else {
        None
    };
    let etcd = match (&etcd_server, a.etcd_endpoints.is_empty()) {
        (Some(s), _) => Some(s.config(a.etcd_lease_ttl)),
        (None, false) => Some(hydramem::membership::EtcdConfig {
            lease_ttl: a.etcd_lease_ttl,
            ..hydramem::membership::EtcdConfig::new(a.etcd_endpoints.clone())
        }),
        (None, true) => None,
    };
    if let Some(e) = &etcd {
        e.validate().map_err(anyhow::Error::msg)?;
    }
    let opts = EmbeddedOptions {
        etcd: etcd.clone(),
        binary: hydramem::embedded::self_exe().context("finding the hydramem binary")?,
        nodes: a.nodes,
        slab_size: a.slab_size.bytes(),
        capacity: a.capacity.bytes(),
        extra_args: vec!["--log".into(), log.into()],
        cluster_file: Some(a.cluster.clone()),
        key_file: a.cluster_key.clone(),
        tls_dir: a.tls_dir.clone(),
    };
    let stop = crate::stop_flag()?;
    let keyed = opts.key_file.is_some();
    let mut cluster = EmbeddedCluster::start(opts)?;
    if !keyed {
        eprintln!(
            "warning: NO CLUSTER KEY: these nodes serve anyone who can connect to them — any \
             peer may read, write and free every client's slabs and drain a node. Make a key \
             with `hydramem key new FILE` and start with --cluster-key FILE"
        );
    }
    println!(
        "{} memory nodes up on loopback ({} each, {} slabs); cluster file: {}",
        a.nodes,
        human(a.capacity.bytes()),
        human(a.slab_size.bytes()),
        a.cluster.display()
    );
    for (i, n) in cluster.cluster().nodes.iter().enumerate() {
        let pid = cluster
            .pid(i)
            .map_or_else(|| "-".to_string(), |p| p.to_string());
        println!("  node {:>3}  {:<21}  pid {pid}", n.id, n.addr);
    }
    if let Some(e) = &etcd {
        let pid = etcd_server
            .as_ref()
            .and_then(|s| s.pid())
            .map_or_else(|| "running".to_string(), |p| format!("pid {p}"));
        println!(
            "  membership on etcd at {} ({pid}), prefix {}, lease {} s: nodes started later \
             with this cluster file join it",
            e.endpoints.join(","),
            e.prefix,
            e.lease_ttl
        );
    }
    println!(
        "{}; Ctrl-C stops them all.",
        match a.restart {
            RestartPolicy::Never => "A node that dies stays down (--restart never)",
            RestartPolicy::Always => "A node that dies is restarted, empty (--restart always)",
        }
    );
    let mut supervisor = Supervisor::new(a.restart, cluster.len());
    while !stop.load(Ordering::Relaxed) {
        for event in supervisor.poll(&mut cluster, Instant::now()) {
            println!("{event}");
        }
        std::thread::sleep(POLL);
    }
    let running = cluster.running();
    cluster.shutdown();
    let _ = std::fs::remove_file(&a.cluster);
    drop(etcd_server);
    println!("stopped {running} memory nodes (of {})", a.nodes);
    Ok(())
}
