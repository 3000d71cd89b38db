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
//!
//! Reading is in `read.rs` and writing in `write.rs`; this file holds what both share: the
//! window's size, how a window takes its slots ([`Taking`]), the checks of the addresses a
//! call names, posting one split of consecutive pages as a run, and waiting for the pages of a
//! window ([`RemoteMemory::wait_all`]).

use std::time::Instant;

use super::slots::{self, Progress};
use super::transport::TransportError;
use super::wait::{NodeSet, Pacer};
use super::{Group, IoError, RemoteMemory};
use crate::wire::Run;
use crate::PAGE_SIZE;

mod read;
mod write;

pub(super) use read::ReadWindow;
pub(super) use write::WriteWindow;

/// Most pages one window of a call keeps in flight (1 MiB, the largest request a kernel block
/// layer or NBD client usually sends); longer calls go window after window.
pub const WINDOW: usize = 256;

/// Passes of [`RemoteMemory::wait_all`] between two looks at an operation that did not move.
const REVISIT: u32 = 16;

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
    /// Its operation.
    fn op(&self) -> &slots::Op<'_>;
    /// Its operation's progress now.
    fn progress(&self) -> Progress {
        self.op().progress()
    }
    /// The node of its split `j`.
    fn node_of(&self, j: usize) -> u16 {
        self.op().node_of(j)
    }
}
