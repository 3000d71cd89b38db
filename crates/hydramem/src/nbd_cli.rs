//! `hydramem nbd`: export a resilient remote block device over the NBD protocol.
//!
//! The command connects one client ([`RemoteMemory`](hydramem::client::RemoteMemory)) to the cluster, wraps it in an
//! [`Export`] (through the backup file of `--scheme ssd-backup`) and serves it with [`hydramem::nbd::run`] on a TCP address or a Unix socket until
//! SIGINT/SIGTERM; then it stops accepting, replies to every request already read, and exits 0.
//! Without `--client-id` the identity is random, so nothing could find the data again: the
//! remote memory is released at exit. With it, the data stays on the memory nodes and the next
//! `hydramem nbd` with the same identity (and scheme) serves it again.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::client_cli::ClientArgs;
use hydramem::nbd::{Export, ExportConfig, Limits, Listener, Shutdown};
use hydramem::units::{human, parse_size, Size};

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("endpoint").required(true).args(["listen", "socket"])))]
pub struct NbdArgs {
    #[command(flatten)]
    client: ClientArgs,
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
    /// Worker threads shared by all connections; one connection may use half of them at once
    /// (1 runs every request in order on its connection's thread). 32 gives one client the
    /// 16 that cover queue depth 16; with 8, hydra 8+2 served fio's depth-16 4 KiB reads 22 %
    /// and writes 25 % slower (docs/benchmarks.md §8).
    #[arg(long, env = "HYDRAMEM_WORKERS", default_value_t = 32)]
    workers: usize,
    /// Connections served at once; more are closed at accept.
    #[arg(long, env = "HYDRAMEM_MAX_CONNECTIONS", default_value_t = Limits::default().max_connections)]
    max_connections: usize,
    /// Time a client has from connecting to the end of the handshake.
    #[arg(long, env = "HYDRAMEM_HANDSHAKE_TIMEOUT", default_value = "30s", value_parser = crate::parse_duration)]
    handshake_timeout: Duration,
    /// Time a request has from its first byte to its last, and a reply to be taken by the
    /// client (against stalled or trickling clients; an idle connection may wait forever).
    #[arg(long, env = "HYDRAMEM_REQUEST_TIMEOUT", default_value = "30s", value_parser = crate::parse_duration)]
    request_timeout: Duration,
    /// Bytes of write payloads and read buffers in flight, all connections together; a
    /// connection that would pass it waits for replies to free some.
    #[arg(long, env = "HYDRAMEM_MAX_BYTES_IN_FLIGHT", default_value = "256MiB", value_parser = parse_size)]
    max_bytes_in_flight: Size,
    /// Require TLS of NBD clients (STARTTLS; they must show a certificate of the same CA): a
    /// member directory (`hydramem tls issue`). Without it the export is served in the clear,
    /// which suits a Unix socket on this machine.
    #[arg(long, env = "HYDRAMEM_NBD_TLS_DIR")]
    nbd_tls: Option<PathBuf>,
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
    if a.max_connections == 0 {
        bail!("--max-connections must be at least 1");
    }
    let bytes_in_flight = match a.max_bytes_in_flight {
        Size::Bytes(b) if b >= 4096 => usize::try_from(b)
            .context("--max-bytes-in-flight does not fit in this machine's address space")?,
        _ => bail!("--max-bytes-in-flight takes a byte count of at least 4KiB (e.g. 256MiB)"),
    };
    let limits = Limits {
        max_connections: a.max_connections,
        handshake: a.handshake_timeout,
        request: a.request_timeout,
        bytes_in_flight,
    };
    let cluster = a.client.key.load(&a.client.cluster)?;
    let label = a.client.label();
    let keep = a.client_id.is_some();
    let front = a.client.open(&cluster, size, a.client_id.as_deref())?;
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
    let export = Arc::new(Export::new(front.store(), size));
    let config = ExportConfig {
        name: a.name.clone(),
        description: format!(
            "hydramem {} over {} memory nodes",
            label,
            cluster.nodes.len()
        ),
        workers: a.workers,
        tls: a
            .nbd_tls
            .as_deref()
            .map(hydramem::tls::Tls::load)
            .transpose()?,
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
    hydramem::nbd::run(listener, export, config, limits, shutdown).context("serving NBD")?;
    if let Some(line) = front.span_summary("trimmed or zeroed") {
        println!("{line}");
    }
    front.close()?;
    if keep {
        println!(
            "stopped; the data stays on the memory nodes for this --client-id ({} of remote address space)",
            human(size)
        );
    } else {
        front
            .mem()
            .free_all()
            .context("releasing the remote memory at exit (the nodes keep it until restarted)")?;
        println!("stopped; remote memory released");
    }
    Ok(())
}
