//! Waiting for an in-flight operation (poll for `poll`, then park until a completion wakes
//! the owner: run-to-completion, paper 4.1.3), and describing one — which splits of which nodes
//! are missing — for error messages.

use std::time::Instant;

use super::slots::{self, Progress};
use super::{Group, RemoteMemory};

/// Split indices of a mask, for messages: "2, 7".
pub(super) fn describe_mask(mask: u32) -> String {
    (0..32)
        .filter(|j| mask & (1 << j) != 0)
        .map(|j| j.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl RemoteMemory {
    /// Polls, then parks, until `check` decides or the operation times out (`None`).
    pub(super) fn wait<T>(
        &self,
        op: &slots::Op<'_>,
        start: Instant,
        mut check: impl FnMut(Progress) -> Option<T>,
    ) -> Option<T> {
        let poll_until = start + self.config.poll;
        let deadline = start + self.config.op_timeout;
        let mut spins = 0u32;
        loop {
            if let Some(v) = check(op.progress()) {
                return Some(v);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            if now < poll_until {
                spins += 1;
                if spins.is_multiple_of(16) {
                    // Two cores serve the nodes too: yield rather than monopolize one.
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            } else {
                // Wake at least every straggler interval: a stalled node sends no completion
                // that would wake us, and the read must re-issue past it.
                std::thread::park_timeout((deadline - now).min(self.config.straggler_after));
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
