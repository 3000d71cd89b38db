//! A resilient remote block device over the Network Block Device protocol.
//!
//! `hydramem nbd` serves one export of `size` bytes whose pages live in a
//! [`RemoteMemory`](crate::client::RemoteMemory): every 4 KiB page is erasure-coded (or
//! replicated) over the memory nodes, so the device survives r lost machines. Any NBD client
//! works with it: `nbd-client` makes it `/dev/nbdX` for swap or a file system, `nbdfuse` plus a
//! loop device does the same without the kernel module, and qemu, fio, nbdcopy and libnbd
//! speak it directly. This is the paper's block device for unmodified applications (Hydra §6,
//! after Infiniswap), in user space and over a standard protocol.
//!
//! The protocol follows the upstream NBD protocol document (fixed newstyle only, TLS by
//! STARTTLS when the server has a member directory, no metadata contexts). Rust has NBD
//! *client* crates, but no maintained server-side library covers fixed newstyle with
//! structured replies, so the server is written here, one concept per module:
//!
//! - [`wire`]: every byte of the protocol, with byte tables; pure parsing and encoding;
//! - [`handshake`]: greeting and option haggling (GO, INFO, EXPORT_NAME, LIST, ABORT,
//!   STRUCTURED_REPLY);
//! - [`transmission`]: requests and replies of one connection, executed by a small worker pool;
//! - [`export`]: the byte-addressed device over whole remote pages (read-modify-write of
//!   partial pages under a per-page lock from [`page_locks`]);
//! - [`limits`]: what a client may hold (connections, deadlines, bytes in flight), and
//!   [`pool`]: the worker threads every connection shares.
//!
//! Invariants the server keeps: a WRITE (or TRIM, WRITE_ZEROES) is replied to only once every
//! page it touched is acknowledged under the client's resilience mode (or, for a page a TRIM
//! discarded, taken out of the store's page map); all connections share
//! one remote memory and one page-lock table, so the export is consistent across connections
//! (CAN_MULTI_CONN) and FLUSH is a barrier with nothing to flush; a malformed message closes
//! only the connection that sent it; a request outside the export gets EINVAL and the
//! connection goes on (the protocol document asks for EINVAL in its size-constraints section
//! and ENOSPC for writes in its error section; EINVAL is used for all); nothing panics on
//! input. [`run`] serves until [`Shutdown::trigger`]: it stops accepting, stops reading
//! requests, replies to every request already read, closes, and returns.

mod batch;
pub mod export;
pub mod handshake;
pub mod limits;
pub mod page_locks;
pub mod pool;
pub mod transmission;
pub mod wire;

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{Shutdown as NetShutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use export::{Export, ExportError, MemStore, PageStore};
use handshake::{Haggled, Phase};
use limits::Deadlined;
pub use limits::Limits;
use transmission::Shared;

use crate::shutdown::Waker;

/// Largest READ or WRITE payload accepted (advertised in NBD_INFO_BLOCK_SIZE): the 32 MiB the
/// protocol document names as never a denial of service; a request of this size holds that
/// much memory while it runs.
pub const MAX_PAYLOAD: usize = 32 << 20;
/// Why a connection was cut during the handshake.
const HANDSHAKE_LATE: &str = "the NBD handshake did not finish within the handshake time \
     (a stalled or trickling client; see --handshake-timeout)";

/// Why a connection ended abnormally (logged; the server goes on).
#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    /// The client sent bytes that are not valid NBD.
    #[error("NBD protocol violation: {0}")]
    Wire(#[from] wire::WireError),
    /// The connection failed.
    #[error("connection error: {0}")]
    Io(#[from] io::Error),
    /// NBD_OPT_EXPORT_NAME named an export that does not exist (that option has no error
    /// reply, so the protocol requires closing the connection).
    #[error("the client asked for export {0:?} with NBD_OPT_EXPORT_NAME, which this server does not serve; use the export name given with --name (or the empty default name)")]
    UnknownExport(String),
    /// An option's data exceeds what the server will read.
    #[error("{option} with {len} bytes of data is larger than this server accepts")]
    OptionTooLarge {
        /// The option.
        option: String,
        /// Its declared data length.
        len: u32,
    },
    /// The client asked for the export with NBD_OPT_EXPORT_NAME before STARTTLS on a server
    /// that requires TLS (that option has no error reply: the connection is closed).
    #[error("the client asked for the export before starting TLS, which this server requires; connect with TLS (e.g. an nbds:// URI with the member's certificates)")]
    TlsRequired,
    /// The connection ended inside a WRITE payload (the write was not done nor acknowledged).
    #[error("connection ended inside the payload of a {len}-byte write at offset {offset} (that write was not applied)")]
    TruncatedPayload {
        /// Declared length.
        len: u32,
        /// Offset of the write.
        offset: u64,
    },
}

/// What clients see of the export besides its size and contents.
#[derive(Debug, Clone)]
pub struct ExportConfig {
    /// Export name (NBD_OPT_LIST, NBD_INFO_NAME); the empty name also selects it.
    pub name: String,
    /// Human-readable description (LIST, NBD_INFO_DESCRIPTION).
    pub description: String,
    /// Worker threads shared by all connections (1: every request runs in order on its
    /// connection's thread).
    pub workers: usize,
    /// TLS required of every client (STARTTLS, mutual, certificates from the cluster CA);
    /// `None`: plain.
    pub tls: Option<crate::tls::Tls>,
}

impl ExportConfig {
    /// Whether a client asking for `name` gets this export.
    pub fn serves(&self, name: &str) -> bool {
        name.is_empty() || name == self.name
    }
}

/// A connection of either kind.
#[derive(Debug)]
pub enum Stream {
    /// TCP.
    Tcp(TcpStream),
    /// A Unix domain socket.
    Unix(UnixStream),
}

impl Stream {
    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    fn shutdown(&self, how: NetShutdown) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s) => s.shutdown(how),
        };
    }

    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }

    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Unix(s) => s.set_write_timeout(t),
        }
    }

    fn peer(&self) -> String {
        match self {
            Stream::Tcp(s) => s.peer_addr().map(|a| a.to_string()),
            Stream::Unix(_) => Ok("unix socket".to_string()),
        }
        .unwrap_or_else(|_| "?".into())
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl Read for &Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => (&*s).read(buf),
            Stream::Unix(s) => (&*s).read(buf),
        }
    }
}

impl Write for &Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => (&*s).write(buf),
            Stream::Unix(s) => (&*s).write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Where the server listens.
#[derive(Debug)]
pub enum Listener {
    /// A TCP address (port 0 picks a free port).
    Tcp(TcpListener),
    /// A Unix domain socket at a path (removed when the server stops).
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// Listens on a TCP address.
    pub fn tcp(addr: &str) -> io::Result<Listener> {
        TcpListener::bind(addr).map(Listener::Tcp)
    }

    /// Listens on a Unix socket at `path`. A socket file left behind by a server that is no
    /// longer running is replaced; a live one, or any other file, is an error.
    pub fn unix(path: &Path) -> io::Result<Listener> {
        use std::os::unix::fs::FileTypeExt;
        if let Ok(m) = std::fs::symlink_metadata(path) {
            if !m.file_type().is_socket() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "the path exists and is not a socket",
                ));
            }
            if UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    "another server is listening on this socket",
                ));
            }
            std::fs::remove_file(path)?;
        }
        UnixListener::bind(path).map(|l| Listener::Unix(l, path.to_path_buf()))
    }

    /// The address clients connect to, for logs and scripts.
    pub fn describe(&self) -> String {
        match self {
            Listener::Tcp(l) => l
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "?".into()),
            Listener::Unix(_, p) => p.display().to_string(),
        }
    }

    /// The TCP address, if any (tests connect to it).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match self {
            Listener::Tcp(l) => l.local_addr().ok(),
            Listener::Unix(..) => None,
        }
    }

    fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Tcp(l) => l.accept().map(|(s, _)| {
                // Replies are written whole; never let Nagle hold a small one back.
                let _ = s.set_nodelay(true);
                Stream::Tcp(s)
            }),
            Listener::Unix(l, _) => l.accept().map(|(s, _)| Stream::Unix(s)),
        }
    }
}

impl crate::shutdown::Connection for Stream {
    fn clone_handle(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn shut(&self, how: NetShutdown) {
        self.shutdown(how)
    }
}

/// Stops a running [`run`]: no new connections, no new requests; what was read is replied to.
pub type Shutdown = crate::shutdown::Shutdown<Stream>;

impl Shutdown {
    /// A fresh, untriggered handle. Triggering shuts only the reading side of connections,
    /// so that the replies to requests already read still go out.
    pub fn new() -> Arc<Shutdown> {
        Shutdown::with(NetShutdown::Read)
    }
}

/// Serves `export` on `listener` until `shutdown` is triggered, within `limits`, then waits
/// for every connection to reply to the requests it read and close. A Unix socket file is
/// removed.
pub fn run(
    listener: Listener,
    export: Arc<Export>,
    config: ExportConfig,
    limits: Limits,
    shutdown: Arc<Shutdown>,
) -> io::Result<()> {
    shutdown.set_waker(match &listener {
        Listener::Tcp(l) => Waker::Tcp(l.local_addr()?),
        Listener::Unix(_, p) => Waker::Unix(p.clone()),
    });
    let shared = Shared::new(config.workers, &limits);
    tracing::info!(
        addr = %listener.describe(),
        export = %config.name,
        size = export.size(),
        workers = shared.pool.as_ref().map_or(0, |p| p.size()),
        max_connections = limits.max_connections,
        bytes_in_flight = limits.bytes_in_flight,
        tls = config.tls.is_some(),
        "NBD server listening"
    );
    let serving = Arc::new(Serving {
        export,
        config,
        limits,
        shared,
        shutdown: shutdown.clone(),
    });
    let connections = metrics::gauge!("hydramem_nbd_connections");
    let mut threads: Vec<std::thread::JoinHandle<()>> = Vec::new();
    let refused = crate::sampled::Sampled::new(1000);
    loop {
        let accepted = listener.accept();
        if shutdown.is_triggered() {
            break;
        }
        let stream = match accepted {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and friends: log, back off briefly, keep serving the others.
                tracing::warn!(error = %e, "NBD accept failed");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if shutdown.tracked() >= limits.max_connections {
            // Closed at once: a flood of connections costs the server no thread and no buffer.
            metrics::counter!("hydramem_nbd_connections_refused_total").increment(1);
            if let Some(refused_so_far) = refused.hit() {
                tracing::warn!(
                    peer = %stream.peer(),
                    max = limits.max_connections,
                    refused_so_far,
                    "refusing NBD connections: the server serves --max-connections already"
                );
            }
            stream.shutdown(NetShutdown::Both);
            continue;
        }
        let id = shutdown.register(&stream);
        let (serving, gauge) = (serving.clone(), connections.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("nbd-conn-{id}"))
            .spawn(move || {
                gauge.increment(1.0);
                connection(stream, id, &serving);
                gauge.decrement(1.0);
                serving.shutdown.unregister(id);
            });
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start a thread for an NBD connection");
                shutdown.unregister(id);
            }
        }
        threads.retain(|t| !t.is_finished());
    }
    threads.retain(|t| !t.is_finished());
    tracing::info!(
        connections = threads.len(),
        "NBD server stopping: finishing requests in flight"
    );
    for t in threads {
        let _ = t.join();
    }
    if let Listener::Unix(_, p) = &listener {
        let _ = std::fs::remove_file(p);
    }
    tracing::info!("NBD server stopped");
    Ok(())
}

/// What every connection of one server serves, and within what.
struct Serving {
    export: Arc<Export>,
    config: ExportConfig,
    limits: Limits,
    shared: Shared,
    shutdown: Arc<Shutdown>,
}

/// Serves one connection from greeting to close.
fn connection(stream: Stream, id: u64, serving: &Serving) {
    let peer = stream.peer();
    tracing::info!(conn = id, %peer, "NBD client connected");
    let result = session(&stream, id, serving);
    match result {
        Ok(Some(end)) => tracing::info!(conn = id, ?end, "NBD client disconnected"),
        Ok(None) => tracing::info!(conn = id, "NBD client left during the handshake"),
        Err(NbdError::Io(e)) if e.kind() == io::ErrorKind::TimedOut => {
            metrics::counter!("hydramem_nbd_connections_timed_out_total").increment(1);
            // A flood of silent or trickling peers must not become a flood of log lines.
            if let Some(cut_off_so_far) = TIMED_OUT.hit() {
                tracing::warn!(conn = id, %peer, error = %e, cut_off_so_far, "closing NBD connection");
            } else {
                tracing::debug!(conn = id, %peer, error = %e, "closing NBD connection");
            }
        }
        Err(e) => {
            metrics::counter!("hydramem_nbd_protocol_errors_total").increment(1);
            tracing::warn!(conn = id, %peer, error = %e, "closing NBD connection");
        }
    }
    stream.shutdown(NetShutdown::Both);
}

/// The handshake (with STARTTLS when the server has TLS) and the transmission phase of one
/// connection; `None` if the client left during the handshake.
fn session(
    stream: &Stream,
    id: u64,
    serving: &Serving,
) -> Result<Option<transmission::End>, NbdError> {
    let Serving {
        export,
        config,
        limits,
        shared,
        shutdown: sd,
    } = serving;
    let accepted = std::time::Instant::now();
    // Reads wake every tick to check their deadline; a reply the client does not take
    // within the request time fails (and ends the connection).
    stream.set_read_timeout(Some(limits::TICK))?;
    stream.set_write_timeout(Some(limits.request))?;
    let mut input = Deadlined::new(stream.try_clone()?);
    input.until(accepted + limits.handshake, HANDSHAKE_LATE);
    let mut r = BufReader::with_capacity(256 << 10, input);
    let mut w = stream.try_clone()?;
    let stopping = || sd.is_triggered();
    let Some(client) = handshake::greet(&mut r, &mut w)? else {
        return Ok(None);
    };
    let size = export.size();
    let Some(tls) = &config.tls else {
        let n = match handshake::haggle(
            &mut r,
            &mut w,
            client,
            config,
            size,
            Phase::Plain,
            stopping,
        )? {
            Haggled::Transmission(n) => n,
            Haggled::Ended | Haggled::StartTls => return Ok(None),
        };
        log_transmission(id, n, false);
        let w = BufWriter::with_capacity(64 << 10, w);
        return transmission::serve(&mut r, w, export, n, shared, stopping).map(Some);
    };
    match handshake::haggle(
        &mut r,
        &mut w,
        client,
        config,
        size,
        Phase::TlsRequired,
        stopping,
    )? {
        Haggled::StartTls => {}
        Haggled::Ended | Haggled::Transmission(_) => return Ok(None),
    }
    // TLS from here on; bytes of its handshake the client sent early are in the buffer.
    let early = r.buffer().to_vec();
    let deadline = accepted + limits.handshake;
    let (rd, wr) = tls.start_server(stream.try_clone()?, &early, deadline)?;
    let mut input = Deadlined::new(rd);
    input.until(deadline, HANDSHAKE_LATE);
    let mut r = BufReader::with_capacity(256 << 10, input);
    let mut w = wr.clone();
    let n = match handshake::haggle(&mut r, &mut w, client, config, size, Phase::InTls, stopping)? {
        Haggled::Transmission(n) => n,
        Haggled::Ended | Haggled::StartTls => return Ok(None),
    };
    log_transmission(id, n, true);
    let w = BufWriter::with_capacity(64 << 10, wr);
    transmission::serve(&mut r, w, export, n, shared, stopping).map(Some)
}

fn log_transmission(id: u64, n: handshake::Negotiated, tls: bool) {
    tracing::info!(
        conn = id,
        structured = n.structured,
        tls,
        flags = format_args!("{:#06x}", n.flags),
        "NBD transmission"
    );
}

/// Connections cut off by a deadline since the server started (their log lines are sampled).
static TIMED_OUT: crate::sampled::Sampled = crate::sampled::Sampled::new(1000);
