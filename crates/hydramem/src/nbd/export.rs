//! The export: a byte-addressed block device of `size` bytes over whole remote pages.
//!
//! NBD addresses bytes (the advertised minimum block size is 1); the remote memory reads and
//! writes whole 4 KiB pages, each acknowledged under the client's resilience mode before
//! `write_page` returns. [`Export`] maps one onto the other:
//!
//! - a read of any range reads the pages it covers whole in one batched call
//!   ([`PageStore::read_pages`]: all in flight at once, one frame per node), straight into the
//!   reply buffer, and a partly covered first or last page through a page-sized bounce buffer;
//! - a write holds the stripes of [`PageLocks`] of every page it touches throughout, writes
//!   the pages it covers whole in one batched call ([`PageStore::write_pages`]) straight from
//!   the request, and a partly covered first or last page by reading it, patching it and
//!   writing it back (read-modify-write), so that a concurrent write to another part of the
//!   same page — from any connection — is never lost;
//! - zeroing (TRIM, WRITE_ZEROES) writes zero pages the same way. A page of an address range
//!   that was never written already reads as zeros and is skipped, so discarding a fresh
//!   device (mkfs does) costs no remote traffic. The client has no way to release single
//!   pages of a range (slabs belong to whole address ranges), so for most stores zeroing is
//!   how remote pages are "released": their contents are gone, their memory stays with the
//!   range. A store that can make whole pages read as zeros for good without storing
//!   anything ([`PageStore::discard`]: span coding without a kept identity) does that for
//!   TRIM and for WRITE_ZEROES that allow holes ([`Export::trim`]); its rows' memory then
//!   comes back.
//!
//! [`MemStore`] keeps the pages in process memory instead: an export with no cluster behind it,
//! for the tests and fuzz targets of the NBD server.
//!
//! Invariants: nothing is written outside `[0, size)` (callers check with [`Export::check`]);
//! when a write returns `Ok`, every page it touched is acknowledged remotely (or, discarded,
//! taken out of the store's page map, which every connection shares), so FLUSH and FUA have
//! nothing left to do and every connection sees the data at once (multi-conn safe).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::page_locks::PageLocks;
use crate::client::{IoError, Page, RemoteMemory};
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;

/// What an export stores its pages in: the remote memory, or an in-memory stand-in in tests.
pub trait PageStore: Send + Sync {
    /// Reads the page at `addr` (a multiple of 4096).
    fn read_page(&self, addr: u64, page: &mut Page) -> Result<(), IoError>;
    /// Writes the page at `addr`; returns once it is acknowledged under the resilience mode.
    fn write_page(&self, addr: u64, page: &Page) -> Result<(), IoError>;
    /// Reads consecutive pages from `addr`; a store that can have them all in flight at once
    /// overrides this page-by-page default.
    fn read_pages(&self, addr: u64, pages: &mut [Page]) -> Result<(), IoError> {
        for (i, page) in pages.iter_mut().enumerate() {
            self.read_page(addr + (i * PAGE_SIZE) as u64, page)?;
        }
        Ok(())
    }
    /// Writes consecutive pages from `addr`; returns once all are acknowledged. A store that
    /// can have them all in flight at once overrides this page-by-page default.
    fn write_pages(&self, addr: u64, pages: &[Page]) -> Result<(), IoError> {
        for (i, page) in pages.iter().enumerate() {
            self.write_page(addr + (i * PAGE_SIZE) as u64, page)?;
        }
        Ok(())
    }
    /// Reads each page of `list` (address, destination); a store that can have them all in
    /// flight at once overrides this page-by-page default.
    fn read_list(&self, list: &mut [(u64, &mut Page)]) -> Result<(), IoError> {
        for (addr, page) in list.iter_mut() {
            self.read_page(*addr, page)?;
        }
        Ok(())
    }
    /// Writes each page of `list` (address, bytes) in list order; returns once all are
    /// acknowledged. A store that can have them all in flight at once overrides this default.
    fn write_list(&self, list: &[(u64, &Page)]) -> Result<(), IoError> {
        for (addr, page) in list {
            self.write_page(*addr, page)?;
        }
        Ok(())
    }
    /// Starts reading the pages at `addrs` and returns what ends the reads, without waiting
    /// for them: a store that can keep them in flight while the caller goes on overrides this
    /// default, which reads them at once.
    fn submit_read<'s>(&'s self, addrs: Vec<u64>) -> Result<Box<dyn PendingPages + 's>, IoError> {
        let mut pages = vec![[0u8; PAGE_SIZE]; addrs.len()].into_boxed_slice();
        let mut list: Vec<(u64, &mut Page)> = addrs.into_iter().zip(pages.iter_mut()).collect();
        self.read_list(&mut list)?;
        Ok(Box::new(Ready(pages)))
    }
    /// Tells the store that the caller will not read the pages at `addrs` again before it
    /// writes them: a store whose overwritten pages leave garbage (span coding) counts their
    /// copies as garbage now, so that compaction does not move them. The caller must not read
    /// a forgotten page before writing it (it may read as zeros or as an older write), not
    /// even after a reattach — the nodes keep the forgotten copies until their rows are
    /// reused, so a successor with the same identity may find them again (they then count as
    /// live until written) — nor forget a page it is reading or writing. Fit for callers whose
    /// own records say which pages hold data (`hydramem run`'s pager, the mount's files),
    /// not for a block device, whose reader expects a trimmed page to stay zeros. This
    /// default forgets nothing.
    fn forget(&self, _addrs: &[u64]) {}
    /// Makes the pages at `addrs` read as zeros from now on without storing anything, if this
    /// store can do that for good; returns whether it did (if not, it did nothing and the
    /// caller writes zeros). For TRIM and WRITE_ZEROES: a span store whose identity no
    /// successor reattaches to (no `--client-id`) forgets them — no message, and their rows'
    /// memory comes back — where writing zeros would store a row of zero pages. The caller
    /// must not read or write those pages meanwhile. This default does nothing.
    fn discard(&self, _addrs: &[u64]) -> bool {
        false
    }
    /// Whether the page at `addr` certainly reads as zeros without being asked (never
    /// written); `false` when unsure.
    fn known_zero(&self, _addr: u64) -> bool {
        false
    }
    /// Where the page at `addr` lives, for messages ("node 3"); `None` when the store cannot
    /// tell (nothing written there yet, or no nodes behind it).
    fn location(&self, _addr: u64) -> Option<String> {
        None
    }
}

/// Reads started with [`PageStore::submit_read`].
pub trait PendingPages: Send {
    /// Waits for the reads and returns the pages, in the order of the addresses given.
    fn wait(self: Box<Self>) -> Result<Box<[Page]>, IoError>;
}

/// Pages already read.
pub(crate) struct Ready(pub(crate) Box<[Page]>);

impl PendingPages for Ready {
    fn wait(self: Box<Self>) -> Result<Box<[Page]>, IoError> {
        Ok(self.0)
    }
}

impl PendingPages for crate::client::PendingRead<'_> {
    fn wait(self: Box<Self>) -> Result<Box<[Page]>, IoError> {
        (*self).wait()
    }
}

impl PageStore for RemoteMemory {
    fn read_page(&self, addr: u64, page: &mut Page) -> Result<(), IoError> {
        RemoteMemory::read_page(self, addr, page)
    }
    fn write_page(&self, addr: u64, page: &Page) -> Result<(), IoError> {
        RemoteMemory::write_page(self, addr, page)
    }
    fn read_pages(&self, addr: u64, pages: &mut [Page]) -> Result<(), IoError> {
        RemoteMemory::read_pages(self, addr, pages)
    }
    fn write_pages(&self, addr: u64, pages: &[Page]) -> Result<(), IoError> {
        RemoteMemory::write_pages(self, addr, pages)
    }
    fn read_list(&self, list: &mut [(u64, &mut Page)]) -> Result<(), IoError> {
        RemoteMemory::read_list(self, list)
    }
    fn write_list(&self, list: &[(u64, &Page)]) -> Result<(), IoError> {
        RemoteMemory::write_list(self, list)
    }
    fn submit_read<'s>(&'s self, addrs: Vec<u64>) -> Result<Box<dyn PendingPages + 's>, IoError> {
        Ok(Box::new(RemoteMemory::submit_read(self, addrs)?))
    }
    fn known_zero(&self, addr: u64) -> bool {
        // An address range is mapped on its first write; until then it reads as zeros.
        self.group_of(addr).is_none()
    }
    fn location(&self, addr: u64) -> Option<String> {
        let g = self.group_of(addr)?;
        let nodes: Vec<String> = g.nodes[..self.layout().width]
            .iter()
            .map(|n| n.to_string())
            .collect();
        let noun = if nodes.len() == 1 { "node" } else { "nodes" };
        Some(format!("{noun} {}", nodes.join(", ")))
    }
}

/// Why a request on the export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The request reaches beyond the end of the export.
    #[error("{len} bytes at offset {offset} reach beyond the end of the {size}-byte export")]
    OutOfRange {
        /// Request offset.
        offset: u64,
        /// Request length.
        len: u64,
        /// Export size.
        size: u64,
    },
    /// The remote memory failed a page operation.
    #[error(transparent)]
    Io(#[from] IoError),
}

/// A block device of `size` bytes over a page store.
pub struct Export {
    store: Arc<dyn PageStore>,
    size: u64,
    locks: PageLocks,
}

/// The part of page `page_addr` that the byte range `[offset, end)` covers: (start within
/// the page, length).
fn piece(page_addr: u64, offset: u64, end: u64) -> (usize, usize) {
    let from = offset.max(page_addr);
    let to = end.min(page_addr + PAGE);
    ((from - page_addr) as usize, (to - from) as usize)
}

impl Export {
    /// An export of `size` bytes; the store must hold at least `size` rounded up to pages.
    pub fn new(store: Arc<dyn PageStore>, size: u64) -> Export {
        Export {
            store,
            size,
            locks: PageLocks::new(),
        }
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Checks that `[offset, offset + len)` lies inside the export.
    pub fn check(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(ExportError::OutOfRange {
                offset,
                len,
                size: self.size,
            }),
        }
    }

    /// Reads `buf.len()` bytes at `offset`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.check(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        let span = Span::of(offset, buf.len() as u64);
        let mut bounce = [0u8; PAGE_SIZE];
        for (p, at, n) in span.partial() {
            self.store.read_page(p, &mut bounce)?;
            buf[(p + at as u64 - offset) as usize..][..n].copy_from_slice(&bounce[at..at + n]);
        }
        let whole = &mut buf[span.whole_bytes(offset)];
        let (pages, _) = whole.as_chunks_mut::<PAGE_SIZE>();
        if !pages.is_empty() {
            self.store.read_pages(span.whole_start, pages)?;
        }
        Ok(())
    }

    /// Writes `data` at `offset`; returns once every page touched is acknowledged.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), ExportError> {
        self.check(offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        let span = Span::of(offset, data.len() as u64);
        let _guards = self.locks.lock_span(span.first / PAGE, span.pages());
        let mut page = [0u8; PAGE_SIZE];
        for (p, at, n) in span.partial() {
            self.store.read_page(p, &mut page)?;
            page[at..at + n].copy_from_slice(&data[(p + at as u64 - offset) as usize..][..n]);
            self.store.write_page(p, &page)?;
        }
        let (pages, _) = data[span.whole_bytes(offset)].as_chunks::<PAGE_SIZE>();
        if !pages.is_empty() {
            self.store.write_pages(span.whole_start, pages)?;
        }
        Ok(())
    }

    /// Makes `len` bytes at `offset` read as zeros, provisioned: every page touched that may
    /// hold data is written with zeros (WRITE_ZEROES with NO_HOLE), and the call returns once
    /// all are acknowledged. Pages that were never written are skipped (they read as zeros).
    pub fn zero(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.zero_range(offset, len, false)
    }

    /// Makes `len` bytes at `offset` read as zeros, holes allowed (TRIM, WRITE_ZEROES without
    /// NO_HOLE): as [`Export::zero`], except that whole pages the store can discard for good
    /// ([`PageStore::discard`]) are discarded instead of written.
    pub fn trim(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.zero_range(offset, len, true)
    }

    fn zero_range(&self, offset: u64, len: u64, may_discard: bool) -> Result<(), ExportError> {
        self.check(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let span = Span::of(offset, len);
        let _guards = self.locks.lock_span(span.first / PAGE, span.pages());
        let mut page = [0u8; PAGE_SIZE];
        for (p, at, n) in span.partial() {
            if self.store.known_zero(p) {
                continue;
            }
            self.store.read_page(p, &mut page)?;
            page[at..at + n].fill(0);
            self.store.write_page(p, &page)?;
        }
        // Whole pages, ZERO_BATCH at a time (bounded memory whatever the length): those that
        // may hold data are discarded where allowed and the store can, else written with
        // zeros, runs of consecutive ones from one buffer.
        let mut zeros: Vec<Page> = Vec::new();
        let mut p = span.whole_start;
        while p < span.whole_end {
            let end = (p + ZERO_BATCH as u64 * PAGE).min(span.whole_end);
            let held: Vec<u64> = (p..end)
                .step_by(PAGE_SIZE)
                .filter(|a| !self.store.known_zero(*a))
                .collect();
            p = end;
            if held.is_empty() || (may_discard && self.store.discard(&held)) {
                continue;
            }
            if zeros.is_empty() {
                zeros = vec![[0u8; PAGE_SIZE]; ZERO_BATCH];
            }
            for run in held.chunk_by(|a, b| b - a == PAGE) {
                self.store.write_pages(run[0], &zeros[..run.len()])?;
            }
        }
        Ok(())
    }
}

impl Export {
    /// Whether a request of `len` bytes at `offset` covers whole pages only, inside the
    /// export: what [`Export::read_many`] and [`Export::write_many`] batch.
    pub fn whole_pages(&self, offset: u64, len: u64) -> bool {
        len > 0
            && offset.is_multiple_of(PAGE)
            && len.is_multiple_of(PAGE)
            && self.check(offset, len).is_ok()
    }

    /// Reads many requests at once — `(offset, buffer)`, each of whole pages
    /// ([`Export::whole_pages`]) — with all their pages in flight together: one list call to
    /// the store, so the pages of requests a client pipelined travel in one frame per node.
    /// Returns each request's outcome; when the list call fails, the requests are read again
    /// one by one, so that each gets its own outcome.
    pub fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> Vec<Result<(), ExportError>> {
        if reqs
            .iter()
            .any(|(o, b)| !self.whole_pages(*o, b.len() as u64))
        {
            return self.one_by_one_read(reqs);
        }
        let mut list: Vec<(u64, &mut Page)> = Vec::new();
        for (offset, buf) in reqs.iter_mut() {
            let (pages, _) = buf.as_chunks_mut::<PAGE_SIZE>();
            list.extend((*offset..).step_by(PAGE_SIZE).zip(pages.iter_mut()));
        }
        match self.store.read_list(&mut list) {
            Ok(()) => reqs.iter().map(|_| Ok(())).collect(),
            Err(_) => {
                drop(list);
                self.one_by_one_read(reqs)
            }
        }
    }

    /// Starts many READs at once — `(offset, len)`, each of whole pages
    /// ([`Export::whole_pages`]) — with all their pages in flight, and returns without waiting
    /// for them: [`SubmittedReads::wait`] gives their pages back, request after request.
    pub fn submit_reads(&self, reqs: &[(u64, u64)]) -> Result<SubmittedReads<'_>, ExportError> {
        if let Some(&(offset, len)) = reqs.iter().find(|(o, l)| !self.whole_pages(*o, *l)) {
            return Err(ExportError::OutOfRange {
                offset,
                len,
                size: self.size,
            });
        }
        let addrs: Vec<u64> = reqs
            .iter()
            .flat_map(|&(offset, len)| (offset..offset + len).step_by(PAGE_SIZE))
            .collect();
        Ok(SubmittedReads {
            pending: self.store.submit_read(addrs)?,
        })
    }

    /// Each request read on its own.
    fn one_by_one_read(&self, reqs: &mut [(u64, &mut [u8])]) -> Vec<Result<(), ExportError>> {
        reqs.iter_mut().map(|(o, b)| self.read(*o, b)).collect()
    }

    /// Writes many requests at once — `(offset, data)`, each of whole pages
    /// ([`Export::whole_pages`]) — with all their pages in flight together, holding the
    /// stripes of every page for the whole call. Requests that overlap are written in order
    /// (the later one's bytes stay). Returns each request's outcome; when the list call fails,
    /// the requests are written again one by one, so that each gets its own outcome.
    pub fn write_many(&self, reqs: &[(u64, &[u8])]) -> Vec<Result<(), ExportError>> {
        if reqs
            .iter()
            .any(|(o, d)| !self.whole_pages(*o, d.len() as u64))
        {
            return reqs.iter().map(|(o, d)| self.write(*o, d)).collect();
        }
        let mut list: Vec<(u64, &Page)> = Vec::new();
        for (offset, data) in reqs {
            let (pages, _) = data.as_chunks::<PAGE_SIZE>();
            list.extend((*offset..).step_by(PAGE_SIZE).zip(pages.iter()));
        }
        let guards = self.locks.lock_pages(list.iter().map(|(a, _)| a / PAGE));
        let r = self.store.write_list(&list);
        drop(guards);
        match r {
            Ok(()) => reqs.iter().map(|_| Ok(())).collect(),
            Err(_) => reqs.iter().map(|(o, d)| self.write(*o, d)).collect(),
        }
    }
}

/// READs started with [`Export::submit_reads`].
pub struct SubmittedReads<'e> {
    pending: Box<dyn PendingPages + 'e>,
}

impl SubmittedReads<'_> {
    /// Waits for the reads; returns every page of every request, in order (request i's bytes
    /// follow request i − 1's).
    pub fn wait(self) -> Result<Box<[Page]>, ExportError> {
        Ok(self.pending.wait()?)
    }
}

/// Pages one zeroing call writes at once.
const ZERO_BATCH: usize = 256;

/// The pages a byte range `[offset, offset + len)` (`len > 0`) touches: those it covers whole
/// (`whole_start..whole_end`, possibly none) and at most two it covers in part (the first and
/// the last).
struct Span {
    offset: u64,
    end: u64,
    /// First page touched.
    first: u64,
    /// One past the last page touched.
    last_end: u64,
    whole_start: u64,
    whole_end: u64,
}

impl Span {
    fn of(offset: u64, len: u64) -> Span {
        let end = offset + len;
        let first = offset / PAGE * PAGE;
        let last_end = end.div_ceil(PAGE) * PAGE;
        let whole_start = offset.div_ceil(PAGE) * PAGE;
        let whole_end = (end / PAGE * PAGE).max(whole_start);
        Span {
            offset,
            end,
            first,
            last_end,
            whole_start,
            whole_end,
        }
    }

    /// Pages touched.
    fn pages(&self) -> u64 {
        (self.last_end - self.first) / PAGE
    }

    /// The bytes of the request (relative to `offset`) that the whole pages cover.
    fn whole_bytes(&self, offset: u64) -> std::ops::Range<usize> {
        if self.whole_start >= self.whole_end {
            return 0..0;
        }
        (self.whole_start - offset) as usize..(self.whole_end - offset) as usize
    }

    /// The pages covered in part, as (page address, start within the page, length).
    fn partial(&self) -> impl Iterator<Item = (u64, usize, usize)> + '_ {
        let head = (self.first < self.whole_start || self.whole_start >= self.whole_end)
            .then_some(self.first);
        let tail = (self.last_end > self.whole_end && self.last_end - PAGE != self.first)
            .then(|| self.last_end - PAGE);
        head.into_iter()
            .chain(tail)
            .filter(|&p| p < self.whole_start || p >= self.whole_end)
            .map(|p| {
                let (at, n) = piece(p, self.offset, self.end);
                (p, at, n)
            })
    }
}

/// Pages in process memory: an export that needs no cluster, for tests, fuzzing and trying
/// the NBD server out. Every page reads as zeros until written; `pause` sleeps inside every
/// read (zero for none) to widen the window in which an unlocked read-modify-write would lose
/// a concurrent write. Addresses are those [`Export`] passes: multiples of 4096 below the
/// size given to [`MemStore::new`] rounded up to pages.
pub struct MemStore {
    bytes: Mutex<Vec<u8>>,
    written: Mutex<Vec<bool>>,
    writes: AtomicU64,
    /// List calls of more than one page.
    lists: AtomicU64,
    pause: Duration,
}

impl MemStore {
    /// A store of `size` bytes rounded up to whole pages, all zero.
    ///
    /// # Panics
    /// If `size` does not fit the address space (the store is allocated whole).
    pub fn new(size: u64, pause: Duration) -> Arc<MemStore> {
        let pages = usize::try_from(size.div_ceil(PAGE)).expect("MemStore size fits in memory");
        Arc::new(MemStore {
            bytes: Mutex::new(vec![0; pages * PAGE_SIZE]),
            written: Mutex::new(vec![false; pages]),
            writes: AtomicU64::new(0),
            lists: AtomicU64::new(0),
            pause,
        })
    }

    /// Pages written so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Calls of [`PageStore::read_list`] or [`PageStore::write_list`] with more than one page
    /// so far: batches a front end gathered.
    pub fn lists(&self) -> u64 {
        self.lists.load(Ordering::Relaxed)
    }
}

impl PageStore for MemStore {
    fn read_page(&self, addr: u64, page: &mut Page) -> Result<(), IoError> {
        page.copy_from_slice(&self.bytes.lock()[addr as usize..][..PAGE_SIZE]);
        if !self.pause.is_zero() {
            std::thread::sleep(self.pause);
        }
        Ok(())
    }
    fn write_page(&self, addr: u64, page: &Page) -> Result<(), IoError> {
        self.bytes.lock()[addr as usize..][..PAGE_SIZE].copy_from_slice(page);
        self.written.lock()[(addr / PAGE) as usize] = true;
        self.writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn read_list(&self, list: &mut [(u64, &mut Page)]) -> Result<(), IoError> {
        if list.len() > 1 {
            self.lists.fetch_add(1, Ordering::Relaxed);
        }
        list.iter_mut()
            .try_for_each(|(addr, page)| self.read_page(*addr, page))
    }
    fn write_list(&self, list: &[(u64, &Page)]) -> Result<(), IoError> {
        if list.len() > 1 {
            self.lists.fetch_add(1, Ordering::Relaxed);
        }
        list.iter()
            .try_for_each(|(addr, page)| self.write_page(*addr, page))
    }
    fn known_zero(&self, addr: u64) -> bool {
        !self.written.lock()[(addr / PAGE) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn out_of_range_is_refused_without_writing() {
        let store = MemStore::new(10_000, Default::default());
        let e = Export::new(store.clone(), 10_000);
        assert!(e.write(9_999, &[1]).is_ok());
        assert!(matches!(
            e.write(9_999, &[1, 2]),
            Err(ExportError::OutOfRange { .. })
        ));
        assert!(e.read(u64::MAX, &mut [0]).is_err());
        assert!(e.zero(10_000, 1).is_err());
        assert!(e.zero(10_000, 0).is_ok());
        // Empty requests at the very end are in range and touch no page (found by fuzzing:
        // a zero-length read at `size` once read the page past the end).
        assert!(e.read(10_000, &mut []).is_ok());
        assert!(e.write(10_000, &[]).is_ok());
        assert_eq!(store.writes(), 1);
    }

    /// A [`MemStore`] that discards: a discarded page reads as zeros until written again.
    struct Discarding {
        inner: Arc<MemStore>,
        gone: Mutex<std::collections::HashSet<u64>>,
        asked: Mutex<Vec<u64>>,
    }

    impl PageStore for Discarding {
        fn read_page(&self, addr: u64, page: &mut Page) -> Result<(), IoError> {
            if self.gone.lock().contains(&addr) {
                page.fill(0);
                return Ok(());
            }
            self.inner.read_page(addr, page)
        }
        fn write_page(&self, addr: u64, page: &Page) -> Result<(), IoError> {
            self.gone.lock().remove(&addr);
            self.inner.write_page(addr, page)
        }
        fn known_zero(&self, addr: u64) -> bool {
            self.gone.lock().contains(&addr) || self.inner.known_zero(addr)
        }
        fn discard(&self, addrs: &[u64]) -> bool {
            self.gone.lock().extend(addrs);
            self.asked.lock().extend(addrs);
            true
        }
    }

    #[test]
    fn zeroing_discards_whole_pages_where_the_store_can() {
        let inner = MemStore::new(1 << 20, Default::default());
        let store = Arc::new(Discarding {
            inner: inner.clone(),
            gone: Mutex::default(),
            asked: Mutex::default(),
        });
        let e = Export::new(store.clone(), 1 << 20);
        let data: Vec<u8> = (0..10 * PAGE_SIZE).map(|i| (i % 251) as u8 + 1).collect();
        e.write(0, &data).unwrap();
        let writes = inner.writes();
        // From byte 100 of page 0 to byte 100 of page 8: pages 1..8 whole, 0 and 8 partly.
        e.trim(100, 8 * PAGE).unwrap();
        let whole: Vec<u64> = (1..8).map(|p| p * PAGE).collect();
        assert_eq!(*store.asked.lock(), whole, "the whole pages discarded");
        assert_eq!(
            inner.writes(),
            writes + 2,
            "only the two partial pages written"
        );
        let mut want = data.clone();
        want[100..100 + 8 * PAGE_SIZE].fill(0);
        let mut got = vec![0u8; want.len()];
        e.read(0, &mut got).unwrap();
        assert!(got == want, "zeros exactly where zeroed");
        // Pages already zero are not asked again.
        e.trim(0, 10 * PAGE).unwrap();
        assert_eq!(store.asked.lock().len(), 7 + 3, "pages 0, 8 and 9 only");
        // Provisioned zeros (WRITE_ZEROES with NO_HOLE) are written, never discarded.
        e.write(0, &data).unwrap();
        let writes = inner.writes();
        e.zero(0, 10 * PAGE).unwrap();
        assert_eq!(store.asked.lock().len(), 10, "nothing more discarded");
        assert_eq!(inner.writes(), writes + 10, "every page written with zeros");
        let mut got = vec![1u8; 10 * PAGE_SIZE];
        e.read(0, &mut got).unwrap();
        assert!(got.iter().all(|&b| b == 0));
    }

    #[test]
    fn zeroing_skips_pages_never_written() {
        let store = MemStore::new(1 << 20, Default::default());
        let e = Export::new(store.clone(), 1 << 20);
        e.zero(0, 1 << 20).unwrap();
        assert_eq!(store.writes(), 0);
        e.write(5000, &[9; 10]).unwrap();
        e.zero(0, 1 << 20).unwrap();
        assert_eq!(store.writes(), 2);
        let mut b = [1u8; 20];
        e.read(4995, &mut b).unwrap();
        assert_eq!(b, [0; 20]);
    }

    #[test]
    fn concurrent_writes_to_two_halves_of_a_page_both_survive() {
        // Without the page lock both writers read the old page during the pause and the
        // second write-back erases the first half.
        let store = MemStore::new(4 * PAGE, Duration::from_millis(2));
        let e = Arc::new(Export::new(store, 4 * PAGE));
        for round in 0..20u8 {
            let hs: Vec<_> = [0usize, 2048]
                .into_iter()
                .map(|half| {
                    let e = e.clone();
                    std::thread::spawn(move || {
                        let v = if half == 0 { round } else { round + 100 };
                        e.write(PAGE + half as u64, &[v; 2048]).unwrap()
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            let mut page = vec![0u8; PAGE_SIZE];
            e.read(PAGE, &mut page).unwrap();
            assert!(page[..2048].iter().all(|&b| b == round), "round {round}");
            assert!(
                page[2048..].iter().all(|&b| b == round + 100),
                "round {round}"
            );
        }
    }

    /// One operation of the model test.
    #[derive(Debug, Clone)]
    enum Op {
        Write(u64, Vec<u8>),
        Zero(u64, u64),
        Read(u64, usize),
    }

    fn arb_op(size: u64) -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..size, proptest::collection::vec(any::<u8>(), 0..9000))
                .prop_map(|(o, d)| Op::Write(o, d)),
            (0..size, 0u64..9000).prop_map(|(o, l)| Op::Zero(o, l)),
            (0..size, 0usize..9000).prop_map(|(o, l)| Op::Read(o, l)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Any sequence of unaligned writes, zeroings and reads behaves like a byte array of
        /// the export's size; requests reaching beyond it fail and change nothing.
        #[test]
        fn behaves_like_a_byte_array(ops in proptest::collection::vec(arb_op(40_000), 1..40)) {
            let size = 37_123u64;
            let e = Export::new(MemStore::new(size, Default::default()), size);
            let mut model = vec![0u8; size as usize];
            for op in ops {
                match op {
                    Op::Write(o, d) => {
                        let fits = o + d.len() as u64 <= size;
                        prop_assert_eq!(e.write(o, &d).is_ok(), fits);
                        if fits {
                            model[o as usize..][..d.len()].copy_from_slice(&d);
                        }
                    }
                    Op::Zero(o, l) => {
                        let fits = o + l <= size;
                        prop_assert_eq!(e.zero(o, l).is_ok(), fits);
                        if fits {
                            model[o as usize..][..l as usize].fill(0);
                        }
                    }
                    Op::Read(o, l) => {
                        let mut b = vec![0xAA; l];
                        let fits = o + l as u64 <= size;
                        prop_assert_eq!(e.read(o, &mut b).is_ok(), fits);
                        if fits {
                            prop_assert_eq!(&b[..], &model[o as usize..][..l]);
                        }
                    }
                }
            }
            let mut all = vec![0u8; size as usize];
            e.read(0, &mut all).unwrap();
            prop_assert_eq!(all, model);
        }
    }
}
