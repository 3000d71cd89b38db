//! The client (the paper's Resilience Manager): a remote address space of resilient pages.
//!
//! [`RemoteMemory`] divides its address space into address ranges of `pages_per_range` pages.
//! A range is mapped on its first write to a coding group of `width` slabs on distinct memory
//! nodes chosen by [`crate::placement`]; split j of every page of the range lives in slab j.
//! Until then the range reads as zeros.
//!
//! Data path (paper 4.1), per page and without heap allocation:
//! - write: post the k data splits straight from the caller's page, then encode the r parity
//!   splits into the operation's side buffer and post them, then wait for the acknowledgements
//!   the mode requires (failure recovery: all k + r; EC-only: any k);
//! - read: post k + Δ split reads to nodes chosen at random among those up; splits land directly
//!   in the caller's page (data) or the side buffer (parity); once k are in, close the operation
//!   (late splits are dropped, see [`slots`]) and decode the missing data splits in place. If
//!   requests fail, ask the splits not asked yet; fail only when fewer than k can arrive.
//! - waiting: the calling thread polls its operation for a bounded time (`poll`) from when its
//!   splits are posted, yielding the core between checks, then parks until a completion wakes
//!   it (run-to-completion, 4.1.3); at most `pollers` threads poll at once, the others park
//!   at once.
//!
//! Replication and single copy use the same path with width n, one "split" of 4096 bytes per
//! copy, a write waiting for all n copies and a read taking the first copy that arrives. Span
//! coding's address space is rows, not pages ([`rows`]; [`crate::span`] maps pages to them).
//!
//! Where each part lives (one concept per file):
//! - [`connect`]: joining the cluster, finding this identity's slabs, starting the maintenance
//!   thread;
//! - [`write`] and [`read`]: the two halves of the data path above, with [`wait`] (waiting on
//!   an operation, and describing it in errors) and [`check`] (consistency checks and
//!   correction of a read's splits; [`correct`] is the search it uses);
//! - [`ranges`]: the range map (which coding group holds an address) and placement;
//! - [`health`]: per-node integrity accounting (the paper's error limits) and corruption
//!   reports;
//! - [`rows`]: span coding's unit (rows of k whole pages and r parity pages, one version):
//!   writing rows whole, and reading one piece with a hedged degraded read behind it;
//! - [`members`]: members that join the cluster while the client runs (etcd membership);
//! - [`repair`]: moving a split to a new slab and regenerating it; [`maintain`]: the
//!   maintenance thread that notices failures, reclaims and restarts and starts repairs;
//! - [`slots`]: in-flight operations and the landing protocol; [`transport`] (the seam) and
//!   [`tcp`] (its implementation) move splits to nodes; [`mem`] is the in-process
//!   implementation with injected faults on which the client's unit tests run;
//! - [`config`], [`error`], [`stats`]: what a caller configures, gets back, and can count.

mod batch;
mod check;
mod config;
mod connect;
pub mod correct;
mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod health;
mod lagging;
pub mod layout;
mod maintain;
pub mod mem;
mod members;
mod ranges;
mod read;
mod repair;
mod rows;
pub(crate) mod slots;
mod stats;
mod submit;
pub mod tcp;
pub mod transport;
mod wait;
mod write;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwapOption;
use hydramem_isal::Codec;
use parking_lot::Mutex;

use crate::wire;
use crate::PAGE_SIZE;
pub use batch::WINDOW;
pub use config::{Ablation, ClientConfig};
pub use error::{ClientError, IoError};
use health::NodeHealth;
pub use health::NodeIntegrity;
pub use layout::{Layout, Mode, Resilience};
pub use ranges::Group;
use ranges::Placement;
pub use repair::RegenStats;
use repair::{RegenCounters, RegenJob};
pub use rows::{HeldRow, Newer, PieceRead, PieceWant, RowWrite};
use slots::Slots;
use stats::ClientMetrics;
pub use stats::ClientStats;
pub use submit::{PendingRead, PendingWrite};
use transport::Transport;

/// A page: the unit of remote I/O.
pub type Page = [u8; PAGE_SIZE];

/// A client's resilient remote address space. `Send + Sync`: share it across threads.
pub struct RemoteMemory {
    layout: Layout,
    config: ClientConfig,
    /// The identity the nodes know this client by: its owner handle with a cluster key, its
    /// identity without (see [`crate::auth`]). What REGEN names, never `config.client_id`.
    owner: crate::wire::ClientId,
    codec: Option<Codec>,
    slots: Arc<Slots>,
    transport: Box<dyn Transport>,
    ranges: Arc<[ArcSwapOption<Group>]>,
    placement: Mutex<Placement>,
    /// Each node's id (cluster-file order, then members in the order they joined); grows
    /// only in [`RemoteMemory::join_member`], whose write lock on it serializes joins.
    node_ids: parking_lot::RwLock<Vec<u32>>,
    stats: ClientStats,
    metrics: ClientMetrics,
    /// The last page version handed out (see [`RemoteMemory::next_version`]).
    clock: AtomicU64,
    /// Integrity accounting per node (cluster-file order).
    health: Arc<[NodeHealth]>,
    /// Some node is suspect: reads look at their group's nodes (one load on the fast path).
    any_suspect: AtomicBool,
    /// Recent latency of one-split reads over all nodes (span's healthy reads), in
    /// nanoseconds, a moving average (0 before the first): what a read's hedge waits for.
    piece_ns: AtomicU64,
    /// Corrupted splits as (node, slab, cause), until [`RemoteMemory::report_corruption`]
    /// reports them to their nodes; at most [`MAX_QUEUED_CORRUPT`] (beyond, only the client's
    /// own per-node counts keep them).
    corrupt_reports: Mutex<Vec<(u16, u32, wire::CorruptCause)>>,
    /// Slabs left on failed nodes after a remap: (node, slab), freed when the node is back.
    orphans: Mutex<Vec<(u16, u32)>>,
    /// Background regenerations.
    regen: Arc<RegenCounters>,
    /// Slabs being moved off a node that reclaimed them: (node, slab), freed once the move's
    /// regeneration is done.
    moving: Mutex<Vec<(u16, u32)>>,
    /// Reclaimed slabs that could not be moved yet (no node could take them): retried, and
    /// repaired as lost if their node drops them first.
    stuck: Mutex<Vec<(u16, u32)>>,
    /// Regenerations that ended, for the maintenance thread to act on.
    ended: Arc<Mutex<Vec<(RegenJob, bool)>>>,
    /// Regenerations that failed, retried every [`REPAIR_RETRY`].
    retry: Mutex<(Instant, Vec<RegenJob>)>,
    /// No repair before this instant (after one found no replacement node).
    repair_after: Mutex<Instant>,
    /// The next audit of the slabs the nodes hold ([`ClientConfig::audit_interval`]).
    audit_after: Mutex<Instant>,
    /// An audit is running (on its thread).
    audit_running: AtomicBool,
    /// (range, split, node, slab): slabs that lost a split's claim to another when this
    /// identity reconnected. Each may hold pages the kept one lacks, so it is kept — never
    /// moved, never freed as a leftover — until a regeneration of that split succeeds.
    superseded: Mutex<Vec<(usize, usize, u16, u32)>>,
    /// (node, slab): slabs of ours, never written, that the last audit of their node found
    /// nothing using; freed if the next audit finds the same (`maintain::sweep`).
    unused_seen: Mutex<Vec<(u16, u32)>>,
    /// Write splits left behind by a straggling node, resent in the background.
    lagging: lagging::Lagging,
    /// Owners polling for their operations now (at most [`ClientConfig::pollers`]).
    pollers: AtomicUsize,
}

impl RemoteMemory {
    /// Replies dropped because they came from another node than the split was posted to, or
    /// were of another operation than the one they named (a confused or hostile node).
    pub fn foreign_replies(&self) -> u64 {
        self.slots.foreign_replies()
    }

    /// The page geometry of this client.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The identity the nodes file this client's slabs under (what STATS fingerprints): its
    /// owner handle with a cluster key, its identity without.
    pub fn owner(&self) -> crate::wire::ClientId {
        self.owner
    }

    /// The file descriptors of this client's connections to the nodes now. A process that
    /// forks a child that goes on without the client (`hydramem run`'s pager does) must close
    /// them in the child: while the child keeps a copy of one open, the nodes count this
    /// process's identity as held (docs/architecture.md, "Who holds an identity"), and a
    /// release of its memory after the process ends is refused.
    pub fn sockets(&self) -> Vec<std::os::fd::RawFd> {
        self.transport.sockets()
    }

    /// Size of the address space in bytes.
    pub fn size(&self) -> u64 {
        self.config.size
    }

    /// The configuration the client was made with.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The client's counters.
    pub fn stats(&self) -> &ClientStats {
        &self.stats
    }

    /// The transport (for status and tests).
    pub fn transport(&self) -> &dyn Transport {
        &*self.transport
    }
}
