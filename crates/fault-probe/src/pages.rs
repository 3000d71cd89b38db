//! The probe's memory: anonymous 4 KiB pages, each filled with bytes derived from its index and
//! a seed. The bytes are pseudo-random, so a compressing swap device (zram) is measured on data
//! it cannot shrink to nothing, and different for every page, so a page that comes back from
//! the wrong place, or with another page's or stale bytes, is caught.
//!
//! Invariant: [`Region::holds`] is true for page `i` exactly when it holds the bytes
//! [`Region::push`] wrote there.

use std::hint::black_box;

/// Bytes in a page (the kernel's, on the machines this runs on).
pub const PAGE: usize = 4096;

/// One page, aligned as the kernel's pages are, so each is faulted in and out on its own.
#[derive(Clone)]
#[repr(C, align(4096))]
pub struct Page([u8; PAGE]);

/// The probe's pages, filled one by one.
pub struct Region {
    pages: Vec<Page>,
    seed: u64,
}

/// SplitMix64's step: a fast, well-mixed stream from any seed.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The bytes page `index` holds under `seed`.
fn contents(seed: u64, index: usize) -> Page {
    let mut state = seed ^ (index as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93);
    let mut page = Page([0; PAGE]);
    for word in page.0.chunks_exact_mut(8) {
        word.copy_from_slice(&splitmix(&mut state).to_le_bytes());
    }
    page
}

impl Region {
    /// An empty region with room for `pages` pages: the memory is reserved, not touched.
    pub fn with_capacity(pages: usize, seed: u64) -> Region {
        Region {
            pages: Vec::with_capacity(pages),
            seed,
        }
    }

    /// Pages written so far.
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    /// Writes the next page (the first touch of its memory: under a memory limit, the
    /// kernel makes room by pushing other pages out).
    pub fn push(&mut self) {
        let page = contents(self.seed, self.pages.len());
        self.pages.push(page);
    }

    /// Reads one byte of page `i`: the access that faults the page in if it is out.
    pub fn touch(&self, i: usize) -> u8 {
        black_box(self.pages[i].0[0])
    }

    /// Whether page `i` is resident (mapped, or in the swap cache) by mincore(2), or `None`
    /// when the kernel does not say. A page that is not will come in from the swap device or
    /// the pager on its next touch.
    pub fn resident(&self, i: usize) -> Option<bool> {
        let addr = self.pages[i].0.as_ptr();
        let mut v = 0u8;
        // SAFETY: `addr` is the start of page `i`, a live, page-aligned 4 KiB of this
        // process's memory (`Page` is aligned to 4096), and `v` has room for the one byte
        // mincore writes for one page.
        let rc = unsafe { libc::mincore(addr as *mut libc::c_void, PAGE, &mut v) };
        (rc == 0).then_some(v & 1 == 1)
    }

    /// Whether page `i` holds the bytes written to it.
    pub fn holds(&self, i: usize) -> bool {
        self.pages[i].0 == contents(self.seed, i).0
    }

    /// Overwrites page `i` with other bytes (for tests: a wrong page).
    #[cfg(test)]
    pub fn corrupt(&mut self, i: usize) {
        self.pages[i].0[100] ^= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_hold_what_was_written_and_differ() {
        let mut r = Region::with_capacity(64, 7);
        (0..64).for_each(|_| r.push());
        assert!((0..64).all(|i| r.holds(i)));
        assert_ne!(contents(7, 0).0, contents(7, 1).0);
        assert_ne!(contents(7, 0).0, contents(8, 0).0);
        let p = contents(7, 3);
        assert!(
            p.0.iter().filter(|&&b| b == 0).count() < 64,
            "not mostly zeros"
        );
    }

    #[test]
    fn a_changed_byte_is_caught() {
        let mut r = Region::with_capacity(4, 1);
        (0..4).for_each(|_| r.push());
        r.corrupt(2);
        assert!(!r.holds(2));
        assert!(r.holds(1) && r.holds(3));
    }

    #[test]
    fn pages_written_are_resident() {
        let mut r = Region::with_capacity(4, 1);
        (0..4).for_each(|_| r.push());
        assert_eq!(r.resident(0), Some(true));
        assert_eq!(r.resident(3), Some(true));
    }

    #[test]
    fn pages_are_page_aligned() {
        let mut r = Region::with_capacity(3, 1);
        (0..3).for_each(|_| r.push());
        let a = r.pages.as_ptr() as usize;
        assert_eq!(a % PAGE, 0);
    }
}
