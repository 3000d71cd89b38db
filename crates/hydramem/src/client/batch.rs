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
use super::wait::Pacer;
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
        let start = Instant::now();
        let mut done = 0;
        while done < pages.len() {
            let at = addr + (done * PAGE_SIZE) as u64;
            done += self.read_window(at, &mut pages[done..], start)?;
        }
        Ok(())
    }

    /// Writes `pages` to consecutive pages starting at `addr`, all in flight at once (see the
    /// module doc). Returns once every page is acknowledged as the mode requires.
    pub fn write_pages(&self, addr: u64, pages: &[Page]) -> Result<(), IoError> {
        self.check_span(addr, pages.len())?;
        let start = Instant::now();
        let mut done = 0;
        while done < pages.len() {
            let at = addr + (done * PAGE_SIZE) as u64;
            done += self.write_window(at, &pages[done..], start)?;
        }
        Ok(())
    }

    /// Checks that `n` pages from `addr` are page aligned and inside the address space.
    fn check_span(&self, addr: u64, n: usize) -> Result<(), IoError> {
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

    /// Reads the first pages of `pages` (as many as one window holds); returns how many.
    fn read_window(&self, addr: u64, pages: &mut [Page], start: Instant) -> Result<usize, IoError> {
        let base = pages.as_mut_ptr();
        let mut live: Vec<ReadSlot<'_>> = Vec::with_capacity(pages.len().min(WINDOW));
        let mut taken = 0;
        for i in 0..pages.len().min(WINDOW) {
            let page_addr = addr + (i * PAGE_SIZE) as u64;
            let (range, pir) = self.locate(page_addr)?;
            // SAFETY: `i < pages.len()`; every access to the pages below goes through `base`.
            let page = unsafe { base.add(i) };
            let Some(group) = self.ranges[range].load_full() else {
                // SAFETY: no operation holds this page (none was acquired for it).
                unsafe { (*page).fill(0) };
                self.stats.reads.fetch_add(1, Ordering::Relaxed);
                taken = i + 1;
                continue;
            };
            let op = if live.is_empty() {
                // SAFETY: the page is valid for 4096 bytes of writes, and nothing touches it
                // until its slot is closed (below, before the page is borrowed again) or dropped.
                unsafe { self.slots.acquire_read(page.cast()) }
            } else {
                // SAFETY: as above.
                match unsafe { self.slots.try_acquire_read(page.cast()) } {
                    Some(op) => op,
                    None => break,
                }
            };
            op.bind(range as u64, pir);
            // The page after the previous one in the same group asks the same splits.
            let mut plan = match live.last() {
                Some(prev) if prev.i + 1 == i && Arc::ptr_eq(&prev.plan.group, &group) => {
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
        for run in runs(&live, |a, b| {
            a.i + 1 == b.i && Arc::ptr_eq(&a.plan.group, &b.plan.group) && a.asked == b.asked
        }) {
            self.post_read_runs(run);
            touched.note(&run[0].op, self.layout.width);
        }
        touched.flush(self);
        let mut again = Vec::new();
        let mut first_err = None;
        let mut conclude = |s: &mut ReadSlot<'_>, result| {
            s.decided = true;
            s.op.close();
            // SAFETY: the slot is closed (no completer writes the page any more) and this is
            // the only reference to page `s.i` (`base` is not used for it elsewhere meanwhile).
            let page = unsafe { &mut *base.add(s.i) };
            let page_addr = addr + (s.i * PAGE_SIZE) as u64;
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
        };
        self.wait_all(&mut live, start, |s, p| {
            let r = s.plan.check(self, &s.op, p)?;
            conclude(s, Some(r));
            Some(())
        });
        for s in live.iter_mut().filter(|s| !s.decided) {
            conclude(s, None);
        }
        drop(live);
        if let Some(e) = first_err {
            return Err(e);
        }
        // Splits of different writes: a write to these pages was in flight. Read each again on
        // its own (with the single-page backoff), now that this window's slots are free.
        for i in again {
            // SAFETY: every slot of the window was dropped: nothing else refers to the pages.
            let page = unsafe { &mut *base.add(i) };
            self.read_page_at(addr + (i * PAGE_SIZE) as u64, page, start)?;
        }
        Ok(taken)
    }

    /// Writes the first pages of `pages` (as many as one window holds); returns how many.
    fn write_window(&self, addr: u64, pages: &[Page], start: Instant) -> Result<usize, IoError> {
        let l = &self.layout;
        let mut live: Vec<WriteSlot<'_>> = Vec::with_capacity(pages.len().min(WINDOW));
        for (i, page) in pages.iter().enumerate().take(WINDOW) {
            let page_addr = addr + (i * PAGE_SIZE) as u64;
            let (range, pir) = self.locate(page_addr)?;
            let group = match self.ranges[range].load_full() {
                Some(g) => g,
                None => self.map_range(range)?,
            };
            let mut op = if live.is_empty() {
                self.slots.acquire_write()
            } else {
                match self.slots.try_acquire_write() {
                    Some(op) => op,
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
        for run in runs(&live, |a, b| {
            a.i + 1 == b.i && a.stamp.range == b.stamp.range && Arc::ptr_eq(&a.group, &b.group)
        }) {
            self.post_write_runs(run, pages);
            touched.note(&run[0].op, l.width);
        }
        touched.flush(self);
        let taken = live.last().map_or(0, |s| s.i + 1);
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
        self.wait_all(&mut live, start, |s, p| {
            let acked = p.landed.count_ones() as usize;
            if acked >= l.write_need {
                settle(s, true);
            } else if acked + (p.outstanding().count_ones() as usize) < l.write_need {
                settle(s, false);
            } else {
                return None;
            }
            Some(())
        });
        for s in live.iter_mut().filter(|s| !s.decided) {
            settle(s, false);
        }
        drop(live);
        for i in again {
            self.write_page(addr + (i * PAGE_SIZE) as u64, &pages[i])?;
        }
        Ok(taken)
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
                    self.transport
                        .post_read_run(node, wire_run, &mut cookies, false)
                },
            );
        }
    }

    /// Posts every split of a run of pages (`run`: consecutive pages of one group, their side
    /// buffers encoded): for each split, one run of consecutive slots to its node, each split
    /// with its page's version and checksum.
    fn post_write_runs(&self, run: &[WriteSlot<'_>], pages: &[Page]) {
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
                        let data = split_of(l, &pages[s.i], s.op.write_side(), j);
                        RunSplit {
                            cookie: s.op.cookie(j),
                            version: s.stamp.version,
                            crc: self.split_crc(data, s.stamp, j),
                            data,
                        }
                    });
                    self.transport
                        .post_write_run(node, wire_run, &mut splits, false)
                },
            );
        }
    }

    /// Posts split `j` of the consecutive pages of `items` (from byte `offset` in the slabs of
    /// `group`) as one run with `post`, after marking it posting in each page's operation. A
    /// run that cannot be posted (its node has none of the group's slabs, or the transport
    /// refuses it) fails that split of every page; their plans ask others or fail as a single
    /// page would.
    fn post_split_run<'o, S: 'o>(
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
    /// (`Some`), pacing like [`RemoteMemory::wait`]; returns at the deadline with the rest
    /// undecided.
    fn wait_all<S: Decided>(
        &self,
        live: &mut [S],
        start: Instant,
        mut decide: impl FnMut(&mut S, Progress) -> Option<()>,
    ) {
        let mut pacer = Pacer::new(&self.config, start);
        // What each operation looked like at its last undecided look: while the owner polls,
        // an operation whose splits have not moved since is looked at again only every
        // REVISIT passes (its time-based decisions — stragglers — run on milliseconds, a
        // polling pass on microseconds); after a park, every operation is looked at.
        let mut seen: Vec<Progress> = vec![Progress::default(); live.len()];
        let mut pass = 0u32;
        loop {
            let mut open = 0;
            pass = pass.wrapping_add(1);
            for (s, last) in live.iter_mut().zip(seen.iter_mut()) {
                if s.decided() {
                    continue;
                }
                let p = s.progress();
                if p == *last && !pass.is_multiple_of(REVISIT) && !pacer.parked() {
                    open += 1;
                    continue;
                }
                *last = p;
                if decide(s, p).is_none() {
                    open += 1;
                }
            }
            if open == 0 || !pacer.pause() {
                return;
            }
        }
    }
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
}

impl Decided for ReadSlot<'_> {
    fn decided(&self) -> bool {
        self.decided
    }
    fn progress(&self) -> Progress {
        self.op.progress()
    }
}

impl Decided for WriteSlot<'_> {
    fn decided(&self) -> bool {
        self.decided
    }
    fn progress(&self) -> Progress {
        self.op.progress()
    }
}
