//! Slab memory: one anonymous private mapping per slab.
//!
//! Invariants: a [`SlabMemory`] is exactly `len` bytes of zero-filled memory when created (the
//! kernel hands out zero pages for a fresh anonymous mapping, so no client ever sees another
//! client's bytes and nothing is resident until it is written); it is unmapped exactly once, on
//! drop. All access goes through [`SlabMemory::read`] (`&self`) and [`SlabMemory::write`]
//! (`&mut self`), which check bounds: the borrow rules make writers exclusive, so no safe code
//! can race a write against anything (the node keeps a slab's mappings behind one `RwLock`).
//! The type is private to the node module.

use std::io;
use std::ptr::NonNull;

/// `madvise` advice that backs pages writable without writing them (Linux 5.14; older kernels
/// refuse it and the callers fall back or do without).
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// A zero-filled, lazily backed region of `len` bytes.
pub(super) struct SlabMemory {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; it has no thread affinity, and the
// node serializes conflicting accesses with a per-slab lock.
unsafe impl Send for SlabMemory {}
// SAFETY: a shared reference only reaches the memory through `read` and `len`, which do not
// write; every write (`write`, `populate`) takes `&mut self`, so shared access is read-only.
unsafe impl Sync for SlabMemory {}

/// The stretch [`SlabMemory::populate`] backs at a time: one transparent huge page, a few
/// hundred microseconds of page faults.
pub const POPULATE_STEP: usize = 2 << 20;

impl SlabMemory {
    /// Maps `len` bytes. `MAP_NORESERVE` because a node donates memory it measures itself; the
    /// kernel should not refuse the mapping on overcommit accounting.
    pub fn new(len: usize) -> io::Result<SlabMemory> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "slab size 0"));
        }
        // SAFETY: an anonymous private mapping with no address hint touches no existing memory;
        // the result is checked for MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(io::Error::last_os_error)?;
        Ok(SlabMemory { ptr, len })
    }

    /// Backs every page with memory now (zero-filled), so that first writes do not fault and
    /// the machine's free memory reflects what the node has claimed. Uses
    /// `MADV_POPULATE_WRITE` (Linux 5.14) and falls back to touching one byte per page. Works
    /// in stretches of [`POPULATE_STEP`], yielding the CPU after each: backing a 64 MiB slab
    /// takes milliseconds of page faults in one system call, during which a kernel without
    /// preemption lets no other thread of that core run — measured on two cores, an
    /// application's reads beside the nodes waited up to 12 ms to be scheduled, even with the
    /// populating thread at nice 19.
    pub fn populate(&mut self) {
        for at in (0..self.len).step_by(POPULATE_STEP) {
            let len = POPULATE_STEP.min(self.len - at);
            // SAFETY: `[at, at + len)` lies inside this live mapping; the advice only faults
            // pages in.
            let r = unsafe {
                libc::madvise(self.ptr.as_ptr().add(at).cast(), len, MADV_POPULATE_WRITE)
            };
            if r != 0 {
                let page = 4096;
                for off in (at..at + len).step_by(page) {
                    // SAFETY: `off < len`, inside the live mapping; writing a zero over a zero
                    // page keeps the contents and makes the kernel back the page; `&mut self`
                    // makes this the only access.
                    unsafe { std::ptr::write_volatile(self.ptr.as_ptr().add(off), 0) };
                }
            }
            std::thread::yield_now();
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    fn check(&self, offset: u64, len: usize) -> Option<usize> {
        let off = usize::try_from(offset).ok()?;
        let end = off.checked_add(len)?;
        (end <= self.len).then_some(off)
    }

    /// The `len` bytes at `offset`; `None` when out of range.
    pub fn bytes(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let off = self.check(offset, len)?;
        // SAFETY: `off + len <= self.len` was checked and the mapping is live (and initialized:
        // anonymous memory reads as zeros) for as long as `self` is borrowed; every write takes
        // `&mut self`, so nothing writes these bytes while the shared slice exists.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off), len) })
    }

    /// The `len` bytes at `offset`, writable; `None` when out of range.
    pub fn bytes_mut(&mut self, offset: u64, len: usize) -> Option<&mut [u8]> {
        let off = self.check(offset, len)?;
        // SAFETY: bounds checked as in `bytes`; `&mut self` excludes every other access to the
        // mapping for as long as the slice lives.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(off), len) })
    }

    /// Copies `out.len()` bytes from `offset`; `None` when out of range.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Option<()> {
        out.copy_from_slice(self.bytes(offset, out.len())?);
        Some(())
    }

    /// Copies `data` to `offset`; `None` when out of range.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Option<()> {
        self.bytes_mut(offset, data.len())?.copy_from_slice(data);
        Some(())
    }

    /// Makes the `len` bytes at `offset` read as zeros again and gives back the memory of
    /// the whole pages among them (`MADV_DONTNEED`: a private anonymous page is then a fresh
    /// zero page until written); the partial pages at either end are zeroed in place.
    /// `None` when out of range.
    pub fn discard(&mut self, offset: u64, len: usize) -> Option<()> {
        let off = self.check(offset, len)?;
        let page = 4096usize;
        let end = off + len;
        let (lo, hi) = (off.next_multiple_of(page).min(end), end / page * page);
        if hi > lo {
            self.bytes_mut(off as u64, lo - off)?.fill(0);
            self.bytes_mut(hi as u64, end - hi)?.fill(0);
            // SAFETY: `[lo, hi)` is page aligned and inside this live mapping (checked above);
            // `&mut self` excludes every other access to it while the advice runs, and
            // MADV_DONTNEED on a private anonymous mapping only replaces its pages with zero
            // pages, which is what the bytes must read as.
            let r = unsafe {
                libc::madvise(
                    self.ptr.as_ptr().add(lo).cast(),
                    hi - lo,
                    libc::MADV_DONTNEED,
                )
            };
            if r != 0 {
                self.bytes_mut(lo as u64, hi - lo)?.fill(0);
            }
        } else {
            self.bytes_mut(off as u64, len)?.fill(0);
        }
        Some(())
    }

    /// Advice about this mapping that may be given without holding the lock that guards
    /// its bytes (see [`Advisor`]).
    pub fn advisor(&self) -> Advisor {
        Advisor {
            ptr: self.ptr,
            len: self.len,
        }
    }
}

/// Advice to the kernel about one slab mapping (prefaulting). It never changes a
/// byte of the mapping, so it needs no exclusion from readers or writers, and a regeneration
/// backs a slab's memory ahead of the thread filling it without taking the slab's lock. The
/// node keeps an advisor in the same slab as its mapping, so it is never used after the unmap
/// (and if it were, `madvise` on an unmapped range fails, and on a range mapped anew it would
/// still change no byte).
#[derive(Debug, Clone, Copy)]
pub(super) struct Advisor {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: an advisor is an address range handed to `madvise`, which never reads or writes
// the memory through it; sharing it between threads shares no data.
unsafe impl Send for Advisor {}
// SAFETY: as for `Send`: nothing is accessed through a shared advisor.
unsafe impl Sync for Advisor {}

impl Advisor {
    /// Backs the pages of `[offset, offset + len)` (clipped to the mapping) with memory now,
    /// so that a bulk fill of that range does not fault page by page. Contents are unchanged
    /// (a fresh page is zero, as the unbacked page read); best effort.
    pub fn prefault(&self, offset: u64, len: usize) {
        let page = 4096usize;
        let Some(start) = usize::try_from(offset).ok().filter(|o| *o < self.len) else {
            return;
        };
        let end = start.saturating_add(len).min(self.len);
        let start = start / page * page;
        if end <= start {
            return;
        }
        // SAFETY: `[start, end)` lies inside the slab's mapping; MADV_POPULATE_WRITE only
        // faults pages in without writing to them, so it changes no byte that a slice may be
        // reading or writing concurrently.
        unsafe {
            libc::madvise(
                self.ptr.as_ptr().add(start).cast(),
                end - start,
                MADV_POPULATE_WRITE,
            )
        };
    }
}

impl Drop for SlabMemory {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe exactly the mapping created in `new`, unmapped only here.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_memory_is_zero_and_bounds_are_checked() {
        let mut m = SlabMemory::new(8192).unwrap();
        let mut buf = [1u8; 100];
        m.read(8000, &mut buf).unwrap();
        assert!(buf.iter().all(|b| *b == 0));
        assert!(m.write(8100, &[0u8; 93]).is_none());
        assert!(m.read(u64::MAX, &mut buf).is_none());
        m.write(4000, &[7u8; 100]).unwrap();
        m.read(4000, &mut buf).unwrap();
        assert!(buf.iter().all(|b| *b == 7));
        assert!(SlabMemory::new(0).is_err());
    }

    #[test]
    fn populated_memory_is_still_zero() {
        let mut m = SlabMemory::new(64 << 10).unwrap();
        m.populate();
        let mut buf = vec![1u8; 64 << 10];
        m.read(0, &mut buf).unwrap();
        assert!(buf.iter().all(|b| *b == 0));
    }

    #[test]
    fn populating_in_steps_backs_every_page_up_to_a_partial_last_step() {
        let len = 2 * POPULATE_STEP + 3 * 4096;
        let mut m = SlabMemory::new(len).unwrap();
        let resident = |m: &SlabMemory| {
            let mut v = vec![0u8; len / 4096];
            // SAFETY: the range is exactly the live mapping, and `v` has a byte per page.
            let r = unsafe { libc::mincore(m.ptr.as_ptr().cast(), len, v.as_mut_ptr()) };
            assert_eq!(r, 0);
            v.iter().filter(|b| **b & 1 != 0).count()
        };
        assert_eq!(resident(&m), 0, "a fresh mapping is not backed");
        m.populate();
        assert_eq!(resident(&m), len / 4096, "every page is backed");
        assert!(m.bytes(0, len).unwrap().iter().all(|b| *b == 0));
    }

    #[test]
    fn advice_and_prefaulting_change_no_byte() {
        let mut m = SlabMemory::new(64 << 10).unwrap();
        m.write(5000, &[9; 10]).unwrap();
        let a = m.advisor();
        a.prefault(4000, 20 << 10);
        a.prefault(60 << 10, 1 << 30); // clipped to the mapping
        a.prefault(u64::MAX, 1);
        let b = m.bytes(0, 64 << 10).unwrap();
        assert_eq!(&b[5000..5010], &[9; 10]);
        assert_eq!(b.iter().filter(|x| **x != 0).count(), 10);
        assert!(m.bytes(60 << 10, 8 << 10).is_none());
    }
}
