//! Stopping a server that blocks in `accept` and serves each connection on its own thread
//! (the memory node, the NBD server).
//!
//! A [`Shutdown`] is a flag plus what it takes to act on it: the address to connect to so that
//! a blocked `accept` returns and sees the flag, and a clone of every open connection, so that
//! triggering can end the connections' blocking reads. Which side is shut is the server's
//! choice ([`NetShutdown::Both`] drops a connection at once; [`NetShutdown::Read`] stops new
//! requests but lets the replies to the requests already read go out).
//!
//! Invariants: a connection registered after the trigger is shut at once (the trigger may
//! fall between `accept` and registration); each connection unregisters itself when it ends,
//! since the clone held here would otherwise keep its socket open.

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown as NetShutdown, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

/// A connection that can be cloned and shut from another thread.
pub trait Connection: Sized + Send {
    /// Another handle to the same socket.
    fn clone_handle(&self) -> io::Result<Self>;
    /// Shuts one or both directions of the socket (errors are ignored: it may be gone).
    fn shut(&self, how: NetShutdown);
}

impl Connection for TcpStream {
    fn clone_handle(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn shut(&self, how: NetShutdown) {
        let _ = self.shutdown(how);
    }
}

/// Where the listener is, to wake a blocked `accept` by connecting to it.
#[derive(Debug, Clone)]
pub enum Waker {
    /// A TCP listener (an unspecified address is reached on loopback).
    Tcp(SocketAddr),
    /// A Unix socket listener.
    Unix(PathBuf),
}

/// Stops a running server (see the module documentation).
pub struct Shutdown<C> {
    stop: AtomicBool,
    how: NetShutdown,
    waker: Mutex<Option<Waker>>,
    conns: Mutex<HashMap<u64, C>>,
    next: AtomicU64,
}

impl<C: Connection> Shutdown<C> {
    /// A fresh, untriggered handle that shuts `how` of every connection when triggered.
    pub fn with(how: NetShutdown) -> Arc<Shutdown<C>> {
        Arc::new(Shutdown {
            stop: AtomicBool::new(false),
            how,
            waker: Mutex::new(None),
            conns: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
        })
    }

    /// Whether shutdown was requested.
    pub fn is_triggered(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Tells where the listener is, so that [`Shutdown::trigger`] can wake its `accept`.
    pub fn set_waker(&self, waker: Waker) {
        *self.waker.lock() = Some(waker);
    }

    /// Requests shutdown, wakes the accept loop and shuts every open connection.
    pub fn trigger(&self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the blocking accept; it sees the flag and returns.
        match self.waker.lock().clone() {
            Some(Waker::Tcp(mut a)) => {
                if a.ip().is_unspecified() {
                    a.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
                }
                drop(TcpStream::connect(a));
            }
            Some(Waker::Unix(p)) => drop(UnixStream::connect(p)),
            None => {}
        }
        for c in self.conns.lock().values() {
            c.shut(self.how);
        }
    }

    /// Tracks a new connection; returns its key. If it cannot be cloned it is served
    /// untracked (a trigger then does not reach it).
    pub fn register(&self, c: &C) -> u64 {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        if let Ok(h) = c.clone_handle() {
            self.conns.lock().insert(key, h);
        }
        if self.is_triggered() {
            c.shut(self.how);
        }
        key
    }

    /// Connections tracked now.
    pub fn tracked(&self) -> usize {
        self.conns.lock().len()
    }

    /// Stops tracking a connection that ended; returns the handle held for it.
    pub fn unregister(&self, key: u64) -> Option<C> {
        self.conns.lock().remove(&key)
    }

    /// Shuts both directions of every tracked connection except `key` (fault injection).
    pub fn drop_others(&self, key: u64) {
        for (k, c) in self.conns.lock().iter() {
            if *k != key {
                c.shut(NetShutdown::Both);
            }
        }
    }
}
