//! File bytes: reads, writes, truncation and preallocation of a file's pages in the page store
//! (the cluster through the batched page API, or process memory).
//!
//! A request's pages travel in one list call ([`PageStore::read_list`] /
//! [`PageStore::write_list`]): all in flight at once, consecutive pages as one run per node.
//! A write covering whole, aligned pages goes straight from the request's buffer; other
//! writes assemble their pages first, reading a partly covered first or last page that holds
//! data (read-modify-write). Pages that are holes or unwritten are never asked for: they
//! read as zeros.
//!
//! Invariants: a file's I/O holds its page table's read lock from the moment its pages are
//! resolved until the store answered, so no page it uses can be unmapped (truncate, punch,
//! delete take the write lock) and handed to another file meanwhile; every write holds the
//! [`PageLocks`] stripes of its pages while it reads whether they are written, merges and
//! marks them written, so two partial writes to one page never lose each other; a page is
//! marked written only after its write was acknowledged; the bytes of a file's last page
//! beyond its size are zeros (truncation zeroes them), so growing a file shows zeros.

use std::sync::Arc;

use parking_lot::{Mutex, RwLockReadGuard, RwLockWriteGuard};

use super::alloc::{NoSpace, PageAllocator};
use super::namespace::Inode;
use super::table::{Entry, PageTable};
use super::FsError;
use crate::client::Page;
use crate::nbd::page_locks::PageLocks;
use crate::nbd::PageStore;
use crate::PAGE_SIZE;

const P: u64 = PAGE_SIZE as u64;

/// Largest file offset (bytes): far beyond any address space, and `offset + len` of any
/// request below it cannot overflow.
pub const MAX_FILE_SIZE: u64 = 1 << 62;

/// File pages in a store, with the allocator of the store's pages.
pub struct Data {
    store: Arc<dyn PageStore>,
    alloc: Mutex<PageAllocator>,
    locks: PageLocks,
}

/// The file pages `first..end` a byte range touches.
fn span(offset: u64, len: u64) -> (u64, u64) {
    (offset / P, (offset + len).div_ceil(P))
}

impl Data {
    /// File data in `store`, whose address space holds `pages` pages.
    /// Page 0 is kept for the superblock ([`super::snapshot`]) and never given to a file.
    pub fn new(store: Arc<dyn PageStore>, pages: u64) -> Data {
        let mut alloc = PageAllocator::new(pages);
        alloc.reserve(0, 1);
        Data {
            store,
            alloc: Mutex::new(alloc),
            locks: PageLocks::new(),
        }
    }

    /// The store the pages are in.
    pub fn store(&self) -> &dyn PageStore {
        &*self.store
    }

    /// Takes `n` free pages (for the metadata snapshot), as extents.
    pub fn take(&self, n: u64) -> Result<Vec<(u64, u64)>, NoSpace> {
        self.alloc.lock().alloc(n, None)
    }

    /// (pages in the address space, pages free).
    pub fn usage(&self) -> (u64, u64) {
        let a = self.alloc.lock();
        (a.total(), a.free_pages())
    }

    /// Reads `len` bytes at `offset` (the caller clamps them to the file's size).
    pub fn read(&self, inode: &Inode, offset: u64, len: usize) -> Result<Vec<u8>, FsError> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let (first, end) = span(offset, len as u64);
        let n = usize::try_from(end - first).map_err(|_| FsError::TooBig)?;
        let mut buf = vec![[0u8; PAGE_SIZE]; n];
        let table = inode.table.read();
        let mut list: Vec<(u64, &mut Page)> = buf
            .iter_mut()
            .zip(first..)
            .filter_map(|(page, fp)| match table.get(fp) {
                Entry::Written(at) => Some((at * P, page)),
                _ => None,
            })
            .collect();
        if !list.is_empty() {
            self.store.read_list(&mut list)?;
        }
        drop(list);
        drop(table);
        let mut bytes = buf.into_flattened();
        let start = (offset - first * P) as usize;
        bytes.drain(..start);
        bytes.truncate(len);
        Ok(bytes)
    }

    /// Writes `data` at `offset`; returns once every page touched is acknowledged.
    pub fn write(&self, inode: &Inode, offset: u64, data: &[u8]) -> Result<(), FsError> {
        if data.is_empty() {
            return Ok(());
        }
        let (first, end) = span(offset, data.len() as u64);
        let table = self.mapped(inode, first, end)?;
        // The address of each page is fixed while the table's read lock is held (mapping and
        // unmapping take the write lock), so it can be read before the stripes are taken.
        let addrs: Vec<u64> = (first..end)
            .map(|fp| table.get(fp).page().map_or(0, |at| at * P))
            .collect();
        let stripes = self.locks.lock_pages(addrs.iter().map(|a| a / P));
        // Invariant: a page's written bit is read only under its stripe, and set (below) before
        // the stripe is released. Read before the stripe, two partial writes to an unwritten
        // page both saw `Unwritten`, both started from zeros, and the later write-back erased
        // the earlier one's bytes; read here, the later writer sees `Written` and merges.
        let entries: Vec<(u64, Entry)> = (first..end).map(|fp| (fp, table.get(fp))).collect();
        if offset.is_multiple_of(P) && (data.len() as u64).is_multiple_of(P) {
            let (pages, _) = data.as_chunks::<PAGE_SIZE>();
            let list: Vec<(u64, &Page)> = addrs.iter().copied().zip(pages.iter()).collect();
            self.store.write_list(&list)?;
        } else {
            let mut buf = vec![[0u8; PAGE_SIZE]; entries.len()];
            let whole = |fp: u64| offset <= fp * P && offset + data.len() as u64 >= (fp + 1) * P;
            let mut old: Vec<(u64, &mut Page)> = buf
                .iter_mut()
                .zip(&entries)
                .filter_map(|(page, &(fp, e))| match e {
                    Entry::Written(at) if !whole(fp) => Some((at * P, page)),
                    _ => None,
                })
                .collect();
            if !old.is_empty() {
                self.store.read_list(&mut old)?;
            }
            drop(old);
            let start = (offset - first * P) as usize;
            buf.as_flattened_mut()[start..start + data.len()].copy_from_slice(data);
            let list: Vec<(u64, &Page)> = addrs.iter().copied().zip(buf.iter()).collect();
            self.store.write_list(&list)?;
        }
        for (fp, _) in entries {
            table.mark_written(fp);
        }
        drop(stripes);
        Ok(())
    }

    /// The file's table for reading, with every page of `first..end` mapped (allocating the
    /// holes, next to the file's preceding pages where free).
    fn mapped<'i>(
        &self,
        inode: &'i Inode,
        first: u64,
        end: u64,
    ) -> Result<RwLockReadGuard<'i, PageTable>, FsError> {
        if end > MAX_FILE_SIZE / P {
            return Err(FsError::TooBig);
        }
        let table = inode.table.read();
        if (first..end).all(|fp| table.get(fp) != Entry::Hole) {
            return Ok(table);
        }
        drop(table);
        let mut table = inode.table.write();
        let holes: Vec<u64> = (first..end)
            .filter(|&fp| table.get(fp) == Entry::Hole)
            .collect();
        if let Some(&h) = holes.first() {
            let hint = table.hint(h);
            let extents = self.alloc.lock().alloc(holes.len() as u64, hint)?;
            let pages = extents.into_iter().flat_map(|(s, l)| s..s + l);
            for (fp, at) in holes.into_iter().zip(pages) {
                table.map(fp, at);
            }
        }
        Ok(RwLockWriteGuard::downgrade(table))
    }

    /// Maps the pages of `[offset, offset + len)` without writing them (they read as zeros):
    /// fallocate's preallocation.
    pub fn allocate(&self, inode: &Inode, offset: u64, len: u64) -> Result<(), FsError> {
        if len == 0 {
            return Ok(());
        }
        let end = offset.checked_add(len).ok_or(FsError::TooBig)?;
        let (first, last) = span(offset, end - offset);
        self.mapped(inode, first, last).map(drop)
    }

    /// Cuts the file to `size` bytes: pages past it are freed, the bytes of its last page past
    /// it become zeros.
    pub fn truncate(&self, inode: &Inode, size: u64) -> Result<(), FsError> {
        let mut table = inode.table.write();
        if !size.is_multiple_of(P) {
            self.zero_in_page(&table, size / P, (size % P) as usize, PAGE_SIZE)?;
        }
        let freed = table.unmap(size.div_ceil(P), u64::MAX);
        self.free(freed);
        Ok(())
    }

    /// Makes `[offset, offset + len)` a hole: whole pages are freed, partly covered ones get
    /// zeros there (fallocate's PUNCH_HOLE).
    pub fn punch(&self, inode: &Inode, offset: u64, len: u64) -> Result<(), FsError> {
        if len == 0 {
            return Ok(());
        }
        let end = offset.checked_add(len).ok_or(FsError::TooBig)?;
        let mut table = inode.table.write();
        let (first, last) = span(offset, len);
        let edges = if last - first == 1 {
            vec![first]
        } else {
            vec![first, last - 1]
        };
        for fp in edges {
            let from = offset.max(fp * P) - fp * P;
            let to = end.min((fp + 1) * P) - fp * P;
            if to - from < P {
                self.zero_in_page(&table, fp, from as usize, to as usize)?;
            }
        }
        let whole_first = offset.div_ceil(P);
        let whole_end = end / P;
        if whole_first < whole_end {
            let freed = table.unmap(whole_first, whole_end);
            self.free(freed);
        }
        Ok(())
    }

    /// Zeroes bytes `from..to` of file page `fp`, if it holds data.
    fn zero_in_page(
        &self,
        table: &PageTable,
        fp: u64,
        from: usize,
        to: usize,
    ) -> Result<(), FsError> {
        let Entry::Written(at) = table.get(fp) else {
            return Ok(());
        };
        let _stripe = self.locks.lock(at);
        let mut page = [0u8; PAGE_SIZE];
        self.store.read_page(at * P, &mut page)?;
        page[from..to].fill(0);
        self.store.write_page(at * P, &page)?;
        Ok(())
    }

    /// Frees every page of a file that is gone.
    pub fn release(&self, inode: &Inode) {
        let freed = inode.table.write().unmap(0, u64::MAX);
        self.free(freed);
    }

    /// Returns pages to the allocator, runs of consecutive pages as one extent. The store
    /// forgets them first ([`PageStore::forget`]): under span coding their copies stop
    /// counting as live, so compaction neither moves them nor keeps their rows, and the
    /// nodes get the memory of a deleted file back. First, because once the allocator has a
    /// page another file may write it, and a forget after that write would drop the new
    /// bytes. The contract holds: a file reads only pages it marked written, so no page is
    /// read between its forget and its next write, and the pages were unmapped under the
    /// file's page table's write lock, so none of the file's I/O is in flight or can reach
    /// them.
    fn free(&self, mut pages: Vec<u64>) {
        pages.sort_unstable();
        let addrs: Vec<u64> = pages.iter().map(|p| p * P).collect();
        self.store.forget(&addrs);
        let mut alloc = self.alloc.lock();
        let mut i = 0;
        while i < pages.len() {
            let mut n = 1;
            while i + n < pages.len() && pages[i + n] == pages[i] + n as u64 {
                n += 1;
            }
            alloc.free(pages[i], n as u64);
            i += n;
        }
    }

    /// Tells the store to forget every free page (page 0, the superblock, is never free):
    /// after a remount with a kept identity, the copies a reattaching span store found again
    /// for pages no file holds — the last snapshot's, a deleted file's not yet overwritten —
    /// would otherwise count as live until written. Call it before any request: no page is
    /// in flight, and a free page is never read before a file writes it.
    pub fn forget_free(&self) {
        const BATCH: u64 = 4096;
        let extents: Vec<(u64, u64)> = self.alloc.lock().extents().collect();
        for (first, n) in extents {
            let mut p = first;
            while p < first + n {
                let end = (p + BATCH).min(first + n);
                let addrs: Vec<u64> = (p..end).map(|q| q * P).collect();
                self.store.forget(&addrs);
                p = end;
            }
        }
    }

    /// Marks the pages a file already holds as allocated (a namespace loaded from a snapshot);
    /// returns false if one of them is taken already.
    pub fn adopt(&self, table: &PageTable) -> bool {
        let mut alloc = self.alloc.lock();
        table
            .entries()
            .all(|(_, e)| e.page().is_some_and(|at| alloc.reserve(at, 1)))
    }
}
