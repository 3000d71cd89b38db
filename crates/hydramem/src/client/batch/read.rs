//! The read path of the multi-page API (see [`super`]): a read window takes one slot per page,
//! gives consecutive pages of one group the same read plan order, so that they ask the same
//! splits, posts those as runs, and concludes each page (decoded in place, checked) as soon as
//! it has what it needs, while the others are still in flight.
//!
//! Invariants: the caller's pages belong to the window until it ends, and a page's bytes are
//! written only through its slot until that slot is closed; a page whose splits came from
//! different writes is never concluded from them: it is read again on its own once the
//! window's slots are free (a submission fails with [`IoError::Again`] instead); the first
//! error of a window is its result.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::{follows, runs, Decided, Taking, Touched, WINDOW};
use crate::client::read::{Asked, ReadOutcome, ReadPlan};
use crate::client::slots;
use crate::client::{IoError, Page, RemoteMemory};
use crate::PAGE_SIZE;

/// One page of a read window.
struct ReadSlot<'a> {
    /// Index of the page in the call.
    i: usize,
    op: slots::Op<'a>,
    plan: ReadPlan,
    /// The splits asked first.
    asked: Asked,
    decided: bool,
}

/// A read window in flight ([`RemoteMemory::begin_read`], ended by [`RemoteMemory::end_read`]): its pages (address, where the
/// bytes go) and their operations.
pub(in crate::client) struct ReadWindow<'c> {
    taking: Taking,
    items: Vec<(u64, *mut Page)>,
    live: Vec<ReadSlot<'c>>,
    start: Instant,
    /// When its splits were posted: its owner polls for the replies from here.
    posted: Instant,
    /// Pages whose splits came from different writes: read again on their own.
    again: Vec<usize>,
    first_err: Option<IoError>,
}

impl ReadWindow<'_> {
    /// Pages of the call the window took.
    pub(in crate::client) fn taken(&self) -> usize {
        self.items.len()
    }
}

impl RemoteMemory {
    /// Reads `pages.len()` consecutive pages starting at `addr` into `pages`, all in flight at
    /// once (see the module doc). Pages never written read as zeros. On error, the pages
    /// before and after the failed one may or may not have been read.
    pub fn read_pages(&self, addr: u64, pages: &mut [Page]) -> Result<(), IoError> {
        self.check_span(addr, pages.len())?;
        let items: Vec<(u64, *mut Page)> = pages
            .iter_mut()
            .enumerate()
            .map(|(i, p)| (addr + (i * PAGE_SIZE) as u64, p as *mut Page))
            .collect();
        // SAFETY: each pointer comes from a distinct element of `pages`, exclusively borrowed
        // for this whole call and not otherwise touched during it.
        unsafe { self.read_items(&items) }
    }

    /// Reads each page of `list` (its address, where its bytes go), all in flight at once, as
    /// [`RemoteMemory::read_pages`] does for a span: pages at consecutive addresses next to
    /// each other in the list travel as runs; others as runs of one, still one frame per
    /// node. For front ends that gather the requests of many callers (the NBD export's
    /// pipelined requests).
    pub fn read_list(&self, list: &mut [(u64, &mut Page)]) -> Result<(), IoError> {
        for (addr, _) in list.iter() {
            self.check_span(*addr, 1)?;
        }
        let items: Vec<(u64, *mut Page)> = list
            .iter_mut()
            .map(|(a, p)| (*a, &mut **p as *mut Page))
            .collect();
        // SAFETY: each pointer comes from a distinct `&mut Page` of `list`, exclusively
        // borrowed for this whole call and not otherwise touched during it.
        unsafe { self.read_items(&items) }
    }

    /// Reads `items` window after window.
    ///
    /// # Safety
    /// Every pointer must be valid for reads and writes of one page for the whole call, the
    /// pointers must be distinct, and nothing else may access those pages during the call.
    unsafe fn read_items(&self, items: &[(u64, *mut Page)]) -> Result<(), IoError> {
        if self.config.ablation.bounce {
            let mut bounce = vec![[0u8; PAGE_SIZE]; items.len()];
            let bounced: Vec<(u64, *mut Page)> = items
                .iter()
                .zip(bounce.iter_mut())
                .map(|(&(a, _), b)| (a, b as *mut Page))
                .collect();
            // SAFETY: the bounce pages are distinct, owned here, and untouched meanwhile.
            let r = unsafe { self.read_windows(&bounced) };
            for (&(_, page), b) in items.iter().zip(&bounce) {
                // SAFETY: the caller's contract; no slot refers to the page (none was
                // acquired for it).
                unsafe { (*page).copy_from_slice(b) };
            }
            return r;
        }
        // SAFETY: the caller's contract.
        unsafe { self.read_windows(items) }
    }

    /// Reads `items` window after window.
    ///
    /// # Safety
    /// As [`RemoteMemory::read_items`].
    unsafe fn read_windows(&self, items: &[(u64, *mut Page)]) -> Result<(), IoError> {
        let start = Instant::now();
        let mut done = 0;
        while done < items.len() {
            // SAFETY: the caller's contract, for a part of the same items.
            done += unsafe { self.read_window(&items[done..], start)? };
        }
        Ok(())
    }

    /// Reads the first pages of `items` (as many as one window holds); returns how many.
    ///
    /// # Safety
    /// As [`RemoteMemory::read_items`].
    unsafe fn read_window(
        &self,
        items: &[(u64, *mut Page)],
        start: Instant,
    ) -> Result<usize, IoError> {
        // SAFETY: the caller's contract.
        let w = unsafe { self.begin_read(items, start, Taking::Call)? };
        self.end_read(w)
    }

    /// Starts reading the first pages of `items` (as many as one window holds): takes their
    /// slots as `taking` says and posts their splits as runs, then returns the window in
    /// flight.
    ///
    /// # Safety
    /// As [`RemoteMemory::read_items`], until the window returned is finished or dropped.
    pub(in crate::client) unsafe fn begin_read(
        &self,
        items: &[(u64, *mut Page)],
        start: Instant,
        taking: Taking,
    ) -> Result<ReadWindow<'_>, IoError> {
        let mut live: Vec<ReadSlot<'_>> = Vec::with_capacity(items.len().min(WINDOW));
        let mut taken = 0;
        for (i, &(page_addr, page)) in items.iter().enumerate().take(WINDOW) {
            let (range, pir) = self.locate(page_addr)?;
            let Some(group) = self.ranges[range].load_full() else {
                // SAFETY: the caller's contract; no operation holds this page (none was
                // acquired for it).
                unsafe { (*page).fill(0) };
                self.stats.reads.fetch_add(1, Ordering::Relaxed);
                taken = i + 1;
                continue;
            };
            let op = if live.is_empty() && taking == Taking::Call {
                // SAFETY: the page is valid for 4096 bytes of writes (the caller's contract),
                // and nothing touches it until its slot is closed (below, before the page is
                // borrowed again) or dropped.
                unsafe { self.slots.acquire_read(page.cast()) }
            } else {
                // SAFETY: as above.
                match unsafe { self.slots.try_acquire_read(page.cast()) } {
                    Some(op) => op,
                    // Nothing is posted yet: the slots taken come back as `live` is dropped.
                    None if taking == Taking::Submission => {
                        return Err(self.no_slot("read", items, live.len()))
                    }
                    None => break,
                }
            };
            op.bind(range as u64, pir);
            // The page after the previous one in the same group asks the same splits.
            let mut plan = match live.last() {
                Some(prev)
                    if follows(items, prev.i, i) && Arc::ptr_eq(&prev.plan.group, &group) =>
                {
                    ReadPlan::next_page(&prev.plan, self)
                }
                _ => ReadPlan::new(self, group, range, pir),
            };
            let asked = plan.take_first(self, self.initial_fanout(&plan.group));
            live.push(ReadSlot {
                i,
                op,
                plan,
                asked,
                decided: false,
            });
            taken = i + 1;
        }
        let mut touched = Touched::default();
        let batched = !self.config.ablation.unbatched;
        for run in runs(&live, |a, b| {
            batched
                && follows(items, a.i, b.i)
                && Arc::ptr_eq(&a.plan.group, &b.plan.group)
                && a.asked == b.asked
        }) {
            self.post_read_runs(run);
            touched.note(&run[0].op, self.layout.width);
        }
        touched.flush(self);
        Ok(ReadWindow {
            taking,
            items: items[..taken].to_vec(),
            live,
            start,
            posted: Instant::now(),
            again: Vec::new(),
            first_err: None,
        })
    }

    /// Concludes every page of `w` that can be concluded now, without waiting; returns
    /// whether all are.
    pub(in crate::client) fn look_read(&self, w: &mut ReadWindow<'_>) -> bool {
        let mut open = 0;
        for i in 0..w.live.len() {
            let s = &mut w.live[i];
            if s.decided {
                continue;
            }
            let p = s.op.progress();
            match s.plan.check(self, &s.op, p) {
                Some(r) => self.conclude_slot(w, i, Some(r)),
                None => open += 1,
            }
        }
        open == 0
    }

    /// Waits for every page of `w` (from the calling thread, which completions now wake),
    /// concludes them, and reads again on their own those whose splits came from different
    /// writes; returns how many pages of the call the window took.
    pub(in crate::client) fn end_read(&self, mut w: ReadWindow<'_>) -> Result<usize, IoError> {
        for s in w.live.iter().filter(|s| !s.decided) {
            s.op.wake_me();
        }
        let (start, posted) = (w.start, w.posted);
        let mut live = std::mem::take(&mut w.live);
        self.wait_all(&mut live, (start, posted), |s, p| {
            let r = s.plan.check(self, &s.op, p)?;
            self.conclude_read_slot(&w.items, &mut w.again, &mut w.first_err, s, Some(r), start);
            Some(())
        });
        for s in live.iter_mut().filter(|s| !s.decided) {
            self.conclude_read_slot(&w.items, &mut w.again, &mut w.first_err, s, None, start);
        }
        drop(live);
        if let Some(e) = w.first_err.take() {
            return Err(e);
        }
        if let (Taking::Submission, Some(&i)) = (w.taking, w.again.first()) {
            return Err(IoError::Again {
                what: "read",
                addr: w.items[i].0,
                why: "its splits came from different writes, as a write to it was in flight",
            });
        }
        // Splits of different writes: a write to these pages was in flight. Read each again on
        // its own (with the single-page backoff), now that this window's slots are free.
        for &i in &w.again {
            let (page_addr, page) = w.items[i];
            // SAFETY: every slot of the window was dropped, and by `begin_read`'s contract
            // nothing else refers to the page.
            let page = unsafe { &mut *page };
            self.read_page_at(page_addr, page, start)?;
        }
        Ok(w.taken())
    }

    /// Concludes page `i` of window `w` (see [`RemoteMemory::conclude_read_slot`]).
    fn conclude_slot(&self, w: &mut ReadWindow<'_>, i: usize, result: Option<Result<(), bool>>) {
        let ReadWindow {
            items,
            live,
            again,
            first_err,
            start,
            ..
        } = w;
        self.conclude_read_slot(items, again, first_err, &mut live[i], result, *start);
    }

    /// Closes a window page's slot and concludes its read with `result` (as
    /// [`ReadPlan::check`] returns it; `None`: timed out): decoded in place and checked, or
    /// noted for a second read (`again`), or its error kept (`first_err`).
    fn conclude_read_slot(
        &self,
        items: &[(u64, *mut Page)],
        again: &mut Vec<usize>,
        first_err: &mut Option<IoError>,
        s: &mut ReadSlot<'_>,
        result: Option<Result<(), bool>>,
        start: Instant,
    ) {
        s.decided = true;
        s.op.close();
        let (page_addr, page) = items[s.i];
        // SAFETY: the slot is closed (no completer writes the page any more), and by
        // `begin_read`'s contract this is the only reference to the page meanwhile.
        let page = unsafe { &mut *page };
        let r = self.conclude_read(&mut s.plan, &mut s.op, page, page_addr, start, result);
        self.metrics
            .read_seconds
            .record(start.elapsed().as_secs_f64());
        match r {
            Ok(ReadOutcome::Done) => {}
            Ok(ReadOutcome::Inconsistent { .. }) => again.push(s.i),
            Err(e) => {
                self.metrics.read_errors.increment(1);
                first_err.get_or_insert(e);
            }
        }
    }

    /// Posts the splits a run of pages asked first (`run`: consecutive pages of one group that
    /// asked the same splits): for each split, one run of consecutive slots to its node.
    fn post_read_runs(&self, run: &[ReadSlot<'_>]) {
        let first = &run[0];
        for j in first.asked.splits() {
            let at = (&*first.plan.group, first.plan.offset());
            self.post_split_run(
                run,
                |s| &s.op,
                j,
                at,
                |node, wire_run| {
                    let mut cookies = run.iter().map(|s| s.op.cookie(j));
                    self.transport.post_read_run(
                        node,
                        wire_run,
                        &mut cookies,
                        self.config.ablation.unbatched,
                    )
                },
            );
        }
    }
}

impl Decided for ReadSlot<'_> {
    fn decided(&self) -> bool {
        self.decided
    }
    fn op(&self) -> &slots::Op<'_> {
        &self.op
    }
}
