//! The transport interface between the client's data path and memory nodes.
//!
//! The data path speaks in *runs* of split requests (consecutive split slots of one slab,
//! each split tagged with a cookie; a single split is a run of one, [`Entry`]) and receives
//! completions split by split through [`Completions`]; it never sees sockets. This is the shape of a
//! one-sided RDMA queue pair (post work requests, poll completions keyed by work-request id), so
//! an RDMA transport can implement the same trait later; TCP ([`super::tcp::TcpTransport`]) is
//! the implementation today.
//!
//! Contract: every posted split is completed exactly once through [`Completions`] (with its
//! node's status, or failed through [`Completions::node_down`] when the connection is lost), or
//! the post of its run returns an error and no completion will follow for any split of it.
//! Posting a run allocates nothing: the caller hands its splits over one by one (an iterator
//! over its own data) and the transport writes them straight into its send buffer.

use std::time::Duration;

use crate::wire::{
    self, CorruptReport, Entry, Header, Notice, Op, OpenRuns, Regen, Run, Status, WireError,
    MAX_CORRUPT_REPORTS,
};

/// A REGEN ready to run ([`Transport::regen`]): blocks until the node answers.
pub type RegenCall = Box<dyn FnOnce() -> Result<u64, TransportError> + Send>;

/// One split of a write run, as a caller hands it to [`Transport::post_write_run`].
#[derive(Debug, Clone, Copy)]
pub struct RunSplit<'a> {
    /// Echoed in the split's completion.
    pub cookie: u64,
    /// The version of the page the split belongs to.
    pub version: u64,
    /// The split's checksum (0 from a client that keeps none).
    pub crc: u32,
    /// The split's tag (see [`crate::tags`]; 0 for a Hydra page's split).
    pub tag: u64,
    /// The split's bytes: exactly the run's split length.
    pub data: &'a [u8],
}

/// Appends a write run to an open WRITEV frame at the end of `buf`: the run's `run.n` splits
/// from `splits`, each written straight into the frame (what a transport's
/// [`Transport::post_write_run`] writes). Fails, leaving the frame as it was, like
/// [`OpenRuns::write_run`].
pub(super) fn append_write_run<'a>(
    frame: &mut OpenRuns,
    buf: &mut Vec<u8>,
    run: Run,
    splits: &mut dyn Iterator<Item = RunSplit<'a>>,
) -> Result<(), WireError> {
    let mut w = frame.write_run(buf, run)?;
    for s in splits.take(run.n as usize) {
        let fields = wire::SplitFields {
            cookie: s.cookie,
            version: s.version,
            crc: s.crc,
            tag: s.tag,
        };
        w.split(fields, s.data)?;
    }
    w.finish()
}

/// The index a member joining a table of `slots` slots, `members` of them filled, takes
/// ([`Transport::join`]); [`TransportError::Full`] when none is left.
pub(super) fn next_slot(
    members: usize,
    slots: usize,
    addr: std::net::SocketAddr,
) -> Result<u16, TransportError> {
    u16::try_from(members)
        .ok()
        .filter(|_| members < slots)
        .ok_or(TransportError::Full {
            capacity: slots,
            addr: addr.to_string(),
        })
}

/// Receives split completions; implemented by the client's slot table. `node` is the node
/// whose connection the reply arrived on (the receiver checks it against the node the split
/// was posted to: a node cannot complete another node's splits).
pub trait Completions: Send + Sync {
    /// A read entry completed with the version and checksum stored for the split; `data` is
    /// valid only during the call.
    fn read_done(
        &self,
        node: u16,
        cookie: u64,
        status: Status,
        version: u64,
        crc: u32,
        data: &[u8],
    );
    /// A write entry completed; `stored` is the version the node holds for the split now
    /// (the newer one that refused it, for [`Status::Stale`]).
    fn write_done(&self, node: u16, cookie: u64, status: Status, stored: u64);
    /// The connection to `node` was lost: every entry posted to it and not completed fails.
    fn node_down(&self, node: u16);
}

/// Hands every split of a WRITEV or READV reply frame that arrived from `node` to
/// `completions` (a read split with its slice of its run's data); returns `Ok(false)` for a
/// frame of another op (the caller's business). An error means the frame is malformed (splits
/// before the bad one were delivered): the connection that carried it cannot be trusted and
/// must be closed.
pub fn deliver(
    completions: &dyn Completions,
    node: u16,
    h: &Header,
    body: &[u8],
) -> Result<bool, WireError> {
    match h.op {
        Op::WriteV => wire::parse_vectored_reply(h, body, |status, s, _| {
            completions.write_done(node, s.cookie, status, s.version)
        })?,
        Op::ReadV => wire::parse_vectored_reply(h, body, |status, s, data| {
            completions.read_done(node, s.cookie, status, s.version, s.crc, data)
        })?,
        _ => return Ok(false),
    }
    Ok(true)
}

/// The outcome of opening a transport's connection to one node: the node's HELLO reply, or
/// why it is unreachable (the node is then down, and the client decides whether enough are up).
pub type HelloOutcome = Result<wire::HelloReply, HelloFailure>;

/// Why a node could not be greeted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloFailure {
    /// What failed, as the transport saw it.
    pub reason: String,
    /// The node refused the identity: another process holds it there
    /// ([`wire::Status::IdentityInUse`]).
    pub in_use: bool,
}

impl std::fmt::Display for HelloFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

/// Errors of the transport.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The node is not connected.
    #[error("memory node {node} ({addr}) is down")]
    Down {
        /// Node index in the cluster file.
        node: u16,
        /// Its address.
        addr: String,
    },
    /// A control request got a non-OK status.
    #[error("memory node {node} ({addr}) refused {op:?}: {status}")]
    Refused {
        /// Node index.
        node: u16,
        /// Its address.
        addr: String,
        /// The request.
        op: Op,
        /// What the node said.
        status: Status,
    },
    /// A control request got no reply in time.
    #[error("memory node {node} ({addr}) did not answer {op:?} within {waited:?}")]
    Timeout {
        /// Node index.
        node: u16,
        /// Its address.
        addr: String,
        /// The request.
        op: Op,
        /// How long we waited.
        waited: Duration,
    },
    /// A run that cannot be posted: the caller's mistake (no splits, more than a frame holds,
    /// data of another length than the run's splits, fewer splits than it declared).
    #[error("cannot post a run to memory node {node} ({addr}): {reason}")]
    BadRun {
        /// Node index.
        node: u16,
        /// Its address.
        addr: String,
        /// What is wrong with the run.
        reason: WireError,
    },
    /// The transport has no way to do what was asked (an in-memory transport cannot have a
    /// node regenerate a slab from other nodes: they have no addresses to dial).
    #[error("memory node {node} ({addr}): this transport cannot {what}")]
    Unsupported {
        /// Node index.
        node: u16,
        /// Its address.
        addr: String,
        /// What was asked.
        what: &'static str,
    },
    /// A regeneration request failed.
    #[error("REGEN on memory node {node} ({addr}) failed: {source}")]
    Regen {
        /// Node index.
        node: u16,
        /// Its address.
        addr: String,
        /// What went wrong (boxed: the error stays small on the data path).
        source: Box<crate::rpc::RpcError>,
    },
    /// A member joined, but every slot of the client's node table is taken.
    #[error(
        "cannot add the memory node at {addr}: this client's node table is full ({capacity} \
         nodes); restart the client to use the new node (a restart sizes the table for the \
         cluster of that moment and room for more)"
    )]
    Full {
        /// Slots of the table.
        capacity: usize,
        /// The new member's address.
        addr: String,
    },
    /// A reply could not be parsed.
    #[error("memory node {node} ({addr}) sent a malformed reply: {reason}")]
    Protocol {
        /// Node index.
        node: u16,
        /// Its address.
        addr: String,
        /// What was wrong.
        reason: String,
    },
}

/// Moves split requests to memory nodes and completions back.
pub trait Transport: Send + Sync {
    /// Number of nodes (indices `0..nodes()` follow the cluster file's order, then the order
    /// in which members joined). Only grows.
    fn nodes(&self) -> usize;
    /// Most nodes this transport can hold, members that may join included (a client sizes
    /// its per-node tables by it).
    fn capacity(&self) -> usize {
        self.nodes()
    }
    /// Adds a member that joined the cluster at run time ([`crate::membership`]) as node
    /// `nodes()` and connects to it (a member that cannot be reached joins down, and is
    /// retried like a node that went down). Returns its index. A transport without room for
    /// more members (the default) says so.
    fn join(&self, _id: u32, addr: std::net::SocketAddr) -> Result<u16, TransportError> {
        Err(TransportError::Full {
            capacity: self.nodes(),
            addr: addr.to_string(),
        })
    }
    /// The membership says `node` left (its lease expired): verify it now rather than at the
    /// next unanswered heartbeat. It is declared failed only if verification fails.
    fn suspect(&self, _node: u16) {}
    /// The file descriptors of the connections open now (none for a transport without
    /// sockets): what a forked child must close, since while a copy of one is open the nodes
    /// count this process's identity as held.
    fn sockets(&self) -> Vec<std::os::fd::RawFd> {
        Vec::new()
    }
    /// Whether the node is currently connected.
    fn is_up(&self, node: u16) -> bool;
    /// What the node said in its last heartbeat reply: slabs of ours it reclaimed, and whether
    /// it takes new slabs. A transport without heartbeats reports nothing.
    fn notice(&self, _node: u16) -> Notice {
        Notice::default()
    }
    /// Whether the node restarted (another incarnation answered a reconnect) since the last
    /// call: every slab the client held there is gone. Clears the flag.
    fn take_restarted(&self, _node: u16) -> bool {
        false
    }
    /// Posts a write run: `splits` yields its `run.n` splits in slot order, each written
    /// straight into the outgoing frame. With `flush == false` the request may wait for a
    /// later post or [`Transport::flush`] to the same node, so that many runs share one
    /// vectored frame.
    fn post_write_run<'a>(
        &self,
        node: u16,
        run: Run,
        splits: &mut dyn Iterator<Item = RunSplit<'a>>,
        flush: bool,
    ) -> Result<(), TransportError>;
    /// Posts a read run: `cookies` yields the cookies of its `run.n` splits in slot order
    /// (same batching rule as [`Transport::post_write_run`]).
    fn post_read_run(
        &self,
        node: u16,
        run: Run,
        cookies: &mut dyn Iterator<Item = u64>,
        flush: bool,
    ) -> Result<(), TransportError>;
    /// Posts a split write: a run of one.
    fn post_write(
        &self,
        node: u16,
        e: Entry,
        data: &[u8],
        flush: bool,
    ) -> Result<(), TransportError> {
        let split = RunSplit {
            cookie: e.cookie,
            version: e.version,
            crc: e.crc,
            tag: e.tag,
            data,
        };
        self.post_write_run(node, e.run(), &mut std::iter::once(split), flush)
    }
    /// Posts a split read: a run of one.
    fn post_read(&self, node: u16, e: Entry, flush: bool) -> Result<(), TransportError> {
        self.post_read_run(node, e.run(), &mut std::iter::once(e.cookie), flush)
    }
    /// Sends whatever is queued for `node`.
    fn flush(&self, node: u16) -> Result<(), TransportError>;
    /// Reads on the calling thread what has arrived from `node`, if no other thread is
    /// reading it, and delivers it; whether anything was read. An owner polling for its
    /// reply calls it so that the reply lands without waking another thread. Transports
    /// that deliver otherwise read nothing here.
    fn receive_from(&self, _node: u16) -> bool {
        false
    }
    /// A blocking control request (HELLO, ALLOC, FREE, LIST, STATS, PING); returns the reply body.
    fn call(&self, node: u16, op: Op, body: &[u8]) -> Result<Vec<u8>, TransportError>;
    /// A printable address of the node, for messages.
    fn addr(&self, node: u16) -> String;
    /// Asks `node` for a slab of splits of `split_len` bytes labelled `tag` (ALLOC); returns
    /// its id.
    fn alloc(&self, node: u16, tag: u64, split_len: u32) -> Result<u32, TransportError> {
        let mut body = Vec::new();
        wire::put_alloc(&mut body, tag, split_len);
        let reply = self.call(node, Op::Alloc, &body)?;
        wire::parse_alloc_reply(&reply).map_err(|e| TransportError::Protocol {
            node,
            addr: self.addr(node),
            reason: format!("ALLOC reply: {e}"),
        })
    }
    /// Gives slab `slab` on `node` back (FREE).
    fn free(&self, node: u16, slab: u32) -> Result<(), TransportError> {
        let mut body = Vec::new();
        wire::put_free(&mut body, slab);
        self.call(node, Op::Free, &body).map(drop)
    }
    /// Gives back the memory of slots `first..first + n` of slab `slab` on `node` (DISCARD):
    /// they read as zeros and as never written afterwards.
    fn discard(&self, node: u16, slab: u32, first: u64, n: u64) -> Result<(), TransportError> {
        let mut body = Vec::new();
        wire::put_discard(&mut body, slab, first, n);
        self.call(node, Op::Discard, &body).map(drop)
    }
    /// The versions and tags stored in slots `first..first + n` of slab `slab` on `node`
    /// (STAMPS, in requests of at most [`wire::MAX_STAMPS`] slots), in slot order.
    fn stamps(
        &self,
        node: u16,
        slab: u32,
        first: u64,
        n: u64,
    ) -> Result<Vec<(u64, u64)>, TransportError> {
        let mut out = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
        let mut at = first;
        while at < first.saturating_add(n) {
            let m = u32::try_from((first + n - at).min(u64::from(wire::MAX_STAMPS)))
                .expect("at most MAX_STAMPS");
            let mut body = Vec::new();
            wire::put_stamps(&mut body, slab, at, m);
            let reply = self.call(node, Op::Stamps, &body)?;
            out.extend(wire::parse_stamps_reply(&reply, m).map_err(|e| {
                TransportError::Protocol {
                    node,
                    addr: self.addr(node),
                    reason: format!("STAMPS reply: {e}"),
                }
            })?);
            at += u64::from(m);
        }
        Ok(out)
    }
    /// Prepares REGEN `req` for `node` (the node rebuilds one of our slabs from the surviving
    /// splits and answers when done, which can take minutes): returns the call, to run on a
    /// thread of its own, which gives the pages rebuilt. A transport that cannot (the default)
    /// says so.
    fn regen(&self, node: u16, _req: &Regen) -> Result<RegenCall, TransportError> {
        Err(TransportError::Unsupported {
            node,
            addr: self.addr(node),
            what: "regenerate a slab",
        })
    }
    /// Tells `node` about corrupted splits we read from its slabs (CORRUPT, a control
    /// request), so that its status and metrics show them: only the client can tell a split is
    /// corrupt, the node cannot. Sends requests of at most [`MAX_CORRUPT_REPORTS`] records and
    /// returns how many records the node matched to a slab of ours (it counts the others as
    /// unknown slabs: freed or moved since the read).
    fn report_corrupt(&self, node: u16, reports: &[CorruptReport]) -> Result<u32, TransportError> {
        let mut accepted = 0;
        for chunk in reports.chunks(MAX_CORRUPT_REPORTS) {
            let mut body = Vec::new();
            wire::put_corrupt(&mut body, chunk);
            let reply = self.call(node, Op::Corrupt, &body)?;
            accepted +=
                wire::parse_corrupt_reply(&reply).map_err(|e| TransportError::Protocol {
                    node,
                    addr: self.addr(node),
                    reason: format!("CORRUPT reply: {e}"),
                })?;
        }
        Ok(accepted)
    }
}
