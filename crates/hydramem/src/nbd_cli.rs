//! `hydramem nbd`: export a resilient remote block device over the NBD protocol.
//!
//! The command connects one client ([`RemoteMemory`]) to the cluster, wraps it in an
//! [`Export`] and serves it with [`hydramem::nbd::run`] on a TCP address or a Unix socket until
//! SIGINT/SIGTERM; then it stops accepting, replies to every request already read, and exits 0.
//! Without `--client-id` the identity is random, so nothing could find the data again: the
//! remote memory is released at exit. With it, the data stays on the memory nodes and the next
//! `hydramem nbd` with the same identity (and scheme) serves it again.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use hydramem::client::{ClientConfig, RemoteMemory, Resilience};
use hydramem::cluster::Cluster;
use hydramem::nbd::{Export, ExportConfig, Listener, Shutdown};
use hydramem::units::{human, parse_size, Size};
use hydramem::wire::ClientId;

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("endpoint").required(true).args(["listen", "socket"])))]
pub struct NbdArgs {
    /// The cluster file.
    #[arg(
        long,
        env = "HYDRAMEM_CLUSTER",
        default_value = "hydramem.cluster.toml"
    )]
    cluster: PathBuf,
    /// Size of the block device (e.g. 1GiB); any byte count works, whole pages are fastest.
    #[arg(long, env = "HYDRAMEM_SIZE", value_parser = parse_size)]
    size: Size,
    /// TCP address to serve on (NBD's port is 10809; port 0 picks a free one).
    #[arg(long, env = "HYDRAMEM_LISTEN")]
    listen: Option<String>,
    /// Unix socket to serve on instead of TCP (e.g. for nbdfuse or qemu on this machine).
    #[arg(long, env = "HYDRAMEM_SOCKET")]
    socket: Option<PathBuf>,
    /// Export name; clients may also ask for the default (empty) name.
    #[arg(long, env = "HYDRAMEM_NAME", default_value = "hydramem")]
    name: String,
    /// Worker threads per connection: requests in flight on one connection run concurrently
    /// up to this many (1 runs them in order). 16 covers a client at queue depth 16; with 8,
    /// hydra 8+2 served fio's depth-16 4 KiB reads 22 % and writes 25 % slower
    /// (docs/benchmarks.md §8).
    #[arg(long, env = "HYDRAMEM_WORKERS", default_value_t = 16)]
    workers: usize,
    /// Resilience scheme: hydra-K+R-dD (e.g. hydra-8+2-d1; add -ec for EC-only, -det for
    /// corruption detection, -cor for correction), repN or single, as `bench --schemes`
    /// takes them.
    #[arg(long, env = "HYDRAMEM_SCHEME", default_value = "hydra-8+2-d1")]
    scheme: Resilience,
    /// Turn off the per-split CRC32C checksums (on by default: a split corrupted on a node or
    /// on the wire is then read around, never returned).
    #[arg(long, env = "HYDRAMEM_NO_CHECKSUMS")]
    no_checksums: bool,
    /// Share of corrupted splits from one node above which reads involving it start with
    /// every split they may need (the paper's ErrorCorrectionLimit).
    #[arg(long, env = "HYDRAMEM_ERROR_CORRECTION_LIMIT", default_value_t = 0.001)]
    error_correction_limit: f64,
    /// Share of corrupted splits from one node above which the client moves its slabs off
    /// that node and avoids it until it restarts (the paper's SlabRegenerationLimit).
    #[arg(long, env = "HYDRAMEM_SLAB_REGENERATION_LIMIT", default_value_t = 0.01)]
    slab_regeneration_limit: f64,
    /// Microseconds a waiting thread polls before it sleeps.
    #[arg(long, env = "HYDRAMEM_POLL_US", default_value_t = 50)]
    poll_us: u64,
    /// Seconds one page operation may take before the request fails with EIO.
    #[arg(long, env = "HYDRAMEM_OP_TIMEOUT", default_value_t = 10.0)]
    op_timeout: f64,
    /// Client identity (32 hex digits) that owns the remote memory. Given, the data outlives
    /// the server and a restart with the same identity serves it again; without it a random
    /// identity is used and the memory is released at exit.
    #[arg(long, env = "HYDRAMEM_CLIENT_ID")]
    client_id: Option<String>,
}

pub fn run(a: NbdArgs, stop: Arc<AtomicBool>) -> Result<()> {
    let size = match a.size {
        Size::Bytes(0) => bail!("--size must be at least 1 byte"),
        Size::Bytes(b) => b,
        Size::Percent(_) => bail!("--size takes a byte count (e.g. 1GiB), not a percentage"),
    };
    if a.workers == 0 {
        bail!("--workers must be at least 1");
    }
    if !(a.op_timeout.is_finite() && a.op_timeout > 0.0) {
        bail!("--op-timeout must be a positive number of seconds");
    }
    let cluster = Cluster::load(&a.cluster)?;
    let scheme = a.scheme;
    let mut config = ClientConfig::new(scheme, size);
    config.poll = Duration::from_micros(a.poll_us);
    config.op_timeout = Duration::from_secs_f64(a.op_timeout);
    config.checksums = !a.no_checksums;
    for (name, v) in [
        ("--error-correction-limit", a.error_correction_limit),
        ("--slab-regeneration-limit", a.slab_regeneration_limit),
    ] {
        if !(0.0..=1.0).contains(&v) {
            bail!("{name} {v} is not a share between 0 and 1 (e.g. 0.01 for 1 % of splits)");
        }
    }
    config.error_correction_limit = a.error_correction_limit;
    config.slab_regeneration_limit = a.slab_regeneration_limit;
    let label = if config.checksums {
        format!("{} with checksums", scheme.label())
    } else {
        scheme.label()
    };
    let keep = a.client_id.is_some();
    if let Some(id) = &a.client_id {
        config.client_id =
            ClientId::from_hex(id).map_err(|e| anyhow::anyhow!("--client-id {id:?}: {e}"))?;
    }
    let mem = RemoteMemory::connect(&cluster, config).with_context(|| {
        format!(
            "connecting to the memory nodes of {} as {}",
            a.cluster.display(),
            scheme.label()
        )
    })?;
    let listener = match (&a.listen, &a.socket) {
        (Some(addr), _) => Listener::tcp(addr).with_context(|| {
            format!("cannot listen on {addr}: is another server using it? pick another --listen")
        })?,
        (None, Some(path)) => Listener::unix(path).with_context(|| {
            format!(
                "cannot listen on the Unix socket {}: pick another --socket",
                path.display()
            )
        })?,
        (None, None) => bail!("give --listen ADDR or --socket PATH"),
    };
    let uri = match &listener {
        Listener::Tcp(_) => format!("nbd://{}/{}", listener.describe(), a.name),
        Listener::Unix(..) => format!("nbd+unix:///{}?socket={}", a.name, listener.describe()),
    };
    let export = Arc::new(Export::new(mem.clone(), size));
    let config = ExportConfig {
        name: a.name.clone(),
        description: format!(
            "hydramem {} over {} memory nodes",
            label,
            cluster.nodes.len()
        ),
        workers: a.workers,
    };
    println!(
        "serving NBD export {:?}: {} as {} on {} memory nodes, at {}",
        a.name,
        human(size),
        label,
        cluster.nodes.len(),
        uri
    );
    let shutdown = Shutdown::new();
    {
        let sd = shutdown.clone();
        std::thread::Builder::new()
            .name("nbd-signals".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                tracing::info!("signal received: finishing requests in flight, then stopping");
                sd.trigger();
            })
            .context("starting the signal watcher thread")?;
    }
    hydramem::nbd::run(listener, export, config, shutdown).context("serving NBD")?;
    if keep {
        println!(
            "stopped; the data stays on the memory nodes for this --client-id ({} of remote address space)",
            human(size)
        );
    } else {
        mem.free_all()
            .context("releasing the remote memory at exit (the nodes keep it until restarted)")?;
        println!("stopped; remote memory released");
    }
    Ok(())
}
