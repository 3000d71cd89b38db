//! Address ranges the pager must never evict from: its own heap and the stacks of its own
//! threads. A page of them that went out would have to be fetched by the pager itself, which
//! may be the very thread that faulted on it.
//!
//! Invariants: a range is added before any page of it can be touched by the pager (the heap
//! before the first allocation in it, a stack before its thread starts), and never removed;
//! adding and reading allocate nothing, so both work inside the allocator and the
//! `pthread_create` hook.

use std::sync::atomic::{AtomicUsize, Ordering};

const MAX: usize = 4096;

static STARTS: [AtomicUsize; MAX] = [const { AtomicUsize::new(0) }; MAX];
static ENDS: [AtomicUsize; MAX] = [const { AtomicUsize::new(0) }; MAX];
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// Records `[start, end)` as the pager's own. Returns false if the table is full (then the
/// caller must not use the range for the pager).
pub fn add(start: usize, end: usize) -> bool {
    let i = COUNT.load(Ordering::Acquire);
    if i >= MAX {
        return false;
    }
    let i = COUNT.fetch_add(1, Ordering::AcqRel);
    if i >= MAX {
        return false;
    }
    STARTS[i].store(start, Ordering::Release);
    ENDS[i].store(end, Ordering::Release);
    true
}

/// Whether `[start, end)` overlaps a range of the pager's own.
pub fn overlaps(start: usize, end: usize) -> bool {
    let n = COUNT.load(Ordering::Acquire).min(MAX);
    (0..n).any(|i| {
        let (s, e) = (
            STARTS[i].load(Ordering::Acquire),
            ENDS[i].load(Ordering::Acquire),
        );
        // A slot being filled reads as (0, 0), which overlaps nothing.
        s < end && start < e
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn ranges_overlap() {
        assert!(super::add(0x10000, 0x20000));
        assert!(super::overlaps(0x1f000, 0x30000));
        assert!(super::overlaps(0x0, 0x10001));
        assert!(!super::overlaps(0x20000, 0x30000));
        assert!(!super::overlaps(0x0, 0x10000));
    }
}
