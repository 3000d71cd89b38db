//! One blocking request and its reply, on a connection of its own to a memory node: the
//! exchanges outside the pipelined data path (a client's REGEN, a regenerating node's HELLO and
//! CORRUPT to its sources, and the STATS, DRAIN, FAULT, LIST and FREE of the tools), and the
//! greeting every connection starts with, the data path's too ([`greet`]: HELLO, and with a
//! cluster key the node's proof checked and AUTH, see [`crate::auth`]). A greeting with TLS
//! ([`crate::tls`]) makes its connection a TLS one before the first byte of the protocol.
//!
//! Invariants: a request is one frame and its reply is awaited before anything else is sent on
//! the connection. A reply is accepted only if it answers that very request (the reply bit,
//! the request's op and its id; ids are unique in the process), so a late reply to an earlier
//! request that timed out is never taken for the current one; after any error the connection
//! is in an unknown state and must be dropped. The reply body is read whole, and its length is
//! checked by [`wire::Header::parse`] first (at most [`wire::MAX_BODY`]), so a peer cannot make
//! the caller allocate more. A reply with any status but OK is an error naming the status.
//! Every error says which request failed, on which node, and what to look at. This module
//! reads and writes no protocol bytes itself: frames and bodies are [`wire`]'s.

#[cfg(feature = "fuzzing")]
pub mod fuzzing;

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::auth::{self, ClusterKey};
use crate::tls::{Link, Tls};
use crate::wire::{
    self, ClientId, FrameBuilder, Header, Hello, HelloReply, Op, Status, WireError, HEADER_LEN,
};

/// Why a request to a node failed.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// No connection to the node could be made.
    #[error(
        "cannot connect to the memory node at {node}: {source}; check that it runs and \
         listens on that address"
    )]
    Connect {
        /// The node's address.
        node: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
    /// The node did not answer within the connection's reply timeout.
    #[error(
        "{op:?} to the memory node at {}: no reply within {timeout:?}; the node may be \
         stopped (SIGSTOP), overloaded or cut off",
        at(node)
    )]
    Timeout {
        /// The request.
        op: Op,
        /// The node's address (`None` if the connection no longer knows it).
        node: Option<SocketAddr>,
        /// The reply timeout that ran out.
        timeout: Duration,
    },
    /// The request could not be sent or its reply not read whole.
    #[error(
        "{op:?} to the memory node at {}: {source}{}",
        at(node),
        if source.kind() == io::ErrorKind::UnexpectedEof {
            " (the node closed the connection: it exited, found the request malformed, or \
             requires TLS, which this end did not use: give --tls DIR, see `hydramem tls`)"
        } else {
            ""
        }
    )]
    Io {
        /// The request.
        op: Op,
        /// The node's address (`None` if the connection no longer knows it).
        node: Option<SocketAddr>,
        /// The OS error.
        source: io::Error,
    },
    /// The request could not be framed, or the reply is not a well-formed answer to it.
    #[error("{op:?} to the memory node at {}: {source}", at(node))]
    Protocol {
        /// The request.
        op: Op,
        /// The node's address (`None` if the connection no longer knows it).
        node: Option<SocketAddr>,
        /// What is wrong with the frame or its body.
        source: WireError,
    },
    /// The node answered with a status other than OK.
    #[error(
        "{op:?} refused by the memory node at {}: {status}{}",
        at(node),
        if *status == Status::Forbidden && *op == Op::Fault {
            " (start the node with --allow-fault-injection to allow it)"
        } else {
            ""
        }
    )]
    Refused {
        /// The request.
        op: Op,
        /// The node's address (`None` if the connection no longer knows it).
        node: Option<SocketAddr>,
        /// The status it answered.
        status: Status,
    },
    /// The greeting's authentication failed (see [`crate::auth`]).
    #[error("memory node at {}: {reason}", at(node))]
    Auth {
        /// The node's address.
        node: Option<SocketAddr>,
        /// What failed, and what to do.
        reason: String,
    },
}

impl RpcError {
    /// The status the node refused the request with, if that is what happened.
    pub fn refused(&self) -> Option<Status> {
        match self {
            RpcError::Refused { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether the node refused the identity because another process holds it there.
    pub fn in_use(&self) -> bool {
        self.refused() == Some(Status::IdentityInUse)
    }
}

/// How long a process that starts to use an identity keeps asking a node that says another
/// process holds it: a predecessor that just exited (a restart, or `hydramem run`'s program
/// whose memory it then releases) may still have connections closing there.
pub const IN_USE_GRACE: Duration = Duration::from_secs(3);

/// `attempt`, made again until `until` (pauses from 10 ms, doubling to 250 ms) while it fails
/// in a way `in_use` says is the identity held by another process; then its last outcome.
/// One deadline for all the nodes of one start ([`IN_USE_GRACE`] from it), so that a process
/// that really holds the identity costs the start that grace once, not once per node.
pub fn patiently<T, E>(
    until: std::time::Instant,
    in_use: impl Fn(&E) -> bool,
    mut attempt: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let mut pause = Duration::from_millis(10);
    loop {
        match attempt() {
            Err(e) if in_use(&e) && std::time::Instant::now() + pause < until => {
                tracing::debug!("identity still held by another process at a node; asking again");
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(250));
            }
            other => return other,
        }
    }
}

/// A node's address for an error message.
fn at(node: &Option<SocketAddr>) -> String {
    node.map_or_else(|| "(address unknown)".into(), |a| a.to_string())
}

/// The id of the next request; unique in the process, so that no reply to an earlier request
/// can pass for the reply to a later one on the same connection.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A connection of its own to one node, for requests made one at a time.
#[derive(Debug)]
pub struct Connection {
    stream: Link,
    node: SocketAddr,
    reply: Duration,
}

impl Connection {
    /// Connects to the node at `node` within `connect`, awaits each reply up to `reply`, and
    /// says HELLO with `hello` when given (STATS, FAULT and DRAIN need none; slab requests
    /// act for the identity given there).
    pub fn open(
        node: SocketAddr,
        greeting: Option<&Greeting>,
        connect: Duration,
        reply: Duration,
    ) -> Result<Connection, RpcError> {
        let connect_error = |source| RpcError::Connect { node, source };
        let stream = TcpStream::connect_timeout(&node, connect).map_err(connect_error)?;
        stream
            .set_read_timeout(Some(reply))
            .map_err(connect_error)?;
        // TLS (when the greeting has it) before anything of the protocol, within the time a
        // reply may take.
        let tls = greeting.and_then(|g| g.tls.as_ref());
        let stream = Link::connect(stream, tls, std::time::Instant::now() + reply.max(connect))
            .map_err(connect_error)?;
        let mut c = Connection {
            stream,
            node,
            reply,
        };
        if let Some(g) = greeting {
            let peer = Peer {
                node: Some(node),
                reply: Some(reply),
            };
            greet(&mut c.stream, peer, g)?;
        }
        Ok(c)
    }

    /// The node's address.
    pub fn node(&self) -> SocketAddr {
        self.node
    }

    /// The connection, after HELLO, for a caller that pipelines requests of its own on it (a
    /// regenerating node's READV to a source).
    pub fn into_link(self) -> Link {
        self.stream
    }

    /// Sends `op` with `body` and returns the body of the node's OK reply.
    pub fn request(&mut self, op: Op, body: &[u8]) -> Result<Vec<u8>, RpcError> {
        let peer = Peer {
            node: Some(self.node),
            reply: Some(self.reply),
        };
        exchange(&mut self.stream, peer, op, body)
    }

    /// Sends `op` with `body` and returns the node's OK reply as `parse` reads its body (one
    /// of [`wire`]'s parsers); a body it refuses is a [`RpcError::Protocol`].
    pub fn call<T>(
        &mut self,
        op: Op,
        body: &[u8],
        parse: impl FnOnce(&[u8]) -> Result<T, WireError>,
    ) -> Result<T, RpcError> {
        let reply = self.request(op, body)?;
        parse(&reply).map_err(|source| RpcError::Protocol {
            op,
            node: Some(self.node),
            source,
        })
    }
}

/// [`Connection::request`] on a stream the caller set up itself (its own timeouts and
/// options); errors name the stream's peer.
pub fn request(stream: &mut Link, op: Op, body: &[u8]) -> Result<Vec<u8>, RpcError> {
    let peer = Peer::of(stream.tcp());
    exchange(stream, peer, op, body)
}

/// Asks the node at `node` to inject `fault`; it refuses ([`Status::Forbidden`]) unless it
/// was started with `--allow-fault-injection`.
pub fn inject(
    node: SocketAddr,
    fault: wire::Fault,
    access: &Access,
    timeout: Duration,
) -> Result<(), RpcError> {
    let mut body = Vec::new();
    fault.put(&mut body);
    Connection::open(node, access.operator().as_ref(), timeout, timeout)?
        .request(Op::Fault, &body)
        .map(drop)
}

/// What a connection needs to be let into a cluster: its key and its TLS, each if the
/// cluster has one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access {
    /// The cluster key.
    pub key: Option<ClusterKey>,
    /// TLS.
    pub tls: Option<Tls>,
}

impl Access {
    /// Neither: an open cluster.
    pub fn open() -> Access {
        Access::default()
    }

    /// The key only.
    pub fn key(key: Option<&ClusterKey>) -> Access {
        Access {
            key: key.cloned(),
            tls: None,
        }
    }

    /// What the cluster file (and the flags that override it) gave.
    pub fn of(cluster: &crate::cluster::Cluster) -> Access {
        Access {
            key: cluster.key.clone(),
            tls: cluster.tls.clone(),
        }
    }

    /// An observer's greeting (STATS).
    pub fn observer(&self) -> Greeting {
        Greeting::observer(self.key.as_ref()).with_tls(self.tls.as_ref())
    }

    /// An operator's greeting (DRAIN, FAULT), if one is needed: a node without a key takes
    /// them from anyone, so only TLS or a key makes a greeting worth its round trip.
    pub fn operator(&self) -> Option<Greeting> {
        (self.key.is_some() || self.tls.is_some())
            .then(|| Greeting::operator(self.key.as_ref()).with_tls(self.tls.as_ref()))
    }
}

/// What a connection says in its greeting.
#[derive(Debug, Clone)]
pub struct Greeting {
    /// The owner handle said in HELLO ([`auth::ClusterKey::owner`] of the identity with a key,
    /// the identity itself without).
    pub owner: ClientId,
    /// `HELLO_*` flags.
    pub flags: u32,
    /// The cluster key, if the cluster has one: the node must prove it, and so does this end.
    pub key: Option<ClusterKey>,
    /// The node id the node must say it is (the cluster file's), if known.
    pub node_id: Option<u32>,
    /// TLS for the connection, if the cluster uses it (see [`crate::tls`]).
    pub tls: Option<Tls>,
    /// The process speaking for the identity ([`process_instance`] unless a test plays
    /// another process): a node refuses the identity to a second instance while the first
    /// one's connections are open.
    pub instance: u64,
}

/// This process's instance: drawn at random the first time it is asked for, then the same
/// for the process's life. Every connection this process opens for an identity says it in
/// HELLO, so that a node can tell a second process using the same identity from a
/// reconnection of the first. (A forked child that goes on without the client must close
/// the client's connections it inherited, as `hydramem run`'s pager does.)
pub fn process_instance() -> u64 {
    static INSTANCE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *INSTANCE.get_or_init(|| rand::random::<u64>().max(1))
}

impl Greeting {
    /// The greeting of the identity `client` (its owner handle is derived here).
    pub fn client(client: &ClientId, flags: u32, key: Option<&ClusterKey>) -> Greeting {
        Greeting {
            owner: key.map_or(*client, |k| k.owner(client)),
            flags,
            key: key.cloned(),
            node_id: None,
            tls: None,
            instance: process_instance(),
        }
    }

    /// The same, as instance `instance` (a test playing a second process).
    pub fn with_instance(mut self, instance: u64) -> Greeting {
        self.instance = instance;
        self
    }

    /// The same over TLS with `tls`, if given.
    pub fn with_tls(mut self, tls: Option<&Tls>) -> Greeting {
        self.tls = tls.cloned();
        self
    }

    /// An observer's greeting (status tools): no identity of its own.
    pub fn observer(key: Option<&ClusterKey>) -> Greeting {
        Self::client(&ClientId::default(), wire::HELLO_OBSERVER, key)
    }

    /// An operator's greeting (DRAIN, FAULT).
    pub fn operator(key: Option<&ClusterKey>) -> Greeting {
        Self::client(
            &ClientId::default(),
            wire::HELLO_OBSERVER | wire::HELLO_OPERATOR,
            key,
        )
    }

    /// The HELLO this greeting opens with, with a fresh nonce.
    pub fn hello(&self) -> Hello {
        Hello {
            client: self.owner,
            flags: self.flags,
            nonce: auth::nonce(),
            instance: self.instance,
        }
    }

    /// The same, to node `id` only.
    pub fn to_node(mut self, id: u32) -> Greeting {
        self.node_id = Some(id);
        self
    }
}

/// HELLO on `stream` (blocking), and with a key the node's proof checked and AUTH sent; the
/// node's reply. Refused: a node that says it is another node than `g.node_id`, one that has
/// no key when this end has one or the reverse (never a silent downgrade), and one whose proof
/// is wrong — before this end proves anything.
pub fn greet(
    stream: &mut (impl Read + Write),
    peer: Peer,
    g: &Greeting,
) -> Result<HelloReply, RpcError> {
    let node = peer.node;
    let refuse = |reason: String| RpcError::Auth { node, reason };
    let hello = g.hello();
    let mut body = Vec::new();
    hello.put(&mut body);
    let reply = exchange(stream, peer, Op::Hello, &body)?;
    let r = HelloReply::parse(&reply).map_err(|source| RpcError::Protocol {
        op: Op::Hello,
        node,
        source,
    })?;
    if let Some(id) = g.node_id.filter(|&id| id != r.node_id) {
        return Err(refuse(format!(
            "it says it is node {}, but the cluster file lists node {id} there; fix the \
             cluster file or restart that node with --id {id}",
            r.node_id
        )));
    }
    let proof = auth::respond(g.key.as_ref(), &hello, &r).map_err(refuse)?;
    if let Some(proof) = proof {
        let mut body = Vec::new();
        wire::put_auth(&mut body, &proof);
        match exchange(stream, peer, Op::Auth, &body) {
            Ok(_) => {}
            Err(RpcError::Refused {
                status: Status::Unauthenticated,
                ..
            }) => {
                return Err(refuse(
                    "it refused this end's proof of the cluster key: the two hold different \
                     keys"
                        .into(),
                ))
            }
            Err(e) => return Err(e),
        }
    }
    Ok(r)
}

/// Whom a blocking exchange is with, for its errors and timeouts.
#[derive(Clone, Copy)]
pub struct Peer {
    /// The node's address.
    pub node: Option<SocketAddr>,
    /// The reply timeout set on the stream.
    pub reply: Option<Duration>,
}

impl Peer {
    /// The peer of `stream` as its socket knows it.
    pub fn of(stream: &TcpStream) -> Peer {
        Peer {
            node: stream.peer_addr().ok(),
            reply: stream.read_timeout().ok().flatten(),
        }
    }
}

/// One request and its reply on `stream`.
fn exchange(
    stream: &mut (impl Read + Write),
    peer: Peer,
    op: Op,
    body: &[u8],
) -> Result<Vec<u8>, RpcError> {
    let node = peer.node;
    let protocol = |source| RpcError::Protocol { op, node, source };
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    let fb = FrameBuilder::begin(&mut out, op, false, Status::Ok, id);
    out.extend_from_slice(body);
    fb.finish(&mut out).map_err(protocol)?;
    let io = |source: io::Error| match (source.kind(), peer.reply) {
        // A read timeout is EAGAIN on Unix ("resource temporarily unavailable").
        (io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut, Some(timeout)) => {
            RpcError::Timeout { op, node, timeout }
        }
        _ => RpcError::Io { op, node, source },
    };
    stream
        .write_all(&out)
        .and_then(|()| stream.flush())
        .map_err(io)?;
    let mut hb = [0u8; HEADER_LEN];
    stream.read_exact(&mut hb).map_err(io)?;
    let h = Header::parse(&hb).map_err(protocol)?;
    if !h.reply || h.op != op || h.id != id {
        return Err(protocol(WireError::Invalid(
            "the reply answers another request (its op or id differ); the connection is \
             out of step, retry on a new one",
        )));
    }
    let mut reply = vec![0u8; h.body_len as usize];
    stream.read_exact(&mut reply).map_err(io)?;
    if h.status != Status::Ok {
        return Err(RpcError::Refused {
            op,
            node,
            status: h.status,
        });
    }
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::sync::mpsc;
    use std::thread::JoinHandle;

    use super::*;

    /// What the fake node does with the one request it reads.
    enum Answer {
        /// Writes these bytes, then keeps the connection open until the test is done.
        Send(Vec<u8>),
        /// Writes these bytes, then closes the connection.
        SendAndClose(Vec<u8>),
    }

    /// A node that accepts one connection, reads one request and answers it as `answer` says;
    /// it keeps the connection until the returned sender is dropped.
    struct Fake {
        addr: SocketAddr,
        hold: Option<mpsc::Sender<()>>,
        thread: Option<JoinHandle<()>>,
    }

    impl Fake {
        fn start(answer: impl FnOnce(&Header, &[u8]) -> Answer + Send + 'static) -> Fake {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let (hold, held) = mpsc::channel::<()>();
            let thread = std::thread::spawn(move || {
                let (mut s, _) = listener.accept().unwrap();
                let mut hb = [0u8; HEADER_LEN];
                s.read_exact(&mut hb).unwrap();
                let h = Header::parse(&hb).unwrap();
                let mut body = vec![0u8; h.body_len as usize];
                s.read_exact(&mut body).unwrap();
                match answer(&h, &body) {
                    Answer::Send(b) => {
                        s.write_all(&b).unwrap();
                        let _ = held.recv();
                    }
                    Answer::SendAndClose(b) => s.write_all(&b).unwrap(),
                }
            });
            Fake {
                addr,
                hold: Some(hold),
                thread: Some(thread),
            }
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            drop(self.hold.take());
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    /// A reply frame to `h` with `status` and `body`.
    fn reply(h: &Header, status: Status, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let fb = FrameBuilder::begin(&mut out, h.op, true, status, h.id);
        out.extend_from_slice(body);
        fb.finish(&mut out).unwrap();
        out
    }

    fn open(addr: SocketAddr, reply: Duration) -> Connection {
        Connection::open(addr, None, Duration::from_secs(5), reply).unwrap()
    }

    const LONG: Duration = Duration::from_secs(30);

    #[test]
    fn the_reply_to_the_request_gives_its_body() {
        let fake = Fake::start(|h, body| {
            assert_eq!((h.op, h.reply, h.status), (Op::List, false, Status::Ok));
            let mut echo = body.to_vec();
            echo.reverse();
            Answer::Send(reply(h, Status::Ok, &echo))
        });
        let got = open(fake.addr, LONG).request(Op::List, b"abc").unwrap();
        assert_eq!(got, b"cba");
    }

    #[test]
    fn a_refusal_names_the_request_the_node_and_what_to_do() {
        let fake = Fake::start(|h, _| Answer::Send(reply(h, Status::Forbidden, &[])));
        let e = inject(fake.addr, wire::Fault::Clear, &Access::open(), LONG).unwrap_err();
        assert_eq!(e.refused(), Some(Status::Forbidden));
        let text = e.to_string();
        for part in [
            "Fault",
            &fake.addr.to_string(),
            "not allowed",
            "--allow-fault-injection",
        ] {
            assert!(text.contains(part), "{part:?} missing from {text:?}");
        }
    }

    /// The error of a STATS whose reply header is the request's, made a reply with an empty
    /// body, then changed by `twist`.
    fn stats_with_reply_header(twist: fn(Header) -> Header) -> RpcError {
        let fake = Fake::start(move |h, _| {
            let h = twist(Header {
                reply: true,
                body_len: 0,
                ..*h
            });
            Answer::Send(h.encode().to_vec())
        });
        open(fake.addr, LONG).request(Op::Stats, &[]).unwrap_err()
    }

    #[test]
    fn a_reply_that_answers_another_request_is_refused() {
        type Twist = fn(Header) -> Header;
        let twists: [Twist; 3] = [
            |h| Header { id: h.id + 1, ..h },
            |h| Header { reply: false, ..h },
            |h| Header { op: Op::Free, ..h },
        ];
        for twist in twists {
            let e = stats_with_reply_header(twist);
            assert!(
                matches!(
                    e,
                    RpcError::Protocol {
                        op: Op::Stats,
                        source: WireError::Invalid(_),
                        ..
                    }
                ),
                "{e:?}"
            );
        }
    }

    #[test]
    fn a_reply_longer_than_a_frame_is_refused_before_anything_is_allocated() {
        let e = stats_with_reply_header(|h| Header {
            body_len: wire::MAX_BODY as u32 + 1,
            ..h
        });
        assert!(
            matches!(
                e,
                RpcError::Protocol {
                    source: WireError::TooLarge(_),
                    ..
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn a_body_its_parser_refuses_is_a_protocol_error() {
        let fake = Fake::start(|h, _| Answer::Send(reply(h, Status::Ok, b"x")));
        let e = open(fake.addr, LONG)
            .call(Op::List, &[], wire::parse_list)
            .unwrap_err();
        assert!(
            matches!(e, RpcError::Protocol { op: Op::List, node: Some(a), .. } if a == fake.addr),
            "{e:?}"
        );
    }

    #[test]
    fn a_silent_node_is_a_timeout_that_says_so() {
        // The fake answers nothing (an empty write) and keeps the connection open.
        let fake = Fake::start(|_, _| Answer::Send(Vec::new()));
        let wait = Duration::from_millis(50);
        let e = open(fake.addr, wait).request(Op::Ping, &[]).unwrap_err();
        assert!(
            matches!(e, RpcError::Timeout { op: Op::Ping, timeout, .. } if timeout == wait),
            "{e:?}"
        );
        assert!(e.to_string().contains("no reply within 50ms"), "{e}");
    }

    #[test]
    fn a_node_that_closes_mid_reply_is_an_io_error_that_says_so() {
        let fake = Fake::start(|h, _| {
            let mut b = reply(h, Status::Ok, &[0; 8]);
            b.truncate(HEADER_LEN + 2);
            Answer::SendAndClose(b)
        });
        let e = open(fake.addr, LONG).request(Op::Stats, &[]).unwrap_err();
        assert!(
            matches!(&e, RpcError::Io { source, .. } if source.kind() == io::ErrorKind::UnexpectedEof),
            "{e:?}"
        );
        assert!(e.to_string().contains("closed the connection"), "{e}");
    }

    #[test]
    fn a_node_that_does_not_listen_is_a_connect_error() {
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        // The listener is closed: nothing listens on `addr` any more.
        let e = Connection::open(addr, None, LONG, LONG).unwrap_err();
        assert!(
            matches!(e, RpcError::Connect { node, .. } if node == addr),
            "{e:?}"
        );
        assert!(e.to_string().contains("check that it runs"), "{e}");
    }
}
