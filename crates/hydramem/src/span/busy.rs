//! Pages being moved: no compaction copy of a page outranks a write of it.
//!
//! A compaction reads a page where the map says it is and writes a copy into a new row. If a
//! write replaced the page meanwhile, the live map keeps the write
//! ([`super::map::PageMap::move_if`]) — but a client that reattaches takes the row with the
//! newest version naming a page ([`super::reattach`]), so a copy of the old bytes must never
//! carry a newer version than the write. The rule here: a compaction copies only pages no
//! write is moving, a write *steals* the pages a compaction is about to copy (it never waits),
//! and the compaction fixes its rows' version at a *commit* under the same lock, dropping the
//! stolen pages: every write that could race a committed copy takes its version after the
//! commit, so after the copy's.
//!
//! Invariant: a page a compaction commits was moved by no write between the compaction's
//! look-up of it and the commit, and every write that starts after the commit gets a version
//! above the compaction's.

use std::collections::{HashMap, HashSet};

use parking_lot::Mutex;

#[derive(Default)]
struct State {
    /// Pages being written, with how many writes move each.
    writing: HashMap<u64, u32>,
    /// Pages a compaction holds (not yet committed).
    compacting: HashSet<u64>,
    /// Of those, the pages a write took since.
    stolen: HashSet<u64>,
}

/// The pages being moved by writes and by the compaction.
#[derive(Default)]
pub struct Busy {
    state: Mutex<State>,
}

/// A write's pages, moving until dropped.
pub struct Writing<'a> {
    busy: &'a Busy,
    pages: Vec<u64>,
}

/// A compaction's pages, held until committed or dropped.
pub struct Compacting<'a> {
    busy: &'a Busy,
    pages: HashSet<u64>,
}

impl Busy {
    /// A write starts moving `pages`: a compaction will not copy them, and those it holds
    /// uncommitted are taken from it.
    pub fn begin_write(&self, pages: Vec<u64>) -> Writing<'_> {
        let mut s = self.state.lock();
        for p in &pages {
            *s.writing.entry(*p).or_insert(0) += 1;
            if s.compacting.contains(p) {
                s.stolen.insert(*p);
            }
        }
        Writing { busy: self, pages }
    }

    /// A compaction holds those of `pages` that no write moves and no other compaction holds.
    pub fn begin_compaction(&self, pages: impl Iterator<Item = u64>) -> Compacting<'_> {
        let mut s = self.state.lock();
        let mut got = HashSet::new();
        for p in pages {
            if !s.writing.contains_key(&p) && s.compacting.insert(p) {
                got.insert(p);
            }
        }
        Compacting {
            busy: self,
            pages: got,
        }
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let mut s = self.busy.state.lock();
        for p in &self.pages {
            if let Some(n) = s.writing.get_mut(p) {
                *n -= 1;
                if *n == 0 {
                    s.writing.remove(p);
                }
            }
        }
    }
}

impl Compacting<'_> {
    /// Whether `page` is held here (and not stolen yet).
    pub fn holds(&self, page: u64) -> bool {
        self.pages.contains(&page)
    }

    /// Commits: runs `take` (which takes the version the copies are written with) under the
    /// lock writes steal under, and returns its result with the pages no write stole. The
    /// pages are released: a write that comes after takes a newer version than `take` did.
    pub fn commit<T>(mut self, take: impl FnOnce() -> T) -> (T, HashSet<u64>) {
        let mut s = self.busy.state.lock();
        let t = take();
        for p in &self.pages {
            s.compacting.remove(p);
        }
        let stolen = std::mem::take(&mut s.stolen);
        let (mine, others): (HashSet<u64>, HashSet<u64>) =
            stolen.into_iter().partition(|p| self.pages.contains(p));
        s.stolen = others;
        drop(s);
        let mut kept = std::mem::take(&mut self.pages);
        kept.retain(|p| !mine.contains(p));
        (t, kept)
    }
}

impl Drop for Compacting<'_> {
    fn drop(&mut self) {
        let mut s = self.busy.state.lock();
        for p in &self.pages {
            s.compacting.remove(p);
            s.stolen.remove(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_never_wait_and_take_pages_from_an_uncommitted_compaction() {
        let b = Busy::default();
        let w = b.begin_write(vec![1, 2]);
        let c = b.begin_compaction([2, 3, 4, 5].into_iter());
        assert!(
            c.holds(3) && c.holds(4) && !c.holds(2),
            "pages being written are skipped"
        );
        // A write of a held page goes ahead and takes it from the compaction.
        let w2 = b.begin_write(vec![4]);
        let (version, kept) = c.commit(|| 7);
        assert_eq!(version, 7);
        assert_eq!(kept, HashSet::from([3, 5]));
        // Committed pages are free again: the next compaction may hold them, and a write of
        // one now goes after the commit.
        let c2 = b.begin_compaction([3, 4].into_iter());
        assert!(c2.holds(3) && !c2.holds(4), "page 4 is still being written");
        drop((w, w2, c2));
        let s = b.state.lock();
        assert!(s.writing.is_empty() && s.compacting.is_empty() && s.stolen.is_empty());
    }

    #[test]
    fn a_compaction_dropped_uncommitted_leaves_nothing_behind() {
        let b = Busy::default();
        let c = b.begin_compaction([1, 2].into_iter());
        let w = b.begin_write(vec![2]);
        drop(c);
        drop(w);
        let s = b.state.lock();
        assert!(s.writing.is_empty() && s.compacting.is_empty() && s.stolen.is_empty());
    }
}
