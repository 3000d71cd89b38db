//! The in-memory transport: [`MemTransport`] hosts N memory nodes in this process and moves
//! frames to them and back without sockets, so that the client's logic (read plans, the
//! landing protocol, batching, versions, repair) runs in fast unit tests, with faults injected
//! per node at run time ([`MemControl`]).
//!
//! Every byte is the real protocol and every request is served by the real node: runs are
//! posted into [`OpenRuns`] frames as the TCP transport posts them (merged per node until a
//! flush), each frame is handled by a [`Session`] of a [`Node`] — the code a daemon runs for
//! one connection — and each reply frame goes through [`super::transport::deliver`] into the
//! client's slot table. Control calls (ALLOC, LIST, ...) are served the same way,
//! synchronously. [`connect`] builds a client on it.
//!
//! Threads: a flush serves the node's queued frames on the flushing thread, in order; one
//! delivery thread hands the replies to the client in the order of their due time. Delivery is
//! asynchronous on purpose, like TCP's receiver thread: completions land while the owner polls
//! and parks, which is the schedule the landing protocol and the wake-ups of [`super::slots`]
//! are built for, and delayed or reordered replies need a clock-driven deliverer anyway.
//! Synchronous delivery would complete splits inside a post, before a batch has posted its
//! other runs: a schedule TCP never produces, so tests would not show what the client does.
//! The queue and that thread are in `delivery`; the fault settings, the counts and the control
//! handle in `faults`.
//!
//! Faults, per node ([`NodeFaults`]): the node goes down (posts and calls fail with
//! [`TransportError::Down`], outstanding splits fail through [`Completions::node_down`]) and
//! comes back up with its memory, or restarts (a fresh node: its slabs are gone and
//! [`Transport::take_restarted`] says so); a share of request frames is lost before the node
//! sees them, or of reply frames after it served them (a split whose frame is lost stays
//! outstanding, as on a node that stops answering); replies are held for a delay (a
//! straggler), or each for a random time within a window (reordering across frames); a share
//! of the splits of READV replies get one data bit flipped (corruption on the wire).
//!
//! Invariants:
//! - a node that is down takes no post and no call; once [`NodeFaults::down`] returns, no
//!   reply served before is delivered;
//! - every random choice draws from its node's generator, seeded from [`MemOptions::seed`], so
//!   a test that posts from one thread sees the same faults on every run;
//! - memory is bounded: a node's unflushed frames are served once they pass 1 MiB, replies
//!   waiting for delivery hold at most 64 MiB (beyond, they are dropped and counted) and
//!   delays are capped at one hour;
//! - no input panics: bad runs are refused ([`TransportError::BadRun`]), unknown nodes are down,
//!   and a frame the node refuses as malformed loses the node, as a broken connection would.
//!
//! Not modelled: heartbeats (faults act on data frames; control calls see only a node that is
//! down) and REGEN, which a node serves by connecting to its peers, whom in-memory nodes have
//! no address to dial: [`Transport::regen`] says it cannot, so a repair allocates its
//! replacement slab and writes reach it, but it stays fresh (asked last) instead of being
//! regenerated.

mod delivery;
mod faults;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::transport::{
    append_write_run, Completions, HelloOutcome, RunSplit, Transport, TransportError,
};
use super::{ClientConfig, ClientError, RemoteMemory};
use crate::cluster::{Cluster, NodeEntry};
use crate::node::session::Session;
use crate::node::{Node, NodeConfig};
use crate::rpc::Greeting;
use crate::wire::{
    self, FrameBuilder, Header, HelloReply, Op, OpenRuns, Request, Run, Status, WireError,
    HEADER_LEN,
};
use delivery::{delivery_loop, Queue};
use faults::{corrupt_reply, hits, Settings};
pub use faults::{MemControl, NodeCounts, NodeFaults};

/// Largest request frame posts merge into, as on TCP.
const MERGE_LIMIT: usize = 256 << 10;
/// Unflushed frames of one node beyond which they are served without waiting for a flush.
const AUTO_FLUSH: usize = 1 << 20;

/// How the in-memory nodes are built.
#[derive(Debug, Clone, Copy)]
pub struct MemOptions {
    /// Slabs each node can hold (its capacity in slabs of the cluster's slab size).
    pub slabs_per_node: u64,
    /// Seed of every node's random choices (dropped frames, flipped bits, reply jitter).
    pub seed: u64,
    /// Room for members that join at run time ([`Transport::join`]; [`MemControl::nodes`]
    /// counts members only).
    pub spare: usize,
}

impl Default for MemOptions {
    fn default() -> Self {
        MemOptions {
            slabs_per_node: 64,
            seed: 0,
            spare: 0,
        }
    }
}

/// One node's state behind its lock: what a connection to it holds, and its faults.
struct NodeState {
    node: Arc<Node>,
    session: Session,
    /// Request frames posted and not yet served.
    buf: Vec<u8>,
    /// The frame at the end of `buf` still open for more runs.
    open: Option<OpenRuns>,
    faults: Settings,
    rng: SmallRng,
    counts: NodeCounts,
}

struct MemNode {
    config: NodeConfig,
    up: AtomicBool,
    restarted: AtomicBool,
    /// Bumped when the node goes down: replies served before are never delivered.
    epoch: AtomicU64,
    state: Mutex<NodeState>,
    /// Counted by the delivery thread.
    delivered: AtomicU64,
    reordered: AtomicU64,
}

struct Shared {
    /// One slot per member, filled once in join order; `members` of them are filled.
    nodes: Box<[OnceLock<MemNode>]>,
    members: AtomicUsize,
    /// Serializes joins.
    joining: Mutex<()>,
    /// What a joining node is built with.
    options: MemOptions,
    slab_size: u64,
    completions: Arc<dyn Completions>,
    greeting: Greeting,
    next_id: AtomicU64,
    queue: Mutex<Queue>,
    queued: Condvar,
    /// Held while a reply is delivered and while a node goes down, so that no reply of a lost
    /// node lands after its splits were failed.
    deliver: Mutex<()>,
}

/// The in-memory transport (see the module doc). Dropping it stops its delivery thread;
/// replies not delivered yet are dropped.
pub struct MemTransport {
    shared: Arc<Shared>,
    delivery: Option<JoinHandle<()>>,
}

/// A cluster file for `n` in-memory nodes (ids `0..n`) with slabs of `slab_size` bytes. The
/// addresses, in the documentation range 192.0.2.0/24, are only names: nothing dials them.
pub fn cluster(n: usize, slab_size: u64) -> Cluster {
    Cluster {
        etcd: None,
        slab_size,
        placement: None,
        key_file: None,
        tls_dir: None,
        tls: None,
        key: None,
        nodes: (0..n)
            .map(|i| NodeEntry {
                id: u32::try_from(i).unwrap_or(u32::MAX),
                addr: SocketAddr::from(([192, 0, 2, 1], u16::try_from(i + 1).unwrap_or(0))),
                domain: None,
            })
            .collect(),
    }
}

/// Connects a client to in-memory nodes, one per node of `cluster`: [`RemoteMemory::connect`]
/// on a [`MemTransport`]. Returns the client and the handle that injects faults.
pub fn connect(
    cluster: &Cluster,
    config: ClientConfig,
    options: MemOptions,
) -> Result<(Arc<RemoteMemory>, MemControl), ClientError> {
    let mut control = None;
    let mem = RemoteMemory::connect_with(cluster, config, |greeting, completions| {
        let (t, outcomes) = MemTransport::new(cluster, options, greeting, completions)?;
        control = Some(t.control());
        Ok((t, outcomes))
    })?;
    let control = control.ok_or_else(|| ClientError::Config("no transport was opened".into()))?;
    Ok((mem, control))
}

impl MemTransport {
    /// Builds one node per node of `cluster` (with the greeting's cluster key, if any) and
    /// greets each as `greeting` says; completions go to
    /// `completions`. Every node answers (the outcomes are all `Ok`).
    pub fn new(
        cluster: &Cluster,
        options: MemOptions,
        greeting: Greeting,
        completions: Arc<dyn Completions>,
    ) -> Result<(MemTransport, Vec<HelloOutcome>), ClientError> {
        let slots = cluster.nodes.len() + options.spare;
        let nodes: Box<[OnceLock<MemNode>]> = (0..slots).map(|_| OnceLock::new()).collect();
        let mut outcomes = Vec::with_capacity(cluster.nodes.len());
        for (i, entry) in cluster.nodes.iter().enumerate() {
            let (node, reply) = mem_node(i, entry.id, cluster.slab_size, options, &greeting)?;
            outcomes.push(Ok(reply));
            let _ = nodes[i].set(node);
        }
        let shared = Arc::new(Shared {
            nodes,
            members: AtomicUsize::new(cluster.nodes.len()),
            joining: Mutex::new(()),
            options,
            slab_size: cluster.slab_size,
            completions,
            greeting,
            next_id: AtomicU64::new(1),
            queue: Mutex::new(Queue::default()),
            queued: Condvar::new(),
            deliver: Mutex::new(()),
        });
        let s2 = shared.clone();
        let delivery = std::thread::Builder::new()
            .name("hm-mem-deliver".into())
            .spawn(move || delivery_loop(&s2))?;
        Ok((
            MemTransport {
                shared,
                delivery: Some(delivery),
            },
            outcomes,
        ))
    }

    /// The handle that injects faults and reads counts.
    pub fn control(&self) -> MemControl {
        MemControl {
            shared: self.shared.clone(),
        }
    }
}

impl Drop for MemTransport {
    fn drop(&mut self) {
        self.shared.queue.lock().stop = true;
        self.shared.queued.notify_all();
        if let Some(h) = self.delivery.take() {
            let _ = h.join();
        }
    }
}

/// Builds in-memory node `i` with id `id` (with the greeting's cluster key, if any) and
/// greets it as `greeting` says.
fn mem_node(
    i: usize,
    id: u32,
    slab_size: u64,
    options: MemOptions,
    greeting: &Greeting,
) -> Result<(MemNode, HelloReply), ClientError> {
    let capacity = slab_size
        .checked_mul(options.slabs_per_node)
        .ok_or_else(|| ClientError::Config("in-memory node capacity overflows".into()))?;
    let config = NodeConfig {
        id,
        capacity,
        slab_size,
        allow_faults: false,
        membership: None,
        key: greeting.key.clone(),
        tls: None,
        tenancy: Default::default(),
    };
    let bad = |e: &dyn std::fmt::Display| {
        ClientError::Config(format!("in-memory node {i} cannot start: {e}"))
    };
    let node = Node::new(config.clone()).map_err(|e| bad(&e))?;
    let mut session = Session::new(node.clone());
    let reply = greet(&mut session, greeting, id).map_err(|e| bad(&e))?;
    let seed = options.seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let node = MemNode {
        config,
        up: AtomicBool::new(true),
        restarted: AtomicBool::new(false),
        epoch: AtomicU64::new(0),
        state: Mutex::new(NodeState {
            node,
            session,
            buf: Vec::new(),
            open: None,
            faults: Settings::default(),
            rng: SmallRng::seed_from_u64(seed),
            counts: NodeCounts::default(),
        }),
        delivered: AtomicU64::new(0),
        reordered: AtomicU64::new(0),
    };
    Ok((node, reply))
}

/// Splits the frame at the start of `buf` off: its header, its body and what follows.
fn split_frame(buf: &[u8]) -> Result<(Header, &[u8], &[u8]), WireError> {
    let truncated = |needed| WireError::Truncated {
        at: 0,
        needed,
        len: buf.len(),
    };
    let head: &[u8; HEADER_LEN] = buf
        .get(..HEADER_LEN)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| truncated(HEADER_LEN))?;
    let h = Header::parse(head)?;
    let end = HEADER_LEN + h.body_len as usize;
    let body = buf.get(HEADER_LEN..end).ok_or_else(|| truncated(end))?;
    Ok((h, body, &buf[end..]))
}

/// A control request frame of `op` with body `body`.
fn control_frame(op: Op, id: u64, body: &[u8]) -> Result<Vec<u8>, WireError> {
    let mut frame = Vec::with_capacity(HEADER_LEN + body.len());
    let fb = FrameBuilder::begin(&mut frame, op, false, Status::Ok, id);
    frame.extend_from_slice(body);
    fb.finish(&mut frame)?;
    Ok(frame)
}

/// Serves one control request frame on `session`; returns the reply's status and body. An
/// error is a request the node refused as malformed (or a reply that answers something else).
fn serve_control(session: &mut Session, frame: &[u8]) -> Result<(Status, Vec<u8>), WireError> {
    let (h, body, _) = split_frame(frame)?;
    let mut out = Vec::new();
    session.handle(&h, body, &mut out)?;
    let (rh, reply, _) = split_frame(&out)?;
    if !rh.reply || rh.op != h.op || rh.id != h.id {
        return Err(WireError::Invalid("a reply to another request"));
    }
    Ok((rh.status, reply.to_vec()))
}

/// Greets a fresh session as the TCP transport does ([`crate::auth::respond`]: HELLO, and with
/// a key both proofs); the node must answer as node `id`.
fn greet(session: &mut Session, g: &Greeting, id: u32) -> Result<HelloReply, WireError> {
    let hello = g.hello();
    let mut body = Vec::new();
    hello.put(&mut body);
    let reply = match serve_control(session, &control_frame(Op::Hello, 0, &body)?)? {
        (Status::Ok, reply) => HelloReply::parse(&reply)?,
        _ => return Err(WireError::Invalid("HELLO refused")),
    };
    if reply.node_id != id {
        return Err(WireError::Invalid("the node answered as another node"));
    }
    let proof = crate::auth::respond(g.key.as_ref(), &hello, &reply)
        .map_err(|_| WireError::Invalid("the node's authentication failed"))?;
    if let Some(proof) = proof {
        let mut body = Vec::new();
        wire::put_auth(&mut body, &proof);
        if serve_control(session, &control_frame(Op::Auth, 1, &body)?)?.0 != Status::Ok {
            return Err(WireError::Invalid("the node refused this end's proof"));
        }
    }
    Ok(reply)
}

impl Shared {
    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn down_error(&self, node: u16) -> TransportError {
        TransportError::Down {
            node,
            addr: self.addr(node),
        }
    }

    /// The member in slot `node`, if it is filled.
    pub(super) fn slot(&self, node: u16) -> Option<&MemNode> {
        self.nodes.get(node as usize)?.get()
    }

    fn addr(&self, node: u16) -> String {
        match self.slot(node) {
            Some(n) => format!("in-memory node {node} (id {})", n.config.id),
            None => format!("(no node {node})"),
        }
    }

    /// The node if it is up.
    fn conn(&self, node: u16) -> Result<&MemNode, TransportError> {
        match self.slot(node) {
            Some(n) if n.up.load(Ordering::Acquire) => Ok(n),
            _ => Err(self.down_error(node)),
        }
    }

    /// Appends a run to the open frame of its op (`append` writes it), or to a new frame;
    /// on failure the node's queue is left as it was. Serves the queue if asked, or once it
    /// grew past [`AUTO_FLUSH`].
    fn post_run(
        &self,
        node: u16,
        op: Op,
        run: &Run,
        flush: bool,
        append: impl FnOnce(&mut OpenRuns, &mut Vec<u8>) -> Result<(), WireError>,
    ) -> Result<(), TransportError> {
        let n = self.conn(node)?;
        let mut guard = n.state.lock();
        if !n.up.load(Ordering::Acquire) {
            return Err(self.down_error(node));
        }
        let st = &mut *guard;
        let before = (st.buf.len(), st.open);
        let frame = match st.open {
            Some(f) if f.op() == op && f.fits(&st.buf, run, MERGE_LIMIT) => Ok(f),
            _ => OpenRuns::begin(&mut st.buf, op, self.next_id()),
        };
        let appended = frame.and_then(|mut f| append(&mut f, &mut st.buf).map(|()| f));
        match appended {
            Ok(f) => st.open = Some(f),
            Err(reason) => {
                st.buf.truncate(before.0);
                st.open = before.1;
                return Err(TransportError::BadRun {
                    node,
                    addr: self.addr(node),
                    reason,
                });
            }
        }
        if flush || st.buf.len() >= AUTO_FLUSH {
            let served = self.serve_queued(node, n, st);
            drop(guard);
            return self.after_serving(node, served);
        }
        Ok(())
    }

    /// Serves every frame queued for the node, in order. An error is a frame the node refused
    /// as malformed: the frames after it are dropped and the caller must lose the node.
    fn serve_queued(&self, node: u16, n: &MemNode, st: &mut NodeState) -> Result<(), WireError> {
        st.open = None;
        let frames = std::mem::take(&mut st.buf);
        let mut rest = &frames[..];
        let mut served = Ok(());
        while !rest.is_empty() && served.is_ok() {
            served = split_frame(rest).and_then(|(h, body, tail)| {
                rest = tail;
                self.serve_frame(node, n, st, &h, body)
            });
        }
        st.buf = frames;
        st.buf.clear();
        served
    }

    /// Loses the node if serving failed (see [`Shared::serve_queued`]).
    fn after_serving(
        &self,
        node: u16,
        served: Result<(), WireError>,
    ) -> Result<(), TransportError> {
        match served {
            Ok(()) => Ok(()),
            Err(e) => {
                tracing::warn!(node, error = %e, "in-memory node refused a frame: losing it");
                self.lose(node);
                Err(self.down_error(node))
            }
        }
    }

    /// Serves one READV or WRITEV frame through the node's session, with the node's faults,
    /// and queues its reply for delivery.
    fn serve_frame(
        &self,
        node: u16,
        n: &MemNode,
        st: &mut NodeState,
        h: &Header,
        body: &[u8],
    ) -> Result<(), WireError> {
        let (runs, splits) = match wire::parse_request(h, body)? {
            Request::ReadV(r) => (r.len(), r.splits()),
            Request::WriteV(w) => (w.len(), w.splits()),
            _ => (0, 0),
        };
        let f = st.faults;
        if hits(&mut st.rng, f.drop_requests) {
            st.counts.dropped_requests += 1;
            return Ok(());
        }
        let c = &mut st.counts;
        c.frames += 1;
        c.runs += runs as u64;
        c.splits += splits as u64;
        let mut out = Vec::new();
        st.session.handle(h, body, &mut out)?;
        if hits(&mut st.rng, f.drop_replies) {
            st.counts.dropped_replies += 1;
            return Ok(());
        }
        if f.corrupt > 0 && h.op == Op::ReadV {
            corrupt_reply(st, &mut out)?;
        }
        let mut due = Instant::now() + f.delay;
        if !f.reorder.is_zero() {
            due += st.rng.random_range(Duration::ZERO..=f.reorder);
        }
        self.enqueue(node, n.epoch.load(Ordering::Acquire), due, out, st);
        Ok(())
    }
}

impl Transport for MemTransport {
    fn nodes(&self) -> usize {
        self.shared.members.load(Ordering::Acquire)
    }

    fn capacity(&self) -> usize {
        self.shared.nodes.len()
    }

    /// A spare slot ([`MemOptions::spare`]) becomes a fresh node with id `id`.
    fn join(&self, id: u32, addr: std::net::SocketAddr) -> Result<u16, TransportError> {
        let sh = &self.shared;
        let _joining = sh.joining.lock();
        let slot = sh.members.load(Ordering::Acquire);
        let node = super::transport::next_slot(slot, sh.nodes.len(), addr)?;
        let (n, _) = mem_node(slot, id, sh.slab_size, sh.options, &sh.greeting).map_err(|e| {
            TransportError::Protocol {
                node,
                addr: addr.to_string(),
                reason: e.to_string(),
            }
        })?;
        let _ = sh.nodes[slot].set(n);
        sh.members.store(slot + 1, Ordering::Release);
        Ok(node)
    }

    fn is_up(&self, node: u16) -> bool {
        self.shared.conn(node).is_ok()
    }

    fn take_restarted(&self, node: u16) -> bool {
        self.shared
            .slot(node)
            .is_some_and(|n| n.restarted.swap(false, Ordering::AcqRel))
    }

    /// What the node would say to a heartbeat now: a PING served by its session.
    fn notice(&self, node: u16) -> wire::Notice {
        let Ok(n) = self.shared.conn(node) else {
            return wire::Notice::default();
        };
        let reply = control_frame(Op::Ping, self.shared.next_id(), &[])
            .and_then(|frame| serve_control(&mut n.state.lock().session, &frame));
        match reply {
            Ok((Status::Ok, body)) => wire::Notice::parse(&body).unwrap_or_default(),
            _ => wire::Notice::default(),
        }
    }

    fn post_write_run<'a>(
        &self,
        node: u16,
        run: Run,
        splits: &mut dyn Iterator<Item = RunSplit<'a>>,
        flush: bool,
    ) -> Result<(), TransportError> {
        self.shared
            .post_run(node, Op::WriteV, &run, flush, |frame, buf| {
                append_write_run(frame, buf, run, splits)
            })
    }

    fn post_read_run(
        &self,
        node: u16,
        run: Run,
        cookies: &mut dyn Iterator<Item = u64>,
        flush: bool,
    ) -> Result<(), TransportError> {
        self.shared
            .post_run(node, Op::ReadV, &run, flush, |frame, buf| {
                frame.read_run(buf, run, cookies)
            })
    }

    fn flush(&self, node: u16) -> Result<(), TransportError> {
        let sh = &self.shared;
        let n = sh.conn(node)?;
        let mut st = n.state.lock();
        let served = sh.serve_queued(node, n, &mut st);
        drop(st);
        sh.after_serving(node, served)
    }

    /// Serves what was posted to the node before the call (a connection keeps order), then
    /// the call.
    fn call(&self, node: u16, op: Op, body: &[u8]) -> Result<Vec<u8>, TransportError> {
        let sh = &self.shared;
        let n = sh.conn(node)?;
        let frame =
            control_frame(op, sh.next_id(), body).map_err(|e| TransportError::Protocol {
                node,
                addr: sh.addr(node),
                reason: format!("cannot send {op:?}: {e}"),
            })?;
        let mut guard = n.state.lock();
        if !n.up.load(Ordering::Acquire) {
            return Err(sh.down_error(node));
        }
        let st = &mut *guard;
        let served = sh.serve_queued(node, n, st).and_then(|()| {
            st.counts.calls += 1;
            serve_control(&mut st.session, &frame)
        });
        drop(guard);
        match served {
            Ok((Status::Ok, reply)) => Ok(reply),
            Ok((status, _)) => Err(TransportError::Refused {
                node,
                addr: sh.addr(node),
                op,
                status,
            }),
            Err(e) => {
                sh.after_serving(node, Err(e))?;
                Err(sh.down_error(node))
            }
        }
    }

    fn addr(&self, node: u16) -> String {
        self.shared.addr(node)
    }
}

#[cfg(test)]
mod tests;
