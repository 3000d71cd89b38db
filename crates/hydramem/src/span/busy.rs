//! Pages being written: a write and a compaction never move the same page at once.
//!
//! A compaction reads a page where the map says it is and writes a copy into a new row; if a
//! write replaced the page meanwhile, the live map keeps the write ([`super::map::PageMap::move_if`]),
//! but the copy's row has the newer version — and a client that reattaches takes the newest
//! version naming a page ([`super::reattach`]). So a page is held by one mover at a time:
//! writes hold every page of their batch (waiting while compaction holds one), compaction
//! holds only pages no write holds (it skips the others: a write moves them anyway) and looks
//! them up after it holds them. A page's rows are then written one after another, each with a
//! newer version than the last.

use std::collections::HashSet;

use parking_lot::{Condvar, Mutex};

/// The pages held by a write or a compaction.
#[derive(Default)]
pub struct Busy {
    held: Mutex<HashSet<u64>>,
    freed: Condvar,
}

/// Pages held until dropped.
pub struct Held<'a> {
    busy: &'a Busy,
    pages: Vec<u64>,
}

impl Busy {
    /// Holds every page of `pages`, waiting while any is held by another.
    pub fn hold_all(&self, pages: &[u64]) -> Held<'_> {
        let mut held = self.held.lock();
        while pages.iter().any(|p| held.contains(p)) {
            self.freed.wait(&mut held);
        }
        held.extend(pages.iter().copied());
        Held {
            busy: self,
            pages: pages.to_vec(),
        }
    }

    /// Holds the pages of `pages` that nobody holds; returns them held.
    pub fn hold_free(&self, pages: impl Iterator<Item = u64>) -> Held<'_> {
        let mut held = self.held.lock();
        let mut got = Vec::new();
        for p in pages {
            if held.insert(p) {
                got.push(p);
            }
        }
        Held {
            busy: self,
            pages: got,
        }
    }
}

impl Held<'_> {
    /// Whether `page` is held here.
    pub fn holds(&self, page: u64) -> bool {
        self.pages.contains(&page)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut held = self.busy.held.lock();
        for p in &self.pages {
            held.remove(p);
        }
        drop(held);
        self.busy.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn compaction_skips_held_pages_and_a_write_waits_for_compactions() {
        let b = Busy::default();
        let w = b.hold_all(&[1, 2]);
        let c = b.hold_free([2, 3, 4].into_iter());
        assert!(c.holds(3) && c.holds(4) && !c.holds(2));
        drop(w);
        let waited = AtomicBool::new(false);
        std::thread::scope(|s| {
            let t = s.spawn(|| {
                let _w = b.hold_all(&[4, 5]);
                assert!(
                    waited.load(Ordering::SeqCst),
                    "held page 4 before compaction let go"
                );
            });
            // The writer cannot get page 4 until the compaction's hold ends.
            waited.store(true, Ordering::SeqCst);
            drop(c);
            t.join().unwrap();
        });
        assert!(b.held.lock().is_empty());
    }
}
