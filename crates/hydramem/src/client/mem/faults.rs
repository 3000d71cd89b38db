//! The faults and counts of the in-memory transport's nodes: [`MemControl`] is the handle a
//! test keeps after handing the transport to a client, [`NodeFaults`] one node's faults (see
//! the module doc of [`super`] for what each does), [`NodeCounts`] what reached it.
//!
//! Invariants: settings are read under the node's lock when a frame is served, so a change
//! applies from the next frame on; rates are clamped to one million per million and delays to
//! an hour; every random choice draws from the node's own seeded generator.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::Rng;

#[cfg(doc)]
use super::MemTransport;
use super::{greet, split_frame, NodeState, Shared};
#[cfg(doc)]
use crate::client::transport::Transport;
use crate::node::session::Session;
use crate::node::Node;
use crate::wire::{self, Status, WireError, HEADER_LEN, PPM_ALL};

/// Longest delay or reorder window a node takes.
const MAX_DELAY: Duration = Duration::from_secs(3600);

/// What happened at one node since the counts were last reset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeCounts {
    /// READV and WRITEV frames that reached the node.
    pub frames: u64,
    /// Runs in them.
    pub runs: u64,
    /// Splits in them.
    pub splits: u64,
    /// Control requests served (ALLOC, FREE, LIST, ...; heartbeats excluded).
    pub calls: u64,
    /// Request frames lost before the node saw them.
    pub dropped_requests: u64,
    /// Reply frames lost after the node served them (injected, or beyond the queue's bound).
    pub dropped_replies: u64,
    /// Splits of READV replies with a bit flipped.
    pub corrupted: u64,
    /// Reply frames delivered after a reply that was served later (by any node).
    pub reordered: u64,
    /// Reply frames delivered to the client.
    pub delivered: u64,
}

/// The faults one node injects (see the module doc).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Settings {
    pub(super) drop_requests: u32,
    pub(super) drop_replies: u32,
    pub(super) corrupt: u32,
    pub(super) delay: Duration,
    pub(super) reorder: Duration,
}

/// A handle on the nodes of a [`MemTransport`] that outlives handing the transport to a
/// client: faults to inject and counts to read.
#[derive(Clone)]
pub struct MemControl {
    pub(super) shared: Arc<Shared>,
}

/// The faults of one node of a [`MemControl`]. Calls naming a node that does not exist do
/// nothing.
pub struct NodeFaults<'a> {
    shared: &'a Shared,
    node: u16,
}

/// Whether a draw of `rng` hits a rate of `ppm` per million.
pub(super) fn hits(rng: &mut SmallRng, ppm: u32) -> bool {
    ppm > 0 && rng.random_range(0..PPM_ALL) < ppm
}

/// Flips one data bit in a share of the splits of a READV reply frame.
pub(super) fn corrupt_reply(st: &mut NodeState, frame: &mut [u8]) -> Result<(), WireError> {
    let (h, body, _) = split_frame(frame)?;
    if h.status != Status::Ok {
        return Ok(());
    }
    let spans = wire::reply_split_spans(body)?;
    let body = &mut frame[HEADER_LEN..];
    for span in spans {
        if hits(&mut st.rng, st.faults.corrupt) {
            let data = &mut body[span];
            let bit = st.rng.random_range(0..data.len() * 8);
            data[bit / 8] ^= 1 << (bit % 8);
            st.counts.corrupted += 1;
        }
    }
    Ok(())
}

impl Shared {
    /// The node comes back: with its memory, or as a fresh node (`fresh`) whose slabs are
    /// gone. It stays down if it cannot start or refuses HELLO (neither happens to a node
    /// that started once).
    pub(super) fn revive(&self, node: u16, fresh: bool) {
        let Some(n) = self.slot(node) else {
            return;
        };
        let mut st = n.state.lock();
        if n.up.load(Ordering::Acquire) {
            return;
        }
        if fresh {
            match Node::new(n.config.clone()) {
                Ok(new) => st.node = new,
                Err(e) => {
                    tracing::warn!(node, error = %e, "in-memory node cannot restart");
                    return;
                }
            }
        }
        let mut session = Session::new(st.node.clone());
        if let Err(e) = greet(&mut session, &self.greeting, n.config.id) {
            tracing::warn!(node, error = %e, "in-memory node refused HELLO");
            return;
        }
        st.session = session;
        if fresh {
            n.restarted.store(true, Ordering::Release);
        }
        n.up.store(true, Ordering::Release);
    }

    /// Changes the node's fault settings.
    pub(super) fn set(&self, node: u16, change: impl FnOnce(&mut Settings)) {
        if let Some(n) = self.slot(node) {
            change(&mut n.state.lock().faults);
        }
    }
}

impl MemControl {
    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.shared.members.load(Ordering::Acquire)
    }

    /// The faults of node `node` (cluster-file order).
    pub fn node(&self, node: u16) -> NodeFaults<'_> {
        NodeFaults {
            shared: &self.shared,
            node,
        }
    }

    /// What happened at node `node` since the counts were last reset (zeros for a node that
    /// does not exist).
    pub fn counts(&self, node: u16) -> NodeCounts {
        let Some(n) = self.shared.slot(node) else {
            return NodeCounts::default();
        };
        NodeCounts {
            delivered: n.delivered.load(Ordering::Relaxed),
            reordered: n.reordered.load(Ordering::Relaxed),
            ..n.state.lock().counts
        }
    }

    /// The counts of every node, summed.
    pub fn total(&self) -> NodeCounts {
        (0..self.nodes())
            .filter_map(|i| u16::try_from(i).ok())
            .map(|i| self.counts(i))
            .fold(NodeCounts::default(), |a, c| NodeCounts {
                frames: a.frames + c.frames,
                runs: a.runs + c.runs,
                splits: a.splits + c.splits,
                calls: a.calls + c.calls,
                dropped_requests: a.dropped_requests + c.dropped_requests,
                dropped_replies: a.dropped_replies + c.dropped_replies,
                corrupted: a.corrupted + c.corrupted,
                reordered: a.reordered + c.reordered,
                delivered: a.delivered + c.delivered,
            })
    }

    /// Sets every node's counts to zero.
    pub fn reset_counts(&self) {
        for n in self
            .shared
            .nodes
            .iter()
            .filter_map(std::sync::OnceLock::get)
        {
            n.state.lock().counts = NodeCounts::default();
            n.delivered.store(0, Ordering::Relaxed);
            n.reordered.store(0, Ordering::Relaxed);
        }
    }
}

impl NodeFaults<'_> {
    /// The node goes down (a crash or a partition): posts and calls fail, its outstanding
    /// splits fail, replies it served and not yet delivered are lost. Its memory stays.
    pub fn down(&self) {
        self.shared.lose(self.node);
    }

    /// A node that is down comes back with its memory (a partition that healed).
    pub fn up(&self) {
        self.shared.revive(self.node, false);
    }

    /// The node restarts at once as a new process: down, then up with no slabs;
    /// [`Transport::take_restarted`] reports it.
    pub fn restart(&self) {
        self.shared.lose(self.node);
        self.shared.revive(self.node, true);
    }

    /// Loses `ppm` per million of the READV and WRITEV frames posted to the node before it
    /// sees them.
    pub fn drop_requests(&self, ppm: u32) {
        self.shared
            .set(self.node, |f| f.drop_requests = ppm.min(PPM_ALL));
    }

    /// Loses `ppm` per million of the node's READV and WRITEV replies after it served them.
    pub fn drop_replies(&self, ppm: u32) {
        self.shared
            .set(self.node, |f| f.drop_replies = ppm.min(PPM_ALL));
    }

    /// Flips one data bit in `ppm` per million of the splits the node's READV replies carry.
    pub fn corrupt_replies(&self, ppm: u32) {
        self.shared.set(self.node, |f| f.corrupt = ppm.min(PPM_ALL));
    }

    /// Holds every reply of the node for `delay` (a straggler); zero ends it.
    pub fn delay(&self, delay: Duration) {
        self.shared
            .set(self.node, |f| f.delay = delay.min(MAX_DELAY));
    }

    /// Holds each reply of the node for a random time within `window` (zero ends it), so that
    /// replies are delivered in another order than they were served.
    pub fn reorder(&self, window: Duration) {
        self.shared
            .set(self.node, |f| f.reorder = window.min(MAX_DELAY));
    }

    /// Ends every fault of the node except being down.
    pub fn clear(&self) {
        self.shared.set(self.node, |f| *f = Settings::default());
    }
}
