//! The multi-page API: read or write many consecutive pages in one call, all in flight at once.
//!
//! A call takes one slot per page (up to [`WINDOW`] pages, and never more than are free: a
//! caller that holds slots never waits for more, so two batches cannot wait for each other),
//! then posts its splits as *runs*: consecutive pages of one range occupy consecutive split
//! slots in each slab of the range's group, so split j of pages p..p+n is one run (slab,
//! offset, n) to split j's node, which the node serves with one lock and one copy. Reads give
//! the pages of a run the same read plan order, so they ask the same splits. Nothing is
//! flushed until every run is posted; then each node touched is flushed once: what one call
//! sends to one node travels in one frame and comes back in one reply. Each page then goes on exactly as a single-page operation would — its own read plan
//! (late binding, re-asks past stragglers), checksums, versions and mode checks — and is
//! concluded (decoded in place, checked) as soon as it has what it needs, while the others are
//! still in flight. The rare ways out of the fast path are taken per page, after the window's
//! slots are released: a read whose splits came from different writes is read again, and a
//! write that was refused as stale, lost a node or saw its range move is written again whole
//! by [`RemoteMemory::write_page`] (with a newer version, so the first attempt cannot count).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::read::{Asked, ReadOutcome, ReadPlan};
use super::slots::{self, Progress};
use super::transport::{RunSplit, TransportError};
use super::wait::{NodeSet, Pacer};
use super::write::{encode_side, split_of, Stamp};
use super::{Group, IoError, Page, RemoteMemory};
use crate::wire::Run;
use crate::PAGE_SIZE;

/// Most pages one window of a call keeps in flight (1 MiB, the largest request a kernel block
/// layer or NBD client usually sends); longer calls go window after window.
pub const WINDOW: usize = 256;

/// Passes of [`RemoteMemory::wait_all`] between two looks at an operation that did not move.
const REVISIT: u32 = 16;

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

/// One page of a write window.
struct WriteSlot<'a> {
    i: usize,
    op: slots::Op<'a>,
    group: Arc<Group>,
    stamp: Stamp,
    decided: bool,
}

/// How a window takes its slots and what it does with pages that need a second attempt.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Taking {
    /// A blocking call: its first page waits for a slot, the others take what is free (a
    /// caller that holds slots never waits for more), and pages that need a second attempt
    /// get it here, waiting for a slot like any call.
    Call,
    /// A submission ([`super::submit`]): every page's slot at once or none
    /// ([`IoError::NoSlot`]), and no second attempt at the end ([`IoError::Again`]). Its
    /// waiter may hold the slots of other submissions that only it ends, so it must never
    /// wait for a slot: that wait could be for itself.
    Submission,
}

/// A read window in flight ([`RemoteMemory::begin_read`], ended by [`RemoteMemory::end_read`]): its pages (address, where the
/// bytes go) and their operations.
pub(super) struct ReadWindow<'c> {
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

/// A write window in flight ([`RemoteMemory::begin_write`], ended by
/// [`RemoteMemory::end_write`]): its pages (address, bytes) and their operations.
pub(super) struct WriteWindow<'c> {
    taking: Taking,
    items: Vec<(u64, *const Page)>,
    live: Vec<WriteSlot<'c>>,
    start: Instant,
    /// When its splits were posted: its owner polls for the acknowledgements from here.
    posted: Instant,
}

impl ReadWindow<'_> {
    /// Pages of the call the window took.
    pub(super) fn taken(&self) -> usize {
        self.items.len()
    }
}

impl WriteWindow<'_> {
    /// Pages of the call the window took.
    pub(super) fn taken(&self) -> usize {
        self.items.len()
    }
}

/// Nodes a window posted to, each flushed once.
#[derive(Default)]
struct Touched(Vec<u16>);

impl Touched {
    fn note(&mut self, op: &slots::Op<'_>, width: usize) {
        let posted = op.progress().posted;
        for j in 0..width {
            let node = op.node_of(j);
            if posted & (1 << j) != 0 && node != slots::NO_NODE && !self.0.contains(&node) {
                self.0.push(node);
            }
        }
    }

    fn flush(&self, c: &RemoteMemory) {
        for &node in &self.0 {
            // A node that went down fails its queued splits through the transport's
            // completions; the pages then ask others or fail as a single page would.
            let _ = c.transport.flush(node);
        }
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

    /// Reads `items` window after window.
    ///
    /// # Safety
    /// Every pointer must be valid for reads and writes of one page for the whole call, the
    /// pointers must be distinct, and nothing else may access those pages during the call.
    pub(super) unsafe fn read_items(&self, items: &[(u64, *mut Page)]) -> Result<(), IoError> {
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

    /// Checks that the page at `addr` is page aligned and inside the address space.
    pub(super) fn check_page(&self, addr: u64) -> Result<(), IoError> {
        self.check_span(addr, 1)
    }

    /// Checks that `n` pages from `addr` are page aligned and inside the address space.
    fn check_span(&self, addr: u64, n: usize) -> Result<(), IoError> {
        if self.layout.span() {
            return Err(IoError::SpanPages {
                what: "access",
                addr,
            });
        }
        if !addr.is_multiple_of(PAGE_SIZE as u64) {
            return Err(IoError::Unaligned { addr });
        }
        let end = u64::try_from(n)
            .ok()
            .and_then(|n| n.checked_mul(PAGE_SIZE as u64))
            .and_then(|len| addr.checked_add(len));
        match end {
            Some(end) if end <= self.config.size => Ok(()),
            _ => Err(IoError::OutOfRange {
                addr,
                size: self.config.size,
            }),
        }
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
    pub(super) unsafe fn begin_read(
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
    pub(super) fn look_read(&self, w: &mut ReadWindow<'_>) -> bool {
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
    pub(super) fn end_read(&self, mut w: ReadWindow<'_>) -> Result<usize, IoError> {
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
    pub(super) unsafe fn begin_write(
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
    pub(super) fn end_write(&self, w: WriteWindow<'_>) -> Result<usize, IoError> {
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

    /// Why a submission of `items` could not start: it found `free` slots free for its
    /// pages, and takes all or none.
    fn no_slot<P>(&self, what: &'static str, items: &[(u64, P)], free: usize) -> IoError {
        IoError::NoSlot {
            what,
            addr: items[0].0,
            pages: items.len().min(WINDOW),
            free,
            slots: self.config.max_in_flight,
        }
    }

    /// Whether every page of `w` is decided now, without waiting (the decision itself is
    /// [`RemoteMemory::end_write`]'s, which returns at once then).
    pub(super) fn write_ready(&self, w: &WriteWindow<'_>) -> bool {
        let l = &self.layout;
        w.live.iter().all(|s| {
            let p = s.op.progress();
            let acked = p.landed.count_ones() as usize;
            acked >= l.write_need || acked + (p.outstanding().count_ones() as usize) < l.write_need
        })
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

    /// Posts split `j` of the consecutive pages of `items` (from byte `offset` in the slabs of
    /// `group`) as one run with `post`, after marking it posting in each page's operation. A
    /// run that cannot be posted (its node has none of the group's slabs, or the transport
    /// refuses it) fails that split of every page; their plans ask others or fail as a single
    /// page would.
    pub(super) fn post_split_run<'o, S: 'o>(
        &self,
        items: &[S],
        op: impl Fn(&S) -> &slots::Op<'o>,
        j: usize,
        (group, offset): (&Group, u64),
        post: impl FnOnce(u16, Run) -> Result<(), TransportError>,
    ) {
        let node = group.nodes[j];
        for s in items {
            op(s).posting(j, node);
        }
        let run = Run {
            slab: group.slabs[j],
            split_len: self.layout.split_len as u32,
            offset,
            n: items.len() as u32,
        };
        if node == slots::NO_NODE || post(node, run).is_err() {
            items.iter().for_each(|s| op(s).post_failed(j));
        }
    }

    /// Looks at every undecided operation of a window until `decide` has decided them all
    /// (`Some`), pacing like [`RemoteMemory::wait_polling_from`] (the deadline from `start`,
    /// the polling from `posted`: posting the splits of a hydra page takes about a whole poll
    /// window here, and a window that parked at once would pay a wake-up per call); returns
    /// at the deadline with the rest undecided.
    fn wait_all<S: Decided>(
        &self,
        live: &mut [S],
        (start, posted): (Instant, Instant),
        mut decide: impl FnMut(&mut S, Progress) -> Option<()>,
    ) {
        let mut pacer = Pacer::polling_from(&self.config, &self.pollers, start, posted);
        // What each operation looked like at its last undecided look: while the owner polls,
        // an operation whose splits have not moved since is looked at again only every
        // REVISIT passes (its time-based decisions — stragglers — run on milliseconds, a
        // polling pass on microseconds); after a park, every operation is looked at.
        let mut seen: Vec<Progress> = vec![Progress::default(); live.len()];
        let mut pass = 0u32;
        let mut set = NodeSet::new();
        loop {
            let mut open = 0;
            pass = pass.wrapping_add(1);
            set.clear();
            let polling = pacer.polling();
            for (s, last) in live.iter_mut().zip(seen.iter_mut()) {
                if s.decided() {
                    continue;
                }
                let p = s.progress();
                if polling {
                    set.add(p.outstanding(), |j| s.node_of(j));
                }
                if p == *last && !pass.is_multiple_of(REVISIT) && !pacer.parked() {
                    open += 1;
                    continue;
                }
                *last = p;
                if decide(s, p).is_none() {
                    open += 1;
                }
            }
            if open == 0 {
                return;
            }
            if polling && self.receive_from(&set) {
                continue;
            }
            if !pacer.pause() {
                return;
            }
        }
    }
}

/// Whether entry `b` of a call's items is the page right after entry `a`'s, in the next
/// place of the list: the two can share runs.
fn follows<P>(items: &[(u64, P)], a: usize, b: usize) -> bool {
    a + 1 == b && items[a].0.checked_add(PAGE_SIZE as u64) == Some(items[b].0)
}

/// The maximal runs of `items` whose neighbours `joins`.
fn runs<T>(items: &[T], joins: impl Fn(&T, &T) -> bool) -> impl Iterator<Item = &[T]> {
    items.chunk_by(move |a, b| joins(a, b))
}

/// What [`RemoteMemory::wait_all`] needs of a window's entries.
trait Decided {
    /// Whether the entry's operation has ended (it is not looked at again).
    fn decided(&self) -> bool;
    /// Its operation's progress now.
    fn progress(&self) -> Progress;
    /// The node of its split `j`.
    fn node_of(&self, j: usize) -> u16;
}

impl Decided for ReadSlot<'_> {
    fn decided(&self) -> bool {
        self.decided
    }
    fn progress(&self) -> Progress {
        self.op.progress()
    }
    fn node_of(&self, j: usize) -> u16 {
        self.op.node_of(j)
    }
}

impl Decided for WriteSlot<'_> {
    fn decided(&self) -> bool {
        self.decided
    }
    fn progress(&self) -> Progress {
        self.op.progress()
    }
    fn node_of(&self, j: usize) -> u16 {
        self.op.node_of(j)
    }
}
