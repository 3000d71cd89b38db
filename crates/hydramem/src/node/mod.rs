//! The memory node (the paper's Resource Monitor): donates part of its machine's memory to
//! clients in fixed-size slabs and serves split reads and writes on them.
//!
//! Invariants:
//! - at most `capacity / slab_size` slabs exist at once; ALLOC beyond that is refused with
//!   [`Status::NoCapacity`] and changes nothing;
//! - a slab is reachable only by the client identity that allocated it, on any connection that
//!   said HELLO with that identity (so a client that reconnects finds its slabs again);
//! - slab memory is zero when handed out (fresh anonymous mappings; a freed slab's mapping is
//!   dropped, never recycled with contents);
//! - a slab holds splits of one length fixed at ALLOC, each with the version of its page; a
//!   write never replaces a split with an older version (see `wire`, "Versions");
//! - every request is answered or the connection is closed; bad input never panics the node;
//! - a slab disappears only by its owner's FREE, after the node reclaimed it and its owner
//!   did not move it within the grace period (see [`control`]), or when its owner's lease ran
//!   out (no connection for the lease's time, see [`tenants`]);
//! - with a cluster key, a connection reaches slabs only after proving the key for this
//!   node (see [`crate::auth`]); an identity holds at most its quota of slabs.

pub mod control;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod limits;
mod memory;
pub mod regen;
pub mod server;
pub mod session;
mod slab;
pub mod tenants;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};

use crate::wire::{
    ClientId, CorruptCause, CorruptReport, Corruption, Listed, Notice, Reclaim, Stats, Status,
    MAX_SPLIT_LEN, PPM_ALL,
};
use control::{ControlConfig, MemorySample};
use memory::SlabMemory;
use slab::NO_DEADLINE;
pub use slab::{Landing, RunView, Slab};

/// Static configuration of one memory node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The node's id in its cluster (reported in HELLO and STATS).
    pub id: u32,
    /// Bytes the node may donate in total.
    pub capacity: u64,
    /// Size of every slab.
    pub slab_size: u64,
    /// Whether FAULT requests are obeyed (testing only; refused otherwise).
    pub allow_faults: bool,
    /// The cluster file: the members this node may read from when it regenerates a slab
    /// (REGEN names its sources by node id, never by address). Read at every REGEN, so a
    /// member added to the file is known without a restart; `None`: REGEN is refused.
    pub membership: Option<std::path::PathBuf>,
    /// The cluster key: connections must prove it (see [`crate::auth`]); `None`: anyone may
    /// connect, as before keys existed.
    pub key: Option<crate::auth::ClusterKey>,
    /// TLS: connections must be TLS with a certificate from the cluster CA, and the node's
    /// own connections to other nodes (regeneration) are (see [`crate::tls`]); `None`: plain
    /// TCP.
    pub tls: Option<crate::tls::Tls>,
    /// Quotas and leases of identities.
    pub tenancy: tenants::TenancyConfig,
}

/// Faults injected into a running node by FAULT requests (see [`crate::wire::Fault`]).
#[derive(Default)]
pub struct Faults {
    /// Microseconds every reply batch is held back.
    pub delay_us: AtomicU64,
    /// Whether requests are left unanswered.
    pub stopped: Mutex<bool>,
    /// Signalled when `stopped` is cleared.
    pub resumed: parking_lot::Condvar,
    /// Whether ALLOC is refused.
    pub refuse_alloc: std::sync::atomic::AtomicBool,
    /// Bit flips in stored splits after writes ([`Corruption::encode`]; 0 = off).
    pub corrupt_writes: AtomicU64,
    /// Bit flips in READV reply data.
    pub corrupt_replies: AtomicU64,
    /// READV entries answered with the neighbouring slot's split.
    pub misdirect_reads: AtomicU64,
}

impl Faults {
    /// Whether this access of `slab` is hit by the corruption stored in `which`. One relaxed
    /// load when the corruption is off, which it is unless a test turned it on.
    pub fn hits(which: &AtomicU64, slab: u32) -> bool {
        let arg = which.load(Ordering::Relaxed);
        arg != 0
            && Corruption::decode(arg).is_ok_and(|c| c.hits(slab, rand::random_range(0..PPM_ALL)))
    }

    /// Turns every corruption off.
    pub fn clear_corruption(&self) {
        for c in [
            &self.corrupt_writes,
            &self.corrupt_replies,
            &self.misdirect_reads,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }
}

/// Flips one random bit of `buf` (injected corruption).
pub fn flip_random_bit(buf: &mut [u8]) {
    if !buf.is_empty() {
        let bit = rand::random_range(0..buf.len() * 8);
        buf[bit / 8] ^= 1 << (bit % 8);
    }
}

/// Errors that prevent a node from starting.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The configuration cannot work.
    #[error("invalid node configuration: {0}")]
    Config(String),
    /// Binding or accepting failed.
    #[error("network error on {what}: {source}")]
    Io {
        /// What the node was doing.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The state of a memory node, shared by all its connections.
pub struct Node {
    config: NodeConfig,
    slabs: RwLock<BTreeMap<u32, Arc<Slab>>>,
    /// Serializes allocation so that the capacity check and the insert are one step.
    alloc: Mutex<u32>,
    clients: AtomicU32,
    /// Injected faults (inert unless `config.allow_faults`).
    pub faults: Faults,
    /// Regenerations running now.
    pub(crate) regenerating: AtomicU32,
    /// Pages rebuilt by regenerations so far.
    pub(crate) regen_pages: AtomicU64,
    /// Start of the node's clock for reclaim deadlines.
    epoch: Instant,
    /// Slabs the node may hold (see [`control`]); `max_slabs` until the first control step.
    budget: AtomicU64,
    /// Pre-allocated slab memory ready to hand out.
    pool: Mutex<Vec<SlabMemory>>,
    /// Draining: no new slabs, every slab reclaimed.
    draining: AtomicBool,
    /// Slabs reclaimed and still here (changed only under the `slabs` write lock).
    reclaiming: AtomicU32,
    evicted_moved: AtomicU64,
    evicted_forced: AtomicU64,
    /// Corrupted splits clients reported, all slabs (see [`Node::report_corrupt`]).
    corrupt_reported: AtomicU64,
    /// Last measurement: total, available, headroom.
    mem: Mutex<(u64, u64, u64)>,
    /// Simulated memory measurements (fault injection).
    pub simulated: control::Simulated,
    /// Random per process start (HELLO reply): tells clients the node restarted.
    incarnation: u64,
    /// This node's credential, from the cluster key (see [`crate::auth`]).
    credential: Option<crate::auth::NodeCredential>,
    /// Identities, their connections and leases.
    tenants: tenants::Tenants,
    /// The members etcd listed last (see [`crate::membership::register`]): regeneration
    /// sources the cluster file does not list are looked up here.
    listed: RwLock<Vec<crate::cluster::NodeEntry>>,
}

impl Node {
    /// Validates the configuration and creates an empty node.
    pub fn new(config: NodeConfig) -> Result<Arc<Node>, NodeError> {
        if config.slab_size == 0 || !config.slab_size.is_multiple_of(4096) {
            return Err(NodeError::Config(format!(
                "slab size {} must be a positive multiple of 4096",
                config.slab_size
            )));
        }
        if config.capacity < config.slab_size {
            return Err(NodeError::Config(format!(
                "capacity {} is smaller than one slab ({}); give --capacity at least the slab size",
                config.capacity, config.slab_size
            )));
        }
        Ok(Arc::new(Node {
            slabs: RwLock::new(BTreeMap::new()),
            // Slab ids start at random, so that ids a client still holds from an earlier
            // incarnation of this node are very unlikely to name a slab of this one.
            alloc: Mutex::new(rand::random::<u32>() >> 1),
            clients: AtomicU32::new(0),
            faults: Faults::default(),
            regenerating: AtomicU32::new(0),
            regen_pages: AtomicU64::new(0),
            epoch: Instant::now(),
            budget: AtomicU64::new(config.capacity / config.slab_size),
            pool: Mutex::new(Vec::new()),
            draining: AtomicBool::new(false),
            reclaiming: AtomicU32::new(0),
            evicted_moved: AtomicU64::new(0),
            evicted_forced: AtomicU64::new(0),
            corrupt_reported: AtomicU64::new(0),
            mem: Mutex::new((0, 0, 0)),
            simulated: control::Simulated::new(),
            incarnation: rand::random::<u64>() | 1,
            credential: config.key.as_ref().map(|k| k.node_credential(config.id)),
            tenants: tenants::Tenants::new(config.tenancy),
            listed: RwLock::new(Vec::new()),
            config,
        }))
    }

    /// This process start's incarnation (never 0).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The node's configuration.
    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// This node's credential, if it has a cluster key.
    pub fn credential(&self) -> Option<&crate::auth::NodeCredential> {
        self.credential.as_ref()
    }

    /// The slab size as a mapping length (the configuration is validated at start).
    fn slab_bytes(&self) -> Result<usize, Status> {
        usize::try_from(self.config.slab_size).map_err(|_| Status::Internal)
    }

    /// Most slabs the node hands out at once.
    pub fn max_slabs(&self) -> u64 {
        self.config.capacity / self.config.slab_size
    }

    /// Allocates a zeroed slab owned by `owner` for splits of `split_len` bytes.
    pub fn alloc(&self, owner: ClientId, tag: u64, split_len: u32) -> Result<u32, Status> {
        if split_len == 0 || split_len > MAX_SPLIT_LEN || split_len as u64 > self.config.slab_size {
            return Err(Status::BadRequest);
        }
        let mut next = self.alloc.lock();
        let refused = self.faults.refuse_alloc.load(Ordering::Relaxed)
            || self.draining.load(Ordering::Relaxed);
        let held = self.slabs.read().len() as u64;
        if refused || held >= self.max_slabs() || held >= self.budget.load(Ordering::Relaxed) {
            metrics::counter!("hydramem_node_alloc_refused_total").increment(1);
            return Err(Status::NoCapacity);
        }
        let quota = self.config.tenancy.quota;
        if quota > 0 && self.held_by(&owner) >= quota {
            metrics::counter!("hydramem_node_alloc_over_quota_total").increment(1);
            tracing::warn!(
                ?owner,
                quota,
                "ALLOC refused: the identity holds its quota of slabs"
            );
            return Err(Status::OverQuota);
        }
        let mapping_failed = |e: std::io::Error| {
            tracing::error!(error = %e, "mapping a slab failed");
            Status::Internal
        };
        let pooled = self.pool.lock().pop();
        let memory = match pooled {
            Some(m) => m,
            None => SlabMemory::new(self.slab_bytes()?).map_err(mapping_failed)?,
        };
        let slab = Slab::new(owner, tag, u64::from(split_len), memory).map_err(mapping_failed)?;
        let mut slabs = self.slabs.write();
        // Ids count up from a random start and wrap; past the wrap, one still in use is
        // skipped (at most `max_slabs` are), so an id never names two slabs.
        let mut id = *next;
        while slabs.contains_key(&id) {
            id = id.wrapping_add(1);
        }
        *next = id.wrapping_add(1);
        slabs.insert(id, Arc::new(slab));
        drop(slabs);
        metrics::counter!("hydramem_node_slabs_allocated_total").increment(1);
        tracing::debug!(slab = id, ?owner, tag, "slab allocated");
        Ok(id)
    }

    /// Slabs `owner` holds.
    fn held_by(&self, owner: &ClientId) -> u64 {
        self.slabs
            .read()
            .values()
            .filter(|s| s.owner == *owner)
            .count() as u64
    }

    /// The slab `id` if `owner` owns it. Absent and foreign slabs are indistinguishable.
    pub fn slab(&self, owner: &ClientId, id: u32) -> Result<Arc<Slab>, Status> {
        match self.slabs.read().get(&id) {
            Some(s) if s.owner == *owner => Ok(s.clone()),
            _ => Err(Status::NoSuchSlab),
        }
    }

    /// Releases a slab of `owner`; its memory is unmapped once the last in-flight access ends.
    pub fn free(&self, owner: &ClientId, id: u32) -> Result<(), Status> {
        let mut slabs = self.slabs.write();
        match slabs.get(&id) {
            Some(s) if s.owner == *owner => {
                if s.reclaimed() {
                    self.reclaiming.fetch_sub(1, Ordering::Relaxed);
                    self.evicted_moved.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!("hydramem_node_evictions_total", "how" => "moved")
                        .increment(1);
                    tracing::info!(slab = id, "reclaimed slab moved away by its owner");
                }
                slabs.remove(&id);
                metrics::counter!("hydramem_node_slabs_freed_total").increment(1);
                Ok(())
            }
            _ => Err(Status::NoSuchSlab),
        }
    }

    /// Gives back the memory of slots `first..first + n` of `owner`'s slab `id` (DISCARD).
    pub fn discard(&self, owner: &ClientId, id: u32, first: u64, n: u64) -> Result<(), Status> {
        self.slab(owner, id)?.discard(first, n)?;
        metrics::counter!("hydramem_node_slots_discarded_total").increment(n);
        Ok(())
    }

    /// Every slab `owner` holds, with its tag and the newest version stored in it.
    pub fn list(&self, owner: &ClientId) -> Vec<Listed> {
        self.slabs
            .read()
            .iter()
            .filter(|(_, s)| s.owner == *owner)
            .map(|(id, s)| Listed {
                slab: *id,
                tag: s.tag,
                newest: s.newest(),
            })
            .collect()
    }

    /// What to tell `owner` in a heartbeat reply.
    pub fn notice_for(&self, owner: &ClientId) -> Notice {
        let held = self.slabs.read().len() as u64;
        let refusing =
            self.draining.load(Ordering::Relaxed) || held >= self.budget.load(Ordering::Relaxed);
        let reclaimed = if self.reclaiming.load(Ordering::Relaxed) == 0 {
            0
        } else {
            self.slabs
                .read()
                .values()
                .filter(|s| s.owner == *owner && s.reclaimed())
                .count() as u32
        };
        Notice {
            reclaimed,
            refusing,
            slabs: Some(held.min(u32::MAX as u64 - 1) as u32),
        }
    }

    /// The reclaimed slabs of `owner`, with the time left before they are dropped.
    pub fn reclaims_for(&self, owner: &ClientId) -> Vec<Reclaim> {
        let now = self.now_ms();
        self.slabs
            .read()
            .iter()
            .filter(|(_, s)| s.owner == *owner && s.reclaimed())
            .map(|(id, s)| Reclaim {
                slab: *id,
                ms_left: match s.reclaim.load(Ordering::Relaxed) {
                    NO_DEADLINE => u32::MAX,
                    d => (d - 1).saturating_sub(now).min(u32::MAX as u64 - 1) as u32,
                },
            })
            .collect()
    }

    /// Whether the node is draining.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Records the members etcd lists (regeneration sources).
    pub fn set_listed(&self, members: Vec<crate::cluster::NodeEntry>) {
        *self.listed.write() = members;
    }

    /// The address of member `id` as etcd listed it last.
    pub fn listed_addr(&self, id: u32) -> Option<std::net::SocketAddr> {
        self.listed
            .read()
            .iter()
            .find(|n| n.id == id)
            .map(|n| n.addr)
    }

    /// Starts draining (no new slabs; every slab reclaimed without deadline, so that each
    /// owner moves its slabs away and nothing is dropped) or cancels it.
    pub fn drain(&self, start: bool) {
        let _g = self.alloc.lock();
        let slabs = self.slabs.write();
        self.draining.store(start, Ordering::Relaxed);
        for s in slabs.values() {
            let r = s.reclaim.load(Ordering::Relaxed);
            if start && r != NO_DEADLINE {
                if r == 0 {
                    self.reclaiming.fetch_add(1, Ordering::Relaxed);
                }
                s.reclaim.store(NO_DEADLINE, Ordering::Relaxed);
            } else if !start && r == NO_DEADLINE {
                s.reclaim.store(0, Ordering::Relaxed);
                self.reclaiming.fetch_sub(1, Ordering::Relaxed);
            }
        }
        drop(slabs);
        if start {
            self.pool.lock().clear();
        }
        tracing::warn!(
            draining = start,
            slabs = self.reclaiming.load(Ordering::Relaxed),
            "{}",
            if start {
                "draining: owners are moving every slab away"
            } else {
                "drain cancelled"
            }
        );
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// One step of memory management (see [`control`]) for a fresh measurement.
    pub fn control_step(&self, sample: MemorySample, cfg: &ControlConfig) {
        let slab_size = self.config.slab_size;
        let _g = self.alloc.lock();
        // Activity: halve, add the accesses since the last step.
        let (mapped, resident) = {
            let slabs = self.slabs.read();
            let mut resident = 0;
            for s in slabs.values() {
                let acc = s.accesses();
                let delta = acc.saturating_sub(s.last_accesses.swap(acc, Ordering::Relaxed));
                let a = s.activity.load(Ordering::Relaxed);
                s.activity.store(a / 2 + delta, Ordering::Relaxed);
                resident += s.resident();
            }
            (slabs.len() as u64, resident)
        };
        let mut pool = self.pool.lock();
        let ours = resident + pool.len() as u64 * slab_size;
        let sample = self.simulated.apply(sample, ours);
        let b = control::budget(sample, cfg.headroom, ours, slab_size, self.max_slabs());
        self.budget.store(b.slabs, Ordering::Relaxed);
        *self.mem.lock() = (sample.total, sample.available, b.headroom);
        metrics::gauge!("hydramem_node_memory_total_bytes").set(sample.total as f64);
        metrics::gauge!("hydramem_node_memory_available_bytes").set(sample.available as f64);
        metrics::gauge!("hydramem_node_budget_slabs").set(b.slabs as f64);
        // Pre-allocation within the budget; release beyond it (pooled slabs hold no data).
        let want = if self.draining.load(Ordering::Relaxed) {
            0
        } else {
            (cfg.prealloc as u64).min(b.slabs.saturating_sub(mapped))
        };
        while pool.len() as u64 > want {
            pool.pop();
            metrics::counter!("hydramem_node_pool_released_total").increment(1);
        }
        let refill = want.saturating_sub(pool.len() as u64);
        metrics::gauge!("hydramem_node_pool_slabs").set(pool.len() as f64);
        drop(pool);
        // Batch eviction: reclaim the E least active of E + E' random candidates.
        let now = self.now_ms();
        let mut slabs = self.slabs.write();
        let staying: Vec<(u32, u64)> = slabs
            .iter()
            .filter(|(_, s)| !s.reclaimed())
            .map(|(id, s)| (*id, s.activity.load(Ordering::Relaxed)))
            .collect();
        let excess = (staying.len() as u64).saturating_sub(b.slabs) as usize;
        if excess > 0 {
            let mut cands = staying;
            let sample_n = (excess + cfg.evict_extra).min(cands.len());
            let mut rng = rand::rng();
            for i in 0..sample_n {
                let j = rand::Rng::random_range(&mut rng, i..cands.len());
                cands.swap(i, j);
            }
            cands.truncate(sample_n);
            cands.sort_by_key(|(_, activity)| *activity);
            let deadline = now + cfg.grace.as_millis() as u64 + 1;
            for (id, activity) in cands.into_iter().take(excess) {
                slabs[&id].reclaim.store(deadline, Ordering::Relaxed);
                self.reclaiming.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("hydramem_node_reclaims_total").increment(1);
                tracing::warn!(
                    slab = id,
                    activity,
                    grace = ?cfg.grace,
                    available = sample.available,
                    headroom = b.headroom,
                    "memory pressure: reclaiming a slab; its owner is asked to move it"
                );
            }
        }
        // Reclaimed slabs whose grace expired go now.
        let expired: Vec<u32> = slabs
            .iter()
            .filter(|(_, s)| {
                let d = s.reclaim.load(Ordering::Relaxed);
                d != 0 && d != NO_DEADLINE && d - 1 <= now
            })
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            slabs.remove(&id);
            self.reclaiming.fetch_sub(1, Ordering::Relaxed);
            self.evicted_forced.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("hydramem_node_evictions_total", "how" => "forced").increment(1);
            tracing::warn!(
                slab = id,
                "evicted a reclaimed slab its owner did not move in time; its range has one \
                 failure less of margin until the owner repairs it"
            );
        }
        metrics::gauge!("hydramem_node_reclaiming_slabs")
            .set(self.reclaiming.load(Ordering::Relaxed) as f64);
        drop(slabs);
        drop(_g);
        self.refill_pool(refill);
        self.expire_leases(Instant::now());
    }

    /// Frees every slab of the identities whose lease ran out by `now` (see [`tenants`]).
    pub fn expire_leases(&self, now: Instant) {
        for (owner, lease) in self.tenants.expired(now) {
            let mut slabs = self.slabs.write();
            let before = slabs.len();
            slabs.retain(|_, s| {
                let mine = s.owner == owner;
                if mine && s.reclaimed() {
                    self.reclaiming.fetch_sub(1, Ordering::Relaxed);
                }
                !mine
            });
            let freed = before - slabs.len();
            drop(slabs);
            if freed > 0 {
                metrics::counter!("hydramem_node_lease_expired_slabs_total")
                    .increment(freed as u64);
                tracing::warn!(
                    ?owner,
                    slabs = freed,
                    ?lease,
                    "an identity's lease ran out (no connection for its lease): its slabs are freed"
                );
            }
        }
        let (tracked, connected) = self.tenants.counts();
        metrics::gauge!("hydramem_node_identities").set(tracked as f64);
        metrics::gauge!("hydramem_node_identities_connected").set(connected as f64);
    }

    /// Maps and backs `n` slabs ahead of their ALLOC and pools them, outside every lock: a
    /// 64 MiB slab takes milliseconds of page faults, which an ALLOC must not wait behind
    /// (the control thread runs at background priority, see [`crate::priority`]).
    fn refill_pool(&self, n: u64) {
        for _ in 0..n {
            let made = self
                .slab_bytes()
                .map_err(|_| std::io::Error::other("slab size"))
                .and_then(SlabMemory::new);
            match made {
                Ok(mut m) => {
                    m.populate();
                    let mut pool = self.pool.lock();
                    pool.push(m);
                    metrics::gauge!("hydramem_node_pool_slabs").set(pool.len() as f64);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot pre-allocate a slab");
                    break;
                }
            }
        }
    }

    fn tenancy_stats(&self) -> crate::wire::TenancyStats {
        let t = self.tenants.config();
        let (identities, connected) = self.tenants.counts();
        let secs = |d: std::time::Duration| u32::try_from(d.as_secs()).unwrap_or(u32::MAX);
        crate::wire::TenancyStats {
            keyed: self.credential.is_some(),
            quota: t.quota,
            lease_s: secs(t.lease),
            kept_lease_s: secs(t.kept_lease),
            identities: u32::try_from(identities).unwrap_or(u32::MAX),
            connected: u32::try_from(connected).unwrap_or(u32::MAX),
        }
    }

    /// Capacity, use and per-slab counters.
    pub fn stats(&self) -> Stats {
        let (mem_total, mem_available, headroom) = *self.mem.lock();
        Stats {
            mem_total,
            mem_available,
            headroom,
            budget_slabs: self.budget.load(Ordering::Relaxed).min(u32::MAX as u64) as u32,
            pool_slabs: self.pool.lock().len() as u32,
            draining: self.draining.load(Ordering::Relaxed),
            reclaiming: self.reclaiming.load(Ordering::Relaxed),
            evicted_moved: self.evicted_moved.load(Ordering::Relaxed),
            evicted_forced: self.evicted_forced.load(Ordering::Relaxed),
            corrupt_reported: self.corrupt_reported.load(Ordering::Relaxed),
            node_id: self.config.id,
            capacity: self.config.capacity,
            slab_size: self.config.slab_size,
            rss: resident_bytes(),
            clients: self.clients.load(Ordering::Relaxed),
            regenerating: self.regenerating.load(Ordering::Relaxed),
            regen_pages: self.regen_pages.load(Ordering::Relaxed),
            tenancy: self.tenancy_stats(),
            slabs: self
                .slabs
                .read()
                .iter()
                .map(|(id, s)| s.stats(*id))
                .collect(),
        }
    }

    /// Injected corruption at rest in slab `id`, whoever owns it: one bit flipped in every
    /// written split. Returns how many splits were hit.
    pub fn corrupt_slab(&self, id: u32) -> Result<u64, Status> {
        let slab = self.slabs.read().get(&id).cloned();
        Ok(slab.ok_or(Status::NoSuchSlab)?.corrupt_written())
    }

    /// Counts the corrupted splits `owner` reports having read from this node: each record in
    /// the node-wide count, and in its slab's count if the slab is `owner`'s (otherwise as an
    /// unknown slab; see [`crate::wire::CorruptReport`]). Logs one warning per report, however
    /// many splits it names, so that a client meeting much corruption cannot flood the log.
    /// Returns the records that named a slab of `owner`.
    pub fn report_corrupt(&self, owner: &ClientId, reports: &[CorruptReport]) -> u32 {
        let (mut accepted, mut unknown) = (0u32, 0u64);
        let mut by_cause = [0u64; CorruptCause::ALL.len()];
        let at = |c: CorruptCause| {
            CorruptCause::ALL
                .iter()
                .position(|x| *x == c)
                .expect("in ALL")
        };
        {
            let slabs = self.slabs.read();
            for c in reports {
                let splits = u64::from(c.splits);
                match slabs.get(&c.slab) {
                    Some(s) if s.owner == *owner => {
                        s.corrupt.fetch_add(splits, Ordering::Relaxed);
                        accepted += 1;
                    }
                    _ => unknown += splits,
                }
                by_cause[at(c.cause)] += splits;
            }
        }
        let total: u64 = by_cause.iter().sum();
        self.corrupt_reported.fetch_add(total, Ordering::Relaxed);
        for (cause, n) in CorruptCause::ALL.into_iter().zip(by_cause) {
            if n > 0 {
                metrics::counter!(
                    "hydramem_node_corrupt_splits_reported_total",
                    "cause" => cause.label()
                )
                .increment(n);
            }
        }
        if total > 0 {
            tracing::warn!(
                client = ?owner,
                splits = total,
                checksum = by_cause[at(CorruptCause::Checksum)],
                codeword = by_cause[at(CorruptCause::Codeword)],
                slabs = reports.len(),
                unknown_slab_splits = unknown,
                "a client read corrupted splits from this node (its memory or its network \
                 flipped bits, or it answered for the wrong page); see hydramem status"
            );
        }
        accepted
    }

    /// A connection of `owner`'s `instance` is identified (not an observer's); `kept` if it
    /// said so. Refused if the identity holds as many connections as it may, or another
    /// instance holds it (nothing counted then).
    pub(crate) fn client_connected(
        &self,
        owner: ClientId,
        kept: bool,
        instance: u64,
    ) -> Result<(), tenants::Refusal> {
        self.tenants.connected(owner, kept, instance)?;
        self.clients.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// That connection closed.
    pub(crate) fn client_disconnected(&self, owner: ClientId) {
        self.clients.fetch_sub(1, Ordering::Relaxed);
        self.tenants.disconnected(owner, Instant::now());
    }
}

/// Resident set size of this process, from /proc/self/statm (0 where unavailable).
pub fn resident_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * page.max(0) as u64
}

/// A node of the unit tests: id 3, room for `slabs` slabs of 64 KiB, no key, no faults.
#[cfg(test)]
pub(crate) fn test_node(slabs: u64) -> Arc<Node> {
    Node::new(NodeConfig {
        id: 3,
        capacity: slabs * 65536,
        slab_size: 65536,
        allow_faults: false,
        membership: None,
        key: None,
        tls: None,
        tenancy: Default::default(),
    })
    .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(slabs: u64) -> Arc<Node> {
        test_node(slabs)
    }

    #[test]
    fn capacity_is_enforced_and_freed_slabs_make_room() {
        let n = node(2);
        let a = ClientId::random();
        let s0 = n.alloc(a, 0, 512).unwrap();
        n.alloc(a, 1, 512).unwrap();
        assert_eq!(n.alloc(a, 2, 512), Err(Status::NoCapacity));
        n.free(&a, s0).unwrap();
        n.alloc(a, 2, 512).unwrap();
    }

    #[test]
    fn slab_ids_skip_those_in_use_when_they_wrap() {
        let n = node(4);
        let a = ClientId::random();
        *n.alloc.lock() = u32::MAX;
        let last = n.alloc(a, 0, 512).unwrap();
        let first = n.alloc(a, 1, 512).unwrap();
        assert_eq!((last, first), (u32::MAX, 0));
        n.slab(&a, first).unwrap().write(0, &[9; 512], 1).unwrap();
        // The counter comes round to ids still held: they are skipped, the slabs kept.
        *n.alloc.lock() = u32::MAX;
        let next = n.alloc(a, 2, 512).unwrap();
        assert_eq!(next, 1);
        let mut b = [0u8; 512];
        n.slab(&a, first).unwrap().read(0, &mut b).unwrap();
        assert_eq!(b, [9; 512], "slab 0 was not replaced");
        assert_eq!(n.list(&a).len(), 3);
    }

    #[test]
    fn slabs_are_private_to_their_owner() {
        let n = node(4);
        let (a, b) = (ClientId::random(), ClientId::random());
        let s = n.alloc(a, 7, 512).unwrap();
        n.slab(&a, s).unwrap().write(0, &[9; 512], 1).unwrap();
        assert!(matches!(n.slab(&b, s), Err(Status::NoSuchSlab)));
        assert_eq!(n.free(&b, s), Err(Status::NoSuchSlab));
        assert_eq!(
            n.list(&a),
            vec![Listed {
                slab: s,
                tag: 7,
                newest: 1
            }]
        );
        assert!(n.list(&b).is_empty());
        // A new slab for b is zeroed even though a wrote into memory before.
        n.free(&a, s).unwrap();
        let s2 = n.alloc(b, 0, 512).unwrap();
        let mut buf = [1u8; 512];
        assert_eq!(n.slab(&b, s2).unwrap().read(0, &mut buf), Ok(0));
        assert_eq!(buf, [0; 512]);
    }

    #[test]
    fn counters_follow_accesses() {
        let n = node(1);
        let a = ClientId::random();
        let id = n.alloc(a, 0, 512).unwrap();
        let s = n.slab(&a, id).unwrap();
        s.write(512, &[1; 512], 7).unwrap();
        let mut b = [0u8; 512];
        assert_eq!(s.read(512, &mut b), Ok(7));
        assert_eq!(s.read(65536, &mut b), Err(Status::OutOfRange));
        assert_eq!(s.read(100, &mut b), Err(Status::BadRequest));
        // Older versions never replace newer ones; an equal one is a no-op.
        assert_eq!(s.write(512, &[2; 512], 6), Err(Status::Stale));
        assert_eq!(s.write(512, &[3; 512], 7), Ok(()));
        assert_eq!(s.read(512, &mut b), Ok(7));
        assert_eq!(b, [1; 512]);
        s.write(512, &[4; 512], 8).unwrap();
        assert_eq!(s.read(512, &mut b), Ok(8));
        assert_eq!(b, [4; 512]);
        let st = n.stats();
        assert_eq!(st.slabs[0].writes, 2);
        assert_eq!(st.slabs[0].reads, 3);
        assert_eq!(st.slabs[0].held, 512, "one slot of 512 bytes holds data");
        assert_eq!(st.used(), 65536);
    }

    /// A node of 64 slabs of 1 MiB.
    fn mib_node() -> Arc<Node> {
        Node::new(NodeConfig {
            id: 1,
            capacity: 64 << 20,
            slab_size: 1 << 20,
            allow_faults: true,
            membership: None,
            key: None,
            tls: None,
            tenancy: Default::default(),
        })
        .unwrap()
    }

    /// A simulated machine of 100 MiB with `avail` MiB available.
    fn pressure(n: &Node, avail: u64) -> MemorySample {
        n.simulated.total.store(100 << 20, Ordering::Relaxed);
        n.simulated.available.store(avail << 20, Ordering::Relaxed);
        MemorySample {
            total: 0,
            available: 0,
        }
    }

    fn cfg(prealloc: usize, evict_extra: usize) -> ControlConfig {
        ControlConfig {
            prealloc,
            evict_extra,
            ..ControlConfig::default()
        }
    }

    fn reclaimed(n: &Node) -> Vec<u32> {
        n.stats()
            .slabs
            .iter()
            .filter(|s| s.flags & crate::wire::SLAB_RECLAIMED != 0)
            .map(|s| s.slab)
            .collect()
    }

    #[test]
    fn the_budget_limits_allocation_and_the_pool_fills_within_it() {
        let n = mib_node();
        let a = ClientId::random();
        // 30 MiB available, 25 MiB headroom: a budget of 5 slabs, 2 of them pre-allocated.
        n.control_step(pressure(&n, 30), &cfg(2, 2));
        let st = n.stats();
        assert_eq!((st.budget_slabs, st.pool_slabs), (5, 2));
        assert_eq!(st.headroom, 25 << 20);
        // Pooled memory is what ALLOC hands out (zeroed), and it is not refilled beyond
        // the budget.
        for t in 0..5 {
            n.alloc(a, t, 512).unwrap();
        }
        assert_eq!(n.stats().pool_slabs, 0);
        assert_eq!(n.alloc(a, 9, 512), Err(Status::NoCapacity));
        assert!(n.notice_for(&a).refusing);
        let id = n.list(&a)[0].slab;
        let mut buf = [1u8; 512];
        n.slab(&a, id).unwrap().read(0, &mut buf).unwrap();
        assert_eq!(buf, [0; 512]);
        // The pooled slabs counted as ours: more room again once memory frees up.
        n.control_step(pressure(&n, 40), &cfg(2, 2));
        assert_eq!(n.stats().budget_slabs, 15);
        assert_eq!(n.stats().pool_slabs, 2);
        assert!(!n.notice_for(&a).refusing);
    }

    #[test]
    fn pressure_releases_the_pool_first_then_reclaims_the_least_active() {
        let n = mib_node();
        let (a, b) = (ClientId::random(), ClientId::random());
        n.control_step(pressure(&n, 60), &cfg(1, 8));
        let ids: Vec<u32> = (0..6)
            .map(|t| n.alloc(if t < 3 { a } else { b }, t, 512).unwrap())
            .collect();
        // Accesses: slab i gets 10 * i reads, so slabs 0 and 1 are the least active.
        for (i, id) in ids.iter().enumerate() {
            let s = n.slab(if i < 3 { &a } else { &b }, *id).unwrap();
            s.write(0, &[1; 512], 1).unwrap();
            let mut buf = [0u8; 512];
            for _ in 0..10 * i {
                s.read(0, &mut buf).unwrap();
            }
        }
        n.control_step(pressure(&n, 60), &cfg(1, 8));
        assert_eq!(n.stats().pool_slabs, 1);
        // Budget (29 − 25) MiB: the pool goes first, then 2 of the 6 slabs are reclaimed.
        n.control_step(pressure(&n, 29), &cfg(1, 8));
        let st = n.stats();
        assert_eq!(st.pool_slabs, 0);
        assert_eq!(st.budget_slabs, 4);
        assert_eq!(reclaimed(&n), vec![ids[0], ids[1]]);
        assert_eq!(st.reclaiming, 2);
        // Each owner hears of its own reclaimed slabs only.
        assert_eq!(n.notice_for(&a).reclaimed, 2);
        assert_eq!(n.notice_for(&b).reclaimed, 0);
        let list = n.reclaims_for(&a);
        assert_eq!(list.len(), 2);
        assert!(list
            .iter()
            .all(|c| c.ms_left > 20_000 && c.ms_left <= 30_000));
        // Reclaimed slabs still serve; the same pressure reclaims no more.
        let mut buf = [0u8; 512];
        assert_eq!(n.slab(&a, ids[0]).unwrap().read(0, &mut buf), Ok(1));
        n.control_step(pressure(&n, 29), &cfg(1, 8));
        assert_eq!(n.stats().reclaiming, 2);
        // The owner moves one away; the other's grace expires and the node drops it.
        n.free(&a, ids[0]).unwrap();
        let expired = ControlConfig {
            grace: std::time::Duration::ZERO,
            ..cfg(1, 8)
        };
        n.slabs.read()[&ids[1]].reclaim.store(1, Ordering::Relaxed);
        n.control_step(pressure(&n, 29), &expired);
        let st = n.stats();
        assert_eq!(
            (st.evicted_moved, st.evicted_forced, st.reclaiming),
            (1, 1, 0)
        );
        assert_eq!(st.slabs.len(), 4);
        assert!(n.slab(&a, ids[1]).is_err());
    }

    #[test]
    fn eviction_picks_the_least_active_among_e_plus_e_prime_sampled() {
        // With E' = 0 the E candidates are random; with E' covering every slab the choice is
        // exactly the least active. Over many trials with E' = 0, some active slab is chosen.
        let mut saw_active = false;
        for _ in 0..30 {
            let n = Node::new(NodeConfig {
                id: 1,
                capacity: 64 << 20,
                slab_size: 1 << 20,
                allow_faults: true,
                membership: None,
                key: None,
                tls: None,
                tenancy: Default::default(),
            })
            .unwrap();
            let a = ClientId::random();
            let ids: Vec<u32> = (0..4).map(|t| n.alloc(a, t, 512).unwrap()).collect();
            for (i, id) in ids.iter().enumerate().skip(1) {
                let s = n.slab(&a, *id).unwrap();
                let mut buf = [0u8; 512];
                for _ in 0..i {
                    s.read(0, &mut buf).unwrap();
                }
            }
            // Budget 3: one slab over.
            n.control_step(pressure(&n, 28), &cfg(0, 0));
            let r = reclaimed(&n);
            assert_eq!(r.len(), 1);
            saw_active |= r[0] != ids[0];
        }
        assert!(saw_active, "E' = 0 should sample at random");
        let n = mib_node();
        let a = ClientId::random();
        let ids: Vec<u32> = (0..4).map(|t| n.alloc(a, t, 512).unwrap()).collect();
        for (i, id) in ids.iter().enumerate() {
            let s = n.slab(&a, *id).unwrap();
            let mut buf = [0u8; 512];
            for _ in 0..(4 - i) {
                s.read(0, &mut buf).unwrap();
            }
        }
        n.control_step(pressure(&n, 28), &cfg(0, 3));
        assert_eq!(reclaimed(&n), vec![ids[3]]);
    }

    #[test]
    fn drain_reclaims_everything_without_deadline_and_can_be_cancelled() {
        let n = node(8);
        let a = ClientId::random();
        let ids: Vec<u32> = (0..3).map(|t| n.alloc(a, t, 512).unwrap()).collect();
        n.drain(true);
        assert_eq!(n.alloc(a, 5, 512), Err(Status::NoCapacity));
        let notice = n.notice_for(&a);
        assert!(notice.refusing);
        assert_eq!(notice.reclaimed, 3);
        assert!(n.reclaims_for(&a).iter().all(|c| c.ms_left == u32::MAX));
        // No deadline: a control step never drops them, whatever the grace.
        let now = ControlConfig {
            grace: std::time::Duration::ZERO,
            ..cfg(0, 0)
        };
        n.control_step(
            MemorySample {
                total: 1 << 40,
                available: 1 << 39,
            },
            &now,
        );
        assert_eq!(n.stats().slabs.len(), 3);
        n.free(&a, ids[0]).unwrap();
        n.drain(false);
        let st = n.stats();
        assert!(!st.draining);
        assert_eq!((st.reclaiming, st.evicted_moved), (0, 1));
        assert!(reclaimed(&n).is_empty());
        n.alloc(a, 6, 512).unwrap();
    }

    #[test]
    fn injected_corruption_flips_one_bit_and_keeps_versions() {
        let n = node(2);
        let a = ClientId::random();
        let id = n.alloc(a, 0, 512).unwrap();
        let s = n.slab(&a, id).unwrap();
        let bits = |b: &[u8], v: u8| b.iter().map(|x| (x ^ v).count_ones()).sum::<u32>();
        for slot in 0..3u64 {
            s.write(slot * 512, &[slot as u8; 512], 10 + slot).unwrap();
        }
        // At rest: every written split (and only those) loses one bit.
        assert_eq!(n.corrupt_slab(id), Ok(3));
        assert_eq!(n.corrupt_slab(id ^ 1), Err(Status::NoSuchSlab));
        let mut b = [0u8; 512];
        for slot in 0..3u64 {
            assert_eq!(s.read(slot * 512, &mut b), Ok(10 + slot));
            assert_eq!(bits(&b, slot as u8), 1);
        }
        assert_eq!(s.read(3 * 512, &mut b), Ok(0));
        assert_eq!(b, [0; 512]);
        // Misdirected: the neighbour's bytes (the previous one for the last slot) under the
        // requested slot's version.
        s.write(0, &[7; 512], 20).unwrap();
        assert_eq!(s.read_misdirected(512, &mut b), Ok((11, 0)));
        assert_eq!(bits(&b, 2), 1, "not the (corrupted) split of slot 2");
        let last = 65536 - 512;
        s.store(last, &[9; 512], 30, 99).unwrap();
        s.store(last - 512, &[8; 512], 30, 88).unwrap();
        assert_eq!(s.read_misdirected(last, &mut b), Ok((30, 88)));
        assert_eq!(b, [8; 512]);
        assert_eq!(s.load(last, &mut b), Ok((30, 99)));
        assert_eq!(b, [9; 512]);
        assert_eq!(s.corrupt(100), Err(Status::BadRequest));
        let mut buf = [0u8; 64];
        flip_random_bit(&mut buf);
        assert_eq!(bits(&buf, 0), 1);
    }

    #[test]
    fn reported_corruption_counts_per_slab_and_in_total_never_on_foreign_slabs() {
        let n = node(4);
        let (a, b) = (ClientId::random(), ClientId::random());
        let (sa, sb) = (n.alloc(a, 0, 512).unwrap(), n.alloc(b, 0, 512).unwrap());
        let report = |slab, splits, cause| CorruptReport {
            slab,
            splits,
            cause,
        };
        let accepted = n.report_corrupt(
            &a,
            &[
                report(sa, 3, CorruptCause::Checksum),
                report(sa, 2, CorruptCause::Codeword),
                // b's slab and a slab that does not exist: the node total only.
                report(sb, 7, CorruptCause::Checksum),
                report(sa ^ sb ^ 0x4000, 1, CorruptCause::Checksum),
            ],
        );
        assert_eq!(accepted, 2);
        let corrupt_of = |id| {
            n.stats()
                .slabs
                .iter()
                .find(|s| s.slab == id)
                .map(|s| s.corrupt)
        };
        assert_eq!((corrupt_of(sa), corrupt_of(sb)), (Some(5), Some(0)));
        assert_eq!(n.stats().corrupt_reported, 13);
        assert_eq!(
            n.report_corrupt(&b, &[report(sb, 1, CorruptCause::Checksum)]),
            1
        );
        assert_eq!(n.report_corrupt(&b, &[]), 0);
        // A freed slab's count goes with it; the node total stays.
        n.free(&a, sa).unwrap();
        let st = n.stats();
        assert_eq!((st.corrupt_reported, corrupt_of(sb)), (14, Some(1)));
    }

    #[test]
    fn bad_configs_are_refused() {
        let cfg = |capacity, slab_size| NodeConfig {
            id: 0,
            capacity,
            slab_size,
            allow_faults: false,
            membership: None,
            key: None,
            tls: None,
            tenancy: Default::default(),
        };
        assert!(Node::new(cfg(1 << 20, 1000)).is_err());
        assert!(Node::new(cfg(4096, 8192)).is_err());
    }
}
