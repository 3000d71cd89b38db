//! The client's counters ([`ClientStats`], read by the bench and tests) and its Prometheus
//! handles, registered once at connect so that the data path only records into them.

use std::sync::atomic::AtomicU64;

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
    /// Write splits left behind: their node had not acknowledged them when the rest of the
    /// page's write was, after `write_straggler_after`; sent again in the background.
    pub left_behind: AtomicU64,
}

/// Prometheus handles, registered once at connect so that the data path only records into
/// them (without `--metrics` they are no-ops).
pub(super) struct ClientMetrics {
    pub(super) read_seconds: metrics::Histogram,
    pub(super) write_seconds: metrics::Histogram,
    pub(super) read_errors: metrics::Counter,
    pub(super) write_errors: metrics::Counter,
    pub(super) reissued: metrics::Counter,
    pub(super) rerouted: metrics::Counter,
    pub(super) corrupt: metrics::Counter,
    pub(super) stale_rewrites: metrics::Counter,
}

impl ClientMetrics {
    pub(super) fn register() -> ClientMetrics {
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
