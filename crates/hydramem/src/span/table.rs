//! The row table of span coding: which rows are free, and how many live pages each row in
//! use holds — what allocation, garbage accounting and compaction read.
//!
//! Rows are written whole and never in place: a write takes fresh rows, and the rows its
//! pages came from lose a live page each. Invariants:
//! - a row is taken ([`RowTable::take`]) with a live count of the pages about to be written to
//!   it, and that count only goes down ([`RowTable::release`]: a page moved away, or a write
//!   or a compaction did not point the page at the row after all); a row returns to the free
//!   rows when it reaches zero, and not before — so a row is reused only once no page of it
//!   can be pointed at (a reader that looked a page up before still finds its piece, or a
//!   newer version that sends it to look again);
//! - free rows are handed out lowest first, so the rows in use stay packed into the fewest
//!   address ranges, whose slabs are what the nodes hold;
//! - a free row is *held* (its pieces still occupy the nodes' memory) until it is given back
//!   ([`RowTable::begin_discard`] .. [`RowTable::end_discard`]); while its memory is being
//!   given back it is out of the free rows, so no write takes it meanwhile, and a write that
//!   takes it afterwards makes it held again.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Live pages per row and the free rows.
pub struct RowTable {
    /// Live pages (or pages being written) per row.
    live: Vec<u8>,
    /// Rows freed after use.
    free: BinaryHeap<Reverse<u64>>,
    /// Rows from here on were never used.
    next: u64,
    /// Rows with a live count above zero.
    in_use: u64,
    /// Per row: free and its memory given back to the nodes.
    discarded: Vec<bool>,
    /// Rows marked in `discarded`.
    n_discarded: u64,
    /// Sum of the live counts.
    live_pages: u64,
}

/// Rows given back to the nodes ([`RowTable::begin_shrink`]): their memory is being
/// discarded, and no write may take them meanwhile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shrink(pub std::ops::Range<u64>);

/// What the table holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Occupancy {
    /// Rows holding at least one live page (or being written).
    pub rows_in_use: u64,
    /// Live pages (and pages being written).
    pub live_pages: u64,
    /// Rows ever used: the high-water mark of the row space.
    pub rows_touched: u64,
    /// Rows whose pieces occupy the nodes' memory: those ever used, less the free ones given
    /// back.
    pub rows_held: u64,
}

/// Free rows whose memory is being given back ([`RowTable::begin_discard`]), as runs of
/// consecutive rows; end with [`RowTable::end_discard`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discard(pub Vec<std::ops::Range<u64>>);

impl RowTable {
    /// A table of `rows` rows, all free.
    pub fn new(rows: u64) -> RowTable {
        let n = usize::try_from(rows).expect("a row count that fits memory");
        RowTable {
            live: vec![0; n],
            free: BinaryHeap::new(),
            next: 0,
            in_use: 0,
            discarded: vec![false; n],
            n_discarded: 0,
            live_pages: 0,
        }
    }

    /// A table of `rows` rows as a client that reattaches finds them: `live[row]` pages live
    /// in each row (rows past its end, none), `held[row]` whether the nodes hold any piece of
    /// it. Rows up to the last held one count as used; the free ones among them are free
    /// rows, held or given back as `held` says.
    pub fn rebuilt(rows: u64, live: &[u8], held: &[bool]) -> RowTable {
        let mut t = RowTable::new(rows);
        let used = held.iter().rposition(|h| *h).map_or(0, |r| r + 1);
        let used = used.max(live.iter().rposition(|l| *l > 0).map_or(0, |r| r + 1));
        t.next = (used as u64).min(rows);
        for row in 0..t.next {
            let n = live.get(row as usize).copied().unwrap_or(0);
            t.live[row as usize] = n;
            t.live_pages += u64::from(n);
            if n > 0 {
                t.in_use += 1;
            } else {
                t.free.push(Reverse(row));
                if !held.get(row as usize).copied().unwrap_or(false) {
                    t.discarded[row as usize] = true;
                    t.n_discarded += 1;
                }
            }
        }
        t
    }

    /// Rows in the table.
    pub fn rows(&self) -> u64 {
        self.live.len() as u64
    }

    /// Takes the lowest free row for `pages` pages (1..=255) about to be written to it;
    /// `None` when no row is free.
    pub fn take(&mut self, pages: u8) -> Option<u64> {
        debug_assert!(pages > 0);
        // Freed rows were used, so they all lie below the never-used ones.
        let row = if let Some(Reverse(r)) = self.free.pop() {
            r
        } else if self.next < self.rows() {
            self.next += 1;
            self.next - 1
        } else {
            return None;
        };
        self.live[row as usize] = pages;
        if std::mem::take(&mut self.discarded[row as usize]) {
            self.n_discarded -= 1;
        }
        self.in_use += 1;
        self.live_pages += u64::from(pages);
        Some(row)
    }

    /// One page of `row` is gone (moved, or never pointed at it); frees the row with its last.
    pub fn release(&mut self, row: u64) {
        let Some(live) = self.live.get_mut(row as usize) else {
            return;
        };
        debug_assert!(*live > 0, "row {row} released more often than taken");
        if *live == 0 {
            return;
        }
        *live -= 1;
        self.live_pages -= 1;
        if *live == 0 {
            self.in_use -= 1;
            self.free.push(Reverse(row));
        }
    }

    /// The live count of `row`.
    pub fn live(&self, row: u64) -> u8 {
        self.live.get(row as usize).copied().unwrap_or(0)
    }

    /// What the table holds now.
    pub fn occupancy(&self) -> Occupancy {
        Occupancy {
            rows_in_use: self.in_use,
            live_pages: self.live_pages,
            rows_touched: self.next,
            rows_held: self.next - self.n_discarded,
        }
    }

    /// The free rows still held (used, freed, memory not given back), at least `min` of them,
    /// as runs of consecutive rows; takes them out of the free rows, so that no write takes
    /// one while its memory is discarded. `None` when fewer than `min` are held free. End with
    /// [`RowTable::end_discard`].
    pub fn begin_discard(&mut self, min: u64) -> Option<Discard> {
        let discarded = &self.discarded;
        let mut rows: Vec<u64> = self
            .free
            .iter()
            .map(|Reverse(r)| *r)
            .filter(|r| !discarded[*r as usize])
            .collect();
        rows.sort_unstable();
        let mut runs: Vec<std::ops::Range<u64>> = Vec::new();
        for r in rows {
            match runs.last_mut() {
                Some(run) if run.end == r => run.end += 1,
                _ => runs.push(r..r + 1),
            }
        }
        let total: u64 = runs.iter().map(|run| run.end - run.start).sum();
        if total < min.max(1) {
            return None;
        }
        self.free.retain(|Reverse(r)| {
            let i = runs.partition_point(|run| run.end <= *r);
            !runs.get(i).is_some_and(|run| run.contains(r))
        });
        Some(Discard(runs))
    }

    /// Ends a discard: its rows are free again, and no longer held.
    pub fn end_discard(&mut self, d: Discard) {
        for run in d.0 {
            for r in run {
                self.discarded[r as usize] = true;
                self.n_discarded += 1;
                self.free.push(Reverse(r));
            }
        }
    }

    /// The rows above the highest one in use, among those ever used: what can be given back
    /// to the nodes. Takes them out of the free rows, so that no write takes one while its
    /// memory is discarded; `None` when there are none. End with [`RowTable::end_shrink`].
    pub fn begin_shrink(&mut self) -> Option<Shrink> {
        let top = (0..self.next)
            .rev()
            .find(|r| self.live[*r as usize] > 0)
            .map_or(0, |r| r + 1);
        if top >= self.next {
            return None;
        }
        self.free.retain(|Reverse(r)| *r < top);
        Some(Shrink(top..self.next))
    }

    /// Ends a shrink: its rows count as never used again (the high-water mark comes down),
    /// or, if writes took rows past them meanwhile, as free.
    pub fn end_shrink(&mut self, s: Shrink) {
        if self.next == s.0.end {
            for r in s.0.clone() {
                if std::mem::take(&mut self.discarded[r as usize]) {
                    self.n_discarded -= 1;
                }
            }
            self.next = s.0.start;
        } else {
            self.free.extend(s.0.map(Reverse));
        }
    }

    /// Up to `max` of the highest rows in use, highest first (what moves down into the free
    /// rows below them when the row space has spread).
    pub fn top_rows(&self, max: usize) -> Vec<u64> {
        (0..self.next)
            .rev()
            .filter(|r| self.live[*r as usize] > 0)
            .take(max)
            .collect()
    }

    /// Up to `max` rows in use with at most `sparse` live pages, sparsest first.
    pub fn sparse_rows(&self, sparse: u8, max: usize) -> Vec<u64> {
        let mut rows: Vec<(u8, u64)> = (0..self.next)
            .filter_map(|r| {
                let n = self.live[r as usize];
                (n > 0 && n <= sparse).then_some((n, r))
            })
            .collect();
        rows.sort_unstable();
        rows.truncate(max);
        rows.into_iter().map(|(_, r)| r).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_reused_lowest_first_and_only_once_empty() {
        let mut t = RowTable::new(4);
        assert_eq!(t.take(2), Some(0));
        assert_eq!(t.take(1), Some(1));
        assert_eq!(t.take(3), Some(2));
        t.release(0);
        assert_eq!(t.take(1), Some(3), "row 0 still has a live page");
        assert_eq!(t.take(1), None, "every row is in use");
        t.release(1);
        t.release(0);
        assert_eq!(
            t.occupancy(),
            Occupancy {
                rows_in_use: 2,
                live_pages: 4,
                rows_touched: 4,
                rows_held: 4,
            }
        );
        assert_eq!(t.take(1), Some(0), "the lowest free row");
        assert_eq!(t.take(1), Some(1));
        assert_eq!(t.sparse_rows(1, 10), vec![0, 1, 3]);
        assert_eq!(t.sparse_rows(3, 2), vec![0, 1]);
    }

    #[test]
    fn free_rows_in_the_middle_are_given_back_and_held_again_when_taken() {
        let mut t = RowTable::new(10);
        for _ in 0..8 {
            t.take(1);
        }
        for r in [1, 2, 3, 6] {
            t.release(r);
        }
        assert!(t.begin_discard(5).is_none(), "only four rows are held free");
        let d = t.begin_discard(2).expect("four free rows are held");
        assert_eq!(d, Discard(vec![1..4, 6..7]));
        assert_eq!(
            t.take(1),
            Some(8),
            "rows being discarded are not handed out"
        );
        t.end_discard(d);
        let o = t.occupancy();
        assert_eq!((o.rows_touched, o.rows_held), (9, 5));
        assert!(t.begin_discard(1).is_none(), "nothing held is free");
        assert_eq!(
            t.take(1),
            Some(1),
            "a discarded row is still the lowest free"
        );
        assert_eq!(
            t.occupancy().rows_held,
            6,
            "and holds memory again once written"
        );
        // A shrink over discarded rows lowers both marks together.
        for r in [4, 5, 7, 8] {
            t.release(r);
        }
        let s = t.begin_shrink().expect("rows 2..9 are free");
        assert_eq!(s, Shrink(2..9));
        t.end_shrink(s);
        let o = t.occupancy();
        assert_eq!((o.rows_touched, o.rows_held, o.rows_in_use), (2, 2, 2));
    }

    #[test]
    fn a_shrink_gives_back_the_rows_above_the_highest_in_use() {
        let mut t = RowTable::new(8);
        for _ in 0..5 {
            t.take(1);
        }
        t.release(4);
        t.release(3);
        t.release(1);
        let s = t.begin_shrink().expect("rows 3 and 4 are free above row 2");
        assert_eq!(s, Shrink(3..5));
        assert_eq!(t.take(1), Some(1), "the free row below stays free");
        assert_eq!(t.take(1), Some(5), "the shrinking rows are not handed out");
        t.end_shrink(s);
        assert_eq!(
            t.occupancy().rows_touched,
            6,
            "a row past them was taken: they stay free"
        );
        assert_eq!(t.take(1), Some(3));
        let mut t = RowTable::new(4);
        t.take(1);
        t.take(1);
        t.release(1);
        let s = t.begin_shrink().unwrap();
        t.end_shrink(s);
        assert_eq!(
            t.occupancy().rows_touched,
            1,
            "the high-water mark came down"
        );
        assert_eq!(t.take(1), Some(1));
        assert!(t.begin_shrink().is_none());
    }

    #[test]
    fn a_rebuilt_table_frees_the_empty_rows_below_the_last_held_one() {
        let live = [2, 0, 0, 3, 0];
        let held = [true, true, false, true, false];
        let mut t = RowTable::rebuilt(8, &live, &held);
        assert_eq!(
            t.occupancy(),
            Occupancy {
                rows_in_use: 2,
                live_pages: 5,
                rows_touched: 4,
                rows_held: 3,
            }
        );
        assert_eq!(
            (t.take(1), t.take(1), t.take(1)),
            (Some(1), Some(2), Some(4))
        );
        assert_eq!(
            t.occupancy().rows_held,
            5,
            "row 2 holds memory again, row 4 is new"
        );
        t.release(0);
        t.release(0);
        assert_eq!(t.take(1), Some(0));
    }
}
