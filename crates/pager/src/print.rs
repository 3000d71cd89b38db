//! Fingerprints of page bytes: how the pager knows that a page it mapped writable is still
//! clean, without a write-protect fault on the program's first write.
//!
//! A page mapped from bytes its slot in the cluster holds (fetched, read ahead, or back from
//! standby while clean) is mapped writable, with the fingerprint of those bytes; when the
//! evictor takes the page out it fingerprints its copy, and the page is clean — its slot
//! already holds it, nothing to write — only if the two are equal. Equal bytes are clean
//! whatever happened between (a counter raised and lowered again counts as no write at all).
//!
//! Invariant: a fingerprint is 128 bits of XXH3 keyed with a seed drawn when the process
//! starts, so a page that changed is taken for clean with probability 2⁻¹²⁸ per eviction,
//! and no input made without the seed — which never leaves the process — does better. (A
//! program able to read the pager's memory can corrupt its own pages anyway.) XXH3 is used
//! because it fingerprints a page in a fraction of a microsecond; a write-protect fault,
//! which this replaces, costs the program 10–20 µs.

use std::sync::OnceLock;

use crate::PAGE;

/// The fingerprint of one page's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Print([u64; 2]);

impl Print {
    /// The fingerprint of `page`.
    pub fn of(page: &[u8; PAGE]) -> Print {
        let h = xxhash_rust::xxh3::xxh3_128_with_seed(page, seed());
        // Two words, not a u128: entries stay 8-byte aligned, and smaller.
        Print([h as u64, (h >> 64) as u64])
    }

    /// A fingerprint standing for a page that holds `x` (for models whose pages are values).
    #[cfg(test)]
    pub fn of_value(x: u64) -> Print {
        Print([x, !x])
    }
}

/// The process's key, drawn on first use.
fn seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| {
        let mut b = [0u8; 8];
        // SAFETY: `b` is a valid buffer of its length for the call.
        let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
        if n != 8 {
            // No entropy source: the clock still keys it per process, unknown to any input.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            b = (t.as_nanos() as u64 ^ u64::from(std::process::id())).to_le_bytes();
        }
        u64::from_le_bytes(b)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_bytes_equal_prints_and_any_changed_byte_changes_it() {
        let mut page = [7u8; PAGE];
        let p = Print::of(&page);
        assert_eq!(Print::of(&page), p);
        for i in [0, 1, 2047, PAGE - 1] {
            page[i] ^= 1;
            assert_ne!(Print::of(&page), p, "byte {i} changed");
            page[i] ^= 1;
        }
        assert_eq!(Print::of(&page), p, "changed back: clean again");
    }
}
