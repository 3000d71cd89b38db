//! The page table of the pager: for every page of the program it has seen, where the page's
//! bytes are — in the program's memory (resident), or in the cluster at a slot of the store
//! (out) — and the slot allocator of the store. Pages it has never seen are either resident
//! (the kernel mapped them on first touch) or were never touched: both read as the program
//! left them, and a missing fault on such a page is a first touch, answered with zeros.
//!
//! Invariants (the caller holds the table's lock across each call and across the memory
//! operation the call decides, see `pager.rs`):
//! - a resident page with a fingerprint (`print.rs`) was mapped from the bytes its slot holds,
//!   which have that fingerprint: it is clean exactly while its bytes still have it, which the
//!   evictor checks on the copy it takes; pages are mapped writable, so a write is never seen
//!   as it happens;
//! - a page leaves for the cluster only from the standby pool: resident → standby → out;
//! - a page is `Out` only after its bytes were acknowledged at its slot; a fault on an `Out`
//!   page fetches that slot, a fault on any other page gets zeros;
//! - a slot belongs to at most one entry, and goes back to the free list exactly once, when
//!   its entry is dropped or replaced;
//! - a page being evicted (`evicting`) is never resolved by a fault: the fault waits for the
//!   eviction to end (the evictor wakes it), so a write can never land between the copy the
//!   evictor sends and the moment it drops the page;
//! - a page in the standby pool (`Standby`) is out of the program's memory, and its bytes are
//!   in the pool buffer its state names, which belongs to that entry alone: taken when the
//!   evictor reserves it, given back exactly once (the page faults back in, is sent out, is
//!   discarded, or its eviction is not committed);
//! - every change made by someone other than the evictor (a fault, the program's madvise,
//!   munmap or mremap) gives the entry a new generation, and the evictor commits an eviction
//!   only to an entry whose generation it selected: a page the program discarded or moved
//!   meanwhile is never dropped or recorded as out.

use std::collections::{BTreeMap, VecDeque};

use crate::print::Print;

/// A page number (virtual address / 4096).
pub type Vpn = u64;

/// Where a page's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// In the program's memory, mapped writable.
    Resident {
        /// Its slot in the store, if it has one.
        slot: Option<u64>,
        /// The fingerprint of the bytes `slot` holds, if the page was mapped from them: it is
        /// clean while its bytes still have this fingerprint. `None`: mapped for a write, or
        /// never stored.
        print: Option<Print>,
    },
    /// Not in the program's memory, nor sent out yet: the bytes are in standby buffer
    /// `buf` (`standby.rs`).
    Standby {
        /// Its slot holds the same bytes (the copy had the fingerprint the page was mapped
        /// with), so sending it out needs no write.
        clean: bool,
        /// Its slot in the store, if it has one.
        slot: Option<u64>,
        /// The pool buffer holding its bytes.
        buf: u32,
    },
    /// Not in the program's memory; the bytes are at `slot` in the store.
    Out {
        /// Where the bytes are.
        slot: u64,
    },
}

/// One page the pager knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Where the bytes are.
    pub state: State,
    /// Faulted in since the clock hand last passed it (the second chance).
    pub referenced: bool,
    /// Being evicted: faults on it wait.
    pub evicting: bool,
    /// Changes with every change not made by the evictor.
    pub gen: u64,
}

impl Entry {
    fn slot(&self) -> Option<u64> {
        match self.state {
            State::Resident { slot, .. } | State::Standby { slot, .. } => slot,
            State::Out { slot } => Some(slot),
        }
    }

    fn buf(&self) -> Option<u32> {
        match self.state {
            State::Standby { buf, .. } => Some(buf),
            _ => None,
        }
    }

    /// Its buffer, if its place `gen` in the standby line is still its own (it has not left
    /// standby, nor changed, since it got that place).
    fn in_line(&self, gen: u64) -> Option<u32> {
        self.buf().filter(|_| self.gen == gen)
    }
}

/// What to do with a missing-page fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultPlan {
    /// Map a page of zeros (first touch, or a page the program discarded).
    Zero,
    /// Read the page from `slot`, then map it if the entry still has generation `gen`.
    Fetch {
        /// The page's slot.
        slot: u64,
        /// The entry's generation when the fetch was planned.
        gen: u64,
    },
    /// The page is being evicted: wait for the evictor to wake the thread.
    Defer,
    /// The page is in standby buffer `buf`: map it from there (`Table::standby_in`).
    Local {
        /// Its buffer.
        buf: u32,
        /// Whether its slot holds the same bytes.
        clean: bool,
    },
}

/// What the evictor does with a page it selected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Its bytes are at `slot` (written now, or already there for a clean page). Only a page
    /// in standby is stored.
    Stored {
        /// The page's slot.
        slot: u64,
    },
    /// It is all zeros: nothing is stored; a later fault maps zeros.
    Zero,
    /// Its bytes were copied to standby buffer `buf`: the page leaves the program's memory
    /// and waits there to be sent out.
    Standby {
        /// Its buffer.
        buf: u32,
        /// The fingerprint of the copy (clean if it is the page's own).
        print: Print,
    },
    /// It could not be written: it stays resident.
    Kept,
}

/// Where the bytes of a page in standby go (`Table::slot_for`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dest {
    /// It is clean: `slot` already holds its bytes, nothing to write.
    Clean(u64),
    /// Write it to this slot.
    Write(u64),
    /// The entry changed since it was selected: nothing to write (commit will leave it).
    Changed,
}

/// What the evictor must do with a selected page after `commit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Commit {
    /// Drop it from memory: its bytes are stored (or zero).
    Drop,
    /// Leave it: the program discarded, moved or faulted it meanwhile, or the write failed.
    Leave,
    /// It was in standby and is now out: its buffer is free, and there is nothing to drop.
    Sent,
}

/// Pages the pager knows, and the store's slots.
#[derive(Debug, Default)]
pub struct Table {
    pages: BTreeMap<Vpn, Entry>,
    /// Standby buffers no entry holds (nor the evictor has reserved).
    free_bufs: Vec<u32>,
    /// Pages put in standby, oldest first, with the generation they got then (an entry
    /// whose generation changed since is no longer this one: skipped).
    standby: VecDeque<(Vpn, u64)>,
    /// Entries in standby now.
    in_standby: usize,
    free: Vec<u64>,
    next_slot: u64,
    slots: u64,
    next_gen: u64,
}

/// The store has no free slot left.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("all {0} pages of the remote space are in use: give hydramem run a larger --remote-size")]
pub struct Full(pub u64);

impl Table {
    /// A table over a store of `slots` pages, with `bufs` standby buffers.
    pub fn new(slots: u64, bufs: u32) -> Table {
        Table {
            slots,
            free_bufs: (0..bufs).rev().collect(),
            ..Table::default()
        }
    }

    /// Takes up to `n` free standby buffers for the evictor (given back by `commit`, or with
    /// `give_back`).
    pub fn take_bufs(&mut self, n: usize) -> Vec<u32> {
        let at = self.free_bufs.len().saturating_sub(n);
        self.free_bufs.split_off(at)
    }

    /// Buffers the evictor took and did not use.
    pub fn give_back(&mut self, bufs: impl IntoIterator<Item = u32>) {
        self.free_bufs.extend(bufs);
    }

    /// Free standby buffers.
    pub fn free_bufs(&self) -> usize {
        self.free_bufs.len()
    }

    /// Pages in standby.
    pub fn in_standby(&self) -> usize {
        self.in_standby
    }

    /// Removes `e` (no longer `vpn`'s entry): its slot and buffer go back.
    fn drop_entry(&mut self, e: Entry) {
        self.release(e.slot());
        if let Some(b) = e.buf() {
            self.left_standby(b);
        }
    }

    /// A page left standby: its buffer `buf` is free.
    fn left_standby(&mut self, buf: u32) {
        self.free_bufs.push(buf);
        self.in_standby -= 1;
    }

    fn gen(&mut self) -> u64 {
        self.next_gen += 1;
        self.next_gen
    }

    fn release(&mut self, slot: Option<u64>) {
        if let Some(s) = slot {
            self.free.push(s);
        }
    }

    fn alloc(&mut self) -> Result<u64, Full> {
        if let Some(s) = self.free.pop() {
            return Ok(s);
        }
        if self.next_slot == self.slots {
            return Err(Full(self.slots));
        }
        self.next_slot += 1;
        Ok(self.next_slot - 1)
    }

    /// The entry of `vpn`, if the pager knows it.
    pub fn get(&self, vpn: Vpn) -> Option<&Entry> {
        self.pages.get(&vpn)
    }

    /// Pages whose bytes are only in the store: (page, slot, generation).
    pub fn out_pages(&self) -> impl Iterator<Item = (Vpn, u64, u64)> + '_ {
        self.pages.iter().filter_map(|(v, e)| match e.state {
            State::Out { slot } => Some((*v, slot, e.gen)),
            _ => None,
        })
    }

    /// Pages in standby and not being sent out: (page, buffer).
    pub fn standby_pages(&self) -> Vec<(Vpn, u32)> {
        self.pages
            .iter()
            .filter(|(_, e)| !e.evicting)
            .filter_map(|(v, e)| e.buf().map(|b| (*v, b)))
            .collect()
    }

    /// Slots in use (pages whose bytes the store holds or will hold).
    pub fn slots_used(&self) -> u64 {
        self.next_slot - self.free.len() as u64
    }

    /// A missing-page fault on `vpn`.
    pub fn on_missing(&mut self, vpn: Vpn) -> FaultPlan {
        let Some(e) = self.pages.get(&vpn).copied() else {
            return FaultPlan::Zero;
        };
        if e.evicting {
            return FaultPlan::Defer;
        }
        match e.state {
            State::Out { slot } => FaultPlan::Fetch { slot, gen: e.gen },
            State::Standby { buf, clean, .. } => FaultPlan::Local { buf, clean },
            // Known as resident, yet reported missing: either the program dropped it (madvise
            // the pager did not see, e.g. from inside the C library) and it reads as zeros, or
            // the report is stale (the page was mapped after the fault, by a read-ahead or for
            // another thread) and the zero page will not be placed. The entry stays until
            // `zeroed` says which.
            State::Resident { .. } => FaultPlan::Zero,
        }
    }

    /// A fetched page was mapped; `print`: the fingerprint of the bytes fetched, `None` for a
    /// write fault (the page is dirty). Returns false if the entry changed since `plan`
    /// (the caller must not map the bytes).
    pub fn fetched(&mut self, vpn: Vpn, slot: u64, gen: u64, print: Option<Print>) -> bool {
        self.mapped(vpn, slot, gen, print, true)
    }

    /// Page `vpn`, in standby, was mapped from its buffer; `print`: the buffer's fingerprint,
    /// `None` for a write fault. It is resident and referenced again, and its buffer is free;
    /// it keeps the fingerprint if its slot holds the buffer's bytes. False if it was not in
    /// standby (nothing changed).
    pub fn standby_in(&mut self, vpn: Vpn, print: Option<Print>) -> bool {
        let g = self.gen();
        let Some(e) = self.pages.get_mut(&vpn) else {
            return false;
        };
        let State::Standby { clean, slot, buf } = e.state else {
            return false;
        };
        *e = Entry {
            state: State::Resident {
                slot,
                print: print.filter(|_| clean && slot.is_some()),
            },
            referenced: true,
            evicting: false,
            gen: g,
        };
        self.left_standby(buf);
        true
    }

    /// A page read ahead of a fault was mapped, with the fingerprint of its bytes. It has no
    /// second chance: the program has not touched it yet. False as for `fetched`.
    pub fn read_ahead(&mut self, vpn: Vpn, slot: u64, gen: u64, print: Print) -> bool {
        self.mapped(vpn, slot, gen, Some(print), false)
    }

    fn mapped(
        &mut self,
        vpn: Vpn,
        slot: u64,
        gen: u64,
        print: Option<Print>,
        referenced: bool,
    ) -> bool {
        if !self.still(vpn, slot, gen) {
            return false;
        }
        let g = self.gen();
        self.pages.insert(
            vpn,
            Entry {
                state: State::Resident {
                    slot: Some(slot),
                    print,
                },
                referenced,
                evicting: false,
                gen: g,
            },
        );
        true
    }

    /// The slot and generation of page `vpn` if it is out and not being evicted: a page worth
    /// reading ahead.
    pub fn out(&self, vpn: Vpn) -> Option<(u64, u64)> {
        match self.pages.get(&vpn) {
            Some(e) if !e.evicting => match e.state {
                State::Out { slot } => Some((slot, e.gen)),
                _ => None,
            },
            _ => None,
        }
    }

    /// Whether the entry of a planned fetch is unchanged (the bytes may be mapped).
    pub fn still(&self, vpn: Vpn, slot: u64, gen: u64) -> bool {
        matches!(self.pages.get(&vpn), Some(e) if e.gen == gen && e.state == (State::Out { slot }) && !e.evicting)
    }

    /// A page of zeros was mapped at `vpn` on a first touch: it gets its second chance.
    pub fn zeroed(&mut self, vpn: Vpn) {
        let g = self.gen();
        let old = self.pages.insert(
            vpn,
            Entry {
                state: State::Resident {
                    slot: None,
                    print: None,
                },
                referenced: true,
                evicting: false,
                gen: g,
            },
        );
        if let Some(e) = old {
            self.drop_entry(e);
        }
    }

    /// A write-protect fault on `vpn` (a page the evictor protected to copy it, whose
    /// eviction did not happen or is under way): true if the write may go on, false if it
    /// waits for the eviction. Whether the write makes the page dirty is its fingerprint's to
    /// say.
    pub fn on_write_protect(&mut self, vpn: Vpn) -> bool {
        let g = self.gen();
        match self.pages.get_mut(&vpn) {
            Some(e) if e.evicting => false,
            Some(e) => {
                e.gen = g;
                true
            }
            None => true,
        }
    }

    /// The clock hand reached resident page `vpn`: Some(generation) if it is selected for
    /// eviction (now `evicting`), None if it keeps its place (its second chance, or it is
    /// already being evicted).
    pub fn select(&mut self, vpn: Vpn) -> Option<u64> {
        let g = self.gen();
        let e = self.pages.entry(vpn).or_insert(Entry {
            state: State::Resident {
                slot: None,
                print: None,
            },
            referenced: false,
            evicting: false,
            gen: g,
        });
        if e.evicting || !matches!(e.state, State::Resident { .. }) {
            return None;
        }
        if e.referenced {
            e.referenced = false;
            return None;
        }
        e.evicting = true;
        Some(e.gen)
    }

    /// Where page `vpn`, in standby and taken by `begin_flush` with generation `gen`, goes:
    /// its slot if it is clean, else the slot to write it to (allocated now if it has none).
    pub fn slot_for(&mut self, vpn: Vpn, gen: u64) -> Result<Dest, Full> {
        let (clean, slot) = match self.pages.get(&vpn) {
            Some(e) if e.gen == gen && e.evicting => match e.state {
                State::Standby { clean, slot, .. } => (clean, slot),
                State::Resident { .. } | State::Out { .. } => return Ok(Dest::Changed),
            },
            _ => return Ok(Dest::Changed),
        };
        match (clean, slot) {
            (true, Some(s)) => Ok(Dest::Clean(s)),
            (_, Some(s)) => Ok(Dest::Write(s)),
            (_, None) => {
                let s = self.alloc()?;
                if let Some(e) = self.pages.get_mut(&vpn) {
                    if let State::Standby { clean, slot, .. } = &mut e.state {
                        *clean = false;
                        *slot = Some(s);
                    }
                }
                Ok(Dest::Write(s))
            }
        }
    }

    /// Takes the oldest pages in standby, at most `n`, to be sent out: they are `evicting`
    /// (faults on them wait) until `commit`. Returns (page, generation, buffer) of each.
    pub fn begin_flush(&mut self, n: usize) -> Vec<(Vpn, u64, u32)> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let Some((vpn, gen)) = self.standby.pop_front() else {
                break;
            };
            if let Some(e) = self.pages.get_mut(&vpn) {
                if let (Some(buf), false) = (e.in_line(gen), e.evicting) {
                    e.evicting = true;
                    out.push((vpn, gen, buf));
                }
            }
        }
        out
    }

    /// Drops the line's stale places (pages that left standby since) once they outnumber
    /// the pages in it: pages that fault back in leave theirs behind, and a program whose
    /// touches keep the pool from filling would otherwise grow the line without end.
    fn trim_standby(&mut self) {
        if self.standby.len() > 2 * self.in_standby + 1024 {
            let pages = &self.pages;
            self.standby
                .retain(|(v, g)| pages.get(v).is_some_and(|e| e.in_line(*g).is_some()));
        }
    }

    /// The eviction of `vpn` (selected with generation `gen`, by the clock or by
    /// `begin_flush`) ended with `outcome`. An outcome not committed (the entry changed
    /// meanwhile) gives its standby buffer back.
    pub fn commit(&mut self, vpn: Vpn, gen: u64, outcome: Outcome) -> Commit {
        let state = match self.pages.get_mut(&vpn) {
            Some(e) if e.gen == gen && e.evicting => {
                e.evicting = false;
                e.state
            }
            _ => {
                if let Outcome::Standby { buf, .. } = outcome {
                    self.free_bufs.push(buf);
                }
                return Commit::Leave;
            }
        };
        let set = |t: &mut Table, state: State| {
            if let Some(e) = t.pages.get_mut(&vpn) {
                e.state = state;
            }
        };
        match (state, outcome) {
            (State::Standby { .. }, Outcome::Kept) => {
                // Not sent: first in line for the next flush.
                self.standby.push_front((vpn, gen));
                Commit::Leave
            }
            (_, Outcome::Kept) => Commit::Leave,
            (State::Resident { slot, print }, Outcome::Standby { buf, print: copy }) => {
                let clean = slot.is_some() && print == Some(copy);
                set(self, State::Standby { clean, slot, buf });
                self.in_standby += 1;
                self.standby.push_back((vpn, gen));
                self.trim_standby();
                Commit::Drop
            }
            (State::Standby { slot, buf, .. }, Outcome::Stored { slot: s }) => {
                debug_assert_eq!(slot, Some(s));
                set(self, State::Out { slot: s });
                self.left_standby(buf);
                Commit::Sent
            }
            (_, Outcome::Zero) => {
                if let Some(e) = self.pages.remove(&vpn) {
                    self.drop_entry(e);
                }
                Commit::Drop
            }
            // None of these happens (a page in standby is not demoted again, one that is out
            // is not selected, and only pages in standby are stored); the buffer goes back.
            (_, Outcome::Standby { buf, .. }) => {
                self.free_bufs.push(buf);
                Commit::Leave
            }
            (State::Resident { .. } | State::Out { .. }, Outcome::Stored { .. }) => Commit::Leave,
        }
    }

    /// The program discarded `[first, first + n)` (madvise DONTNEED/FREE/REMOVE, munmap):
    /// the pages read as zeros from now on, their slots are free.
    pub fn forget(&mut self, first: Vpn, n: u64) {
        let gone: Vec<(Vpn, Entry)> = self
            .pages
            .range(first..first.saturating_add(n))
            .map(|(v, e)| (*v, *e))
            .collect();
        for (v, e) in gone {
            self.pages.remove(&v);
            self.drop_entry(e);
        }
    }

    /// The program moved `[from, from + n)` to `to` (mremap): each page's entry moves with
    /// its bytes. A page being evicted is left to the evictor at its old place (the move
    /// changes its generation, so the eviction is not committed) and arrives as a dirty
    /// resident page.
    pub fn remap(&mut self, from: Vpn, to: Vpn, n: u64) {
        self.forget(to, n);
        let moved: Vec<(Vpn, Entry)> = self
            .pages
            .range(from..from.saturating_add(n))
            .map(|(v, e)| (*v, *e))
            .collect();
        for (v, e) in moved {
            self.pages.remove(&v);
            let g = self.gen();
            let entry = match e.state {
                // Its fingerprint stays: it is of the bytes, wherever they are mapped.
                State::Resident { slot, print } => Entry {
                    state: State::Resident { slot, print },
                    referenced: e.referenced,
                    evicting: false,
                    gen: g,
                },
                State::Standby { buf, slot, .. } => {
                    self.standby.push_back((to + (v - from), g));
                    Entry {
                        state: State::Standby {
                            clean: false,
                            slot,
                            buf,
                        },
                        referenced: e.referenced,
                        evicting: false,
                        gen: g,
                    }
                }
                State::Out { .. } => Entry { gen: g, ..e },
            };
            self.pages.insert(to + (v - from), entry);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The fingerprint of a page holding `x` (the model's pages are values, not bytes).
    fn pr(x: u64) -> Print {
        Print::of_value(x)
    }

    /// Puts resident page `vpn`, holding `value`, in standby (the hand passing it as often as
    /// its second chance needs); returns its buffer.
    fn demote(t: &mut Table, vpn: Vpn, value: u64) -> u32 {
        let g = t.select(vpn).or_else(|| t.select(vpn)).expect("selected");
        let buf = t.take_bufs(1).pop().expect("a free buffer");
        let print = pr(value);
        assert_eq!(
            t.commit(vpn, g, Outcome::Standby { buf, print }),
            Commit::Drop
        );
        buf
    }

    /// Sends the oldest page in standby out; returns it and where it went.
    fn flush_one(t: &mut Table) -> (Vpn, Dest) {
        let (v, g, _) = t.begin_flush(1).pop().expect("a page in standby");
        let dest = t.slot_for(v, g).expect("a slot");
        let (Dest::Write(slot) | Dest::Clean(slot)) = dest else {
            panic!("changed")
        };
        assert_eq!(t.commit(v, g, Outcome::Stored { slot }), Commit::Sent);
        (v, dest)
    }

    /// Page `vpn`, holding `value`, goes through standby to the cluster; returns where.
    fn evict(t: &mut Table, vpn: Vpn, value: u64) -> Dest {
        demote(t, vpn, value);
        let (v, dest) = flush_one(t);
        assert_eq!(v, vpn);
        dest
    }

    /// Fetches out page `vpn` for a read, as holding `value`; returns its slot.
    fn fetch(t: &mut Table, vpn: Vpn, value: u64) -> u64 {
        let FaultPlan::Fetch { slot, gen } = t.on_missing(vpn) else {
            panic!("not fetched")
        };
        assert!(t.fetched(vpn, slot, gen, Some(pr(value))));
        slot
    }

    #[test]
    fn first_touch_is_zero_then_evicted_page_is_fetched_clean() {
        let mut t = Table::new(10, 4);
        assert_eq!(t.on_missing(7), FaultPlan::Zero);
        t.zeroed(7);
        // A page never stored is written to a new slot.
        let Dest::Write(slot) = evict(&mut t, 7, 5) else {
            panic!("a page never stored is written")
        };
        assert_eq!(fetch(&mut t, 7, 5), slot);
        // Referenced: the hand passes it once. Its copy has the fingerprint it was mapped
        // with: clean, nothing to write.
        assert_eq!(t.select(7), None);
        assert_eq!(evict(&mut t, 7, 5), Dest::Clean(slot));
        assert_eq!(t.slots_used(), 1);
    }

    #[test]
    fn a_page_whose_bytes_changed_is_dirty_and_one_changed_back_is_clean() {
        let mut t = Table::new(10, 4);
        t.zeroed(1);
        let Dest::Write(slot) = evict(&mut t, 1, 5) else {
            panic!("written")
        };
        fetch(&mut t, 1, 5);
        // Mapped writable: the program's write is not seen, its copy's fingerprint is.
        assert_eq!(evict(&mut t, 1, 6), Dest::Write(slot), "reuses its slot");
        fetch(&mut t, 1, 6);
        assert_eq!(evict(&mut t, 1, 6), Dest::Clean(slot));
        // A fault for a write maps it without a fingerprint: dirty whatever its bytes.
        let FaultPlan::Fetch { slot, gen } = t.on_missing(1) else {
            panic!()
        };
        assert!(t.fetched(1, slot, gen, None));
        assert_eq!(evict(&mut t, 1, 6), Dest::Write(slot));
    }

    #[test]
    fn faults_on_an_evicting_page_wait_and_discards_win() {
        let mut t = Table::new(10, 4);
        // While the evictor copies it.
        let g = t.select(3).unwrap();
        assert_eq!(t.on_missing(3), FaultPlan::Defer);
        assert!(!t.on_write_protect(3));
        t.forget(3, 1);
        let buf = t.take_bufs(1)[0];
        let print = pr(9);
        assert_eq!(
            t.commit(3, g, Outcome::Standby { buf, print }),
            Commit::Leave
        );
        assert_eq!(
            (t.free_bufs(), t.in_standby()),
            (4, 0),
            "its buffer is back"
        );
        // While it is sent out.
        t.zeroed(3);
        demote(&mut t, 3, 9);
        let (v, g, _) = t.begin_flush(1)[0];
        assert_eq!(t.on_missing(v), FaultPlan::Defer);
        let Dest::Write(s) = t.slot_for(v, g).unwrap() else {
            panic!("no slot")
        };
        t.forget(3, 1);
        assert_eq!(t.commit(3, g, Outcome::Stored { slot: s }), Commit::Leave);
        assert_eq!(t.on_missing(3), FaultPlan::Zero);
        assert_eq!(t.slots_used(), 0);
        assert_eq!((t.free_bufs(), t.in_standby()), (4, 0));
    }

    #[test]
    fn a_stale_missing_report_keeps_a_mapped_page_and_its_slot() {
        let mut t = Table::new(10, 4);
        t.zeroed(4);
        let Dest::Write(slot) = evict(&mut t, 4, 2) else {
            panic!("no slot")
        };
        let FaultPlan::Fetch { slot: s, gen } = t.on_missing(4) else {
            panic!("not fetched")
        };
        assert_eq!(s, slot);
        assert!(t.read_ahead(4, slot, gen, pr(2)));
        // A second report for it, read after it was mapped: no zero page can be placed, and
        // the entry is untouched — it keeps its fingerprint, so dropping it needs no write.
        assert_eq!(t.on_missing(4), FaultPlan::Zero);
        assert_eq!(t.slots_used(), 1);
        assert_eq!(evict(&mut t, 4, 2), Dest::Clean(slot));
        // Had the program dropped it, the zero page is placed and the slot goes back.
        t.zeroed(4);
        assert_eq!(t.slots_used(), 0);
    }

    #[test]
    fn a_fetch_is_not_mapped_when_the_page_changed() {
        let mut t = Table::new(10, 4);
        t.zeroed(5);
        evict(&mut t, 5, 1);
        let FaultPlan::Fetch { slot, gen } = t.on_missing(5) else {
            panic!()
        };
        t.forget(5, 1);
        assert!(!t.still(5, slot, gen));
        assert!(!t.fetched(5, slot, gen, None));
    }

    #[test]
    fn remap_moves_out_pages_and_cancels_evictions() {
        let mut t = Table::new(10, 4);
        t.zeroed(100);
        let Dest::Write(s) = evict(&mut t, 100, 1) else {
            panic!("no slot")
        };
        fetch(&mut t, 100, 1);
        t.zeroed(99);
        evict(&mut t, 99, 3);
        let g = t.select(100).or_else(|| t.select(100)).unwrap();
        t.remap(99, 500, 2);
        assert_eq!(t.on_missing(99), FaultPlan::Zero);
        assert!(matches!(t.on_missing(500), FaultPlan::Fetch { .. }));
        let buf = t.take_bufs(1)[0];
        let print = pr(1);
        assert_eq!(
            t.commit(100, g, Outcome::Standby { buf, print }),
            Commit::Leave
        );
        // The page moved with its bytes and their fingerprint.
        assert_eq!(
            t.get(501).unwrap().state,
            State::Resident {
                slot: Some(s),
                print: Some(pr(1))
            }
        );
    }

    #[test]
    fn a_page_in_standby_comes_back_locally_and_the_oldest_is_sent_out() {
        let mut t = Table::new(10, 2);
        let b1 = demote(&mut t, 1, 1);
        demote(&mut t, 2, 2);
        assert_eq!((t.in_standby(), t.free_bufs()), (2, 0));
        // A touch of page 1 (a read the clock would not have seen) is answered from its
        // buffer, which is free again, and the page has its second chance.
        assert_eq!(
            t.on_missing(1),
            FaultPlan::Local {
                buf: b1,
                clean: false
            }
        );
        assert!(t.standby_in(1, Some(pr(1))));
        assert_eq!(
            t.get(1).unwrap().state,
            State::Resident {
                slot: None,
                print: None
            },
            "no slot holds it: no fingerprint"
        );
        assert_eq!((t.in_standby(), t.free_bufs()), (1, 1));
        assert_eq!(t.select(1), None, "referenced: it keeps its place once");
        // The flush takes the oldest page still in standby (2, not 1) and sends it out.
        let taken = t.begin_flush(4);
        assert_eq!(taken.len(), 1);
        let (v, g, _) = taken[0];
        assert_eq!(v, 2);
        assert_eq!(
            t.on_missing(2),
            FaultPlan::Defer,
            "faults wait while it is sent"
        );
        let Dest::Write(slot) = t.slot_for(2, g).unwrap() else {
            panic!("a dirty page is written")
        };
        assert_eq!(t.commit(2, g, Outcome::Stored { slot }), Commit::Sent);
        assert_eq!((t.in_standby(), t.free_bufs()), (0, 2));
        assert!(matches!(t.on_missing(2), FaultPlan::Fetch { .. }));
        // A failed send keeps the page in standby, first in line.
        let b3 = demote(&mut t, 3, 3);
        let (v, g, _) = t.begin_flush(1)[0];
        assert_eq!(t.commit(v, g, Outcome::Kept), Commit::Leave);
        assert_eq!(t.begin_flush(1), vec![(3, g, b3)]);
        // A clean page back from standby keeps its fingerprint.
        fetch(&mut t, 2, 2);
        let b2 = demote(&mut t, 2, 2);
        assert_eq!(
            t.on_missing(2),
            FaultPlan::Local {
                buf: b2,
                clean: true
            }
        );
        assert!(t.standby_in(2, Some(pr(2))));
        assert_eq!(
            t.get(2).unwrap().state,
            State::Resident {
                slot: Some(slot),
                print: Some(pr(2))
            }
        );
    }

    #[test]
    fn full_store_is_an_error() {
        let mut t = Table::new(1, 4);
        t.zeroed(1);
        evict(&mut t, 1, 1);
        t.zeroed(2);
        demote(&mut t, 2, 2);
        let (v, g, _) = t.begin_flush(1)[0];
        assert_eq!(t.slot_for(v, g), Err(Full(1)));
        assert_eq!(t.commit(v, g, Outcome::Kept), Commit::Leave);
        assert!(!t.get(2).unwrap().evicting);
        assert_eq!(t.in_standby(), 1, "it stays in standby");
    }

    #[derive(Clone, Debug)]
    enum Op {
        Touch(u8, bool),
        Rewrite(u8),
        Demote(u8),
        Flush(u8),
        Forget(u8, u8),
        Remap(u8, u8, u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..32, any::<bool>()).prop_map(|(v, w)| Op::Touch(v, w)),
            (0u8..32).prop_map(Op::Rewrite),
            (0u8..32).prop_map(Op::Demote),
            (1u8..4).prop_map(Op::Flush),
            (0u8..32, 1u8..4).prop_map(|(v, n)| Op::Forget(v, n)),
            (0u8..32, 0u8..32, 1u8..4).prop_map(|(a, b, n)| Op::Remap(a, b, n)),
        ]
    }

    proptest! {
        /// A model of memory (page → value) against the table driving a simulated store and
        /// address space, where writes are silent (pages are mapped writable) and only the
        /// fingerprints of copies tell a clean page: every page always reads back what was
        /// last written to it, a page sent out as clean holds what its slot holds, no slot is
        /// held twice, and no standby buffer is lost or doubled.
        #[test]
        fn table_keeps_every_page(ops in proptest::collection::vec(op(), 1..200)) {
            let mut t = Table::new(64, 4);
            let mut model = [0u64; 64];
            // Simulated memory: resident pages and their values; the store's slots.
            let mut mem: BTreeMap<u64, u64> = BTreeMap::new();
            let mut store = [0u64; 64];
            // The standby buffers' bytes.
            let mut bufs = [0u64; 4];
            let mut value = 0u64;
            let fault_in = |t: &mut Table, mem: &mut BTreeMap<u64, u64>, store: &[u64; 64], bufs: &[u64; 4], v: u64, w: bool| {
                if mem.contains_key(&v) { return; }
                match t.on_missing(v) {
                    FaultPlan::Local { buf, .. } => {
                        let x = bufs[buf as usize];
                        mem.insert(v, x);
                        assert!(t.standby_in(v, (!w).then(|| pr(x))));
                    }
                    FaultPlan::Zero => { mem.insert(v, 0); t.zeroed(v); }
                    FaultPlan::Fetch { slot, gen } => {
                        let x = store[slot as usize];
                        assert!(t.fetched(v, slot, gen, (!w).then(|| pr(x))));
                        mem.insert(v, x);
                    }
                    FaultPlan::Defer => panic!("no eviction in flight"),
                }
            };
            for op in ops {
                match op {
                    Op::Touch(v, w) => {
                        let v = u64::from(v);
                        fault_in(&mut t, &mut mem, &store, &bufs, v, w);
                        if w {
                            value += 1;
                            mem.insert(v, value);
                            model[v as usize] = value;
                        }
                        prop_assert_eq!(mem[&v], model[v as usize]);
                    }
                    Op::Rewrite(v) => {
                        // A write fault that leaves the bytes as they were: mapped without a
                        // fingerprint, the page is sent out again, never taken for clean
                        // wrongly.
                        let v = u64::from(v);
                        fault_in(&mut t, &mut mem, &store, &bufs, v, true);
                    }
                    Op::Demote(v) => {
                        let v = u64::from(v);
                        if !mem.contains_key(&v) { continue; }
                        let Some(g) = t.select(v).or_else(|| t.select(v)) else { continue };
                        let Some(buf) = t.take_bufs(1).pop() else {
                            prop_assert_eq!(t.commit(v, g, Outcome::Kept), Commit::Leave);
                            continue;
                        };
                        let outcome = if mem[&v] == 0 {
                            t.give_back([buf]);
                            Outcome::Zero
                        } else {
                            bufs[buf as usize] = mem[&v];
                            Outcome::Standby { buf, print: pr(mem[&v]) }
                        };
                        prop_assert_eq!(t.commit(v, g, outcome), Commit::Drop);
                        mem.remove(&v);
                    }
                    Op::Flush(n) => {
                        for (v, g, buf) in t.begin_flush(usize::from(n)) {
                            prop_assert_eq!(t.on_missing(v), FaultPlan::Defer);
                            let s = match t.slot_for(v, g).unwrap() {
                                Dest::Write(s) => { store[s as usize] = bufs[buf as usize]; s }
                                Dest::Clean(s) => {
                                    prop_assert_eq!(store[s as usize], bufs[buf as usize], "clean page differs from its slot");
                                    s
                                }
                                Dest::Changed => panic!("changed without a change"),
                            };
                            prop_assert_eq!(t.commit(v, g, Outcome::Stored { slot: s }), Commit::Sent);
                        }
                    }
                    Op::Forget(v, n) => {
                        let (v, n) = (u64::from(v), u64::from(n));
                        t.forget(v, n);
                        for p in v..(v + n).min(64) { mem.remove(&p); model[p as usize] = 0; }
                    }
                    Op::Remap(a, b, n) => {
                        let (a, b, n) = (u64::from(a), u64::from(b), u64::from(n));
                        if a + n > 64 || b + n > 64 || (a < b + n && b < a + n) { continue; }
                        t.remap(a, b, n);
                        let vals: Vec<u64> = (a..a + n).map(|p| model[p as usize]).collect();
                        let res: Vec<Option<u64>> = (a..a + n).map(|p| mem.remove(&p)).collect();
                        for p in b..b + n { mem.remove(&p); }
                        for i in 0..n {
                            model[(a + i) as usize] = 0;
                            model[(b + i) as usize] = vals[i as usize];
                            if let Some(x) = res[i as usize] { mem.insert(b + i, x); }
                        }
                    }
                }
                prop_assert_eq!(t.in_standby() + t.free_bufs(), 4, "a standby buffer lost or doubled");
            }
            // Read everything back.
            for v in 0..64u64 {
                fault_in(&mut t, &mut mem, &store, &bufs, v, false);
                prop_assert_eq!(mem[&v], model[v as usize], "page {}", v);
            }
            // Every buffer is free or held by one entry; none is both or twice.
            prop_assert_eq!(t.in_standby(), 0);
            let mut free = t.free_bufs.clone();
            free.sort_unstable();
            prop_assert_eq!(free, vec![0, 1, 2, 3]);
            let mut held: Vec<u64> = t.pages.values().filter_map(|e| e.slot()).collect();
            let n = held.len();
            held.sort_unstable();
            held.dedup();
            prop_assert_eq!(held.len(), n, "a slot is held twice");
            prop_assert_eq!(t.slots_used(), n as u64);
        }
    }
}
