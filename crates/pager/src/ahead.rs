//! Adaptive read-ahead: whether a page-in brings the pages after it along.
//!
//! Reading ahead pays when the program touches the next page soon after the faulting one, and
//! costs when it does not: the faulting page waits for the pages read with it (under span, on
//! another node), and they take local memory. redis's 4 KiB values sit in 5 KiB slots, so a
//! GET that misses touches two pages: one page ahead brought it +50% GETs. memcached's small
//! values do not cross pages: one page ahead cost it 9% of its requests under rep2 and 26%
//! under span (docs/benchmarks.md §12, "Read-ahead only where it pays").
//!
//! Which kind a program is cannot be seen while reading ahead: a page mapped ahead is touched
//! without a fault. So the policy measures while it does not read ahead. In windows of
//! [`WINDOW`] page-ins from the cluster, it counts the *sequential* ones: a page-in of page v
//! while one of the `max` pages before v was among the last [`RECENT`] paged in — the
//! page-ins reading ahead would have saved. After a window measured, it reads ahead if at
//! least [`ON_PERCENT`]% were sequential; while it reads ahead, one window in
//! [`PROBE_EVERY`] goes without, to measure again. It starts measuring.
//!
//! Invariant: [`Ahead::pages`] is 0 in every window that measures, so what a window measures
//! is the program's own order of touches, never one read-ahead made.

/// Page-ins per window.
pub const WINDOW: u32 = 512;
/// How many recent page-ins a page-in looks back at.
pub const RECENT: usize = 32;
/// The share of sequential page-ins, in percent, from which reading ahead pays: a page read
/// ahead and not used costs the page-in it rides with 6–10 µs, one used saves a page-in of
/// 40–50, so the break-even is near 15%. Measured: redis 30–33%, memcached 0–2%.
pub const ON_PERCENT: u32 = 20;
/// While reading ahead, one window in this many measures instead.
pub const PROBE_EVERY: u32 = 16;

/// The read-ahead policy of one pager (its fault thread's, under the pager's lock).
pub struct Ahead {
    /// Pages read ahead when reading ahead (0: never).
    max: u64,
    /// The last [`RECENT`] pages paged in (0: none yet; page 0 is never mapped).
    recent: [u64; RECENT],
    next: usize,
    /// Reading ahead (outside probe windows).
    reading: bool,
    /// Windows read ahead since the last that measured: the next window probes (measures
    /// although `reading`) once they are one short of [`PROBE_EVERY`].
    since_probe: u32,
    /// Page-ins in this window, and of them the sequential ones.
    count: u32,
    sequential: u32,
}

/// How a window ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// It measured.
    Measured {
        /// The share of its page-ins that were sequential, in percent.
        percent: u32,
        /// Whether the windows after it read ahead.
        reading: bool,
    },
    /// It read ahead.
    Read,
}

impl Ahead {
    /// A policy reading at most `max` pages ahead (0: never reads ahead).
    pub fn new(max: u64) -> Ahead {
        Ahead {
            max,
            recent: [0; RECENT],
            next: 0,
            reading: false,
            since_probe: 0,
            count: 0,
            sequential: 0,
        }
    }

    /// How many pages the next page-in reads ahead (at most that many: those out).
    pub fn pages(&self) -> u64 {
        if self.measuring() {
            0
        } else {
            self.max
        }
    }

    fn measuring(&self) -> bool {
        !self.reading || self.since_probe + 1 >= PROBE_EVERY
    }

    /// Page `v` was paged in from the cluster; returns how the window ended, if this page-in
    /// ended one.
    pub fn paged_in(&mut self, v: u64) -> Option<Window> {
        if self.max == 0 {
            return None;
        }
        if self.measuring() && self.follows(v) {
            self.sequential += 1;
        }
        self.recent[self.next] = v;
        self.next = (self.next + 1) % RECENT;
        self.count += 1;
        if self.count < WINDOW {
            return None;
        }
        let end = if self.measuring() {
            let percent = self.sequential * 100 / self.count;
            self.reading = percent >= ON_PERCENT;
            self.since_probe = 0;
            Window::Measured {
                percent,
                reading: self.reading,
            }
        } else {
            self.since_probe += 1;
            Window::Read
        };
        self.count = 0;
        self.sequential = 0;
        Some(end)
    }

    /// Whether one of the `max` pages before `v` was paged in recently.
    fn follows(&self, v: u64) -> bool {
        (1..=self.max.min(v)).any(|d| self.recent.contains(&(v - d)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `n` page-ins from `next`; returns the windows that ended and how many of the
    /// page-ins were asked to read ahead.
    fn feed(a: &mut Ahead, n: u32, mut next: impl FnMut(u32) -> u64) -> (Vec<Window>, u32) {
        let mut ends = Vec::new();
        let mut read = 0;
        for i in 0..n {
            if a.pages() > 0 {
                read += 1;
            }
            ends.extend(a.paged_in(next(i)));
        }
        (ends, read)
    }

    /// A page-in of a value spanning two pages: v, then v + 1 (redis's GETs).
    fn pairs(i: u32) -> u64 {
        let value = u64::from(i / 2).wrapping_mul(7919) % 100_000;
        1000 + value * 3 + u64::from(i % 2)
    }

    /// Page-ins scattered over the memory, none near another (memcached's).
    fn scattered(i: u32) -> u64 {
        1000 + u64::from(i).wrapping_mul(7919) % 100_000 * 3
    }

    #[test]
    fn a_program_touching_pairs_of_pages_gets_read_ahead_after_one_window() {
        let mut a = Ahead::new(1);
        assert_eq!(a.pages(), 0, "it starts measuring");
        let (ends, read) = feed(&mut a, WINDOW, pairs);
        assert_eq!(read, 0, "nothing is read ahead while measuring");
        assert_eq!(
            ends,
            vec![Window::Measured {
                percent: 50,
                reading: true
            }]
        );
        assert_eq!(a.pages(), 1);
        // Reading ahead from then on, but for one window in PROBE_EVERY.
        let (ends, read) = feed(&mut a, WINDOW * PROBE_EVERY, pairs);
        assert_eq!(read, WINDOW * (PROBE_EVERY - 1));
        assert_eq!(ends.iter().filter(|e| **e == Window::Read).count(), 15);
        assert!(matches!(
            ends.last(),
            Some(Window::Measured { reading: true, .. })
        ));
    }

    #[test]
    fn a_program_touching_scattered_pages_gets_none() {
        let mut a = Ahead::new(1);
        let (ends, read) = feed(&mut a, WINDOW * 4, scattered);
        assert_eq!(read, 0);
        assert!(ends.iter().all(|e| *e
            == Window::Measured {
                percent: 0,
                reading: false
            }));
    }

    #[test]
    fn a_program_that_stops_touching_pairs_loses_read_ahead_at_the_next_probe() {
        let mut a = Ahead::new(1);
        feed(&mut a, WINDOW, pairs);
        assert_eq!(a.pages(), 1);
        // Scattered now: read ahead until the probe window, which turns it off.
        let (ends, read) = feed(&mut a, WINDOW * PROBE_EVERY, scattered);
        assert_eq!(read, WINDOW * (PROBE_EVERY - 1));
        assert_eq!(
            ends.last(),
            Some(&Window::Measured {
                percent: 0,
                reading: false
            })
        );
        assert_eq!(a.pages(), 0);
    }

    #[test]
    fn a_share_below_the_threshold_stays_off_and_one_above_turns_on() {
        // One page-in in six follows its neighbour (16%), then one in three (33%).
        let mixed = |every: u32| {
            move |i: u32| {
                if i % every == 1 {
                    1000 + u64::from(i - 1).wrapping_mul(7919) % 100_000 * 3 + 1
                } else {
                    1000 + u64::from(i).wrapping_mul(7919) % 100_000 * 3
                }
            }
        };
        let mut a = Ahead::new(1);
        feed(&mut a, WINDOW, mixed(6));
        assert_eq!(a.pages(), 0);
        feed(&mut a, WINDOW, mixed(3));
        assert_eq!(a.pages(), 1);
    }

    #[test]
    fn max_zero_never_reads_ahead_nor_measures() {
        let mut a = Ahead::new(0);
        let (ends, read) = feed(&mut a, WINDOW * 2, pairs);
        assert_eq!((ends.len(), read), (0, 0));
    }

    #[test]
    fn more_pages_ahead_look_as_far_back() {
        // A program touching every other page of runs: v, v + 2, v + 4.
        let strided = |i: u32| {
            1000 + u64::from(i / 3).wrapping_mul(7919) % 100_000 * 8 + u64::from(i % 3) * 2
        };
        let mut one = Ahead::new(1);
        feed(&mut one, WINDOW, strided);
        assert_eq!(one.pages(), 0, "one page ahead would never have been used");
        let mut two = Ahead::new(2);
        feed(&mut two, WINDOW, strided);
        assert_eq!(two.pages(), 2);
    }
}
