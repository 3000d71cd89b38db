//! The node's network front: accepts connections and serves each on its own thread.
//!
//! A connection is served strictly in order: read one frame, act, append the reply to an output
//! buffer, and flush the buffer only when no further request is already buffered. Pipelined
//! requests therefore get their replies in batches (one write system call for many replies)
//! while a lone request is answered at once. Blocking threads rather than an event loop because
//! a node serves few connections (one or two per client) and a blocked thread wakes faster than
//! an executor hop, which is the latency that matters here.
//!
//! A frame that fails to parse ends that connection with a logged reason; the node and its
//! other connections are unaffected. [`run`] returns when [`Shutdown::trigger`] is called.

use std::io::{self, BufReader, Read, Write};
use std::net::{Shutdown as NetShutdown, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Faults, Node};
use crate::wire::{
    self, ClientId, Fault, FrameBuilder, Header, HelloReply, Op, ReplyEntry, Request, Status,
    WireError, HEADER_LEN, HELLO_OBSERVER, MAX_BODY,
};

/// Stops a running [`run`]: the accept loop ends and every open connection is shut down
/// (both directions: a node's clients re-send what was in flight to a node that stops).
pub type Shutdown = crate::shutdown::Shutdown<TcpStream>;

impl Shutdown {
    /// A fresh, untriggered handle.
    pub fn new() -> Arc<Shutdown> {
        Shutdown::with(NetShutdown::Both)
    }
}

/// Serves `node` on `listener` until `shutdown` is triggered.
pub fn run(listener: TcpListener, node: Arc<Node>, shutdown: Arc<Shutdown>) -> io::Result<()> {
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
        let _ = stream.set_nodelay(true);
        let key = shutdown.register(&stream);
        let node = node.clone();
        let sd = shutdown.clone();
        let spawned = std::thread::Builder::new()
            .name("hm-conn".into())
            .spawn(move || {
                let mut conn = Connection::new(node.clone(), sd.clone(), key);
                match conn.serve(stream) {
                    Ok(()) => tracing::debug!(?peer, "connection closed by peer"),
                    Err(ConnError::Protocol(e)) => {
                        metrics::counter!("hydramem_node_protocol_errors_total").increment(1);
                        tracing::warn!(?peer, reason = %e, "closing connection: malformed frame")
                    }
                    Err(ConnError::Io(e)) => tracing::debug!(?peer, error = %e, "connection ended"),
                }
                if conn.counted {
                    node.client_disconnected();
                }
                if let Some(c) = sd.unregister(key) {
                    let _ = c.shutdown(NetShutdown::Both);
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot spawn a connection thread; dropping connection");
        }
    }
    tracing::info!(addr = %local, "memory node stopped accepting");
    Ok(())
}

#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error(transparent)]
    Protocol(#[from] WireError),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Per-connection state: the identity said in HELLO and reusable buffers.
struct Connection {
    node: Arc<Node>,
    shutdown: Arc<Shutdown>,
    key: u64,
    client: Option<ClientId>,
    observer: bool,
    counted: bool,
    body: Vec<u8>,
    out: Vec<u8>,
}

impl Connection {
    fn new(node: Arc<Node>, shutdown: Arc<Shutdown>, key: u64) -> Connection {
        Connection {
            node,
            shutdown,
            key,
            client: None,
            observer: false,
            counted: false,
            body: Vec::with_capacity(64 << 10),
            out: Vec::with_capacity(256 << 10),
        }
    }

    fn serve(&mut self, stream: TcpStream) -> Result<(), ConnError> {
        let mut reader = BufReader::with_capacity(256 << 10, stream.try_clone()?);
        let mut writer = stream;
        loop {
            let mut hb = [0u8; HEADER_LEN];
            // The magic first, so that a peer speaking another protocol is turned away at once
            // instead of holding the connection while we wait for a full header.
            match reader.read_exact(&mut hb[..4]) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e.into()),
            }
            if hb[..4] != wire::MAGIC {
                return Err(WireError::BadMagic([hb[0], hb[1], hb[2], hb[3]]).into());
            }
            reader.read_exact(&mut hb[4..])?;
            let h = Header::parse(&hb)?;
            self.body.resize(h.body_len as usize, 0);
            reader.read_exact(&mut self.body)?;
            if h.op != Op::Fault {
                self.hold_while_stopped();
            }
            let body = std::mem::take(&mut self.body);
            let r = self.handle(&h, &body);
            self.body = body;
            r?;
            if reader.buffer().is_empty() || self.out.len() > MAX_BODY {
                let delay = self.node.faults.delay_us.load(Ordering::Relaxed);
                if delay > 0 {
                    std::thread::sleep(std::time::Duration::from_micros(delay));
                }
                writer.write_all(&self.out)?;
                self.out.clear();
            }
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

    /// Applies a FAULT request; `Forbidden` unless the node allows fault injection.
    fn fault(&self, fault: Fault) -> Status {
        let node = &self.node;
        if !node.config().allow_faults {
            tracing::warn!(
                ?fault,
                "fault injection refused: node not started with --allow-fault-injection"
            );
            return Status::Forbidden;
        }
        tracing::warn!(?fault, "injecting fault");
        let f = &node.faults;
        match fault {
            Fault::Clear => {
                f.delay_us.store(0, Ordering::Relaxed);
                f.refuse_alloc.store(false, Ordering::Relaxed);
                node.simulated.total.store(0, Ordering::Relaxed);
                node.simulated.available.store(u64::MAX, Ordering::Relaxed);
                f.clear_corruption();
                *f.stopped.lock() = false;
                f.resumed.notify_all();
            }
            Fault::DelayReplies(us) => f.delay_us.store(us, Ordering::Relaxed),
            Fault::StopAnswering => *f.stopped.lock() = true,
            Fault::RefuseAlloc => f.refuse_alloc.store(true, Ordering::Relaxed),
            Fault::DropConnections => {
                self.shutdown.drop_others(self.key);
            }
            // Dies on the spot, without replying or cleaning up; exit rather than abort so
            // that test machines do not collect core dumps.
            Fault::Crash => std::process::exit(134),
            Fault::MemoryTotal(b) => node.simulated.total.store(b, Ordering::Relaxed),
            Fault::MemoryAvailable(b) => node.simulated.available.store(b, Ordering::Relaxed),
            Fault::CorruptSlab(slab) => match node.corrupt_slab(slab) {
                Ok(splits) => tracing::warn!(slab, splits, "corrupted stored splits"),
                Err(st) => return st,
            },
            Fault::CorruptWrites(c) => f.corrupt_writes.store(c.encode(), Ordering::Relaxed),
            Fault::CorruptReplies(c) => f.corrupt_replies.store(c.encode(), Ordering::Relaxed),
            Fault::MisdirectReads(c) => f.misdirect_reads.store(c.encode(), Ordering::Relaxed),
        }
        Status::Ok
    }

    fn handle(&mut self, h: &Header, body: &[u8]) -> Result<(), ConnError> {
        let req = wire::parse_request(h, body)?;
        let node = self.node.clone();
        let out = &mut self.out;
        let client = match (&req, self.client, self.observer) {
            (
                Request::Hello(_)
                | Request::Ping
                | Request::Stats
                | Request::Fault(_)
                | Request::Drain(_),
                _,
                _,
            ) => None,
            (_, Some(c), false) => Some(c),
            _ => {
                let fb = FrameBuilder::begin(out, h.op, true, Status::NotIdentified, h.id);
                fb.finish(out)?;
                return Ok(());
            }
        };
        let fb_ok = |out: &mut Vec<u8>| FrameBuilder::begin(out, h.op, true, Status::Ok, h.id);
        match req {
            Request::Hello(hello) => {
                if self.client.is_some() && self.client != Some(hello.client) {
                    return Err(WireError::Invalid(
                        "HELLO with a different identity on one connection",
                    )
                    .into());
                }
                self.observer = hello.flags & HELLO_OBSERVER != 0;
                self.client = Some(hello.client);
                if !self.observer && !self.counted {
                    self.counted = true;
                    node.client_connected();
                }
                tracing::debug!(client = ?hello.client, observer = self.observer, "hello");
                let fb = fb_ok(out);
                HelloReply {
                    node_id: node.config().id,
                    slab_size: node.config().slab_size,
                    capacity: node.config().capacity,
                    max_body: MAX_BODY as u32,
                    incarnation: node.incarnation(),
                }
                .put(out);
                fb.finish(out)?;
            }
            Request::Ping => {
                let fb = fb_ok(out);
                // A client's heartbeat learns whether the node wants slabs back.
                if let (Some(c), false) = (self.client, self.observer) {
                    node.notice_for(&c).put(out);
                }
                fb.finish(out)?
            }
            Request::Reclaims => {
                let fb = fb_ok(out);
                wire::put_reclaims(out, &node.reclaims_for(&client.expect("identified")));
                fb.finish(out)?;
            }
            Request::Drain(start) => {
                node.drain(start);
                fb_ok(out).finish(out)?;
            }
            Request::Corrupt(list) => match list.reports() {
                Ok(reports) => {
                    let accepted = node.report_corrupt(&client.expect("identified"), &reports);
                    let fb = fb_ok(out);
                    out.extend_from_slice(&accepted.to_le_bytes());
                    fb.finish(out)?;
                }
                Err(e) => {
                    // Refused as a whole, connection kept (see `wire::CorruptReport`).
                    tracing::warn!(reason = %e, records = list.len(), "CORRUPT report refused");
                    FrameBuilder::begin(out, h.op, true, Status::BadRequest, h.id).finish(out)?;
                }
            },
            Request::Regen(req) => {
                let c = client.expect("identified");
                let st = if req.client != c {
                    tracing::warn!("REGEN for another identity refused");
                    Err(Status::NoSuchSlab)
                } else {
                    tracing::info!(
                        slab = req.slab,
                        split = req.target,
                        pages = req.pages,
                        "regenerating a slab"
                    );
                    let t0 = std::time::Instant::now();
                    super::regen::regenerate(&node, &req).map_err(|e| {
                        tracing::warn!(error = %e, slab = req.slab, "regeneration failed");
                        Status::Internal
                    }).inspect(|pages| {
                        tracing::info!(slab = req.slab, pages, elapsed = ?t0.elapsed(), "slab regenerated");
                    })
                };
                match st {
                    Ok(pages) => {
                        let fb = FrameBuilder::begin(&mut self.out, h.op, true, Status::Ok, h.id);
                        self.out.extend_from_slice(&pages.to_le_bytes());
                        fb.finish(&mut self.out)?;
                    }
                    Err(st) => FrameBuilder::begin(&mut self.out, h.op, true, st, h.id)
                        .finish(&mut self.out)?,
                }
            }
            Request::Fault(fault) => {
                let st = self.fault(fault);
                FrameBuilder::begin(&mut self.out, h.op, true, st, h.id).finish(&mut self.out)?;
            }
            Request::Stats => {
                let fb = fb_ok(out);
                node.stats().put(out);
                fb.finish(out)?;
            }
            Request::Alloc { tag, split_len } => {
                let c = client.expect("identified");
                match node.alloc(c, tag, split_len) {
                    Ok(slab) => {
                        let fb = fb_ok(out);
                        out.extend_from_slice(&slab.to_le_bytes());
                        fb.finish(out)?;
                    }
                    Err(st) => FrameBuilder::begin(out, h.op, true, st, h.id).finish(out)?,
                }
            }
            Request::Free { slab } => {
                let st = match node.free(&client.expect("identified"), slab) {
                    Ok(()) => Status::Ok,
                    Err(st) => st,
                };
                FrameBuilder::begin(out, h.op, true, st, h.id).finish(out)?;
            }
            Request::List => {
                let fb = fb_ok(out);
                wire::put_list(out, &node.list(&client.expect("identified")));
                fb.finish(out)?;
            }
            Request::WriteV(entries) => {
                let c = client.expect("identified");
                let fb = fb_ok(out);
                out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
                for (e, d) in entries.iter() {
                    let st = if e.len == 0 {
                        Status::BadRequest
                    } else {
                        match node.slab(&c, e.slab).and_then(|s| {
                            s.store(e.offset, d, e.version, e.crc)?;
                            if Faults::hits(&node.faults.corrupt_writes, e.slab) {
                                s.corrupt(e.offset)?;
                            }
                            Ok(())
                        }) {
                            Ok(()) => Status::Ok,
                            Err(st) => st,
                        }
                    };
                    ReplyEntry::put_write(out, e.cookie, st);
                }
                metrics::counter!("hydramem_node_write_entries_total")
                    .increment(entries.len() as u64);
                metrics::counter!("hydramem_node_bytes_written_total")
                    .increment(entries.data_len() as u64);
                fb.finish(out)?;
            }
            Request::ReadV(entries) => {
                let c = client.expect("identified");
                let frame_start = out.len();
                let fb = fb_ok(out);
                out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
                let mut bytes = 0u64;
                for e in entries.iter() {
                    let len = e.len as usize;
                    let slab = if e.len == 0 {
                        Err(Status::BadRequest)
                    } else {
                        node.slab(&c, e.slab)
                    };
                    let head = out.len();
                    ReplyEntry::put_read(out, e.cookie, Status::Ok, e.len, 0, 0);
                    let start = out.len();
                    // The reply must fit one frame: refuse entries that would overflow it.
                    let fits = start + len - frame_start - HEADER_LEN <= MAX_BODY;
                    let r = slab.and_then(|s| {
                        if !fits {
                            return Err(Status::BadRequest);
                        }
                        out.resize(start + len, 0);
                        let data = &mut out[start..start + len];
                        let f = &node.faults;
                        let stamp = if Faults::hits(&f.misdirect_reads, e.slab) {
                            s.read_misdirected(e.offset, data)?
                        } else {
                            s.load(e.offset, data)?
                        };
                        if Faults::hits(&f.corrupt_replies, e.slab) {
                            super::flip_random_bit(data);
                        }
                        Ok(stamp)
                    });
                    match r {
                        Ok((version, crc)) => {
                            // Version and crc are the last 12 bytes of the entry header.
                            out[start - 12..start - 4].copy_from_slice(&version.to_le_bytes());
                            out[start - 4..start].copy_from_slice(&crc.to_le_bytes());
                            bytes += len as u64;
                        }
                        Err(st) => {
                            out.truncate(head);
                            ReplyEntry::put_read(out, e.cookie, st, 0, 0, 0);
                        }
                    }
                }
                metrics::counter!("hydramem_node_read_entries_total")
                    .increment(entries.len() as u64);
                metrics::counter!("hydramem_node_bytes_read_total").increment(bytes);
                fb.finish(out)?;
            }
        }
        Ok(())
    }
}
