//! A lock-free-read, insert-only cache of ISA-L decode tables keyed by loss
//! pattern.
//!
//! Decoding a page needs ISA-L tables built from the inverse of the `k x k`
//! generator submatrix of the present splits; building them costs a matrix
//! inversion plus table expansion (microseconds), while the coding itself
//! costs tens of nanoseconds. The same few loss patterns repeat for as long
//! as a memory node is down, so the tables are built once per pattern and
//! looked up afterwards.
//!
//! Structure: a fixed power-of-two array of 16-byte slots `(key, tables
//! pointer)` with linear probing. A lookup is a hash, one `Acquire` load of
//! the key and a load of the pointer beside it, so it never writes shared
//! memory (a read-locked map would bounce its lock word between cores on
//! every call) and the table pointer is one dependent load away from the
//! `Codec`. Inserts are rare (once per pattern) and serialised by a mutex
//! that also owns the table buffers.
//!
//! Invariants:
//! - key 0 means "empty"; real keys are never 0 (`k >= 1` data splits means
//!   the present mask is never empty);
//! - a slot is written once, under the mutex: pointer first, then the key
//!   with `Release`; it never changes again, so a reader that sees the key
//!   with `Acquire` also sees the pointer;
//! - the pointed-to tables are owned by `owned` and never freed or moved
//!   (a `Vec<Line>`'s heap buffer stays put when the `Vec` itself moves)
//!   until the cache is dropped, so a [`TablesRef`] tied to `&self` is valid;
//! - at most `max_entries` (3/4 of the slots) are filled, so probes reach an
//!   empty slot quickly; when full, callers use tables without caching them.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use parking_lot::Mutex;

/// The most slots a cache allocates (256 KiB of slots).
const MAX_SLOTS: usize = 16 * 1024;
/// The fewest slots a cache allocates.
const MIN_SLOTS: usize = 16;

/// One 64-byte-aligned chunk of table memory, so tables start on a cache
/// line whatever the allocator's default alignment.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Cache-line-aligned, heap-allocated storage for ISA-L coding tables.
///
/// A `Vec` rather than a `Box<[_]>` so that raw pointers into the buffer
/// stay valid when the owner is moved (a `Box` move asserts uniqueness).
pub(crate) struct Tables {
    lines: Vec<Line>,
}

impl Tables {
    /// Zeroed storage of at least `len` bytes.
    pub(crate) fn zeroed(len: usize) -> Tables {
        Tables {
            lines: vec![Line([0; 64]); len.div_ceil(64).max(1)],
        }
    }

    /// Pointer for ISA-L to write the tables through (`ec_init_tables`).
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.lines.as_mut_ptr().cast()
    }

    /// Pointer for ISA-L to read the tables through (`ec_encode_data`, which
    /// takes `*mut` but never writes the tables).
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.as_non_null().as_ptr()
    }

    fn as_non_null(&self) -> NonNull<u8> {
        NonNull::from(self.lines.as_slice()).cast()
    }
}

/// Borrowed cached tables: valid for as long as the cache is borrowed.
#[derive(Clone, Copy)]
pub(crate) struct TablesRef<'a> {
    ptr: NonNull<u8>,
    _cache: PhantomData<&'a Tables>,
}

impl TablesRef<'_> {
    /// Pointer for `ec_encode_data` (read only, despite the `*mut`).
    #[inline]
    pub(crate) fn as_ptr(self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

/// Packs a loss pattern into the cache key.
#[inline]
pub(crate) fn pattern_key(present_mask: u32, missing_mask: u32) -> u64 {
    (u64::from(present_mask) << 32) | u64::from(missing_mask)
}

/// One hash slot; 16 bytes so key and pointer share a cache line.
#[repr(C, align(16))]
struct Slot {
    /// 0 while empty.
    key: AtomicU64,
    /// Null while empty; written before `key`.
    tables: AtomicPtr<u8>,
}

/// The decode-table cache; see the module docs.
pub(crate) struct DecodeCache {
    slots: Box<[Slot]>,
    /// `slots.len() - 1` (the length is a power of two).
    mask: usize,
    max_entries: usize,
    /// Owns every cached table buffer; its lock serialises inserts.
    owned: Mutex<Vec<Tables>>,
}

impl DecodeCache {
    /// A cache sized for `patterns` distinct loss patterns (capped at
    /// [`MAX_SLOTS`] slots, 3/4 of which may be filled).
    pub(crate) fn with_patterns(patterns: usize) -> DecodeCache {
        let wanted = patterns.saturating_mul(4) / 3 + 1;
        let len = wanted.clamp(MIN_SLOTS, MAX_SLOTS).next_power_of_two();
        let slots: Box<[Slot]> = (0..len)
            .map(|_| Slot {
                key: AtomicU64::new(0),
                tables: AtomicPtr::new(std::ptr::null_mut()),
            })
            .collect();
        DecodeCache {
            slots,
            mask: len - 1,
            max_entries: len / 4 * 3,
            owned: Mutex::new(Vec::new()),
        }
    }

    /// Home slot of `key` (Fibonacci hashing: multiply, keep the top bits).
    #[inline]
    fn home(&self, key: u64) -> usize {
        let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        // The top 32 bits spread well and fit any `usize`; `mask` < 2^32.
        ((h >> 32) as usize) & self.mask
    }

    /// The tables for `key`, if cached. Never allocates, locks or writes.
    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<TablesRef<'_>> {
        let mut i = self.home(key);
        // Bounded for robustness; with at most 3/4 of the slots used an
        // empty slot ends the probe long before.
        for _ in 0..self.slots.len() {
            let slot = self.slots.get(i)?;
            let found = slot.key.load(Ordering::Acquire);
            if found == key {
                // Ordered after the pointer store by the Acquire above.
                let ptr = NonNull::new(slot.tables.load(Ordering::Relaxed))?;
                return Some(TablesRef {
                    ptr,
                    _cache: PhantomData,
                });
            }
            if found == 0 {
                return None;
            }
            i = (i + 1) & self.mask;
        }
        None
    }

    /// Caches `tables` under `key` and returns them, or returns the tables
    /// another thread cached first; hands `tables` back (`Err`) if the
    /// cache is full.
    pub(crate) fn insert(&self, key: u64, tables: Tables) -> Result<TablesRef<'_>, Tables> {
        let mut owned = self.owned.lock();
        if let Some(found) = self.get(key) {
            return Ok(found);
        }
        if key == 0 || owned.len() >= self.max_entries {
            return Err(tables);
        }
        let mut i = self.home(key);
        for _ in 0..self.slots.len() {
            let Some(slot) = self.slots.get(i) else { break };
            // Only inserters write slots and they hold the lock.
            if slot.key.load(Ordering::Relaxed) == 0 {
                let ptr = tables.as_non_null();
                owned.push(tables);
                slot.tables.store(ptr.as_ptr(), Ordering::Relaxed);
                slot.key.store(key, Ordering::Release);
                return Ok(TablesRef {
                    ptr,
                    _cache: PhantomData,
                });
            }
            i = (i + 1) & self.mask;
        }
        // Unreachable while fewer than all slots are used.
        Err(tables)
    }

    /// Number of cached patterns (for tests and diagnostics).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.owned.lock().len()
    }

    /// Most patterns this cache will hold.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.max_entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Tables whose first byte is `tag`.
    fn tables(tag: u8) -> Tables {
        let mut t = Tables::zeroed(8);
        // SAFETY: `t` holds at least 64 writable bytes.
        unsafe { t.as_mut_ptr().write(tag) };
        t
    }

    fn first_byte(t: TablesRef<'_>) -> u8 {
        // SAFETY: cached tables hold at least 64 initialised bytes and live
        // as long as the cache borrowed by `t`.
        unsafe { *t.as_ptr() }
    }

    #[test]
    fn tables_are_cache_line_aligned_and_sized() {
        for len in [1, 63, 64, 65, 32 * 8 * 2, 32 * 32 * 32] {
            let t = Tables::zeroed(len);
            assert_eq!(t.as_ptr() as usize % 64, 0);
            assert!(t.lines.len() * 64 >= len);
        }
    }

    #[test]
    fn get_after_insert_and_miss_before() {
        let c = DecodeCache::with_patterns(10);
        let k = pattern_key(0b11, 0b100);
        assert!(c.get(k).is_none());
        let stored = c.insert(k, tables(42)).ok().expect("room in the cache");
        assert_eq!(first_byte(stored), 42);
        let found = c.get(k).expect("cached");
        assert_eq!(found.as_ptr(), stored.as_ptr());
        assert!(c.get(pattern_key(0b11, 0b1000)).is_none());
    }

    #[test]
    fn duplicate_insert_returns_first_tables() {
        let c = DecodeCache::with_patterns(4);
        let k = pattern_key(1, 2);
        assert!(c.insert(k, tables(7)).is_ok());
        let again = c.insert(k, tables(9)).ok().expect("already cached");
        assert_eq!(first_byte(again), 7);
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn key_zero_is_never_cached() {
        let c = DecodeCache::with_patterns(4);
        assert!(c.insert(0, tables(1)).is_err());
        assert!(c.get(0).is_none());
    }

    #[test]
    fn fills_to_capacity_then_hands_tables_back() {
        let c = DecodeCache::with_patterns(1);
        let cap = c.capacity();
        assert_eq!(cap, MIN_SLOTS / 4 * 3);
        for i in 1..=cap as u64 {
            assert!(c.insert(i, tables(i as u8)).is_ok());
        }
        assert!(c.insert(1000, tables(0)).is_err());
        // Already-cached keys are still found when full.
        assert_eq!(c.insert(3, tables(0)).ok().map(first_byte), Some(3));
        for i in 1..=cap as u64 {
            assert_eq!(c.get(i).map(first_byte), Some(i as u8));
        }
        assert!(c.get(1000).is_none());
        assert_eq!(c.len(), cap);
    }

    #[test]
    fn slot_count_is_capped() {
        let c = DecodeCache::with_patterns(usize::MAX);
        assert_eq!(c.slots.len(), MAX_SLOTS);
        let c = DecodeCache::with_patterns(135);
        assert_eq!(c.slots.len(), 256);
    }

    #[test]
    fn tables_stay_put_while_the_owner_grows() {
        let c = DecodeCache::with_patterns(1000);
        let first = c.insert(1, tables(1)).ok().expect("room").as_ptr();
        for i in 2..=700u64 {
            assert!(c.insert(i, tables(i as u8)).is_ok());
        }
        assert_eq!(c.get(1).map(TablesRef::as_ptr), Some(first));
        assert_eq!(c.get(1).map(first_byte), Some(1));
    }

    #[test]
    fn concurrent_inserts_and_lookups_agree() {
        let c = Arc::new(DecodeCache::with_patterns(64));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let c = Arc::clone(&c);
                std::thread::spawn(move || {
                    for i in 1..=48u64 {
                        let k = pattern_key(i as u32, 1);
                        let got = match c.get(k) {
                            Some(found) => found,
                            None => c.insert(k, tables(i as u8)).ok().expect("room"),
                        };
                        assert_eq!(first_byte(got), i as u8, "thread {t}");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("inserting thread panicked");
        }
        assert_eq!(c.len(), 48);
        for i in 1..=48u64 {
            let k = pattern_key(i as u32, 1);
            assert_eq!(c.get(k).map(first_byte), Some(i as u8));
        }
    }
}
