//! Repair: move a split of a range to a new slab (its node failed, reclaimed the slab, or
//! returns too many corrupted splits) and regenerate it there in the background — the new node
//! rebuilds the slab from the group's other slabs (REGEN), or copies it from the old slab when
//! that is still readable. Writes go to the new slab at once; reads ask it last until it is
//! regenerated.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use parking_lot::Mutex;

use super::ranges::{node_views, Placement};
use super::slots::{self};
use super::transport::TransportError;
use super::{layout, ClientError, Group, RemoteMemory, Resilience};

/// How long a repair that found no replacement node waits before trying again.
pub(super) const REPAIR_RETRY: Duration = Duration::from_secs(1);
/// One background regeneration: split `split` of `range`, into `slab` on `node`, optionally
/// copying from the slab it replaces (`from`, when that slab is still readable: a move).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RegenJob {
    pub(super) range: usize,
    pub(super) split: usize,
    pub(super) node: u16,
    pub(super) slab: u32,
    pub(super) from: Option<(u16, u32)>,
}

/// Why a split moves to a replacement slab.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MoveReason {
    /// Its node failed or lost the slab: the old slab is unreadable, regenerate by decoding.
    Lost,
    /// Its node reclaimed the slab (memory pressure, drain) and still serves it: copy it, then
    /// free it.
    Reclaimed {
        /// The slab being moved away.
        slab: u32,
    },
    /// Its node returns too many corrupted splits (above the SlabRegenerationLimit): regenerate
    /// by decoding from the other splits, never from it, and free the old slab.
    Corrupt,
    /// Its node is up but no longer holds the slab (an audit found it gone): as `Lost`, if
    /// the split is still on that slab.
    Gone {
        /// The slab found gone.
        slab: u32,
    },
}

impl MoveReason {
    /// Whether the old slab is unreadable and its node is not to blame for it (`Lost`,
    /// `Gone`): the split is decoded from the others, and the node itself may take it again
    /// when no other can.
    fn lost(self) -> bool {
        matches!(self, MoveReason::Lost | MoveReason::Gone { .. })
    }
}

/// Counts of background slab regenerations.
#[derive(Debug, Default)]
pub(super) struct RegenCounters {
    pub(super) started: AtomicU64,
    pub(super) done: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) pages: AtomicU64,
    /// Sum of the wall time of finished regenerations, nanoseconds.
    pub(super) nanos: AtomicU64,
}

/// What the thread waiting for a regeneration records when it ends.
struct RegenEnd {
    regen: Arc<RegenCounters>,
    ended: Arc<Mutex<Vec<(RegenJob, bool)>>>,
    ranges: Arc<[ArcSwapOption<Group>]>,
    /// The regenerating node's address, for the log.
    target: String,
}

impl RegenEnd {
    /// `job`'s regeneration, started at `t0`, ended with `result` (pages rebuilt): counted,
    /// said, and handed to maintenance; a complete split may be read again (unless it moved
    /// meanwhile).
    fn record(self, job: RegenJob, result: Result<u64, TransportError>, t0: Instant) {
        metrics::gauge!("hydramem_client_regenerations_in_progress").decrement(1.0);
        let (range, j, target) = (job.range, job.split, &self.target);
        let ok = result.is_ok();
        match result {
            Ok(pages) => {
                self.ranges[range].rcu(|g| {
                    g.as_ref().map(|g| {
                        let mut ng = (**g).clone();
                        if ng.nodes[j] == job.node && ng.slabs[j] == job.slab {
                            ng.fresh &= !(1 << j);
                        }
                        Arc::new(ng)
                    })
                });
                let r = &self.regen;
                r.pages.fetch_add(pages, Ordering::SeqCst);
                r.nanos
                    .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::SeqCst);
                r.done.fetch_add(1, Ordering::SeqCst);
                metrics::counter!("hydramem_client_regenerations_total").increment(1);
                tracing::info!(range, split = j, %target, pages, elapsed = ?t0.elapsed(), moved = job.from.is_some(), "slab regenerated");
            }
            Err(e) => {
                self.regen.failed.fetch_add(1, Ordering::SeqCst);
                tracing::warn!(range, split = j, %target, error = %e, "slab regeneration failed; the range stays degraded until a retry succeeds");
            }
        }
        self.ended.lock().push((job, ok));
    }
}

/// What background regeneration has done so far.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct RegenStats {
    /// Regenerations started.
    pub started: u64,
    /// Finished.
    pub done: u64,
    /// Failed.
    pub failed: u64,
    /// Pages rebuilt by the finished ones.
    pub pages: u64,
    /// Sum of their wall times.
    pub busy: Duration,
}

impl RemoteMemory {
    /// Moves split `j` of `range` off `lost` (a failed node, or one that lost the slab) to a
    /// replacement slab chosen by placement, never on a node that already holds a split of the
    /// range. The old slab is remembered and freed once its node answers again. Returns the
    /// range's new coding group (or the current one if another thread already moved it).
    pub(super) fn remap(
        &self,
        range: usize,
        j: usize,
        lost: u16,
        why: MoveReason,
    ) -> Result<Arc<Group>, ClientError> {
        let mut pl = self.placement.lock();
        // A range released meanwhile (the client ending) has nothing left to repair.
        let g = self.ranges[range]
            .load_full()
            .ok_or(ClientError::Unmapped {
                range: range as u64,
            })?;
        if g.nodes[j] != lost {
            return Ok(g);
        }
        if let MoveReason::Reclaimed { slab } | MoveReason::Gone { slab } = why {
            if g.slabs[j] != slab {
                return Ok(g);
            }
        }
        let reclaimed = matches!(why, MoveReason::Reclaimed { .. });
        let l = &self.layout;
        // A node that reclaims a slab, or corrupts it, is never its replacement.
        let mut excluded: Vec<u16> = if !why.lost() { vec![lost] } else { Vec::new() };
        loop {
            let chosen = self.replacement(&mut pl, (&g, range, j), lost, why, &excluded)?;
            let tag = layout::tag(l.code(), range as u32, j as u8);
            match self.transport.alloc(chosen, tag, l.split_len as u32) {
                Ok(slab) => {
                    let mut ng = (*g).clone();
                    ng.nodes[j] = chosen;
                    ng.slabs[j] = slab;
                    ng.fresh |= 1 << j;
                    let ng = Arc::new(ng);
                    if reclaimed {
                        // Before the switch, so that maintenance never takes the old slab,
                        // no longer in any group, for a leftover.
                        self.moving.lock().push((lost, g.slabs[j]));
                    }
                    self.ranges[range].store(Some(ng.clone()));
                    pl.loads[chosen as usize] += 1;
                    if lost != slots::NO_NODE {
                        pl.loads[lost as usize] = pl.loads[lost as usize].saturating_sub(1);
                        if !reclaimed {
                            self.orphans.lock().push((lost, g.slabs[j]));
                        }
                    }
                    metrics::counter!("hydramem_client_splits_remapped_total").increment(1);
                    tracing::warn!(
                        range,
                        split = j,
                        from = lost,
                        to = chosen,
                        "split moved to a replacement slab (its older pages stay readable from the other splits)"
                    );
                    drop(pl);
                    let job = RegenJob {
                        range,
                        split: j,
                        node: chosen,
                        slab,
                        from: reclaimed.then_some((lost, g.slabs[j])),
                    };
                    self.regenerate(job, &ng);
                    self.release_orphans();
                    return Ok(ng);
                }
                Err(e) => {
                    tracing::warn!(node = chosen, error = %e, "replacement slab refused; trying another node");
                    excluded.push(chosen);
                }
            }
        }
    }

    /// The node that takes split `j` of `range` (group `g`) off `lost`: placement's choice
    /// among the available nodes outside the group and `excluded`; for an unknown lost node
    /// (its slab was missing at connect), the least loaded such node; when none is spare, the
    /// lost node itself if it is back and the split was lost (it restarted and lost the slab,
    /// or returned after being declared failed).
    fn replacement(
        &self,
        pl: &mut Placement,
        (g, range, j): (&Group, usize, usize),
        lost: u16,
        why: MoveReason,
        excluded: &[u16],
    ) -> Result<u16, ClientError> {
        let mut views = node_views(&*self.transport, &pl.loads, &pl.domains.of, &self.health);
        for n in excluded {
            views[*n as usize].available = false;
        }
        let members: Vec<usize> = g.nodes[..self.layout.width]
            .iter()
            .filter(|n| **n != slots::NO_NODE)
            .map(|n| *n as usize)
            .collect();
        let chosen = if lost == slots::NO_NODE {
            (0..views.len())
                .filter(|n| views[*n].available && !members.contains(n))
                .min_by_key(|n| views[*n].load)
                .ok_or(crate::placement::PlacementError::NoReplacement { lost: j })
        } else {
            pl.placer
                .replace(&views, &members, lost as usize)
                .or_else(|e| {
                    if views[lost as usize].available && why.lost() {
                        Ok(lost as usize)
                    } else {
                        Err(e)
                    }
                })
        };
        chosen
            .map(|n| n as u16)
            .map_err(|source| ClientError::Placement {
                range: range as u64,
                source,
            })
    }

    /// Starts background regeneration of split `job.split` of `job.range` on the node that now
    /// holds it (paper 4.2): that node reads the surviving splits from their nodes, decodes and
    /// fills the slab, while this client keeps reading and writing the range. Writes go to the
    /// new slab already; the node's version check keeps them from being overwritten by older
    /// regenerated splits. A move (`job.from`) lets the node copy the old slab instead, and
    /// replicas are always copied from a surviving replica.
    pub(super) fn regenerate(&self, job: RegenJob, g: &Group) {
        let width = self.layout.width;
        let (k, r, copies) = match self.layout.resilience {
            Resilience::Hydra { k, r, .. } | Resilience::Span { k, r } => (k, r, false),
            Resilience::Replication { .. } => (1, (width - 1) as u8, true),
        };
        let j = job.split;
        let sources = self.regen_sources(&job, g, copies);
        if sources.is_empty() && width == 1 {
            // A single copy has nothing to be rebuilt from: the new slab keeps the writes made
            // since the loss, the pages written before are gone (reads of them fail as lost,
            // the slab staying fresh), and a retry would only fail again, every second.
            tracing::warn!(
                range = job.range,
                split = j,
                "single copy lost: nothing to regenerate it from; the pages written before the loss are gone"
            );
            return;
        }
        let req = crate::wire::Regen {
            client: self.owner,
            k,
            r,
            target: j as u8,
            split_len: self.layout.split_len as u32,
            slab: job.slab,
            pages: self.layout.pages_per_range,
            range: job.range as u64,
            checksums: self.config.checksums,
            sources,
        };
        let call = match self.transport.regen(job.node, &req) {
            Ok(call) => call,
            Err(e) => {
                self.regen.failed.fetch_add(1, Ordering::SeqCst);
                tracing::warn!(range = job.range, split = j, error = %e, "cannot start the slab's regeneration; the range stays degraded until a retry succeeds");
                self.ended.lock().push((job, false));
                return;
            }
        };
        let end = RegenEnd {
            regen: self.regen.clone(),
            ended: self.ended.clone(),
            ranges: self.ranges.clone(),
            target: self.transport.addr(job.node),
        };
        self.regen.started.fetch_add(1, Ordering::SeqCst);
        metrics::gauge!("hydramem_client_regenerations_in_progress").increment(1.0);
        let spawned = std::thread::Builder::new()
            .name("hm-regen".into())
            .spawn(move || {
                let t0 = Instant::now();
                let result = call();
                end.record(job, result, t0);
            });
        if let Err(e) = spawned {
            metrics::gauge!("hydramem_client_regenerations_in_progress").decrement(1.0);
            self.regen.failed.fetch_add(1, Ordering::SeqCst);
            tracing::warn!(range = job.range, split = j, error = %e, "cannot start a thread to wait for the slab's regeneration; it is retried");
            self.ended.lock().push((job, false));
        }
    }

    /// Where the node regenerating `job`'s split reads from: the slab it replaces when that
    /// is still readable (a move: copied), then the group's other splits on nodes that are up
    /// (copied for replicas, decoded otherwise), k + r at most in all. Sources are named by
    /// their id in the cluster file; the regenerating node looks their addresses up in its
    /// own copy of it.
    fn regen_sources(
        &self,
        job: &RegenJob,
        g: &Group,
        copies: bool,
    ) -> Vec<crate::wire::RegenSource> {
        let width = self.layout.width;
        let ids = self.node_ids.read().clone();
        let id = |n: u16| ids.get(n as usize).copied();
        let j = job.split;
        let mut sources: Vec<crate::wire::RegenSource> = Vec::new();
        if let Some((node, slab)) = job.from {
            if let Some(id) = id(node) {
                sources.push(crate::wire::RegenSource {
                    split: j as u8,
                    copy: true,
                    slab,
                    node: id,
                });
            }
        }
        sources.extend(
            (0..width)
                .filter(|&i| {
                    i != j && g.nodes[i] != slots::NO_NODE && self.transport.is_up(g.nodes[i])
                })
                .filter_map(|i| {
                    Some(crate::wire::RegenSource {
                        split: i as u8,
                        copy: copies,
                        slab: g.slabs[i],
                        node: id(g.nodes[i])?,
                    })
                })
                // A move's copy source is one of the k + r as well.
                .take(width - sources.len()),
        );
        sources
    }

    /// Mapped ranges with a member on a node that is down (not yet repaired) or a split still
    /// being regenerated.
    pub fn degraded_ranges(&self) -> usize {
        let w = self.layout.width;
        self.ranges
            .iter()
            .filter(|r| {
                r.load().as_ref().is_some_and(|g| {
                    g.fresh != 0
                        || g.nodes[..w]
                            .iter()
                            .any(|n| *n == slots::NO_NODE || !self.transport.is_up(*n))
                })
            })
            .count()
    }

    /// Everything background regeneration has done so far.
    pub fn regen_stats(&self) -> RegenStats {
        let r = &self.regen;
        RegenStats {
            started: r.started.load(Ordering::SeqCst),
            done: r.done.load(Ordering::SeqCst),
            failed: r.failed.load(Ordering::SeqCst),
            pages: r.pages.load(Ordering::SeqCst),
            busy: Duration::from_nanos(r.nanos.load(Ordering::SeqCst)),
        }
    }

    /// Regenerations started, finished and failed so far.
    pub fn regenerations(&self) -> (u64, u64, u64) {
        let r = &self.regen;
        (
            r.started.load(Ordering::SeqCst),
            r.done.load(Ordering::SeqCst),
            r.failed.load(Ordering::SeqCst),
        )
    }
}
