//! The pager's own heap. Everything the pager allocates (the client, its buffers, its page
//! table) comes from one region it reserves for itself and records in `exclude`, never from
//! the program's allocator: pages of the program's heap may be out in the cluster, and the
//! thread that would fetch them must not fault on them itself.
//!
//! The allocator is talc (a general-purpose allocator that works on memory it is given)
//! behind a spin lock: only the pager's few threads allocate here, and a lock that parks
//! would itself allocate. The region is reserved once, without backing (MAP_NORESERVE):
//! only the pages the pager touches cost memory.

use std::alloc::Layout;
use std::sync::atomic::{AtomicUsize, Ordering};

use talc::base::binning::Binning;
use talc::base::Talc;
use talc::source::Source;

/// Address space reserved for the pager's heap (only touched pages cost memory).
const RESERVE: usize = 64 << 30;

/// Where the heap region is (0 before the first allocation).
static BASE: AtomicUsize = AtomicUsize::new(0);

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

/// The allocator of the preloaded library.
pub type PagerAlloc = talc::TalcLock<spinning_top::RawSpinlock, Reserve>;

/// A new allocator (used as the global allocator of the preloaded library).
pub const fn new() -> PagerAlloc {
    talc::TalcLock::new(Reserve::new())
}
