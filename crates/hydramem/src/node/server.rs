//! The node's network front: accepts connections and serves each on its own thread.
//!
//! A connection is served strictly in order: read one frame, act, append the reply to an output
//! buffer, and flush the buffer only when no further request is already buffered. Pipelined
//! requests therefore get their replies in batches (one write system call for many replies)
//! while a lone request is answered at once. Blocking threads rather than an event loop because
//! a node serves few connections (one or two per client) and a blocked thread wakes faster than
//! an executor hop, which is the latency that matters here.
//!
//! What a request means is [`super::session`]'s business; this module moves frames. A frame
//! that fails to parse ends that connection with a logged reason; the node and its other
//! connections are unaffected. Whatever way a connection's thread ends — the peer leaves, a
//! malformed frame, an I/O error, even a panic in a handler (a bug: caught, logged and counted)
//! — the connection is unregistered, its socket shut and its client uncounted, by guards that
//! run on every path. [`run`] returns when [`Shutdown::trigger`] is called. What a connection
//! may hold — how many there are, how long a peer may take to identify itself or to send a
//! frame, how much buffer stays — is bounded by [`super::limits`].

use std::io;
use std::net::{Shutdown as NetShutdown, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::limits::{self, ConnLimits, FrameReader, ReadError};
use super::session::{After, Session};
use super::Node;
use crate::wire::{Header, Op, WireError, HEADER_LEN, MAX_BODY};

/// Stops a running [`run`]: the accept loop ends and every open connection is shut down
/// (both directions: a node's clients re-send what was in flight to a node that stops).
pub type Shutdown = crate::shutdown::Shutdown<TcpStream>;

impl Shutdown {
    /// A fresh, untriggered handle.
    pub fn new() -> Arc<Shutdown> {
        Shutdown::with(NetShutdown::Both)
    }
}

/// Serves `node` on `listener` until `shutdown` is triggered, within `limits`.
pub fn run(
    listener: TcpListener,
    node: Arc<Node>,
    shutdown: Arc<Shutdown>,
    limits: ConnLimits,
) -> io::Result<()> {
    let refused = crate::sampled::Sampled::new(1000);
    let local = listener.local_addr()?;
    shutdown.set_waker(crate::shutdown::Waker::Tcp(local));
    tracing::info!(addr = %local, node = node.config().id, "memory node serving");
    for conn in listener.incoming() {
        if shutdown.is_triggered() {
            break;
        }
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and friends: log, back off briefly, keep serving the others.
                tracing::warn!(error = %e, "accept failed");
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
        };
        let peer = stream.peer_addr().ok();
        if shutdown.tracked() >= limits.max_connections {
            // Closed at once: a flood of connections costs a node no thread and no buffer.
            metrics::counter!("hydramem_node_connections_refused_total").increment(1);
            if let Some(refused_so_far) = refused.hit() {
                tracing::warn!(
                    ?peer,
                    max = limits.max_connections,
                    refused_so_far,
                    "refusing connections: the node serves --max-connections already"
                );
            }
            continue;
        }
        let _ = stream.set_nodelay(true);
        if let Err(e) = limits::keep_alive(&stream) {
            // The connection works without; only a vanished peer's would then stay open.
            tracing::debug!(?peer, error = %e, "cannot turn on TCP keepalive");
        }
        let key = shutdown.register(&stream);
        let node = node.clone();
        let sd = shutdown.clone();
        let spawned = std::thread::Builder::new()
            .name("hm-conn".into())
            .spawn(move || {
                let _registered = Registered {
                    shutdown: sd.clone(),
                    key,
                };
                let mut conn = Connection::new(node, sd, key, limits);
                let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    conn.serve(stream)
                }));
                match served {
                    Ok(Ok(())) => tracing::debug!(?peer, "connection closed by peer"),
                    Ok(Err(ConnError::Protocol(e))) => {
                        metrics::counter!("hydramem_node_protocol_errors_total").increment(1);
                        tracing::warn!(?peer, reason = %e, "closing connection: malformed frame")
                    }
                    Ok(Err(ConnError::Io(e))) => {
                        tracing::debug!(?peer, error = %e, "connection ended")
                    }
                    Ok(Err(ConnError::Tls(why))) => {
                        metrics::counter!("hydramem_node_tls_refused_total").increment(1);
                        // Sampled as timeouts are: a scan of the port must not flood the log.
                        if let Some(refused_so_far) = TLS_REFUSED.hit() {
                            tracing::warn!(?peer, reason = %why, refused_so_far, "closing connection: no TLS with a certificate of this cluster");
                        } else {
                            tracing::debug!(?peer, reason = %why, "closing connection: TLS failed");
                        }
                    }
                    Ok(Err(ConnError::Deadline(why))) => {
                        metrics::counter!("hydramem_node_connections_timed_out_total").increment(1);
                        // A flood of silent peers must not become a flood of log lines.
                        if let Some(cut_off_so_far) = TIMED_OUT.hit() {
                            tracing::warn!(?peer, reason = why, cut_off_so_far, "closing connection");
                        } else {
                            tracing::debug!(?peer, reason = why, "closing connection");
                        }
                    }
                    Err(panic) => {
                        metrics::counter!("hydramem_node_handler_panics_total").increment(1);
                        let what = panic
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_default();
                        tracing::error!(?peer, panic = %what, "a request handler panicked (a bug; please report it): closing this connection, the node goes on");
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot spawn a connection thread; dropping connection");
        }
    }
    tracing::info!(addr = %local, "memory node stopped accepting");
    Ok(())
}

/// Connections cut off by a deadline since the node started (their log lines are sampled).
static TIMED_OUT: crate::sampled::Sampled = crate::sampled::Sampled::new(1000);
/// Connections whose TLS handshake failed since the node started (sampled likewise).
static TLS_REFUSED: crate::sampled::Sampled = crate::sampled::Sampled::new(1000);

/// Unregisters a connection and shuts its socket when its thread ends, however it ends.
struct Registered {
    shutdown: Arc<Shutdown>,
    key: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(c) = self.shutdown.unregister(self.key) {
            let _ = c.shutdown(NetShutdown::Both);
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error(transparent)]
    Protocol(#[from] WireError),
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("{0}")]
    Deadline(&'static str),
    #[error("{0}")]
    Tls(String),
}

impl From<ReadError> for ConnError {
    fn from(e: ReadError) -> ConnError {
        match e {
            ReadError::Closed => ConnError::Io(io::ErrorKind::UnexpectedEof.into()),
            ReadError::Deadline(why) => ConnError::Deadline(why),
            ReadError::Io(e) => ConnError::Io(e),
        }
    }
}

/// Per-connection state: the session and reusable buffers.
struct Connection {
    node: Arc<Node>,
    session: Session,
    shutdown: Arc<Shutdown>,
    key: u64,
    limits: ConnLimits,
    body: Vec<u8>,
    out: Vec<u8>,
}

impl Connection {
    fn new(node: Arc<Node>, shutdown: Arc<Shutdown>, key: u64, limits: ConnLimits) -> Connection {
        Connection {
            session: Session::new(node.clone()),
            node,
            shutdown,
            key,
            limits,
            body: Vec::with_capacity(64 << 10),
            out: Vec::with_capacity(256 << 10),
        }
    }

    fn serve(&mut self, stream: TcpStream) -> Result<(), ConnError> {
        let tls = self.node.config().tls.clone();
        let mut reader =
            FrameReader::new(stream, self.limits, tls.as_ref()).map_err(|e| match e.kind() {
                io::ErrorKind::TimedOut if tls.is_some() => {
                    ConnError::Deadline("the TLS handshake did not finish in time")
                }
                _ if tls.is_some() => ConnError::Tls(e.to_string()),
                _ => ConnError::Io(e),
            })?;
        let sd = self.shutdown.clone();
        let stop = move || sd.is_triggered();
        loop {
            let mut hb = [0u8; HEADER_LEN];
            // The magic first, so that a peer speaking another protocol is turned away at once
            // instead of holding the connection while we wait for a full header.
            let identified = self.session.client().is_some();
            let began = match reader.first(&mut hb[..4], identified, &stop) {
                Ok(t) => t,
                Err(ReadError::Closed) => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            Header::check_magic(hb[..4].try_into().expect("4 bytes"))?;
            reader.rest(&mut hb[4..], began)?;
            let h = Header::parse(&hb)?;
            // The buffer grows to at most MAX_BODY and shrinks back after a large frame; a
            // body is read without zeroing its bytes first.
            let len = h.body_len as usize;
            if self.body.len() < len {
                self.body.resize(len, 0);
            }
            reader.rest(&mut self.body[..len], began)?;
            if h.op != Op::Fault {
                self.hold_while_stopped();
            }
            let body = &self.body[..len];
            let gone = || stop() || reader.peer_gone();
            match self
                .session
                .handle_watching(&h, body, &mut self.out, &gone)?
            {
                After::Reply => {}
                After::DropOtherConnections => self.shutdown.drop_others(self.key),
                After::Close => {
                    reader.send(&self.out)?;
                    return Ok(());
                }
            }
            if !reader.buffered() || self.out.len() > MAX_BODY {
                let delay = self.node.faults.delay_us.load(Ordering::Relaxed);
                if delay > 0 {
                    std::thread::sleep(std::time::Duration::from_micros(delay));
                }
                reader.send(&self.out)?;
                self.out.clear();
                limits::shrink(&mut self.out);
            }
            limits::shrink(&mut self.body);
        }
    }

    /// Injected "stop answering": wait until the fault is cleared or the node shuts down.
    fn hold_while_stopped(&self) {
        let f = &self.node.faults;
        let mut stopped = f.stopped.lock();
        while *stopped && !self.shutdown.is_triggered() {
            f.resumed
                .wait_for(&mut stopped, std::time::Duration::from_millis(100));
        }
    }
}
