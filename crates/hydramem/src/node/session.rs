//! One client's session with the node: what each request means, independent of sockets.
//!
//! A [`Session`] holds what a connection has said about itself (the identity given in HELLO,
//! whether it is an observer) and turns one parsed request frame into its reply, appended to
//! an output buffer. The server ([`super::server`]) owns the socket and calls
//! [`Session::handle`] for every frame it reads; the fuzz target drives the same function with
//! arbitrary frames on an in-memory node.
//!
//! Invariants: every request that parses gets exactly one reply frame, whatever its content; a
//! request that does not parse is an error that ends the connection, and changes nothing; no
//! input panics (slot arithmetic is checked in [`super::slab`], REGEN is validated before it
//! allocates or connects, see [`super::regen`]); a session that counted itself as a connected
//! client uncounts itself when dropped, on every path out of a connection, unwinding included.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Faults, Node};
use crate::wire::{
    self, ClientId, Fault, FrameBuilder, Header, HelloReply, ReplyEntry, Request, Status,
    WireError, HEADER_LEN, HELLO_OBSERVER, MAX_BODY,
};

/// What the connection must do after a request, besides sending the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// Nothing more.
    Reply,
    /// Injected fault: drop every other connection of the node.
    DropOtherConnections,
}

/// The state of one connection's conversation with the node.
pub struct Session {
    node: Arc<Node>,
    client: Option<ClientId>,
    observer: bool,
    counted: bool,
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.counted {
            self.node.client_disconnected();
        }
    }
}

impl Session {
    /// A session that has not said HELLO yet.
    pub fn new(node: Arc<Node>) -> Session {
        Session {
            node,
            client: None,
            observer: false,
            counted: false,
        }
    }

    /// The identity said in HELLO, if any.
    pub fn client(&self) -> Option<ClientId> {
        self.client
    }

    /// Serves one request frame: appends its reply to `out`. An error means the frame is a
    /// protocol violation and the connection must be closed (nothing was changed).
    pub fn handle(
        &mut self,
        h: &Header,
        body: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<After, WireError> {
        let req = wire::parse_request(h, body)?;
        let identified = match (self.client, self.observer) {
            (Some(c), false) => Some(c),
            _ => None,
        };
        let open = matches!(
            req,
            Request::Hello(_)
                | Request::Ping
                | Request::Stats
                | Request::Fault(_)
                | Request::Drain(_)
        );
        let client = match (open, identified) {
            (true, _) => ClientId::default(),
            (false, Some(c)) => c,
            (false, None) => {
                reply_status(out, h, Status::NotIdentified)?;
                return Ok(After::Reply);
            }
        };
        let node = self.node.clone();
        match req {
            Request::Hello(hello) => self.hello(h, hello, out)?,
            Request::Ping => {
                let fb = ok(out, h);
                // A client's heartbeat learns whether the node wants slabs back.
                if let Some(c) = identified {
                    node.notice_for(&c).put(out);
                }
                fb.finish(out)?
            }
            Request::Reclaims => {
                let fb = ok(out, h);
                wire::put_reclaims(out, &node.reclaims_for(&client));
                fb.finish(out)?;
            }
            Request::Drain(start) => {
                node.drain(start);
                ok(out, h).finish(out)?;
            }
            Request::Corrupt(list) => match list.reports() {
                Ok(reports) => {
                    let accepted = node.report_corrupt(&client, &reports);
                    let fb = ok(out, h);
                    out.extend_from_slice(&accepted.to_le_bytes());
                    fb.finish(out)?;
                }
                Err(e) => {
                    // Refused as a whole, connection kept (see `wire::CorruptReport`).
                    tracing::warn!(reason = %e, records = list.len(), "CORRUPT report refused");
                    reply_status(out, h, Status::BadRequest)?;
                }
            },
            Request::Regen(req) => match super::regen::serve(&node, &client, &req) {
                Ok(pages) => {
                    let fb = ok(out, h);
                    out.extend_from_slice(&pages.to_le_bytes());
                    fb.finish(out)?;
                }
                Err(st) => reply_status(out, h, st)?,
            },
            Request::Fault(fault) => {
                let (st, after) = self.fault(fault);
                reply_status(out, h, st)?;
                return Ok(after);
            }
            Request::Stats => {
                let fb = ok(out, h);
                node.stats().put(out);
                fb.finish(out)?;
            }
            Request::Alloc { tag, split_len } => match node.alloc(client, tag, split_len) {
                Ok(slab) => {
                    let fb = ok(out, h);
                    out.extend_from_slice(&slab.to_le_bytes());
                    fb.finish(out)?;
                }
                Err(st) => reply_status(out, h, st)?,
            },
            Request::Free { slab } => {
                let st = node.free(&client, slab).err().unwrap_or(Status::Ok);
                reply_status(out, h, st)?;
            }
            Request::List => {
                let fb = ok(out, h);
                wire::put_list(out, &node.list(&client));
                fb.finish(out)?;
            }
            Request::WriteV(entries) => write_v(&node, &client, h, &entries, out)?,
            Request::ReadV(entries) => read_v(&node, &client, h, &entries, out)?,
        }
        Ok(After::Reply)
    }

    fn hello(
        &mut self,
        h: &Header,
        hello: wire::Hello,
        out: &mut Vec<u8>,
    ) -> Result<(), WireError> {
        if self.client.is_some() && self.client != Some(hello.client) {
            return Err(WireError::Invalid(
                "HELLO with a different identity on one connection",
            ));
        }
        let node = &self.node;
        self.observer = hello.flags & HELLO_OBSERVER != 0;
        self.client = Some(hello.client);
        if !self.observer && !self.counted {
            self.counted = true;
            node.client_connected();
        }
        tracing::debug!(client = ?hello.client, observer = self.observer, "hello");
        let fb = ok(out, h);
        HelloReply {
            node_id: node.config().id,
            slab_size: node.config().slab_size,
            capacity: node.config().capacity,
            max_body: MAX_BODY as u32,
            incarnation: node.incarnation(),
        }
        .put(out);
        fb.finish(out)
    }

    /// Applies a FAULT request; `Forbidden` unless the node allows fault injection.
    fn fault(&self, fault: Fault) -> (Status, After) {
        let node = &self.node;
        if !node.config().allow_faults {
            tracing::warn!(
                ?fault,
                "fault injection refused: node not started with --allow-fault-injection"
            );
            return (Status::Forbidden, After::Reply);
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
            Fault::DropConnections => return (Status::Ok, After::DropOtherConnections),
            // Dies on the spot, without replying or cleaning up; exit rather than abort so
            // that test machines do not collect core dumps.
            Fault::Crash => std::process::exit(134),
            Fault::MemoryTotal(b) => node.simulated.total.store(b, Ordering::Relaxed),
            Fault::MemoryAvailable(b) => node.simulated.available.store(b, Ordering::Relaxed),
            Fault::CorruptSlab(slab) => match node.corrupt_slab(slab) {
                Ok(splits) => tracing::warn!(slab, splits, "corrupted stored splits"),
                Err(st) => return (st, After::Reply),
            },
            Fault::CorruptWrites(c) => f.corrupt_writes.store(c.encode(), Ordering::Relaxed),
            Fault::CorruptReplies(c) => f.corrupt_replies.store(c.encode(), Ordering::Relaxed),
            Fault::MisdirectReads(c) => f.misdirect_reads.store(c.encode(), Ordering::Relaxed),
        }
        (Status::Ok, After::Reply)
    }
}

fn ok(out: &mut Vec<u8>, h: &Header) -> FrameBuilder {
    FrameBuilder::begin(out, h.op, true, Status::Ok, h.id)
}

fn reply_status(out: &mut Vec<u8>, h: &Header, st: Status) -> Result<(), WireError> {
    FrameBuilder::begin(out, h.op, true, st, h.id).finish(out)
}

/// WRITEV: stores every entry through the slab's version check; each reply entry carries the
/// version stored afterwards (the newer one that refused a `Stale` entry).
fn write_v(
    node: &Node,
    client: &ClientId,
    h: &Header,
    entries: &wire::WriteList<'_>,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    let fb = ok(out, h);
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for (e, d) in entries.iter() {
        let slab = node.slab(client, e.slab);
        let r = slab.as_ref().map_err(|st| *st).and_then(|s| {
            if e.len == 0 {
                return Err(Status::BadRequest);
            }
            s.store(e.offset, d, e.version, e.crc)?;
            if Faults::hits(&node.faults.corrupt_writes, e.slab) {
                s.corrupt(e.offset)?;
            }
            Ok(())
        });
        let (st, stored) = match (r, &slab) {
            (Ok(()), _) => (Status::Ok, e.version),
            (Err(Status::Stale), Ok(s)) => (Status::Stale, s.stored_version(e.offset).unwrap_or(0)),
            (Err(st), _) => (st, 0),
        };
        ReplyEntry::put_write(out, e.cookie, st, stored);
    }
    metrics::counter!("hydramem_node_write_entries_total").increment(entries.len() as u64);
    metrics::counter!("hydramem_node_bytes_written_total").increment(entries.data_len() as u64);
    fb.finish(out)
}

/// READV: every entry's split with its version and checksum, in one reply frame (an entry
/// that would not fit it is refused).
fn read_v(
    node: &Node,
    client: &ClientId,
    h: &Header,
    entries: &wire::EntryList<'_>,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    let frame_start = out.len();
    let fb = ok(out, h);
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    let mut bytes = 0u64;
    for e in entries.iter() {
        let len = e.len as usize;
        let head = out.len();
        // The reply must fit one frame: refuse entries that would overflow it.
        let fits = head + wire::READ_REPLY_LEN + len - frame_start - HEADER_LEN <= MAX_BODY;
        let r = if e.len == 0 || !fits {
            Err(Status::BadRequest)
        } else {
            node.slab(client, e.slab).and_then(|s| {
                let data = ReplyEntry::begin_read(out, e.cookie, e.len);
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
            })
        };
        match r {
            Ok((version, crc)) => {
                ReplyEntry::stamp_read(&mut out[head..], version, crc);
                bytes += len as u64;
            }
            Err(st) => {
                out.truncate(head);
                ReplyEntry::put_read(out, e.cookie, st, 0, 0, 0);
            }
        }
    }
    metrics::counter!("hydramem_node_read_entries_total").increment(entries.len() as u64);
    metrics::counter!("hydramem_node_bytes_read_total").increment(bytes);
    fb.finish(out)
}
