//! The page table of one file: file page → page of the remote address space.
//!
//! A file page is a hole (never allocated: reads as zeros, costs nothing), allocated but not
//! yet written (fallocate, or pages reused from a deleted file: reads as zeros without asking
//! the cluster, and a partial write starts from zeros instead of the old bytes), or written.
//! Entries live in chunks of [`CHUNK`] pages in a B-tree, so a sparse file costs only what
//! it maps (8 bytes per mapped page, rounded to chunks).
//!
//! Invariants: an entry changes between hole and allocated only under the table's write lock
//! (the caller's `RwLock`); the written bit is set under the read lock, atomically, after the
//! page's write was acknowledged, so a reader holding the read lock sees each entry either
//! before or after, never torn.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Pages per chunk of the table.
pub const CHUNK: u64 = 64;

const WRITTEN: u64 = 1;

/// What a file page is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// Never allocated: reads as zeros.
    Hole,
    /// Allocated at this page of the address space, not written yet: reads as zeros.
    Unwritten(u64),
    /// Allocated at this page and written.
    Written(u64),
}

impl Entry {
    fn decode(v: u64) -> Entry {
        match v {
            0 => Entry::Hole,
            v if v & WRITTEN != 0 => Entry::Written((v >> 1) - 1),
            v => Entry::Unwritten((v >> 1) - 1),
        }
    }

    /// The page of the address space, if allocated.
    pub fn page(self) -> Option<u64> {
        match self {
            Entry::Hole => None,
            Entry::Unwritten(p) | Entry::Written(p) => Some(p),
        }
    }
}

/// A file's page table.
#[derive(Debug, Default)]
pub struct PageTable {
    chunks: BTreeMap<u64, Box<[AtomicU64]>>,
    mapped: u64,
}

impl PageTable {
    /// An empty table (every page a hole).
    pub fn new() -> PageTable {
        PageTable::default()
    }

    /// Pages allocated.
    pub fn mapped(&self) -> u64 {
        self.mapped
    }

    /// The entry of file page `page`.
    pub fn get(&self, page: u64) -> Entry {
        match self.chunks.get(&(page / CHUNK)) {
            Some(c) => Entry::decode(c[(page % CHUNK) as usize].load(Ordering::Acquire)),
            None => Entry::Hole,
        }
    }

    /// Maps file page `page`, a hole, to address-space page `at`, not written yet.
    pub fn map(&mut self, page: u64, at: u64) {
        let chunk = self
            .chunks
            .entry(page / CHUNK)
            .or_insert_with(|| (0..CHUNK).map(|_| AtomicU64::new(0)).collect());
        let slot = &chunk[(page % CHUNK) as usize];
        debug_assert_eq!(slot.load(Ordering::Relaxed), 0, "mapping a mapped page");
        slot.store((at + 1) << 1, Ordering::Release);
        self.mapped += 1;
    }

    /// Records that file page `page` (allocated) has been written.
    pub fn mark_written(&self, page: u64) {
        if let Some(c) = self.chunks.get(&(page / CHUNK)) {
            c[(page % CHUNK) as usize].fetch_or(WRITTEN, Ordering::AcqRel);
        }
    }

    /// Unmaps the file pages in `first..end`; returns the address-space pages they held.
    pub fn unmap(&mut self, first: u64, end: u64) -> Vec<u64> {
        let mut freed = Vec::new();
        if first >= end {
            return freed;
        }
        let chunks: Vec<u64> = self
            .chunks
            .range(first / CHUNK..=(end - 1) / CHUNK)
            .map(|(&k, _)| k)
            .collect();
        for k in chunks {
            let Some(c) = self.chunks.get(&k) else {
                continue;
            };
            let lo = first.max(k * CHUNK);
            let hi = end.min((k + 1) * CHUNK);
            for p in lo..hi {
                let v = c[(p % CHUNK) as usize].swap(0, Ordering::AcqRel);
                if let Some(at) = Entry::decode(v).page() {
                    freed.push(at);
                }
            }
            if c.iter().all(|e| e.load(Ordering::Relaxed) == 0) {
                self.chunks.remove(&k);
            }
        }
        self.mapped -= freed.len() as u64;
        freed
    }

    /// Where file page `page` would lie if the file were contiguous from its nearest mapped
    /// page below (in the same or an earlier chunk): the allocator's hint, so that a file
    /// grows into the pages following its own.
    pub fn hint(&self, page: u64) -> Option<u64> {
        let (&k, c) = self.chunks.range(..=page / CHUNK).next_back()?;
        let top = if k == page / CHUNK {
            page % CHUNK
        } else {
            CHUNK
        };
        (0..top).rev().find_map(|i| {
            Entry::decode(c[i as usize].load(Ordering::Relaxed))
                .page()
                .map(|at| at + (page - (k * CHUNK + i)))
        })
    }

    /// Every mapped page as (file page, entry), in file order.
    pub fn entries(&self) -> impl Iterator<Item = (u64, Entry)> + '_ {
        self.chunks.iter().flat_map(|(&k, c)| {
            c.iter().enumerate().filter_map(move |(i, e)| {
                let e = Entry::decode(e.load(Ordering::Acquire));
                (e != Entry::Hole).then_some((k * CHUNK + i as u64, e))
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_go_from_hole_to_unwritten_to_written_and_back() {
        let mut t = PageTable::new();
        assert_eq!(t.get(5), Entry::Hole);
        t.map(5, 0);
        t.map(200, 17);
        assert_eq!(t.get(5), Entry::Unwritten(0));
        t.mark_written(5);
        assert_eq!(t.get(5), Entry::Written(0));
        assert_eq!(t.mapped(), 2);
        assert_eq!(t.hint(6), Some(1));
        assert_eq!(t.hint(201), Some(18));
        assert_eq!(t.hint(130), Some(125));
        assert_eq!(t.hint(3), None);
        assert_eq!(
            t.entries().collect::<Vec<_>>(),
            vec![(5, Entry::Written(0)), (200, Entry::Unwritten(17))]
        );
        assert_eq!(t.unmap(6, 1000), vec![17]);
        assert_eq!(t.unmap(0, 6), vec![0]);
        assert_eq!(t.mapped(), 0);
        assert!(t.chunks.is_empty());
    }
}
