//! The page map of span coding: for every page of the address space, the row and position
//! that hold it and the version its row was written with (16 bytes a page: 0.4% of the
//! memory it maps), or nothing for a page never written. Entries live in chunks of
//! [`CHUNK`] pages made on the first write into them, so a client costs memory for the part
//! of its address space it wrote, not for all of it (8 GiB of address space would be 32 MiB
//! of map up front, in the memory of the process it serves: `hydramem run` counts it against
//! the program's budget).
//!
//! Invariants:
//! - an entry and its version change together: readers and writers of an entry hold its
//!   stripe's lock (one of [`STRIPES`]), so a reader never sees a row with another row's
//!   version;
//! - a write moves a page unconditionally ([`PageMap::set`]: no two writes of one page are in
//!   flight together, `super::gather`), and the map is updated before the write returns, so
//!   a write that starts after another returned replaces it; a
//!   compaction moves a page only if it is still where the compaction read it
//!   ([`PageMap::move_if`]), so it can never bring back bytes a write replaced meanwhile;
//! - a forgotten page ([`PageMap::clear`]) is as if never written: a compaction that read it
//!   finds it gone and drops its copy.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use parking_lot::Mutex;

/// Lock stripes: enough that threads writing different pages seldom share one.
const STRIPES: usize = 1024;
/// Pages per chunk of entries (64 KiB of map for 16 MiB of pages).
pub const CHUNK: u64 = 4096;

type Entry = [AtomicU64; 2];

/// Where a page lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    /// Its row.
    pub row: u64,
    /// Its position in the row (0..k).
    pub pos: usize,
    /// The version its row was written with: the version its piece must carry.
    pub version: u64,
}

/// Page → [`Loc`] for an address space of a fixed number of pages.
pub struct PageMap {
    /// Per page, in chunks of [`CHUNK`] made on first write: (row + 1) << 5 | position
    /// (0: never written), then the version.
    chunks: Box<[OnceLock<Box<[Entry]>>]>,
    pages: u64,
    stripes: Box<[Mutex<()>]>,
}

/// Positions fit 5 bits: a row has at most 32 pieces.
const POS_BITS: u32 = 5;

impl PageMap {
    /// A map of `pages` pages, none written.
    pub fn new(pages: u64) -> PageMap {
        let n = usize::try_from(pages.div_ceil(CHUNK)).expect("a page count that fits memory");
        PageMap {
            chunks: (0..n).map(|_| OnceLock::new()).collect(),
            pages,
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }

    /// Pages in the map.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// Chunks of entries made so far (each [`CHUNK`] pages).
    #[cfg(test)]
    fn chunks_made(&self) -> usize {
        self.chunks.iter().filter(|c| c.get().is_some()).count()
    }

    fn entry(&self, page: u64) -> Option<&Entry> {
        let chunk = self.chunks[(page / CHUNK) as usize].get()?;
        Some(&chunk[(page % CHUNK) as usize])
    }

    fn stripe(&self, page: u64) -> &Mutex<()> {
        &self.stripes[(page % STRIPES as u64) as usize]
    }

    fn load(&self, page: u64) -> Option<Loc> {
        let e = self.entry(page)?;
        let word = e[0].load(Ordering::Relaxed);
        (word != 0).then(|| Loc {
            row: (word >> POS_BITS) - 1,
            pos: (word & ((1 << POS_BITS) - 1)) as usize,
            version: e[1].load(Ordering::Relaxed),
        })
    }

    fn store(&self, page: u64, loc: Loc) {
        let chunk = self.chunks[(page / CHUNK) as usize].get_or_init(|| {
            (0..CHUNK)
                .map(|_| [AtomicU64::new(0), AtomicU64::new(0)])
                .collect()
        });
        let e = &chunk[(page % CHUNK) as usize];
        e[0].store(
            (loc.row + 1) << POS_BITS | loc.pos as u64,
            Ordering::Relaxed,
        );
        e[1].store(loc.version, Ordering::Relaxed);
    }

    /// Where page `page` lives, if it was ever written. `page` must be below [`Self::pages`].
    pub fn get(&self, page: u64) -> Option<Loc> {
        let _g = self.stripe(page).lock();
        self.load(page)
    }

    /// Points page `page` at `loc`; returns where it was.
    pub fn set(&self, page: u64, loc: Loc) -> Option<Loc> {
        debug_assert!(loc.pos < 1 << POS_BITS);
        let _g = self.stripe(page).lock();
        let old = self.load(page);
        self.store(page, loc);
        old
    }

    /// Forgets where page `page` lives (as if never written); returns where it was.
    pub fn clear(&self, page: u64) -> Option<Loc> {
        // A chunk never made holds nothing to clear: no lock (a remount forgets every free
        // page of the address space, most of them never written).
        let e = self.entry(page)?;
        let _g = self.stripe(page).lock();
        let old = self.load(page)?;
        e[0].store(0, Ordering::Relaxed);
        e[1].store(0, Ordering::Relaxed);
        Some(old)
    }

    /// Points page `page` at `loc` only if it is still at `expected`; returns whether it did.
    pub fn move_if(&self, page: u64, expected: Loc, loc: Loc) -> bool {
        let _g = self.stripe(page).lock();
        if self.load(page) != Some(expected) {
            return false;
        }
        self.store(page, loc);
        true
    }

    /// Calls `f` with every written page and its location (each entry read under its lock;
    /// the map may change between entries).
    pub fn for_each(&self, mut f: impl FnMut(u64, Loc)) {
        self.for_each_in(|_| Some(()), |(), page, loc| f(page, loc));
    }

    /// Calls `f` with every written page whose row `want` picks (`want(row)` is `Some`), what
    /// `want` said and the page's location. The row is first read without the entry's lock,
    /// so a page whose row is not wanted costs one load and no lock — compaction scans the
    /// whole map for the pages of a few rows, and a lock per page was a third of its thread's
    /// CPU. A wanted page is read again under its lock (its row and version together), and
    /// given only if its row is still wanted.
    pub fn for_each_in<T>(&self, want: impl Fn(u64) -> Option<T>, mut f: impl FnMut(T, u64, Loc)) {
        for (c, chunk) in self.chunks.iter().enumerate() {
            let Some(entries) = chunk.get() else {
                continue;
            };
            let first = c as u64 * CHUNK;
            for (page, e) in (first..self.pages).zip(entries.iter()) {
                let word = e[0].load(Ordering::Relaxed);
                if word == 0 || want((word >> POS_BITS) - 1).is_none() {
                    continue;
                }
                if let Some(loc) = self.get(page) {
                    if let Some(t) = want(loc.row) {
                        f(t, page, loc);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn for_each_in_gives_the_pages_of_the_wanted_rows_only() {
        let m = PageMap::new(3 * CHUNK);
        for (page, row) in [(0, 5), (1, 6), (CHUNK + 3, 5), (2 * CHUNK + 9, 7)] {
            m.set(
                page,
                Loc {
                    row,
                    pos: 1,
                    version: row * 10,
                },
            );
        }
        m.clear(1);
        let mut got = Vec::new();
        m.for_each_in(
            |row| (row == 5 || row == 6).then_some(row * 100),
            |t, page, loc| got.push((t, page, loc.row, loc.version)),
        );
        assert_eq!(got, vec![(500, 0, 5, 50), (500, CHUNK + 3, 5, 50)]);
        // The last entry of a chunk, and of a last chunk that the map's end cuts short.
        let m = PageMap::new(2 * CHUNK + 10);
        for page in [CHUNK - 1, 2 * CHUNK + 9] {
            m.set(
                page,
                Loc {
                    row: 3,
                    pos: 0,
                    version: 1,
                },
            );
        }
        let mut got = Vec::new();
        m.for_each_in(|row| (row == 3).then_some(()), |(), page, _| got.push(page));
        assert_eq!(got, vec![CHUNK - 1, 2 * CHUNK + 9]);
    }

    #[test]
    fn chunks_are_made_only_where_pages_are_written() {
        let m = PageMap::new(8 << 18); // 8 GiB of pages
        assert_eq!(m.chunks_made(), 0);
        let loc = Loc {
            row: 1,
            pos: 2,
            version: 3,
        };
        assert_eq!(m.get(CHUNK * 100 + 5), None);
        assert_eq!(m.chunks_made(), 0, "a read makes no chunk");
        m.set(CHUNK * 100 + 5, loc);
        m.set(m.pages() - 1, loc);
        assert_eq!(m.chunks_made(), 2);
        assert_eq!(m.get(CHUNK * 100 + 5), Some(loc));
        assert_eq!(m.get(CHUNK * 100 + 6), None);
        let mut seen = Vec::new();
        m.for_each(|p, l| seen.push((p, l)));
        assert_eq!(seen, vec![(CHUNK * 100 + 5, loc), (m.pages() - 1, loc)]);
    }

    #[test]
    fn entries_read_back_and_move_only_from_where_expected() {
        let m = PageMap::new(10);
        assert_eq!(m.get(3), None);
        let a = Loc {
            row: 0,
            pos: 0,
            version: 5,
        };
        let b = Loc {
            row: (1 << 40) + 7,
            pos: 31,
            version: u64::MAX >> 1,
        };
        assert_eq!(m.set(3, a), None);
        assert_eq!(m.get(3), Some(a));
        assert!(!m.move_if(3, b, a), "not where expected: unchanged");
        assert!(m.move_if(3, a, b));
        assert_eq!(m.get(3), Some(b));
        assert_eq!(m.set(3, a), Some(b));
        let mut seen = Vec::new();
        m.for_each(|p, l| seen.push((p, l)));
        assert_eq!(seen, vec![(3, a)]);
    }
}
