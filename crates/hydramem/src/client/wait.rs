//! Waiting for an in-flight operation (poll for `poll`, then park until a completion wakes
//! the owner: run-to-completion, paper 4.1.3), and describing one — which splits of which nodes
//! are missing — for error messages.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::slots::{self, Progress};
use super::{ClientConfig, Group, RemoteMemory};

/// Split indices of a mask, for messages: "2, 7".
pub(super) fn describe_mask(mask: u32) -> String {
    (0..32)
        .filter(|j| mask & (1 << j) != 0)
        .map(|j| j.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// How an owner waits between two looks at its operations: it polls (spinning, yielding the
/// core every few spins) until `poll` has passed since polling began, then parks until a
/// completion unparks it — but at most one straggler interval, because a stalled node sends no
/// completion and the read must re-ask past it.
///
/// At most [`ClientConfig::pollers`] owners poll at once (the pacer holds one of those places
/// until it parks or ends); the others park at once. Measured on two cores: with 16 threads
/// each polling 50 µs after posting a read, depth-16 read throughput fell by a third (the
/// spinning took the cores the nodes and the transport's threads needed), while one poller
/// alone cut the QD1 read p50 by ~15%.
pub(super) struct Pacer<'m> {
    poll_until: Instant,
    deadline: Instant,
    straggler_after: Duration,
    spins: u32,
    parked: bool,
    /// A time the owner must look again by, even without a completion (a hedge).
    wake_at: Option<Instant>,
    /// The count of polling owners, while this pacer holds a place in it.
    polling: Option<&'m AtomicUsize>,
}

impl<'m> Pacer<'m> {
    /// A pacer whose deadline runs from `start` and whose polling, if one of the `pollers`
    /// places is free, runs from `poll_from`.
    pub(super) fn polling_from(
        config: &ClientConfig,
        pollers: &'m AtomicUsize,
        start: Instant,
        poll_from: Instant,
    ) -> Pacer<'m> {
        let polling = if pollers.fetch_add(1, Ordering::SeqCst) < config.pollers {
            Some(pollers)
        } else {
            pollers.fetch_sub(1, Ordering::SeqCst);
            None
        };
        Pacer {
            poll_until: if polling.is_some() {
                poll_from + config.poll
            } else {
                poll_from
            },
            deadline: start + config.op_timeout,
            straggler_after: config.straggler_after,
            spins: 0,
            parked: false,
            wake_at: None,
            polling,
        }
    }

    /// Parks no later than `at` (the owner has a decision due then: a hedged read).
    pub(super) fn wake_at(&mut self, at: Instant) {
        self.wake_at = Some(at);
    }

    /// Whether the owner still polls (holds a polling place and has not parked): it may then
    /// read its replies itself ([`NodeSet`]).
    pub(super) fn polling(&self) -> bool {
        self.polling.is_some() && !self.parked
    }

    /// Whether the last pause parked (so time may have passed: time-based decisions are due).
    pub(super) fn parked(&self) -> bool {
        self.parked
    }

    /// Gives the polling place back (once parked, the owner never polls again).
    fn stop_polling(&mut self) {
        if let Some(pollers) = self.polling.take() {
            pollers.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Waits a little; `false` once the deadline has passed.
    pub(super) fn pause(&mut self) -> bool {
        let now = Instant::now();
        if now >= self.deadline {
            return false;
        }
        self.parked = now >= self.poll_until;
        if !self.parked {
            self.spins += 1;
            if self.spins.is_multiple_of(16) {
                // Two cores serve the nodes too: yield rather than monopolize one.
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        } else {
            self.stop_polling();
            let mut until = (self.deadline - now).min(self.straggler_after);
            if let Some(at) = self.wake_at.filter(|at| *at > now) {
                until = until.min(at - now);
            }
            std::thread::park_timeout(until);
        }
        true
    }
}

impl Drop for Pacer<'_> {
    fn drop(&mut self) {
        self.stop_polling();
    }
}

/// The nodes an owner waits on, read by the owner itself while it polls
/// ([`crate::client::transport::Transport::receive_from`]): its reply then lands without
/// waking the transport's receiver thread and then the owner (measured: docs/benchmarks.md
/// §12). Only while it waits on at most [`NodeSet::MAX`] nodes (a replicated or span page,
/// a few of them): each look costs a system call per node, and for a hydra page's nine or
/// ten splits those cost more than the wake-ups they save (depth-16 throughput −15–20%);
/// the receiver thread reads the rest.
pub(super) struct NodeSet {
    nodes: [u16; NodeSet::MAX],
    len: usize,
    /// More nodes than `MAX`: the owner reads none itself.
    wide: bool,
}

impl NodeSet {
    /// Most nodes an owner reads itself.
    pub(super) const MAX: usize = 4;

    pub(super) fn new() -> NodeSet {
        NodeSet {
            nodes: [0; NodeSet::MAX],
            len: 0,
            wide: false,
        }
    }

    /// Adds the nodes of the splits in `outstanding` (`node_of` says whose split j is).
    pub(super) fn add(&mut self, mut outstanding: u32, node_of: impl Fn(usize) -> u16) {
        while outstanding != 0 && !self.wide {
            let j = outstanding.trailing_zeros() as usize;
            outstanding &= outstanding - 1;
            let n = node_of(j);
            if n == slots::NO_NODE || self.nodes[..self.len].contains(&n) {
                continue;
            }
            if self.len == NodeSet::MAX {
                self.wide = true;
            } else {
                self.nodes[self.len] = n;
                self.len += 1;
            }
        }
    }

    pub(super) fn clear(&mut self) {
        self.len = 0;
        self.wide = false;
    }

    /// The nodes the owner reads itself (none when it waits on more than `MAX`).
    fn nodes(&self) -> &[u16] {
        if self.wide {
            &[]
        } else {
            &self.nodes[..self.len]
        }
    }
}

impl RemoteMemory {
    /// While `pacer` polls: reads on this thread what has arrived from the nodes of `op`'s
    /// outstanding splits (progress `p`), with `set` as scratch; whether anything did.
    pub(super) fn receive_own(
        &self,
        pacer: &Pacer<'_>,
        set: &mut NodeSet,
        op: &slots::Op<'_>,
        p: Progress,
    ) -> bool {
        if !pacer.polling() {
            return false;
        }
        set.clear();
        set.add(p.outstanding(), |j| op.node_of(j));
        self.receive_from(set)
    }

    /// Reads on this thread what has arrived from the nodes of `set`; whether anything did.
    pub(super) fn receive_from(&self, set: &NodeSet) -> bool {
        set.nodes()
            .iter()
            .fold(false, |got, &n| self.transport.receive_from(n) | got)
    }

    /// Polls, then parks, until `check` decides or the operation times out (`None`). The
    /// deadline runs from `start`, the polling from `poll_from`: a caller whose operation
    /// started earlier (before encoding and posting, say) still polls its whole
    /// [`ClientConfig::poll`] for the replies, instead of parking at once and paying a wake-up.
    pub(super) fn wait_polling_from<T>(
        &self,
        op: &slots::Op<'_>,
        start: Instant,
        poll_from: Instant,
        mut check: impl FnMut(Progress) -> Option<T>,
    ) -> Option<T> {
        let mut pacer = Pacer::polling_from(&self.config, &self.pollers, start, poll_from);
        let mut set = NodeSet::new();
        loop {
            let p = op.progress();
            if let Some(v) = check(p) {
                return Some(v);
            }
            if self.receive_own(&pacer, &mut set, op, p) {
                continue;
            }
            if !pacer.pause() {
                return None;
            }
        }
    }

    pub(super) fn describe(&self, op: &slots::Op<'_>, mask: u32) -> String {
        let mut v = Vec::new();
        for j in 0..self.layout.width {
            if mask & (1 << j) != 0 {
                let node = op.node_of(j);
                v.push(self.node_label(node));
            }
        }
        if let Some(st) = op.first_status() {
            v.push(format!("first error: {st}"));
        }
        if v.is_empty() {
            "none".into()
        } else {
            v.join(", ")
        }
    }

    pub(super) fn describe_group(&self, g: &Group, op: &slots::Op<'_>, p: Progress) -> String {
        let mut v = Vec::new();
        for j in 0..self.layout.width {
            let node = g.nodes[j];
            let down = node == slots::NO_NODE || !self.transport.is_up(node);
            if p.corrupt & (1 << j) != 0 {
                v.push(format!(
                    "{} (split {j}: failed its checksum)",
                    self.node_label(node)
                ));
            } else if down || p.failed & (1 << j) != 0 {
                v.push(format!("{} (split {j})", self.node_label(node)));
            } else if g.fresh & (1 << j) != 0 && p.posted & !p.landed & (1 << j) != 0 {
                v.push(format!(
                    "{} (split {j}: a replacement slab not regenerated yet, without this page)",
                    self.node_label(node)
                ));
            }
        }
        if let Some(st) = op.first_status() {
            v.push(format!("first error: {st}"));
        }
        v.join(", ")
    }

    /// [`Self::describe_group`] for a span row read of `version`, with the pieces that
    /// answered with another version of the row.
    pub(super) fn describe_row(
        &self,
        g: &Group,
        op: &slots::Op<'_>,
        p: Progress,
        version: u64,
    ) -> String {
        let mut nodes = self.describe_group(g, op, p);
        let width = self.layout.width;
        let other = (p.landed & !op.of_version(p.landed, width, version)).count_ones();
        if other > 0 {
            if !nodes.is_empty() {
                nodes.push_str(", ");
            }
            nodes.push_str(&format!(
                "{other} pieces answered with another version of the row (it was rewritten \
                 or given back after the page was looked up)"
            ));
        }
        nodes
    }

    pub(super) fn node_label(&self, node: u16) -> String {
        if node == slots::NO_NODE {
            "unknown node (its slab was not found)".into()
        } else {
            let up = if self.transport.is_up(node) {
                "up"
            } else {
                "down"
            };
            format!("node {node} at {} ({up})", self.transport.addr(node))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Resilience;

    #[test]
    fn at_most_the_configured_owners_poll_at_once() {
        let mut config = ClientConfig::new(Resilience::Replication { copies: 2 }, 1 << 20);
        config.pollers = 1;
        config.poll = Duration::from_secs(60);
        let pollers = AtomicUsize::new(0);
        let now = Instant::now();
        let mut first = Pacer::polling_from(&config, &pollers, now, now);
        let mut second = Pacer::polling_from(&config, &pollers, now, now);
        assert!(first.pause() && !first.parked(), "the first owner polls");
        // The second parks at once (for at most a straggler interval: nothing unparks it here).
        config.straggler_after = Duration::from_millis(1);
        assert!(second.pause() && second.parked(), "the second owner parks");
        drop(first);
        assert_eq!(pollers.load(Ordering::SeqCst), 0, "the place is given back");
        let mut third = Pacer::polling_from(&config, &pollers, now, now);
        assert!(
            third.pause() && !third.parked(),
            "a freed place polls again"
        );
        drop(second);
        assert_eq!(
            pollers.load(Ordering::SeqCst),
            1,
            "a parked pacer holds no place"
        );
    }

    #[test]
    fn an_owner_reads_each_node_of_its_outstanding_splits_once() {
        let mut set = NodeSet::new();
        // Splits 0, 2 and 3 outstanding, on nodes 7, 7 and 4; split 1's node unknown.
        let nodes = [7, slots::NO_NODE, 7, 4];
        set.add(0b1111, |j| nodes[j]);
        assert_eq!(set.nodes(), &[7, 4]);
        set.clear();
        assert!(set.nodes().is_empty());
        set.add(0b1111, |j| j as u16);
        assert_eq!(set.nodes(), &[0, 1, 2, 3]);
        // More distinct nodes than MAX (a hydra page): all left to the receiver thread.
        set.add(0b1_0000, |j| j as u16);
        assert!(set.nodes().is_empty());
        set.clear();
        set.add(0b1, |j| j as u16);
        assert_eq!(set.nodes(), &[0]);
    }
}
