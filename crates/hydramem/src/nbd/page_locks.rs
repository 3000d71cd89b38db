//! A striped lock table over page numbers: the serialization point of every write to a page.
//!
//! A remote page is written whole (`RemoteMemory::write_page`), so a write of part of a page is
//! a read-modify-write. Two such writes to different bytes of one page, from two requests (on
//! one connection's workers or on two connections), would otherwise both read the old page and
//! the second write back would erase the first. Every write path — partial or whole page, WRITE,
//! TRIM, WRITE_ZEROES — therefore holds the page's stripe while it reads and writes that page.
//!
//! Invariants: a thread holds either one stripe, or the stripes of a span of pages taken
//! together in ascending stripe order ([`PageLocks::lock_span`]), so no two threads can each
//! hold a stripe the other waits for: stripes never deadlock. Reads take no lock, because a
//! remote page read always returns one whole acknowledged version (docs/architecture.md,
//! "Versions"). Pages that share a stripe merely serialize; with [`STRIPES`] stripes and page
//! numbers spread by a multiplicative hash, unrelated pages rarely collide.

use parking_lot::{Mutex, MutexGuard};

/// Number of stripes: far more than concurrent writers (connections × workers), so that
/// collisions between unrelated pages are rare, and small (a few KiB) in memory.
pub const STRIPES: usize = 1024;

/// The lock table.
pub struct PageLocks {
    stripes: Box<[Mutex<()>]>,
}

impl Default for PageLocks {
    fn default() -> Self {
        PageLocks::new()
    }
}

impl PageLocks {
    /// A table of [`STRIPES`] unlocked stripes.
    pub fn new() -> PageLocks {
        PageLocks {
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }

    /// The stripe of page number `page` (byte address / 4096).
    fn index(page: u64) -> usize {
        // Fibonacci hashing: consecutive pages land on distant stripes.
        (page.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 54) as usize % STRIPES
    }

    /// Locks the stripe of page `page` until the guard is dropped.
    pub fn lock(&self, page: u64) -> MutexGuard<'_, ()> {
        self.stripes[Self::index(page)].lock()
    }

    /// Locks the stripes of pages `first..first + n` until the guards are dropped: each
    /// stripe once, in ascending stripe order (see the module doc).
    pub fn lock_span(&self, first: u64, n: u64) -> Vec<MutexGuard<'_, ()>> {
        self.lock_pages(first..first.saturating_add(n))
    }

    /// Locks the stripes of the page numbers `pages` (in any order, repeats allowed) until the
    /// guards are dropped: each stripe once, in ascending stripe order (see the module doc).
    pub fn lock_pages(&self, pages: impl Iterator<Item = u64>) -> Vec<MutexGuard<'_, ()>> {
        let mut idx: Vec<usize> = pages.map(Self::index).collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter().map(|i| self.stripes[i].lock()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_lock_each_stripe_once_and_exclude_single_locks() {
        let locks = PageLocks::new();
        // 4096 pages cover every stripe (several pages per stripe): each is taken once.
        let guards = locks.lock_span(7, 4096);
        assert_eq!(guards.len(), STRIPES);
        assert!(locks.stripes[PageLocks::index(9)].try_lock().is_none());
        drop(guards);
        assert!(locks.stripes[PageLocks::index(9)].try_lock().is_some());
        assert!(locks.lock_span(0, 0).is_empty());
    }

    #[test]
    fn consecutive_pages_spread_over_stripes() {
        let used: std::collections::HashSet<usize> = (0..256).map(PageLocks::index).collect();
        assert!(
            used.len() > 200,
            "only {} stripes for 256 pages",
            used.len()
        );
        assert!((0..100_000u64).all(|p| PageLocks::index(p) < STRIPES));
        assert!(PageLocks::index(u64::MAX) < STRIPES);
    }

    #[test]
    fn one_page_is_exclusive() {
        let l = PageLocks::new();
        let g = l.lock(7);
        assert!(l.stripes[PageLocks::index(7)].try_lock().is_none());
        drop(g);
        assert!(l.stripes[PageLocks::index(7)].try_lock().is_some());
    }
}
