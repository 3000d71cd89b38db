//! `hydramem node`: one memory node in the foreground until SIGINT or SIGTERM, and `hydramem
//! node drain`, which drains a running node for maintenance.
//!
//! The node checks its settings, binds its address, takes its first memory-control step (so
//! that the first ALLOC already sees the budget), starts the control thread, registers in
//! etcd if the cluster file has `[etcd]`, and serves; when it stops it revokes its
//! registration, so that clients see it leave at once rather than a lease later. A node that
//! registers never advertises a wildcard address. `drain` starts (or cancels) a drain and
//! waits until the node holds no slab; giving up waiting does not stop the drain.

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use hydramem::node::control::{self, ControlConfig, MemorySource, SystemMemory};
use hydramem::node::{server, Node, NodeConfig};
use hydramem::units::{human, parse_size, Size};

use crate::client_cli::KeyArgs;
use crate::{parse_duration, stop_flag};

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct NodeArgs {
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

pub fn run(a: NodeArgs) -> Result<()> {
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
