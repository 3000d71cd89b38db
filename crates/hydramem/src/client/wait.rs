//! Waiting for an in-flight operation (poll for `poll`, then park until a completion wakes
//! the owner: run-to-completion, paper 4.1.3), and describing one — which splits of which nodes
//! are missing — for error messages.

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
pub(super) struct Pacer {
    poll_until: Instant,
    deadline: Instant,
    straggler_after: Duration,
    spins: u32,
    parked: bool,
}

impl Pacer {
    /// A pacer for operations that started at `start` (their deadline runs from there).
    pub(super) fn new(config: &ClientConfig, start: Instant) -> Pacer {
        Pacer::polling_from(config, start, start)
    }

    /// A pacer whose deadline runs from `start` but whose polling runs from `poll_from`.
    pub(super) fn polling_from(config: &ClientConfig, start: Instant, poll_from: Instant) -> Pacer {
        Pacer {
            poll_until: poll_from + config.poll,
            deadline: start + config.op_timeout,
            straggler_after: config.straggler_after,
            spins: 0,
            parked: false,
        }
    }

    /// Whether the last pause parked (so time may have passed: time-based decisions are due).
    pub(super) fn parked(&self) -> bool {
        self.parked
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
            std::thread::park_timeout((self.deadline - now).min(self.straggler_after));
        }
        true
    }
}

impl RemoteMemory {
    /// Polls, then parks, until `check` decides or the operation times out (`None`).
    pub(super) fn wait<T>(
        &self,
        op: &slots::Op<'_>,
        start: Instant,
        check: impl FnMut(Progress) -> Option<T>,
    ) -> Option<T> {
        self.wait_polling_from(op, start, start, check)
    }

    /// [`RemoteMemory::wait`], polling from `poll_from` on: a caller whose deadline runs from
    /// an earlier `start` (before encoding and posting, say) still polls its whole
    /// [`ClientConfig::poll`] for the replies, instead of parking at once and paying a wake-up.
    pub(super) fn wait_polling_from<T>(
        &self,
        op: &slots::Op<'_>,
        start: Instant,
        poll_from: Instant,
        mut check: impl FnMut(Progress) -> Option<T>,
    ) -> Option<T> {
        let mut pacer = Pacer::polling_from(&self.config, start, poll_from);
        loop {
            if let Some(v) = check(op.progress()) {
                return Some(v);
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
