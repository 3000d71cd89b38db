//! Bounds on what NBD clients may hold of the server: connections, time, threads and bytes.
//!
//! Without them a peer could open connections without end (each a thread and buffers), send a
//! handshake a byte every few seconds and keep its thread forever, park a request half sent,
//! or pipeline writes of 32 MiB on many connections until the server runs out of memory. With
//! them:
//! - connections beyond [`Limits::max_connections`] are closed at accept;
//! - the whole handshake, from accept to the first request, must finish within
//!   [`Limits::handshake`] (not each read: a trickle does not reset it);
//! - a request whose first byte arrived must arrive whole (header and payload) within
//!   [`Limits::request`], and a reply must be taken by the client within the same time; an
//!   idle connection between requests is normal for a block device and may wait forever;
//! - request payloads and read buffers in flight, over all connections, stay within
//!   [`Limits::bytes_in_flight`] ([`Budget`]): a connection that would pass it stops reading
//!   until replies free some;
//! - pipelined requests run on one worker pool shared by every connection (see
//!   [`super::transmission`]), so threads are the pool's plus one per connection (and one more
//!   for a connection that pipelines reads).
//!
//! Invariants: a [`Deadlined`] reader passes bytes through unchanged and fails with
//! `TimedOut` only once its deadline passed with nothing to read; its socket wakes it every
//! [`TICK`]. A [`Permit`] gives its bytes back to the [`Budget`] when dropped, whatever path
//! the request took, and a request larger than the whole budget takes all of it (so it runs
//! alone rather than never).

use std::io::{self, Read};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// How often a waiting reader wakes to check its deadline (the socket's read timeout).
pub const TICK: Duration = Duration::from_secs(1);

/// The NBD server's bounds (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; more are closed at accept.
    pub max_connections: usize,
    /// From accept to the end of option haggling.
    pub handshake: Duration,
    /// From a request's first byte to its last, and for a reply to be taken.
    pub request: Duration,
    /// Payload and read-buffer bytes of requests read and not yet replied to, all connections
    /// together.
    pub bytes_in_flight: usize,
}

impl Default for Limits {
    /// 256 connections (a kernel client, nbdfuse or qemu holds 1–16); 30 s for the handshake
    /// (clients finish it in milliseconds; the protocol document's servers allow about as
    /// much); 30 s per request (the largest, 32 MiB, takes well under a second on any link
    /// that serves a block device); 256 MiB in flight (eight maximal requests; the kernel's
    /// swap keeps well under 1 MiB in flight).
    fn default() -> Limits {
        Limits {
            max_connections: 256,
            handshake: Duration::from_secs(30),
            request: Duration::from_secs(30),
            bytes_in_flight: 256 << 20,
        }
    }
}

/// A reader that retries the socket's read timeouts ([`TICK`]) until a deadline, then fails
/// with `TimedOut` and `what` as the reason. Without a deadline it waits for as long as the
/// peer is silent (the stream's end or an error still end the wait).
#[derive(Debug)]
pub struct Deadlined<R> {
    inner: R,
    deadline: Option<(Instant, &'static str)>,
}

impl<R> Deadlined<R> {
    /// `inner` with no deadline.
    pub fn new(inner: R) -> Deadlined<R> {
        Deadlined {
            inner,
            deadline: None,
        }
    }

    /// From now on, reads fail once `at` has passed with nothing arrived, saying `what`.
    pub fn until(&mut self, at: Instant, what: &'static str) {
        self.deadline = Some((at, what));
    }

    /// The reader inside.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// No deadline: reads wait for the peer as long as it takes.
    pub fn no_deadline(&mut self) {
        self.deadline = None;
    }
}

impl<R: Read> Read for Deadlined<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.inner.read(buf) {
                Err(e) if waiting(&e) => {
                    if let Some((at, what)) = self.deadline {
                        if Instant::now() >= at {
                            return Err(io::Error::new(io::ErrorKind::TimedOut, what));
                        }
                    }
                }
                r => return r,
            }
        }
    }
}

/// A read timeout, or a read that a stop and continue of the process interrupted.
fn waiting(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// Bytes that requests in flight may hold, shared by every connection of a server.
#[derive(Debug)]
pub struct Budget {
    limit: usize,
    used: Mutex<usize>,
    freed: Condvar,
}

impl Budget {
    /// A budget of `limit` bytes (at least one).
    pub fn new(limit: usize) -> std::sync::Arc<Budget> {
        std::sync::Arc::new(Budget {
            limit: limit.max(1),
            used: Mutex::new(0),
            freed: Condvar::new(),
        })
    }

    /// The budget, in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        *self.used.lock()
    }

    /// `n` bytes (all of the budget if `n` is more), if they are free now.
    pub fn try_take(self: &std::sync::Arc<Self>, n: usize) -> Option<Permit> {
        let n = n.min(self.limit);
        let mut used = self.used.lock();
        (*used + n <= self.limit).then(|| {
            *used += n;
            self.permit(n)
        })
    }

    /// `n` bytes (all of the budget if `n` is more), waiting until they are free.
    pub fn take(self: &std::sync::Arc<Self>, n: usize) -> Permit {
        let n = n.min(self.limit);
        let mut used = self.used.lock();
        if *used + n > self.limit {
            metrics::counter!("hydramem_nbd_budget_waits_total").increment(1);
            while *used + n > self.limit {
                self.freed.wait(&mut used);
            }
        }
        *used += n;
        self.permit(n)
    }

    fn permit(self: &std::sync::Arc<Self>, bytes: usize) -> Permit {
        Permit {
            budget: (bytes > 0).then(|| self.clone()),
            bytes,
        }
    }
}

/// Bytes of a [`Budget`] one request holds until it is replied to; given back on drop.
#[derive(Debug)]
pub struct Permit {
    budget: Option<std::sync::Arc<Budget>>,
    bytes: usize,
}

impl Permit {
    /// A permit for nothing (a request with no payload and no data to read).
    pub fn none() -> Permit {
        Permit {
            budget: None,
            bytes: 0,
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            let mut used = b.used.lock();
            *used -= self.bytes;
            drop(used);
            b.freed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn a_deadline_ends_a_silent_wait_and_bytes_pass_unchanged() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut r = Deadlined::new(s);
        peer.write_all(b"abc").unwrap();
        let mut b = [0u8; 3];
        r.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"abc");
        r.until(Instant::now() + Duration::from_millis(200), "too slow");
        let began = Instant::now();
        let e = r.read(&mut b).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(e.to_string(), "too slow");
        assert!(began.elapsed() >= Duration::from_millis(200));
        // Without a deadline the reader outwaits the socket's timeouts.
        r.no_deadline();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            peer.write_all(b"z").unwrap();
            peer
        });
        assert_eq!(r.read(&mut b).unwrap(), 1);
        assert_eq!(b[0], b'z');
        drop(writer.join().unwrap());
    }

    #[test]
    fn the_budget_blocks_past_its_limit_and_permits_give_bytes_back() {
        let b = Budget::new(100);
        let p1 = b.take(60);
        assert!(b.try_take(50).is_none());
        let p2 = b.try_take(40).expect("40 more fit");
        assert_eq!(b.used(), 100);
        let waiter = {
            let b = b.clone();
            std::thread::spawn(move || {
                let p = b.take(70);
                (b.used(), p)
            })
        };
        // The waiter cannot have its bytes until both permits are dropped.
        drop(p1);
        assert!(b.used() <= 100);
        drop(p2);
        let (used_then, p3) = waiter.join().unwrap();
        assert_eq!(used_then, 70);
        drop(p3);
        assert_eq!(b.used(), 0);
        // More than the whole budget takes all of it, and runs.
        let all = b.take(1000);
        assert_eq!(b.used(), 100);
        drop(all);
        assert_eq!(b.used(), 0);
        assert_eq!(Permit::none().bytes, 0);
    }
}
