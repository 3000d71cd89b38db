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
//! - waiting: the calling thread polls its operation for a bounded time (`poll`), yielding the
//!   core between checks, then parks until a completion wakes it (run-to-completion, 4.1.3).
//!
//! Replication and single copy use the same path with width n, one "split" of 4096 bytes per
//! copy, a write waiting for all n copies and a read taking the first copy that arrives.

pub mod correct;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod layout;
pub(crate) mod slots;
pub mod tcp;
pub mod transport;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use hydramem_isal::Codec;
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};

use crate::cluster::Cluster;
use crate::integrity;
use crate::placement::{NodeView, Placer};
use crate::units::human;
use crate::wire::{self, ClientId, Entry, Hello, Op, Status};
use crate::PAGE_SIZE;
use layout::MAX_WIDTH;
pub use layout::{Layout, Mode, Resilience};
use slots::{Progress, Slots};
use tcp::{TcpOptions, TcpTransport};
use transport::{Transport, TransportError};

/// A page: the unit of remote I/O.
pub type Page = [u8; PAGE_SIZE];

/// Everything a client needs besides the cluster file.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Resilience scheme and its parameters.
    pub resilience: Resilience,
    /// Size of the remote address space in bytes (rounded up to whole pages).
    pub size: u64,
    /// Identity that owns the client's slabs; reconnecting with it finds them again.
    pub client_id: ClientId,
    /// How long a waiting thread polls before it sleeps.
    pub poll: Duration,
    /// How long one page operation may take before it fails.
    pub op_timeout: Duration,
    /// A read still short of k splits after this long asks the splits it has not asked yet
    /// (a straggler or a silently stalled node must not hold the page up).
    pub straggler_after: Duration,
    /// Page operations in flight at once (callers beyond it wait).
    pub max_in_flight: usize,
    /// CodingSets load-balancing factor l, used unless the cluster file's `[placement]` sets
    /// one (the file also chooses the policy).
    pub placement_l: usize,
    /// Seed for placement and split choice (random when `None`).
    pub seed: Option<u64>,
    /// Transport timeouts.
    pub tcp: TcpOptions,
    /// Per-split CRC32C checksums bound to the page and version ([`crate::integrity`]): written
    /// with every split, verified on every read; a split that fails is never used and the read
    /// asks another instead. On by default (docs/architecture.md says why).
    pub checksums: bool,
    /// The paper's ErrorCorrectionLimit: a node whose share of corrupted splits (among those
    /// read from it in the last window) is above this is suspect, and reads that involve it
    /// start with every split they may need (k + 2Δ + 1 in correction mode, one spare with
    /// checksums) instead of asking more only after they found corruption.
    pub error_correction_limit: f64,
    /// The paper's SlabRegenerationLimit: above this share, the client regenerates its slabs
    /// on that node elsewhere and places nothing new there until the node restarts.
    pub slab_regeneration_limit: f64,
    /// Splits read from a node per accounting window: its error rate is judged once this many
    /// were read, so that one flipped bit on a quiet node does not evict it.
    pub error_window: u64,
}

impl ClientConfig {
    /// Defaults for a scheme and an address-space size.
    pub fn new(resilience: Resilience, size: u64) -> ClientConfig {
        ClientConfig {
            resilience,
            size,
            client_id: ClientId::random(),
            poll: Duration::from_micros(50),
            op_timeout: Duration::from_secs(10),
            straggler_after: Duration::from_millis(5),
            max_in_flight: 1024,
            placement_l: 2,
            seed: None,
            tcp: TcpOptions::default(),
            checksums: true,
            error_correction_limit: 0.001,
            slab_regeneration_limit: 0.01,
            error_window: 1000,
        }
    }
}

/// What the client knows about one node's integrity (paper 4.1.2: per-machine error rates).
#[derive(Debug, Default)]
struct NodeHealth {
    /// Splits read from the node in the current window.
    reads: AtomicU64,
    /// Of them, those found corrupted (failed checksum, or outvoted by the other splits).
    errors: AtomicU64,
    /// Corrupted splits found on the node since the client started.
    total_errors: AtomicU64,
    /// Above the ErrorCorrectionLimit in the last window.
    suspect: AtomicBool,
    /// Above the SlabRegenerationLimit: slabs moved away, no new placements.
    avoided: AtomicBool,
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

/// Errors that stop a client from starting or from mapping memory.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Bad resilience parameters.
    #[error(transparent)]
    Layout(#[from] layout::LayoutError),
    /// The codec refused the parameters.
    #[error("cannot build the Reed-Solomon codec: {0}")]
    Codec(#[from] hydramem_isal::CodecError),
    /// Too few nodes are reachable for one coding group.
    #[error("{label} needs {needed} memory nodes but only {up} of {total} are reachable ({down}); start more nodes or use a narrower scheme")]
    TooFewNodes {
        /// The scheme.
        label: String,
        /// Nodes one range needs.
        needed: usize,
        /// Nodes up.
        up: usize,
        /// Nodes listed.
        total: usize,
        /// Which are down and why.
        down: String,
    },
    /// A node disagrees with the cluster file about the slab size.
    #[error("memory node {node} ({addr}) uses slabs of {node_slab} bytes but the cluster file says {file_slab}; fix the cluster file or restart the node with --slab-size {file_slab}")]
    SlabSize {
        /// Node index.
        node: usize,
        /// Its address.
        addr: String,
        /// What the node said.
        node_slab: u64,
        /// What the file says.
        file_slab: u64,
    },
    /// Existing slabs of this identity were written with other parameters.
    #[error("this client identity already holds slabs written as layout {found:#06x} on node {node}, but it was started as {label} ({expected:#06x}); reconnect with the same k and r (or copies), use a new identity, or release this one's memory first (hydramem free)")]
    LayoutMismatch {
        /// Node index.
        node: usize,
        /// Layout code found in a slab tag.
        found: u16,
        /// Layout code of this client.
        expected: u16,
        /// This client's scheme.
        label: String,
    },
    /// Existing slabs of this identity lie beyond the size asked for: connecting would leave
    /// them unreachable and their memory held on the nodes for good.
    #[error("this client identity already holds data in address range {range}, which starts at {} (byte {start}), beyond the {} it was started with; reconnect with a size larger than {} to keep that data, or release this identity's memory first (hydramem free)", human(*start), human(*size), human(*start))]
    SmallerThanHeld {
        /// Size asked for.
        size: u64,
        /// First byte of the highest address range the identity holds.
        start: u64,
        /// That range's index.
        range: u32,
    },
    /// Placement found no coding group.
    #[error("cannot place address range {range}: {source}")]
    Placement {
        /// The range.
        range: u64,
        /// Why.
        source: crate::placement::PlacementError,
    },
    /// Every node that could host the range is full.
    #[error("cannot map address range {range}: the memory nodes are out of capacity ({full}); add nodes or give them more --capacity")]
    OutOfCapacity {
        /// The range.
        range: u64,
        /// The nodes that refused for lack of capacity.
        full: String,
    },
    /// A node refused or failed a control request.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// A configured value is out of its range.
    #[error("invalid client configuration: {0}")]
    Config(String),
    /// The OS refused a resource (threads, epoll).
    #[error("client setup failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Errors of a page read or write. They name the page, its range and the nodes involved.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// The address is not a multiple of 4096.
    #[error("address {addr:#x} is not page aligned (4096)")]
    Unaligned {
        /// The address.
        addr: u64,
    },
    /// The address is beyond the address space.
    #[error("address {addr:#x} is outside the {size}-byte remote address space")]
    OutOfRange {
        /// The address.
        addr: u64,
        /// Size of the address space.
        size: u64,
    },
    /// Not enough splits could be read or written.
    #[error("{what} of page {addr:#x} (address range {range}) failed: {got} of the {needed} splits it needs succeeded; failing nodes: {nodes}")]
    Unavailable {
        /// "read" or "write".
        what: &'static str,
        /// The page.
        addr: u64,
        /// Its range.
        range: u64,
        /// Splits needed.
        needed: usize,
        /// Splits that succeeded.
        got: usize,
        /// The failing nodes with their addresses and errors.
        nodes: String,
    },
    /// The operation did not complete in time.
    #[error("{what} of page {addr:#x} (address range {range}) timed out after {waited:?} waiting for nodes {nodes}")]
    Timeout {
        /// "read" or "write".
        what: &'static str,
        /// The page.
        addr: u64,
        /// Its range.
        range: u64,
        /// How long it waited.
        waited: Duration,
        /// The nodes that did not answer.
        nodes: String,
    },
    /// The splits never agreed on one version for the whole timeout: a write to this page kept
    /// racing the read, or an earlier write of it failed half-way.
    #[error("read of page {addr:#x} (address range {range}) found no version of the page held by enough splits for {waited:?}: a write to it kept racing the read or failed part-way, or more splits are lost (or not yet regenerated) than the code tolerates")]
    Inconsistent {
        /// The page.
        addr: u64,
        /// Its range.
        range: u64,
        /// How long it retried.
        waited: Duration,
    },
    /// Corruption detection or correction found the splits of the page inconsistent with each
    /// other and could not put them right; the page's bytes are not handed out.
    #[error("read of page {addr:#x} (address range {range}) found corruption: its {splits} splits of one version do not form one codeword, so at least one was corrupted on its node or on the wire; splits read from: {nodes}. {why}: rewrite the page, or enable checksums to read around corrupted splits")]
    Corrupt {
        /// The page.
        addr: u64,
        /// Its range.
        range: u64,
        /// Splits compared.
        splits: usize,
        /// The nodes the compared splits came from.
        nodes: String,
        /// Why the mode could not correct it.
        why: String,
    },
    /// A node holds a version of the page's splits that no later write can pass (the largest
    /// valid version): something wrote the page with a version far in the future.
    #[error("write of page {addr:#x} refused: the nodes hold version {held} of it, and no newer version exists (at most {max}); a client with a clock far in the future, or a peer that knows this identity, wrote it. Release this identity's memory (hydramem free) or use a new identity")]
    VersionsExhausted {
        /// The page.
        addr: u64,
        /// The version the nodes hold.
        held: u64,
        /// The largest valid version.
        max: u64,
    },
    /// The range could not be mapped.
    #[error(transparent)]
    Map(#[from] ClientError),
}

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

/// Counters of one client.
#[derive(Debug, Default)]
pub struct ClientStats {
    /// Pages written.
    pub writes: AtomicU64,
    /// Pages read.
    pub reads: AtomicU64,
    /// Reads that had to decode (a data split was missing or late).
    pub decodes: AtomicU64,
    /// Extra split reads issued after failures.
    pub reissued: AtomicU64,
    /// Reads repeated because their splits came from different writes.
    pub retries: AtomicU64,
    /// Write splits re-sent to a replacement slab after their node failed.
    pub rerouted: AtomicU64,
    /// Read splits that failed their checksum (never used; another split was asked instead).
    pub corrupt: AtomicU64,
    /// Reads whose splits detection or correction mode found inconsistent and could not
    /// correct (answered with an error).
    pub corrupt_detected: AtomicU64,
    /// Reads whose splits disagreed and that correction mode put right.
    pub corrected: AtomicU64,
    /// Reads that started with extra splits because a node of theirs is suspect.
    pub wide_reads: AtomicU64,
    /// Splits moved off nodes above the SlabRegenerationLimit.
    pub evacuated: AtomicU64,
    /// Page writes sent again with a newer version because a node held a newer one than
    /// this client's clock gave (see [`RemoteMemory::write_page`]).
    pub stale_rewrites: AtomicU64,
}

/// Prometheus handles, registered once at connect so that the data path only records into
/// them (without `--metrics` they are no-ops).
struct ClientMetrics {
    read_seconds: metrics::Histogram,
    write_seconds: metrics::Histogram,
    read_errors: metrics::Counter,
    write_errors: metrics::Counter,
    reissued: metrics::Counter,
    rerouted: metrics::Counter,
    corrupt: metrics::Counter,
    stale_rewrites: metrics::Counter,
}

impl ClientMetrics {
    fn register() -> ClientMetrics {
        ClientMetrics {
            read_seconds: metrics::histogram!("hydramem_client_op_seconds", "op" => "read"),
            write_seconds: metrics::histogram!("hydramem_client_op_seconds", "op" => "write"),
            read_errors: metrics::counter!("hydramem_client_op_errors_total", "op" => "read"),
            write_errors: metrics::counter!("hydramem_client_op_errors_total", "op" => "write"),
            reissued: metrics::counter!("hydramem_client_splits_reissued_total"),
            rerouted: metrics::counter!("hydramem_client_splits_rerouted_total"),
            corrupt: metrics::counter!("hydramem_client_splits_corrupt_total"),
            stale_rewrites: metrics::counter!("hydramem_client_stale_rewrites_total"),
        }
    }
}

/// How one read attempt ended, when it did not fail.
enum ReadOutcome {
    /// The page is in the caller's buffer.
    Done,
    /// k splits arrived but of different versions: try again.
    Inconsistent { range: u64 },
}

/// Encodes the r parity splits of a page into the first r splits of `parity`: the data splits
/// are the page's whole splits, then the padded `tail` splits (when k does not divide 4096).
fn encode_parity(codec: &Codec, l: &Layout, page: &[u8], tail: &[u8], parity: &mut [u8]) {
    let s = l.split_len;
    let mut data: [&[u8]; MAX_WIDTH] = [&[]; MAX_WIDTH];
    for (j, d) in data.iter_mut().enumerate().take(l.full_data) {
        *d = &page[j * s..(j + 1) * s];
    }
    for (t, chunk) in tail.chunks_exact(s).enumerate() {
        data[l.full_data + t] = chunk;
    }
    let r = l.width - l.k;
    let mut out: [&mut [u8]; MAX_WIDTH] = std::array::from_fn(|_| &mut [][..]);
    for (p, chunk) in parity.chunks_exact_mut(s).take(r).enumerate() {
        out[p] = chunk;
    }
    codec
        .encode(&data[..l.k], &mut out[..r])
        .expect("layout and codec agree on k, r and split length");
}

/// What the first look of a checked read found, for [`RemoteMemory::second_look`].
struct Look {
    addr: u64,
    range: usize,
    /// The version whose splits were checked.
    version: u64,
    /// Those splits.
    mask: u32,
    /// When the read started (its deadline runs from here).
    start: Instant,
    /// The slot's progress when the first look closed.
    before: Progress,
}

/// Split indices of a mask, for messages: "2, 7".
fn describe_mask(mask: u32) -> String {
    (0..32)
        .filter(|j| mask & (1 << j) != 0)
        .map(|j| j.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Adapter: the slot table receives the transport's completions.
/// A client's resilient remote address space. `Send + Sync`: share it across threads.
pub struct RemoteMemory {
    layout: Layout,
    config: ClientConfig,
    codec: Option<Codec>,
    slots: Arc<Slots>,
    transport: Box<dyn Transport>,
    ranges: Arc<[ArcSwapOption<Group>]>,
    placement: Mutex<Placement>,
    domains: Vec<Option<u32>>,
    /// Each node's id in the cluster file (cluster-file order).
    node_ids: Vec<u32>,
    stats: ClientStats,
    metrics: ClientMetrics,
    /// The last page version handed out (see [`RemoteMemory::next_version`]).
    clock: AtomicU64,
    /// Integrity accounting per node (cluster-file order).
    health: Arc<[NodeHealth]>,
    /// Some node is suspect: reads look at their group's nodes (one load on the fast path).
    any_suspect: AtomicBool,
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
}

/// How often the maintenance thread repairs ranges and releases stale slabs.
const MAINTENANCE_INTERVAL: Duration = Duration::from_millis(100);
/// How long a repair that found no replacement node waits before trying again.
const REPAIR_RETRY: Duration = Duration::from_secs(1);
/// Corrupted splits queued for reporting between two maintenance rounds, at most: a bound on
/// the queue's memory when every read meets corruption.
const MAX_QUEUED_CORRUPT: usize = 1 << 16;

/// One background regeneration: split `split` of `range`, into `slab` on `node`, optionally
/// copying from the slab it replaces (`from`, when that slab is still readable: a move).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RegenJob {
    range: usize,
    split: usize,
    node: u16,
    slab: u32,
    from: Option<(u16, u32)>,
}

/// Why a split moves to a replacement slab.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MoveReason {
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
}

/// Counts of background slab regenerations.
#[derive(Debug, Default)]
struct RegenCounters {
    started: AtomicU64,
    done: AtomicU64,
    failed: AtomicU64,
    pages: AtomicU64,
    /// Sum of the wall time of finished regenerations, nanoseconds.
    nanos: AtomicU64,
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

/// The outcome of one write attempt.
enum Written {
    /// Acknowledged as the mode requires.
    Done,
    /// A node holds a newer version of a split (this one): write again past it.
    Stale(u64),
}

/// The wall clock in nanoseconds since the epoch (0 before it).
fn wall_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Says so when the versions an identity holds are ahead of this machine's clock: new writes
/// continue from them (versions must only grow), which is right, but worth an operator's look.
fn seed_clock_note(held: u64) {
    let now = wall_nanos();
    if held > now.saturating_add(60_000_000_000) {
        tracing::warn!(
            ahead = ?Duration::from_nanos(held - now),
            "this identity's stored page versions are ahead of this machine's clock (written \
             by a machine with a faster clock, or before the clock stepped back): new writes \
             continue from them"
        );
    }
}

/// Sends REGEN to the node holding the replacement slab on a connection of its own (the node
/// answers when the slab is rebuilt) and returns the pages it rebuilt.
fn send_regen(target: std::net::SocketAddr, req: &crate::wire::Regen) -> Result<u64, String> {
    let hello = Hello {
        client: req.client,
        flags: 0,
    };
    let connect = Duration::from_secs(5);
    let mut s = crate::status::open(target, Some(hello), connect, Duration::from_secs(3600))?;
    let mut body = Vec::new();
    req.put(&mut body);
    let reply = crate::status::request(&mut s, Op::Regen, &body)?;
    Ok(u64::from_le_bytes(
        reply
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .ok_or("short REGEN reply")?,
    ))
}

struct Placement {
    placer: Placer,
    loads: Vec<u64>,
}

thread_local! {
    static RNG: std::cell::RefCell<rand::rngs::SmallRng> =
        std::cell::RefCell::new(rand::rngs::SmallRng::from_os_rng());
}

impl RemoteMemory {
    /// Connects to the cluster's nodes, finds this identity's existing slabs and is ready for
    /// I/O. Fails when fewer nodes are reachable than one coding group needs.
    pub fn connect(
        cluster: &Cluster,
        config: ClientConfig,
    ) -> Result<Arc<RemoteMemory>, ClientError> {
        cluster.validate().map_err(ClientError::Config)?;
        if config.max_in_flight == 0 || config.max_in_flight > slots::MAX_SLOTS {
            return Err(ClientError::Config(format!(
                "max_in_flight is {}; it must be 1 to {} (page operations in flight at once)",
                config.max_in_flight,
                slots::MAX_SLOTS
            )));
        }
        let layout = Layout::new(config.resilience, cluster.slab_size)?;
        let codec = match config.resilience {
            Resilience::Hydra { k, r, .. } => {
                let codec = Codec::new(k as usize, r as usize)?;
                prepare_decode_tables(&codec, &layout);
                Some(codec)
            }
            Resilience::Replication { .. } => None,
        };
        let slots =
            Arc::new(Slots::new(layout, config.max_in_flight).with_checksums(config.checksums));
        let addrs: Vec<_> = cluster.nodes.iter().map(|n| n.addr).collect();
        let hello = Hello {
            client: config.client_id,
            flags: 0,
        };
        let members: Vec<(u32, std::net::SocketAddr)> =
            cluster.nodes.iter().map(|n| (n.id, n.addr)).collect();
        let (transport, outcomes) =
            TcpTransport::connect(&members, hello, slots.clone(), config.tcp)?;
        let mut down = Vec::new();
        for (i, o) in outcomes.iter().enumerate() {
            match o {
                Ok(h) if h.slab_size != cluster.slab_size => {
                    return Err(ClientError::SlabSize {
                        node: i,
                        addr: addrs[i].to_string(),
                        node_slab: h.slab_size,
                        file_slab: cluster.slab_size,
                    })
                }
                Ok(_) => {}
                Err(e) => down.push(format!("node {i} at {}: {e}", addrs[i])),
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
        // Slab tags name a range with 32 bits.
        let n_ranges = config.size.div_ceil(layout.range_bytes());
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
        let ranges: Box<[ArcSwapOption<Group>]> =
            (0..n_ranges).map(|_| ArcSwapOption::empty()).collect();

        // Domains as small integers, for placement.
        let mut names: HashMap<&str, u32> = HashMap::new();
        let domains: Vec<Option<u32>> = cluster
            .nodes
            .iter()
            .map(|n| {
                n.domain.as_deref().map(|d| {
                    let next = names.len() as u32;
                    *names.entry(d).or_insert(next)
                })
            })
            .collect();

        // Node loads (slab counts) and this identity's existing slabs.
        let mut loads = vec![0u64; addrs.len()];
        let mut found: HashMap<u32, Group> = HashMap::new();
        let mut beyond: Option<u32> = None;
        let mut held_version = 0u64;
        for node in 0..addrs.len() as u16 {
            if !transport.is_up(node) {
                continue;
            }
            let stats = wire::Stats::parse(&transport.call(node, Op::Stats, &[])?)
                .map_err(|e| protocol(&transport, node, e))?;
            loads[node as usize] = stats.slabs.len() as u64;
            let list = wire::parse_list(&transport.call(node, Op::List, &[])?)
                .map_err(|e| protocol(&transport, node, e))?;
            for wire::Listed { slab, tag, newest } in list {
                // Versions only grow: continue past everything this identity ever stored, even
                // if this machine's clock is behind the one that wrote it.
                held_version = held_version.max(newest);
                let Some((code, range, split)) = layout::untag(tag) else {
                    continue;
                };
                if code != layout.code() {
                    return Err(ClientError::LayoutMismatch {
                        node: node as usize,
                        found: code,
                        expected: layout.code(),
                        label: config.resilience.label(),
                    });
                }
                if range as usize >= ranges.len() {
                    beyond = beyond.max(Some(range));
                } else if (split as usize) < layout.width {
                    let g = found.entry(range).or_insert(Group {
                        nodes: [slots::NO_NODE; MAX_WIDTH],
                        slabs: [0; MAX_WIDTH],
                        fresh: 0,
                    });
                    g.nodes[split as usize] = node;
                    g.slabs[split as usize] = slab;
                }
            }
        }
        if let Some(range) = beyond {
            return Err(ClientError::SmallerThanHeld {
                size: config.size,
                start: range as u64 * layout.range_bytes(),
                range,
            });
        }
        let recovered = found.len();
        for (range, g) in found {
            ranges[range as usize].store(Some(Arc::new(g)));
        }
        seed_clock_note(held_version);
        if recovered > 0 {
            tracing::info!(
                ranges = recovered,
                "found this identity's existing address ranges"
            );
        }
        let health: Arc<[NodeHealth]> = (0..cluster.nodes.len())
            .map(|_| NodeHealth::default())
            .collect();
        let views = node_views(&transport, &loads, &domains, &health);
        let seed = config.seed.unwrap_or_else(rand::random);
        let placer = Placer::new(
            cluster.placement_policy(config.placement_l),
            layout.width,
            &views,
            seed,
        )
        .map_err(|source| ClientError::Placement { range: 0, source })?;
        let mem = Arc::new(RemoteMemory {
            layout,
            config,
            codec,
            slots,
            transport: Box::new(transport),
            ranges: Arc::from(ranges),
            placement: Mutex::new(Placement { placer, loads }),
            domains,
            node_ids: cluster.nodes.iter().map(|n| n.id).collect(),
            stats: ClientStats::default(),
            metrics: ClientMetrics::register(),
            clock: AtomicU64::new(held_version),
            health,
            any_suspect: AtomicBool::new(false),
            corrupt_reports: Mutex::new(Vec::new()),
            orphans: Mutex::new(Vec::new()),
            regen: Arc::new(RegenCounters::default()),
            moving: Mutex::new(Vec::new()),
            stuck: Mutex::new(Vec::new()),
            ended: Arc::new(Mutex::new(Vec::new())),
            retry: Mutex::new((Instant::now(), Vec::new())),
            repair_after: Mutex::new(Instant::now()),
        });
        // Maintenance: repair ranges that lost a member, release stale slabs of nodes that came
        // back. It holds only a weak reference and ends when the client is dropped.
        let weak = Arc::downgrade(&mem);
        std::thread::Builder::new()
            .name("hm-maintain".into())
            .spawn(move || loop {
                std::thread::sleep(MAINTENANCE_INTERVAL);
                match weak.upgrade() {
                    Some(mem) => mem.maintain(),
                    None => return,
                }
            })?;
        Ok(mem)
    }

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
        self.check_health();
        self.refresh_loads();
        self.regenerations_ended();
        self.release_orphans();
        self.report_corruption();
    }

    /// Moves every slab of ours that `node` reclaimed (it runs short of memory, or drains) to a
    /// replacement node, copying it while the old slab still serves, then frees the old one.
    fn move_reclaimed(&self, node: u16) {
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
            if self.moving.lock().contains(&(node, c.slab)) {
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
                    let _ = self.transport.call(node, Op::Free, &c.slab.to_le_bytes());
                }
            }
        }
    }

    /// Takes every node's slab count from its last heartbeat as its load, so that this client
    /// places new ranges knowing what other clients allocated since it connected (without it,
    /// clients that connected together keep choosing the same "emptiest" group). Allocates
    /// only when a load changed.
    fn refresh_loads(&self) {
        let mut pl = self.placement.lock();
        let mut changed = false;
        for i in 0..self.transport.nodes() {
            if let Some(slabs) = self.transport.notice(i as u16).slabs {
                if pl.loads[i] != u64::from(slabs) {
                    pl.loads[i] = u64::from(slabs);
                    changed = true;
                }
            }
        }
        if changed {
            let views = node_views(&*self.transport, &pl.loads, &self.domains, &self.health);
            let _ = pl.placer.refresh(&views);
        }
    }

    /// The load (slabs) this client's placement assumes for every node, in cluster-file order.
    pub fn placement_loads(&self) -> Vec<u64> {
        self.placement.lock().loads.clone()
    }

    /// A node came back as a new process: every split of ours it held is lost. They are
    /// repaired like a dropped reclaimed slab (`unstick`): regenerated on a replacement node,
    /// or on the restarted node itself when no other can take them.
    fn node_restarted(&self, node: u16) {
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
        let held: Vec<u32> = match self.transport.call(node, Op::List, &[]) {
            Ok(b) => wire::parse_list(&b)
                .map(|l| l.into_iter().map(|l| l.slab).collect())
                .unwrap_or_default(),
            Err(_) => Vec::new(),
        };
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
    fn locate_slab(&self, node: u16, slab: u32) -> Option<(usize, usize)> {
        let w = self.layout.width;
        (0..self.ranges.len()).find_map(|range| {
            let g = self.ranges[range].load();
            let g = g.as_ref()?;
            (0..w)
                .find(|&j| g.nodes[j] == node && g.slabs[j] == slab)
                .map(|j| (range, j))
        })
    }

    /// Reclaimed slabs we could not move whose node dropped them meanwhile (it no longer
    /// reports any reclaimed slab of ours, or is down): their splits are lost, so repair them
    /// like a failed node's.
    fn unstick(&self) {
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

    /// Acts on regenerations that ended: a finished move frees the slab it replaced; a failed
    /// regeneration is retried while its slab is still the range's.
    fn regenerations_ended(&self) {
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
                    match self.transport.call(node, Op::Free, &slab.to_le_bytes()) {
                        Ok(_) | Err(TransportError::Refused { .. }) => {
                            tracing::info!(node, slab, range = job.range, "moved slab released")
                        }
                        // Its node went away meanwhile: free it when it is back.
                        Err(_) => self.orphans.lock().push((node, slab)),
                    }
                    self.moving.lock().retain(|m| *m != (node, slab));
                }
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

    /// A fresh page version above `past`: a hybrid logical clock, the wall clock in
    /// nanoseconds unless that would not exceed the last version handed out (or `past`).
    /// Versions only grow, across threads and across restarts of a client: a client that
    /// reattaches to an identity starts from the newest version the nodes hold for it
    /// ([`RemoteMemory::connect`]), and a node that refuses a write as stale reports the
    /// version to pass. Fails for page `addr` when no valid version is left.
    fn next_version(&self, addr: u64, past: u64) -> Result<u64, IoError> {
        let now = wall_nanos();
        let mut next = 0;
        let _ = self
            .clock
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| {
                next = now.max(last.max(past).saturating_add(1));
                (next <= wire::MAX_VERSION).then_some(next)
            });
        if next > wire::MAX_VERSION {
            return Err(IoError::VersionsExhausted {
                addr,
                held: past.max(self.clock.load(Ordering::SeqCst)),
                max: wire::MAX_VERSION,
            });
        }
        Ok(next)
    }

    /// Replies dropped because they came from another node than the split was posted to, or
    /// were of another operation than the one they named (a confused or hostile node).
    pub fn foreign_replies(&self) -> u64 {
        self.slots.foreign_replies()
    }

    /// The page geometry of this client.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Size of the address space in bytes.
    pub fn size(&self) -> u64 {
        self.config.size
    }

    /// The client's counters.
    pub fn stats(&self) -> &ClientStats {
        &self.stats
    }

    /// The transport (for status and tests).
    pub fn transport(&self) -> &dyn Transport {
        &*self.transport
    }

    /// The coding group of the range holding `addr`, if mapped.
    pub fn group_of(&self, addr: u64) -> Option<Arc<Group>> {
        let range = (addr / self.layout.range_bytes()) as usize;
        self.ranges.get(range)?.load_full()
    }

    fn locate(&self, addr: u64) -> Result<(usize, u64), IoError> {
        if !addr.is_multiple_of(PAGE_SIZE as u64) {
            return Err(IoError::Unaligned { addr });
        }
        if addr >= self.config.size {
            return Err(IoError::OutOfRange {
                addr,
                size: self.config.size,
            });
        }
        let rb = self.layout.range_bytes();
        Ok(((addr / rb) as usize, (addr % rb) / PAGE_SIZE as u64))
    }

    /// Writes one page. Returns once the mode's acknowledgements are in.
    ///
    /// A node that refuses a split as stale holds a newer version of it than this client's
    /// clock gave (a clock that stepped back, another machine that wrote with this identity):
    /// then the page is written again, whole, with a version past the one the node reported,
    /// so a write is acknowledged only once its bytes are what the nodes hold.
    pub fn write_page(&self, addr: u64, page: &Page) -> Result<(), IoError> {
        let (range, pir) = self.locate(addr)?;
        let start = Instant::now();
        let mut version = self.next_version(addr, 0)?;
        loop {
            match self.write_version(addr, page, (range, pir), version, start)? {
                Written::Done => return Ok(()),
                Written::Stale(held) => {
                    self.stats.stale_rewrites.fetch_add(1, Ordering::Relaxed);
                    self.metrics.stale_rewrites.increment(1);
                    tracing::debug!(
                        addr,
                        version,
                        held,
                        "a node holds a newer version of the page: writing it again past it"
                    );
                    version = self.next_version(addr, held)?;
                }
            }
        }
    }

    /// One attempt of [`RemoteMemory::write_page`] at `version`, on a slot of its own (so
    /// replies to an earlier attempt cannot count for this one).
    fn write_version(
        &self,
        addr: u64,
        page: &Page,
        (range, pir): (usize, u64),
        version: u64,
        start: Instant,
    ) -> Result<Written, IoError> {
        let mut group = match self.ranges[range].load_full() {
            Some(g) => g,
            None => self.map_range(range)?,
        };
        let l = &self.layout;
        let offset = l.split_offset(pir);
        let mut op = self.slots.acquire_write();
        let checksums = self.config.checksums;
        let post = |op: &slots::Op<'_>, group: &Group, j: usize, data: &[u8]| {
            let node = group.nodes[j];
            op.posting(j, node);
            let e = Entry {
                slab: group.slabs[j],
                len: l.split_len as u32,
                offset,
                cookie: op.cookie(j),
                version,
                crc: if checksums {
                    integrity::split_crc(data, range as u64, pir, j, version)
                } else {
                    0
                },
            };
            if node == slots::NO_NODE || self.transport.post_write(node, e, data, true).is_err() {
                op.post_failed(j);
            }
        };
        let s = l.split_len;
        if let Some(codec) = &self.codec {
            // Data splits first, straight from the caller's page...
            for j in 0..l.full_data {
                post(&op, &group, j, &page[j * s..(j + 1) * s]);
            }
            // ...then the padded tail splits (only when k does not divide 4096) and the
            // parity, computed while the data splits are already on the wire.
            let side = op.side();
            let tail = &page[l.full_data * s..];
            let ntail = l.k - l.full_data;
            side[..ntail * s].fill(0);
            side[..tail.len()].copy_from_slice(tail);
            let (tail_buf, parity_buf) = side.split_at_mut(ntail * s);
            encode_parity(codec, l, page, tail_buf, parity_buf);
        }
        // The bytes of split j: in the page, or (tail and parity) in the side buffer.
        let side_ptr = op.side().as_ptr();
        let side_len = l.side_len();
        // SAFETY: the side buffer is owned by the slot for as long as `op` lives, holds at
        // least `side_len` bytes, and write completions never touch it; the data path does not
        // write it again after encoding, so this shared view aliases no mutable one.
        let side = unsafe { std::slice::from_raw_parts(side_ptr, side_len) };
        let split = |j: usize| -> &[u8] {
            if !l.coded() {
                &page[..]
            } else if j < l.full_data {
                &page[j * s..(j + 1) * s]
            } else {
                &side[(j - l.full_data) * s..(j - l.full_data + 1) * s]
            }
        };
        if l.coded() {
            for j in l.full_data..l.width {
                post(&op, &group, j, split(j));
            }
        } else {
            for j in 0..l.width {
                post(&op, &group, j, split(j));
            }
        }
        let mut reroutes = 0;
        let result = loop {
            let result = self.wait(&op, start, |p| {
                let acked = p.landed.count_ones() as usize;
                if acked >= l.write_need {
                    Some(Ok(()))
                } else if acked + p.outstanding().count_ones() as usize >= l.write_need {
                    None
                } else {
                    Some(Err(()))
                }
            });
            if result == Some(Ok(())) && reroutes < 2 * l.width {
                // A move may have switched splits of this range to new slabs while the write
                // was in flight, and its copy may have read the old slab before this split
                // landed there: send such splits to their new slabs too (same version).
                if let Some(cur) = self.ranges[range].load_full() {
                    if !Arc::ptr_eq(&cur, &group) {
                        let mut moved = 0;
                        for j in 0..l.width {
                            if cur.nodes[j] != group.nodes[j] || cur.slabs[j] != group.slabs[j] {
                                op.retry(j);
                                post(&op, &cur, j, split(j));
                                moved += 1;
                            }
                        }
                        group = cur;
                        reroutes += moved.max(1);
                        continue;
                    }
                }
            }
            if result != Some(Err(())) || reroutes >= 2 * l.width {
                break result;
            }
            // Splits whose node failed, or lost the slab, move to a replacement slab chosen by
            // placement; the write then goes on with the same version (paper 4.1.1).
            let p = op.progress();
            let mut moved = 0;
            for j in 0..l.width {
                if p.failed & (1 << j) == 0 {
                    continue;
                }
                let node = group.nodes[j];
                let lost = node == slots::NO_NODE
                    || !self.transport.is_up(node)
                    || matches!(
                        op.first_status(),
                        Some(Status::NoSuchSlab | Status::Internal)
                    );
                if !lost {
                    continue;
                }
                // No replacement node may be up right now (one is reconnecting, say): keep
                // trying until the operation's deadline rather than fail at once.
                group = loop {
                    match self.remap(range, j, node, MoveReason::Lost) {
                        Ok(g) => break g,
                        Err(ClientError::Placement { .. })
                            if start.elapsed() + Duration::from_millis(50)
                                < self.config.op_timeout =>
                        {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        Err(e) => return Err(e.into()),
                    }
                };
                op.retry(j);
                post(&op, &group, j, split(j));
                moved += 1;
                reroutes += 1;
            }
            if moved == 0 {
                break result;
            }
            self.stats
                .rerouted
                .fetch_add(moved as u64, Ordering::Relaxed);
            self.metrics.rerouted.increment(moved as u64);
        };
        let p = op.close();
        let held = op.stale_version();
        if held != 0 {
            // Versions only grow: whatever this attempt's outcome, the clock moves past it.
            self.clock.fetch_max(held, Ordering::SeqCst);
            if !matches!(result, Some(Ok(()))) && start.elapsed() < self.config.op_timeout {
                return Ok(Written::Stale(held));
            }
        }
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .write_seconds
            .record(start.elapsed().as_secs_f64());
        if !matches!(result, Some(Ok(()))) {
            self.metrics.write_errors.increment(1);
        }
        match result {
            Some(Ok(())) => Ok(Written::Done),
            Some(Err(())) => Err(IoError::Unavailable {
                what: "write",
                addr,
                range: range as u64,
                needed: l.write_need,
                got: p.landed.count_ones() as usize,
                nodes: self.describe(&op, p.failed),
            }),
            None => Err(IoError::Timeout {
                what: "write",
                addr,
                range: range as u64,
                waited: start.elapsed(),
                nodes: self.describe(&op, p.outstanding()),
            }),
        }
    }

    /// Moves split `j` of `range` off `lost` (a failed node, or one that lost the slab) to a
    /// replacement slab chosen by placement, never on a node that already holds a split of the
    /// range. The old slab is remembered and freed once its node answers again. Returns the
    /// range's new coding group (or the current one if another thread already moved it).
    fn remap(
        &self,
        range: usize,
        j: usize,
        lost: u16,
        why: MoveReason,
    ) -> Result<Arc<Group>, ClientError> {
        let mut pl = self.placement.lock();
        let g = self.ranges[range]
            .load_full()
            .expect("only mapped ranges are remapped");
        if g.nodes[j] != lost {
            return Ok(g);
        }
        if let MoveReason::Reclaimed { slab } = why {
            if g.slabs[j] != slab {
                return Ok(g);
            }
        }
        let reclaimed = matches!(why, MoveReason::Reclaimed { .. });
        let l = &self.layout;
        // A node that reclaims a slab, or corrupts it, is never its replacement.
        let mut excluded: Vec<u16> = if why != MoveReason::Lost {
            vec![lost]
        } else {
            Vec::new()
        };
        loop {
            let mut views = node_views(&*self.transport, &pl.loads, &self.domains, &self.health);
            for n in &excluded {
                views[*n as usize].available = false;
            }
            let members: Vec<usize> = g.nodes[..l.width]
                .iter()
                .filter(|n| **n != slots::NO_NODE)
                .map(|n| *n as usize)
                .collect();
            let chosen = if lost == slots::NO_NODE {
                // The lost node is unknown (its slab was missing at connect): any available
                // node outside the group, least loaded first.
                (0..views.len())
                    .filter(|n| views[*n].available && !members.contains(n))
                    .min_by_key(|n| views[*n].load)
                    .ok_or(crate::placement::PlacementError::NoReplacement { lost: j })
            } else {
                pl.placer
                    .replace(&views, &members, lost as usize)
                    .or_else(|e| {
                        // No spare node: the lost node itself will do if it is back (it
                        // restarted and lost the slab, or returned after being declared failed).
                        if views[lost as usize].available && why == MoveReason::Lost {
                            Ok(lost as usize)
                        } else {
                            Err(e)
                        }
                    })
            }
            .map_err(|source| ClientError::Placement {
                range: range as u64,
                source,
            })? as u16;
            let mut body = layout::tag(l.code(), range as u32, j as u8)
                .to_le_bytes()
                .to_vec();
            body.extend_from_slice(&(l.split_len as u32).to_le_bytes());
            match self.transport.call(chosen, Op::Alloc, &body) {
                Ok(b) if b.len() == 4 => {
                    let slab = u32::from_le_bytes(b.try_into().expect("4"));
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
                Ok(_) => excluded.push(chosen),
                Err(e) => {
                    tracing::warn!(node = chosen, error = %e, "replacement slab refused; trying another node");
                    excluded.push(chosen);
                }
            }
        }
    }

    /// Starts background regeneration of split `job.split` of `job.range` on the node that now
    /// holds it (paper 4.2): that node reads the surviving splits from their nodes, decodes and
    /// fills the slab, while this client keeps reading and writing the range. Writes go to the
    /// new slab already; the node's version check keeps them from being overwritten by older
    /// regenerated splits. A move (`job.from`) lets the node copy the old slab instead, and
    /// replicas are always copied from a surviving replica.
    fn regenerate(&self, job: RegenJob, g: &Group) {
        let width = self.layout.width;
        let (k, r, copies) = match self.layout.resilience {
            Resilience::Hydra { k, r, .. } => (k, r, false),
            Resilience::Replication { .. } => (1, (width - 1) as u8, true),
        };
        let addr = |n: u16| self.transport.addr(n).parse::<std::net::SocketAddr>().ok();
        // Sources are named by their id in the cluster file; the regenerating node looks
        // their addresses up in its own copy of it.
        let id = |n: u16| self.node_ids.get(n as usize).copied();
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
        let Some(target) = addr(job.node) else {
            return;
        };
        let req = crate::wire::Regen {
            client: self.config.client_id,
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
        let regen = self.regen.clone();
        let ended = self.ended.clone();
        let ranges = self.ranges.clone();
        let range = job.range;
        regen.started.fetch_add(1, Ordering::SeqCst);
        metrics::gauge!("hydramem_client_regenerations_in_progress").increment(1.0);
        let spawned = std::thread::Builder::new()
            .name("hm-regen".into())
            .spawn(move || {
                let t0 = Instant::now();
                let result = send_regen(target, &req);
                metrics::gauge!("hydramem_client_regenerations_in_progress").decrement(1.0);
                let ok = result.is_ok();
                match result {
                    Ok(pages) => {
                        // Complete: reads may use it again (unless the split moved meanwhile).
                        ranges[range].rcu(|g| {
                            g.as_ref().map(|g| {
                                let mut ng = (**g).clone();
                                if ng.nodes[j] == job.node && ng.slabs[j] == job.slab {
                                    ng.fresh &= !(1 << j);
                                }
                                Arc::new(ng)
                            })
                        });
                        regen.pages.fetch_add(pages, Ordering::SeqCst);
                        regen
                            .nanos
                            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::SeqCst);
                        regen.done.fetch_add(1, Ordering::SeqCst);
                        metrics::counter!("hydramem_client_regenerations_total").increment(1);
                        tracing::info!(range, split = j, %target, pages, elapsed = ?t0.elapsed(), moved = job.from.is_some(), "slab regenerated");
                    }
                    Err(e) => {
                        regen.failed.fetch_add(1, Ordering::SeqCst);
                        tracing::warn!(range, split = j, %target, error = %e, "slab regeneration failed; the range stays degraded until a retry succeeds");
                    }
                }
                ended.lock().push((job, ok));
            });
        if spawned.is_err() {
            self.regen.failed.fetch_add(1, Ordering::SeqCst);
            self.ended.lock().push((job, false));
        }
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
            match self.transport.call(*node, Op::Free, &slab.to_le_bytes()) {
                Ok(_) | Err(TransportError::Refused { .. }) => {
                    tracing::info!(node, slab, "released a stale slab on a node that came back");
                    false
                }
                Err(_) => true,
            }
        });
        self.orphans.lock().extend(orphans);
    }

    /// Reads one page. A page never written reads as zeros.
    ///
    /// Only splits of one version are ever combined (see docs/architecture.md, "Versions"). If
    /// the splits that arrive belong to different writes — a write to the page is in flight —
    /// the read is repeated, up to `op_timeout`; it never returns mixed bytes.
    pub fn read_page(&self, addr: u64, page: &mut Page) -> Result<(), IoError> {
        let start = Instant::now();
        let r = self.read_page_at(addr, page, start);
        self.metrics
            .read_seconds
            .record(start.elapsed().as_secs_f64());
        if r.is_err() {
            self.metrics.read_errors.increment(1);
        }
        r
    }

    fn read_page_at(&self, addr: u64, page: &mut Page, start: Instant) -> Result<(), IoError> {
        let mut backoff = Duration::from_micros(20);
        loop {
            match self.read_once(addr, page, start)? {
                ReadOutcome::Done => return Ok(()),
                ReadOutcome::Inconsistent { range } => {
                    self.stats.retries.fetch_add(1, Ordering::Relaxed);
                    if start.elapsed() + backoff >= self.config.op_timeout {
                        return Err(IoError::Inconsistent {
                            addr,
                            range,
                            waited: start.elapsed(),
                        });
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(10));
                }
            }
        }
    }

    fn read_once(
        &self,
        addr: u64,
        page: &mut Page,
        start: Instant,
    ) -> Result<ReadOutcome, IoError> {
        let (range, pir) = self.locate(addr)?;
        let Some(group) = self.ranges[range].load_full() else {
            page.fill(0);
            self.stats.reads.fetch_add(1, Ordering::Relaxed);
            return Ok(ReadOutcome::Done);
        };
        let l = &self.layout;
        let offset = l.split_offset(pir);
        // SAFETY: `page` is exclusively borrowed for this whole call and `op` is dropped before
        // it returns; this function touches the page only after `op.close()` (decoding,
        // checking), and `second_look` closes again before it does (see `Op::reopen`).
        let mut op = unsafe { self.slots.acquire_read(page.as_mut_ptr()) };
        op.bind(range as u64, pir);
        // Candidate splits: those whose node is up, in random order.
        // Regenerated splits first, in random order; then (coded schemes only) the splits
        // still being regenerated, which may lack older pages.
        let mut order = [0u8; MAX_WIDTH];
        let mut n = 0;
        let mut settled = 0;
        for fresh in [false, true] {
            if fresh && !l.coded() {
                break;
            }
            for j in 0..l.width {
                let node = group.nodes[j];
                if (group.fresh & (1 << j) != 0) == fresh
                    && node != slots::NO_NODE
                    && self.transport.is_up(node)
                {
                    order[n] = j as u8;
                    n += 1;
                }
            }
            if !fresh {
                settled = n;
            }
        }
        RNG.with(|r| {
            let mut r = r.borrow_mut();
            for i in (1..settled).rev() {
                order.swap(i, r.random_range(0..=i));
            }
            for i in (settled + 1..n).rev() {
                order.swap(i, r.random_range(settled..=i));
            }
        });
        let mut next = 0;
        // Posts the splits in `again` anew, then up to `count` splits not asked yet; returns
        // how many requests went out.
        let mut post_more = |op: &slots::Op<'_>, count: usize, again: u32| -> usize {
            let post = |j: usize| {
                let node = group.nodes[j];
                op.posting(j, node);
                let e = Entry {
                    slab: group.slabs[j],
                    len: l.split_len as u32,
                    offset,
                    cookie: op.cookie(j),
                    version: 0,
                    crc: 0,
                };
                let ok = self.transport.post_read(node, e, true).is_ok();
                if !ok {
                    op.post_failed(j);
                }
                ok as usize
            };
            let mut posted = (0..l.width)
                .filter(|j| again & (1 << j) != 0)
                .map(post)
                .sum();
            let mut asked = 0;
            while asked < count && next < n {
                let j = order[next] as usize;
                next += 1;
                let ok = post(j);
                asked += ok;
                posted += ok;
            }
            posted
        };
        let fanout = self.initial_fanout(&group);
        post_more(&op, fanout, 0);
        let op_start = Instant::now();
        let mut straggler_check = op_start + self.config.straggler_after;
        let width = l.width;
        // A checking read (detection, correction) needs k + Δ splits of one version. With
        // fewer settled ones (more than r − Δ of the group's nodes down or regenerating),
        // checksums still verify every split, so k verified ones are as safe as ever; without
        // checksums the read waits for regeneration (or fails) rather than return bytes that
        // nothing checked.
        let mut need = if l.detects() && settled < l.read_need && self.config.checksums {
            l.k
        } else {
            l.read_need
        };
        let result = self.wait(&op, start, |p| {
            // The largest set of landed splits that share one version.
            let got = match op.consistent(p.landed, width, need) {
                Ok(_) => return Some(Ok(())),
                Err(largest) => largest,
            };
            let pending = p.outstanding().count_ones() as usize;
            let now = Instant::now();
            if now >= straggler_check {
                // Late binding did not hide the straggler: widen the request by what is missing.
                straggler_check = now + self.config.straggler_after;
                let more = post_more(&op, need - got, 0);
                self.stats
                    .reissued
                    .fetch_add(more as u64, Ordering::Relaxed);
                self.metrics.reissued.increment(more as u64);
                if more > 0 {
                    return None;
                }
            }
            if got + pending < need {
                let more = post_more(&op, need - got - pending, 0);
                if more > 0 {
                    self.stats
                        .reissued
                        .fetch_add(more as u64, Ordering::Relaxed);
                    self.metrics.reissued.increment(more as u64);
                    return None;
                }
                if pending == 0 {
                    // A node failed during the read (before the client knew it was down):
                    // with checksums, k verified splits still make a safe page.
                    if l.detects() && self.config.checksums && need > l.k {
                        need = l.k;
                        if op.consistent(p.landed, width, need).is_ok() {
                            return Some(Ok(()));
                        }
                    }
                    return Some(Err(p.landed.count_ones() as usize >= need));
                }
            }
            None
        });
        let p = op.close();
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        self.count_reads(&op, p.landed | p.corrupt);
        if p.corrupt != 0 {
            self.count_corrupt(&op, p.corrupt, addr, wire::CorruptCause::Checksum);
        }
        match result {
            Some(Ok(())) => {
                let (version, mask) = op
                    .consistent(p.landed, width, need)
                    .expect("a consistent set was found before closing");
                self.finish_read(&mut op, page, mask);
                if l.detects() && !self.codeword_holds(&mut op, page, mask) {
                    let first = Look {
                        addr,
                        range,
                        version,
                        mask,
                        start,
                        before: p,
                    };
                    return self.second_look(&mut op, page, first, &mut post_more);
                }
                Ok(ReadOutcome::Done)
            }
            // Enough splits arrived but from different writes: a write is in flight.
            Some(Err(true)) => Ok(ReadOutcome::Inconsistent {
                range: range as u64,
            }),
            Some(Err(false)) => Err(IoError::Unavailable {
                what: "read",
                addr,
                range: range as u64,
                needed: l.read_need,
                got: p.landed.count_ones() as usize,
                nodes: self.describe_group(&group, &op, p),
            }),
            None => Err(IoError::Timeout {
                what: "read",
                addr,
                range: range as u64,
                waited: start.elapsed(),
                nodes: self.describe(&op, p.outstanding()),
            }),
        }
    }

    /// How many splits a read of `group` asks at once: the layout's fanout, or (paper 4.1.2)
    /// every split it may need when one of the group's nodes is above the
    /// ErrorCorrectionLimit, so that finding its corruption costs no second round trip.
    fn initial_fanout(&self, group: &Group) -> usize {
        let l = &self.layout;
        if !self.any_suspect.load(Ordering::Relaxed) || !(l.corrects() || self.config.checksums) {
            return l.read_fanout;
        }
        let suspect = group.nodes[..l.width].iter().any(|&n| {
            n != slots::NO_NODE && self.health[n as usize].suspect.load(Ordering::Relaxed)
        });
        if !suspect {
            return l.read_fanout;
        }
        self.stats.wide_reads.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("hydramem_client_wide_reads_total").increment(1);
        let wide = if l.corrects() {
            l.k + 2 * l.delta() + 1
        } else {
            l.read_fanout + 1
        };
        wide.min(l.width)
    }

    /// Counts the splits a read got (intact or not) against their nodes, the denominator of
    /// the per-node error rates. Only clients that can find corruption keep the accounts.
    fn count_reads(&self, op: &slots::Op<'_>, got: u32) {
        if !(self.config.checksums || self.layout.detects()) {
            return;
        }
        for j in 0..self.layout.width {
            if got & (1 << j) != 0 {
                if let Some(h) = self.health.get(op.node_of(j) as usize) {
                    h.reads.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Accounts the corrupted splits of a read (`cause`: failed its checksum, or outvoted by
    /// the page's other splits) to the nodes that returned them (off the fast path: only reads
    /// that met corruption come here).
    fn count_corrupt(
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
            .locate(addr)
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
    fn check_health(&self) {
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
    fn evacuate(&self, node: u16) {
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
    fn splits_on(&self, node: u16) -> Vec<(usize, usize, u32)> {
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

    /// A read whose first k + Δ splits disagree (paper 4.1.2): asks Δ + 1 more (up to
    /// k + 2Δ + 1, or all there are), then looks for the one codeword that enough of them
    /// agree with ([`correct`]). Correction mode returns that page and names the corrupted
    /// splits; detection mode uses the second look only to name the corrupted node (possible
    /// when the group is wide enough) and still answers with an error.
    fn second_look(
        &self,
        op: &mut slots::Op<'_>,
        page: &mut Page,
        first: Look,
        post_more: &mut dyn FnMut(&slots::Op<'_>, usize, u32) -> usize,
    ) -> Result<ReadOutcome, IoError> {
        let l = &self.layout;
        let codec = self
            .codec
            .as_ref()
            .expect("only coded reads check codewords");
        let target = (l.k + 2 * l.delta() + 1).min(l.width);
        let version = first.version;
        // SAFETY: `page` (the one the read's slot was acquired for) is not touched from here
        // until `op.close()` below; only the posting of split reads happens in between.
        unsafe { op.reopen() };
        {
            let op: &slots::Op<'_> = op;
            // Replies that came while the slot was closed for the check were dropped: ask
            // those splits again (a reply that still comes lands once, first claim wins).
            post_more(op, 0, first.before.outstanding());
            self.wait(op, first.start, |p| {
                let got = op.of_version(p.landed, l.width, version).count_ones() as usize;
                if got >= target {
                    return Some(());
                }
                let pending = p.outstanding().count_ones() as usize;
                if got + pending < target && post_more(op, target - got - pending, 0) > 0 {
                    return None;
                }
                (pending == 0).then_some(())
            });
        }
        let p = op.close();
        self.count_reads(
            op,
            (p.landed | p.corrupt) & !(first.before.landed | first.before.corrupt),
        );
        let fresh_corrupt = p.corrupt & !first.before.corrupt;
        if fresh_corrupt != 0 {
            self.count_corrupt(op, fresh_corrupt, first.addr, wire::CorruptCause::Checksum);
        }
        let mask = op.of_version(p.landed, l.width, version);
        let newer = (0..l.width).any(|j| p.landed & (1 << j) != 0 && op.version_of(j) > version);
        let s = l.split_len;
        let outcome = {
            let side: &[u8] = op.side();
            let received: Vec<Option<&[u8]>> = (0..l.width)
                .map(|j| {
                    (mask & (1 << j) != 0).then(|| match l.place(j) {
                        layout::Place::Page(off) => &page[off..off + s],
                        layout::Place::Side(off) => &side[off..off + s],
                    })
                })
                .collect();
            correct::correct(codec, &received, s)
        };
        let nodes = self.describe(op, mask);
        match outcome {
            Ok(c) => {
                self.count_corrupt(op, c.corrupt, first.addr, wire::CorruptCause::Codeword);
                if l.corrects() {
                    page.copy_from_slice(&c.splits[..PAGE_SIZE]);
                    self.stats.corrected.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!("hydramem_client_reads_corrected_total").increment(1);
                    return Ok(ReadOutcome::Done);
                }
                page.fill(0);
                self.stats.corrupt_detected.fetch_add(1, Ordering::Relaxed);
                Err(IoError::Corrupt {
                    addr: first.addr,
                    range: first.range as u64,
                    splits: first.mask.count_ones() as usize,
                    nodes,
                    why: format!(
                        "Detection mode does not correct (split(s) {} were the corrupted ones)",
                        describe_mask(c.corrupt)
                    ),
                })
            }
            // Splits of a newer write arrived: a write is in flight, read again.
            Err(_) if newer => {
                page.fill(0);
                Ok(ReadOutcome::Inconsistent {
                    range: first.range as u64,
                })
            }
            Err(e) => {
                page.fill(0);
                self.stats.corrupt_detected.fetch_add(1, Ordering::Relaxed);
                let why = match e {
                    _ if !l.corrects() => {
                        "Detection mode does not correct, and the splits it could read do not \
                         single out the corrupted one"
                            .to_string()
                    }
                    correct::Uncorrectable::TooFew { received } => format!(
                        "Only {received} splits of this version could be read, too few to find the corrupted ones"
                    ),
                    correct::Uncorrectable::TooManyErrors { received, best } => format!(
                        "At most {best} of the {received} splits read agree on one page: more were corrupted than correction mode can correct"
                    ),
                    correct::Uncorrectable::TooManyTrials => {
                        "The search for the corrupted splits gave up".to_string()
                    }
                };
                Err(IoError::Corrupt {
                    addr: first.addr,
                    range: first.range as u64,
                    splits: mask.count_ones() as usize,
                    nodes,
                    why,
                })
            }
        }
    }

    /// Decodes in place after a read closed with `landed`: k or more splits of one version.
    fn finish_read(&self, op: &mut slots::Op<'_>, page: &mut Page, landed: u32) {
        let Some(codec) = &self.codec else { return };
        let l = &self.layout;
        let s = l.split_len;
        let k = l.k;
        let data_mask = (1u32 << k) - 1;
        let side = op.side();
        if landed & data_mask != data_mask {
            self.stats.decodes.fetch_add(1, Ordering::Relaxed);
            // Present: the first k landed splits (data first); missing: the data splits not in.
            let (page_parts, _) = page.split_at_mut(l.full_data * s);
            let mut parts: [Option<&mut [u8]>; MAX_WIDTH] = std::array::from_fn(|_| None);
            for (j, c) in page_parts.chunks_exact_mut(s).enumerate() {
                parts[j] = Some(c);
            }
            for (t, c) in side.chunks_exact_mut(s).enumerate() {
                parts[l.full_data + t] = Some(c);
            }
            let mut present: [(usize, &[u8]); MAX_WIDTH] = [(0, &[]); MAX_WIDTH];
            let mut missing: [(usize, &mut [u8]); MAX_WIDTH] =
                std::array::from_fn(|_| (0, &mut [][..]));
            let (mut np, mut nm) = (0, 0);
            for (j, part) in parts.iter_mut().enumerate().take(l.width) {
                let is_landed = landed & (1 << j) != 0;
                if is_landed && np < k {
                    present[np] = (j, part.take().expect("each split once"));
                    np += 1;
                } else if !is_landed && j < k {
                    missing[nm] = (j, part.take().expect("each split once"));
                    nm += 1;
                }
            }
            codec
                .reconstruct(&present[..np], &mut missing[..nm])
                .expect("k landed splits of a valid layout always decode");
        }
        // Data splits that reach past the page were landed/decoded in the side buffer.
        let tail = l.full_data * s;
        if tail < PAGE_SIZE {
            page[tail..].copy_from_slice(&op.side()[..PAGE_SIZE - tail]);
        }
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

    /// Corruption detection, after [`Self::finish_read`] put the page together from k of the
    /// splits in `mask`: re-encodes the parity from the page and compares it with every parity
    /// split in `mask`. The splits used to decode agree by construction; every other one is a
    /// check, so with k + Δ splits up to Δ corrupted ones are always caught (any two codewords
    /// differ in at least r + 1 splits). Allocation-free: the parity is re-encoded into the
    /// side buffer's check area.
    fn codeword_holds(&self, op: &mut slots::Op<'_>, page: &Page, mask: u32) -> bool {
        let Some(codec) = &self.codec else {
            return true;
        };
        let l = &self.layout;
        let (s, k, r) = (l.split_len, l.k, l.width - l.k);
        let side = op.side();
        let (front, check) = side.split_at_mut(l.check_offset());
        let ntail = k - l.full_data;
        let (tail, parity) = front.split_at(ntail * s);
        encode_parity(codec, l, page, tail, check);
        (0..r).all(|p| {
            let at = p * s..(p + 1) * s;
            mask & (1 << (k + p)) == 0 || check[at.clone()] == parity[at]
        })
    }

    /// Polls, then parks, until `check` decides or the operation times out (`None`).
    fn wait<T>(
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

    fn describe(&self, op: &slots::Op<'_>, mask: u32) -> String {
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

    fn describe_group(&self, g: &Group, op: &slots::Op<'_>, p: Progress) -> String {
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

    fn node_label(&self, node: u16) -> String {
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

    /// Maps range `range` to a new coding group (first write).
    fn map_range(&self, range: usize) -> Result<Arc<Group>, ClientError> {
        let mut pl = self.placement.lock();
        if let Some(g) = self.ranges[range].load_full() {
            return Ok(g);
        }
        let l = &self.layout;
        let mut excluded: Vec<u16> = Vec::new();
        let mut full: Vec<u16> = Vec::new();
        loop {
            let mut views = node_views(&*self.transport, &pl.loads, &self.domains, &self.health);
            for n in &excluded {
                views[*n as usize].available = false;
            }
            let chosen = match pl.placer.place(&views) {
                Ok(c) => c,
                Err(_) if !full.is_empty() => {
                    return Err(ClientError::OutOfCapacity {
                        range: range as u64,
                        full: full
                            .iter()
                            .map(|n| self.node_label(*n))
                            .collect::<Vec<_>>()
                            .join(", "),
                    })
                }
                Err(source) => {
                    return Err(ClientError::Placement {
                        range: range as u64,
                        source,
                    })
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
                let mut body = tag.to_le_bytes().to_vec();
                body.extend_from_slice(&(l.split_len as u32).to_le_bytes());
                match self.transport.call(node, Op::Alloc, &body) {
                    Ok(body) if body.len() == 4 => {
                        g.nodes[j] = node;
                        g.slabs[j] = u32::from_le_bytes(body.try_into().expect("4"));
                        pl.loads[node as usize] += 1;
                    }
                    Ok(_) => {
                        failed = Some((node, None));
                        break;
                    }
                    Err(e) => {
                        failed = Some((node, Some(e)));
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
                            let _ = self.transport.call(
                                g.nodes[j],
                                Op::Free,
                                &g.slabs[j].to_le_bytes(),
                            );
                            pl.loads[g.nodes[j] as usize] -= 1;
                        }
                    }
                    tracing::warn!(node, error = ?err, "slab allocation failed; trying other nodes");
                    excluded.push(node);
                    if let Some(TransportError::Refused {
                        status: Status::NoCapacity,
                        ..
                    }) = err
                    {
                        full.push(node);
                        continue;
                    }
                    if let Some(e) = err {
                        if !matches!(
                            e,
                            TransportError::Down { .. } | TransportError::Timeout { .. }
                        ) {
                            return Err(e.into());
                        }
                    }
                }
            }
        }
    }

    /// Frees every slab this client holds (its data is gone afterwards).
    pub fn free_all(&self) -> Result<(), ClientError> {
        let mut pl = self.placement.lock();
        for r in self.ranges.iter() {
            if let Some(g) = r.swap(None) {
                for j in 0..self.layout.width {
                    let node = g.nodes[j];
                    if node != slots::NO_NODE && self.transport.is_up(node) {
                        self.transport
                            .call(node, Op::Free, &g.slabs[j].to_le_bytes())?;
                        pl.loads[node as usize] = pl.loads[node as usize].saturating_sub(1);
                    }
                }
            }
        }
        Ok(())
    }
}

/// Builds the decode tables of every loss pattern a read can meet (any k of the k + r splits
/// present, the data splits among the others missing) before the first read, so that no read
/// pays the ~2 µs matrix inversion or the allocation of a first use. Skipped for codes with
/// more than 4096 patterns, whose tables are then built on first use.
fn prepare_decode_tables(codec: &Codec, l: &Layout) {
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

/// The placer's view: a node takes new slabs if it is up and has not said it refuses them
/// (draining, or out of memory budget), and this client does not avoid it for corruption.
fn node_views(
    t: &dyn Transport,
    loads: &[u64],
    domains: &[Option<u32>],
    health: &[NodeHealth],
) -> Vec<NodeView> {
    (0..t.nodes())
        .map(|i| NodeView {
            available: t.is_up(i as u16)
                && !t.notice(i as u16).refusing
                && !health[i].avoided.load(Ordering::Relaxed),
            load: loads[i],
            domain: domains[i],
        })
        .collect()
}

fn protocol(t: &dyn Transport, node: u16, e: wire::WireError) -> ClientError {
    ClientError::Transport(TransportError::Protocol {
        node,
        addr: t.addr(node),
        reason: e.to_string(),
    })
}
