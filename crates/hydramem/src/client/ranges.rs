//! The range map: address range → coding group (which slab on which node holds each split).
//! A range is mapped on its first write ([`RemoteMemory::map_range`]): placement picks
//! `width` nodes, each allocates a slab tagged with the range and the layout, and the group is
//! published atomically; until then the range reads as zeros. Also the placement state (the
//! placer and the nodes' loads).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::health::NodeHealth;
use super::layout::MAX_WIDTH;
use super::slots::{self};
use super::transport::{Transport, TransportError};
use super::{layout, ClientError, IoError, RemoteMemory};
use crate::placement::{NodeView, Placer};
use crate::wire::Status;
use crate::PAGE_SIZE;

/// The coding group of one address range: which slab on which node holds each split.
#[derive(Debug, Clone)]
pub struct Group {
    /// Node index per split.
    pub nodes: [u16; MAX_WIDTH],
    /// Slab id per split.
    pub slabs: [u32; MAX_WIDTH],
    /// Splits whose slab is a replacement still being regenerated. Reads ask them last (coded
    /// schemes) or never (replication: one copy is a whole page, and a not yet copied one would
    /// answer with an old or empty page that no other copy outvotes); writes go to them.
    pub fresh: u32,
}

pub(super) struct Placement {
    pub(super) placer: Placer,
    /// Slabs per node (what placement balances).
    pub(super) loads: Vec<u64>,
    /// Failure domain per node, as small integers ([`Domains`]).
    pub(super) domains: Domains,
    /// The policy and seed the placer was built with (a new member rebuilds it).
    pub(super) policy: crate::placement::Policy,
    pub(super) seed: u64,
}

/// Failure domains as small integers, for placement: one entry per node, names numbered in
/// the order first seen.
#[derive(Debug, Default)]
pub(super) struct Domains {
    pub(super) of: Vec<Option<u32>>,
    names: std::collections::HashMap<String, u32>,
}

impl Domains {
    /// Adds the next node's domain.
    pub(super) fn push(&mut self, name: Option<&str>) {
        let d = name.map(|d| {
            let next = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
            *self.names.entry(d.to_string()).or_insert(next)
        });
        self.of.push(d);
    }
}

/// The placer's view: a node takes new slabs if it is up and has not said it refuses them
/// (draining, or out of memory budget), and this client does not avoid it for corruption.
/// It covers the nodes placement knows (`loads`): a member the transport is still joining is
/// offered once [`RemoteMemory::join_member`] has added it.
pub(super) fn node_views(
    t: &dyn Transport,
    loads: &[u64],
    domains: &[Option<u32>],
    health: &[NodeHealth],
) -> Vec<NodeView> {
    (0..loads.len())
        .map(|i| NodeView {
            available: t.is_up(i as u16)
                && !t.notice(i as u16).refusing
                && !health[i].avoided.load(Ordering::Relaxed),
            load: loads[i],
            domain: domains[i],
        })
        .collect()
}

impl RemoteMemory {
    /// Takes every node's slab count from its last heartbeat as its load, so that this client
    /// places new ranges knowing what other clients allocated since it connected (without it,
    /// clients that connected together keep choosing the same "emptiest" group). Allocates
    /// only when a load changed.
    pub(super) fn refresh_loads(&self) {
        let mut pl = self.placement.lock();
        let mut changed = false;
        for i in 0..pl.loads.len() {
            if let Some(slabs) = self.transport.notice(i as u16).slabs {
                if pl.loads[i] != u64::from(slabs) {
                    pl.loads[i] = u64::from(slabs);
                    changed = true;
                }
            }
        }
        if changed {
            let views = node_views(&*self.transport, &pl.loads, &pl.domains.of, &self.health);
            let _ = pl.placer.refresh(&views);
        }
    }

    /// The load (slabs) this client's placement assumes for every node, in cluster-file order.
    pub fn placement_loads(&self) -> Vec<u64> {
        self.placement.lock().loads.clone()
    }

    /// The range of the page at `addr` and its index in the range (its split slot).
    pub(super) fn locate(&self, addr: u64) -> Result<(usize, u64), IoError> {
        if self.layout.span() {
            return Err(IoError::SpanPages {
                what: "access",
                addr,
            });
        }
        self.locate_unit(addr)
    }

    /// [`RemoteMemory::locate`] for any layout: for span, `addr` is a row's (row × 4096).
    pub(super) fn locate_unit(&self, addr: u64) -> Result<(usize, u64), IoError> {
        if !addr.is_multiple_of(PAGE_SIZE as u64) {
            return Err(IoError::Unaligned { addr });
        }
        let space = self.layout.space(self.config.size);
        if addr >= space {
            return Err(IoError::OutOfRange { addr, size: space });
        }
        let rb = self.layout.range_bytes();
        Ok(((addr / rb) as usize, (addr % rb) / PAGE_SIZE as u64))
    }

    /// The coding group of the range holding `addr`, if mapped.
    pub fn group_of(&self, addr: u64) -> Option<Arc<Group>> {
        let range = (addr / self.layout.range_bytes()) as usize;
        self.ranges.get(range)?.load_full()
    }

    /// Maps range `range` to a new coding group (first write).
    pub(super) fn map_range(&self, range: usize) -> Result<Arc<Group>, ClientError> {
        let mut pl = self.placement.lock();
        if let Some(g) = self.ranges[range].load_full() {
            return Ok(g);
        }
        let l = &self.layout;
        let mut excluded: Vec<u16> = Vec::new();
        let mut full: Vec<u16> = Vec::new();
        loop {
            let mut views = node_views(&*self.transport, &pl.loads, &pl.domains.of, &self.health);
            for n in &excluded {
                views[*n as usize].available = false;
            }
            let chosen = match pl.placer.place(&views) {
                Ok(c) => c,
                Err(source) => {
                    if full.is_empty() {
                        // Nodes that said in a heartbeat that they take no new slabs (out of
                        // budget, or draining) were not offered to the placer: the cluster is
                        // full just as when they refuse an allocation.
                        full = (0..self.transport.nodes() as u16)
                            .filter(|&n| {
                                self.transport.is_up(n) && self.transport.notice(n).refusing
                            })
                            .collect();
                    }
                    if full.is_empty() {
                        return Err(ClientError::Placement {
                            range: range as u64,
                            source,
                        });
                    }
                    return Err(ClientError::OutOfCapacity {
                        range: range as u64,
                        full: full
                            .iter()
                            .map(|n| self.node_label(*n))
                            .collect::<Vec<_>>()
                            .join(", "),
                    });
                }
            };
            let mut g = Group {
                nodes: [slots::NO_NODE; MAX_WIDTH],
                slabs: [0; MAX_WIDTH],
                fresh: 0,
            };
            let mut failed = None;
            for (j, &node) in chosen.iter().enumerate() {
                let node = node as u16;
                let tag = layout::tag(l.code(), range as u32, j as u8);
                match self.transport.alloc(node, tag, l.split_len as u32) {
                    Ok(slab) => {
                        g.nodes[j] = node;
                        g.slabs[j] = slab;
                        pl.loads[node as usize] += 1;
                    }
                    Err(e) => {
                        failed = Some((node, e));
                        break;
                    }
                }
            }
            match failed {
                None => {
                    let g = Arc::new(g);
                    self.ranges[range].store(Some(g.clone()));
                    tracing::debug!(range, nodes = ?&g.nodes[..l.width], "address range mapped");
                    metrics::counter!("hydramem_client_ranges_mapped_total").increment(1);
                    return Ok(g);
                }
                Some((node, err)) => {
                    // Give back what this attempt took, avoid the refusing node, try again.
                    for j in 0..l.width {
                        if g.nodes[j] != slots::NO_NODE {
                            match self.transport.free(g.nodes[j], g.slabs[j]) {
                                Ok(_) | Err(TransportError::Refused { .. }) => {}
                                // Freed once the node answers (`release_orphans`).
                                Err(_) => self.orphans.lock().push((g.nodes[j], g.slabs[j])),
                            }
                            pl.loads[g.nodes[j] as usize] -= 1;
                        }
                    }
                    tracing::warn!(node, error = ?err, "slab allocation failed; trying other nodes");
                    excluded.push(node);
                    match err {
                        // Out of capacity, or this identity's quota there is used up: full for
                        // this client alike.
                        TransportError::Refused {
                            status: Status::NoCapacity | Status::OverQuota,
                            ..
                        } => full.push(node),
                        // A node that is gone, stalled or answers nonsense: another one will do.
                        TransportError::Down { .. }
                        | TransportError::Timeout { .. }
                        | TransportError::Protocol { .. } => {}
                        e => return Err(e.into()),
                    }
                }
            }
        }
    }

    /// Gives back the nodes' memory of the units (span rows) `units`: every slab of each
    /// mapped range they cross is told to DISCARD those slots, so they read as zeros and as
    /// never written. Best effort: a node that is down or refuses keeps the memory (its slab
    /// is moved or freed later anyway). Returns the slots the nodes discarded. The caller
    /// must own the units: no operation of its own may be in flight to them.
    pub fn discard_units(&self, units: std::ops::Range<u64>) -> u64 {
        let per = self.layout.pages_per_range;
        let mut done = 0;
        let mut unit = units.start;
        while unit < units.end {
            let range = unit / per;
            let stop = units.end.min((range + 1) * per);
            let (first, n) = (unit % per, stop - unit);
            let group = usize::try_from(range)
                .ok()
                .and_then(|r| self.ranges.get(r))
                .and_then(|r| r.load_full());
            for g in group.iter() {
                for j in 0..self.layout.width {
                    let node = g.nodes[j];
                    if node == slots::NO_NODE || !self.transport.is_up(node) {
                        continue;
                    }
                    match self.transport.discard(node, g.slabs[j], first, n) {
                        Ok(()) => done += n,
                        Err(e) => {
                            tracing::debug!(error = %e, "DISCARD refused; the slots keep their memory")
                        }
                    }
                }
            }
            unit = stop;
        }
        done
    }

    /// Frees every slab this client holds (its data is gone afterwards).
    pub fn free_all(&self) -> Result<(), ClientError> {
        let mut pl = self.placement.lock();
        for r in self.ranges.iter() {
            if let Some(g) = r.swap(None) {
                for j in 0..self.layout.width {
                    let node = g.nodes[j];
                    if node != slots::NO_NODE && self.transport.is_up(node) {
                        self.transport.free(node, g.slabs[j])?;
                        pl.loads[node as usize] = pl.loads[node as usize].saturating_sub(1);
                    }
                }
            }
        }
        // And the slabs kept only until their split was regenerated (best effort: they hold
        // nothing the ranges need).
        let superseded = std::mem::take(&mut *self.superseded.lock());
        for (_, _, node, slab) in superseded {
            if self.transport.is_up(node) && self.transport.free(node, slab).is_ok() {
                pl.loads[node as usize] = pl.loads[node as usize].saturating_sub(1);
            }
        }
        Ok(())
    }
}
