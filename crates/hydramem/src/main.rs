//! The `hydramem` command line: memory nodes, the embedded cluster, status, benchmark, demo,
//! soak, the NBD block device, the file system, paging a program (`run`), and the placement
//! simulator.
//!
//! Precedence of settings: command-line flags, then the environment (`HYDRAMEM_<OPTION>`), then
//! an optional TOML file given with `--config FILE` (or `HYDRAMEM_CONFIG`), whose tables are
//! named after the subcommands (`[node]`, `[up]`, `[bench]`, ...) and whose keys are the long
//! flag names; defaults are shown by `--help`.
//!
//! Each subcommand's arguments and code are in a module of their own (`node_cli`, `up_cli`,
//! `admin_cli` for `status`, `free`, `key` and `tls`, ...); this file parses the command
//! line, merges the config file into it, and holds what several subcommands use
//! ([`parse_duration`], [`stop_flag`]).

mod admin_cli;
mod bench_cli;
mod client_cli;
mod demo;
mod mount_cli;
mod nbd_cli;
mod node_cli;
mod run_cli;
mod run_user;
mod sim_cli;
mod soak;
mod up_cli;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

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
    Node(node_cli::NodeArgs),
    /// Start N memory nodes on loopback and write the cluster file (the embedded default).
    Up(up_cli::UpArgs),
    /// Show health, capacity, use and slabs of every node of a cluster.
    Status(admin_cli::StatusArgs),
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
    Free(admin_cli::FreeArgs),
    /// Cluster keys: `hydramem key new FILE` makes one (see --cluster-key).
    Key {
        #[command(subcommand)]
        action: admin_cli::KeyAction,
    },
    /// TLS for the node protocol: `hydramem tls ca DIR` makes the cluster's certificate
    /// authority, `hydramem tls issue DIR NAME OUT` a member directory for --tls.
    Tls {
        #[command(subcommand)]
        action: admin_cli::TlsAction,
    },
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
        Cmd::Node(a) => node_cli::run(a),
        Cmd::Up(a) => up_cli::run(a, &cli.log),
        Cmd::Status(a) => admin_cli::run_status(a),
        Cmd::Bench(a) => bench_cli::run(a),
        Cmd::Demo(a) => demo::run(a),
        Cmd::Soak(a) => soak::run(a),
        Cmd::Nbd(a) => stop_flag().and_then(|stop| nbd_cli::run(a, stop)),
        Cmd::Mount(a) => stop_flag().and_then(|stop| mount_cli::run(a, stop)),
        Cmd::Run(a) => run_cli::run(a),
        Cmd::Sim(a) => sim_cli::run(a),
        Cmd::Free(a) => admin_cli::run_free(a),
        Cmd::Key {
            action: admin_cli::KeyAction::New { file },
        } => admin_cli::run_key_new(&file),
        Cmd::Tls { action } => admin_cli::run_tls(action),
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
