//! The `hydramem` command line: memory nodes, the embedded cluster, status, benchmark, demo.
//!
//! Every option can also come from the environment (`HYDRAMEM_<OPTION>`); defaults are shown
//! by `--help`.

mod bench_cli;
mod demo;

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use hydramem::cluster::Cluster;
use hydramem::embedded::{EmbeddedCluster, EmbeddedOptions};
use hydramem::node::{server, Node, NodeConfig};
use hydramem::units::{human, parse_size, Size};

#[derive(Parser)]
#[command(
    name = "hydramem",
    version,
    about = "Resilient, highly available erasure-coded remote memory"
)]
struct Cli {
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
    Up(UpArgs),
    /// Show health, capacity, use and slabs of every node of a cluster.
    Status(StatusArgs),
    /// Latency and throughput of every resilience scheme, side by side, against one cluster.
    Bench(bench_cli::BenchArgs),
    /// A self-contained tour: start a cluster, write, lose nodes, read everything back.
    Demo(demo::DemoArgs),
}

#[derive(clap::Args)]
struct NodeArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "HYDRAMEM_LISTEN", default_value = "127.0.0.1:7400")]
    listen: String,
    /// Node id in the cluster file.
    #[arg(long, env = "HYDRAMEM_ID", default_value_t = 0)]
    id: u32,
    /// Memory to donate: bytes (64G, 512MiB) or a share of this machine's memory (25%).
    #[arg(long, env = "HYDRAMEM_CAPACITY", default_value = "25%", value_parser = parse_size)]
    capacity: Size,
    /// Slab size; must match the cluster file.
    #[arg(long, env = "HYDRAMEM_SLAB_SIZE", default_value = "1GiB", value_parser = parse_size)]
    slab_size: Size,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9400).
    #[arg(long, env = "HYDRAMEM_METRICS")]
    metrics: Option<String>,
    /// Print "listening ADDR" on stdout once ready (used by `up`).
    #[arg(long, hide = true)]
    announce: bool,
}

#[derive(clap::Args)]
struct UpArgs {
    /// Number of memory nodes.
    #[arg(long, env = "HYDRAMEM_NODES", default_value_t = 12)]
    nodes: usize,
    /// Where to write the cluster file.
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
}

fn main() {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let r = match cli.cmd {
        Cmd::Node(a) => run_node(a),
        Cmd::Up(a) => run_up(a, &cli.log),
        Cmd::Status(a) => run_status(a),
        Cmd::Bench(a) => bench_cli::run(a),
        Cmd::Demo(a) => demo::run(a),
    };
    if let Err(e) = r {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
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
    let config = NodeConfig {
        id: a.id,
        capacity: a.capacity.bytes(),
        slab_size: a.slab_size.bytes(),
    };
    let node = Node::new(config)?;
    if let Some(m) = &a.metrics {
        let addr: std::net::SocketAddr = m
            .parse()
            .with_context(|| format!("--metrics {m:?} is not an address"))?;
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .install()
            .with_context(|| format!("starting the metrics endpoint on {addr}"))?;
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
    let stop = stop_flag()?;
    let sd = shutdown.clone();
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
        }
        tracing::info!("signal received, stopping");
        sd.trigger();
    });
    server::run(listener, node, shutdown)?;
    Ok(())
}

fn run_up(a: UpArgs, log: &str) -> Result<()> {
    if a.nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    let opts = EmbeddedOptions {
        binary: std::env::current_exe().context("finding the hydramem binary")?,
        nodes: a.nodes,
        slab_size: a.slab_size.bytes(),
        capacity: a.capacity.bytes(),
        extra_args: vec!["--log".into(), log.into()],
    };
    let stop = stop_flag()?;
    let mut cluster = EmbeddedCluster::start(opts)?;
    cluster.write_cluster_file(&a.cluster)?;
    println!(
        "{} memory nodes up on loopback ({} each, {} slabs); cluster file: {}",
        a.nodes,
        human(a.capacity.bytes()),
        human(a.slab_size.bytes()),
        a.cluster.display()
    );
    for n in &cluster.cluster().nodes {
        println!("  node {:>3}  {}", n.id, n.addr);
    }
    println!("Ctrl-C stops them all.");
    let mut exit = None;
    while !stop.load(Ordering::Relaxed) {
        if let Some((i, st)) = cluster.try_wait_any() {
            exit = Some((i, st));
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    cluster.shutdown();
    let _ = std::fs::remove_file(&a.cluster);
    if let Some((i, st)) = exit {
        bail!("memory node {i} exited on its own ({st}); stopped the others");
    }
    println!("stopped {} memory nodes", a.nodes);
    Ok(())
}

fn run_status(a: StatusArgs) -> Result<()> {
    let cluster = Cluster::load(&a.cluster)?;
    let rows = hydramem::status::collect(&cluster);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    print!("{}", hydramem::status::table(&cluster, &rows));
    Ok(())
}
