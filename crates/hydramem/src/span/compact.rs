//! Compaction of span rows: overwritten pages leave dead pieces in their old rows, and writes
//! of fewer than k pages leave partial rows, so the remote memory a span store uses drifts
//! above the code's cost (k + r)/k per page. Compaction reads the live pages of the emptiest
//! rows and writes them again packed into full rows; the rows they leave become free.
//!
//! Policy: a background thread compacts when the rows in use cost more than [`HIGH`] times
//! the code's cost (woken by the write that crossed it), and stops once they are back within
//! [`BUSY_LOW`] times it while client writes flow, [`LOW`] times it once they have paused for
//! [`IDLE`] (or when asked to compact), or when no rows are left whose pages would pack
//! tighter. Each pass takes the sparsest rows first (most memory freed per page moved), at
//! most [`VICTIMS`] of them. While writes flow, compacting further than the writes need
//! gains no memory — the free rows stay held until writes pause, and the writes fill them —
//! and costs page moves: under `hydramem run` (redis at 50%), stopping at 1.3 moved 40–47k
//! pages beside 104k written out, stopping at 1.4 moved 20–23k, with the nodes holding 1.45
//! remote bytes per byte either way (docs/benchmarks.md §12).
//!
//! Memory: a free row's pieces occupy the nodes until given back. After a compaction, the top
//! rows in use move down into the holes when the row space has spread, and the rows above the
//! highest in use go back with DISCARD ([`shrink`]). The free rows left below it go back once
//! writes have paused for [`IDLE`] ([`give_back_if_idle`]), at least [`MIN_DISCARD`] at a
//! time: while writes flow, the free rows are where they land next (lowest first), and giving
//! them back meanwhile costs a DISCARD per node now, a page fault per piece then, and reads
//! queued behind the DISCARDs (measured: span's QD1 read p99 1.9× with free rows given back
//! after every compaction). A write that reuses a row makes the nodes hold it again.
//!
//! Invariants: a page moves only if it is still where compaction read it
//! ([`super::map::PageMap::move_if`]): a write that moved it meanwhile wins, and the
//! compacted copy is garbage at once. A page is read with the version the map gave, so the
//! bytes written are exactly that version's. Rows are freed only by the live-count rule of
//! [`super::table`], never by compaction directly.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::map::Loc;
use super::table::Occupancy;
use super::Core;
use crate::client::{ClientError, IoError, Newer, Page, PieceRead, PieceWant, Resilience};
use crate::PAGE_SIZE;

/// Compaction starts above this multiple of the code's cost (k + r)/k: 1.45 for 8 + 2, under
/// the 1.5 the design allows in steady state.
pub const HIGH: f64 = 1.16;
/// ... and stops at this multiple once client writes have paused for [`IDLE`], or when asked
/// to compact: 1.3 for 8 + 2.
pub const LOW: f64 = 1.04;
/// ... and at this multiple while client writes flow: 1.4 for 8 + 2 (with a ceiling other
/// than [`HIGH`], the same fraction of it).
pub const BUSY_LOW: f64 = 1.12;
/// The lowest ceiling a user may set, as a multiple of the code's cost: room above [`LOW`]
/// for compaction to stop short of while writes flow.
pub const MIN_HIGH: f64 = 1.1;
/// Rows looked at per pass.
pub const VICTIMS: usize = 64;
/// Below this many rows in use the store is too small for garbage to matter.
pub const MIN_ROWS: u64 = 32;
/// Free rows below the top are given back to the nodes only this many at a time (each run of
/// consecutive rows costs a DISCARD per node of its range).
pub const MIN_DISCARD: u64 = 16;
/// How long writes must have paused before the free rows below the top are given back.
pub const IDLE: Duration = Duration::from_secs(1);

/// Where compaction starts and stops, in remote bytes held per byte of live data.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// Compaction starts above this.
    pub high: f64,
    /// ... and stops at this while client writes flow,
    pub busy_low: f64,
    /// ... and at this once they have paused for [`IDLE`], or when asked to compact.
    pub low: f64,
}

impl Thresholds {
    /// For rows of `k` pages and `width` pieces, compaction starting above `max_cost` remote
    /// bytes per byte (`None`: [`HIGH`] times the code's cost, 1.45 for 8 + 2). A higher
    /// ceiling trades memory for page moves: memcached under `hydramem run` at 50% moved as
    /// many pages as it wrote out at 1.45, a third of that at 1.7 (docs/benchmarks.md §12).
    /// While writes flow compaction stops the same fraction below the ceiling as by default;
    /// once they pause it goes down to [`LOW`] times the code's cost whatever the ceiling.
    /// The ceiling must leave room above that: at least 1.1 times the code's cost.
    pub fn new(k: usize, width: usize, max_cost: Option<f64>) -> Result<Thresholds, ClientError> {
        let base = width as f64 / k.max(1) as f64;
        let high = max_cost.unwrap_or(base * HIGH);
        let least = base * MIN_HIGH;
        if !(high.is_finite() && high >= least) {
            return Err(ClientError::Config(format!(
                "a span max cost of {high} remote bytes per byte is below what span-{k}+{r} \
                 can compact to while writes flow: give at least {least:.3} (1.1 × the code's \
                 cost {base:.3}; the default is {default:.3})",
                r = width.saturating_sub(k),
                default = base * HIGH,
            )));
        }
        Ok(Thresholds {
            high,
            busy_low: high * BUSY_LOW / HIGH,
            low: base * LOW,
        })
    }

    /// [`Thresholds::new`] for the rows of `scheme` with a ceiling of `max_cost`; `None` for a
    /// scheme that is not span coded (it has no compaction, and ignores the ceiling). What a
    /// front end checks a user's ceiling with before it connects.
    pub fn of_scheme(
        scheme: Resilience,
        max_cost: Option<f64>,
    ) -> Result<Option<Thresholds>, ClientError> {
        let Resilience::Span { k, r } = scheme else {
            return Ok(None);
        };
        let (k, width) = (usize::from(k), usize::from(k) + usize::from(r));
        Thresholds::new(k, width, max_cost).map(Some)
    }
}

/// When to compact, and the signal that wakes the thread.
pub struct Compactor {
    /// Where compaction starts and stops.
    limits: Thresholds,
    /// Pieces per row, k + r.
    width: f64,
    /// Held by the one compaction running (two would race each other's moves and stop).
    running: Mutex<()>,
    signal: Arc<(Mutex<Signal>, Condvar)>,
    /// When the policy was made, and the last client write since (ms after it, plus one; 0:
    /// none yet).
    epoch: Instant,
    last_write: AtomicU64,
}

#[derive(Default)]
struct Signal {
    wake: bool,
    stop: bool,
}

impl Compactor {
    /// The policy for rows of `width` pieces, within `limits`.
    pub fn new(width: usize, limits: Thresholds) -> Compactor {
        metrics::gauge!("hydramem_span_max_cost").set(limits.high);
        Compactor {
            limits,
            width: width as f64,
            running: Mutex::new(()),
            signal: Arc::default(),
            epoch: Instant::now(),
            last_write: AtomicU64::new(0),
        }
    }

    /// Where compaction starts and stops.
    pub fn limits(&self) -> Thresholds {
        self.limits
    }

    /// A client write (not compaction's) happened now.
    pub fn note_write(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_write
            .store(ms.saturating_add(1), Ordering::Relaxed);
    }

    /// Whether no client write happened in the [`IDLE`] before `now` (and one ever did).
    fn idle_at(&self, now: Instant) -> bool {
        let last = self.last_write.load(Ordering::Relaxed);
        last != 0
            && now.saturating_duration_since(self.epoch)
                >= Duration::from_millis(last - 1).saturating_add(IDLE)
    }

    /// Remote bytes per live byte of the rows in use.
    fn cost(&self, o: &Occupancy) -> f64 {
        if o.live_pages == 0 {
            return 0.0;
        }
        o.rows_in_use as f64 * self.width / o.live_pages as f64
    }

    /// Whether `o` is over the threshold where compaction starts.
    pub fn over(&self, o: &Occupancy) -> bool {
        o.rows_in_use >= MIN_ROWS && self.cost(o) > self.limits.high
    }

    /// Whether `o` is within the target compaction stops at: the low one when `deep` (client
    /// writes have paused, or compaction was asked for), else the one while writes flow.
    fn within(&self, o: &Occupancy, deep: bool) -> bool {
        let target = if deep {
            self.limits.low
        } else {
            self.limits.busy_low
        };
        o.rows_in_use < MIN_ROWS || self.cost(o) <= target
    }

    /// Wakes the compaction thread.
    pub fn wake(&self) {
        let (m, c) = &*self.signal;
        m.lock().wake = true;
        c.notify_one();
    }

    /// Tells the compaction thread to end: it finishes the step under way (a pass's reads
    /// and writes, or one give-back) and starts no other.
    pub fn stop(&self) {
        let (m, c) = &*self.signal;
        m.lock().stop = true;
        c.notify_one();
    }

    /// Whether a compaction is running now.
    #[cfg(test)]
    pub(crate) fn busy(&self) -> bool {
        self.running.is_locked()
    }

    /// Whether [`Compactor::stop`] was called.
    fn stopping(&self) -> bool {
        self.signal.0.lock().stop
    }
}

/// Starts `store`'s compaction thread; it runs until [`Compactor::stop`] (the store's drop,
/// which joins it). `None`, with a warning, if the thread cannot start: garbage then stays.
pub(crate) fn start(store: &Arc<Core>) -> Option<std::thread::JoinHandle<()>> {
    let store = store.clone();
    let spawned = std::thread::Builder::new()
        .name("hydramem-span-compact".into())
        .spawn(move || {
            crate::priority::background("span compaction");
            compaction_loop(&store);
        });
    match spawned {
        Ok(thread) => Some(thread),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the span compaction thread: garbage stays");
            None
        }
    }
}

/// The compaction thread: waits for a wake (or a second), then compacts, until stopped.
fn compaction_loop(store: &Core) {
    let signal = store.compactor.signal.clone();
    loop {
        {
            let (m, c) = &*signal;
            let mut s = m.lock();
            if !s.wake && !s.stop {
                c.wait_for(&mut s, Duration::from_secs(1));
            }
            if s.stop {
                return;
            }
            s.wake = false;
        }
        if let Err(e) = run(store, false) {
            tracing::warn!(error = %e, "span compaction pass failed; retrying later");
        }
        give_back_if_idle(store, Instant::now());
    }
}

/// Compacts `store` while it is over the threshold (or, with `force` or once client writes
/// have paused, while it is above the target at all) and rows that would pack tighter
/// exist; returns the pages moved. The target is [`LOW`] with `force` or while writes have
/// paused, [`BUSY_LOW`] while they flow (looked at before each pass).
pub(crate) fn run(store: &Core, force: bool) -> Result<u64, IoError> {
    let c = &store.compactor;
    let _one = c.running.lock();
    let k = store.k;
    let mut total = 0;
    let mut first = true;
    // First the sparsest rows, until the rows in use are within the target; then, if it
    // did anything, the rows in use near the top of the row space move down into the holes,
    // so that the top empties and its memory goes back to the nodes ([`shrink`]).
    let mut settling = false;
    loop {
        if c.stopping() {
            // The store is being dropped: what is left waits for its successor.
            return Ok(total);
        }
        let occ = store.table.lock().occupancy();
        let deep = force || c.idle_at(Instant::now());
        let go = if first && !deep {
            c.over(&occ)
        } else {
            !c.within(&occ, deep)
        };
        first = false;
        let victims = if go {
            store.table.lock().sparse_rows(
                u8::try_from(k.saturating_sub(1)).unwrap_or(u8::MAX),
                VICTIMS,
            )
        } else if (total > 0 || force) && spread(&occ) {
            settling = true;
            store.table.lock().top_rows(VICTIMS)
        } else {
            Vec::new()
        };
        if victims.len() < 2 {
            break;
        }
        let moved = pass(store, &victims)?;
        let counters = &store.counters;
        counters
            .compactions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        counters
            .compacted_pages
            .fetch_add(moved, std::sync::atomic::Ordering::Relaxed);
        metrics::counter!("hydramem_span_compacted_pages_total").increment(moved);
        total += moved;
        if moved == 0 {
            break;
        }
        if settling {
            shrink(store);
        }
    }
    shrink(store);
    if force {
        discard_free(store);
    }
    Ok(total)
}

/// Whether the rows ever used spread well past those in use (more than an eighth, and more
/// than a pass's worth of rows): holes that moving the top rows down would give back.
fn spread(o: &Occupancy) -> bool {
    o.rows_touched > o.rows_in_use + o.rows_in_use / 8 + VICTIMS as u64
}

/// Gives the nodes back the memory of the rows above the highest one in use (compaction
/// moves pages to the lowest free rows, so the top empties).
fn shrink(store: &Core) {
    let Some(s) = store.table.lock().begin_shrink() else {
        return;
    };
    let rows = s.0.end - s.0.start;
    let slots = store.mem.discard_units(s.0.clone());
    store.table.lock().end_shrink(s);
    metrics::counter!("hydramem_span_rows_discarded_total").increment(rows);
    tracing::debug!(
        rows,
        slots,
        "span rows above the highest in use given back to the nodes"
    );
}

/// Gives the free rows below the highest one in use back to the nodes ([`discard_free`]) if
/// no client write happened in the [`IDLE`] before `now`; returns whether it looked.
pub(crate) fn give_back_if_idle(store: &Core, now: Instant) -> bool {
    if !store.compactor.idle_at(now) || store.compactor.stopping() {
        return false;
    }
    let _one = store.compactor.running.lock();
    discard_free(store);
    true
}

/// Gives the nodes back the memory of the free rows below the highest one in use (the holes
/// compaction left that moving the top rows down did not fill), once there are at least
/// [`MIN_DISCARD`] of them: a write that takes one later makes it hold memory again.
fn discard_free(store: &Core) {
    let Some(d) = store.table.lock().begin_discard(MIN_DISCARD) else {
        return;
    };
    let rows: u64 = d.0.iter().map(|r| r.end - r.start).sum();
    let slots: u64 = d.0.iter().map(|r| store.mem.discard_units(r.clone())).sum();
    let runs = d.0.len();
    store.table.lock().end_discard(d);
    metrics::counter!("hydramem_span_rows_discarded_total").increment(rows);
    tracing::debug!(
        rows,
        runs,
        slots,
        "free span rows below the highest in use given back to the nodes"
    );
}

/// One pass: moves the live pages of `victims` (sparsest first) into full rows, as many
/// whole rows' worth as they hold (all of them when that is less than a row: they still
/// pack into fewer rows than they fill now). Returns the pages moved.
fn pass(store: &Core, victims: &[u64]) -> Result<u64, IoError> {
    let order = Ranks::of(victims);
    let mut found: Vec<(usize, u64, Loc)> = Vec::new();
    store.map.for_each_in(
        |row| order.get(row),
        |i, page, loc| found.push((i, page, loc)),
    );
    // Hold the pages (those being written are skipped: the write moves them), then look each
    // up again: a write may have moved it between the scan and the hold.
    let held = store
        .busy
        .begin_compaction(found.iter().map(|(_, page, _)| *page));
    found.retain_mut(|(i, page, loc)| {
        let now = store.map.get(*page);
        match now {
            Some(l) if held.holds(*page) && order.get(l.row) == Some(*i) => {
                *loc = l;
                true
            }
            _ => false,
        }
    });
    found.sort_unstable_by_key(|(i, page, _)| (*i, *page));
    let k = store.k;
    if found.len() > k {
        found.truncate(found.len() / k * k);
    }
    // Read together: the pages of a victim row are on different nodes, and those at one
    // position of consecutive victims are one run to one node.
    let mut bytes: Vec<Page> = vec![[0u8; PAGE_SIZE]; found.len()];
    let mut wants: Vec<(PieceWant, &mut Page)> = found
        .iter()
        .zip(bytes.iter_mut())
        .map(|((_, page, loc), buf)| {
            (
                super::want(page * PAGE_SIZE as u64, *loc, Newer::Moved),
                buf,
            )
        })
        .collect();
    let results = store.mem.read_pieces(&mut wants);
    drop(wants);
    let mut kept: Vec<(u64, Loc)> = Vec::with_capacity(found.len());
    let mut keep = Vec::with_capacity(found.len());
    for (i, (r, (_, page, loc))) in results.into_iter().zip(&found).enumerate() {
        let read = match r? {
            PieceRead::Done { .. } => true,
            // Still there: the newer pieces are the remains of a write never acknowledged
            // (see [`Newer::Stale`]); read around them.
            PieceRead::Moved if store.map.get(*page) == Some(*loc) => {
                let want = super::want(page * PAGE_SIZE as u64, *loc, Newer::Stale);
                store.mem.read_piece(want, &mut bytes[i])? != PieceRead::Moved
            }
            // Written again since the scan: its old row is released by that write.
            PieceRead::Moved => false,
        };
        if read {
            kept.push((*page, *loc));
        }
        keep.push(read);
    }
    let mut keep = keep.into_iter();
    bytes.retain(|_| keep.next().unwrap_or(false));
    // The copies' version, fixed before any write that could race them starts; the pages a
    // write took meanwhile are left to it (see [`super::busy`]).
    let (version, committed) = held.commit(|| store.mem.take_version());
    let version = version?;
    let (list, expected): (Vec<(u64, &Page)>, Vec<Loc>) = kept
        .iter()
        .zip(bytes.iter())
        .filter(|((page, _), _)| committed.contains(page))
        .map(|((page, loc), bytes)| ((*page, bytes), *loc))
        .unzip();
    store.write_packed(&list, Some((&expected, version)))
}

/// Each victim row's rank in a pass (sparsest first), looked up once per page of the map: by
/// index into an array over the rows up to the highest victim, not by hash. The scan of the
/// map visits every page each pass, and hashing the row of each (SipHash, a `HashMap`) was a
/// third of the compaction thread's CPU under memcached (docs/benchmarks.md §12).
struct Ranks(Vec<u8>);

impl Ranks {
    /// No rank: the row is not a victim.
    const NONE: u8 = u8::MAX;

    /// The ranks of `victims` (at most [`VICTIMS`] of them, distinct).
    fn of(victims: &[u64]) -> Ranks {
        const _: () = assert!(VICTIMS < Ranks::NONE as usize);
        debug_assert!(victims.len() <= VICTIMS, "{} victims", victims.len());
        let len = victims.iter().max().map_or(0, |m| m + 1);
        let mut ranks = vec![Ranks::NONE; usize::try_from(len).expect("a row that fits memory")];
        for (i, row) in victims.iter().enumerate().take(VICTIMS) {
            ranks[*row as usize] = i as u8;
        }
        Ranks(ranks)
    }

    /// The rank of `row`, if it is a victim.
    fn get(&self, row: u64) -> Option<usize> {
        let r = *self.0.get(usize::try_from(row).ok()?)?;
        (r != Ranks::NONE).then_some(usize::from(r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_name_the_victims_in_order_and_no_other_row() {
        let r = Ranks::of(&[7, 2, 40]);
        assert_eq!(r.get(7), Some(0));
        assert_eq!(r.get(2), Some(1));
        assert_eq!(r.get(40), Some(2));
        for row in [0, 1, 3, 8, 39, 41, u64::MAX] {
            assert_eq!(r.get(row), None, "row {row}");
        }
        assert_eq!(Ranks::of(&[]).get(0), None);
    }
}
