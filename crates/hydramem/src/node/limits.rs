//! Bounds on what connections may hold of a node: how many there are, how long a peer may take
//! to say who it is, how long one frame may take to arrive once begun, and how much buffer a
//! connection keeps after a large frame.
//!
//! Without them a peer could hold a thread per connection forever without saying HELLO, or
//! keep a connection's 4 MiB body buffer by sending one large frame, or trickle a frame a byte
//! every few seconds (slow-loris). With them: connections beyond [`ConnLimits::max_connections`]
//! are closed at accept; a connection not identified within [`ConnLimits::handshake`] is closed;
//! a frame whose bytes do not all arrive within [`ConnLimits::frame`] of its first closes its
//! connection; buffers shrink back after a frame larger than [`KEEP_BUFFER`]; a connection
//! whose peer's machine vanished (powered off, cut off: no FIN, no RST) is closed by TCP
//! keepalive ([`keep_alive`]) within [`KEEPALIVE_DEAD`], which gives back the identity it held
//! (see [`super::tenants`]) and starts its lease.
//!
//! Invariants: a [`FrameReader`] reads exactly the bytes asked or fails, and its deadlines are
//! checked at least every [`TICK`] while it waits (the socket's read timeout, set once); an
//! identified connection may stay idle between frames for as long as it likes (its lease and
//! heartbeats are the client's business), and the node's shutdown reaches a waiting reader
//! within a tick.

use std::io::{self, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::tls::{Link, Tls};

/// How often a waiting reader wakes to check its deadlines (and the node's shutdown).
pub const TICK: Duration = Duration::from_secs(1);

/// A connection's buffers shrink back to this after a larger frame.
pub const KEEP_BUFFER: usize = 256 << 10;

/// Keepalive: a connection silent this long is probed ...
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(15);
/// ... every this long ...
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// ... and closed after this many probes without an answer.
pub const KEEPALIVE_PROBES: u32 = 3;
/// The longest a vanished peer's connection stays open: 30 s.
pub const KEEPALIVE_DEAD: Duration = Duration::from_secs(15 + 5 * 3);

/// Turns on TCP keepalive for an accepted connection ([`KEEPALIVE_IDLE`], probes every
/// [`KEEPALIVE_INTERVAL`], [`KEEPALIVE_PROBES`] of them), and a user timeout of
/// [`KEEPALIVE_DEAD`]: the kernel sends no keepalive probe while replies wait to be
/// acknowledged, and retransmits those for about 15 minutes before it gives up, so a peer
/// that vanished in the middle of a read would otherwise hold its connection that long. A
/// live client heartbeats every 100 ms, so only a peer that is gone is ever probed. The
/// kernel answers probes for a process that is only stopped (SIGSTOP), whose connections
/// stay, as they must: it may resume and write — unless replies fill its receive buffer
/// and it takes none for 30 s, when the user timeout ends them too (a client reconnects as
/// it resumes; measured on Linux 6.18).
pub fn keep_alive(stream: &TcpStream) -> io::Result<()> {
    let params = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    let sock = socket2::SockRef::from(stream);
    sock.set_tcp_keepalive(&params)?;
    sock.set_tcp_user_timeout(Some(KEEPALIVE_DEAD))
}

/// The node's bounds on connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Connections served at once; more are closed at accept.
    pub max_connections: usize,
    /// Time from accept to an identified connection (HELLO, and AUTH with a key).
    pub handshake: Duration,
    /// Time from a frame's first byte to its last.
    pub frame: Duration,
}

impl Default for ConnLimits {
    /// 4096 connections (a client holds one per node, plus one per regeneration and tool);
    /// 10 s to say HELLO (a client does it right after connecting); 30 s per frame (the
    /// largest, 4 MiB, takes milliseconds on any link a node serves).
    fn default() -> ConnLimits {
        ConnLimits {
            max_connections: 4096,
            handshake: Duration::from_secs(10),
            frame: Duration::from_secs(30),
        }
    }
}

/// Why a [`FrameReader`] gave up.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The peer closed the connection between frames.
    #[error("the peer closed the connection")]
    Closed,
    /// A deadline passed.
    #[error("{0}")]
    Deadline(&'static str),
    /// The socket failed, or closed inside a frame.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Reads frames' bytes from a connection under the limits' deadlines (and writes the
/// replies: with TLS the two directions share one session).
pub struct FrameReader {
    reader: BufReader<Link>,
    limits: ConnLimits,
    accepted: Instant,
}

impl FrameReader {
    /// A reader of `stream`, accepted now. Sets the socket's read timeout to [`TICK`]; with
    /// `tls`, runs the TLS handshake first, within the handshake time (a peer without a
    /// certificate from the cluster CA fails here).
    pub fn new(
        stream: TcpStream,
        limits: ConnLimits,
        tls: Option<&Tls>,
    ) -> io::Result<FrameReader> {
        stream.set_read_timeout(Some(TICK))?;
        let accepted = Instant::now();
        let link = Link::accept(stream, tls, accepted + limits.handshake)?;
        Ok(FrameReader {
            reader: BufReader::with_capacity(KEEP_BUFFER, link),
            limits,
            accepted,
        })
    }

    /// Sends `bytes` (replies) and pushes them out.
    pub fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        let link = self.reader.get_mut();
        link.write_all(bytes)?;
        link.flush()
    }

    /// Whether more bytes are buffered already (another request is waiting).
    pub fn buffered(&self) -> bool {
        !self.reader.buffer().is_empty()
    }

    /// Whether the peer is gone: it closed the connection (the socket is at its end with no
    /// byte waiting) or the connection failed. Does not wait and consumes nothing. A peer
    /// that sent more before it closed is not seen as gone until those bytes are read, and a
    /// TLS peer that closed cleanly (its close_notify waits) neither: both err on the side of
    /// serving on. A peer that only shut its sending side counts as gone (no hydramem client
    /// half-closes a connection it still reads).
    pub fn peer_gone(&self) -> bool {
        let sock = socket2::SockRef::from(self.reader.get_ref().tcp());
        let mut byte = [std::mem::MaybeUninit::<u8>::uninit()];
        match sock.recv_with_flags(&mut byte, libc::MSG_PEEK | libc::MSG_DONTWAIT) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ),
        }
    }

    /// Waits for the first bytes of the next frame and fills `buf` with them. Between frames
    /// an identified connection may wait forever; one that is not must be identified within
    /// the handshake time. `stop` is asked at every tick (the node shutting down).
    pub fn first(
        &mut self,
        buf: &mut [u8],
        identified: bool,
        stop: &dyn Fn() -> bool,
    ) -> Result<Instant, ReadError> {
        loop {
            match self.reader.read(&mut buf[..1]) {
                Ok(0) => return Err(ReadError::Closed),
                Ok(_) => break,
                // A socket with a read timeout fails its recv with EINTR when the process was
                // stopped and continued (SIGSTOP, SIGCONT): nothing happened, read on.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if waiting(&e) => {
                    if stop() {
                        return Err(ReadError::Closed);
                    }
                    if !identified && self.accepted.elapsed() >= self.limits.handshake {
                        return Err(ReadError::Deadline(
                            "the peer did not identify itself (HELLO, and AUTH with a key) in time",
                        ));
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        let began = Instant::now();
        self.rest(&mut buf[1..], began)?;
        Ok(began)
    }

    /// Fills `buf` with the next bytes of the frame begun at `began`, within the frame time.
    pub fn rest(&mut self, buf: &mut [u8], began: Instant) -> Result<(), ReadError> {
        let mut got = 0;
        while got < buf.len() {
            match self.reader.read(&mut buf[got..]) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
                Ok(n) => got += n,
                Err(e) if waiting(&e) || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
            if got < buf.len() && began.elapsed() >= self.limits.frame {
                return Err(ReadError::Deadline(
                    "a frame did not arrive whole in time (a stalled or trickling peer)",
                ));
            }
        }
        Ok(())
    }
}

/// A read timeout: nothing arrived within a tick.
fn waiting(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Gives `buf`'s memory back after a frame larger than [`KEEP_BUFFER`].
pub fn shrink(buf: &mut Vec<u8>) {
    if buf.capacity() > 2 * KEEP_BUFFER {
        buf.truncate(KEEP_BUFFER);
        buf.shrink_to(KEEP_BUFFER);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    fn pair(limits: ConnLimits) -> (FrameReader, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (FrameReader::new(s, limits, None).unwrap(), peer)
    }

    fn short() -> ConnLimits {
        ConnLimits {
            max_connections: 1,
            handshake: Duration::from_millis(1500),
            frame: Duration::from_millis(1500),
        }
    }

    /// Blocks until something arrives on `r`'s socket (bytes, its end or an error), without
    /// consuming it: what the peer did has landed. The read timeout is [`TICK`]: at most 50.
    fn landed(r: &FrameReader) -> io::Result<usize> {
        let mut two = [0u8; 2];
        for _ in 0..50 {
            match r.reader.get_ref().tcp().peek(&mut two) {
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                other => return other,
            }
        }
        panic!("nothing arrived from the peer");
    }

    #[test]
    fn a_peer_is_gone_once_it_closed_and_nothing_it_sent_waits() {
        let (mut r, mut peer) = pair(short());
        assert!(!r.peer_gone(), "a quiet peer is there");
        peer.write_all(b"ab").unwrap();
        drop(peer);
        let mut b = [0u8; 1];
        r.first(&mut b, true, &|| false).unwrap();
        // One byte is still in the reader's buffer, none on the socket: the socket's end is
        // what counts (the reader's buffer holds no request to answer).
        assert_eq!(landed(&r).unwrap(), 0, "the peer's end");
        assert!(r.peer_gone(), "a closed peer is gone");
        // A peer that closes with bytes on the socket still unread is not gone yet.
        let (r, mut peer) = pair(short());
        peer.write_all(b"x").unwrap();
        drop(peer);
        assert_eq!(landed(&r).unwrap(), 1, "the byte");
        assert!(!r.peer_gone(), "a byte waits to be read");
        // A peer that resets the connection is gone.
        let (r, peer) = pair(short());
        socket2::SockRef::from(&peer)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(peer);
        assert!(landed(&r).is_err(), "the reset");
        assert!(r.peer_gone(), "a peer that reset the connection is gone");
    }

    #[test]
    fn accepted_connections_probe_a_vanished_peer_within_thirty_seconds() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let sock = socket2::SockRef::from(&accepted);
        assert!(!sock.keepalive().unwrap(), "off until asked");
        keep_alive(&accepted).unwrap();
        assert!(sock.keepalive().unwrap());
        assert_eq!(sock.tcp_keepalive_time().unwrap(), KEEPALIVE_IDLE);
        assert_eq!(sock.tcp_keepalive_interval().unwrap(), KEEPALIVE_INTERVAL);
        assert_eq!(sock.tcp_keepalive_retries().unwrap(), KEEPALIVE_PROBES);
        assert_eq!(sock.tcp_user_timeout().unwrap(), Some(KEEPALIVE_DEAD));
        assert_eq!(
            KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_PROBES,
            KEEPALIVE_DEAD
        );
    }

    #[test]
    fn a_peer_that_never_identifies_is_cut_off_and_an_identified_one_may_idle() {
        let (mut r, mut peer) = pair(short());
        let mut b = [0u8; 4];
        let e = r.first(&mut b, false, &|| false).unwrap_err();
        assert!(matches!(e, ReadError::Deadline(_)), "{e}");
        // Identified: waiting past the handshake time is fine; the frame then arrives.
        let (mut r, mut peer2) = pair(short());
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2500));
            peer2.write_all(b"abcd").unwrap();
            peer2
        });
        r.first(&mut b, true, &|| false).unwrap();
        assert_eq!(&b, b"abcd");
        drop(writer.join());
        peer.write_all(b"x").ok();
    }

    #[test]
    fn a_trickled_frame_is_cut_off_at_the_frame_deadline() {
        let (mut r, mut peer) = pair(short());
        let trickle = std::thread::spawn(move || {
            for _ in 0..20 {
                if peer.write_all(b"x").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(400));
            }
        });
        let mut b = [0u8; 16];
        let e = r.first(&mut b, true, &|| false).unwrap_err();
        assert!(matches!(e, ReadError::Deadline(_)), "{e}");
        drop(r);
        trickle.join().unwrap();
    }

    #[test]
    fn buffers_shrink_back_after_a_large_frame() {
        let mut v = vec![0u8; 4 << 20];
        shrink(&mut v);
        assert!(v.capacity() <= KEEP_BUFFER, "{}", v.capacity());
        let mut small = Vec::with_capacity(KEEP_BUFFER);
        shrink(&mut small);
        assert_eq!(small.capacity(), KEEP_BUFFER);
    }
}
