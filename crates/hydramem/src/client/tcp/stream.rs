//! A connection to one memory node as the TCP transport sets it up and shares it: connecting
//! and greeting the node ([`handshake`]: TLS first if the greeting has it, then HELLO, and
//! with a cluster key both proofs), and the [`Wire`] its senders and its receiver then take in
//! turn.
//!
//! Invariants: a connection is used only as the node the cluster file names for its address
//! (the HELLO reply must say node `id`, or the connection is refused); once greeted, its
//! socket is non-blocking, so no sender or reader ever waits on it; with TLS, the session is
//! behind one lock, and the encrypted bytes it still holds go out before any new ones.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use parking_lot::Mutex;

use super::TcpOptions;
use crate::rpc::Greeting;
use crate::wire::HelloReply;

/// [`handshake`], asked again until `until` while the node says the identity is in use (a
/// restart right after its predecessor exited), then given up with that refusal.
pub(super) fn handshake_at_start(
    addr: SocketAddr,
    id: u32,
    greeting: &Greeting,
    o: TcpOptions,
    until: Instant,
) -> io::Result<(Wire, HelloReply)> {
    crate::rpc::patiently(until, in_use, || handshake(addr, id, greeting, o))
}

/// Whether a handshake failed because the node said another process holds the identity.
pub(super) fn in_use(e: &io::Error) -> bool {
    e.get_ref()
        .and_then(|e| e.downcast_ref::<crate::rpc::RpcError>())
        .is_some_and(crate::rpc::RpcError::in_use)
}

/// Connects and greets the node on a blocking socket (TLS first if the greeting has it, then
/// [`crate::rpc::greet`]: HELLO, and with a cluster key both proofs), then switches to
/// non-blocking. The node must answer as node `id` (the cluster file's id for that address),
/// or the connection is refused: a node started with another `--id`, or a cluster file that
/// lists the wrong address, must not be used as the node it is not.
pub(super) fn handshake(
    addr: SocketAddr,
    id: u32,
    greeting: &Greeting,
    o: TcpOptions,
) -> io::Result<(Wire, HelloReply)> {
    let s = TcpStream::connect_timeout(&addr, o.connect_timeout)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(o.call_timeout))?;
    let g = greeting.clone().to_node(id);
    let peer = crate::rpc::Peer::of(&s);
    let deadline = Instant::now() + o.call_timeout;
    let mut link = crate::tls::Link::connect(s, g.tls.as_ref(), deadline)?;
    let reply = crate::rpc::greet(&mut link, peer, &g).map_err(io::Error::other)?;
    let (sock, tls) = link.into_client_parts();
    sock.set_read_timeout(None)?;
    sock.set_nonblocking(true)?;
    let wire = Wire {
        sock,
        tls: tls.map(Mutex::new),
    };
    Ok((wire, reply))
}

/// A connection's socket and, with TLS, its session, which senders and the receiver take in
/// turn (see [`super`]).
pub(super) struct Wire {
    pub(super) sock: TcpStream,
    tls: Option<Mutex<rustls::ClientConnection>>,
}

impl Wire {
    /// Writes as much of `buf` as the socket takes without blocking. Returns how much of it
    /// was taken, and whether encrypted bytes still wait in the TLS session for the socket
    /// (then the socket must be waited on, as for a partial write).
    pub(super) fn send(&self, buf: &[u8]) -> io::Result<(usize, bool)> {
        let Some(tls) = &self.tls else {
            let mut done = 0;
            while done < buf.len() {
                match (&self.sock).write(&buf[done..]) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => done += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            return Ok((done, false));
        };
        let mut conn = tls.lock();
        // What an earlier call left encrypted goes out first, in order.
        if !push(&mut conn, &self.sock)? {
            return Ok((0, true));
        }
        let mut done = 0;
        while done < buf.len() {
            let n = conn.writer().write(&buf[done..])?;
            done += n;
            if !push(&mut conn, &self.sock)? {
                return Ok((done, true));
            }
            if n == 0 {
                break; // the session takes no more now: a partial write, waited on as one
            }
        }
        Ok((done, false))
    }

    /// Whether encrypted bytes wait in the TLS session for the socket.
    pub(super) fn pending(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.lock().wants_write())
    }

    /// Reads what is available now into `out` without blocking (plaintext, with TLS):
    /// `WouldBlock` when nothing is, `Ok(0)` at the end of the connection.
    pub(super) fn receive(
        &self,
        sock: &mut mio::net::TcpStream,
        out: &mut [u8],
    ) -> io::Result<usize> {
        let Some(tls) = &self.tls else {
            return sock.read(out);
        };
        let mut conn = tls.lock();
        loop {
            match conn.reader().read(out) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            // No plaintext left: take in what the socket holds (as much as the session has
            // room for), and what it decrypts to.
            if conn.read_tls(sock)? == 0 {
                return Ok(0);
            }
            conn.process_new_packets()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            // A session message to answer (a key update) goes out with the next bytes if the
            // socket is full now.
            push(&mut conn, &self.sock)?;
        }
    }
}

/// Writes the session's encrypted bytes to the socket: true once none are left, false if the
/// socket is full.
fn push(conn: &mut rustls::ClientConnection, mut sock: &TcpStream) -> io::Result<bool> {
    while conn.wants_write() {
        match conn.write_tls(&mut sock) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{self, ClientId, FrameBuilder, Header, Op, Status, HEADER_LEN};
    use std::net::TcpListener;
    use std::thread::JoinHandle;

    /// A node that answers the first `refusals` HELLOs IDENTITY_IN_USE (and closes), and the
    /// next one as node 1; returns how many HELLOs it saw.
    fn node_held_for(refusals: usize) -> (SocketAddr, JoinHandle<usize>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let thread = std::thread::spawn(move || {
            for seen in 1.. {
                let (mut s, _) = listener.accept().unwrap();
                let mut head = [0u8; HEADER_LEN];
                s.read_exact(&mut head).unwrap();
                let h = Header::parse(&head).unwrap();
                let mut body = vec![0u8; h.body_len as usize];
                s.read_exact(&mut body).unwrap();
                let hello = wire::Hello::parse(&body).unwrap();
                assert_eq!(
                    hello.instance, 42,
                    "every attempt says the process's instance"
                );
                let mut out = Vec::new();
                if seen <= refusals {
                    FrameBuilder::begin(&mut out, Op::Hello, true, Status::IdentityInUse, h.id)
                        .finish(&mut out)
                        .unwrap();
                    s.write_all(&out).unwrap();
                    continue;
                }
                let fb = FrameBuilder::begin(&mut out, Op::Hello, true, Status::Ok, h.id);
                HelloReply {
                    node_id: 1,
                    slab_size: 1 << 20,
                    capacity: 1 << 30,
                    max_body: wire::MAX_BODY as u32,
                    incarnation: 1,
                    auth: crate::auth::AUTH_NONE,
                    nonce: [0; crate::auth::NONCE_LEN],
                    proof: [0; crate::auth::PROOF_LEN],
                }
                .put(&mut out);
                fb.finish(&mut out).unwrap();
                s.write_all(&out).unwrap();
                return seen;
            }
            unreachable!()
        });
        (addr, thread)
    }

    fn greeting() -> Greeting {
        Greeting::client(&ClientId([5; 16]), wire::HELLO_KEPT, None).with_instance(42)
    }

    #[test]
    fn a_start_waits_out_a_predecessor_that_still_holds_the_identity() {
        let (addr, node) = node_held_for(2);
        let until = Instant::now() + crate::rpc::IN_USE_GRACE;
        let (_, reply) = handshake_at_start(addr, 1, &greeting(), TcpOptions::default(), until)
            .expect("admitted once the predecessor's connections closed");
        assert_eq!(reply.node_id, 1);
        assert_eq!(node.join().unwrap(), 3, "two refusals, then admitted");
    }

    #[test]
    fn a_start_gives_up_with_the_refusal_once_its_grace_is_over() {
        // The grace is over (another node of this start used it up): one attempt, refused.
        let (addr, node) = node_held_for(1);
        let e = handshake_at_start(addr, 1, &greeting(), TcpOptions::default(), Instant::now())
            .err()
            .expect("refused");
        assert!(in_use(&e), "{e}");
        assert!(e.to_string().contains("in use by another process"), "{e}");
        // The holder has gone: the next attempt is admitted, and it was the second.
        handshake(addr, 1, &greeting(), TcpOptions::default()).unwrap();
        assert_eq!(node.join().unwrap(), 2);
    }
}
