//! The receiving side of the TCP transport: reply frames parsed in place in a buffer per
//! connection and handed to [`Completions`] (splits) or to the thread waiting in a call.
//!
//! Who reads a connection: the receiver thread, woken by epoll (mio, edge-triggered), or a
//! thread that polls for its own reply ([`Shared::receive_from`]): when a split's owner
//! reads the reply itself, the page lands without two wake-ups (the receiver thread's, then
//! the owner's), which cost 12-25 µs each on a loaded two-core machine (docs/benchmarks.md
//! §12). A connection's receive state is behind a lock; an owner only tries it, the receiver
//! thread waits for it.
//!
//! Invariant (edge-triggered epoll): every byte that arrives is read by someone. A reader
//! reads until the socket says it would block; the receiver thread, woken by an edge, takes
//! the lock even if an owner holds it, and reads after it — so bytes that arrive after the
//! owner's last read, whose edge woke the receiver, are read by the receiver. An owner that
//! finds the connection broken (closed, a malformed frame) leaves it to the receiver thread,
//! which owns the registrations and marks the node down.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use mio::{Events, Interest, Poll, Token};

use super::{Shared, Wire, WAKER};
use crate::wire::{self, Header, Op, WireError, HEADER_LEN, MAX_BODY};

/// Receive state of one connection: the socket, its wire (for TLS) and a buffer of bytes not
/// yet parsed.
pub(super) struct Rx {
    stream: mio::net::TcpStream,
    wire: Arc<Wire>,
    buf: Vec<u8>,
    filled: usize,
    /// Why an owner found the connection broken: it reads no more, and the receiver thread
    /// closes exactly this connection (not one that replaced it meanwhile).
    broken: Option<String>,
}

impl Rx {
    /// The descriptor the receiver reads on (a duplicate of the connection's own).
    pub(super) fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.stream.as_raw_fd()
    }

    pub(super) fn new(stream: mio::net::TcpStream, wire: Arc<Wire>) -> Rx {
        Rx {
            stream,
            wire,
            buf: vec![0; 256 << 10],
            filled: 0,
            broken: None,
        }
    }
}

/// The receiver thread: waits on every connection (and the waker), reads what arrives, and
/// registers the connections that (re)join.
pub(super) fn receive_loop(sh: Arc<Shared>, mut poll: Poll) {
    let mut events = Events::with_capacity(64);
    let mut want = Vec::with_capacity(sh.want_write.lock().capacity());
    while !sh.stop.load(Ordering::SeqCst) {
        if let Err(e) = poll.poll(&mut events, None) {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            tracing::error!(error = %e, "client receiver poll failed");
            break;
        }
        for ev in events.iter() {
            if ev.token() == WAKER {
                on_wake(&sh, &poll, &mut want);
                continue;
            }
            let node = ev.token().0;
            let Some(slot) = sh.rx.get(node) else {
                continue;
            };
            let mut g = slot.lock();
            let Some(r) = g.as_mut() else {
                continue;
            };
            if ev.is_writable() {
                let _ = poll
                    .registry()
                    .reregister(&mut r.stream, ev.token(), Interest::READABLE);
                let _ = sh.flush_node(node as u16);
            }
            if let Err(reason) = drain(&sh, node as u16, r) {
                close(&sh, &poll, node, &mut g, &reason);
            }
        }
    }
}

/// What the waker asks: connections to register, to watch for write readiness, or that an
/// owner found broken.
fn on_wake(sh: &Shared, poll: &Poll, want: &mut Vec<u16>) {
    for (n, mut m, wire) in std::mem::take(&mut *sh.new_streams.lock()) {
        let Some(slot) = sh.rx.get(n as usize) else {
            continue;
        };
        let mut g = slot.lock();
        if let Some(mut old) = g.take() {
            let _ = poll.registry().deregister(&mut old.stream);
        }
        if poll
            .registry()
            .register(&mut m, Token(n as usize), Interest::READABLE)
            .is_ok()
        {
            *g = Some(Rx::new(m, wire));
        }
    }
    // Swapped with the receiver's own vector, not held: a connection's lock is never taken
    // under the list's. Both keep their capacity, so a full socket costs no allocation on
    // the data path.
    std::mem::swap(want, &mut *sh.want_write.lock());
    for n in want.drain(..) {
        let Some(slot) = sh.rx.get(n as usize) else {
            continue;
        };
        if let Some(r) = slot.lock().as_mut() {
            let _ = poll.registry().reregister(
                &mut r.stream,
                Token(n as usize),
                Interest::READABLE | Interest::WRITABLE,
            );
        }
    }
    for n in std::mem::take(&mut *sh.broken.lock()) {
        if let Some(slot) = sh.rx.get(n as usize) {
            let mut g = slot.lock();
            if let Some(reason) = g.as_mut().and_then(|r| r.broken.take()) {
                close(sh, poll, n as usize, &mut g, &reason);
            }
        }
    }
}

/// Closes connection `node` (its receive state in `g`): deregistered, dropped, the node down.
fn close(sh: &Shared, poll: &Poll, node: usize, g: &mut Option<Rx>, reason: &str) {
    tracing::debug!(node, reason = %reason, "closing connection");
    if let Some(mut r) = g.take() {
        let _ = poll.registry().deregister(&mut r.stream);
    }
    sh.mark_down(node as u16);
}

impl Shared {
    /// Reads on the calling thread what has arrived from `node`, unless another thread is
    /// reading it; whether anything was read. A broken connection is left to the receiver
    /// thread (woken to close it).
    pub(super) fn receive_from(&self, node: u16) -> bool {
        let Some(mut g) = self.rx.get(usize::from(node)).and_then(|s| s.try_lock()) else {
            return false;
        };
        let Some(r) = g.as_mut().filter(|r| r.broken.is_none()) else {
            return false;
        };
        match drain(self, node, r) {
            Ok(read) => read > 0,
            Err(reason) => {
                r.broken = Some(reason);
                drop(g);
                self.broken.lock().push(node);
                let _ = self.waker.wake();
                true
            }
        }
    }
}

/// Reads everything available on one connection and dispatches every complete frame; the
/// bytes read.
fn drain(sh: &Shared, node: u16, r: &mut Rx) -> Result<usize, String> {
    let mut read = 0;
    loop {
        if r.filled == r.buf.len() {
            // Only a frame larger than the buffer gets here: grow to the protocol maximum.
            r.buf
                .resize((r.buf.len() * 2).min(MAX_BODY + HEADER_LEN), 0);
        }
        match r.wire.receive(&mut r.stream, &mut r.buf[r.filled..]) {
            Ok(0) => return Err("node closed the connection".into()),
            Ok(n) => {
                r.filled += n;
                read += n;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(read),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.to_string()),
        }
        let mut pos = 0;
        while r.filled - pos >= HEADER_LEN {
            let hb: &[u8; HEADER_LEN] = r.buf[pos..pos + HEADER_LEN].try_into().expect("len");
            let h = Header::parse(hb).map_err(|e| e.to_string())?;
            let end = pos + HEADER_LEN + h.body_len as usize;
            if end > r.filled {
                break;
            }
            dispatch(sh, node, &h, &r.buf[pos + HEADER_LEN..end]).map_err(|e| e.to_string())?;
            pos = end;
        }
        r.buf.copy_within(pos..r.filled, 0);
        r.filled -= pos;
    }
}

fn dispatch(sh: &Shared, node: u16, h: &Header, body: &[u8]) -> Result<(), WireError> {
    if !h.reply {
        return Err(WireError::Invalid("node sent a request frame"));
    }
    if crate::client::transport::deliver(&*sh.completions, node, h, body)? {
        return Ok(());
    }
    match h.op {
        Op::Ping => {
            let Some(c) = sh.slot(node) else {
                return Ok(());
            };
            // Only the answer to the heartbeat in flight counts: a node that answers a PING
            // never sent (any id, u64::MAX included) proves nothing about its liveness.
            if h.id != c.ping_sent.load(Ordering::Acquire) {
                sh.unexpected_reply(node, h);
                return Ok(());
            }
            // Store the notice before the pong, so a heartbeat that saw its answer sees it.
            c.notice
                .store(wire::Notice::parse(body)?.encode(), Ordering::Relaxed);
            c.pong.store(h.id, Ordering::Release);
            Ok(())
        }
        _ => {
            // A call is answered only by its node, with its op: check before taking it, so
            // that another node's reply cannot steal (and drop) the real one.
            let mut calls = sh.calls.lock();
            match calls.get(&h.id) {
                Some(&(n, op, _)) if n == node && op == h.op => {
                    if let Some((_, _, tx)) = calls.remove(&h.id) {
                        let _ = tx.send((h.status, body.to_vec()));
                    }
                }
                Some(_) => {
                    drop(calls);
                    sh.unexpected_reply(node, h);
                }
                None => tracing::debug!(node, id = h.id, "reply to an abandoned call dropped"),
            }
            Ok(())
        }
    }
}
