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
    /// `MADV_POPULATE_WRITE` (Linux 5.14) and falls back to touching one byte per page.
    pub fn populate(&mut self) {
        const MADV_POPULATE_WRITE: libc::c_int = 23;
        // SAFETY: the range is exactly this live mapping; the advice only faults pages in.
        let r = unsafe { libc::madvise(self.ptr.as_ptr().cast(), self.len, MADV_POPULATE_WRITE) };
        if r == 0 {
            return;
        }
        let page = 4096;
        for off in (0..self.len).step_by(page) {
            // SAFETY: `off < len`, inside the live mapping; writing a zero over a zero page
            // keeps the contents and makes the kernel back the page; `&mut self` makes this
            // the only access.
            unsafe { std::ptr::write_volatile(self.ptr.as_ptr().add(off), 0) };
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

    /// Copies `out.len()` bytes from `offset`; `None` when out of range.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Option<()> {
        let off = self.check(offset, out.len())?;
        // SAFETY: `off + out.len() <= self.len` was checked, the mapping is live while `self`
        // is, and `out` cannot overlap the private mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), out.as_mut_ptr(), out.len())
        };
        Some(())
    }

    /// Copies `data` to `offset`; `None` when out of range.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Option<()> {
        let off = self.check(offset, data.len())?;
        // SAFETY: bounds checked as in `read`; `&mut self` excludes every other access to the
        // mapping for the duration of the copy.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(off), data.len())
        };
        Some(())
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
}
