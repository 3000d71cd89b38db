//! The read path (paper 4.1, late binding): post k + Δ split reads to nodes chosen at random
//! among those up; splits land directly in the caller's page (data) or the slot's side buffer
//! (parity); once k of one version are in, close the operation and decode the missing data
//! splits in place. Ask more when requests fail or a straggler holds the page up past
//! `straggler_after`; fail only when fewer than k can arrive. No heap allocation per page.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use super::check::Look;
use super::layout::MAX_WIDTH;
use super::slots::{self};
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

impl RemoteMemory {
    /// Reads one page. A page never written reads as zeros.
    ///
    /// Only splits of one version are ever combined (see docs/architecture.md, "Versions"). If
    /// the splits that arrive belong to different writes — a write to the page is in flight —
    /// the read is repeated, up to `op_timeout`; it never returns mixed bytes.
    pub fn read_page(&self, addr: u64, page: &mut Page) -> Result<(), IoError> {
        let start = Instant::now();
        let r = self.read_page_at(addr, page, start);
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
        let l = &self.layout;
        let offset = l.split_offset(pir);
        // SAFETY: `page` is exclusively borrowed for this whole call and `op` is dropped before
        // it returns; this function touches the page only after `op.close()` (decoding,
        // checking), and `second_look` closes again before it does (see `Op::reopen`).
        let mut op = unsafe { self.slots.acquire_read(page.as_mut_ptr()) };
        op.bind(range as u64, pir);
        // Candidate splits: those whose node is up, in random order.
        // Regenerated splits first, in random order; then (coded schemes only) the splits
        // still being regenerated, which may lack older pages.
        let mut order = [0u8; MAX_WIDTH];
        let mut n = 0;
        let mut settled = 0;
        for fresh in [false, true] {
            if fresh && !l.coded() {
                break;
            }
            for j in 0..l.width {
                let node = group.nodes[j];
                if (group.fresh & (1 << j) != 0) == fresh
                    && node != slots::NO_NODE
                    && self.transport.is_up(node)
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
        let mut next = 0;
        // Posts the splits in `again` anew, then up to `count` splits not asked yet; returns
        // how many requests went out.
        let mut post_more = |op: &slots::Op<'_>, count: usize, again: u32| -> usize {
            let post = |j: usize| {
                let node = group.nodes[j];
                op.posting(j, node);
                let e = Entry {
                    slab: group.slabs[j],
                    len: l.split_len as u32,
                    offset,
                    cookie: op.cookie(j),
                    version: 0,
                    crc: 0,
                };
                let ok = self.transport.post_read(node, e, true).is_ok();
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
            while asked < count && next < n {
                let j = order[next] as usize;
                next += 1;
                let ok = post(j);
                asked += ok;
                posted += ok;
            }
            posted
        };
        let fanout = self.initial_fanout(&group);
        post_more(&op, fanout, 0);
        let op_start = Instant::now();
        let mut straggler_check = op_start + self.config.straggler_after;
        let width = l.width;
        // A checking read (detection, correction) needs k + Δ splits of one version. With
        // fewer settled ones (more than r − Δ of the group's nodes down or regenerating),
        // checksums still verify every split, so k verified ones are as safe as ever; without
        // checksums the read waits for regeneration (or fails) rather than return bytes that
        // nothing checked.
        let mut need = if l.detects() && settled < l.read_need && self.config.checksums {
            l.k
        } else {
            l.read_need
        };
        let result = self.wait(&op, start, |p| {
            // The largest set of landed splits that share one version.
            let got = match op.consistent(p.landed, width, need) {
                Ok(_) => return Some(Ok(())),
                Err(largest) => largest,
            };
            let pending = p.outstanding().count_ones() as usize;
            let now = Instant::now();
            if now >= straggler_check {
                // Late binding did not hide the straggler: widen the request by what is missing.
                straggler_check = now + self.config.straggler_after;
                let more = post_more(&op, need - got, 0);
                self.stats
                    .reissued
                    .fetch_add(more as u64, Ordering::Relaxed);
                self.metrics.reissued.increment(more as u64);
                if more > 0 {
                    return None;
                }
            }
            if got + pending < need {
                let more = post_more(&op, need - got - pending, 0);
                if more > 0 {
                    self.stats
                        .reissued
                        .fetch_add(more as u64, Ordering::Relaxed);
                    self.metrics.reissued.increment(more as u64);
                    return None;
                }
                if pending == 0 {
                    // A node failed during the read (before the client knew it was down):
                    // with checksums, k verified splits still make a safe page.
                    if l.detects() && self.config.checksums && need > l.k {
                        need = l.k;
                        if op.consistent(p.landed, width, need).is_ok() {
                            return Some(Ok(()));
                        }
                    }
                    return Some(Err(p.landed.count_ones() as usize >= need));
                }
            }
            None
        });
        let p = op.close();
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        self.count_reads(&op, p.landed | p.corrupt);
        if p.corrupt != 0 {
            self.count_corrupt(&op, p.corrupt, addr, wire::CorruptCause::Checksum);
        }
        match result {
            Some(Ok(())) => {
                let (version, mask) = op
                    .consistent(p.landed, width, need)
                    .expect("a consistent set was found before closing");
                self.finish_read(&mut op, page, mask);
                if l.detects() && !self.codeword_holds(&mut op, page, mask) {
                    let first = Look {
                        addr,
                        range,
                        version,
                        mask,
                        start,
                        before: p,
                    };
                    return self.second_look(&mut op, page, first, &mut post_more);
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
                nodes: self.describe_group(&group, &op, p),
            }),
            None => Err(IoError::Timeout {
                what: "read",
                addr,
                range: range as u64,
                waited: start.elapsed(),
                nodes: self.describe(&op, p.outstanding()),
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
