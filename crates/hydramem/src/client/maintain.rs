//! The maintenance thread's work, every [`MAINTENANCE_INTERVAL`]: notice failed, restarted and
//! reclaiming nodes, start repairs for the splits they held, act on regenerations that ended,
//! retry the failed ones, and free slabs left behind once their nodes are back.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::error::protocol;
use super::repair::{MoveReason, REPAIR_RETRY};
use super::slots::{self};
use super::transport::TransportError;
use super::{layout, Group, RemoteMemory};
use crate::wire::{self, Op};

/// How often the maintenance thread repairs ranges and releases stale slabs.
pub(super) const MAINTENANCE_INTERVAL: Duration = Duration::from_millis(100);
impl RemoteMemory {
    /// One round of maintenance (the background thread runs it every 100 ms): every split of
    /// a mapped range whose node is down is moved to a replacement slab and regenerated there
    /// in the background, and stale slabs of nodes that came back are released.
    pub fn maintain(&self) {
        let now = Instant::now();
        let due = *self.repair_after.lock() <= now;
        if due && (0..self.transport.nodes() as u16).any(|n| !self.transport.is_up(n)) {
            let mut stuck = false;
            for range in 0..self.ranges.len() {
                let Some(g) = self.ranges[range].load_full() else {
                    continue;
                };
                for j in 0..self.layout.width {
                    let node = g.nodes[j];
                    if node != slots::NO_NODE && self.transport.is_up(node) {
                        continue;
                    }
                    if let Err(e) = self.remap(range, j, node, MoveReason::Lost) {
                        // No spare node now; the range stays degraded and is retried later.
                        tracing::debug!(range, split = j, error = %e, "cannot repair yet");
                        stuck = true;
                        break;
                    }
                }
            }
            if stuck {
                *self.repair_after.lock() = now + REPAIR_RETRY;
            }
        }
        for node in 0..self.transport.nodes() as u16 {
            if self.transport.take_restarted(node) {
                self.node_restarted(node);
            }
            if self.transport.notice(node).reclaimed > 0 && self.transport.is_up(node) {
                self.move_reclaimed(node);
            }
        }
        self.unstick();
        self.resend_lagging();
        self.check_health();
        self.refresh_loads();
        self.regenerations_ended();
        self.release_orphans();
        self.report_corruption();
    }

    /// Moves every slab of ours that `node` reclaimed (it runs short of memory, or drains) to a
    /// replacement node, copying it while the old slab still serves, then frees the old one.
    pub(super) fn move_reclaimed(&self, node: u16) {
        let list = match self.transport.call(node, Op::Reclaims, &[]) {
            Ok(b) => match wire::parse_reclaims(&b) {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %protocol(&*self.transport, node, e), "bad RECLAIMS reply");
                    return;
                }
            },
            Err(e) => {
                tracing::debug!(node, error = %e, "cannot list reclaimed slabs yet");
                return;
            }
        };
        for c in list {
            if self.moving.lock().contains(&(node, c.slab))
                || self
                    .superseded
                    .lock()
                    .iter()
                    .any(|&(_, _, n, s)| (n, s) == (node, c.slab))
            {
                // Taken care of by a move under way, or kept until its split is regenerated.
                continue;
            }
            let at = self.locate_slab(node, c.slab);
            match at {
                Some((range, j)) => {
                    tracing::info!(
                        node,
                        slab = c.slab,
                        range,
                        split = j,
                        ms_left = c.ms_left,
                        "node reclaimed a slab: moving it"
                    );
                    metrics::counter!("hydramem_client_reclaims_total").increment(1);
                    match self.remap(range, j, node, MoveReason::Reclaimed { slab: c.slab }) {
                        Ok(_) => self.stuck.lock().retain(|x| *x != (node, c.slab)),
                        Err(e) => {
                            let mut stuck = self.stuck.lock();
                            if !stuck.contains(&(node, c.slab)) {
                                tracing::warn!(node, slab = c.slab, range, ms_left = c.ms_left, error = %e, "cannot move a reclaimed slab yet; retrying");
                                stuck.push((node, c.slab));
                            }
                        }
                    }
                }
                None => {
                    // Not part of any range (left over from an earlier move or a lost mapping).
                    let _ = self.transport.free(node, c.slab);
                }
            }
        }
    }

    /// A node came back as a new process: every split of ours it held is lost. They are
    /// repaired like a dropped reclaimed slab (`unstick`): regenerated on a replacement node,
    /// or on the restarted node itself when no other can take them.
    pub(super) fn node_restarted(&self, node: u16) {
        // A new process with fresh memory: judge it afresh.
        if let Some(h) = self.health.get(node as usize) {
            if h.avoided.swap(false, Ordering::Relaxed) {
                tracing::info!(
                    node,
                    "a node avoided for corruption restarted: placing on it again"
                );
            }
            h.suspect.store(false, Ordering::Relaxed);
            h.reads.store(0, Ordering::Relaxed);
            h.errors.store(0, Ordering::Relaxed);
        }
        // Slabs the new process already holds for us were allocated after the restart (a
        // repair may place a split on it before this round sees the restart): only the others
        // are lost. If the node cannot be asked, all of them are treated as lost.
        let held = self.listed_slabs(node).unwrap_or_default();
        let lost: Vec<(u16, u32)> = self
            .splits_on(node)
            .into_iter()
            .filter(|(_, _, slab)| !held.contains(slab))
            .map(|(_, _, slab)| (node, slab))
            .collect();
        tracing::warn!(
            node,
            splits = lost.len(),
            "memory node restarted empty: repairing the splits it held"
        );
        let mut stuck = self.stuck.lock();
        for l in lost {
            if !stuck.contains(&l) {
                stuck.push(l);
            }
        }
    }

    /// The (range, split) whose slab is `slab` on `node`, if any range uses it.
    pub(super) fn locate_slab(&self, node: u16, slab: u32) -> Option<(usize, usize)> {
        let w = self.layout.width;
        (0..self.ranges.len()).find_map(|range| {
            let g = self.ranges[range].load();
            let g = g.as_ref()?;
            (0..w)
                .find(|&j| g.nodes[j] == node && g.slabs[j] == slab)
                .map(|j| (range, j))
        })
    }

    /// The slabs `node` holds for us (LIST); `None` if it cannot say now (logged).
    fn listed_slabs(&self, node: u16) -> Option<std::collections::HashSet<u32>> {
        Some(self.listed(node)?.into_iter().map(|l| l.slab).collect())
    }

    /// The slabs of ours `node` holds, with their tags (LIST); `None`, logged, if it cannot
    /// be asked now or answers nonsense.
    fn listed(&self, node: u16) -> Option<Vec<wire::Listed>> {
        match self.transport.call(node, Op::List, &[]) {
            Ok(b) => match wire::parse_list(&b) {
                Ok(l) => Some(l),
                Err(e) => {
                    tracing::warn!(error = %protocol(&*self.transport, node, e), "bad LIST reply");
                    None
                }
            },
            Err(e) => {
                tracing::debug!(node, error = %e, "cannot list the node's slabs now");
                None
            }
        }
    }

    /// Frees `slab` on `node`, no longer needed by range `range` (`what` it was, for the log),
    /// or, if the node cannot be asked now, remembers it to free once the node answers.
    fn release(&self, node: u16, slab: u32, range: usize, what: &'static str) {
        match self.transport.free(node, slab) {
            Ok(_) | Err(TransportError::Refused { .. }) => {
                tracing::info!(node, slab, range, "{what} slab released")
            }
            Err(_) => self.orphans.lock().push((node, slab)),
        }
    }

    /// Whether an audit of the slabs the nodes hold is due now (every
    /// [`ClientConfig::audit_interval`](super::ClientConfig)) and none is running; if so, it
    /// counts as started: the caller runs [`RemoteMemory::audit_node`] for every node, on a
    /// thread of its own, then [`RemoteMemory::audit_done`].
    pub(super) fn audit_due(&self) -> bool {
        let now = Instant::now();
        let mut next = self.audit_after.lock();
        if *next > now || self.audit_running.swap(true, Ordering::AcqRel) {
            return false;
        }
        *next = now + self.config.audit_interval;
        true
    }

    /// The audit that [`RemoteMemory::audit_due`] started has ended.
    pub(super) fn audit_done(&self) {
        self.audit_running.store(false, Ordering::Release);
    }

    /// The audit of one node, if it is up: asks it which of our slabs it holds (LIST), repairs
    /// the splits whose slab it no longer has — a reclaimed slab dropped at its deadline, a
    /// slab another process with our identity freed while we were cut off from the node, a
    /// node that restarted between two heartbeats — and frees the never-written slabs it holds
    /// that nothing of ours uses ([`Self::sweep`]).
    /// Nothing else notices either while a range is only read: a read reads around a split
    /// whose node answers that the slab is gone, and a write notices only when it fails. So
    /// without this a range that is only read could stay one failure closer to loss for as
    /// long as it is read. Runs on a thread of its own (a node slow to answer LIST delays no
    /// repair); costs one LIST per node per interval.
    pub(super) fn audit_node(&self, node: u16) {
        if !self.transport.is_up(node) {
            return;
        }
        // Ours before the node's answer: a slab allocated meanwhile is in the answer but not
        // here; one freed meanwhile (a move) is no longer its split's, checked below.
        let ours = self.splits_on(node);
        let Some(listed) = self.listed(node) else {
            return;
        };
        let held: std::collections::HashSet<u32> = listed.iter().map(|l| l.slab).collect();
        for (range, j, slab) in ours.into_iter().filter(|s| !held.contains(&s.2)) {
            // A split a write moved meanwhile left its old slab freed on purpose: only a
            // split still on the slab is a gone one (`remap` checks again, under its lock).
            let still = |g: &Group| g.nodes[j] == node && g.slabs[j] == slab;
            if !self.ranges[range].load().as_deref().is_some_and(still) {
                continue;
            }
            match self.remap(range, j, node, MoveReason::Gone { slab }) {
                Ok(g) if !still(&g) => {
                    metrics::counter!("hydramem_client_slabs_gone_total").increment(1);
                    tracing::warn!(
                        node,
                        slab,
                        range,
                        split = j,
                        "a memory node no longer held a slab of ours: regenerating it elsewhere"
                    );
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(node, slab, range, split = j, error = %e, "a memory node no longer holds a slab of ours and it cannot be repaired yet; the next audit retries");
                }
            }
        }
        self.sweep(node, &listed);
    }

    /// Frees the slabs of `listed` (what `node` said it holds of ours) that no write ever
    /// reached, that carry this client's layout in their tag, and that no range, move under
    /// way, superseded claim or pending free named at this audit and at the one before: an
    /// ALLOC whose reply was lost (the node allocated, the client timed out and placed the
    /// split elsewhere). Each held a slab of the node's memory until the identity was freed.
    ///
    /// Safe because such a slab holds no byte of anyone's: a slab with a write in it is never
    /// freed here, even if nothing names it (a node that was down when this client connected
    /// comes back with slabs it never adopted, which may be the only copy of their pages).
    /// Nothing else of this identity can be placing it: the nodes let one process hold an
    /// identity at a time ([`crate::node::tenants`]), and every ALLOC is made, and its slab
    /// put into its range, under the placement lock, which this takes after the LIST and
    /// holds until its last FREE, so a slab the LIST named that nothing names under the lock
    /// was not allocated by a mapping or a repair still under way (nor, should the node have
    /// restarted since the LIST, is a new slab of ours that took the same number). Two audits must find it unused, so that the last audit of a
    /// client being dropped cannot take a slab its successor in the same process (the same
    /// instance to the nodes) has just allocated. A slab whose tag is not this layout's is
    /// never touched.
    fn sweep(&self, node: u16, listed: &[wire::Listed]) {
        let code = self.layout.code();
        let blank: Vec<u32> = listed
            .iter()
            .filter(|l| l.newest == 0)
            .filter(|l| layout::untag(l.tag).is_some_and(|(c, _, _)| c == code))
            .map(|l| l.slab)
            .collect();
        if blank.is_empty() {
            self.unused_seen.lock().retain(|m| m.0 != node);
            return;
        }
        // Held to the last FREE: should the node restart after the LIST, a slab of ours that
        // its new incarnation numbers like a listed one can only come from an ALLOC, made
        // under this lock, so it is named below (and kept) or is a lost ALLOC's (and blank).
        let _placing = self.placement.lock();
        let mut used: std::collections::HashSet<u32> =
            self.splits_on(node).into_iter().map(|s| s.2).collect();
        let on_node = |&(n, s): &(u16, u32)| (n == node).then_some(s);
        used.extend(self.moving.lock().iter().filter_map(on_node));
        used.extend(self.orphans.lock().iter().filter_map(on_node));
        used.extend(
            self.superseded
                .lock()
                .iter()
                .filter(|s| s.2 == node)
                .map(|s| s.3),
        );
        let unused = blank.into_iter().filter(|s| !used.contains(s));
        // Found unused again: freed now. Found unused for the first time: remembered.
        let again: Vec<u32> = {
            let mut seen = self.unused_seen.lock();
            let before: Vec<u32> = seen.iter().filter(|m| m.0 == node).map(|m| m.1).collect();
            seen.retain(|m| m.0 != node);
            let (again, first): (Vec<u32>, Vec<u32>) = unused.partition(|s| before.contains(s));
            seen.extend(first.into_iter().map(|s| (node, s)));
            again
        };
        for slab in again {
            match self.transport.free(node, slab) {
                Ok(_) => {
                    metrics::counter!("hydramem_client_slabs_swept_total").increment(1);
                    tracing::warn!(
                        node,
                        slab,
                        "freed a slab of ours that was never written and that nothing used (an allocation whose reply was lost)"
                    );
                }
                // The node stopped answering: the rest waits for the next audits, so that
                // placement (this lock) waits for at most one FREE's timeout.
                Err(e) => {
                    tracing::debug!(node, slab, error = %e, "cannot free an unused slab now; the next audits retry");
                    break;
                }
            }
        }
    }

    /// Reclaimed slabs we could not move whose node dropped them meanwhile (it no longer
    /// reports any reclaimed slab of ours, or is down): their splits are lost, so repair them
    /// like a failed node's.
    pub(super) fn unstick(&self) {
        let stuck = {
            let s = self.stuck.lock();
            if s.is_empty() {
                return;
            }
            s.clone()
        };
        for (node, slab) in stuck {
            let at = self.locate_slab(node, slab);
            let Some((range, j)) = at else {
                self.stuck.lock().retain(|x| *x != (node, slab));
                continue;
            };
            if self.transport.notice(node).reclaimed > 0 && self.transport.is_up(node) {
                continue; // still reclaimed: `move_reclaimed` keeps trying
            }
            if self.remap(range, j, node, MoveReason::Lost).is_ok() {
                tracing::warn!(node, slab, range, split = j, "a reclaimed slab was dropped before it could be moved; regenerated it elsewhere");
                self.stuck.lock().retain(|x| *x != (node, slab));
            }
        }
    }

    /// Frees the slabs that lost split `split` of `range` to another when this identity
    /// reconnected ([`RemoteMemory::superseded`](super::RemoteMemory)): a regeneration of the
    /// split succeeded, so the split is whole without them.
    fn release_superseded(&self, range: usize, split: usize) {
        let done: Vec<(u16, u32)> = {
            let mut sup = self.superseded.lock();
            let (done, kept) = sup
                .drain(..)
                .partition(|&(r, j, _, _)| (r, j) == (range, split));
            *sup = kept;
            done.into_iter().map(|(_, _, n, s)| (n, s)).collect()
        };
        for (node, slab) in done {
            self.release(node, slab, range, "superseded");
        }
    }

    /// Acts on regenerations that ended: a finished move frees the slab it replaced; a failed
    /// regeneration is retried while its slab is still the range's.
    pub(super) fn regenerations_ended(&self) {
        let ended = {
            let mut e = self.ended.lock();
            if e.is_empty() {
                return;
            }
            std::mem::take(&mut *e)
        };
        for (job, ok) in ended {
            if ok {
                if let Some((node, slab)) = job.from {
                    self.release(node, slab, job.range, "moved");
                    self.moving.lock().retain(|m| *m != (node, slab));
                }
                self.release_superseded(job.range, job.split);
            } else {
                self.retry.lock().1.push(job);
            }
        }
        let due = {
            let mut r = self.retry.lock();
            if r.1.is_empty() || r.0 > Instant::now() {
                return;
            }
            r.0 = Instant::now() + REPAIR_RETRY;
            std::mem::take(&mut r.1)
        };
        for job in due {
            let current = self.ranges[job.range].load_full();
            match current {
                Some(g) if g.nodes[job.split] == job.node && g.slabs[job.split] == job.slab => {
                    tracing::info!(
                        range = job.range,
                        split = job.split,
                        "retrying a regeneration that failed"
                    );
                    self.regenerate(job, &g);
                }
                _ => {
                    // The split moved again: the old slab of a move is no longer needed.
                    if let Some(m) = job.from {
                        self.moving.lock().retain(|x| *x != m);
                        self.orphans.lock().push(m);
                    }
                }
            }
        }
    }

    /// Frees the slabs left behind on nodes that failed, once those nodes answer again (a
    /// revived node's stale slabs are released, never read). Called after every remap; call it
    /// periodically to release them sooner.
    pub fn release_orphans(&self) {
        let mut orphans = {
            let mut o = self.orphans.lock();
            // Nothing to do until one of their nodes is back (and no allocation meanwhile).
            if !o.iter().any(|(n, _)| self.transport.is_up(*n)) {
                return;
            }
            std::mem::take(&mut *o)
        };
        let width = self.layout.width;
        // A restarted node numbers its slabs anew: never free an id a current group uses.
        let in_use = |node: u16, slab: u32| {
            self.ranges.iter().any(|r| {
                r.load()
                    .as_ref()
                    .is_some_and(|g| (0..width).any(|j| g.nodes[j] == node && g.slabs[j] == slab))
            })
        };
        orphans.retain(|(node, slab)| {
            if !self.transport.is_up(*node) {
                return true;
            }
            if in_use(*node, *slab) {
                return false;
            }
            match self.transport.free(*node, *slab) {
                Ok(_) | Err(TransportError::Refused { .. }) => {
                    tracing::info!(node, slab, "released a stale slab on a node that came back");
                    false
                }
                Err(_) => true,
            }
        });
        self.orphans.lock().extend(orphans);
    }
}
