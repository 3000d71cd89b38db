//! The write path of the multi-page API (see [`super`]): a write window takes one slot per
//! page, stamps each page with a new version and encodes its side buffer, posts every split
//! as runs, and waits until each page is acknowledged as the mode requires.
//!
//! Invariants: a page counts as written only when enough of its splits are acknowledged (a
//! straggler's may be left behind, to be resent in the background), no node holds a newer
//! version, and its range did not move meanwhile; any other page is written again whole by
//! [`RemoteMemory::write_page`], with a newer version, once the window's slots are free (a
//! submission fails with [`IoError::Again`] instead), so a first attempt never counts; the
//! version clock moves past every version a node says it holds.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::{follows, runs, Decided, Taking, Touched, WINDOW};
use crate::client::slots;
use crate::client::transport::RunSplit;
use crate::client::write::{encode_side, split_of, Stamp};
use crate::client::{Group, IoError, Page, RemoteMemory};
use crate::PAGE_SIZE;

/// One page of a write window.
struct WriteSlot<'a> {
    i: usize,
    op: slots::Op<'a>,
    group: Arc<Group>,
    stamp: Stamp,
    decided: bool,
}

/// A write window in flight ([`RemoteMemory::begin_write`], ended by
/// [`RemoteMemory::end_write`]): its pages (address, bytes) and their operations.
pub(in crate::client) struct WriteWindow<'c> {
    taking: Taking,
    items: Vec<(u64, *const Page)>,
    live: Vec<WriteSlot<'c>>,
    start: Instant,
    /// When its splits were posted: its owner polls for the acknowledgements from here.
    posted: Instant,
}

impl WriteWindow<'_> {
    /// Pages of the call the window took.
    pub(in crate::client) fn taken(&self) -> usize {
        self.items.len()
    }
}

impl RemoteMemory {
    /// Writes `pages` to consecutive pages starting at `addr`, all in flight at once (see the
    /// module doc). Returns once every page is acknowledged as the mode requires.
    pub fn write_pages(&self, addr: u64, pages: &[Page]) -> Result<(), IoError> {
        self.check_span(addr, pages.len())?;
        let items: Vec<(u64, &Page)> = pages
            .iter()
            .enumerate()
            .map(|(i, p)| (addr + (i * PAGE_SIZE) as u64, p))
            .collect();
        self.write_items(&items)
    }

    /// Writes each page of `list` (its address, its bytes), all in flight at once, as
    /// [`RemoteMemory::write_pages`] does for a span. An address named twice is written twice,
    /// in list order: the later entry is what reads return.
    pub fn write_list(&self, list: &[(u64, &Page)]) -> Result<(), IoError> {
        for (addr, _) in list {
            self.check_span(*addr, 1)?;
        }
        self.write_items(list)
    }

    /// Writes `items` window after window.
    fn write_items(&self, items: &[(u64, &Page)]) -> Result<(), IoError> {
        if self.config.ablation.bounce {
            let bounce: Vec<Page> = items.iter().map(|(_, p)| **p).collect();
            let bounced: Vec<(u64, &Page)> = items
                .iter()
                .zip(&bounce)
                .map(|(&(a, _), b)| (a, b))
                .collect();
            return self.write_windows(&bounced);
        }
        self.write_windows(items)
    }

    /// Writes `items` window after window.
    fn write_windows(&self, items: &[(u64, &Page)]) -> Result<(), IoError> {
        let start = Instant::now();
        let mut done = 0;
        while done < items.len() {
            done += self.write_window(&items[done..], start)?;
        }
        Ok(())
    }

    /// Writes the first pages of `items` (as many as one window holds); returns how many.
    fn write_window(&self, items: &[(u64, &Page)], start: Instant) -> Result<usize, IoError> {
        let ptrs: Vec<(u64, *const Page)> =
            items.iter().map(|&(a, p)| (a, p as *const Page)).collect();
        // SAFETY: the pages are borrowed for this whole call.
        let w = unsafe { self.begin_write(&ptrs, start, Taking::Call)? };
        self.end_write(w)
    }

    /// Starts writing the first pages of `items` (as many as one window holds): takes their
    /// slots, stamps and encodes them, and posts their splits as runs; returns the window in
    /// flight. `taking` as for [`RemoteMemory::begin_read`].
    ///
    /// # Safety
    /// Every pointer must be valid for reads of one page, unchanged, until the window returned
    /// is ended or dropped.
    pub(in crate::client) unsafe fn begin_write(
        &self,
        items: &[(u64, *const Page)],
        start: Instant,
        taking: Taking,
    ) -> Result<WriteWindow<'_>, IoError> {
        let l = &self.layout;
        // SAFETY: the caller's contract, for the window's lifetime (ended within it).
        let pages: Vec<(u64, &Page)> = items.iter().map(|&(a, p)| (a, unsafe { &*p })).collect();
        let mut live: Vec<WriteSlot<'_>> = Vec::with_capacity(items.len().min(WINDOW));
        for (i, &(page_addr, page)) in pages.iter().enumerate().take(WINDOW) {
            let (range, pir) = self.locate(page_addr)?;
            let group = match self.ranges[range].load_full() {
                Some(g) => g,
                None => self.map_range(range)?,
            };
            let mut op = if live.is_empty() && taking == Taking::Call {
                self.slots.acquire_write()
            } else {
                match self.slots.try_acquire_write() {
                    Some(op) => op,
                    // Nothing is posted yet: the slots taken come back as `live` is dropped.
                    None if taking == Taking::Submission => {
                        return Err(self.no_slot("write", items, live.len()))
                    }
                    None => break,
                }
            };
            let version = self.next_version(page_addr, 0)?;
            if let Some(codec) = &self.codec {
                encode_side(codec, l, &mut op, page);
            }
            live.push(WriteSlot {
                i,
                op,
                group,
                stamp: Stamp {
                    range,
                    pir,
                    version,
                },
                decided: false,
            });
        }
        let mut touched = Touched::default();
        let batched = !self.config.ablation.unbatched;
        for run in runs(&live, |a, b| {
            batched && follows(&pages, a.i, b.i) && Arc::ptr_eq(&a.group, &b.group)
        }) {
            self.post_write_runs(run, &pages);
            touched.note(&run[0].op, l.width);
        }
        touched.flush(self);
        let taken = live.last().map_or(0, |s| s.i + 1);
        Ok(WriteWindow {
            taking,
            items: items[..taken].to_vec(),
            live,
            start,
            posted: Instant::now(),
        })
    }

    /// Waits (from the calling thread, which completions now wake) until every page of `w`
    /// is acknowledged as the mode requires, then writes again, whole, those that left the
    /// fast path; returns how many pages of the call the window took.
    pub(in crate::client) fn end_write(&self, w: WriteWindow<'_>) -> Result<usize, IoError> {
        let l = &self.layout;
        let WriteWindow {
            taking,
            items,
            mut live,
            start,
            posted,
        } = w;
        for s in live.iter().filter(|s| !s.decided) {
            s.op.wake_me();
        }
        // SAFETY: `begin_write`'s contract: valid and unchanged until the window is ended.
        let page = |i: usize| unsafe { &*items[i].1 };
        // Pages that leave the fast path: written again whole once the slots are free.
        let mut again = Vec::new();
        let mut settle = |s: &mut WriteSlot<'_>, acked: bool| {
            s.decided = true;
            s.op.close();
            let held = s.op.stale_version();
            if held != 0 {
                // Versions only grow: the clock moves past what a node holds.
                self.clock.fetch_max(held, Ordering::SeqCst);
            }
            let moved = self.ranges[s.stamp.range]
                .load_full()
                .is_none_or(|cur| !Arc::ptr_eq(&cur, &s.group));
            if acked && held == 0 && !moved {
                self.stats.writes.fetch_add(1, Ordering::Relaxed);
                self.metrics
                    .write_seconds
                    .record(start.elapsed().as_secs_f64());
            } else {
                again.push(s.i);
            }
        };
        self.wait_all(&mut live, (start, posted), |s, p| {
            let acked = p.landed.count_ones() as usize;
            if acked >= l.write_need {
                settle(s, true);
            } else if acked + (p.outstanding().count_ones() as usize) < l.write_need {
                settle(s, false);
            } else if self.leave_behind(&s.op, &s.group, page(s.i), s.stamp, (p, start)) {
                // A straggler: the write completed without it.
                settle(s, true);
            } else {
                return None;
            }
            Some(())
        });
        for s in live.iter_mut().filter(|s| !s.decided) {
            settle(s, false);
        }
        let taken = items.len();
        drop(live);
        if let (Taking::Submission, Some(&i)) = (taking, again.first()) {
            return Err(IoError::Again {
                what: "write",
                addr: items[i].0,
                why: "it was refused as stale, fell short of nodes, or its range moved",
            });
        }
        for i in again {
            self.write_page(items[i].0, page(i))?;
        }
        Ok(taken)
    }

    /// Whether every page of `w` is decided now, without waiting (the decision itself is
    /// [`RemoteMemory::end_write`]'s, which returns at once then).
    pub(in crate::client) fn write_ready(&self, w: &WriteWindow<'_>) -> bool {
        let l = &self.layout;
        w.live.iter().all(|s| {
            let p = s.op.progress();
            let acked = p.landed.count_ones() as usize;
            acked >= l.write_need || acked + (p.outstanding().count_ones() as usize) < l.write_need
        })
    }

    /// Posts every split of a run of pages (`run`: consecutive pages of one group, their side
    /// buffers encoded): for each split, one run of consecutive slots to its node, each split
    /// with its page's version and checksum.
    fn post_write_runs(&self, run: &[WriteSlot<'_>], items: &[(u64, &Page)]) {
        let l = &self.layout;
        let first = &run[0];
        for j in 0..l.width {
            let at = (&*first.group, l.split_offset(first.stamp.pir));
            self.post_split_run(
                run,
                |s| &s.op,
                j,
                at,
                |node, wire_run| {
                    let mut splits = run.iter().map(|s| {
                        let data = split_of(l, items[s.i].1, s.op.write_side(), j);
                        RunSplit {
                            cookie: s.op.cookie(j),
                            version: s.stamp.version,
                            crc: self.split_crc(data, s.stamp, j),
                            tag: 0,
                            data,
                        }
                    });
                    self.transport.post_write_run(
                        node,
                        wire_run,
                        &mut splits,
                        self.config.ablation.unbatched,
                    )
                },
            );
        }
    }
}

impl Decided for WriteSlot<'_> {
    fn decided(&self) -> bool {
        self.decided
    }
    fn op(&self) -> &slots::Op<'_> {
        &self.op
    }
}
