//! What a client is configured with besides the cluster file: the scheme, the address-space
//! size, the identity, timeouts and the integrity limits. [`ClientConfig::new`] gives the
//! defaults every front end starts from.

use std::time::Duration;

use super::tcp::TcpOptions;
use super::Resilience;
use crate::wire::ClientId;

/// Design choices of the data path that a measurement may turn off, one at a time, to see what
/// each is worth (paper Fig. 10). All off (the default) is the real data path; nothing but
/// `hydramem bench` should turn one on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ablation {
    /// Encode the parity before sending any split, instead of sending the data splits while
    /// the parity is encoded (asynchronously encoded write, paper 4.1.1).
    pub encode_first: bool,
    /// Read into and write from a bounce buffer per page, with a copy to or from the caller's
    /// page, instead of landing and sending splits in place (in-place coding, paper 4.1.3).
    pub bounce: bool,
    /// Send every page of a multi-page call in messages of its own (flushed page by page, one
    /// split per entry), instead of runs that share one frame per node (batching).
    pub unbatched: bool,
}

/// Everything a client needs besides the cluster file.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Resilience scheme and its parameters.
    pub resilience: Resilience,
    /// Size of the remote address space in bytes (rounded up to whole pages).
    pub size: u64,
    /// Identity that owns the client's slabs; reconnecting with it finds them again.
    pub client_id: ClientId,
    /// Whether the identity is kept (given, to be reattached later, rather than random): the
    /// nodes then keep its slabs for their long lease after its connections close (see
    /// `node::tenants`).
    pub kept: bool,
    /// How long a waiting thread polls before it sleeps.
    pub poll: Duration,
    /// Threads that may poll at once; a thread that waits while this many poll parks at
    /// once (threads spinning together take the cores the nodes and the transport need).
    /// Default: half the CPUs, at least one.
    pub pollers: usize,
    /// How long one page operation may take before it fails.
    pub op_timeout: Duration,
    /// A read still short of k splits after this long asks the splits it has not asked yet
    /// (a straggler or a silently stalled node must not hold the page up).
    pub straggler_after: Duration,
    /// A page write whose splits are all acknowledged but a few (at most
    /// [`super::Layout::max_lagging`]) after this long completes, and the missing splits are
    /// sent again in the background until their node takes them (a straggler must not hold
    /// writes up until the failure detector acts; see `client/lagging.rs`).
    pub write_straggler_after: Duration,
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
    /// Design choices turned off for a measurement (none by default).
    pub ablation: Ablation,
    /// Span schemes: the remote bytes held per byte of data above which compaction starts
    /// while writes flow (`None`: 1.16 × the code's cost, 1.45 for span-8+2). Higher holds
    /// more garbage and moves fewer pages ([`crate::span::compact::Thresholds`]). Other
    /// schemes ignore it.
    pub span_max_cost: Option<f64>,
    /// How often maintenance asks each node which of this client's slabs it still holds
    /// ([`RemoteMemory::audit`](super::RemoteMemory)), so that a split whose slab a node no
    /// longer has is repaired even while only read.
    pub audit_interval: Duration,
    /// The process this client speaks for its identity as ([`crate::rpc::process_instance`]
    /// by default): nodes refuse an identity to a second instance while the first one's
    /// connections are open. A test sets another to play a second process.
    pub instance: u64,
}

impl ClientConfig {
    /// Defaults for a scheme and an address-space size.
    pub fn new(resilience: Resilience, size: u64) -> ClientConfig {
        ClientConfig {
            resilience,
            size,
            client_id: ClientId::random(),
            kept: false,
            poll: Duration::from_micros(50),
            pollers: std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1)),
            op_timeout: Duration::from_secs(10),
            straggler_after: Duration::from_millis(5),
            write_straggler_after: Duration::from_millis(20),
            max_in_flight: 1024,
            placement_l: 2,
            seed: None,
            tcp: TcpOptions::default(),
            checksums: true,
            error_correction_limit: 0.001,
            slab_regeneration_limit: 0.01,
            error_window: 1000,
            ablation: Ablation::default(),
            span_max_cost: None,
            audit_interval: Duration::from_secs(10),
            instance: crate::rpc::process_instance(),
        }
    }
}
