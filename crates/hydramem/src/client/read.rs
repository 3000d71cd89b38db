//! The read path (paper 4.1, late binding): post k + Δ split reads to nodes chosen at random
//! among those up; splits land directly in the caller's page (data) or the slot's side buffer
//! (parity); once k of one version are in, close the operation and decode the missing data
//! splits in place. Ask more when requests fail or a straggler holds the page up past
//! `straggler_after`; fail only when fewer than k can arrive. No heap allocation per page.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use super::check::Look;
use super::layout::MAX_WIDTH;
use super::slots::{self, Progress};
use super::{Group, IoError, Page, RemoteMemory};
use crate::wire::{self, Entry};
use crate::PAGE_SIZE;

/// How one read attempt ended, when it did not fail.
pub(super) enum ReadOutcome {
    /// The page is in the caller's buffer.
    Done,
    /// k splits arrived but of different versions: try again.
    Inconsistent { range: u64 },
}

thread_local! {
    static RNG: std::cell::RefCell<rand::rngs::SmallRng> =
        std::cell::RefCell::new(rand::rngs::SmallRng::from_os_rng());
}

/// The splits a read plan asked first, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Asked {
    order: [u8; MAX_WIDTH],
    n: usize,
}

impl Asked {
    /// The split indices.
    pub(super) fn splits(&self) -> impl Iterator<Item = usize> + '_ {
        self.order[..self.n].iter().map(|&j| j as usize)
    }
}

/// A read plan: which splits of one page to ask, in what order, and when to ask more.
///
/// Candidates are the splits whose node is up: settled splits first, in random order (late
/// binding spreads reads over the group), then splits still being regenerated, which may lack
/// older pages — for replicas only when no settled copy is up, since no other copy outvotes a
/// replacement's answer: then a page the replacements do not have (version 0) is lost with the
/// copies that had it, not a page of zeros (a replica that no surviving copy can regenerate,
/// the only copy of `single`, stays a replacement for good, and serves the pages written since
/// it was placed). The plan first asks the layout's fanout (k + Δ, wider when a node of the
/// group is suspect), then asks more when requests fail or when `straggler_after` passed
/// without k splits of one version.
pub(super) struct ReadPlan {
    pub(super) group: Arc<Group>,
    pub(super) range: usize,
    offset: u64,
    order: [u8; MAX_WIDTH],
    /// Candidates in `order`.
    n: usize,
    /// The next candidate to ask.
    next: usize,
    /// Splits this read needs of one version.
    pub(super) need: usize,
    straggler_check: Instant,
}

impl ReadPlan {
    /// The plan for page `pir` of `range`, mapped to `group`.
    pub(super) fn new(c: &RemoteMemory, group: Arc<Group>, range: usize, pir: u64) -> ReadPlan {
        let l = &c.layout;
        let mut order = [0u8; MAX_WIDTH];
        let mut n = 0;
        let mut settled = 0;
        for fresh in [false, true] {
            if fresh && !l.coded() && n > 0 {
                break;
            }
            for j in 0..l.width {
                let node = group.nodes[j];
                if (group.fresh & (1 << j) != 0) == fresh
                    && node != slots::NO_NODE
                    && c.transport.is_up(node)
                {
                    order[n] = j as u8;
                    n += 1;
                }
            }
            if !fresh {
                settled = n;
            }
        }
        RNG.with(|r| {
            let mut r = r.borrow_mut();
            for i in (1..settled).rev() {
                order.swap(i, r.random_range(0..=i));
            }
            for i in (settled + 1..n).rev() {
                order.swap(i, r.random_range(settled..=i));
            }
        });
        // A checking read (detection, correction) needs k + Δ splits of one version. With
        // fewer settled ones (more than r − Δ of the group's nodes down or regenerating),
        // checksums still verify every split, so k verified ones are as safe as ever; without
        // checksums the read waits for regeneration (or fails) rather than return bytes that
        // nothing checked.
        let need = if l.detects() && settled < l.read_need && c.config.checksums {
            l.k
        } else {
            l.read_need
        };
        ReadPlan {
            group,
            range,
            offset: l.split_offset(pir),
            order,
            n,
            next: 0,
            need,
            straggler_check: Instant::now() + c.config.straggler_after,
        }
    }

    /// The plan for the page after `prev`'s, in the same range and group: the same splits in
    /// the same order, so that the pages of a window ask the same splits of consecutive slots
    /// and each node gets one run ([`super::batch`]).
    pub(super) fn next_page(prev: &ReadPlan, c: &RemoteMemory) -> ReadPlan {
        ReadPlan {
            group: prev.group.clone(),
            offset: prev.offset + c.layout.split_len as u64,
            next: 0,
            straggler_check: Instant::now() + c.config.straggler_after,
            ..*prev
        }
    }

    /// Byte offset of the page's splits in their slabs.
    pub(super) fn offset(&self) -> u64 {
        self.offset
    }

    /// Posts the first requests (the fanout); with `flush == false` they wait in the
    /// transport's queues for the caller to flush the group's nodes.
    pub(super) fn start(&mut self, c: &RemoteMemory, op: &slots::Op<'_>, flush: bool) {
        let fanout = c.initial_fanout(&self.group);
        self.post_more(c, op, fanout, 0, flush);
        self.straggler_check = Instant::now() + c.config.straggler_after;
    }

    /// Takes the first `fanout` candidates as asked without posting them, for a caller that
    /// posts them itself as runs (and marks a run it could not post as failed, which
    /// [`ReadPlan::check`] answers by asking further candidates); returns them, in order.
    pub(super) fn take_first(&mut self, c: &RemoteMemory, fanout: usize) -> Asked {
        let n = fanout.min(self.n);
        self.next = n;
        self.straggler_check = Instant::now() + c.config.straggler_after;
        Asked {
            order: self.order,
            n,
        }
    }

    /// Posts the splits in `again` anew, then up to `count` splits not asked yet; returns how
    /// many requests went out.
    pub(super) fn post_more(
        &mut self,
        c: &RemoteMemory,
        op: &slots::Op<'_>,
        count: usize,
        again: u32,
        flush: bool,
    ) -> usize {
        let l = &c.layout;
        let post = |j: usize| {
            let node = self.group.nodes[j];
            op.posting(j, node);
            let e = Entry {
                slab: self.group.slabs[j],
                len: l.split_len as u32,
                offset: self.offset,
                cookie: op.cookie(j),
                version: 0,
                crc: 0,
                tag: 0,
            };
            let ok = c.transport.post_read(node, e, flush).is_ok();
            if !ok {
                op.post_failed(j);
            }
            ok as usize
        };
        let mut posted = (0..l.width)
            .filter(|j| again & (1 << j) != 0)
            .map(post)
            .sum();
        let mut asked = 0;
        while asked < count && self.next < self.n {
            let j = self.order[self.next] as usize;
            self.next += 1;
            let ok = post(j);
            asked += ok;
            posted += ok;
        }
        posted
    }

    /// One look at the read's progress `p`: `Some(Ok)` once `need` splits of one version are
    /// in; `Some(Err(true))` when enough arrived but of different writes; `Some(Err(false))`
    /// when too few can still arrive; `None` to keep waiting (after asking more if a request
    /// failed or a straggler holds the page up).
    pub(super) fn check(
        &mut self,
        c: &RemoteMemory,
        op: &slots::Op<'_>,
        p: Progress,
    ) -> Option<Result<(), bool>> {
        let l = &c.layout;
        // The largest set of landed splits that share one version.
        let got = match op.consistent(p.landed, l.width, self.need) {
            Ok((0, copies)) if !l.coded() && copies & !self.group.fresh == 0 => {
                // Only replacement copies answered, and they do not have the page: it was lost
                // with the copies that had it (see the type's doc).
                for j in (0..l.width).filter(|j| copies & (1 << j) != 0) {
                    op.retry(j);
                }
                return Some(Err(false));
            }
            Ok(_) => return Some(Ok(())),
            Err(largest) => largest,
        };
        let pending = p.outstanding().count_ones() as usize;
        let now = Instant::now();
        if now >= self.straggler_check {
            // Late binding did not hide the straggler: widen the request by what is missing.
            self.straggler_check = now + c.config.straggler_after;
            let more = self.post_more(c, op, self.need - got, 0, true);
            c.count_reissued(more);
            if more > 0 {
                return None;
            }
        }
        if got + pending < self.need {
            let more = self.post_more(c, op, self.need - got - pending, 0, true);
            if more > 0 {
                c.count_reissued(more);
                return None;
            }
            if pending == 0 {
                // A node failed during the read (before the client knew it was down):
                // with checksums, k verified splits still make a safe page.
                if l.detects() && c.config.checksums && self.need > l.k {
                    self.need = l.k;
                    if op.consistent(p.landed, l.width, self.need).is_ok() {
                        return Some(Ok(()));
                    }
                }
                return Some(Err(p.landed.count_ones() as usize >= self.need));
            }
        }
        None
    }
}

impl RemoteMemory {
    /// Reads one page. A page never written reads as zeros.
    ///
    /// Only splits of one version are ever combined (see docs/architecture.md, "Versions"). If
    /// the splits that arrive belong to different writes — a write to the page is in flight —
    /// the read is repeated, up to `op_timeout`; it never returns mixed bytes.
    pub fn read_page(&self, addr: u64, page: &mut Page) -> Result<(), IoError> {
        let start = Instant::now();
        let r = if self.config.ablation.bounce {
            let mut bounce: Page = [0; PAGE_SIZE];
            let r = self.read_page_at(addr, &mut bounce, start);
            page.copy_from_slice(&bounce);
            r
        } else {
            self.read_page_at(addr, page, start)
        };
        self.metrics
            .read_seconds
            .record(start.elapsed().as_secs_f64());
        if r.is_err() {
            self.metrics.read_errors.increment(1);
        }
        r
    }

    pub(super) fn read_page_at(
        &self,
        addr: u64,
        page: &mut Page,
        start: Instant,
    ) -> Result<(), IoError> {
        let mut backoff = Duration::from_micros(20);
        loop {
            match self.read_once(addr, page, start)? {
                ReadOutcome::Done => return Ok(()),
                ReadOutcome::Inconsistent { range } => {
                    self.stats.retries.fetch_add(1, Ordering::Relaxed);
                    if start.elapsed() + backoff >= self.config.op_timeout {
                        return Err(IoError::Inconsistent {
                            addr,
                            range,
                            waited: start.elapsed(),
                        });
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(10));
                }
            }
        }
    }

    pub(super) fn read_once(
        &self,
        addr: u64,
        page: &mut Page,
        start: Instant,
    ) -> Result<ReadOutcome, IoError> {
        let (range, pir) = self.locate(addr)?;
        let Some(group) = self.ranges[range].load_full() else {
            page.fill(0);
            self.stats.reads.fetch_add(1, Ordering::Relaxed);
            return Ok(ReadOutcome::Done);
        };
        // SAFETY: `page` is exclusively borrowed for this whole call and `op` is dropped before
        // it returns; this function touches the page only after `op.close()` (decoding,
        // checking), and `second_look` closes again before it does (see `Op::reopen`).
        let mut op = unsafe { self.slots.acquire_read(page.as_mut_ptr()) };
        let mut plan = ReadPlan::new(self, group, range, pir);
        op.bind(range as u64, pir);
        plan.start(self, &op, true);
        // Polled from here, not from `start`: posting k + Δ splits takes most of a poll window.
        let posted = Instant::now();
        let result = self.wait_polling_from(&op, start, posted, |p| plan.check(self, &op, p));
        self.conclude_read(&mut plan, &mut op, page, addr, start, result)
    }

    /// Ends a read whose wait decided (`result`, as [`ReadPlan::check`] returns it; `None`:
    /// timed out): closes the slot, counts, decodes in place, and runs the mode's checks.
    pub(super) fn conclude_read(
        &self,
        plan: &mut ReadPlan,
        op: &mut slots::Op<'_>,
        page: &mut Page,
        addr: u64,
        start: Instant,
        result: Option<Result<(), bool>>,
    ) -> Result<ReadOutcome, IoError> {
        let l = &self.layout;
        let width = l.width;
        let range = plan.range;
        let p = op.close();
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        self.count_reads(op, p.landed | p.corrupt);
        if p.corrupt != 0 {
            self.count_corrupt(op, p.corrupt, addr, wire::CorruptCause::Checksum);
        }
        match result {
            Some(Ok(())) => {
                let (version, mask) = op
                    .consistent(p.landed, width, plan.need)
                    .expect("a consistent set was found before closing");
                self.finish_read(op, page, mask);
                if l.detects() && !self.codeword_holds(op, page, mask) {
                    let first = Look {
                        addr,
                        range,
                        version,
                        mask,
                        start,
                        before: p,
                    };
                    let mut more = |op: &slots::Op<'_>, count: usize, again: u32| {
                        plan.post_more(self, op, count, again, true)
                    };
                    return self.second_look(op, page, first, &mut more);
                }
                Ok(ReadOutcome::Done)
            }
            // Enough splits arrived but from different writes: a write is in flight.
            Some(Err(true)) => Ok(ReadOutcome::Inconsistent {
                range: range as u64,
            }),
            Some(Err(false)) => Err(IoError::Unavailable {
                what: "read",
                addr,
                range: range as u64,
                needed: l.read_need,
                got: p.landed.count_ones() as usize,
                nodes: self.describe_group(&plan.group, op, p),
            }),
            None => Err(IoError::Timeout {
                what: "read",
                addr,
                range: range as u64,
                waited: start.elapsed(),
                nodes: self.describe(op, p.outstanding()),
            }),
        }
    }

    /// How many splits a read of `group` asks at once: the layout's fanout, or (paper 4.1.2)
    /// every split it may need when one of the group's nodes is above the
    /// ErrorCorrectionLimit, so that finding its corruption costs no second round trip.
    pub(super) fn initial_fanout(&self, group: &Group) -> usize {
        let l = &self.layout;
        if !self.any_suspect.load(Ordering::Relaxed) || !(l.corrects() || self.config.checksums) {
            return l.read_fanout;
        }
        let suspect = group.nodes[..l.width].iter().any(|&n| {
            n != slots::NO_NODE && self.health[n as usize].suspect.load(Ordering::Relaxed)
        });
        if !suspect {
            return l.read_fanout;
        }
        self.stats.wide_reads.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("hydramem_client_wide_reads_total").increment(1);
        let wide = if l.corrects() {
            l.k + 2 * l.delta() + 1
        } else {
            l.read_fanout + 1
        };
        wide.min(l.width)
    }

    /// Counts split reads asked again (after a failure or past a straggler).
    pub(super) fn count_reissued(&self, more: usize) {
        if more > 0 {
            self.stats
                .reissued
                .fetch_add(more as u64, Ordering::Relaxed);
            self.metrics.reissued.increment(more as u64);
        }
    }

    /// Counts the splits a read got (intact or not) against their nodes, the denominator of
    /// the per-node error rates. Only clients that can find corruption keep the accounts.
    pub(super) fn count_reads(&self, op: &slots::Op<'_>, got: u32) {
        if !(self.config.checksums || self.layout.detects()) {
            return;
        }
        for j in 0..self.layout.width {
            if got & (1 << j) != 0 {
                if let Some(h) = self.health.get(op.node_of(j) as usize) {
                    h.reads.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Decodes in place after a read closed with `landed`: k or more splits of one version.
    pub(super) fn finish_read(&self, op: &mut slots::Op<'_>, page: &mut Page, landed: u32) {
        let Some(codec) = &self.codec else { return };
        let l = &self.layout;
        let s = l.split_len;
        let k = l.k;
        let data_mask = (1u32 << k) - 1;
        let side = op.side();
        if landed & data_mask != data_mask {
            self.stats.decodes.fetch_add(1, Ordering::Relaxed);
            // Present: the first k landed splits (data first); missing: the data splits not in.
            let (page_parts, _) = page.split_at_mut(l.full_data * s);
            let mut parts: [Option<&mut [u8]>; MAX_WIDTH] = std::array::from_fn(|_| None);
            for (j, c) in page_parts.chunks_exact_mut(s).enumerate() {
                parts[j] = Some(c);
            }
            for (t, c) in side.chunks_exact_mut(s).enumerate() {
                parts[l.full_data + t] = Some(c);
            }
            let mut present: [(usize, &[u8]); MAX_WIDTH] = [(0, &[]); MAX_WIDTH];
            let mut missing: [(usize, &mut [u8]); MAX_WIDTH] =
                std::array::from_fn(|_| (0, &mut [][..]));
            let (mut np, mut nm) = (0, 0);
            for (j, part) in parts.iter_mut().enumerate().take(l.width) {
                let is_landed = landed & (1 << j) != 0;
                if is_landed && np < k {
                    present[np] = (j, part.take().expect("each split once"));
                    np += 1;
                } else if !is_landed && j < k {
                    missing[nm] = (j, part.take().expect("each split once"));
                    nm += 1;
                }
            }
            codec
                .reconstruct(&present[..np], &mut missing[..nm])
                .expect("k landed splits of a valid layout always decode");
        }
        // Data splits that reach past the page were landed/decoded in the side buffer.
        let tail = l.full_data * s;
        if tail < PAGE_SIZE {
            page[tail..].copy_from_slice(&op.side()[..PAGE_SIZE - tail]);
        }
    }
}
