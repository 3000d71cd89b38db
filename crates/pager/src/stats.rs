//! What the pager did, for its report: page-ins and their latency (fault read to page
//! mapped), page-outs by kind, and the faults it resolved without the cluster.
//!
//! Invariants: counters only grow; a page-in is timed from the moment its fault was read to
//! the moment the page was mapped and its thread woken, and split into its phases: the wait
//! for the pager's lock before the fault could be read (not in the page-in's time), the
//! remote read, and the mapping (the lock taken again, the page copied in, the thread woken).
//! The pages read ahead with it are mapped after the thread is woken: timed apart, not in the
//! page-in's time, which the program does not wait for.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde::Serialize;

use crate::ahead::Window;

/// Counters of one pager.
#[derive(Default)]
pub struct Stats {
    /// Pages fetched from the cluster and mapped.
    pub page_ins: AtomicU64,
    /// Missing faults answered with zeros (first touches).
    pub zero_fills: AtomicU64,
    /// Pages mapped to the zero page after a first touch, before their own (`zero_ahead`).
    pub zeroed_ahead: AtomicU64,
    /// Missing-fault reports the page was mapped before they were read (a read-ahead or
    /// another thread's fault mapped it), or whose range was gone: nothing to do.
    pub stale_reports: AtomicU64,
    /// Writes to pages the evictor had write-protected to copy them (mapped pages are
    /// writable: no other write faults).
    pub write_protect_faults: AtomicU64,
    /// Faults that waited for an eviction in flight.
    pub deferred: AtomicU64,
    /// Missing faults held back while the program was far over its budget (`throttle.rs`).
    pub held: AtomicU64,
    /// Their time held, in total (µs).
    pub held_us: AtomicU64,
    /// Pages written to the cluster.
    pub written: AtomicU64,
    /// Clean pages dropped without a write (their slot held them).
    pub clean_drops: AtomicU64,
    /// Pages read ahead of a fault and mapped.
    pub read_ahead: AtomicU64,
    /// Windows of page-ins that read ahead (`ahead.rs`).
    pub ahead_windows_read: AtomicU64,
    /// Windows of page-ins that measured whether to read ahead (and read none).
    pub ahead_windows_measured: AtomicU64,
    /// The share of sequential page-ins the last measured window saw, in percent.
    pub sequential_percent: AtomicU64,
    /// Missing faults answered from the standby pool (pages not sent out yet).
    pub standby_ins: AtomicU64,
    /// All-zero pages dropped without a write.
    pub zero_drops: AtomicU64,
    /// Times the kernel refused to drop a page (the program locked it, mlock): it stays in
    /// local memory until unlocked (a page locked again after an unlock is counted again).
    pub undroppable: AtomicU64,
    /// Missing faults the evictor read before a commit and handed to the fault thread.
    pub handed: AtomicU64,
    /// Pages that could not be written out and stayed resident.
    pub kept: AtomicU64,
    /// Pages the cluster could not return (poisoned: SIGBUS).
    pub lost: AtomicU64,
    /// Batched writes of evicted pages.
    pub batches: AtomicU64,
    /// Highest resident anonymous memory of the program seen, in bytes (the process's, less
    /// the pager's own).
    pub peak_resident: AtomicU64,
    /// Highest memory of the pager's own seen (its heap less the standby pool), in bytes.
    pub peak_own: AtomicU64,
    page_in_us: Mutex<Option<Histogram<u64>>>,
    lock_wait_us: Mutex<Option<Histogram<u64>>>,
    fetch_us: Mutex<Option<Histogram<u64>>>,
    fetch_evicting_us: Mutex<Option<Histogram<u64>>>,
    map_us: Mutex<Option<Histogram<u64>>>,
    ahead_us: Mutex<Option<Histogram<u64>>>,
    write_us: Mutex<Option<Histogram<u64>>>,
}

/// Where one page-in's time went.
#[derive(Debug, Clone, Copy)]
pub struct PageIn {
    /// From the fault report being readable to the pager's lock taken (before the page-in).
    pub lock_wait: Duration,
    /// The remote read (the page and those read ahead).
    pub fetch: Duration,
    /// Whether an eviction batch was in flight when the read started (its write shares the
    /// connections and the cores).
    pub evicting: bool,
    /// The lock taken again, the page copied in, the thread woken.
    pub map: Duration,
    /// After the thread was woken: the pages read ahead copied in (zero when none was).
    pub ahead: Duration,
}

/// Latency percentiles in microseconds.
#[derive(Debug, Serialize, Default, Clone, Copy)]
pub struct Percentiles {
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Largest.
    pub max: u64,
}

/// The report's numbers.
#[derive(Debug, Serialize, Default)]
pub struct Summary {
    /// Pages fetched from the cluster and mapped.
    pub page_ins: u64,
    /// Page-in latency, fault read to page mapped and its thread woken (µs).
    pub page_in_us: Percentiles,
    /// Before a page-in: the wait for the pager's lock to read the fault (µs).
    pub page_in_lock_wait_us: Percentiles,
    /// Of a page-in: the remote read (µs).
    pub page_in_fetch_us: Percentiles,
    /// The remote reads that started while an eviction batch was in flight (µs).
    pub page_in_fetch_evicting_us: Percentiles,
    /// Page-ins whose remote read started while an eviction batch was in flight.
    pub page_ins_evicting: u64,
    /// Of a page-in: mapping the page and waking the thread (µs).
    pub page_in_map_us: Percentiles,
    /// After a page-in whose read brought pages ahead: mapping them, once the thread runs
    /// again (µs; not in the page-in's latency).
    pub page_in_ahead_us: Percentiles,
    /// Missing faults answered with zeros (first touches).
    pub zero_fills: u64,
    /// Pages mapped to the zero page after a first touch, before their own.
    pub zeroed_ahead: u64,
    /// Missing-fault reports the page was mapped before they were read, or whose range
    /// was gone: nothing to do.
    pub stale_reports: u64,
    /// Writes to pages the evictor had write-protected to copy them (mapped pages are
    /// writable: no other write faults).
    pub write_protect_faults: u64,
    /// Faults that waited for an eviction in flight.
    pub deferred: u64,
    /// Missing faults held back while the program was far over its budget.
    pub held: u64,
    /// Their time held, in total (ms).
    pub held_ms: u64,
    /// Pages written to the cluster.
    pub written: u64,
    /// Clean pages dropped without a write (their slot held them).
    pub clean_drops: u64,
    /// Pages read ahead of a fault and mapped.
    pub read_ahead: u64,
    /// Windows of page-ins that read ahead.
    pub ahead_windows_read: u64,
    /// Windows of page-ins that measured whether to read ahead (and read none).
    pub ahead_windows_measured: u64,
    /// The share of sequential page-ins the last measured window saw, in percent.
    pub sequential_percent: u64,
    /// Missing faults answered from the standby pool (pages not sent out yet).
    pub standby_ins: u64,
    /// All-zero pages dropped without a write.
    pub zero_drops: u64,
    /// Times the kernel refused to drop a page (the program locked it, mlock): it stays in
    /// local memory until unlocked (a page locked again after an unlock is counted again).
    pub undroppable: u64,
    /// Missing faults the evictor read before a commit and handed to the fault thread.
    pub handed: u64,
    /// Pages that could not be written out and stayed resident.
    pub kept: u64,
    /// Pages the cluster could not return (poisoned: SIGBUS).
    pub lost: u64,
    /// Batched writes of evicted pages.
    pub batches: u64,
    /// Latency of one batched write of evicted pages (µs).
    pub batch_write_us: Percentiles,
    /// Highest resident anonymous memory of the program seen, in bytes (the process's, less
    /// the pager's own).
    pub peak_resident: u64,
    /// Highest memory of the pager's own seen, in bytes (its heap less the standby pool).
    pub peak_own: u64,
}

fn record(h: &Mutex<Option<Histogram<u64>>>, d: Duration) {
    let mut h = h.lock();
    let h = h
        .get_or_insert_with(|| Histogram::new_with_bounds(1, 60_000_000, 2).expect("valid bounds"));
    let _ = h.record(d.as_micros().clamp(1, 60_000_000) as u64);
}

fn percentiles(h: &Mutex<Option<Histogram<u64>>>) -> Percentiles {
    h.lock()
        .as_ref()
        .map_or(Percentiles::default(), |h| Percentiles {
            p50: h.value_at_quantile(0.5),
            p90: h.value_at_quantile(0.9),
            p99: h.value_at_quantile(0.99),
            max: h.max(),
        })
}

impl Stats {
    /// Adds one to `c`.
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// A page-in whose fault took `d` to resolve, the pages read ahead included, in the
    /// phases `p`.
    pub fn page_in(&self, d: Duration, p: PageIn) {
        Stats::add(&self.page_ins, 1);
        record(&self.page_in_us, d.saturating_sub(p.ahead));
        if !p.ahead.is_zero() {
            record(&self.ahead_us, p.ahead);
        }
        record(&self.lock_wait_us, p.lock_wait);
        record(&self.fetch_us, p.fetch);
        if p.evicting {
            record(&self.fetch_evicting_us, p.fetch);
        }
        record(&self.map_us, p.map);
    }

    /// A window of page-ins ended as `w` (`ahead.rs`).
    pub fn ahead_window(&self, w: Window) {
        match w {
            Window::Read => Self::add(&self.ahead_windows_read, 1),
            Window::Measured { percent, .. } => {
                Self::add(&self.ahead_windows_measured, 1);
                self.sequential_percent
                    .store(u64::from(percent), Ordering::Relaxed);
            }
        }
    }

    /// A missing fault was held back for `d` (`throttle.rs`).
    pub fn held(&self, d: Duration) {
        Self::add(&self.held, 1);
        Self::add(&self.held_us, d.as_micros().try_into().unwrap_or(u64::MAX));
    }

    /// A batch write that took `d`.
    pub fn batch(&self, d: Duration) {
        Stats::add(&self.batches, 1);
        record(&self.write_us, d);
    }

    /// The resident memory seen now.
    pub fn resident(&self, bytes: u64) {
        self.peak_resident.fetch_max(bytes, Ordering::Relaxed);
    }

    /// The pager's own memory seen now.
    pub fn own(&self, bytes: u64) {
        self.peak_own.fetch_max(bytes, Ordering::Relaxed);
    }

    /// The numbers so far.
    pub fn summary(&self) -> Summary {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Summary {
            page_ins: g(&self.page_ins),
            page_in_us: percentiles(&self.page_in_us),
            page_in_lock_wait_us: percentiles(&self.lock_wait_us),
            page_in_fetch_us: percentiles(&self.fetch_us),
            page_in_fetch_evicting_us: percentiles(&self.fetch_evicting_us),
            page_ins_evicting: self
                .fetch_evicting_us
                .lock()
                .as_ref()
                .map_or(0, |h| h.len()),
            page_in_map_us: percentiles(&self.map_us),
            page_in_ahead_us: percentiles(&self.ahead_us),
            zero_fills: g(&self.zero_fills),
            zeroed_ahead: g(&self.zeroed_ahead),
            stale_reports: g(&self.stale_reports),
            write_protect_faults: g(&self.write_protect_faults),
            deferred: g(&self.deferred),
            held: g(&self.held),
            held_ms: g(&self.held_us) / 1000,
            written: g(&self.written),
            clean_drops: g(&self.clean_drops),
            read_ahead: g(&self.read_ahead),
            ahead_windows_read: g(&self.ahead_windows_read),
            ahead_windows_measured: g(&self.ahead_windows_measured),
            sequential_percent: g(&self.sequential_percent),
            standby_ins: g(&self.standby_ins),
            zero_drops: g(&self.zero_drops),
            undroppable: g(&self.undroppable),
            handed: g(&self.handed),
            kept: g(&self.kept),
            lost: g(&self.lost),
            batches: g(&self.batches),
            batch_write_us: percentiles(&self.write_us),
            peak_resident: g(&self.peak_resident),
            peak_own: g(&self.peak_own),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phases(ahead_us: u64) -> PageIn {
        PageIn {
            lock_wait: Duration::from_micros(1),
            fetch: Duration::from_micros(40),
            evicting: false,
            map: Duration::from_micros(10),
            ahead: Duration::from_micros(ahead_us),
        }
    }

    #[test]
    fn a_page_in_ends_when_its_thread_is_woken_not_after_the_pages_read_ahead() {
        let s = Stats::default();
        s.page_in(Duration::from_micros(60), phases(8));
        s.page_in(Duration::from_micros(60), phases(8));
        s.page_in(Duration::from_micros(52), phases(0));
        let r = s.summary();
        assert_eq!(r.page_ins, 3);
        assert_eq!(r.page_in_us.p50, 52);
        assert_eq!(r.page_in_us.max, 52);
        assert_eq!(r.page_in_map_us.p50, 10);
        // Only the page-ins that read ahead are in its histogram.
        assert_eq!(r.page_in_ahead_us.p50, 8);
        assert_eq!(r.page_in_ahead_us.max, 8);
    }
}
