//! The operator's one-shot commands: `hydramem status` (every node's health, capacity, use and
//! slabs, once or refreshed with `--watch`), `hydramem free` (release what one client
//! identity holds on the cluster), and `hydramem key new` and `hydramem tls ca|issue` (make
//! the cluster key, the certificate authority and member directories).
//!
//! Each prints what it did and exits; none serves. The files they make are never written over
//! (an existing key, CA or member file is an error), and private keys are made readable by
//! their owner only. `free` fails unless every node was asked and none refused because the
//! identity is still in use.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Subcommand;
use hydramem::units::human;

use crate::client_cli::KeyArgs;
use crate::{parse_duration, stop_flag};

#[derive(Subcommand)]
pub enum TlsAction {
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
pub enum KeyAction {
    /// Write a new random cluster key to FILE (mode 600; an existing file is not
    /// overwritten). Give the same file to every node and client of the cluster.
    New {
        /// The key file to create.
        file: PathBuf,
    },
}

#[derive(clap::Args)]
pub struct FreeArgs {
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
pub struct StatusArgs {
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

pub fn run_free(a: FreeArgs) -> Result<()> {
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

pub fn run_key_new(file: &std::path::Path) -> Result<()> {
    hydramem::auth::ClusterKey::generate().save(file)?;
    println!(
        "wrote a new cluster key to {} (mode 600): give it to every node and client of the \
         cluster with --cluster-key {0}, or name it in the cluster file as key_file",
        file.display()
    );
    Ok(())
}

pub fn run_tls(action: TlsAction) -> Result<()> {
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

pub fn run_status(a: StatusArgs) -> Result<()> {
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
