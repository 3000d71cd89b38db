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
//! - every request is answered or the connection is closed; bad input never panics the node.

mod memory;
pub mod regen;
pub mod server;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::wire::{ClientId, SlabStats, Stats, Status};
pub use memory::SlabMemory;

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

/// One allocated slab.
pub struct Slab {
    owner: ClientId,
    tag: u64,
    split_len: u64,
    memory: SlabMemory,
    /// The version of each split slot (u64 little-endian per slot; lazily backed like `memory`).
    versions: SlabMemory,
    /// Writers take it exclusively so that a concurrent read never sees a torn split.
    lock: RwLock<()>,
    reads: AtomicU64,
    writes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    touched: AtomicU64,
}

impl Slab {
    /// The slot index of a whole split at `offset`, or the error for a misaligned or
    /// out-of-range access.
    fn slot(&self, offset: u64, len: usize) -> Result<u64, Status> {
        if len as u64 != self.split_len || !offset.is_multiple_of(self.split_len) {
            return Err(Status::BadRequest);
        }
        let slot = offset / self.split_len;
        if (slot + 1) * 8 > self.versions.len() as u64 {
            return Err(Status::OutOfRange);
        }
        Ok(slot)
    }

    fn version(&self, slot: u64) -> u64 {
        let mut v = [0u8; 8];
        self.versions.read(slot * 8, &mut v).expect("slot checked");
        u64::from_le_bytes(v)
    }

    /// Copies one split out of the slab and returns its version, counting the access.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<u64, Status> {
        let slot = self.slot(offset, out.len())?;
        let _g = self.lock.read();
        self.memory.read(offset, out).ok_or(Status::OutOfRange)?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.bytes_read
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        Ok(self.version(slot))
    }

    /// Stores one split of `version` unless a newer version is stored ([`Status::Stale`]); an
    /// equal version is acknowledged without rewriting.
    pub fn write(&self, offset: u64, data: &[u8], version: u64) -> Result<(), Status> {
        let slot = self.slot(offset, data.len())?;
        let _g = self.lock.write();
        let stored = self.version(slot);
        if version < stored {
            return Err(Status::Stale);
        }
        if version == stored && version != 0 {
            return Ok(());
        }
        self.memory.write(offset, data).ok_or(Status::OutOfRange)?;
        self.versions
            .write(slot * 8, &version.to_le_bytes())
            .expect("slot checked");
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.bytes_written
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        self.touched
            .fetch_max(offset + data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn stats(&self, id: u32) -> SlabStats {
        SlabStats {
            slab: id,
            owner: self.owner.fingerprint(),
            tag: self.tag,
            reads: self.reads.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            touched: self.touched.load(Ordering::Relaxed),
        }
    }
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
            config,
            slabs: RwLock::new(BTreeMap::new()),
            // Slab ids start at random, so that ids a client still holds from an earlier
            // incarnation of this node are very unlikely to name a slab of this one.
            alloc: Mutex::new(rand::random::<u32>() >> 1),
            clients: AtomicU32::new(0),
            faults: Faults::default(),
            regenerating: AtomicU32::new(0),
            regen_pages: AtomicU64::new(0),
        }))
    }

    /// The node's configuration.
    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// Most slabs the node hands out at once.
    pub fn max_slabs(&self) -> u64 {
        self.config.capacity / self.config.slab_size
    }

    /// Allocates a zeroed slab owned by `owner` for splits of `split_len` bytes.
    pub fn alloc(&self, owner: ClientId, tag: u64, split_len: u32) -> Result<u32, Status> {
        if split_len == 0 || split_len as u64 > self.config.slab_size {
            return Err(Status::BadRequest);
        }
        let mut next = self.alloc.lock();
        let refused = self.faults.refuse_alloc.load(Ordering::Relaxed);
        if refused || self.slabs.read().len() as u64 >= self.max_slabs() {
            metrics::counter!("hydramem_node_alloc_refused_total").increment(1);
            return Err(Status::NoCapacity);
        }
        let map = |len: u64| {
            SlabMemory::new(len as usize).map_err(|e| {
                tracing::error!(error = %e, "mapping a slab failed");
                Status::Internal
            })
        };
        let memory = map(self.config.slab_size)?;
        let versions = map((self.config.slab_size / split_len as u64 * 8).max(8))?;
        let id = *next;
        *next = next.wrapping_add(1);
        let slab = Slab {
            owner,
            tag,
            split_len: split_len as u64,
            memory,
            versions,
            lock: RwLock::new(()),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            touched: AtomicU64::new(0),
        };
        self.slabs.write().insert(id, Arc::new(slab));
        metrics::counter!("hydramem_node_slabs_allocated_total").increment(1);
        tracing::debug!(slab = id, ?owner, tag, "slab allocated");
        Ok(id)
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
                slabs.remove(&id);
                metrics::counter!("hydramem_node_slabs_freed_total").increment(1);
                Ok(())
            }
            _ => Err(Status::NoSuchSlab),
        }
    }

    /// (slab, tag) of every slab `owner` holds.
    pub fn list(&self, owner: &ClientId) -> Vec<(u32, u64)> {
        self.slabs
            .read()
            .iter()
            .filter(|(_, s)| s.owner == *owner)
            .map(|(id, s)| (*id, s.tag))
            .collect()
    }

    /// Capacity, use and per-slab counters.
    pub fn stats(&self) -> Stats {
        Stats {
            node_id: self.config.id,
            capacity: self.config.capacity,
            slab_size: self.config.slab_size,
            rss: resident_bytes(),
            clients: self.clients.load(Ordering::Relaxed),
            regenerating: self.regenerating.load(Ordering::Relaxed),
            regen_pages: self.regen_pages.load(Ordering::Relaxed),
            slabs: self
                .slabs
                .read()
                .iter()
                .map(|(id, s)| s.stats(*id))
                .collect(),
        }
    }

    pub(crate) fn client_connected(&self) {
        self.clients.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn client_disconnected(&self) {
        self.clients.fetch_sub(1, Ordering::Relaxed);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn node(slabs: u64) -> Arc<Node> {
        Node::new(NodeConfig {
            id: 3,
            capacity: slabs * 65536,
            slab_size: 65536,
            allow_faults: false,
        })
        .unwrap()
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
    fn slabs_are_private_to_their_owner() {
        let n = node(4);
        let (a, b) = (ClientId::random(), ClientId::random());
        let s = n.alloc(a, 7, 512).unwrap();
        n.slab(&a, s).unwrap().write(0, &[9; 512], 1).unwrap();
        assert!(matches!(n.slab(&b, s), Err(Status::NoSuchSlab)));
        assert_eq!(n.free(&b, s), Err(Status::NoSuchSlab));
        assert_eq!(n.list(&a), vec![(s, 7)]);
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
        assert_eq!(st.slabs[0].touched, 1024);
        assert_eq!(st.used(), 65536);
    }

    #[test]
    fn bad_configs_are_refused() {
        let cfg = |capacity, slab_size| NodeConfig {
            id: 0,
            capacity,
            slab_size,
            allow_faults: false,
        };
        assert!(Node::new(cfg(1 << 20, 1000)).is_err());
        assert!(Node::new(cfg(4096, 8192)).is_err());
    }
}
