//! Checks and correction of a read's splits (paper 4.1.2): after the first k splits of one
//! version landed, detection and correction modes ask for more and test that they form one
//! codeword; correction finds the codeword most splits agree with ([`super::correct`]) and
//! names the corrupted splits. Invariant: bytes that did not pass the mode's check are never
//! handed out — the read ends in [`super::IoError::Corrupt`] instead.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::read::ReadOutcome;
use super::slots::{self, Progress};
use super::wait::describe_mask;
use super::write::encode_parity;
use super::{correct, layout, IoError, Page, RemoteMemory};
use crate::wire::{self};
use crate::PAGE_SIZE;

/// What the first look of a checked read found, for [`RemoteMemory::second_look`].
pub(super) struct Look {
    pub(super) addr: u64,
    pub(super) range: usize,
    /// The version whose splits were checked.
    pub(super) version: u64,
    /// Those splits.
    pub(super) mask: u32,
    /// When the read started (its deadline runs from here).
    pub(super) start: Instant,
    /// The slot's progress when the first look closed.
    pub(super) before: Progress,
}

impl RemoteMemory {
    /// A read whose first k + Δ splits disagree (paper 4.1.2): asks Δ + 1 more (up to
    /// k + 2Δ + 1, or all there are), then looks for the one codeword that enough of them
    /// agree with ([`correct`]). Correction mode returns that page and names the corrupted
    /// splits; detection mode uses the second look only to name the corrupted node (possible
    /// when the group is wide enough) and still answers with an error.
    pub(super) fn second_look(
        &self,
        op: &mut slots::Op<'_>,
        page: &mut Page,
        first: Look,
        post_more: &mut dyn FnMut(&slots::Op<'_>, usize, u32) -> usize,
    ) -> Result<ReadOutcome, IoError> {
        let l = &self.layout;
        let codec = self
            .codec
            .as_ref()
            .expect("only coded reads check codewords");
        let target = (l.k + 2 * l.delta() + 1).min(l.width);
        // SAFETY: `page` (the one the read's slot was acquired for) is not touched from here
        // until `op.close()` below; only the posting of split reads happens in between.
        unsafe { op.reopen() };
        self.gather_more(op, &first, target, post_more);
        let p = op.close();
        self.count_reads(
            op,
            (p.landed | p.corrupt) & !(first.before.landed | first.before.corrupt),
        );
        let fresh_corrupt = p.corrupt & !first.before.corrupt;
        if fresh_corrupt != 0 {
            self.count_corrupt(op, fresh_corrupt, first.addr, wire::CorruptCause::Checksum);
        }
        let version = first.version;
        let mask = op.of_version(p.landed, l.width, version);
        let newer = (0..l.width).any(|j| p.landed & (1 << j) != 0 && op.version_of(j) > version);
        let s = l.split_len;
        let outcome = {
            let side: &[u8] = op.side();
            let received: Vec<Option<&[u8]>> = (0..l.width)
                .map(|j| {
                    (mask & (1 << j) != 0).then(|| match l.place(j) {
                        layout::Place::Page(off) => &page[off..off + s],
                        layout::Place::Side(off) => &side[off..off + s],
                    })
                })
                .collect();
            correct::correct(codec, &received, s)
        };
        let nodes = self.describe(op, mask);
        match outcome {
            Ok(c) => {
                self.count_corrupt(op, c.corrupt, first.addr, wire::CorruptCause::Codeword);
                if l.corrects() {
                    page.copy_from_slice(&c.splits[..PAGE_SIZE]);
                    self.stats.corrected.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!("hydramem_client_reads_corrected_total").increment(1);
                    return Ok(ReadOutcome::Done);
                }
                page.fill(0);
                self.stats.corrupt_detected.fetch_add(1, Ordering::Relaxed);
                Err(IoError::Corrupt {
                    addr: first.addr,
                    range: first.range as u64,
                    splits: first.mask.count_ones() as usize,
                    nodes,
                    why: format!(
                        "Detection mode does not correct (split(s) {} were the corrupted ones)",
                        describe_mask(c.corrupt)
                    ),
                })
            }
            // Splits of a newer write arrived: a write is in flight, read again.
            Err(_) if newer => {
                page.fill(0);
                Ok(ReadOutcome::Inconsistent {
                    range: first.range as u64,
                })
            }
            Err(e) => {
                page.fill(0);
                self.stats.corrupt_detected.fetch_add(1, Ordering::Relaxed);
                Err(IoError::Corrupt {
                    addr: first.addr,
                    range: first.range as u64,
                    splits: mask.count_ones() as usize,
                    nodes,
                    why: uncorrectable(l.corrects(), e),
                })
            }
        }
    }

    /// The second look's reads: asks again the splits whose replies came while the slot was
    /// closed for the first look (they were dropped), then more, until `target` splits of the
    /// first look's version landed or none is left to ask (or the read's deadline).
    fn gather_more(
        &self,
        op: &slots::Op<'_>,
        first: &Look,
        target: usize,
        post_more: &mut dyn FnMut(&slots::Op<'_>, usize, u32) -> usize,
    ) {
        let width = self.layout.width;
        // A reply that still comes lands once: the first claim wins.
        post_more(op, 0, first.before.outstanding());
        self.wait_polling_from(op, first.start, Instant::now(), |p| {
            let got = op.of_version(p.landed, width, first.version).count_ones() as usize;
            if got >= target {
                return Some(());
            }
            let pending = p.outstanding().count_ones() as usize;
            if got + pending < target && post_more(op, target - got - pending, 0) > 0 {
                return None;
            }
            (pending == 0).then_some(())
        });
    }

    /// Corruption detection, after [`Self::finish_read`] put the page together from k of the
    /// splits in `mask`: re-encodes the parity from the page and compares it with every parity
    /// split in `mask`. The splits used to decode agree by construction; every other one is a
    /// check, so with k + Δ splits up to Δ corrupted ones are always caught (any two codewords
    /// differ in at least r + 1 splits). Allocation-free: the parity is re-encoded into the
    /// side buffer's check area.
    pub(super) fn codeword_holds(&self, op: &mut slots::Op<'_>, page: &Page, mask: u32) -> bool {
        let Some(codec) = &self.codec else {
            return true;
        };
        let l = &self.layout;
        let (s, k, r) = (l.split_len, l.k, l.width - l.k);
        let side = op.side();
        let (front, check) = side.split_at_mut(l.check_offset());
        let ntail = k - l.full_data;
        let (tail, parity) = front.split_at(ntail * s);
        encode_parity(codec, l, page, tail, check);
        (0..r).all(|p| {
            let at = p * s..(p + 1) * s;
            mask & (1 << (k + p)) == 0 || check[at.clone()] == parity[at]
        })
    }
}

/// Why a second look could not single out the corrupted splits (`corrects`: the mode is
/// correction), for the error a user sees.
fn uncorrectable(corrects: bool, e: correct::Uncorrectable) -> String {
    match e {
        _ if !corrects => "Detection mode does not correct, and the splits it could read do not \
                           single out the corrupted one"
            .to_string(),
        correct::Uncorrectable::TooFew { received } => format!(
            "Only {received} splits of this version could be read, too few to find the corrupted ones"
        ),
        correct::Uncorrectable::TooManyErrors { received, best } => format!(
            "At most {best} of the {received} splits read agree on one page: more were corrupted \
             than correction mode can correct"
        ),
        correct::Uncorrectable::TooManyTrials => {
            "The search for the corrupted splits gave up".to_string()
        }
    }
}
