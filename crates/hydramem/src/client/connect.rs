//! Joining the cluster: connect to every node, check that they agree with the cluster file,
//! find the slabs this identity already holds (and seed the version clock past their versions),
//! rebuild the range map from their tags, and start the maintenance thread. Fails unless at
//! least one coding group's width of nodes is reachable.
//!
//! All of it runs on whatever transport the caller opens ([`RemoteMemory::connect_with`]);
//! [`RemoteMemory::connect`] opens TCP, tests open the in-memory transport.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwapOption;
use hydramem_isal::Codec;
use parking_lot::Mutex;

use super::error::protocol;
use super::health::NodeHealth;
use super::layout::MAX_WIDTH;
use super::maintain::MAINTENANCE_INTERVAL;
use super::ranges::{node_views, Domains, Placement};
use super::repair::{RegenCounters, RegenJob};
use super::slots::{self, Slots};
use super::tcp::TcpTransport;
use super::transport::{Completions, HelloOutcome};
use super::write::seed_clock_note;
use super::{
    layout, ClientConfig, ClientError, ClientMetrics, ClientStats, Group, Layout, RemoteMemory,
    Resilience, Transport,
};
use crate::cluster::Cluster;
use crate::placement::Placer;
use crate::rpc::Greeting;
use crate::units::human;
use crate::wire::{self, Op};

/// Builds the decode tables of every loss pattern a read can meet (any k of the k + r splits
/// present, the data splits among the others missing) before the first read, so that no read
/// pays the ~2 µs matrix inversion or the allocation of a first use. Skipped for codes with
/// more than 4096 patterns, whose tables are then built on first use.
pub(super) fn prepare_decode_tables(codec: &Codec, l: &Layout) {
    let (w, k) = (l.width, l.k);
    let count = (0..k).fold(1u128, |c, i| c * (w - i) as u128 / (i as u128 + 1));
    if count > 4096 || w > 24 {
        return;
    }
    let s = l.split_len;
    let zero = vec![0u8; s];
    let mut out = vec![vec![0u8; s]; k];
    for present in 0u32..(1 << w) {
        if present.count_ones() as usize != k || present & ((1 << k) - 1) == (1 << k) - 1 {
            continue; // not k splits, or all data present (no decode)
        }
        let p: Vec<(usize, &[u8])> = (0..w)
            .filter(|j| present & (1 << j) != 0)
            .map(|j| (j, &zero[..]))
            .collect();
        let mut missing: Vec<(usize, &mut [u8])> = out
            .iter_mut()
            .enumerate()
            .filter(|(j, _)| present & (1 << j) == 0)
            .map(|(j, b)| (j, &mut b[..]))
            .collect();
        let _ = codec.reconstruct(&p, &mut missing);
    }
}

/// What connecting learned from the nodes: their loads, this identity's slabs and the newest
/// version it holds.
struct Held {
    /// Slabs per node (cluster-file order).
    loads: Vec<u64>,
    /// The coding groups of the ranges this identity already holds.
    found: HashMap<u32, Group>,
    /// The newest page version stored anywhere for this identity.
    newest: u64,
    /// The newest version stored in the slab `found` holds for each (range, split).
    newest_of: HashMap<(u32, u8), u64>,
    /// Slabs that lost their split's claim to another (a move or a repair the last process
    /// with this identity did not finish): (range, split, node, slab), as
    /// [`RemoteMemory::superseded`] keeps them. `found` holds the winner, to be regenerated
    /// whole from the split's group; the losers are kept until that succeeds.
    superseded: Vec<(usize, usize, u16, u32)>,
}

impl Held {
    /// Takes `slab` on `node` (its newest write `newest`) as split `split` of `range`. When
    /// another slab claims that split already, the one with the newer write is kept (the
    /// first one listed on a tie) and the other is superseded. Neither is known to be
    /// complete — the old slab lacks the writes after the switch, the new one the pages not
    /// yet copied or decoded, and either may miss a write left behind by a straggler — so the
    /// kept one is regenerated from the split's group, whose k members hold every page's
    /// newest version, through the node's version check, which keeps the newer of each page.
    fn adopt(&mut self, range: u32, split: u8, (node, slab, newest): (u16, u32, u64)) {
        let g = self.found.entry(range).or_insert(Group {
            nodes: [slots::NO_NODE; MAX_WIDTH],
            slabs: [0; MAX_WIDTH],
            fresh: 0,
        });
        let (r, j) = (range as usize, split as usize);
        if g.nodes[j] != slots::NO_NODE {
            let theirs = self.newest_of.get(&(range, split)).copied().unwrap_or(0);
            tracing::warn!(
                range,
                split,
                slabs = ?[(g.nodes[j], g.slabs[j]), (node, slab)],
                "two slabs of this identity hold one split (a move or repair the last process \
                 did not finish): keeping the one with the newest write and regenerating it; \
                 the other is freed once that is done"
            );
            if newest <= theirs {
                self.superseded.push((r, j, node, slab));
                return;
            }
            self.superseded.push((r, j, g.nodes[j], g.slabs[j]));
        }
        g.nodes[j] = node;
        g.slabs[j] = slab;
        self.newest_of.insert((range, split), newest);
    }

    /// The splits that more than one slab claimed, each once.
    fn doubled(&self) -> Vec<(usize, usize)> {
        let mut d: Vec<(usize, usize)> =
            self.superseded.iter().map(|&(r, j, _, _)| (r, j)).collect();
        d.sort_unstable();
        d.dedup();
        d
    }
}

impl RemoteMemory {
    /// Connects to the cluster's nodes over TCP, finds this identity's existing slabs and is
    /// ready for I/O. Fails when fewer nodes are reachable than one coding group needs.
    pub fn connect(
        cluster: &Cluster,
        config: ClientConfig,
    ) -> Result<Arc<RemoteMemory>, ClientError> {
        let joined = crate::membership::Joined::resolve(cluster)?;
        let cluster = joined.cluster();
        let members: Vec<(u32, std::net::SocketAddr)> =
            cluster.nodes.iter().map(|n| (n.id, n.addr)).collect();
        let options = config.tcp;
        let capacity = members.len() + joined.room();
        let mem = RemoteMemory::connect_with(cluster, config, |hello, completions| {
            Ok(TcpTransport::connect(
                &members,
                capacity,
                hello,
                completions,
                options,
            )?)
        })?;
        joined.follow(&mem)?;
        Ok(mem)
    }

    /// Like [`RemoteMemory::connect`], on the transport `open` builds: `open` gets the HELLO
    /// to say to every node and the client's slot table, into which the transport must
    /// deliver completions, and returns the transport with each node's outcome (one per node
    /// of the cluster file, in its order). Everything else — validation, the layout, the
    /// hello outcomes, this identity's slabs (LIST), the version clock, maintenance — is the
    /// same whatever the transport. The in-memory transport ([`super::mem`]) comes this way.
    pub fn connect_with<T: Transport + 'static>(
        cluster: &Cluster,
        config: ClientConfig,
        open: impl FnOnce(Greeting, Arc<dyn Completions>) -> Result<(T, Vec<HelloOutcome>), ClientError>,
    ) -> Result<Arc<RemoteMemory>, ClientError> {
        validate(cluster, &config)?;
        let layout = Layout::new(config.resilience, cluster.slab_size)?;
        let codec = codec(&layout)?;
        let slots =
            Arc::new(Slots::new(layout, config.max_in_flight).with_checksums(config.checksums));
        let flags = if config.kept { wire::HELLO_KEPT } else { 0 };
        let greeting = Greeting::client(&config.client_id, flags, cluster.key.as_ref())
            .with_tls(cluster.tls.as_ref())
            .with_instance(config.instance);
        let owner = greeting.owner;
        let (transport, outcomes) = open(greeting, slots.clone())?;
        if outcomes.len() != cluster.nodes.len() || transport.nodes() != cluster.nodes.len() {
            return Err(ClientError::Config(format!(
                "the transport opened {} nodes ({} outcomes) for a cluster of {}",
                transport.nodes(),
                outcomes.len(),
                cluster.nodes.len()
            )));
        }
        check_outcomes(cluster, &config, &layout, &transport, &outcomes)?;
        let ranges = empty_ranges(&config, &layout)?;
        let held = find_held(&transport, &config, &layout, ranges.len())?;
        let recovered = held.found.len();
        let doubled = held.doubled();
        for (range, mut g) in held.found {
            for &(_, split) in doubled.iter().filter(|d| d.0 == range as usize) {
                // Read last until regenerated.
                g.fresh |= 1 << split;
            }
            ranges[range as usize].store(Some(Arc::new(g)));
        }
        seed_clock_note(held.newest);
        if recovered > 0 {
            tracing::info!(
                ranges = recovered,
                "found this identity's existing address ranges"
            );
        }
        let mut domains = Domains::default();
        for n in &cluster.nodes {
            domains.push(n.domain.as_deref());
        }
        let health: Arc<[NodeHealth]> = (0..transport.capacity().max(cluster.nodes.len()))
            .map(|_| NodeHealth::default())
            .collect();
        let views = node_views(&transport, &held.loads, &domains.of, &health);
        let seed = config.seed.unwrap_or_else(rand::random);
        let audit_after = Instant::now() + config.audit_interval;
        let policy = cluster.placement_policy(config.placement_l);
        let placer = Placer::new(policy, layout.width, &views, seed)
            .map_err(|source| ClientError::Placement { range: 0, source })?;
        let mem = Arc::new(RemoteMemory {
            layout,
            config,
            owner,
            codec,
            slots,
            transport: Box::new(transport),
            ranges: Arc::from(ranges),
            placement: Mutex::new(Placement {
                placer,
                loads: held.loads,
                domains,
                policy,
                seed,
            }),
            node_ids: parking_lot::RwLock::new(cluster.nodes.iter().map(|n| n.id).collect()),
            stats: ClientStats::default(),
            metrics: ClientMetrics::register(),
            clock: AtomicU64::new(held.newest),
            health,
            any_suspect: AtomicBool::new(false),
            piece_ns: AtomicU64::new(0),
            corrupt_reports: Mutex::new(Vec::new()),
            orphans: Mutex::new(Vec::new()),
            regen: Arc::new(RegenCounters::default()),
            moving: Mutex::new(Vec::new()),
            lagging: Default::default(),
            pollers: AtomicUsize::new(0),
            stuck: Mutex::new(Vec::new()),
            ended: Arc::new(Mutex::new(Vec::new())),
            retry: Mutex::new((Instant::now(), Vec::new())),
            repair_after: Mutex::new(Instant::now()),
            audit_after: Mutex::new(audit_after),
            audit_running: AtomicBool::new(false),
            superseded: Mutex::new(held.superseded),
            unused_seen: Mutex::new(Vec::new()),
        });
        metrics::gauge!("hydramem_client_nodes").set(mem.transport.nodes() as f64);
        for (range, j) in doubled {
            if let Some(g) = mem.ranges[range].load_full() {
                let job = RegenJob {
                    range,
                    split: j,
                    node: g.nodes[j],
                    slab: g.slabs[j],
                    from: None,
                };
                mem.regenerate(job, &g);
            }
        }
        start_maintenance(&mem)?;
        Ok(mem)
    }
}

/// The Reed-Solomon codec of a coded layout, its decode tables built (none for replicas).
fn codec(layout: &Layout) -> Result<Option<Codec>, ClientError> {
    match layout.resilience {
        Resilience::Hydra { k, r, .. } | Resilience::Span { k, r } => {
            let codec = Codec::new(k as usize, r as usize)?;
            prepare_decode_tables(&codec, layout);
            Ok(Some(codec))
        }
        Resilience::Replication { .. } => Ok(None),
    }
}

/// Checks the cluster file and the configured values a client cannot start without.
fn validate(cluster: &Cluster, config: &ClientConfig) -> Result<(), ClientError> {
    cluster.validate().map_err(ClientError::Config)?;
    if config.max_in_flight == 0 || config.max_in_flight > slots::MAX_SLOTS {
        return Err(ClientError::Config(format!(
            "max_in_flight is {}; it must be 1 to {} (page operations in flight at once)",
            config.max_in_flight,
            slots::MAX_SLOTS
        )));
    }
    Ok(())
}

/// Every node that answered must use the cluster file's slab size, and at least one coding
/// group's width of nodes must have answered.
fn check_outcomes(
    cluster: &Cluster,
    config: &ClientConfig,
    layout: &Layout,
    transport: &dyn Transport,
    outcomes: &[HelloOutcome],
) -> Result<(), ClientError> {
    let mut down = Vec::new();
    for (i, o) in outcomes.iter().enumerate() {
        let addr = || u16::try_from(i).map_or_else(|_| format!("node {i}"), |n| transport.addr(n));
        match o {
            Ok(h) if h.slab_size != cluster.slab_size => {
                return Err(ClientError::SlabSize {
                    node: i,
                    addr: addr(),
                    node_slab: h.slab_size,
                    file_slab: cluster.slab_size,
                })
            }
            Ok(_) => {}
            Err(e) if e.in_use => {
                return Err(ClientError::IdentityInUse {
                    node: i,
                    addr: addr(),
                })
            }
            Err(e) => down.push(format!("node {i} at {}: {e}", addr())),
        }
    }
    let up = outcomes.len() - down.len();
    if up < layout.width {
        return Err(ClientError::TooFewNodes {
            label: config.resilience.label(),
            needed: layout.width,
            up,
            total: outcomes.len(),
            down: if down.is_empty() {
                "none down".into()
            } else {
                down.join("; ")
            },
        });
    }
    Ok(())
}

/// The range map of an address space of `config.size`, every range unmapped. Slab tags name a
/// range with 32 bits, which bounds the number of ranges.
fn empty_ranges(
    config: &ClientConfig,
    layout: &Layout,
) -> Result<Box<[ArcSwapOption<Group>]>, ClientError> {
    let n_ranges = layout.space(config.size).div_ceil(layout.range_bytes());
    let n_ranges = u32::try_from(n_ranges)
        .ok()
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| {
            ClientError::Config(format!(
                "a remote address space of {} is {n_ranges} address ranges of {}; at most \
                 {} are possible: use a smaller size or larger slabs",
                human(config.size),
                human(layout.range_bytes()),
                u32::MAX
            ))
        })?;
    Ok((0..n_ranges).map(|_| ArcSwapOption::empty()).collect())
}

/// Asks every node that is up for its load (STATS) and this identity's slabs (LIST): the
/// groups of the ranges it holds and the newest version stored. Refuses slabs of another
/// layout, and slabs beyond the address space (connecting would strand them).
fn find_held(
    transport: &dyn Transport,
    config: &ClientConfig,
    layout: &Layout,
    n_ranges: usize,
) -> Result<Held, ClientError> {
    let mut held = Held {
        loads: vec![0; transport.nodes()],
        found: HashMap::new(),
        newest: 0,
        newest_of: HashMap::new(),
        superseded: Vec::new(),
    };
    let mut beyond: Option<u32> = None;
    for i in 0..held.loads.len() {
        let Ok(node) = u16::try_from(i) else { break };
        if !transport.is_up(node) {
            continue;
        }
        let stats = wire::Stats::parse(&transport.call(node, Op::Stats, &[])?)
            .map_err(|e| protocol(transport, node, e))?;
        held.loads[i] = stats.slabs.len() as u64;
        let list = wire::parse_list(&transport.call(node, Op::List, &[])?)
            .map_err(|e| protocol(transport, node, e))?;
        for wire::Listed { slab, tag, newest } in list {
            // Versions only grow: continue past everything this identity ever stored, even
            // if this machine's clock is behind the one that wrote it.
            held.newest = held.newest.max(newest);
            let Some((code, range, split)) = layout::untag(tag) else {
                continue;
            };
            if code != layout.code() {
                return Err(ClientError::LayoutMismatch {
                    node: i,
                    found: code,
                    expected: layout.code(),
                    label: config.resilience.label(),
                });
            }
            if range as usize >= n_ranges {
                beyond = beyond.max(Some(range));
            } else if (split as usize) < layout.width {
                held.adopt(range, split, (node, slab, newest));
            }
        }
    }
    match beyond {
        Some(range) => Err(ClientError::SmallerThanHeld {
            size: config.size,
            start: range as u64 * layout.range_bytes(),
            range,
        }),
        None => Ok(held),
    }
}

/// Maintenance: repair ranges that lost a member, release stale slabs of nodes that came
/// back. The thread holds only a weak reference and ends when the client is dropped.
fn start_maintenance(mem: &Arc<RemoteMemory>) -> Result<(), ClientError> {
    let weak = Arc::downgrade(mem);
    std::thread::Builder::new()
        .name("hm-maintain".into())
        .spawn(move || loop {
            std::thread::sleep(MAINTENANCE_INTERVAL);
            match weak.upgrade() {
                Some(mem) => {
                    mem.maintain();
                    if mem.audit_due() {
                        start_audit(&mem);
                    }
                }
                None => return,
            }
        })?;
    Ok(())
}

/// Runs an audit of every node's slabs on a thread of its own, holding the client only while
/// it asks one node (a client dropped meanwhile ends it).
fn start_audit(mem: &Arc<RemoteMemory>) {
    let weak = Arc::downgrade(mem);
    let nodes = mem.transport.nodes();
    let spawned = std::thread::Builder::new()
        .name("hm-audit".into())
        .spawn(move || {
            for node in 0..nodes {
                let (Some(mem), Ok(node)) = (weak.upgrade(), u16::try_from(node)) else {
                    return;
                };
                mem.audit_node(node);
            }
            if let Some(mem) = weak.upgrade() {
                mem.audit_done();
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the audit of the nodes' slabs; retrying later");
        mem.audit_done();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held() -> Held {
        Held {
            loads: vec![0; 4],
            found: HashMap::new(),
            newest: 0,
            newest_of: HashMap::new(),
            superseded: Vec::new(),
        }
    }

    #[test]
    fn of_two_slabs_for_one_split_the_newest_is_kept_and_the_others_superseded() {
        let mut h = held();
        h.adopt(0, 1, (2, 20, 5));
        h.adopt(0, 2, (3, 30, 9));
        assert!(h.superseded.is_empty());
        // Newer: replaces the first, which is superseded.
        h.adopt(0, 1, (1, 10, 7));
        // Older, then as new: the kept one stays.
        h.adopt(0, 1, (3, 31, 6));
        h.adopt(0, 1, (0, 40, 7));
        let g = &h.found[&0];
        assert_eq!((g.nodes[1], g.slabs[1]), (1, 10));
        assert_eq!((g.nodes[2], g.slabs[2]), (3, 30));
        assert_eq!(
            h.superseded,
            vec![(0, 1, 2, 20), (0, 1, 3, 31), (0, 1, 0, 40)]
        );
        assert_eq!(h.doubled(), vec![(0, 1)], "one regeneration per split");
    }
}
