//! The client's errors: [`ClientError`] for starting and mapping memory, [`IoError`] for a
//! page operation. Each names the page, its range and the nodes involved, and says what to do.

use std::time::Duration;

use super::layout;
use super::transport::{Transport, TransportError};
use crate::units::human;
use crate::wire::{self};

/// Errors that stop a client from starting or from mapping memory.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The membership in etcd could not be read.
    #[error(transparent)]
    Membership(#[from] crate::membership::MembershipError),
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
    /// A node says another process holds this client's identity (its connections there are
    /// open): two processes must never write into one identity's slabs.
    #[error(
        "node {node} at {addr} says another process holds this client identity (its \
         connections to the node are open): stop that process first, or give this one another \
         --client-id (if that process's machine is gone, the node lets the identity go within \
         30 s; if it just ended, its last repairs may hold the identity a little longer: try \
         again)"
    )]
    IdentityInUse {
        /// The node, in the cluster file's order.
        node: usize,
        /// Its address.
        addr: String,
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
    /// A repair was asked for a range whose memory was released meanwhile (the client is
    /// ending): there is nothing left to repair.
    #[error(
        "address range {range} is no longer mapped (its memory was released): nothing to repair"
    )]
    Unmapped {
        /// The range.
        range: u64,
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
    /// A submission could not take the slots of all its pages at once: it takes all or none,
    /// and never waits for one (see `client::submit`).
    #[error("{what} of {pages} pages from {addr:#x} could not start: only {free} of the {slots} operation slots were free, and a submission takes one per page at once or none (it never waits for a slot); end earlier submissions first, use a call that waits, or raise max_in_flight")]
    NoSlot {
        /// "read" or "write".
        what: &'static str,
        /// The first page of the submission.
        addr: u64,
        /// Pages it needed slots for.
        pages: usize,
        /// Slots it found free.
        free: usize,
        /// The client's slots (max_in_flight).
        slots: usize,
    },
    /// A submission larger than one window.
    #[error("a {what} submission of {pages} pages is larger than the {max} pages one keeps in flight; submit at most {max} pages at a time")]
    SubmissionTooLarge {
        /// "read" or "write".
        what: &'static str,
        /// Pages submitted.
        pages: usize,
        /// Most pages of one submission.
        max: usize,
    },
    /// A page of a submission needs a second attempt, which the submission's waiter does not
    /// make: it may hold other submissions' slots, so it never waits for one.
    #[error("{what} of page {addr:#x} needs a second attempt ({why}), which a submission does not make because its waiter never waits for an operation slot; {what} the page again with a call that waits")]
    Again {
        /// "read" or "write".
        what: &'static str,
        /// The page.
        addr: u64,
        /// Why the first attempt did not conclude.
        why: &'static str,
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
    /// A page call on a span-coded client: its address space is rows of whole pages, which
    /// only [`crate::span::SpanStore`] reads and writes (it maps pages to rows).
    #[error("{what} of page {addr:#x} asked of a span-coded client directly: span schemes keep pages in rows that only the span store maps (hydramem::span::SpanStore, which every front end builds through FrontStore); use it")]
    SpanPages {
        /// "read" or "write".
        what: &'static str,
        /// The page.
        addr: u64,
    },
    /// The range could not be mapped.
    #[error(transparent)]
    Map(#[from] ClientError),
    /// A store layered over the remote memory could not serve the page from its own copy
    /// either (the local file of the `ssd-backup` scheme, `crate::backup`); the error says
    /// which copy failed how, and what to do.
    #[error("{0}")]
    Store(Box<dyn std::error::Error + Send + Sync + 'static>),
}

pub(super) fn protocol(t: &dyn Transport, node: u16, e: wire::WireError) -> ClientError {
    ClientError::Transport(TransportError::Protocol {
        node,
        addr: t.addr(node),
        reason: e.to_string(),
    })
}
