//! In-flight page operations and the landing protocol that keeps late splits out of pages.
//!
//! Every page read or write in flight owns one [`Slot`] of a fixed table allocated when the
//! client starts, so the data path never allocates. A split request carries a 64-bit cookie
//! (slot index, slot generation, split index) that the node echoes; the transport hands each
//! reply to [`Slots::read_done`] / [`Slots::write_done`], which find the slot by index in O(1).
//!
//! A reply is trusted only as far as it matches what was asked: its cookie must name a slot in
//! use at that generation, the split must have been posted to the very node the reply came
//! from, and the reply's operation must be the slot's (a READV reply for a write's slot, or a
//! WRITEV reply for a read's, is dropped). Replies that fail the node or operation check are
//! counted ([`Slots::foreign_replies`]): a confused or hostile node can neither land bytes
//! through another operation's pointers nor complete other nodes' splits.
//!
//! The landing protocol (the user-space analogue of Hydra deregistering the RDMA memory region
//! once k splits are in):
//! 1. a completer announces itself (`writers += 1`), then checks that the slot still has the
//!    cookie's generation, is not closed, was posted to the replying node and is of the
//!    reply's operation; otherwise it backs out and drops the split;
//! 2. it claims the split's landing region (first claim wins: copies of a replicated page share
//!    one region), copies the bytes, sets the split's `landed` bit, then `writers -= 1`;
//! 3. the owner, once enough splits are in, sets `closed` and waits for `writers == 0`.
//!
//! All steps use sequentially consistent atomics, so a completer either finished its copy before
//! the owner's wait ended or saw `closed` and never touched the page: after step 3 no late split
//! can write into the caller's page or side buffer, and the owner may decode in place. The
//! generation, bumped on release, makes replies to a previous use of the slot harmless.
//!
//! With checksums on ([`Slots::with_checksums`]), a completer verifies a read split against
//! its checksum and the page the slot is bound to ([`Op::bind`]) *before* it claims a landing
//! region: a split that fails never touches the page, counts as failed (so the read asks
//! another) and is marked corrupt, so that the owner can name the node that returned it.

use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering::SeqCst,
};
use std::thread::Thread;

use parking_lot::{Condvar, Mutex};

use super::layout::{Layout, Place, MAX_WIDTH};
use super::transport::Completions;
use crate::integrity;
use crate::wire::Status;

/// Marks a split that was not posted to any node (node indices are below it: a cluster has at
/// most [`crate::cluster::MAX_NODES`] nodes).
pub const NO_NODE: u16 = u16::MAX;
/// Most slots a table has: the cookie's slot field is 16 bits.
pub const MAX_SLOTS: usize = 1 << 16;

/// What a slot's operation is (a reply must be of the same kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A page read: splits land in the caller's page.
    Read = 1,
    /// A page write: replies only acknowledge.
    Write = 2,
}
const GEN_BITS: u32 = 40;
const GEN_MASK: u64 = (1 << GEN_BITS) - 1;

/// Builds the cookie of split `split` of the operation in slot `slot` at generation `gen`.
pub fn cookie(slot: u16, gen: u64, split: usize) -> u64 {
    (slot as u64) << 48 | (gen & GEN_MASK) << 8 | split as u64
}

fn uncookie(c: u64) -> (usize, u64, usize) {
    ((c >> 48) as usize, (c >> 8) & GEN_MASK, (c & 0xff) as usize)
}

/// One in-flight page operation.
pub struct Slot {
    gen: AtomicU64,
    in_use: AtomicBool,
    /// [`Kind`] of the operation in the slot.
    kind: AtomicU8,
    /// Writes: the newest version a node reported when it refused a split as stale.
    stale: AtomicU64,
    closed: AtomicBool,
    writers: AtomicU32,
    /// Splits that arrived (reads) or were acknowledged (writes).
    landed: AtomicU32,
    /// Splits whose request failed (node down, error status, short data, bad checksum).
    failed: AtomicU32,
    /// Of the failed splits, those that arrived with a checksum that does not verify.
    corrupt: AtomicU32,
    /// The address range and page in range a read is for (what checksums bind).
    range: AtomicU64,
    page_in_range: AtomicU64,
    /// Landing regions already claimed.
    claimed: AtomicU32,
    /// Splits posted to a node.
    posted: AtomicU32,
    /// The first error status a node returned, for the error message.
    first_status: AtomicU32,
    /// Splits whose own failure says their slab is gone or unreachable: the node answered
    /// `NoSuchSlab` or `Internal`, the node was lost, or the split could not be posted.
    /// Per split, unlike `first_status`: a split that failed otherwise (`Stale`, say) on a
    /// healthy node must never be taken for lost because another split was.
    gone: AtomicU32,
    /// The node each split was posted to.
    nodes: [AtomicU16; MAX_WIDTH],
    /// The version each landed split carried (reads).
    versions: [AtomicU64; MAX_WIDTH],
    /// The caller's page during a read; null otherwise.
    page: AtomicPtr<u8>,
    waiter: Mutex<Option<Thread>>,
    /// The side buffer, owned (allocated in `Slots::new`, freed in `Drop for Slot`); a raw
    /// pointer because completers write disjoint regions of it concurrently.
    side: *mut [u8],
}

impl Drop for Slot {
    fn drop(&mut self) {
        // SAFETY: `side` came from `Box::into_raw` in `Slots::new` and is freed only here.
        drop(unsafe { Box::from_raw(self.side) });
    }
}

// SAFETY: `side` is the only field that is neither Send nor Sync by itself: it is an owned
// allocation (so sending the slot is fine) and for sharing: It is written by completers only between a
// successful region claim and the `writers` decrement, each completer to its own claimed,
// disjoint region, and by the owner only when no completer can run (before posting, or after
// `closed` is set and `writers` reached zero), as the module doc's protocol establishes.
unsafe impl Sync for Slot {}
// SAFETY: the slot owns the allocation behind `side`; nothing ties it to a thread.
unsafe impl Send for Slot {}

/// Counts of a slot's splits at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// Bitmask of landed / acknowledged splits.
    pub landed: u32,
    /// Bitmask of failed splits.
    pub failed: u32,
    /// Bitmask of posted splits.
    pub posted: u32,
    /// Bitmask of the failed splits whose checksum did not verify.
    pub corrupt: u32,
}

impl Progress {
    /// Splits posted and neither landed nor failed.
    pub fn outstanding(&self) -> u32 {
        self.posted & !self.landed & !self.failed
    }
}

/// The fixed table of slots of one client.
pub struct Slots {
    layout: Layout,
    slots: Box<[Slot]>,
    free: Mutex<Vec<u16>>,
    freed: Condvar,
    /// Verify every read split against its checksum.
    checksums: bool,
    /// Replies dropped because they came from another node than the split was posted to, or
    /// were of another operation than the slot's.
    foreign: AtomicU64,
}

impl Slots {
    /// A table of `n` slots for `layout`; `n` must be `1..=MAX_SLOTS` (the client's
    /// configuration is checked before, with a clear error).
    pub fn new(layout: Layout, n: usize) -> Slots {
        let n = n.clamp(1, MAX_SLOTS);
        let slots = (0..n)
            .map(|_| Slot {
                gen: AtomicU64::new(0),
                in_use: AtomicBool::new(false),
                kind: AtomicU8::new(0),
                stale: AtomicU64::new(0),
                closed: AtomicBool::new(false),
                writers: AtomicU32::new(0),
                landed: AtomicU32::new(0),
                failed: AtomicU32::new(0),
                corrupt: AtomicU32::new(0),
                range: AtomicU64::new(0),
                page_in_range: AtomicU64::new(0),
                claimed: AtomicU32::new(0),
                posted: AtomicU32::new(0),
                first_status: AtomicU32::new(0),
                gone: AtomicU32::new(0),
                nodes: std::array::from_fn(|_| AtomicU16::new(NO_NODE)),
                versions: std::array::from_fn(|_| AtomicU64::new(0)),
                page: AtomicPtr::new(std::ptr::null_mut()),
                waiter: Mutex::new(None),
                side: Box::into_raw(vec![0u8; layout.side_len().max(1)].into_boxed_slice()),
            })
            .collect();
        Slots {
            layout,
            slots,
            // `n <= MAX_SLOTS`, so every index fits the cookie's 16 bits.
            free: Mutex::new((0..n).rev().filter_map(|i| u16::try_from(i).ok()).collect()),
            freed: Condvar::new(),
            checksums: false,
            foreign: AtomicU64::new(0),
        }
    }

    /// Replies dropped because they came from a node the split was not posted to, or were of
    /// another operation than their slot's (a confused or hostile node).
    pub fn foreign_replies(&self) -> u64 {
        self.foreign.load(SeqCst)
    }

    /// Verifies read splits against their checksums (see the module doc).
    pub fn with_checksums(mut self, on: bool) -> Slots {
        self.checksums = on;
        self
    }

    /// Takes a free slot for a page read into `page`, waiting while all are in flight
    /// (back-pressure).
    ///
    /// # Safety
    /// `page` must be valid for writes of 4096 bytes and must not be read or written by
    /// anything else until the returned [`Op`] is dropped or closed ([`Op::close`]): until
    /// then, completers copy arriving splits into it from other threads.
    pub unsafe fn acquire_read(&self, page: *mut u8) -> Op<'_> {
        self.acquire(Kind::Read, page)
    }

    /// Takes a free slot for a page write, waiting while all are in flight.
    pub fn acquire_write(&self) -> Op<'_> {
        self.acquire(Kind::Write, std::ptr::null_mut())
    }

    /// Like [`Slots::acquire_read`], but `None` instead of waiting when every slot is in
    /// flight: a caller that already holds slots must not wait for more (two such callers
    /// could each wait for the other's).
    ///
    /// # Safety
    /// As for [`Slots::acquire_read`].
    pub unsafe fn try_acquire_read(&self, page: *mut u8) -> Option<Op<'_>> {
        let idx = self.free.lock().pop()?;
        Some(self.init(idx, Kind::Read, page))
    }

    /// Like [`Slots::acquire_write`], but `None` instead of waiting when every slot is in flight.
    pub fn try_acquire_write(&self) -> Option<Op<'_>> {
        let idx = self.free.lock().pop()?;
        Some(self.init(idx, Kind::Write, std::ptr::null_mut()))
    }

    fn acquire(&self, kind: Kind, page: *mut u8) -> Op<'_> {
        let idx = {
            let mut free = self.free.lock();
            loop {
                if let Some(i) = free.pop() {
                    break i;
                }
                self.freed.wait(&mut free);
            }
        };
        self.init(idx, kind, page)
    }

    /// Prepares free slot `idx` for an operation of `kind` on `page` (null for writes).
    fn init(&self, idx: u16, kind: Kind, page: *mut u8) -> Op<'_> {
        let s = &self.slots[idx as usize];
        *s.waiter.lock() = Some(std::thread::current());
        s.page.store(page, SeqCst);
        // Only the layout's splits: `enter` refuses a split past the width, so the rest are
        // never read (32 SeqCst stores per operation were 22 too many for span-8+2).
        for n in &s.nodes[..self.layout.width] {
            n.store(NO_NODE, SeqCst);
        }
        s.landed.store(0, SeqCst);
        s.failed.store(0, SeqCst);
        s.corrupt.store(0, SeqCst);
        s.claimed.store(0, SeqCst);
        s.posted.store(0, SeqCst);
        s.first_status.store(0, SeqCst);
        s.gone.store(0, SeqCst);
        s.stale.store(0, SeqCst);
        s.kind.store(kind as u8, SeqCst);
        s.closed.store(false, SeqCst);
        s.in_use.store(true, SeqCst);
        Op {
            slots: self,
            idx,
            gen: s.gen.load(SeqCst),
        }
    }

    /// Enters the slot a reply from `node` of operation `kind` names, if it is that slot's
    /// current operation, open, of that kind, and the split was posted to `node`.
    fn enter(&self, node: u16, kind: Kind, c: u64) -> Option<(&Slot, usize)> {
        let (idx, gen, split) = uncookie(c);
        let s = self.slots.get(idx)?;
        if split >= self.layout.width {
            return None;
        }
        s.writers.fetch_add(1, SeqCst);
        if s.gen.load(SeqCst) & GEN_MASK != gen || s.closed.load(SeqCst) || !s.in_use.load(SeqCst) {
            s.writers.fetch_sub(1, SeqCst);
            return None;
        }
        if s.kind.load(SeqCst) != kind as u8 || s.nodes[split].load(SeqCst) != node {
            s.writers.fetch_sub(1, SeqCst);
            self.foreign.fetch_add(1, SeqCst);
            metrics::counter!("hydramem_client_foreign_replies_total").increment(1);
            tracing::debug!(
                node,
                ?kind,
                cookie = c,
                "dropped a reply from a node the split was not posted to, or of another operation"
            );
            return None;
        }
        Some((s, split))
    }

    /// Leaves the slot a completer entered, waking its owner only when the owner may be able
    /// to decide: a split failed, or enough landed for the least any decision needs (k for a
    /// read, the mode's acknowledgements for a write). Waking on every split cost a futex
    /// wake per split — nine per hydra page read — for looks that could only say "not yet";
    /// an owner that needs more than that minimum is woken by each later split, and time-based
    /// decisions (stragglers, deadlines) never wait for a wake ([`super::wait::Pacer`]).
    fn leave(&self, s: &Slot) {
        let landed_mask = s.landed.load(SeqCst);
        let landed = landed_mask.count_ones() as usize;
        let least = if s.kind.load(SeqCst) == Kind::Write as u8 {
            self.layout.write_need
        } else {
            self.layout.k
        };
        // Nothing outstanding: an owner that asked fewer splits than the least (a span read
        // of the one split that is its page) decides now too.
        let all_in = s.posted.load(SeqCst) & !landed_mask == 0;
        let wake = if landed >= least || all_in || s.failed.load(SeqCst) != 0 {
            s.waiter.lock().clone()
        } else {
            None
        };
        // Leave before waking: the woken owner closes the slot at once, and close() waits
        // for `writers == 0`. Woken first, on a busy machine the owner could preempt this
        // thread and spin in close() until its time slice ran out (measured: 88% of a
        // mount's CPU spent there, 2 cores). A late unpark of a thread that has moved on is
        // a spurious wake-up, which every parking loop tolerates.
        s.writers.fetch_sub(1, SeqCst);
        if let Some(t) = wake {
            t.unpark();
        }
    }

    fn fail(s: &Slot, split: usize, status: Status) {
        s.failed.fetch_or(1 << split, SeqCst);
        if matches!(status, Status::NoSuchSlab | Status::Internal) {
            s.gone.fetch_or(1 << split, SeqCst);
        }
        let _ = s
            .first_status
            .compare_exchange(0, status as u32 + 1, SeqCst, SeqCst);
    }
}

/// The transport delivers completions straight into the table: no queue, no thread hop.
impl Completions for Slots {
    /// Delivers a read reply from `node` with the version and checksum the node stored for the
    /// split. Data of a stale, closed, duplicate or foreign split is dropped unread.
    fn read_done(&self, node: u16, c: u64, status: Status, version: u64, crc: u32, data: &[u8]) {
        let Some((s, j)) = self.enter(node, Kind::Read, c) else {
            return;
        };
        let intact = || {
            !self.checksums
                || integrity::verify(
                    data,
                    crc,
                    s.range.load(SeqCst),
                    s.page_in_range.load(SeqCst),
                    j,
                    version,
                )
        };
        if status == Status::Ok && data.len() == self.layout.split_len && !intact() {
            s.corrupt.fetch_or(1 << j, SeqCst);
            Self::fail(s, j, Status::Internal);
        } else if status != Status::Ok || data.len() != self.layout.split_len {
            Self::fail(
                s,
                j,
                if status == Status::Ok {
                    Status::Internal
                } else {
                    status
                },
            );
        } else {
            let bit = 1u32 << self.layout.region(j);
            if s.claimed.fetch_or(bit, SeqCst) & bit == 0 {
                let dst = match self.layout.place(j) {
                    Place::Page(off) => {
                        // SAFETY: the owner stored a pointer to its 4096-byte page, valid until
                        // the Op is dropped, which waits for `writers == 0`; `off + split_len <=
                        // 4096` for in-page splits by construction of the layout.
                        unsafe { s.page.load(SeqCst).add(off) }
                    }
                    Place::Side(off) => {
                        // SAFETY: the side buffer holds `side_len` bytes and this region is
                        // claimed by this completer alone (see the `Sync` impl).
                        unsafe { s.side.cast::<u8>().add(off) }
                    }
                };
                if !dst.is_null() {
                    // SAFETY: `dst` points at `split_len` writable bytes of the claimed region
                    // (above) that nothing else reads or writes until `writers` drops.
                    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
                    s.versions[j].store(version, SeqCst);
                    s.landed.fetch_or(1 << j, SeqCst);
                }
            }
        }
        self.leave(s);
    }

    /// Delivers a write reply from `node`; `stored` is the version the node holds for the
    /// split now. `Stale` is a failure, never an acknowledgement: the node kept a newer
    /// version (`stored`) and did not write this one, so the writer must write again past it
    /// ([`Op::stale_version`]).
    fn write_done(&self, node: u16, c: u64, status: Status, stored: u64) {
        let Some((s, j)) = self.enter(node, Kind::Write, c) else {
            return;
        };
        match status {
            Status::Ok => {
                s.landed.fetch_or(1 << j, SeqCst);
            }
            Status::Stale => {
                s.stale.fetch_max(stored, SeqCst);
                Self::fail(s, j, status);
            }
            _ => Self::fail(s, j, status),
        }
        self.leave(s);
    }

    /// Fails every outstanding split posted to `node` (its connection was lost).
    fn node_down(&self, node: u16) {
        for (i, s) in self.slots.iter().enumerate() {
            if !s.in_use.load(SeqCst) {
                continue;
            }
            let gen = s.gen.load(SeqCst);
            let Ok(i) = u16::try_from(i) else { break };
            let kind = match s.kind.load(SeqCst) {
                k if k == Kind::Read as u8 => Kind::Read,
                _ => Kind::Write,
            };
            for j in 0..self.layout.width {
                if s.nodes[j].load(SeqCst) == node {
                    if let Some((s, j)) = self.enter(node, kind, cookie(i, gen, j)) {
                        if s.landed.load(SeqCst) & (1 << j) == 0 {
                            Self::fail(s, j, Status::Internal);
                        }
                        self.leave(s);
                    }
                }
            }
        }
    }
}

/// The owner's handle on a slot; dropping it closes the slot and returns it to the table.
pub struct Op<'a> {
    slots: &'a Slots,
    idx: u16,
    gen: u64,
}

impl Op<'_> {
    fn slot(&self) -> &Slot {
        &self.slots.slots[self.idx as usize]
    }

    /// The cookie for split `j` of this operation.
    pub fn cookie(&self, j: usize) -> u64 {
        cookie(self.idx, self.gen, j)
    }

    /// Binds a read to its page, which the checksums of its splits must name (before any
    /// split is posted).
    pub fn bind(&self, range: u64, page_in_range: u64) {
        let s = self.slot();
        s.range.store(range, SeqCst);
        s.page_in_range.store(page_in_range, SeqCst);
    }

    /// Records that split `j` is being posted to `node` (before the request is sent).
    pub fn posting(&self, j: usize, node: u16) {
        let s = self.slot();
        s.nodes[j].store(node, SeqCst);
        s.posted.fetch_or(1 << j, SeqCst);
    }

    /// Forgets the failure of split `j` before it is posted again (to a replacement slab).
    pub fn retry(&self, j: usize) {
        let s = self.slot();
        s.failed.fetch_and(!(1 << j), SeqCst);
        s.corrupt.fetch_and(!(1 << j), SeqCst);
        s.landed.fetch_and(!(1 << j), SeqCst);
        s.gone.fetch_and(!(1 << j), SeqCst);
    }

    /// Marks split `j` failed without a reply (posting to a node that is down).
    pub fn post_failed(&self, j: usize) {
        Slots::fail(self.slot(), j, Status::Internal);
    }

    /// The state of the splits now.
    pub fn progress(&self) -> Progress {
        let s = self.slot();
        Progress {
            landed: s.landed.load(SeqCst),
            failed: s.failed.load(SeqCst),
            posted: s.posted.load(SeqCst),
            corrupt: s.corrupt.load(SeqCst),
        }
    }

    /// The version split `j` carried when it landed (meaningful for landed splits only).
    pub fn version_of(&self, j: usize) -> u64 {
        self.slot().versions[j].load(SeqCst)
    }

    /// The splits among `landed` (of the first `width`) that carry version `v`.
    pub fn of_version(&self, landed: u32, width: usize, v: u64) -> u32 {
        (0..width)
            .filter(|&i| landed & (1 << i) != 0 && self.version_of(i) == v)
            .fold(0, |m, i| m | 1 << i)
    }

    /// Among the landed splits, the newest version that `need` of them share, with the mask of
    /// its splits; otherwise `None` and the size of the largest same-version set.
    pub fn consistent(&self, landed: u32, width: usize, need: usize) -> Result<(u64, u32), usize> {
        let mut best: Option<(u64, u32)> = None;
        let mut largest = 0;
        for j in 0..width {
            if landed & (1 << j) == 0 {
                continue;
            }
            let v = self.version_of(j);
            let mask = self.of_version(landed, width, v);
            let n = mask.count_ones() as usize;
            largest = largest.max(n);
            if n >= need && best.is_none_or(|(bv, _)| v > bv) {
                best = Some((v, mask));
            }
        }
        best.ok_or(largest)
    }

    /// The node split `j` was posted to.
    pub fn node_of(&self, j: usize) -> u16 {
        self.slot().nodes[j].load(SeqCst)
    }

    /// Writes: the newest version a node holds for a split it refused as stale (0: none).
    pub fn stale_version(&self) -> u64 {
        self.slot().stale.load(SeqCst)
    }

    /// Whether split `j` failed in a way that says its slab is gone or its node lost (see
    /// `Slot::gone`): what decides that the split moves to a replacement slab.
    pub fn split_gone(&self, j: usize) -> bool {
        self.slot().gone.load(SeqCst) & (1 << j) != 0
    }

    /// The first error status a node reported for this operation, if any.
    pub fn first_status(&self) -> Option<Status> {
        let v = self.slot().first_status.load(SeqCst);
        Status::ALL.into_iter().find(|s| *s as u32 + 1 == v)
    }

    /// Closes the slot to completers; returns the final progress. After this no completer
    /// touches the page or the side buffer.
    pub fn close(&mut self) -> Progress {
        let s = self.slot();
        s.closed.store(true, SeqCst);
        // A completer copies at most one split before it leaves; should it be descheduled
        // meanwhile, give it the core instead of spinning a whole time slice.
        let mut spins = 0u32;
        while s.writers.load(SeqCst) != 0 {
            spins += 1;
            if spins.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        self.progress()
    }

    /// Opens a closed slot to completers again, so that a read can ask for more splits after
    /// it checked those it had (corruption correction). Splits that landed keep their claimed
    /// regions, so late or duplicate replies never overwrite them; a region the owner wrote
    /// meanwhile without a landed split (a decoded data split) may be overwritten by that
    /// split when it arrives, which is what a second look wants.
    ///
    /// # Safety
    /// The contract of [`Slots::acquire_read`] holds again: nothing may read or write the
    /// page (or the side buffer) until the slot is closed again ([`Op::close`]) or dropped.
    pub unsafe fn reopen(&mut self) {
        self.slot().closed.store(false, SeqCst);
    }

    /// A write's side buffer (its tail and parity splits once encoded), shared. Sound
    /// because completers never touch a write's side buffer (write replies carry no data) and
    /// the owner writes it only through [`Op::side`], whose `&mut self` cannot overlap this
    /// borrow.
    ///
    /// # Panics
    /// For a read, whose side buffer completers write.
    pub fn write_side(&self) -> &[u8] {
        assert_eq!(
            self.slot().kind.load(SeqCst),
            Kind::Write as u8,
            "only a write's side buffer can be shared"
        );
        // SAFETY: see above: for a write no completer writes the side buffer, and the owner's
        // only mutable access needs `&mut self`, which this `&self` borrow excludes.
        unsafe { &*self.slot().side }
    }

    /// The side buffer. Exclusive access: callable before any split is posted or after
    /// [`Op::close`], which the `&mut self` receiver and the data path's call order ensure.
    pub fn side(&mut self) -> &mut [u8] {
        // SAFETY: see the doc above and the `Sync` impl of `Slot`: the owner calls this only
        // while no completer may write (before posting reads, or after `close`); writes never
        // let completers touch the side buffer at all.
        unsafe { &mut *self.slot().side }
    }
}

impl Op<'_> {
    /// Makes completions wake the calling thread (an operation handed to another thread to
    /// wait for it; its owner was the thread that took the slot).
    pub fn wake_me(&self) {
        *self.slot().waiter.lock() = Some(std::thread::current());
    }
}

impl Drop for Op<'_> {
    fn drop(&mut self) {
        self.close();
        let s = self.slot();
        s.in_use.store(false, SeqCst);
        s.page.store(std::ptr::null_mut(), SeqCst);
        s.gen.fetch_add(1, SeqCst);
        *s.waiter.lock() = None;
        self.slots.free.lock().push(self.idx);
        self.slots.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::layout::{Mode, Resilience};

    fn layout() -> Layout {
        Layout::new(
            Resilience::Hydra {
                k: 8,
                r: 2,
                delta: 1,
                mode: Mode::FailureRecovery,
            },
            1 << 20,
        )
        .unwrap()
    }

    /// A read of `page` with every split posted to node 0.
    fn read_op<'a>(slots: &'a Slots, page: &mut [u8; 4096]) -> Op<'a> {
        // SAFETY: every test keeps `page` alive and untouched until it drops the op.
        let op = unsafe { slots.acquire_read(page.as_mut_ptr()) };
        for j in 0..slots.layout.width {
            op.posting(j, 0);
        }
        op
    }

    #[test]
    fn splits_land_in_page_and_side_and_late_ones_are_dropped() {
        let slots = Slots::new(layout(), 4);
        let mut page = [0u8; 4096];
        let mut op = read_op(&slots, &mut page);
        let c3 = op.cookie(3);
        let c9 = op.cookie(9);
        let c4 = op.cookie(4);
        slots.read_done(0, c3, Status::Ok, 1, 0, &[3; 512]);
        slots.read_done(0, c9, Status::Ok, 1, 0, &[9; 512]);
        assert_eq!(op.progress().landed, 1 << 3 | 1 << 9);
        op.close();
        slots.read_done(0, c4, Status::Ok, 1, 0, &[4; 512]);
        assert_eq!(op.progress().landed, 1 << 3 | 1 << 9);
        assert_eq!(op.side()[512..1024], [9; 512]);
        drop(op);
        assert!(page[1536..2048].iter().all(|b| *b == 3));
        assert!(
            page[2048..2560].iter().all(|b| *b == 0),
            "late split touched the page"
        );
        // A reply to the previous generation of a reused slot is ignored.
        let mut page2 = [0u8; 4096];
        let op2 = read_op(&slots, &mut page2);
        slots.read_done(0, c3, Status::Ok, 1, 0, &[7; 512]);
        assert_eq!(op2.progress().landed, 0);
        drop(op2);
        assert!(page2.iter().all(|b| *b == 0));
    }

    #[test]
    fn errors_short_data_and_node_loss_fail_splits() {
        let slots = Slots::new(layout(), 2);
        let mut page = [0u8; 4096];
        let op = read_op(&slots, &mut page);
        slots.read_done(0, op.cookie(0), Status::NoSuchSlab, 1, 0, &[]);
        slots.read_done(0, op.cookie(1), Status::Ok, 1, 0, &[1; 100]);
        op.posting(2, 5);
        slots.node_down(5);
        assert_eq!(op.progress().failed, 0b111);
        assert_eq!(op.first_status(), Some(Status::NoSuchSlab));
        assert!(op.split_gone(0) && op.split_gone(2));
        // Garbage cookies are ignored.
        slots.read_done(0, u64::MAX, Status::Ok, 1, 0, &[0; 512]);
        slots.write_done(0, cookie(1, 0, 31), Status::Ok, 0);
    }

    #[test]
    fn only_splits_of_one_version_are_combined() {
        let slots = Slots::new(layout(), 1);
        let mut page = [0u8; 4096];
        let op = read_op(&slots, &mut page);
        // 5 splits of version 7 and 4 of version 9: no version has k = 8.
        for j in 0..5 {
            slots.read_done(0, op.cookie(j), Status::Ok, 7, 0, &[7; 512]);
        }
        for j in 5..9 {
            slots.read_done(0, op.cookie(j), Status::Ok, 9, 0, &[9; 512]);
        }
        let landed = op.progress().landed;
        assert_eq!(op.consistent(landed, 10, 8), Err(5));
        // A fifth split of version 9 ties the two at 5: still no version has 8.
        slots.read_done(0, op.cookie(9), Status::Ok, 9, 0, &[9; 512]);
        assert_eq!(op.consistent(op.progress().landed, 10, 8), Err(5));
        // With need 5 the newest version that has 5 wins.
        assert_eq!(
            op.consistent(op.progress().landed, 10, 5),
            Ok((9, 0b11_1110_0000))
        );
        drop(op);
    }

    #[test]
    fn splits_failing_their_checksum_never_land_and_are_marked_corrupt() {
        let slots = Slots::new(layout(), 1).with_checksums(true);
        let mut page = [0u8; 4096];
        let op = read_op(&slots, &mut page);
        op.bind(3, 17);
        let crc = |d: &[u8], j, v| integrity::split_crc(d, 3, 17, j, v);
        slots.read_done(
            0,
            op.cookie(0),
            Status::Ok,
            5,
            crc(&[1; 512], 0, 5),
            &[1; 512],
        );
        // Flipped bytes, another page's split, another split index, another version.
        let mut flipped = [2u8; 512];
        let good = crc(&flipped, 1, 5);
        flipped[9] ^= 0x10;
        slots.read_done(0, op.cookie(1), Status::Ok, 5, good, &flipped);
        let other_page = integrity::split_crc(&[3; 512], 3, 18, 2, 5);
        slots.read_done(0, op.cookie(2), Status::Ok, 5, other_page, &[3; 512]);
        slots.read_done(
            0,
            op.cookie(3),
            Status::Ok,
            5,
            crc(&[4; 512], 4, 5),
            &[4; 512],
        );
        slots.read_done(
            0,
            op.cookie(4),
            Status::Ok,
            6,
            crc(&[5; 512], 4, 5),
            &[5; 512],
        );
        // Never written: zeros with crc 0 are fine, anything else is not.
        slots.read_done(0, op.cookie(5), Status::Ok, 0, 0, &[0; 512]);
        slots.read_done(0, op.cookie(6), Status::Ok, 0, 0, &[6; 512]);
        let p = op.progress();
        assert_eq!(p.landed, 0b10_0001);
        assert_eq!(p.failed, 0b101_1110);
        assert_eq!(p.corrupt, 0b101_1110);
        drop(op);
        assert!(page[..512].iter().all(|b| *b == 1));
        assert!(
            page[512..].iter().all(|b| *b == 0),
            "a corrupt split landed"
        );
        // Without checksums the same bytes land.
        let slots = Slots::new(layout(), 1);
        let op = read_op(&slots, &mut page);
        slots.read_done(0, op.cookie(1), Status::Ok, 5, good, &flipped);
        assert_eq!((op.progress().landed, op.progress().corrupt), (0b10, 0));
    }

    #[test]
    fn replicated_copies_claim_one_region() {
        let l = Layout::new(Resilience::Replication { copies: 2 }, 1 << 20).unwrap();
        let slots = Slots::new(l, 1);
        let mut page = [0u8; 4096];
        let op = read_op(&slots, &mut page);
        slots.read_done(0, op.cookie(1), Status::Ok, 1, 0, &[1; 4096]);
        slots.read_done(0, op.cookie(0), Status::Ok, 1, 0, &[2; 4096]);
        assert_eq!(op.progress().landed, 0b10);
        drop(op);
        assert!(page.iter().all(|b| *b == 1));
    }

    #[test]
    fn replies_from_another_node_or_for_another_operation_are_dropped_and_counted() {
        let slots = Slots::new(layout(), 2);
        let mut page = [0u8; 4096];
        let op = read_op(&slots, &mut page);
        // Split 3 was posted to node 0: node 7 cannot deliver it, nor fail it.
        slots.read_done(7, op.cookie(3), Status::Ok, 1, 0, &[3; 512]);
        slots.read_done(7, op.cookie(4), Status::NoSuchSlab, 0, 0, &[]);
        assert_eq!((op.progress().landed, op.progress().failed), (0, 0));
        // A write acknowledgement for a read's split is not a read reply.
        slots.write_done(0, op.cookie(3), Status::Ok, 1);
        assert_eq!(op.progress().landed, 0);
        assert_eq!(slots.foreign_replies(), 3);
        drop(op);
        assert!(page.iter().all(|b| *b == 0));
        // The reproduction: a READV reply carrying a write's cookie must not land anywhere
        // (the write's slot has no page: it used to copy to null + offset).
        let w = slots.acquire_write();
        for j in 0..10 {
            w.posting(j, 0);
        }
        slots.read_done(0, w.cookie(2), Status::Ok, 1, 0, &[9; 512]);
        slots.read_done(0, w.cookie(9), Status::Ok, 1, 0, &[9; 512]);
        assert_eq!(w.progress().landed, 0);
        assert_eq!(slots.foreign_replies(), 5);
        slots.write_done(0, w.cookie(2), Status::Ok, 1);
        assert_eq!(w.progress().landed, 0b100);
    }

    /// Regression: a write whose split on a killed node failed first (`Internal`) took every
    /// other failed split for lost too, and the remap gave back healthy slabs with their data
    /// (EC-only writes under a node kill, `tests/data_path.rs`).
    #[test]
    fn only_the_split_whose_slab_is_gone_counts_as_gone() {
        let slots = Slots::new(layout(), 1);
        let w = slots.acquire_write();
        for j in 0..3 {
            w.posting(j, j as u16);
        }
        slots.node_down(0);
        slots.write_done(1, w.cookie(1), Status::Stale, 90);
        slots.write_done(2, w.cookie(2), Status::NoSuchSlab, 0);
        assert_eq!(w.progress().failed, 0b111);
        assert_eq!(w.first_status(), Some(Status::Internal));
        assert!(w.split_gone(0), "its node was lost");
        assert!(
            !w.split_gone(1),
            "a stale split on a healthy node is not gone"
        );
        assert!(w.split_gone(2), "its node said the slab is gone");
        w.retry(0);
        assert!(!w.split_gone(0), "a retried split starts clean");
        drop(w);
        let w = slots.acquire_write();
        assert!(!w.split_gone(2), "a new operation in the slot starts clean");
    }

    #[test]
    fn a_stale_write_reply_is_a_failure_with_the_stored_version_never_an_ack() {
        let slots = Slots::new(layout(), 1);
        let w = slots.acquire_write();
        for j in 0..10 {
            w.posting(j, 2);
        }
        slots.write_done(2, w.cookie(0), Status::Ok, 50);
        slots.write_done(2, w.cookie(1), Status::Stale, 90);
        slots.write_done(2, w.cookie(2), Status::Stale, 70);
        let p = w.progress();
        assert_eq!((p.landed, p.failed), (0b1, 0b110));
        assert_eq!(w.stale_version(), 90);
        assert_eq!(w.first_status(), Some(Status::Stale));
        drop(w);
        // A new operation in the slot starts clean.
        let w = slots.acquire_write();
        assert_eq!(w.stale_version(), 0);
    }

    #[test]
    fn a_table_of_the_most_slots_the_cookie_can_name_has_them_all() {
        let slots = Slots::new(layout(), MAX_SLOTS);
        assert_eq!(slots.free.lock().len(), MAX_SLOTS);
        let w = slots.acquire_write();
        assert!(w.cookie(0) >> 48 < MAX_SLOTS as u64);
    }
}
