//! The standby pool: pages the evictor took out of the program's memory but has not sent to
//! the cluster yet. The clock sees a page's faults, never its reads or writes (user space
//! cannot read the accessed bits), so a page that is only read looks cold however hot it is.
//! Taking a page out first to standby, and sending it out only once it has waited there
//! while the pool turned over, lets its reads be seen: a touch faults, and the fault is
//! answered from the pool in a copy, not a round trip, and gives the page its second chance.
//! The pages sent out are the oldest in standby: those the program did not touch for a whole
//! turn of the pool (the second segment of a segmented FIFO, as VMS's standby list).
//!
//! Invariants: a buffer is written only by the evictor, between reserving it
//! (`Table::take_bufs`, when no entry names it) and committing the page into it; it is read
//! only while an entry names it (by the fault thread, under the table's lock, or by the
//! evictor sending it out, while faults on the page wait). So no buffer is read and written
//! at once.

use std::alloc::Layout;
use std::ptr::NonNull;

use crate::PAGE;

/// The pool's buffers: `len` pages, allocated from the pager's heap when the pager starts
/// (once the program passes half its budget: a program that stays small never costs the
/// pool's memory) and touched at once. Touched as they were first used instead, moving a page
/// into a buffer would cost as much memory as it frees, and the program ran a pool's worth
/// over its budget while the pool filled (75 MiB against 64 in the README's example).
pub struct Pool {
    base: Option<NonNull<u8>>,
    len: u32,
}

// SAFETY: the pool is plain memory; which thread may read or write a buffer is the table's
// protocol above, kept under the table's lock.
unsafe impl Send for Pool {}
// SAFETY: as for Send.
unsafe impl Sync for Pool {}

impl Pool {
    /// A pool of `len` page buffers (none if the allocation fails: said, and the evictor then
    /// has no buffers and sends nothing out).
    pub fn new(len: u32) -> Pool {
        let base = Self::layout(len).and_then(|l| {
            if l.size() == 0 {
                return None;
            }
            // SAFETY: a layout of non-zero size; the memory is only ever accessed through
            // raw pointers.
            let p = NonNull::new(unsafe { std::alloc::alloc(l) })?;
            // SAFETY: the block just allocated, ours alone. Written, not `alloc_zeroed`: the
            // pager's heap gives zeroed blocks by discarding their pages, untouched.
            unsafe { std::ptr::write_bytes(p.as_ptr(), 0, l.size()) };
            Some(p)
        });
        if base.is_none() && len > 0 {
            tracing::error!("cannot allocate the standby pool of {len} pages");
        }
        Pool {
            base,
            len: if base.is_some() { len } else { 0 },
        }
    }

    fn layout(len: u32) -> Option<Layout> {
        Layout::from_size_align(len as usize * PAGE, PAGE).ok()
    }

    /// Buffers in the pool.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether the pool has no buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where buffer `buf` is, for the kernel to write (process_vm_readv). Panics if `buf` is
    /// not a buffer of the pool.
    pub fn ptr(&self, buf: u32) -> *mut u8 {
        assert!(buf < self.len, "standby buffer {buf} of {}", self.len);
        let base = self.base.expect("a pool with buffers has memory");
        // SAFETY: `buf < len`, so the offset is inside the allocation.
        unsafe { base.as_ptr().add(buf as usize * PAGE) }
    }

    /// The bytes of buffer `buf`.
    ///
    /// # Safety
    /// An entry of the table names `buf` (so it was written), and the caller holds what
    /// keeps the evictor from reserving it again while the reference lives (the table's lock,
    /// or, for the evictor, being the only thread that reserves).
    pub unsafe fn page(&self, buf: u32) -> &[u8; PAGE] {
        // SAFETY: in bounds (`ptr`), initialized and not written meanwhile (the contract).
        unsafe { &*self.ptr(buf).cast::<[u8; PAGE]>() }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let (Some(base), Some(l)) = (self.base, Self::layout(self.len)) {
            // SAFETY: allocated in `new` with this layout.
            unsafe { std::alloc::dealloc(base.as_ptr(), l) };
        }
    }
}
