//! Span coding (Carbink, OSDI '22): a page read is one message, at erasure coding's memory
//! cost. Pages stay whole, each on one node; the pages written together are grouped k at a
//! time into *rows*, and each row gets r parity pages computed across its pages, on r further
//! nodes of the same coding group ([`crate::client::rows`] writes and reads rows). A healthy
//! read asks the page's node alone, as replication does; a read whose node is down, slow or
//! regenerating decodes the page from k other pieces of its row.
//!
//! **Writes are log-structured** (the design Carbink chose, and the one that keeps every
//! consistency argument of per-page coding): a write never changes a row in place. The pages
//! of one call are packed into fresh rows, k per row (a call of fewer than k pages writes a
//! partial row: its empty positions hold zero pages), each row written whole under one
//! version; only once every row is acknowledged by all its k + r nodes does the page map
//! ([`map`]) point the pages at them. The rows the pages came from lose a live page each
//! ([`table`]); a row with no live page left is free and is reused by a later write. So a row
//! is immutable while any page points at it: a degraded read decodes from pieces that can
//! only be the row's own, and a failure in the middle of a write leaves every acknowledged
//! page where it was. The alternative, parity deltas applied in place, would need the old
//! page on every write and leaves a window where a row's data and parity disagree (the RAID
//! write hole), which only an undo log on the nodes closes.
//!
//! **Group commit** ([`gather`]): while a batch's rows are in flight, the calls that arrive
//! queue their pages, and the next write packs all of them, so that concurrent single-page
//! writes (a swap device's) fill rows instead of leaving one partial row each; a queue that
//! fills a row goes out beside the batches in flight, unless it shares a page with them (the
//! writes of one page are never concurrent).
//!
//! **Garbage and compaction** ([`compact`]): overwritten pages leave dead pieces in their old
//! rows, and small writes leave partial rows. A background thread compacts when the remote
//! memory in use exceeds the code's cost (k + r)/k by more than a set margin: it reads the
//! live pages of the emptiest rows and writes them again packed into full rows, moving each
//! page only if no write moved it meanwhile.
//!
//! **Kept identities** ([`reattach`]): every piece carries its page number as its tag (the
//! parity pieces the code's parity over them), so a client that reattaches to its identity
//! rebuilds the page map and the row table from the pieces' versions and tags alone.

mod busy;
pub mod compact;
pub mod gather;
pub mod map;
mod reattach;
pub mod table;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::client::{IoError, Newer, Page, PieceRead, PieceWant, RemoteMemory, RowWrite};
use crate::nbd::PageStore;
use crate::PAGE_SIZE;
use compact::Compactor;
use map::{Loc, PageMap};
use table::{Occupancy, RowTable};

const PAGE: u64 = PAGE_SIZE as u64;

/// How often a read looks a page up again after finding its row reused, before it gives up:
/// each time a write moved the page between the look-up and the read.
const MAX_MOVES: u32 = 1000;

/// The store of a span-coded client: its pages, mapped to rows. It owns its compaction
/// thread: dropping the store (its last handle) stops the thread and waits for the pass
/// under way, so once the drop returns this client changes no row on the nodes again, and
/// a successor with its identity may reattach ([`Core`] is what the thread shares).
/// [`SpanStore::stop_compaction`] does the same while handles remain (before the client's
/// memory is freed).
pub struct SpanStore {
    core: Arc<Core>,
    compaction: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The state a span store shares with its compaction thread.
pub(crate) struct Core {
    mem: Arc<RemoteMemory>,
    map: PageMap,
    table: Mutex<RowTable>,
    k: usize,
    width: usize,
    compactor: Compactor,
    gather: gather::Gather,
    busy: busy::Busy,
    counters: Counters,
}

#[derive(Default)]
struct Counters {
    rows_written: AtomicU64,
    partial_rows: AtomicU64,
    reads_decoded: AtomicU64,
    moved_retries: AtomicU64,
    compacted_pages: AtomicU64,
    compactions: AtomicU64,
    forgotten: AtomicU64,
}

/// What a span store holds and has done.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct SpanStats {
    /// Pages the map points at rows.
    pub live_pages: u64,
    /// Rows holding at least one live page.
    pub rows_in_use: u64,
    /// Rows ever used (the high-water mark of the row space).
    pub rows_touched: u64,
    /// Rows whose pieces occupy the nodes' memory: those ever used, less the free rows
    /// compaction gave back.
    pub rows_held: u64,
    /// Pieces per row (k + r).
    pub width: u64,
    /// Rows written (by writes and by compaction).
    pub rows_written: u64,
    /// Of them, rows written with fewer than k pages.
    pub partial_rows: u64,
    /// Reads that decoded their page from the rest of its row.
    pub reads_decoded: u64,
    /// Reads that found their row reused and looked the page up again.
    pub moved_retries: u64,
    /// Pages compaction moved into full rows.
    pub compacted_pages: u64,
    /// Compaction passes.
    pub compactions: u64,
    /// Pages forgotten ([`PageStore::forget`]): their copies became garbage before any
    /// write replaced them.
    #[serde(default)]
    pub forgotten: u64,
    /// The remote bytes per byte above which compaction starts while writes flow (the
    /// ceiling, `ClientConfig::span_max_cost`; 0 in reports from before it was kept).
    #[serde(default)]
    pub max_cost: f64,
}

impl SpanStats {
    /// Remote bytes per byte of live data in the rows in use (1 + r/k when every row is full).
    pub fn cost(&self) -> f64 {
        if self.live_pages == 0 {
            return 0.0;
        }
        (self.rows_in_use * self.width) as f64 / self.live_pages as f64
    }

    /// Bytes the nodes hold for rows that are free and not yet given back.
    pub fn free_held_bytes(&self) -> u64 {
        self.rows_held.saturating_sub(self.rows_in_use) * self.width * PAGE
    }

    /// What the rows hold and what compaction did, in words, for a front end's summary;
    /// `forgot` says who freed the forgotten pages ("the program freed them").
    pub fn summary(&self, forgot: &str) -> String {
        format!(
            "{} pages in {} rows, {:.2} remote bytes per byte (and {} of free rows not yet \
             given back); {} pages forgotten ({forgot}); compaction moved {} pages in {} \
             passes{}",
            self.live_pages,
            self.rows_in_use,
            self.cost(),
            crate::units::human(self.free_held_bytes()),
            self.forgotten,
            self.compacted_pages,
            self.compactions,
            if self.max_cost > 0.0 {
                format!(" (it starts above {:.2})", self.max_cost)
            } else {
                String::new()
            }
        )
    }
}

impl SpanStore {
    /// The store of `mem`, a client connected with a span scheme, with its compaction thread
    /// started. Its page map is empty for a new identity; for one that reattaches, rebuilt
    /// from what the nodes hold ([`reattach`]).
    ///
    /// # Errors
    /// The nodes' metadata for a row is inconsistent (see [`RemoteMemory::held_rows`]).
    ///
    /// # Panics
    /// If `mem` is not span coded (a caller's mistake: [`crate::backup::FrontStore`] builds
    /// this store for span schemes only).
    pub fn new(mem: Arc<RemoteMemory>) -> Result<Arc<SpanStore>, IoError> {
        let l = *mem.layout();
        assert!(l.span(), "a span store needs a span-coded client");
        let limits = compact::Thresholds::new(l.k, l.width, mem.config().span_max_cost)?;
        let pages = mem.size().div_ceil(PAGE);
        let rows = l.space(mem.size()) / PAGE;
        let map = PageMap::new(pages);
        let (table, found) = reattach::rebuild(&mem, &map, rows)?;
        if found > 0 {
            let o = table.occupancy();
            tracing::info!(
                pages = found,
                rows_in_use = o.rows_in_use,
                rows_held = o.rows_held,
                "rebuilt the span page map from the memory nodes"
            );
        }
        let core = Arc::new(Core {
            map,
            table: Mutex::new(table),
            k: l.k,
            width: l.width,
            mem,
            compactor: Compactor::new(l.width, limits),
            gather: gather::Gather::new(l.k),
            busy: busy::Busy::default(),
            counters: Counters::default(),
        });
        let compaction = compact::start(&core);
        Ok(Arc::new(SpanStore {
            core,
            compaction: Mutex::new(compaction),
        }))
    }

    /// The client under the store.
    pub fn mem(&self) -> &Arc<RemoteMemory> {
        &self.core.mem
    }

    /// What the store holds and has done.
    pub fn stats(&self) -> SpanStats {
        self.core.stats()
    }

    /// Compacts now until the memory in use is back within the target (what the background
    /// thread does when it is over); returns the pages moved.
    pub fn compact(&self) -> Result<u64, IoError> {
        compact::run(&self.core, true)
    }

    /// Stops the compaction thread and waits for the pass under way: from then on only this
    /// store's own writes change its rows, and nothing reads them behind its back — what a
    /// caller needs before it frees the client's memory while handles to the store remain
    /// (a pass reading a freed range fails, and says so). Writes still work; garbage then
    /// stays. The drop does the same.
    pub fn stop_compaction(&self) {
        self.core.compactor.stop();
        let thread = self.compaction.lock().take();
        if let Some(thread) = thread {
            if thread.join().is_err() {
                tracing::warn!("the span compaction thread panicked");
            }
        }
    }

    /// The state shared with the compaction thread (for this module's tests).
    #[cfg(test)]
    fn core(&self) -> &Core {
        &self.core
    }
}

impl Drop for SpanStore {
    fn drop(&mut self) {
        self.stop_compaction();
    }
}

/// Every call goes to the shared state; the handle only owns the compaction thread.
impl PageStore for SpanStore {
    fn read_page(&self, addr: u64, page: &mut Page) -> Result<(), IoError> {
        self.core.read_page(addr, page)
    }

    fn write_page(&self, addr: u64, page: &Page) -> Result<(), IoError> {
        self.core.write_page(addr, page)
    }

    fn read_pages(&self, addr: u64, pages: &mut [Page]) -> Result<(), IoError> {
        self.core.read_pages(addr, pages)
    }

    fn write_pages(&self, addr: u64, pages: &[Page]) -> Result<(), IoError> {
        self.core.write_pages(addr, pages)
    }

    fn read_list(&self, list: &mut [(u64, &mut Page)]) -> Result<(), IoError> {
        self.core.read_list(list)
    }

    fn write_list(&self, list: &[(u64, &Page)]) -> Result<(), IoError> {
        self.core.write_list(list)
    }

    fn submit_read<'s>(
        &'s self,
        addrs: Vec<u64>,
    ) -> Result<Box<dyn crate::nbd::export::PendingPages + 's>, IoError> {
        self.core.submit_read(addrs)
    }

    fn forget(&self, addrs: &[u64]) {
        self.core.forget(addrs)
    }

    fn discard(&self, addrs: &[u64]) -> bool {
        self.core.discard(addrs)
    }

    fn known_zero(&self, addr: u64) -> bool {
        self.core.known_zero(addr)
    }

    fn location(&self, addr: u64) -> Option<String> {
        self.core.location(addr)
    }
}

impl Core {
    /// What the store holds and has done.
    fn stats(&self) -> SpanStats {
        let Occupancy {
            rows_in_use,
            live_pages,
            rows_touched,
            rows_held,
        } = self.table.lock().occupancy();
        let c = &self.counters;
        SpanStats {
            live_pages,
            rows_in_use,
            rows_touched,
            rows_held,
            width: self.width as u64,
            rows_written: c.rows_written.load(Ordering::Relaxed),
            partial_rows: c.partial_rows.load(Ordering::Relaxed),
            reads_decoded: c.reads_decoded.load(Ordering::Relaxed),
            moved_retries: c.moved_retries.load(Ordering::Relaxed),
            compacted_pages: c.compacted_pages.load(Ordering::Relaxed),
            compactions: c.compactions.load(Ordering::Relaxed),
            forgotten: c.forgotten.load(Ordering::Relaxed),
            max_cost: self.compactor.limits().high,
        }
    }

    /// The page number of `addr`, checked.
    fn page_of(&self, addr: u64) -> Result<u64, IoError> {
        if !addr.is_multiple_of(PAGE) {
            return Err(IoError::Unaligned { addr });
        }
        let page = addr / PAGE;
        if page >= self.map.pages() {
            return Err(IoError::OutOfRange {
                addr,
                size: self.mem.size(),
            });
        }
        Ok(page)
    }

    /// Reads page `page` (at `addr`) from where the map says it is. A read that finds its
    /// row holding a newer version looks the page up again: if it moved, it reads it where it
    /// is now; if it is still there, the newer pieces are stale ([`Newer::Stale`]) and the
    /// next read decodes around them.
    fn read_one(&self, addr: u64, page: u64, out: &mut Page) -> Result<(), IoError> {
        let mut newer = Newer::Moved;
        for _ in 0..MAX_MOVES {
            let Some(loc) = self.map.get(page) else {
                out.fill(0);
                return Ok(());
            };
            let read = match self.mem.read_piece(want(addr, loc, newer), out) {
                // The page moved while its old row failed to read (its row was reused or its
                // range given back): read it where it is now.
                Err(_) if self.map.get(page) != Some(loc) => Ok(PieceRead::Moved),
                r => r,
            };
            match read? {
                PieceRead::Done { decoded } => {
                    if decoded {
                        self.counters.reads_decoded.fetch_add(1, Ordering::Relaxed);
                        metrics::counter!("hydramem_span_reads_decoded_total").increment(1);
                    }
                    return Ok(());
                }
                PieceRead::Moved => {
                    self.counters.moved_retries.fetch_add(1, Ordering::Relaxed);
                    newer = if self.map.get(page) == Some(loc) {
                        tracing::debug!(
                            page = format_args!("{addr:#x}"),
                            row = loc.row,
                            version = loc.version,
                            "a piece of the page's row is newer than the page, which is still \
                             there: reading around it"
                        );
                        Newer::Stale
                    } else {
                        Newer::Moved
                    };
                }
            }
        }
        Err(IoError::Store(
            format!(
                "read of page {addr:#x}: its row was reused {MAX_MOVES} times between looking \
                 it up and reading it; writes to it are racing every read"
            )
            .into(),
        ))
    }

    /// Writes `pages` (page number, bytes) packed into fresh rows, and once every row is
    /// acknowledged points the pages at them, in list order. `expected`: compaction's
    /// condition, per page the location it read the bytes from (the page moves only if it is
    /// still there), and the version it committed its copies to (see [`busy`]). Returns how
    /// many pages moved.
    fn write_packed(
        &self,
        pages: &[(u64, &Page)],
        expected: Option<(&[Loc], u64)>,
    ) -> Result<u64, IoError> {
        if pages.is_empty() {
            return Ok(0);
        }
        // A write marks its pages as moving (see [`busy`]; compaction's copies come with
        // the version they committed to), and writes each page once: of two in one batch,
        // the later wins, and two rows of one version naming one page would leave a
        // reattaching client to guess.
        let deduped;
        let (pages, _moving, version) = match expected {
            None => {
                self.compactor.note_write();
                deduped = last_of_each(pages);
                let numbers = deduped.iter().map(|(n, _)| *n).collect();
                (&deduped[..], Some(self.busy.begin_write(numbers)), None)
            }
            Some((_, version)) => (pages, None, Some(version)),
        };
        let expected = expected.map(|(e, _)| e);
        let rows = self.take_rows(pages.len())?;
        let spots: Vec<(usize, usize)> = (0..pages.len())
            .map(|i| place(i, pages.len(), self.k))
            .collect();
        let mut refs: Vec<Vec<&Page>> = vec![Vec::with_capacity(self.k); rows.len()];
        let mut ids: Vec<Vec<u64>> = vec![Vec::with_capacity(self.k); rows.len()];
        for (&(r, _), (n, p)) in spots.iter().zip(pages) {
            refs[r].push(*p);
            ids[r].push(*n);
        }
        let writes: Vec<RowWrite<'_>> = rows
            .iter()
            .zip(refs.iter().zip(&ids))
            .map(|(&row, (pages, ids))| RowWrite { row, pages, ids })
            .collect();
        let versions = match self.mem.write_rows_at(&writes, version) {
            Ok(v) => v,
            Err(e) => {
                let mut t = self.table.lock();
                for (row, chunk) in rows.iter().zip(&refs) {
                    for _ in chunk {
                        t.release(*row);
                    }
                }
                return Err(e);
            }
        };
        let c = &self.counters;
        c.rows_written
            .fetch_add(rows.len() as u64, Ordering::Relaxed);
        metrics::counter!("hydramem_span_rows_written_total").increment(rows.len() as u64);
        let partial = refs.iter().filter(|c| c.len() < self.k).count();
        c.partial_rows.fetch_add(partial as u64, Ordering::Relaxed);
        let at = |i: usize| {
            let (r, pos) = spots[i];
            Loc {
                row: rows[r],
                pos,
                version: versions[r],
            }
        };
        let (gone, moved) = self.point(pages, at, expected);
        let over = self.release_rows(gone);
        if over {
            self.compactor.wake();
        }
        Ok(moved)
    }

    /// Points the `pages` just written at their new locations (`at(i)` for the ith), all of
    /// them for a write, for compaction (`expected`) only those still where it read them.
    /// Returns the rows that lost a page (one entry per page) and how many pages moved.
    fn point(
        &self,
        pages: &[(u64, &Page)],
        at: impl Fn(usize) -> Loc,
        expected: Option<&[Loc]>,
    ) -> (Vec<u64>, u64) {
        let mut gone = Vec::with_capacity(pages.len());
        let mut moved = 0;
        for (i, (page, _)) in pages.iter().enumerate() {
            let loc = at(i);
            match expected {
                // No other write of the page is in flight (`gather`): it moves.
                None => {
                    if let Some(old) = self.map.set(*page, loc) {
                        gone.push(old.row);
                    }
                    moved += 1;
                }
                Some(exp) => {
                    if self.map.move_if(*page, exp[i], loc) {
                        gone.push(exp[i].row);
                        moved += 1;
                    } else {
                        // A write moved the page meanwhile: this copy is garbage already.
                        gone.push(loc.row);
                    }
                }
            }
        }
        (gone, moved)
    }

    /// Takes one live page off each row of `gone` (one entry per page), updates the gauges,
    /// and says whether the rows in use are now over compaction's threshold.
    fn release_rows(&self, gone: Vec<u64>) -> bool {
        let mut t = self.table.lock();
        for row in gone {
            t.release(row);
        }
        let o = t.occupancy();
        metrics::gauge!("hydramem_span_live_pages").set(o.live_pages as f64);
        metrics::gauge!("hydramem_span_rows_in_use").set(o.rows_in_use as f64);
        metrics::gauge!("hydramem_span_rows_touched").set(o.rows_touched as f64);
        metrics::gauge!("hydramem_span_rows_held").set(o.rows_held as f64);
        self.compactor.over(&o)
    }

    /// Takes ⌈n / k⌉ rows for `n` pages (the last one for the pages left over).
    fn take_rows(&self, n: usize) -> Result<Vec<u64>, IoError> {
        let mut t = self.table.lock();
        let mut rows = Vec::with_capacity(n.div_ceil(self.k));
        let mut left = n;
        while left > 0 {
            let here = left.min(self.k);
            let Some(row) = t.take(u8::try_from(here).expect("k is at most 32")) else {
                for row in &rows {
                    for _ in 0..t.live(*row) {
                        t.release(*row);
                    }
                }
                return Err(IoError::Store(
                    format!(
                        "no free row for {n} pages: every one of the {} rows holds live pages \
                         (compaction is behind); retry the write",
                        t.rows()
                    )
                    .into(),
                ));
            };
            rows.push(row);
            left -= here;
        }
        Ok(rows)
    }
}

/// Rows filled together, column by column, by [`place`].
const COLUMN: usize = 8;

/// Where the `i`th of `n` pages written together goes: (row of the write, position), for the
/// rows `take_rows` takes — ⌊n / k⌋ full rows, then one with the n mod k left. The full rows
/// are filled in blocks of [`COLUMN`] rows, each column by column: pages i and i + 1 sit at
/// one position of two consecutive rows, which is one node (a position is one node of the
/// range's group), so pages written together in address order — an eviction batch — are read
/// together from one node in one message (a fault and the page read ahead with it), as with
/// replication; filled row by row, they were on two nodes. Blocks keep a row's pages within
/// COLUMN × k pages of each other, so a rewrite of a stretch of pages still frees whole rows.
/// The pages left over fill the last row in order.
fn place(i: usize, n: usize, k: usize) -> (usize, usize) {
    let full = n / k;
    if i >= full * k {
        return (full, i - full * k);
    }
    let block = i / (COLUMN * k);
    let height = COLUMN.min(full - block * COLUMN);
    let j = i - block * COLUMN * k;
    (block * COLUMN + j % height, j / height)
}

/// `pages` with only the last entry of each page number, in list order.
fn last_of_each<'a>(pages: &[(u64, &'a Page)]) -> Vec<(u64, &'a Page)> {
    let mut last = std::collections::HashMap::with_capacity(pages.len());
    for (i, (n, _)) in pages.iter().enumerate() {
        last.insert(*n, i);
    }
    if last.len() == pages.len() {
        return pages.to_vec();
    }
    pages
        .iter()
        .enumerate()
        .filter(|(i, (n, _))| last[n] == *i)
        .map(|(_, p)| *p)
        .collect()
}

impl PageStore for Core {
    fn read_page(&self, addr: u64, page: &mut Page) -> Result<(), IoError> {
        let p = self.page_of(addr)?;
        self.read_one(addr, p, page)
    }

    fn write_page(&self, addr: u64, page: &Page) -> Result<(), IoError> {
        self.write_list(&[(addr, page)])
    }

    fn read_pages(&self, addr: u64, pages: &mut [Page]) -> Result<(), IoError> {
        let mut list: Vec<(u64, &mut Page)> = pages
            .iter_mut()
            .enumerate()
            .map(|(i, p)| (addr + i as u64 * PAGE, p))
            .collect();
        self.read_list(&mut list)
    }

    fn read_list(&self, list: &mut [(u64, &mut Page)]) -> Result<(), IoError> {
        let mut wants: Vec<(PieceWant, &mut Page)> = Vec::with_capacity(list.len());
        for (addr, page) in list.iter_mut() {
            match self.map.get(self.page_of(*addr)?) {
                None => page.fill(0),
                Some(loc) => wants.push((want(*addr, loc, Newer::Moved), &mut **page)),
            }
        }
        let results = self.mem.read_pieces(&mut wants);
        for (r, (want, page)) in results.into_iter().zip(wants.iter_mut()) {
            let r = match r {
                // The page moved or was forgotten while its old row failed to read (the row was
                // reused or its range given back, as after a TRIM emptied it): look again, as
                // [`Core::read_one`] does.
                Err(_)
                    if self.map.get(want.addr / PAGE).map(|l| (l.row, l.version))
                        != Some((want.row, want.version)) =>
                {
                    Ok(PieceRead::Moved)
                }
                r => r,
            };
            match r? {
                PieceRead::Done { decoded } => {
                    if decoded {
                        self.counters.reads_decoded.fetch_add(1, Ordering::Relaxed);
                        metrics::counter!("hydramem_span_reads_decoded_total").increment(1);
                    }
                }
                // Moved since the look-up: look again, alone.
                PieceRead::Moved => {
                    self.counters.moved_retries.fetch_add(1, Ordering::Relaxed);
                    self.read_one(want.addr, want.addr / PAGE, page)?;
                }
            }
        }
        Ok(())
    }

    fn write_pages(&self, addr: u64, pages: &[Page]) -> Result<(), IoError> {
        let list: Vec<(u64, &Page)> = pages
            .iter()
            .enumerate()
            .map(|(i, p)| (addr + i as u64 * PAGE, p))
            .collect();
        self.write_list(&list)
    }

    fn write_list(&self, list: &[(u64, &Page)]) -> Result<(), IoError> {
        let pages = list
            .iter()
            .map(|(addr, p)| Ok((self.page_of(*addr)?, *p)))
            .collect::<Result<Vec<_>, IoError>>()?;
        // Concurrent calls share rows (group commit).
        self.gather
            .write(&pages, &|batch| self.write_packed(batch, None).map(|_| ()))
    }

    /// Takes the pages out of the map and their rows' live counts, so that compaction moves
    /// them no more (a compaction that read one meanwhile finds it gone and drops its copy,
    /// see [`map::PageMap::move_if`]).
    fn forget(&self, addrs: &[u64]) {
        let gone: Vec<u64> = addrs
            .iter()
            .filter_map(|&a| self.page_of(a).ok())
            .filter_map(|page| self.map.clear(page))
            .map(|loc| loc.row)
            .collect();
        if !gone.is_empty() {
            self.counters
                .forgotten
                .fetch_add(gone.len() as u64, Ordering::Relaxed);
            if self.release_rows(gone) {
                self.compactor.wake();
            }
        }
    }

    /// Forgets the pages, which then read as zeros (never written) — for good only if no
    /// successor reattaches to this identity: one that did would find their copies again, so a
    /// kept identity (`--client-id`) discards nothing and the caller writes zeros.
    fn discard(&self, addrs: &[u64]) -> bool {
        if self.mem.config().kept {
            return false;
        }
        self.forget(addrs);
        true
    }

    fn known_zero(&self, addr: u64) -> bool {
        self.page_of(addr)
            .is_ok_and(|page| self.map.get(page).is_none())
    }

    fn location(&self, addr: u64) -> Option<String> {
        let loc = self.map.get(self.page_of(addr).ok()?)?;
        let group = self.mem.group_of(loc.row * PAGE)?;
        Some(format!(
            "row {} piece {} on node {}",
            loc.row, loc.pos, group.nodes[loc.pos]
        ))
    }
}

/// The read of page `addr`, stored at `loc`.
fn want(addr: u64, loc: Loc, newer: Newer) -> PieceWant {
    PieceWant {
        addr,
        row: loc.row,
        pos: loc.pos,
        version: loc.version,
        newer,
    }
}
