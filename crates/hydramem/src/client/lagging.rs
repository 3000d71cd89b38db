//! Write stragglers (paper 4.1.1): a page write is not held up by one slow node. A split that
//! its node has not acknowledged [`ClientConfig::write_straggler_after`] after the write
//! started, while all the others are, is *left behind*: the write completes, a copy of the
//! split is kept, and the maintenance thread sends it again until its node acknowledges it.
//!
//! Invariants:
//! - a write leaves at most [`Layout::max_lagging`] splits behind: write_need − read_need − 1,
//!   so a completed page always has one split more than a read needs, of its version (hydra
//!   8+2 in failure recovery: one of ten; replication ×2, and any mode whose writes need no
//!   more than reads plus one, none: their writes wait as before);
//! - a left-behind split is resent with its page's version, so it can never overwrite a newer
//!   write of the page (the node refuses it as stale, which ends the resend), and an equal
//!   version landing twice is harmless;
//! - the queue is bounded ([`MAX_LAGGING`] splits); when it is full, writes wait for every
//!   acknowledgement as before;
//! - an entry ends when its node acknowledges or refuses the split, when the split moved to
//!   another slab (the node was declared failed and the slab is regenerated there: the
//!   regeneration rebuilds the split), or when the range was freed.
//!
//! [`ClientConfig::write_straggler_after`]: super::ClientConfig::write_straggler_after

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::slots::{self, Progress};
use super::write::{split_of, Stamp};
use super::{Group, Layout, Page, RemoteMemory};

/// Most splits left behind at once.
pub const MAX_LAGGING: usize = 4096;

/// How long the maintenance thread waits for a round's resent splits; those still unanswered
/// are tried again in a later round.
const RESEND_WAIT: Duration = Duration::from_millis(200);

/// Most splits resent in one round (slots taken only if free, so the data path never waits
/// for them).
const RESEND_BATCH: usize = 256;

/// One split left behind.
struct LagSplit {
    stamp: Stamp,
    split: usize,
    node: u16,
    slab: u32,
    data: Box<[u8]>,
}

/// The splits left behind, for the maintenance thread.
#[derive(Default)]
pub(super) struct Lagging {
    queue: Mutex<Vec<LagSplit>>,
    /// Splits left behind and not settled: those queued and those the maintenance thread is
    /// resending right now.
    count: AtomicUsize,
}

impl Lagging {
    /// Splits left behind and not settled yet.
    pub(super) fn len(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }
}

impl Layout {
    /// Most splits of one page write that may be left behind (see the module doc).
    pub fn max_lagging(&self) -> usize {
        self.write_need.saturating_sub(self.read_need + 1)
    }
}

impl RemoteMemory {
    /// Whether a write whose progress is `p` may complete now, leaving its missing splits
    /// behind: it started `write_straggler_after` ago, every split not acknowledged is still
    /// outstanding (none failed: failures go to the reroute path), few enough are missing, and
    /// the queue has room. If so, copies the missing splits of `page` (written with `op`'s
    /// side buffer at `stamp`, to `group`) into the queue and returns `true`.
    pub(super) fn leave_behind(
        &self,
        op: &slots::Op<'_>,
        group: &Group,
        page: &Page,
        stamp: Stamp,
        (p, start): (Progress, Instant),
    ) -> bool {
        let l = &self.layout;
        let missing = p.outstanding();
        let n = missing.count_ones() as usize;
        if n == 0
            || n > l.max_lagging()
            || p.failed != 0
            || p.landed.count_ones() as usize + n < l.write_need
            || start.elapsed() < self.config.write_straggler_after
        {
            return false;
        }
        let mut queue = self.lagging.queue.lock();
        if self.lagging.len() + n > MAX_LAGGING {
            return false;
        }
        self.lagging.count.fetch_add(n, Ordering::SeqCst);
        for j in (0..l.width).filter(|j| missing & (1 << j) != 0) {
            let data = split_of(l, page, op.write_side(), j);
            queue.push(LagSplit {
                stamp,
                split: j,
                node: group.nodes[j],
                slab: group.slabs[j],
                data: data.into(),
            });
        }
        drop(queue);
        self.stats
            .left_behind
            .fetch_add(n as u64, Ordering::Relaxed);
        metrics::counter!("hydramem_client_write_splits_left_behind_total").increment(n as u64);
        tracing::debug!(
            range = stamp.range,
            page = stamp.pir,
            splits = n,
            "write completed without a straggling node's acknowledgement; resending in the background"
        );
        true
    }

    /// Splits left behind and not yet acknowledged.
    pub fn lagging_splits(&self) -> usize {
        self.lagging.len()
    }

    /// Sends the splits left behind again (the maintenance thread, every round): up to
    /// [`RESEND_BATCH`] at once, each on a slot of its own, all posted and then waited for
    /// together for at most [`RESEND_WAIT`], so that a node still slow never holds the
    /// maintenance thread for long; those neither acknowledged nor refused as stale go back
    /// to the queue for a later round.
    pub(super) fn resend_lagging(&self) {
        let batch: Vec<LagSplit> = {
            let mut q = self.lagging.queue.lock();
            let n = q.len().min(RESEND_BATCH);
            q.drain(..n).collect()
        };
        if batch.is_empty() {
            return;
        }
        let mut sent = Vec::with_capacity(batch.len());
        let mut retry = Vec::new();
        let mut nodes = Vec::new();
        for s in batch {
            let current = self.ranges[s.stamp.range]
                .load_full()
                .filter(|g| g.nodes[s.split] == s.node && g.slabs[s.split] == s.slab);
            let Some(group) = current else {
                // Moved: the new slab is regenerated from the other splits.
                self.lagging.count.fetch_sub(1, Ordering::SeqCst);
                continue;
            };
            match self.post_lagging(&s, &group) {
                Some(op) => {
                    if !nodes.contains(&s.node) {
                        nodes.push(s.node);
                    }
                    sent.push((s, op));
                }
                None => retry.push(s),
            }
        }
        for node in nodes {
            let _ = self.transport.flush(node);
        }
        let deadline = Instant::now() + RESEND_WAIT;
        while !sent.is_empty() {
            let mut i = 0;
            while i < sent.len() {
                let (s, op) = &sent[i];
                let p = op.progress();
                let bit = 1 << s.split;
                if p.landed & bit != 0 || op.stale_version() > s.stamp.version {
                    // Acknowledged, or refused as stale: a newer write of the page got there.
                    self.lagging.count.fetch_sub(1, Ordering::SeqCst);
                    metrics::counter!("hydramem_client_write_splits_caught_up_total").increment(1);
                    sent.swap_remove(i);
                } else if p.failed & bit != 0 {
                    retry.push(sent.swap_remove(i).0);
                } else {
                    i += 1;
                }
            }
            if sent.is_empty() || Instant::now() >= deadline {
                break;
            }
            std::thread::park_timeout(Duration::from_millis(5));
        }
        retry.extend(sent.into_iter().map(|(s, _)| s));
        if !retry.is_empty() {
            self.lagging.queue.lock().extend(retry);
        }
    }

    /// Posts one left-behind split to `group` (still the split's node and slab), unflushed,
    /// on a slot of its own; `None` when its node is down, no slot is free or the post failed.
    fn post_lagging(&self, s: &LagSplit, group: &Group) -> Option<slots::Op<'_>> {
        if !self.transport.is_up(s.node) {
            return None;
        }
        let op = self.slots.try_acquire_write()?;
        self.post_split_write(&op, group, (s.split, 0), &s.data, s.stamp, false);
        (op.progress().failed & (1 << s.split) == 0).then_some(op)
    }
}
