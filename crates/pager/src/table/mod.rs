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
    /// The kernel refused to drop it (the program locked it, mlock): it stays resident,
    /// and the clock does not select it again until the program unlocks it (munlock).
    pub locked: bool,
}

impl Entry {
    /// A resident page with no slot, with generation `gen`: one the program touched first
    /// (`referenced`: the pager zero-filled it) or that the kernel mapped unseen.
    fn resident(gen: u64, referenced: bool) -> Entry {
        Entry {
            state: State::Resident {
                slot: None,
                print: None,
            },
            referenced,
            evicting: false,
            gen,
            locked: false,
        }
    }

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
    /// Slots freed since the pager last told the store to forget them ([`Table::take_freed`]),
    /// every one of them still free.
    freed: Vec<u64>,
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
            self.freed.push(s);
        }
    }

    fn alloc(&mut self) -> Result<u64, Full> {
        if let Some(s) = self.free.pop() {
            // Taken again before the store was told: not to be forgotten now (the write the
            // slot is taken for replaces what it held).
            if let Some(i) = self.freed.iter().rposition(|&f| f == s) {
                self.freed.swap_remove(i);
            }
            return Ok(s);
        }
        if self.next_slot == self.slots {
            return Err(Full(self.slots));
        }
        self.next_slot += 1;
        Ok(self.next_slot - 1)
    }

    /// The slots freed since the last call, all still free: what they hold will never be
    /// read (the store may count it as garbage, see `PageStore::forget`). The caller tells
    /// the store before it lets go of the table's lock, so that no slot is taken again and
    /// written before the store forgets it.
    pub fn take_freed(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.freed)
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
            locked: false,
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
                locked: false,
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
        let old = self.pages.insert(vpn, Entry::resident(g, true));
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
        let e = self.pages.entry(vpn).or_insert(Entry::resident(g, false));
        if e.evicting || e.locked || !matches!(e.state, State::Resident { .. }) {
            return None;
        }
        if e.referenced {
            e.referenced = false;
            return None;
        }
        e.evicting = true;
        Some(e.gen)
    }

    /// The kernel refused to drop page `vpn`, which `commit` had just put in standby or
    /// found all zeros, because the program locked it (mlock): it is resident again — its
    /// buffer free, its slot kept but not clean (the copy's fingerprint is not known to be
    /// the slot's), its place in the standby line stale — and `locked`, so the clock never
    /// selects it again until the program unlocks it (`unlock`) or unmaps it (which forgets
    /// the entry).
    pub fn undo_drop(&mut self, vpn: Vpn) {
        let g = self.gen();
        let e = self.pages.entry(vpn).or_insert(Entry::resident(g, false));
        e.gen = g;
        e.locked = true;
        if let State::Standby { slot, buf, .. } = e.state {
            e.state = State::Resident { slot, print: None };
            self.left_standby(buf);
        }
    }

    /// The program unlocked the `n` pages from `first` (munlock): those `undo_drop` marked
    /// locked may be selected again.
    pub fn unlock(&mut self, first: Vpn, n: u64) {
        for e in self
            .pages
            .range_mut(first..first.saturating_add(n))
            .map(|(_, e)| e)
        {
            e.locked = false;
        }
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
                match outcome {
                    Outcome::Standby { buf, .. } => self.free_bufs.push(buf),
                    // Written to a slot that the program freed meanwhile: the write may have
                    // landed after the store was told to forget the slot, so it is told again.
                    Outcome::Stored { slot }
                        if self.free.contains(&slot) && !self.freed.contains(&slot) =>
                    {
                        self.freed.push(slot)
                    }
                    _ => {}
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
                    locked: e.locked,
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
                        locked: false,
                    }
                }
                State::Out { .. } => Entry { gen: g, ..e },
            };
            self.pages.insert(to + (v - from), entry);
        }
    }
}

#[cfg(test)]
mod tests;
