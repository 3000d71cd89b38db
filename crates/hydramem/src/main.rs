//! The `hydramem` command line: memory nodes, the embedded cluster, status, benchmark, demo,
//! soak, the NBD block device, the file system, paging a program (`run`), and the placement
//! simulator.
//!
//! Precedence of settings: command-line flags, then the environment (`HYDRAMEM_<OPTION>`), then
//! an optional TOML file given with `--config FILE` (or `HYDRAMEM_CONFIG`), whose tables are
//! named after the subcommands (`[node]`, `[up]`, `[bench]`, ...) and whose keys are the long
//! flag names; defaults are shown by `--help`.

mod bench_cli;
mod client_cli;
mod demo;
mod mount_cli;
mod nbd_cli;
mod run_cli;
mod run_user;
mod sim_cli;
mod soak;
mod up_cli;

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use client_cli::KeyArgs;
use hydramem::node::control::{self, ControlConfig, MemorySource, SystemMemory};
use hydramem::node::{server, Node, NodeConfig};
use hydramem::units::{human, parse_size, Size};

#[derive(Parser)]
#[command(
    name = "hydramem",
    version,
    about = "Resilient, highly available erasure-coded remote memory"
)]
struct Cli {
    /// TOML file with defaults per subcommand ([node], [up], [bench], ...); flags and the
    /// environment take precedence over it.
    #[arg(long, global = true, env = "HYDRAMEM_CONFIG")]
    config: Option<PathBuf>,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9400): a node's request and
    /// slab counters, or a client's failures detected, splits re-routed, regenerations.
    #[arg(long, global = true, env = "HYDRAMEM_METRICS")]
    metrics: Option<String>,
    /// Log filter (error, warn, info, debug, trace, or a tracing directive).
    #[arg(long, global = true, env = "HYDRAMEM_LOG", default_value = "info")]
    log: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one memory node in the foreground.
    Node(NodeArgs),
    /// Start N memory nodes on loopback and write the cluster file (the embedded default).
    Up(up_cli::UpArgs),
    /// Show health, capacity, use and slabs of every node of a cluster.
    Status(StatusArgs),
    /// Latency and throughput of every resilience scheme, side by side, against one cluster.
    Bench(bench_cli::BenchArgs),
    /// A self-contained tour: start a cluster, write, lose nodes, read everything back.
    Demo(demo::DemoArgs),
    /// Many seeded fault runs: nodes killed, paused, restarted and slowed under load.
    Soak(soak::SoakArgs),
    /// Export a resilient remote block device over NBD (for nbd-client, nbdfuse, qemu, fio).
    Nbd(nbd_cli::NbdArgs),
    /// Mount a file system whose files live in the cluster's memory (FUSE): scratch space,
    /// and the fast way to swap to hydramem (scripts/swap).
    Mount(mount_cli::MountArgs),
    /// Run a program with its memory paged to the cluster from user space (userfaultfd):
    /// no swap device, no cgroup, no change to the program.
    Run(run_cli::RunArgs),
    /// Placement simulator: probability of data loss and load balance of CodingSets, EC-Cache
    /// and power of two choices (paper Figures 15 and 16).
    Sim(sim_cli::SimArgs),
    /// Release everything one client identity holds on the cluster (what `nbd --client-id`
    /// keeps after it stops). Stop the client using the identity first.
    Free(FreeArgs),
    /// Cluster keys: `hydramem key new FILE` makes one (see --cluster-key).
    Key {
        #[command(subcommand)]
        action: KeyAction,
    },
    /// TLS for the node protocol: `hydramem tls ca DIR` makes the cluster's certificate
    /// authority, `hydramem tls issue DIR NAME OUT` a member directory for --tls.
    Tls {
        #[command(subcommand)]
        action: TlsAction,
    },
}

#[derive(Subcommand)]
enum TlsAction {
    /// Make a new certificate authority for the cluster in DIR: ca.pem (give it to every
    /// member) and ca.key (mode 600; it signs members: keep it off the cluster's machines).
    Ca {
        /// The directory to create it in (an existing CA there is not overwritten).
        dir: PathBuf,
    },
    /// Issue a member certificate from the CA in CA_DIR into the new directory OUT (ca.pem,
    /// cert.pem, key.pem), named NAME (the machine it is for); give OUT to that node or
    /// client with --tls.
    Issue {
        /// The CA's directory (`hydramem tls ca`).
        ca_dir: PathBuf,
        /// The member's name.
        name: String,
        /// The member directory to create.
        out: PathBuf,
    },
}

#[derive(Subcommand)]
enum KeyAction {
    /// Write a new random cluster key to FILE (mode 600; an existing file is not
    /// overwritten). Give the same file to every node and client of the cluster.
    New {
        /// The key file to create.
        file: PathBuf,
    },
}

#[derive(clap::Args)]
struct FreeArgs {
    /// The cluster file.
    #[arg(
        long,
        env = "HYDRAMEM_CLUSTER",
        default_value = "hydramem.cluster.toml"
    )]
    cluster: PathBuf,
    /// The identity whose memory is released (32 hex digits, as given to `nbd --client-id`).
    #[arg(long, env = "HYDRAMEM_CLIENT_ID")]
    client_id: String,
    #[command(flatten)]
    key: KeyArgs,
}

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
struct NodeArgs {
    #[command(subcommand)]
    action: Option<NodeAction>,
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "HYDRAMEM_LISTEN", default_value = "127.0.0.1:7400")]
    listen: String,
    /// Node id in the cluster file.
    #[arg(long, env = "HYDRAMEM_ID", default_value_t = 0)]
    id: u32,
    /// The cluster file: the members this node may read from when a client asks it to
    /// regenerate a slab (sources are named by node id and looked up here at every request,
    /// so members added to the file are known without a restart).
    #[arg(
        long,
        env = "HYDRAMEM_CLUSTER",
        default_value = "hydramem.cluster.toml"
    )]
    cluster: PathBuf,
    /// Memory to donate: bytes (64G, 512MiB) or a share of this machine's memory (25%).
    #[arg(long, env = "HYDRAMEM_CAPACITY", default_value = "25%", value_parser = parse_size)]
    capacity: Size,
    /// Slab size; must match the cluster file.
    #[arg(long, env = "HYDRAMEM_SLAB_SIZE", default_value = "1GiB", value_parser = parse_size)]
    slab_size: Size,
    /// Obey FAULT requests (delay, stall, drop connections, refuse allocation, crash). For
    /// tests only: never on a node that holds data anyone needs.
    #[arg(long, env = "HYDRAMEM_ALLOW_FAULT_INJECTION")]
    allow_fault_injection: bool,
    /// Print "listening ADDR" on stdout once ready (used by `up`, which also gives the
    /// warning of a node without a key, once for all its nodes).
    #[arg(long, hide = true)]
    announce: bool,
    /// Share of the machine's memory (or its cgroup limit) kept free for local applications;
    /// below it the node gives slabs back.
    #[arg(long, env = "HYDRAMEM_HEADROOM", default_value_t = 0.25)]
    headroom: f64,
    /// How often the node measures free memory and adjusts its slabs.
    #[arg(long, env = "HYDRAMEM_CONTROL_PERIOD", default_value = "1s", value_parser = parse_duration)]
    control_period: Duration,
    /// Slabs kept mapped and backed ahead of allocation, within the memory budget.
    #[arg(long, env = "HYDRAMEM_PREALLOC", default_value_t = 1)]
    prealloc: usize,
    /// E': extra random candidates examined per batch eviction (the E least active of E + E'
    /// are reclaimed).
    #[arg(long, env = "HYDRAMEM_EVICT_EXTRA", default_value_t = 2)]
    evict_extra: usize,
    /// Time an owner has to move a reclaimed slab before the node drops it.
    #[arg(long, env = "HYDRAMEM_RECLAIM_GRACE", default_value = "30s", value_parser = parse_duration)]
    reclaim_grace: Duration,
    /// The cluster key file (`hydramem key new FILE`): every connection must prove it, and
    /// DRAIN and FAULT need an operator's. Without one the node serves anyone who connects.
    #[arg(long, env = "HYDRAMEM_CLUSTER_KEY_FILE")]
    cluster_key: Option<PathBuf>,
    /// TLS member directory (`hydramem tls issue`: ca.pem, cert.pem, key.pem): every
    /// connection must be TLS with a certificate from the cluster's CA, and this node's own
    /// connections to other nodes (regeneration) are.
    #[arg(long = "tls", env = "HYDRAMEM_TLS_DIR")]
    tls_dir: Option<PathBuf>,
    /// Most slabs one client identity may hold on this node (0: no limit but --capacity).
    #[arg(long, env = "HYDRAMEM_QUOTA", default_value_t = 0)]
    quota: u64,
    /// How long an identity's slabs outlive its last connection before they are freed (a
    /// crashed client's memory comes back after this).
    #[arg(long, env = "HYDRAMEM_LEASE", default_value = "10m", value_parser = parse_duration)]
    lease: Duration,
    /// The same for kept identities (`--client-id`): how long a kept mount or export may stay
    /// away before its memory is freed.
    #[arg(long, env = "HYDRAMEM_KEPT_LEASE", default_value = "7d", value_parser = parse_duration)]
    kept_lease: Duration,
    /// Connections served at once; more are closed at accept (each holds a thread).
    #[arg(long, env = "HYDRAMEM_MAX_CONNECTIONS", default_value_t = 4096)]
    max_connections: usize,
    /// Connections one client identity may hold open at once (0: no limit but
    /// --max-connections); more are refused at HELLO (or AUTH) with OVER_QUOTA. A client
    /// holds one per node, plus one per regeneration and tool.
    #[arg(
        long,
        env = "HYDRAMEM_MAX_CONNECTIONS_PER_IDENTITY",
        default_value_t = 64
    )]
    max_connections_per_identity: u32,
    /// Time a new connection has to identify itself (HELLO, and AUTH with a key).
    #[arg(long, env = "HYDRAMEM_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    handshake_timeout: Duration,
    /// Time a frame has from its first byte to its last (against stalled or trickling peers).
    #[arg(long, env = "HYDRAMEM_FRAME_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    frame_timeout: Duration,
    /// The address clients reach this node at, as it registers in etcd (when the cluster
    /// file has [etcd]); by default the address it listens on, which must then not be a
    /// wildcard (0.0.0.0).
    #[arg(long, env = "HYDRAMEM_ADVERTISE")]
    advertise: Option<std::net::SocketAddr>,
    /// This node's failure domain (rack, power feed), as it registers in etcd.
    #[arg(long, env = "HYDRAMEM_DOMAIN")]
    domain: Option<String>,
}

#[derive(Subcommand)]
enum NodeAction {
    /// Drain a running node for maintenance: it takes no new slabs and its clients move every
    /// slab it holds elsewhere (no data is lost); waits until it holds none, then it can stop.
    Drain(DrainArgs),
}

#[derive(clap::Args)]
struct DrainArgs {
    /// The node: its address (ip:port), or its id in --cluster.
    node: String,
    /// Cluster file, to name the node by id.
    #[arg(
        long,
        env = "HYDRAMEM_CLUSTER",
        default_value = "hydramem.cluster.toml"
    )]
    cluster: PathBuf,
    /// Give up waiting after this long (the drain itself goes on).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    timeout: Duration,
    /// Return once the drain is started, without waiting.
    #[arg(long)]
    no_wait: bool,
    /// Cancel a drain: the node takes slabs again and keeps the ones not yet moved.
    #[arg(long, conflicts_with = "no_wait")]
    cancel: bool,
    #[command(flatten)]
    key: KeyArgs,
}

/// Parses "500ms", "2s", "1.5s", "10m".
fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, unit) = t
        .find(|c: char| c.is_ascii_alphabetic())
        .map(|i| t.split_at(i))
        .unwrap_or((t, "s"));
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 500ms, 2s, 10m)"))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" => v,
        "m" | "min" => v * 60.0,
        "h" => v * 3600.0,
        "d" => v * 86400.0,
        _ => return Err(format!("unknown unit in {s:?}: use ms, s, m or h")),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("{s:?} must be a non-negative duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[derive(clap::Args)]
struct StatusArgs {
    /// The cluster file.
    #[arg(
        long,
        env = "HYDRAMEM_CLUSTER",
        default_value = "hydramem.cluster.toml"
    )]
    cluster: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Refresh the table every interval (e.g. 1s) until Ctrl-C: follow regenerations,
    /// evictions and drains as they happen.
    #[arg(long, value_parser = parse_duration, conflicts_with = "json")]
    watch: Option<Duration>,
    /// With --watch: stop after this many refreshes.
    #[arg(long, requires = "watch")]
    count: Option<u64>,
    #[command(flatten)]
    key: KeyArgs,
}

/// Subcommands whose options a `--config` file may set (`sim` has sub-subcommands and takes
/// its options on the command line only). For `run`, what follows `--` is the program's own
/// command line: its options are never taken for ours.
const SUBCOMMANDS: [&str; 10] = [
    "node", "up", "status", "bench", "demo", "soak", "nbd", "free", "run", "mount",
];

/// The command line with the config file's settings for the subcommand inserted right after
/// it, only for options given neither as a flag nor in the environment (both beat the file).
fn args_with_config() -> Result<Vec<String>> {
    let mut args: Vec<String> = std::env::args().collect();
    let mut path = std::env::var("HYDRAMEM_CONFIG").ok().map(PathBuf::from);
    for (i, a) in args.iter().enumerate() {
        if let Some(p) = a.strip_prefix("--config=") {
            path = Some(p.into());
        } else if a == "--config" {
            path = args.get(i + 1).map(PathBuf::from);
        }
    }
    let Some(path) = path else { return Ok(args) };
    let Some(sub_at) = args.iter().position(|a| SUBCOMMANDS.contains(&a.as_str())) else {
        return Ok(args);
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    let doc: toml::Table = toml::from_str(&text)
        .with_context(|| format!("config file {} is not valid TOML", path.display()))?;
    let Some(section) = doc.get(&args[sub_at]) else {
        return Ok(args);
    };
    let table = section.as_table().with_context(|| {
        format!(
            "[{}] in {} must be a table of flag = value",
            args[sub_at],
            path.display()
        )
    })?;
    let ours = args[sub_at..]
        .iter()
        .position(|a| a == "--")
        .map_or(args.len(), |end| sub_at + end);
    let mut extra = Vec::new();
    for (key, value) in table {
        let env = format!("HYDRAMEM_{}", key.to_uppercase().replace('-', "_"));
        let flag = format!("--{key}");
        let on_command_line = args[sub_at..ours]
            .iter()
            .any(|a| *a == flag || a.starts_with(&format!("{flag}=")));
        if on_command_line || std::env::var_os(&env).is_some() {
            continue;
        }
        let v = match value {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(true) => {
                extra.push(format!("--{key}"));
                continue;
            }
            toml::Value::Boolean(false) => continue,
            toml::Value::Array(a) => a
                .iter()
                .map(|x| {
                    x.as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| x.to_string())
                })
                .collect::<Vec<_>>()
                .join(","),
            other => bail!(
                "{key} = {other} in {}: use a string, number or boolean",
                path.display()
            ),
        };
        extra.push(format!("--{key}={v}"));
    }
    args.splice(sub_at + 1..sub_at + 1, extra);
    Ok(args)
}

fn main() {
    let args = match args_with_config() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    };
    let cli = Cli::parse_from(args);
    // The demo narrates what happens itself; unless asked, keep the log to errors there.
    let log = match (&cli.cmd, cli.log.as_str(), std::env::var_os("HYDRAMEM_LOG")) {
        (Cmd::Demo(_), "info", None) => "error",
        (_, l, _) => l,
    };
    // fuser warns when it unmounts a file system that `umount` already unmounted; our own
    // code reports what matters about a mount.
    let log = if log.contains("fuser") {
        log.to_string()
    } else {
        format!("{log},fuser=error")
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only for a terminal: logs sent to a file or a journal stay plain text.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Some(m) = &cli.metrics {
        if let Err(e) = install_metrics(m) {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
    let r = match cli.cmd {
        Cmd::Node(a) => run_node(a),
        Cmd::Up(a) => up_cli::run(a, &cli.log),
        Cmd::Status(a) => run_status(a),
        Cmd::Bench(a) => bench_cli::run(a),
        Cmd::Demo(a) => demo::run(a),
        Cmd::Soak(a) => soak::run(a),
        Cmd::Nbd(a) => stop_flag().and_then(|stop| nbd_cli::run(a, stop)),
        Cmd::Mount(a) => stop_flag().and_then(|stop| mount_cli::run(a, stop)),
        Cmd::Run(a) => run_cli::run(a),
        Cmd::Sim(a) => sim_cli::run(a),
        Cmd::Free(a) => run_free(a),
        Cmd::Key {
            action: KeyAction::New { file },
        } => run_key_new(&file),
        Cmd::Tls { action } => run_tls(action),
    };
    if let Err(e) = r {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// Serves Prometheus metrics of this process on `addr`.
fn install_metrics(addr: &str) -> Result<()> {
    let a: std::net::SocketAddr = addr
        .parse()
        .with_context(|| format!("--metrics {addr:?} is not an address"))?;
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(a)
        .install()
        .with_context(|| format!("starting the metrics endpoint on {a}"))
}

/// SIGINT/SIGTERM set the returned flag.
fn stop_flag() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    Ok(stop)
}

fn run_node(a: NodeArgs) -> Result<()> {
    if let Some(NodeAction::Drain(d)) = a.action {
        return run_drain(d);
    }
    let control = ControlConfig {
        period: a.control_period,
        headroom: a.headroom,
        prealloc: a.prealloc,
        evict_extra: a.evict_extra,
        grace: a.reclaim_grace,
    };
    control.validate().map_err(anyhow::Error::msg)?;
    let config = NodeConfig {
        id: a.id,
        capacity: a.capacity.bytes(),
        slab_size: a.slab_size.bytes(),
        allow_faults: a.allow_fault_injection,
        membership: Some(a.cluster.clone()),
        key: a
            .cluster_key
            .as_deref()
            .map(hydramem::auth::ClusterKey::load)
            .transpose()?,
        tls: a
            .tls_dir
            .as_deref()
            .map(hydramem::tls::Tls::load)
            .transpose()?,
        tenancy: hydramem::node::tenants::TenancyConfig {
            quota: a.quota,
            lease: a.lease,
            kept_lease: a.kept_lease,
            max_connections: a.max_connections_per_identity,
        },
    };
    let keyed = config.key.is_some();
    let tls = config.tls.is_some();
    let node = Node::new(config)?;
    metrics::gauge!("hydramem_node_cluster_key").set(if keyed { 1.0 } else { 0.0 });
    metrics::gauge!("hydramem_node_tls").set(if tls { 1.0 } else { 0.0 });
    // Nodes that announce themselves were started by `up` (or another embedded cluster),
    // which says this once for all of them.
    if !keyed && !a.announce {
        tracing::warn!(
            "NO CLUSTER KEY: this node serves anyone who can connect to it — any peer may read, \
             write and free every client's slabs and drain the node. Make a key with \
             `hydramem key new FILE` and give it to every node and client with --cluster-key"
        );
    }
    if a.allow_fault_injection {
        tracing::warn!("fault injection is ENABLED: this node obeys FAULT requests (tests only)");
    }
    let listener = TcpListener::bind(&a.listen).with_context(|| {
        format!(
            "cannot listen on {}: is another node using it? pick another --listen",
            a.listen
        )
    })?;
    let local = listener.local_addr()?;
    tracing::info!(
        id = a.id,
        capacity = %human(node.config().capacity),
        slab = %human(node.config().slab_size),
        slabs = node.max_slabs(),
        "memory node starting"
    );
    if a.announce {
        println!("listening {local}");
    }
    let shutdown = server::Shutdown::new();
    // Memory management: the first step runs before serving, so that the first ALLOC already
    // sees the budget.
    let source = SystemMemory::new();
    tracing::info!(
        headroom = control.headroom,
        period = ?control.period,
        prealloc = control.prealloc,
        grace = ?control.grace,
        cgroup_levels = source.cgroup_levels(),
        "memory management"
    );
    if let Ok(s) = source.sample() {
        node.control_step(s, &control);
    }
    {
        let (node, sd) = (node.clone(), shutdown.clone());
        std::thread::Builder::new()
            .name("hm-control".into())
            .spawn(move || control::run(node, Box::new(source), control, sd))
            .context("starting the memory control thread")?;
    }
    let stop = stop_flag()?;
    let sd = shutdown.clone();
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
        }
        tracing::info!("signal received, stopping");
        sd.trigger();
    });
    let limits = hydramem::node::limits::ConnLimits {
        max_connections: a.max_connections.max(1),
        handshake: a.handshake_timeout,
        frame: a.frame_timeout,
    };
    raise_open_files(limits.max_connections);
    let registration = register_in_etcd(&a, &node, local)?;
    server::run(listener, node, shutdown, limits)?;
    // Revokes the lease: clients see this node leave now, not a lease later.
    drop(registration);
    Ok(())
}

/// Registers the node in etcd if its cluster file has `[etcd]`. Only that table is read
/// now (the rest is the membership the node looks sources up in at each regeneration, and
/// may still be being written: `up` writes it after its nodes started).
fn register_in_etcd(
    a: &NodeArgs,
    node: &std::sync::Arc<Node>,
    local: std::net::SocketAddr,
) -> Result<Option<hydramem::membership::register::Registration>> {
    let cfg = match hydramem::membership::etcd_of_file(&a.cluster) {
        Ok(Some(cfg)) => cfg,
        Ok(None) => return Ok(None),
        Err(e @ hydramem::membership::EtcdFileError::Invalid(_)) => return Err(e.into()),
        Err(reason) => {
            tracing::warn!(%reason, "not registering in etcd: the cluster file cannot be read now");
            return Ok(None);
        }
    };
    let addr = a.advertise.unwrap_or(local);
    if addr.ip().is_unspecified() {
        bail!(
            "this node listens on {local} and registers in etcd: clients cannot dial a \
             wildcard address; give --advertise IP:PORT"
        );
    }
    let endpoints = cfg.endpoints.join(",");
    let r = hydramem::membership::register::Registration::for_node(
        node.clone(),
        cfg,
        addr,
        a.domain.clone(),
    )?;
    tracing::info!(%endpoints, %addr, "registering in etcd");
    Ok(Some(r))
}

/// Raises this process's soft limit on open files to its hard limit, so that a node can hold
/// `--max-connections` sockets (the usual soft limit is 1024); warns when even the hard
/// limit is lower (accept then fails with EMFILE before the cap, which the node survives).
fn raise_open_files(connections: usize) {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit through a valid, exclusive pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return;
    }
    if l.rlim_cur < l.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: l.rlim_max,
            rlim_max: l.rlim_max,
        };
        // SAFETY: setrlimit reads one rlimit through a valid pointer.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            l = raised;
        }
    }
    let want = connections as u64 + 64;
    if l.rlim_cur < want {
        tracing::warn!(
            open_files = l.rlim_cur,
            max_connections = connections,
            "this node may open fewer files than --max-connections needs: raise its limit \
             (LimitNOFILE= in systemd, ulimit -n) or lower --max-connections"
        );
    }
}

fn run_drain(d: DrainArgs) -> Result<()> {
    let addr: std::net::SocketAddr = match d.node.parse() {
        Ok(a) => a,
        Err(_) => {
            let id: u32 = d.node.parse().with_context(|| {
                format!("{:?} is neither an address (ip:port) nor a node id", d.node)
            })?;
            let cluster = d.key.load(&d.cluster)?;
            let registered = || {
                let found = hydramem::membership::registered(cluster.etcd.as_ref()?).ok()?;
                found.into_iter().find(|m| m.id == id).map(|m| m.addr)
            };
            cluster
                .nodes
                .iter()
                .find(|n| n.id == id)
                .map(|n| n.addr)
                .or_else(registered)
                .with_context(|| {
                    format!(
                        "no node with id {id} in {} (nor registered in its etcd)",
                        d.cluster.display()
                    )
                })?
        }
    };
    let t = Duration::from_secs(5);
    let access = d.key.access(&d.cluster)?;
    let stats = |what: &str| {
        hydramem::status::fetch(addr, &access, t)
            .map_err(|e| anyhow::anyhow!("cannot {what} the node: {e}"))
    };
    let before = stats("reach")?;
    hydramem::status::drain(addr, !d.cancel, &access, t).map_err(|e| {
        let what = if d.cancel { "cancel" } else { "start" };
        anyhow::anyhow!("cannot {what} the drain: {e}")
    })?;
    if d.cancel {
        println!("drain of node {} at {addr} cancelled", before.node_id);
        return Ok(());
    }
    println!(
        "draining node {} at {addr}: {} slabs to move",
        before.node_id,
        before.slabs.len()
    );
    if d.no_wait {
        return Ok(());
    }
    let total = before.slabs.len() as u64;
    let bar = indicatif::ProgressBar::new(total).with_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} slabs moved  {elapsed}")
            .expect("valid template"),
    );
    let start = std::time::Instant::now();
    loop {
        let st = stats("poll")?;
        let left = st.slabs.len() as u64;
        bar.set_length(total.max(left));
        bar.set_position(total.saturating_sub(left));
        if left == 0 {
            bar.finish();
            println!(
                "node {} at {addr} holds no slabs ({} moved by their owners, {} dropped); it can be stopped now",
                st.node_id, st.evicted_moved, st.evicted_forced
            );
            return Ok(());
        }
        if start.elapsed() > d.timeout {
            bar.abandon();
            let mut owners: Vec<String> = st
                .slabs
                .iter()
                .map(|s| format!("{:08x}", s.owner))
                .collect();
            owners.sort();
            owners.dedup();
            bail!(
                "node {} at {addr} still holds {left} slabs after {:?} (owners {}): their clients \
                 are not connected or cannot place them elsewhere; start them, add memory nodes, \
                 or wait longer (the drain goes on; `hydramem node drain --cancel {}` stops it)",
                st.node_id,
                d.timeout,
                owners.join(", "),
                d.node
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn run_free(a: FreeArgs) -> Result<()> {
    let cluster = a.key.load(&a.cluster)?;
    let id = hydramem::wire::ClientId::from_hex(&a.client_id)
        .map_err(|e| anyhow::anyhow!("--client-id {:?}: {e}", a.client_id))?;
    let nodes = hydramem::release::release(&cluster, id, Duration::from_secs(5));
    let fingerprint = hydramem::rpc::Greeting::client(&id, 0, cluster.key.as_ref())
        .owner
        .fingerprint();
    let (mut slabs, mut failed) = (0u64, Vec::new());
    for n in &nodes {
        match &n.result {
            Ok(k) => {
                slabs += k;
                println!("node {:>3}  {:<21}  {k} slabs released", n.id, n.addr);
            }
            Err(e) => {
                println!("node {:>3}  {:<21}  not released: {e}", n.id, n.addr);
                failed.push(n.id.to_string());
            }
        }
    }
    println!(
        "released {slabs} slabs ({}) of identity {:08x} on {} of {} nodes",
        human(slabs * cluster.slab_size),
        fingerprint,
        nodes.len() - failed.len(),
        nodes.len()
    );
    if nodes
        .iter()
        .any(|n| n.result.as_ref().is_err_and(|e| e.in_use()))
    {
        bail!(
            "identity {:08x} is in use by a running process (its nodes refuse another while its connections are open): stop the process that uses this --client-id, then run `hydramem free` again",
            fingerprint,
        );
    }
    if !failed.is_empty() {
        bail!(
            "node(s) {} could not be asked; a node that restarts holds nothing, but one that was only unreachable keeps this identity's slabs: run `hydramem free` again once it answers",
            failed.join(", ")
        );
    }
    Ok(())
}

fn run_key_new(file: &std::path::Path) -> Result<()> {
    hydramem::auth::ClusterKey::generate().save(file)?;
    println!(
        "wrote a new cluster key to {} (mode 600): give it to every node and client of the \
         cluster with --cluster-key {0}, or name it in the cluster file as key_file",
        file.display()
    );
    Ok(())
}

fn run_tls(action: TlsAction) -> Result<()> {
    match action {
        TlsAction::Ca { dir } => {
            hydramem::tls::new_ca(&dir)?;
            println!(
                "made the cluster's TLS certificate authority in {}: ca.pem, and ca.key (mode \
                 600), which signs members; issue a member directory per machine with \
                 `hydramem tls issue {0} NAME OUT`, then keep ca.key off the cluster",
                dir.display()
            );
        }
        TlsAction::Issue { ca_dir, name, out } => {
            hydramem::tls::issue(&ca_dir, &name, &out)?;
            println!(
                "issued member {name:?} in {}: ca.pem, cert.pem, key.pem (mode 600); give it to \
                 that node or client with --tls {0} (or HYDRAMEM_TLS_DIR, or tls_dir in the \
                 cluster file)",
                out.display()
            );
        }
    }
    Ok(())
}

fn run_status(a: StatusArgs) -> Result<()> {
    let mut cluster = a.key.load(&a.cluster)?;
    // With [etcd], the registered members are listed beside the file's nodes.
    let membership = cluster.etcd.clone().map(|cfg| {
        let (found, line) = hydramem::membership::report(&cfg);
        cluster.add_nodes(found.iter().map(hydramem::membership::Member::entry));
        line
    });
    let rows = hydramem::status::collect(&cluster);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    let Some(every) = a.watch else {
        print!("{}", hydramem::status::table(&cluster, &rows));
        if let Some(line) = &membership {
            println!("{line}");
        }
        return Ok(());
    };
    let stop = stop_flag()?;
    let mut rows = rows;
    let mut shown = 0u64;
    loop {
        // Clear the screen and home the cursor on terminals; plain separators otherwise.
        if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
            print!("\x1b[2J\x1b[H");
        } else if shown > 0 {
            println!();
        }
        println!("{}  (every {:?}, Ctrl-C stops)", utc_time_of_day(), every);
        print!("{}", hydramem::status::table(&cluster, &rows));
        shown += 1;
        if a.count.is_some_and(|c| shown >= c) || stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        let until = std::time::Instant::now() + every;
        while std::time::Instant::now() < until {
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20).min(every));
        }
        rows = hydramem::status::collect(&cluster);
    }
}

/// Wall-clock time of day (UTC) as HH:MM:SS, without a date-time dependency.
fn utc_time_of_day() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!(
        "{:02}:{:02}:{:02} UTC",
        secs / 3600 % 24,
        secs / 60 % 60,
        secs % 60
    )
}
