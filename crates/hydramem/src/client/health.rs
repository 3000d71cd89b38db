//! Per-node integrity accounting (paper 4.1.2, the ErrorCorrectionLimit and
//! SlabRegenerationLimit): corrupted splits counted per node over a window of reads; a node
//! above the first limit is *suspect* (reads involving it start wide), above the second it is
//! *avoided* (its slabs are moved away and nothing new is placed there). Corrupted splits are
//! also reported to the nodes that returned them, so that their status shows it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::repair::MoveReason;
use super::slots::{self};
use super::RemoteMemory;
use crate::wire::{self};

/// What the client knows about one node's integrity (paper 4.1.2: per-machine error rates).
#[derive(Debug, Default)]
pub(super) struct NodeHealth {
    /// Splits read from the node in the current window.
    pub(super) reads: AtomicU64,
    /// Of them, those found corrupted (failed checksum, or outvoted by the other splits).
    pub(super) errors: AtomicU64,
    /// Corrupted splits found on the node since the client started.
    pub(super) total_errors: AtomicU64,
    /// Above the ErrorCorrectionLimit in the last window.
    pub(super) suspect: AtomicBool,
    /// Above the SlabRegenerationLimit: slabs moved away, no new placements.
    pub(super) avoided: AtomicBool,
}

/// One node's integrity as this client sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct NodeIntegrity {
    /// Corrupted splits found on the node since the client started.
    pub corrupt_splits: u64,
    /// Its error rate is above the ErrorCorrectionLimit: reads involving it start wide.
    pub suspect: bool,
    /// Its error rate went above the SlabRegenerationLimit: the client moved its slabs away
    /// and places nothing new there until the node restarts.
    pub avoided: bool,
}

/// Corrupted splits queued for reporting between two maintenance rounds, at most: a bound on
/// the queue's memory when every read meets corruption.
pub(super) const MAX_QUEUED_CORRUPT: usize = 1 << 16;

impl RemoteMemory {
    /// Accounts the corrupted splits of a read (`cause`: failed its checksum, or outvoted by
    /// the page's other splits) to the nodes that returned them (off the fast path: only reads
    /// that met corruption come here).
    pub(super) fn count_corrupt(
        &self,
        op: &slots::Op<'_>,
        corrupt: u32,
        addr: u64,
        cause: wire::CorruptCause,
    ) {
        let n = corrupt.count_ones() as u64;
        self.stats.corrupt.fetch_add(n, Ordering::Relaxed);
        self.metrics.corrupt.increment(n);
        // The slab of each split, for the report to its node (unless the split moved since).
        let group = self
            .locate_unit(addr)
            .ok()
            .and_then(|(r, _)| self.ranges[r].load_full());
        for j in 0..self.layout.width {
            if corrupt & (1 << j) == 0 {
                continue;
            }
            let node = op.node_of(j);
            if let Some(h) = self.health.get(node as usize) {
                h.errors.fetch_add(1, Ordering::Relaxed);
                h.total_errors.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(g) = group.as_ref().filter(|g| g.nodes[j] == node) {
                let mut q = self.corrupt_reports.lock();
                if q.len() < MAX_QUEUED_CORRUPT {
                    q.push((node, g.slabs[j], cause));
                }
            }
            tracing::debug!(
                node,
                split = j,
                addr,
                "a split {} (corrupted on the node or on the wire, or the wrong page or \
                 version); the page is read from its other splits",
                match cause {
                    wire::CorruptCause::Checksum => "failed its checksum",
                    wire::CorruptCause::Codeword => "disagreed with the page's other splits",
                }
            );
        }
    }

    /// Corrupted splits found so far, per node in cluster-file order.
    pub fn corrupt_splits(&self) -> Vec<u64> {
        self.health
            .iter()
            .map(|h| h.total_errors.load(Ordering::Relaxed))
            .collect()
    }

    /// What this client knows about every node's integrity, in cluster-file order.
    pub fn integrity(&self) -> Vec<NodeIntegrity> {
        self.health
            .iter()
            .map(|h| NodeIntegrity {
                corrupt_splits: h.total_errors.load(Ordering::Relaxed),
                suspect: h.suspect.load(Ordering::Relaxed),
                avoided: h.avoided.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Judges every node's error rate once it served a window's worth of splits (paper
    /// 4.1.2): above the ErrorCorrectionLimit reads involving it start wide, until a window
    /// comes in below; above the SlabRegenerationLimit its slabs of ours are regenerated
    /// elsewhere (from the other splits, never from it) and new slabs avoid it until it
    /// restarts. Evacuation is retried every round until nothing of ours is left there.
    pub(super) fn check_health(&self) {
        let window = self.config.error_window.max(1);
        let mut any = false;
        for (n, h) in self.health.iter().enumerate() {
            let reads = h.reads.load(Ordering::Relaxed);
            if reads >= window {
                let errors = h.errors.load(Ordering::Relaxed);
                h.reads.fetch_sub(reads, Ordering::Relaxed);
                h.errors.fetch_sub(errors, Ordering::Relaxed);
                let rate = errors as f64 / reads as f64;
                let suspect = rate > self.config.error_correction_limit;
                if h.suspect.swap(suspect, Ordering::Relaxed) != suspect {
                    tracing::warn!(
                        node = n,
                        node_addr = self.transport.addr(n as u16),
                        errors,
                        reads,
                        suspect,
                        "node error rate crossed the error-correction limit: reads involving \
                         it now start {} splits",
                        if suspect {
                            "with all the"
                        } else {
                            "again with the usual"
                        }
                    );
                }
                if rate > self.config.slab_regeneration_limit
                    && !h.avoided.swap(true, Ordering::Relaxed)
                {
                    metrics::counter!("hydramem_client_nodes_avoided_total").increment(1);
                    tracing::error!(
                        node = n,
                        node_addr = self.transport.addr(n as u16),
                        errors,
                        reads,
                        "node returns corrupted splits above the slab-regeneration limit: \
                         regenerating its slabs elsewhere and placing nothing new on it until \
                         it restarts; check its memory (ECC errors in the kernel log) and its \
                         network path"
                    );
                }
            }
            any |= h.suspect.load(Ordering::Relaxed);
            if h.avoided.load(Ordering::Relaxed) && self.transport.is_up(n as u16) {
                self.evacuate(n as u16);
            }
        }
        self.any_suspect.store(any, Ordering::Relaxed);
    }

    /// Moves every split of ours off `node` (see [`Self::check_health`]).
    pub(super) fn evacuate(&self, node: u16) {
        for (range, j, _) in self.splits_on(node) {
            match self.remap(range, j, node, MoveReason::Corrupt) {
                Ok(_) => {
                    self.stats.evacuated.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::debug!(range, split = j, error = %e, "cannot move a split off a corrupting node yet");
                    return;
                }
            }
        }
    }

    /// Every split of ours on `node` now: (range, split, slab).
    pub(super) fn splits_on(&self, node: u16) -> Vec<(usize, usize, u32)> {
        let mut out = Vec::new();
        for (range, g) in self.ranges.iter().enumerate() {
            if let Some(g) = g.load().as_ref() {
                for j in (0..self.layout.width).filter(|&j| g.nodes[j] == node) {
                    out.push((range, j, g.slabs[j]));
                }
            }
        }
        out
    }

    /// Reports the corrupted splits reads found since the last call to the nodes that returned
    /// them (one CORRUPT per node, counted per slab, and one warning in the log), so that `hydramem status` and the node's
    /// metrics show where corruption happens; the maintenance thread calls it every round. A
    /// report that fails is logged and dropped: the splits stay counted in
    /// [`RemoteMemory::corrupt_splits`].
    pub fn report_corruption(&self) {
        let mut found = std::mem::take(&mut *self.corrupt_reports.lock());
        found.sort_unstable();
        let mut reports: Vec<(u16, wire::CorruptReport)> = Vec::new();
        for (node, slab, cause) in found {
            match reports.last_mut() {
                Some((n, r)) if *n == node && r.slab == slab && r.cause == cause => r.splits += 1,
                _ => reports.push((
                    node,
                    wire::CorruptReport {
                        slab,
                        splits: 1,
                        cause,
                    },
                )),
            }
        }
        for per_node in reports.chunk_by(|a, b| a.0 == b.0) {
            let node = per_node[0].0;
            let list: Vec<_> = per_node.iter().map(|(_, r)| *r).collect();
            let splits: u64 = list.iter().map(|r| u64::from(r.splits)).sum();
            // One warning per node and round (every read that meets corruption logs at debug).
            tracing::warn!(
                node,
                node_addr = self.transport.addr(node),
                splits,
                slabs = list.len(),
                "corrupted splits from this node (on it or on the wire) were read around; \
                 reporting them to it"
            );
            match self.transport.report_corrupt(node, &list) {
                Ok(accepted) => {
                    tracing::debug!(node, splits, accepted, "corruption reported")
                }
                Err(e) => tracing::warn!(
                    node,
                    splits,
                    error = %e,
                    "could not report corrupted splits to the node that returned them; its \
                     status will not show them (this client still counts them)"
                ),
            }
        }
    }
}
