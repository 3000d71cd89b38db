//! The page allocator of a mount: which pages of the client's remote address space hold file
//! data, and which are free.
//!
//! The address space is `total` pages, numbered from 0 (page n is byte address n × 4096 of the
//! [`PageStore`](crate::nbd::PageStore)). Free pages are kept as extents (start → length) in
//! a B-tree; allocation prefers the page right after the previous page of the same file (so a
//! file written in order lies in consecutive pages, which the batched path sends as one run
//! per node) and otherwise takes the next free extent after a cursor (next fit), so that the
//! space fills from its low end and few address ranges — and so few slabs — are mapped.
//!
//! Invariants: free extents never overlap and never touch (adjacent ones are merged), every
//! page is either free or allocated exactly once, and `free_pages` is the sum of the extents'
//! lengths. Freeing a page that is already free is a bug of the caller and is refused (logged,
//! nothing changes) rather than corrupting the map.

use std::collections::BTreeMap;

/// The allocator has fewer free pages than asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the file system is full: {wanted} pages asked, {free} free")]
pub struct NoSpace {
    /// Pages asked for.
    pub wanted: u64,
    /// Pages free.
    pub free: u64,
}

/// Free extents of an address space of whole pages.
#[derive(Debug)]
pub struct PageAllocator {
    /// Free extents: first page → number of pages.
    free: BTreeMap<u64, u64>,
    total: u64,
    free_pages: u64,
    /// Where the next allocation without a usable hint starts looking.
    cursor: u64,
}

impl PageAllocator {
    /// An allocator of `total` pages, all free.
    pub fn new(total: u64) -> PageAllocator {
        let mut free = BTreeMap::new();
        if total > 0 {
            free.insert(0, total);
        }
        PageAllocator {
            free,
            total,
            free_pages: total,
            cursor: 0,
        }
    }

    /// Pages in the address space.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Pages free.
    pub fn free_pages(&self) -> u64 {
        self.free_pages
    }

    /// The free extents, `(first page, length)`, in address order.
    pub fn extents(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.free.iter().map(|(&first, &n)| (first, n))
    }

    /// Allocates `n` pages, as extents `(first page, length)` in allocation order: first as
    /// many as are free from `hint` on (contiguously), then next fit from the cursor. Either
    /// all `n` are allocated or none ([`NoSpace`]).
    pub fn alloc(&mut self, n: u64, hint: Option<u64>) -> Result<Vec<(u64, u64)>, NoSpace> {
        if n > self.free_pages {
            return Err(NoSpace {
                wanted: n,
                free: self.free_pages,
            });
        }
        let mut out = Vec::new();
        let mut left = n;
        if let Some(h) = hint.filter(|&h| h < self.total) {
            if let Some((start, len)) = self.extent_holding(h) {
                let take = left.min(start + len - h);
                self.take(start, len, h, take);
                out.push((h, take));
                left -= take;
            }
        }
        while left > 0 {
            let (start, len) = match self.free.range(self.cursor..).next() {
                Some((&s, &l)) => (s, l),
                // Wrap around: the allocator is not full (checked above), so an extent exists.
                None => match self.free.iter().next() {
                    Some((&s, &l)) => (s, l),
                    None => break,
                },
            };
            let take = left.min(len);
            self.take(start, len, start, take);
            out.push((start, take));
            left -= take;
        }
        if let Some(&(s, l)) = out.last() {
            self.cursor = s + l;
        }
        Ok(out)
    }

    /// Marks `[start, start + len)` allocated, when it is entirely free (used when the map of
    /// allocated pages is rebuilt from files); returns whether it was.
    pub fn reserve(&mut self, start: u64, len: u64) -> bool {
        match self.extent_holding(start) {
            Some((s, l)) if start + len <= s + l => {
                self.take(s, l, start, len);
                true
            }
            _ => false,
        }
    }

    /// Returns `[start, start + len)` to the free pages, merging it with free neighbours.
    /// Pages outside the space or already free are refused (logged, nothing changes).
    pub fn free(&mut self, start: u64, len: u64) {
        if len == 0 {
            return;
        }
        let end = start.saturating_add(len);
        let overlaps_prev = self
            .free
            .range(..end)
            .next_back()
            .is_some_and(|(&s, &l)| s + l > start);
        if end > self.total || overlaps_prev {
            tracing::error!(
                start,
                len,
                "freeing pages that are free or outside the space"
            );
            return;
        }
        let mut first = start;
        let mut length = len;
        if let Some((&s, &l)) = self.free.range(..start).next_back() {
            if s + l == start {
                self.free.remove(&s);
                first = s;
                length += l;
            }
        }
        if let Some(l) = self.free.remove(&end) {
            length += l;
        }
        self.free.insert(first, length);
        self.free_pages += len;
    }

    /// The free extent holding page `p`, if `p` is free.
    fn extent_holding(&self, p: u64) -> Option<(u64, u64)> {
        let (&s, &l) = self.free.range(..=p).next_back()?;
        (p < s + l).then_some((s, l))
    }

    /// Takes `[at, at + n)` out of the free extent `(start, len)` that holds it.
    fn take(&mut self, start: u64, len: u64, at: u64, n: u64) {
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - start);
        }
        if at + n < start + len {
            self.free.insert(at + n, start + len - at - n);
        }
        self.free_pages -= n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_file_written_in_order_gets_consecutive_pages() {
        let mut a = PageAllocator::new(100);
        let first = a.alloc(1, None).unwrap();
        assert_eq!(first, vec![(0, 1)]);
        // Another file takes pages in between: the hint still extends the first one where free.
        let other = a.alloc(3, None).unwrap();
        assert_eq!(other, vec![(1, 3)]);
        assert_eq!(a.alloc(2, Some(1)).unwrap(), vec![(4, 2)]);
        assert_eq!(a.alloc(2, Some(6)).unwrap(), vec![(6, 2)]);
        assert_eq!(a.free_pages(), 92);
    }

    #[test]
    fn full_space_refuses_without_allocating_anything() {
        let mut a = PageAllocator::new(4);
        a.alloc(3, None).unwrap();
        assert_eq!(a.alloc(2, None), Err(NoSpace { wanted: 2, free: 1 }));
        assert_eq!(a.free_pages(), 1);
        assert_eq!(a.alloc(1, None).unwrap(), vec![(3, 1)]);
    }

    #[test]
    fn freed_pages_merge_and_are_found_again_after_wrapping() {
        let mut a = PageAllocator::new(8);
        a.alloc(8, None).unwrap();
        a.free(2, 2);
        a.free(5, 1);
        a.free(4, 1);
        assert_eq!(
            a.free.iter().map(|(&s, &l)| (s, l)).collect::<Vec<_>>(),
            vec![(2, 4)]
        );
        assert_eq!(a.alloc(4, None).unwrap(), vec![(2, 4)]);
        assert_eq!(a.free_pages(), 0);
    }

    #[test]
    fn double_free_and_out_of_space_are_refused() {
        let mut a = PageAllocator::new(8);
        a.alloc(4, None).unwrap();
        a.free(6, 1);
        a.free(3, 2);
        a.free(7, 5);
        assert_eq!(a.free_pages(), 4);
        assert!(a.reserve(5, 3));
        assert!(!a.reserve(5, 1));
        assert_eq!(a.free_pages(), 1);
    }

    proptest! {
        /// Random allocations and frees keep every page either free or held exactly once.
        #[test]
        fn pages_are_never_handed_out_twice(ops in proptest::collection::vec((0u8..3, 1u64..20, 0u64..64), 1..200)) {
            let mut a = PageAllocator::new(64);
            let mut held: Vec<(u64, u64)> = Vec::new();
            for (op, n, hint) in ops {
                if op < 2 {
                    if let Ok(ext) = a.alloc(n, Some(hint)) {
                        prop_assert_eq!(ext.iter().map(|e| e.1).sum::<u64>(), n);
                        held.extend(ext);
                    }
                } else if !held.is_empty() {
                    let (s, l) = held.swap_remove((hint as usize) % held.len());
                    a.free(s, l);
                }
                let mut owner = [0u8; 64];
                for &(s, l) in &held {
                    for p in s..s + l {
                        owner[p as usize] += 1;
                    }
                }
                for (&s, &l) in &a.free {
                    for p in s..s + l {
                        owner[p as usize] += 1;
                    }
                }
                prop_assert!(owner.iter().all(|&c| c == 1));
                prop_assert_eq!(a.free_pages(), a.free.values().sum::<u64>());
            }
        }
    }
}
