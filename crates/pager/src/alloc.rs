//! The pager's own heap. Everything the pager allocates (the client, its buffers, its page
//! table) comes from one region it reserves for itself and records in `exclude`, never from
//! the program's allocator: pages of the program's heap may be out in the cluster, and the
//! thread that would fetch them must not fault on them itself.
//!
//! The allocator is talc (a general-purpose allocator that works on memory it is given)
//! behind a spin lock: only the pager's few threads allocate here, and a lock that parks
//! would itself allocate. The region is reserved once, without backing (MAP_NORESERVE):
//! only the pages the pager touches cost memory, and [`resident`] counts them (the pager's
//! own memory is not the program's: the evictor keeps it outside `--local-memory`).

use std::alloc::Layout;
use std::sync::atomic::{AtomicUsize, Ordering};

use talc::base::binning::Binning;
use talc::base::Talc;
use talc::source::Source;

/// Address space reserved for the pager's heap (only touched pages cost memory).
const RESERVE: usize = 64 << 30;

/// Where the heap region is (0 before the first allocation).
static BASE: AtomicUsize = AtomicUsize::new(0);
/// The end of the highest block ever handed out (0 before the first).
static HIGH: AtomicUsize = AtomicUsize::new(0);

/// Notes that a block of `size` bytes was handed out at `p`.
fn note(p: *mut u8, size: usize) -> *mut u8 {
    if !p.is_null() {
        HIGH.fetch_max((p as usize).saturating_add(size), Ordering::Relaxed);
    }
    p
}

/// Bytes of the pager's heap resident now: the pages of the part ever handed out that are
/// in memory (mincore), with `buf` as mincore's vector (one byte per page, grown as needed).
pub fn resident(buf: &mut Vec<u8>) -> u64 {
    let base = BASE.load(Ordering::Acquire);
    if base == 0 {
        return 0;
    }
    let end = HIGH.load(Ordering::Relaxed).next_multiple_of(crate::PAGE);
    let len = end.saturating_sub(base).min(RESERVE);
    buf.resize(len / crate::PAGE, 0);
    // SAFETY: `[base, base + len)` lies in the heap's mapping, which is never unmapped, and
    // `buf` has one byte for each of its pages.
    let r = unsafe { libc::mincore(base as *mut libc::c_void, len, buf.as_mut_ptr()) };
    if r != 0 {
        return 0;
    }
    buf.iter().filter(|b| **b & 1 != 0).count() as u64 * crate::PAGE as u64
}

/// Whether `p` points into the pager's heap.
pub fn owns(p: *const u8) -> bool {
    let base = BASE.load(Ordering::Acquire);
    base != 0 && (p as usize).wrapping_sub(base) < RESERVE
}

/// Reserves the heap region on the first allocation.
#[derive(Debug)]
pub struct Reserve {
    claimed: bool,
}

impl Reserve {
    /// A source that has reserved nothing yet.
    pub const fn new() -> Reserve {
        Reserve { claimed: false }
    }
}

impl Default for Reserve {
    fn default() -> Self {
        Reserve::new()
    }
}

// SAFETY: `acquire` touches talc only through the `&mut Talc` it is given, and allocates
// nothing itself (mmap and the exclusion table do not allocate).
unsafe impl Source for Reserve {
    fn acquire<B: Binning>(talc: &mut Talc<Self, B>, _layout: Layout) -> Result<(), ()> {
        if talc.source.claimed {
            return Err(());
        }
        // SAFETY: a fresh private anonymous mapping; no memory of anyone else is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                RESERVE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(());
        }
        if !crate::exclude::add(base as usize, base as usize + RESERVE) {
            return Err(());
        }
        talc.source.claimed = true;
        BASE.store(base as usize, Ordering::Release);
        // SAFETY: the region is ours alone, readable and writable, and lives forever.
        match unsafe { talc.claim(base.cast(), RESERVE) } {
            Some(_) => Ok(()),
            None => Err(()),
        }
    }
}

/// The allocator of the preloaded library: talc, with zeroed blocks of several pages made
/// without touching their pages.
pub struct PagerAlloc(talc::TalcLock<spinning_top::RawSpinlock, Reserve>);

/// A new allocator (used as the global allocator of the preloaded library).
pub const fn new() -> PagerAlloc {
    PagerAlloc(talc::TalcLock::new(Reserve::new()))
}

/// Zeroed blocks from this size on have their whole pages discarded instead of written.
const DISCARD_FROM: usize = 4 * crate::PAGE;

// SAFETY: every method hands the call to talc's, which upholds GlobalAlloc's contract;
// `alloc_zeroed` then only zeroes the block it got, by writing its partial pages and
// discarding its whole ones (which then read as zeros).
unsafe impl std::alloc::GlobalAlloc for PagerAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract.
        note(unsafe { self.0.alloc(layout) }, layout.size())
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract.
        unsafe { self.0.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract.
        note(unsafe { self.0.realloc(ptr, layout, new_size) }, new_size)
    }

    /// A zeroed block. Writing zeros over a large block would make all of its pages
    /// resident — memory the pager takes from the program's budget whether it is used or not
    /// (a span client's per-slot buffers are 40 MiB): its whole pages are discarded instead
    /// (MADV_DONTNEED on the pager's own private mapping, never registered with the
    /// userfaultfd: they read as zeros and cost nothing until written), and only the partial
    /// pages at its ends are written.
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract.
        let p = note(unsafe { self.0.alloc(layout) }, layout.size());
        if p.is_null() {
            return p;
        }
        let (start, len) = (p as usize, layout.size());
        let first = start.next_multiple_of(crate::PAGE);
        let last = (start + len) / crate::PAGE * crate::PAGE;
        // SAFETY: `[first, last)` lies inside the block just allocated, which is ours alone.
        let discarded = len >= DISCARD_FROM
            && last > first
            && unsafe {
                libc::syscall(libc::SYS_madvise, first, last - first, libc::MADV_DONTNEED)
            } == 0;
        // SAFETY: the writes stay inside the block: all of it, or the parts outside
        // `[first, last)` when those pages were discarded.
        unsafe {
            if discarded {
                std::ptr::write_bytes(p, 0, first - start);
                std::ptr::write_bytes(last as *mut u8, 0, start + len - last);
            } else {
                std::ptr::write_bytes(p, 0, len);
            }
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use std::alloc::{GlobalAlloc, Layout};

    #[test]
    fn zeroed_blocks_read_as_zeros_over_reused_memory() {
        let heap = super::new();
        for size in [100, 4096, 5 * 4096 + 123, 1 << 20] {
            let layout = Layout::from_size_align(size, 16).unwrap();
            // SAFETY: non-zero layouts; each block is written within its size and freed once.
            unsafe {
                let dirty = heap.alloc(layout);
                std::ptr::write_bytes(dirty, 0xa5, size);
                heap.dealloc(dirty, layout);
                let p = heap.alloc_zeroed(layout);
                assert!(!p.is_null());
                let bytes = std::slice::from_raw_parts(p, size);
                assert!(
                    bytes.iter().all(|&b| b == 0),
                    "{size}-byte block not zeroed"
                );
                heap.dealloc(p, layout);
            }
        }
        // What the heap counts as resident: a written block, not a zeroed one. (In this test
        // binary only the heaps the tests make are counted; this is the only one.)
        let mut buf = Vec::new();
        let before = super::resident(&mut buf);
        let mib = Layout::from_size_align(8 << 20, 4096).unwrap();
        // SAFETY: non-zero layouts; the blocks are written within their sizes and freed once.
        unsafe {
            let zeroed = heap.alloc_zeroed(mib);
            let after_zeroed = super::resident(&mut buf);
            assert!(
                after_zeroed < before + (1 << 20),
                "a zeroed block costs nothing: {before} → {after_zeroed}"
            );
            let written = heap.alloc(mib);
            std::ptr::write_bytes(written, 1, 8 << 20);
            let after = super::resident(&mut buf);
            assert!(
                after >= after_zeroed + (8 << 20),
                "a written block is resident: {after_zeroed} → {after}"
            );
            heap.dealloc(written, mib);
            heap.dealloc(zeroed, mib);
        }
    }
}
