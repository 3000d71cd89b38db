//! The sending side of the TCP transport (see [`super`]): each connection's send buffer, the
//! runs appended to it (merged into the vectored frame of their op still open at its end, up
//! to [`MERGE_LIMIT`]), and flat combining to write it out: the thread that posts writes the
//! buffer itself unless another thread is already writing to that socket.
//!
//! Invariants: at most one thread writes to a connection's socket at a time (`flushing`);
//! bytes reach the socket in the order they were appended (what the socket did not take is
//! kept ahead of what was queued meanwhile), and a frame stays open for merging only while its
//! offsets into the buffer hold; a run that cannot be appended leaves the buffer as it was; no
//! sender ever blocks on a full socket: the rest waits for the receiver thread to see the
//! socket writable; buffers are swapped, never reallocated, once grown to the working size.
//! Three callers in [`super`] touch the state directly and keep these invariants themselves:
//! a control call and a ping append a whole frame of their own (closing the open one first),
//! and a reconnect's attach empties the buffer of the dead socket's bytes.

use std::io;
use std::sync::atomic::Ordering;

use super::{Conn, Shared};
use crate::client::transport::TransportError;
use crate::wire::{Op, OpenRuns, Run, WireError};

/// Largest body the client lets one merged vectored frame grow to.
const MERGE_LIMIT: usize = 256 << 10;

/// A connection's send buffer (see the module doc).
pub(super) struct SendState {
    pub(super) buf: Vec<u8>,
    spare: Vec<u8>,
    /// The vectored frame at the end of `buf` still open for more runs.
    pub(super) open: Option<OpenRuns>,
    pub(super) flushing: bool,
}

impl SendState {
    /// Buffers sized for a full merged frame up front, so that they never grow (allocate) on
    /// the data path.
    pub(super) fn new() -> SendState {
        SendState {
            buf: Vec::with_capacity(2 * MERGE_LIMIT),
            spare: Vec::with_capacity(2 * MERGE_LIMIT),
            open: None,
            flushing: false,
        }
    }
}

impl Shared {
    /// Makes `st.open` a frame of `op` that `run` fits (within [`MERGE_LIMIT`] when it joins
    /// a frame with other runs): the open one, or a new one after it.
    fn open_for(&self, st: &mut SendState, op: Op, run: &Run) -> Result<(), WireError> {
        match st.open {
            Some(f) if f.op() == op && f.fits(&st.buf, run, MERGE_LIMIT) => Ok(()),
            _ => {
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                st.open = Some(OpenRuns::begin(&mut st.buf, op, id)?);
                Ok(())
            }
        }
    }

    /// Appends a run to the open frame of its op (`append` writes it), or to a new frame;
    /// on failure the send buffer is left as it was. Then flushes if asked.
    pub(super) fn post_run(
        &self,
        node: u16,
        op: Op,
        run: &Run,
        flush: bool,
        append: impl FnOnce(&mut OpenRuns, &mut Vec<u8>) -> Result<(), WireError>,
    ) -> Result<(), TransportError> {
        let c = self.conn(node)?;
        let mut guard = c.send.lock();
        let st = &mut *guard;
        let before = (st.buf.len(), st.open);
        let appended = self.open_for(st, op, run).and_then(|()| {
            let frame = st.open.as_mut().expect("opened above");
            append(frame, &mut st.buf)
        });
        if let Err(reason) = appended {
            st.buf.truncate(before.0);
            st.open = before.1;
            return Err(TransportError::BadRun {
                node,
                addr: c.addr.to_string(),
                reason,
            });
        }
        if flush {
            self.flush_locked(node, c, guard)
        } else {
            Ok(())
        }
    }

    /// Writes the send buffer unless another thread already is (it will pick our bytes up).
    /// Never blocks: bytes the socket does not take now stay queued and the receiver thread
    /// flushes them when the socket becomes writable.
    pub(super) fn flush_locked<'a>(
        &self,
        node: u16,
        c: &'a Conn,
        mut st: parking_lot::MutexGuard<'a, SendState>,
    ) -> Result<(), TransportError> {
        // An empty buffer has nothing to write, unless a TLS session still holds encrypted
        // bytes a full socket did not take (the receiver calls this once it is writable).
        if st.flushing
            || (st.buf.is_empty() && !c.stream.load().as_ref().is_some_and(|w| w.pending()))
        {
            return Ok(());
        }
        st.flushing = true;
        loop {
            let mut out = std::mem::take(&mut st.spare);
            std::mem::swap(&mut out, &mut st.buf);
            st.open = None;
            drop(st);
            let r = write_some(c, &out);
            st = c.send.lock();
            match r {
                Ok((n, false)) if n == out.len() => {
                    out.clear();
                    st.spare = out;
                    if st.buf.is_empty() {
                        st.flushing = false;
                        return Ok(());
                    }
                }
                Ok((n, _)) => {
                    // The socket is full (a slow or stalled node): keep the rest, in order,
                    // ahead of whatever was queued meanwhile (with TLS, bytes may also wait
                    // inside the session; the socket's readiness pushes them too).
                    out.drain(..n);
                    out.extend_from_slice(&st.buf);
                    st.buf.clear();
                    // Offsets into the buffer moved: nothing may merge into an old frame.
                    st.open = None;
                    std::mem::swap(&mut st.buf, &mut out);
                    st.spare = out;
                    st.flushing = false;
                    drop(st);
                    self.want_write.lock().push(node);
                    let _ = self.waker.wake();
                    return Ok(());
                }
                Err(e) => {
                    st.flushing = false;
                    st.buf.clear();
                    st.open = None;
                    drop(st);
                    tracing::warn!(node, addr = %c.addr, error = %e, "send to memory node failed");
                    self.mark_down(node);
                    return Err(TransportError::Down {
                        node,
                        addr: c.addr.to_string(),
                    });
                }
            }
        }
    }

    pub(super) fn flush_node(&self, node: u16) -> Result<(), TransportError> {
        let c = self.conn(node)?;
        let st = c.send.lock();
        self.flush_locked(node, c, st)
    }
}

/// Writes as much of `buf` as the connection takes without blocking
/// ([`Wire::send`](super::stream::Wire::send)).
fn write_some(c: &Conn, buf: &[u8]) -> io::Result<(usize, bool)> {
    c.stream
        .load_full()
        .ok_or_else(|| io::Error::other("not connected"))?
        .send(buf)
}
