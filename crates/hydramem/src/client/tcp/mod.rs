//! TCP implementation of [`Transport`]: one connection per memory node, pipelined.
//!
//! Sending (`send.rs`): the thread that posts a split appends it to the connection's send
//! buffer and, if no other thread is writing to that socket right now, writes the buffer out
//! itself (flat combining). While one thread is in the `write` system call, splits that other
//! threads post to the same node accumulate and are appended to the still-open vectored frame,
//! so under load many splits for one node travel in one frame and one system call, with no
//! extra thread hop at low load. Buffers are swapped, never reallocated, once they have grown
//! to the working size.
//!
//! Receiving (`receive.rs`): one receiver thread waits on all sockets with epoll (mio), parses
//! reply frames in place in a per-connection buffer, and hands each split to [`Completions`],
//! which copies it straight to its landing place; an owner that polls for its reply on a few
//! nodes reads their sockets itself ([`Transport::receive_from`]), saving two wake-ups.
//! Control replies (ALLOC, LIST, ...) go to the thread waiting in [`Transport::call`] through
//! a channel keyed by request id.
//!
//! Connecting (`stream.rs`): connect, TLS, HELLO, then a non-blocking socket. With TLS
//! ([`crate::tls`]) a connection's session is shared by its senders and the receiver under a
//! lock ([`Wire`]): a sender encrypts into it and writes what the socket takes, the receiver
//! reads ciphertext into it and takes the plaintext out; encrypted bytes the socket did not
//! take wait in the session for the socket to become writable, as plain ones wait in the send
//! buffer.
//!
//! A connection that fails (EOF, reset, malformed reply) is marked down; its outstanding splits
//! are failed through [`Completions::node_down`] and its pending calls return errors.
//!
//! Membership grows at run time ([`TcpTransport::join`]): the connection table has a fixed
//! number of slots from the start (the cluster's nodes plus room for members that join later),
//! a member's slot is filled once and never reused, and the count of members only grows, so
//! the data path indexes it without a lock.
//!
//! Failure detection ([`monitor`], CubicRing's recipe): a monitor thread PINGs every node each `heartbeat`.
//! A node that does not answer within `heartbeat_timeout` is only *suspected*: before it is
//! declared failed it is verified over a fresh connection (connect, HELLO, PING within
//! `verify_timeout`), so that one slow reply does not trigger an expensive recovery. A node
//! that fails verification, or whose connection breaks, is marked down at once. Down nodes are
//! retried every `reconnect_interval`; one that answers again is reconnected and marked up, and
//! the client reconsiders it for placement.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use mio::{Interest, Poll, Token, Waker};
use parking_lot::Mutex;

use crate::rpc::Greeting;

use super::transport::{
    append_write_run, Completions, RegenCall, RunSplit, Transport, TransportError,
};
use crate::wire::{self, FrameBuilder, Header, Op, Run, Status};

mod monitor;
mod receive;
mod send;
mod stream;

use receive::Rx;
use send::SendState;
use stream::{handshake, handshake_at_start, in_use, Wire};

const WAKER: Token = Token(usize::MAX);

/// Timeouts of the TCP transport and its failure detector.
#[derive(Debug, Clone, Copy)]
pub struct TcpOptions {
    /// How long to wait for a TCP connection to a node.
    pub connect_timeout: Duration,
    /// How long a control request may take.
    pub call_timeout: Duration,
    /// Interval between heartbeats (PING) to every node.
    pub heartbeat: Duration,
    /// A heartbeat not answered within this makes the node suspect.
    pub heartbeat_timeout: Duration,
    /// Time a suspect node has to answer a fresh connection before it is declared failed.
    pub verify_timeout: Duration,
    /// Interval between attempts to reconnect a node that is down.
    pub reconnect_interval: Duration,
}

impl Default for TcpOptions {
    fn default() -> Self {
        TcpOptions {
            connect_timeout: Duration::from_secs(2),
            call_timeout: Duration::from_secs(5),
            heartbeat: Duration::from_millis(100),
            heartbeat_timeout: Duration::from_millis(500),
            verify_timeout: Duration::from_secs(1),
            reconnect_interval: Duration::from_millis(500),
        }
    }
}

impl std::fmt::Display for TcpOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "heartbeat every {:?}, suspect after {:?} without reply, verify within {:?}, reconnect every {:?}",
            self.heartbeat, self.heartbeat_timeout, self.verify_timeout, self.reconnect_interval
        )
    }
}

struct Conn {
    addr: SocketAddr,
    /// The node's id in the cluster file (what it must say in HELLO).
    id: u32,
    up: AtomicBool,
    /// The socket (and TLS session) for sending; replaced when a node that was down is
    /// reconnected.
    stream: ArcSwapOption<Wire>,
    send: Mutex<SendState>,
    /// Request id of the heartbeat PING in flight (0: none yet).
    ping_sent: AtomicU64,
    /// Request id of the last heartbeat this node answered (heartbeats need no allocation).
    pong: AtomicU64,
    /// The node's last heartbeat notice ([`wire::Notice::encode`]).
    notice: AtomicU64,
    /// The node's incarnation at the last handshake (0: never reached).
    incarnation: AtomicU64,
    /// Set when a reconnect found another incarnation: the node restarted and lost our slabs.
    restarted: AtomicBool,
    /// Set when the membership says the node left: the monitor verifies it at once.
    left: AtomicBool,
}

impl Conn {
    /// A member's connection state: up with `wire` (and its HELLO reply's incarnation), or
    /// down (the monitor reconnects it).
    fn new(id: u32, addr: SocketAddr, wire: Option<(Arc<Wire>, u64)>) -> Conn {
        let incarnation = wire.as_ref().map_or(0, |w| w.1);
        Conn {
            addr,
            id,
            up: AtomicBool::new(wire.is_some()),
            stream: ArcSwapOption::new(wire.map(|w| w.0)),
            send: Mutex::new(SendState::new()),
            ping_sent: AtomicU64::new(0),
            pong: AtomicU64::new(0),
            notice: AtomicU64::new(wire::Notice::default().encode()),
            incarnation: AtomicU64::new(incarnation),
            restarted: AtomicBool::new(false),
            left: AtomicBool::new(false),
        }
    }
}

/// What wakes the monitor thread before its next heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// Nothing: sleep a heartbeat.
    Sleep,
    /// A member is suspected (it left the membership): look now.
    Look,
    /// The transport is dropped.
    Stop,
}

type CallReply = (Status, Vec<u8>);
/// A control call waiting for its reply: the node asked, the op, where to send the reply.
type Waiting = (u16, Op, SyncSender<CallReply>);

struct Shared {
    /// One slot per member, filled once in join order; `members` of them are filled.
    conns: Box<[OnceLock<Conn>]>,
    /// Slots filled so far (only grows; [`Transport::nodes`]).
    members: AtomicUsize,
    /// Serializes joins (a slot is claimed and filled under it).
    joining: Mutex<()>,
    completions: Arc<dyn Completions>,
    /// Control calls waiting for their reply: request id → (node, op, where to send it).
    calls: Mutex<HashMap<u64, Waiting>>,
    next_id: AtomicU64,
    stop: AtomicBool,
    options: TcpOptions,
    /// Wakes the receiver thread (stop, or a connection that needs write readiness).
    waker: Waker,
    /// Nodes whose socket refused more bytes: the receiver thread waits for them to become
    /// writable and flushes them, so no caller ever blocks on a stalled node.
    want_write: Mutex<Vec<u16>>,
    /// Reconnected sockets for the receiver thread to register.
    new_streams: Mutex<Vec<(u16, mio::net::TcpStream, Arc<Wire>)>>,
    /// Each member's receive state (`receive.rs`): read by the receiver thread, or by an
    /// owner polling for its reply.
    rx: Box<[Mutex<Option<Rx>>]>,
    /// Connections an owner found broken (`receive.rs`), for the receiver thread to close.
    broken: Mutex<Vec<u16>>,
    /// What to say to a node when (re)connecting.
    greeting: Greeting,
    /// Wakes the monitor thread early (stop).
    monitor_wake: (parking_lot::Mutex<Wake>, parking_lot::Condvar),
}

/// The TCP transport. Dropping it stops its receiver thread and closes the connections.
pub struct TcpTransport {
    shared: Arc<Shared>,
    receiver: Option<JoinHandle<()>>,
    monitor: Option<JoinHandle<()>>,
}

pub use super::transport::{HelloFailure, HelloOutcome};

impl TcpTransport {
    /// Connects to every node (its id in the cluster file and its address) and says HELLO.
    /// Nodes that cannot be reached, or answer as another node, are left down (their outcome
    /// says why); the caller decides whether enough are up.
    pub fn connect(
        nodes: &[(u32, SocketAddr)],
        capacity: usize,
        greeting: Greeting,
        completions: Arc<dyn Completions>,
        options: TcpOptions,
    ) -> io::Result<(TcpTransport, Vec<HelloOutcome>)> {
        let capacity = capacity
            .max(nodes.len())
            .min(usize::from(super::slots::NO_NODE));
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let conns: Box<[OnceLock<Conn>]> = (0..capacity).map(|_| OnceLock::new()).collect();
        let mut outcomes = Vec::with_capacity(nodes.len());
        let rx: Box<[Mutex<Option<Rx>>]> = (0..capacity).map(|_| Mutex::new(None)).collect();
        let grace = Instant::now() + crate::rpc::IN_USE_GRACE;
        for (i, &(id, addr)) in nodes.iter().enumerate() {
            match handshake_at_start(addr, id, &greeting, options, grace) {
                Ok((wire, reply)) => {
                    let wire = Arc::new(wire);
                    let mut m = mio::net::TcpStream::from_std(wire.sock.try_clone()?);
                    poll.registry()
                        .register(&mut m, Token(i), Interest::READABLE)?;
                    *rx[i].lock() = Some(Rx::new(m, wire.clone()));
                    let _ = conns[i].set(Conn::new(id, addr, Some((wire, reply.incarnation))));
                    outcomes.push(Ok(reply));
                }
                Err(e) => {
                    let in_use = in_use(&e);
                    if in_use {
                        // The caller stops with an error that says so.
                        tracing::debug!(node = i, %addr, error = %e, "identity held by another process");
                    } else {
                        tracing::warn!(node = i, %addr, error = %e, "memory node unreachable");
                    }
                    let _ = conns[i].set(Conn::new(id, addr, None));
                    outcomes.push(Err(HelloFailure {
                        reason: e.to_string(),
                        in_use,
                    }));
                }
            }
        }
        let shared = Arc::new(Shared {
            conns,
            members: AtomicUsize::new(nodes.len()),
            joining: Mutex::new(()),
            completions,
            calls: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            stop: AtomicBool::new(false),
            options,
            waker,
            want_write: Mutex::new(Vec::with_capacity(4 * capacity)),
            new_streams: Mutex::new(Vec::new()),
            rx,
            broken: Mutex::new(Vec::new()),
            greeting,
            monitor_wake: (
                parking_lot::Mutex::new(Wake::Sleep),
                parking_lot::Condvar::new(),
            ),
        });
        let s2 = shared.clone();
        let receiver = std::thread::Builder::new()
            .name("hm-recv".into())
            .spawn(move || receive::receive_loop(s2, poll))?;
        let s3 = shared.clone();
        let monitor = std::thread::Builder::new()
            .name("hm-monitor".into())
            .spawn(move || monitor::monitor_loop(s3))?;
        tracing::info!(timeouts = %options, "client failure detector");
        Ok((
            TcpTransport {
                shared,
                receiver: Some(receiver),
                monitor: Some(monitor),
            },
            outcomes,
        ))
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = self.shared.waker.wake();
        {
            let (m, cv) = &self.shared.monitor_wake;
            *m.lock() = Wake::Stop;
            cv.notify_all();
        }
        if let Some(h) = self.monitor.take() {
            let _ = h.join();
        }
        if let Some(h) = self.receiver.take() {
            let _ = h.join();
        }
        for c in self.shared.conns.iter().filter_map(OnceLock::get) {
            if let Some(s) = c.stream.load().as_ref() {
                let _ = s.sock.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}
/// Reconnections refused because another process holds the identity (logged sampled).
static IN_USE_REFUSED: crate::sampled::Sampled = crate::sampled::Sampled::new(100);
impl Shared {
    /// Members so far (slots `0..members()` are filled).
    fn members(&self) -> usize {
        self.members.load(Ordering::Acquire)
    }

    /// The member in slot `node`, if it is filled.
    fn slot(&self, node: u16) -> Option<&Conn> {
        self.conns.get(node as usize)?.get()
    }

    fn conn(&self, node: u16) -> Result<&Conn, TransportError> {
        let c = self.slot(node).ok_or_else(|| TransportError::Down {
            node,
            addr: "(no such node)".into(),
        })?;
        if !c.up.load(Ordering::Acquire) {
            return Err(TransportError::Down {
                node,
                addr: c.addr.to_string(),
            });
        }
        Ok(c)
    }

    /// A blocking control request with its own timeout.
    fn call(
        &self,
        node: u16,
        op: Op,
        body: &[u8],
        waited: Duration,
    ) -> Result<Vec<u8>, TransportError> {
        let sh = self;
        let c = sh.conn(node)?;
        let id = sh.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = sync_channel(1);
        sh.calls.lock().insert(id, (node, op, tx));
        {
            let mut st = c.send.lock();
            st.open = None;
            let fb = FrameBuilder::begin(&mut st.buf, op, false, Status::Ok, id);
            st.buf.extend_from_slice(body);
            fb.finish(&mut st.buf)
                .map_err(|e| TransportError::Protocol {
                    node,
                    addr: c.addr.to_string(),
                    reason: e.to_string(),
                })?;
            sh.flush_locked(node, c, st)?;
        }
        match rx.recv_timeout(waited) {
            Ok((Status::Ok, body)) => Ok(body),
            Ok((status, _)) => Err(TransportError::Refused {
                node,
                addr: c.addr.to_string(),
                op,
                status,
            }),
            Err(RecvTimeoutError::Timeout) => {
                sh.calls.lock().remove(&id);
                Err(TransportError::Timeout {
                    node,
                    addr: c.addr.to_string(),
                    op,
                    waited,
                })
            }
            Err(RecvTimeoutError::Disconnected) => Err(TransportError::Down {
                node,
                addr: c.addr.to_string(),
            }),
        }
    }

    /// A heartbeat: sends PING and waits for the answer up to `timeout`. Allocation-free, so
    /// that heartbeats add nothing to the data path's zero-allocation budget.
    fn ping(&self, node: u16, timeout: Duration) -> bool {
        let Ok(c) = self.conn(node) else { return false };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        c.ping_sent.store(id, Ordering::Release);
        {
            let mut st = c.send.lock();
            st.open = None;
            if FrameBuilder::begin(&mut st.buf, Op::Ping, false, Status::Ok, id)
                .finish(&mut st.buf)
                .is_err()
            {
                return false;
            }
            if self.flush_locked(node, c, st).is_err() {
                return false;
            }
        }
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if c.pong.load(Ordering::Acquire) == id {
                return true;
            }
            // The transport stopping, or the connection lost meanwhile: no answer will come,
            // and a drop must not wait out a long heartbeat timeout.
            if self.stop.load(Ordering::SeqCst) || !c.up.load(Ordering::Acquire) {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        false
    }

    /// Puts a connection that completed its handshake in service for slot `node`: the
    /// senders use it from a clean send buffer, the receiver thread registers it, and the
    /// node is up. `false` if its socket cannot be shared with the receiver (it stays down).
    fn attach(&self, node: u16, c: &Conn, wire: Wire) -> bool {
        let Ok(clone) = wire.sock.try_clone() else {
            return false;
        };
        let wire = Arc::new(wire);
        {
            let mut st = c.send.lock();
            st.buf.clear();
            st.open = None;
            st.flushing = false;
        }
        c.stream.store(Some(wire.clone()));
        self.new_streams
            .lock()
            .push((node, mio::net::TcpStream::from_std(clone), wire));
        let _ = self.waker.wake();
        c.notice
            .store(wire::Notice::default().encode(), Ordering::Relaxed);
        c.up.store(true, Ordering::Release);
        true
    }

    /// Tries to reconnect a node that is down; on success it is up again.
    fn reconnect(&self, node: u16) {
        let Some(c) = self.slot(node) else { return };
        let (wire, reply) = match handshake(c.addr, c.id, &self.greeting, self.options) {
            Ok(x) => x,
            Err(e) if in_use(&e) => {
                // While this client was cut off from the node, another process took its
                // identity there: the node stays down for this one (it reads and repairs
                // around it), and the operator must hear of it.
                metrics::counter!("hydramem_client_identity_in_use_total").increment(1);
                if let Some(times) = IN_USE_REFUSED.hit() {
                    tracing::error!(node, addr = %c.addr, times, "the node says another process holds this client's identity: two processes are using one --client-id; stop one of them");
                }
                return;
            }
            Err(e) => {
                tracing::debug!(node, error = %e, "memory node still down");
                return;
            }
        };
        let before = c.incarnation.swap(reply.incarnation, Ordering::AcqRel);
        if before != 0 && before != reply.incarnation {
            tracing::warn!(node, addr = %c.addr, "memory node restarted: the slabs it held are gone");
            c.restarted.store(true, Ordering::Release);
        }
        if !self.attach(node, c, wire) {
            return;
        }
        metrics::counter!("hydramem_client_reconnects_total").increment(1);
        tracing::info!(node, addr = %c.addr, "memory node is back: reconnected");
    }

    /// A reply that answers nothing this client asked of `node` (another node's call, another
    /// operation, a heartbeat never sent): dropped and counted.
    fn unexpected_reply(&self, node: u16, h: &Header) {
        metrics::counter!("hydramem_client_foreign_replies_total").increment(1);
        tracing::debug!(node, op = ?h.op, id = h.id, "dropped a reply to nothing this node was asked");
    }

    fn mark_down(&self, node: u16) {
        let Some(c) = self.slot(node) else { return };
        if c.up.swap(false, Ordering::AcqRel) {
            tracing::warn!(node, addr = %c.addr, "memory node connection lost");
            metrics::counter!("hydramem_client_node_down_total").increment(1);
            if let Some(s) = c.stream.load().as_ref() {
                let _ = s.sock.shutdown(std::net::Shutdown::Both);
            }
            self.calls.lock().retain(|_, (n, _, _)| *n != node);
            self.completions.node_down(node);
        }
    }
}

impl Transport for TcpTransport {
    fn nodes(&self) -> usize {
        self.shared.members()
    }

    fn capacity(&self) -> usize {
        self.shared.conns.len()
    }

    fn is_up(&self, node: u16) -> bool {
        self.shared
            .slot(node)
            .is_some_and(|c| c.up.load(Ordering::Acquire))
    }

    fn take_restarted(&self, node: u16) -> bool {
        self.shared
            .slot(node)
            .is_some_and(|c| c.restarted.swap(false, Ordering::AcqRel))
    }

    fn notice(&self, node: u16) -> wire::Notice {
        self.shared
            .slot(node)
            .map(|c| wire::Notice::decode(c.notice.load(Ordering::Relaxed)))
            .unwrap_or_default()
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

    fn receive_from(&self, node: u16) -> bool {
        self.shared.receive_from(node)
    }

    fn flush(&self, node: u16) -> Result<(), TransportError> {
        self.shared.flush_node(node)
    }

    /// Fills the next free slot with the member and connects to it; a member that cannot be
    /// reached now joins down, and the monitor reconnects it. Fails only when every slot is
    /// taken.
    fn join(&self, id: u32, addr: SocketAddr) -> Result<u16, TransportError> {
        let sh = &self.shared;
        let _joining = sh.joining.lock();
        let slot = sh.members();
        let node = super::transport::next_slot(slot, sh.conns.len(), addr)?;
        let c = sh.conns[slot].get_or_init(|| Conn::new(id, addr, None));
        match handshake(addr, id, &sh.greeting, sh.options) {
            Ok((wire, reply)) => {
                c.incarnation.store(reply.incarnation, Ordering::Release);
                if !sh.attach(node, c, wire) {
                    tracing::warn!(node, id, %addr, "cannot share the new member's socket with the receiver: joined down");
                }
            }
            Err(e) if in_use(&e) => {
                tracing::error!(node, id, %addr, "the new member says another process holds this client's identity: two processes are using one --client-id; joined down");
            }
            Err(e) => {
                tracing::warn!(node, id, %addr, error = %e, "new member unreachable: joined down");
            }
        }
        sh.members.store(slot + 1, Ordering::Release);
        Ok(node)
    }

    fn sockets(&self) -> Vec<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        let sh = &self.shared;
        // Each connection's socket, and the duplicate the receiver reads on (registered or
        // waiting to be).
        let mut fds: Vec<_> = (sh.conns.iter().filter_map(OnceLock::get))
            .filter_map(|c| c.stream.load_full())
            .map(|w| w.sock.as_raw_fd())
            .collect();
        fds.extend(sh.rx.iter().filter_map(|rx| rx.lock().as_ref().map(Rx::fd)));
        fds.extend(sh.new_streams.lock().iter().map(|(_, m, _)| m.as_raw_fd()));
        fds
    }

    fn suspect(&self, node: u16) {
        if let Some(c) = self.shared.slot(node) {
            c.left.store(true, Ordering::Release);
            let (m, cv) = &self.shared.monitor_wake;
            let mut wake = m.lock();
            if *wake == Wake::Sleep {
                *wake = Wake::Look;
            }
            cv.notify_all();
        }
    }

    fn call(&self, node: u16, op: Op, body: &[u8]) -> Result<Vec<u8>, TransportError> {
        self.shared
            .call(node, op, body, self.shared.options.call_timeout)
    }

    /// A connection of its own, with the client's HELLO, that waits as long as the node
    /// takes (an hour at most): a slab of gigabytes rebuilds in seconds to minutes.
    fn regen(&self, node: u16, req: &wire::Regen) -> Result<RegenCall, TransportError> {
        let c = self.shared.conn(node)?;
        let (addr, greeting) = (c.addr, self.shared.greeting.clone().to_node(c.id));
        let connect = self.shared.options.connect_timeout;
        let mut body = Vec::new();
        req.put(&mut body);
        Ok(Box::new(move || {
            crate::rpc::Connection::open(addr, Some(&greeting), connect, Duration::from_secs(3600))
                .and_then(|mut s| s.call(Op::Regen, &body, wire::parse_regen_reply))
                .map_err(|source| TransportError::Regen {
                    node,
                    addr: addr.to_string(),
                    source: Box::new(source),
                })
        }))
    }

    fn addr(&self, node: u16) -> String {
        self.shared
            .slot(node)
            .map(|c| c.addr.to_string())
            .unwrap_or_else(|| format!("(node {node})"))
    }
}
