//! The delivery side of the in-memory transport: reply frames wait in one queue ordered by
//! their due time (when they were served, plus the node's delay or reorder jitter), and one
//! thread hands each to the client's completions when it is due, through
//! [`super::super::transport::deliver`], as TCP's receiver thread does.
//!
//! Invariants: a reply is delivered at most once, and never after its node went down — losing a
//! node bumps its epoch, purges its queued replies and fails its outstanding splits while
//! holding the delivery lock, so a reply is either delivered before the node's splits are
//! failed or not at all; the queue holds at most [`MAX_QUEUED`] bytes (replies beyond are
//! dropped and counted).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{split_frame, NodeState, Shared};
use crate::client::transport::deliver;

/// Most reply bytes waiting for delivery.
const MAX_QUEUED: usize = 64 << 20;

/// A reply frame waiting for its due time.
pub(super) struct Pending {
    due: Instant,
    seq: u64,
    node: u16,
    epoch: u64,
    frame: Vec<u8>,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.seq) == (other.due, other.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.due, self.seq).cmp(&(other.due, other.seq))
    }
}

#[derive(Default)]
pub(super) struct Queue {
    pub(super) pending: BinaryHeap<Reverse<Pending>>,
    pub(super) bytes: usize,
    pub(super) next_seq: u64,
    pub(super) stop: bool,
}

impl Shared {
    /// Queues a reply frame for the delivery thread (dropped beyond [`MAX_QUEUED`]).
    pub(super) fn enqueue(
        &self,
        node: u16,
        epoch: u64,
        due: Instant,
        frame: Vec<u8>,
        st: &mut NodeState,
    ) {
        let mut q = self.queue.lock();
        if q.bytes + frame.len() > MAX_QUEUED {
            st.counts.dropped_replies += 1;
            return;
        }
        q.bytes += frame.len();
        let seq = q.next_seq;
        q.next_seq += 1;
        q.pending.push(Reverse(Pending {
            due,
            seq,
            node,
            epoch,
            frame,
        }));
        drop(q);
        self.queued.notify_one();
    }

    /// Delivers one reply, unless its node went down since it was served.
    pub(super) fn deliver_one(&self, p: &Pending, latest: &mut Option<u64>) {
        let guard = self.deliver.lock();
        let Some(n) = self.slot(p.node) else {
            return;
        };
        if !n.up.load(Ordering::Acquire) || n.epoch.load(Ordering::Acquire) != p.epoch {
            return;
        }
        if latest.is_some_and(|l| l > p.seq) {
            n.reordered.fetch_add(1, Ordering::Relaxed);
        }
        *latest = (*latest).max(Some(p.seq));
        let delivered = split_frame(&p.frame)
            .and_then(|(h, body, _)| deliver(&*self.completions, p.node, &h, body));
        match delivered {
            Ok(_) => {
                n.delivered.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!(node = p.node, error = %e, "malformed reply: losing the node");
                self.lose_locked(p.node, &guard);
            }
        }
    }

    /// The node goes down: it takes nothing more, what was queued for it is gone, and its
    /// outstanding splits fail.
    pub(super) fn lose(&self, node: u16) {
        let guard = self.deliver.lock();
        self.lose_locked(node, &guard);
    }

    pub(super) fn lose_locked(&self, node: u16, _delivering: &parking_lot::MutexGuard<'_, ()>) {
        let Some(n) = self.slot(node) else {
            return;
        };
        {
            let mut st = n.state.lock();
            if !n.up.swap(false, Ordering::AcqRel) {
                return;
            }
            n.epoch.fetch_add(1, Ordering::AcqRel);
            st.buf.clear();
            st.open = None;
        }
        {
            let mut q = self.queue.lock();
            q.pending.retain(|p| p.0.node != node);
            q.bytes = q.pending.iter().map(|p| p.0.frame.len()).sum();
        }
        tracing::warn!(node, "in-memory node down");
        self.completions.node_down(node);
    }
}

/// Hands replies to the client in the order of their due time until the transport is dropped.
pub(super) fn delivery_loop(sh: &Shared) {
    let mut latest = None;
    loop {
        let next = {
            let mut q = sh.queue.lock();
            loop {
                if q.stop {
                    return;
                }
                match q.pending.peek().map(|p| p.0.due) {
                    None => sh.queued.wait(&mut q),
                    Some(due) if due > Instant::now() => {
                        sh.queued.wait_until(&mut q, due);
                    }
                    Some(_) => {
                        if let Some(Reverse(p)) = q.pending.pop() {
                            q.bytes = q.bytes.saturating_sub(p.frame.len());
                            break p;
                        }
                    }
                }
            }
        };
        sh.deliver_one(&next, &mut latest);
    }
}
