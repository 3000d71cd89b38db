//! The write-behind queue: pages the remote copy acknowledged, waiting for the drain thread to
//! write them to the backup file.
//!
//! It keeps the latest bytes of each address only (a rewrite replaces the queued bytes), holds
//! at most `capacity` pages (a writer waits for room: backpressure, never unbounded memory),
//! and stamps every entry with a sequence number that a rewrite changes. The drainer copies an
//! entry, writes it, and removes it only if its number is unchanged — an entry rewritten
//! meanwhile stays for the next pass — so an address leaves the queue only once the file holds
//! its latest bytes. Readers look here first: a queued page is the freshest copy there is.
//! Entries are handed to the drainer in address order from a cursor that moves on, so pages
//! rewritten over and over cannot keep the others waiting.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::client::Page;

/// One queued page.
struct Entry {
    seq: u64,
    bytes: Arc<Page>,
}

struct State {
    entries: BTreeMap<u64, Entry>,
    next_seq: u64,
    /// Where the drainer's next batch starts.
    cursor: u64,
    closed: bool,
    /// Writers waiting for room.
    waiting: usize,
}

/// A page handed to the drainer: (address, sequence number, bytes).
pub(super) type Queued = (u64, u64, Arc<Page>);

/// The queue (see the module doc).
pub(super) struct Queue {
    state: Mutex<State>,
    capacity: usize,
    /// Signalled when entries leave: writers waiting for room, and [`Queue::wait_empty`].
    left: Condvar,
    /// Signalled when entries arrive or the queue closes: the drainer.
    arrived: Condvar,
}

impl Queue {
    /// An empty queue of at most `capacity` pages (at least 1).
    pub(super) fn new(capacity: usize) -> Queue {
        Queue {
            state: Mutex::new(State {
                entries: BTreeMap::new(),
                next_seq: 0,
                cursor: 0,
                closed: false,
                waiting: 0,
            }),
            capacity: capacity.max(1),
            left: Condvar::new(),
            arrived: Condvar::new(),
        }
    }

    /// Queues `pages` in order, the latest bytes of an address replacing what is queued for
    /// it; waits for room while the queue is full. Returns `false`, queuing nothing more,
    /// once the queue is closed (the caller then writes the rest itself).
    pub(super) fn push<'p>(&self, pages: impl IntoIterator<Item = (u64, &'p Page)>) -> bool {
        let mut st = self.state.lock();
        for (addr, page) in pages {
            while !st.closed && !st.entries.contains_key(&addr) && st.entries.len() >= self.capacity
            {
                st.waiting += 1;
                self.left.wait(&mut st);
                st.waiting -= 1;
            }
            if st.closed {
                return false;
            }
            st.next_seq += 1;
            let entry = Entry {
                seq: st.next_seq,
                bytes: Arc::new(*page),
            };
            st.entries.insert(addr, entry);
            self.arrived.notify_one();
        }
        metrics::gauge!("hydramem_backup_queue_pages").set(st.entries.len() as f64);
        true
    }

    /// Copies the queued bytes of `addr` into `page`; `false` if none are queued.
    pub(super) fn get(&self, addr: u64, page: &mut Page) -> bool {
        match self.state.lock().entries.get(&addr) {
            Some(e) => {
                page.copy_from_slice(&e.bytes[..]);
                true
            }
            None => false,
        }
    }

    /// Pages queued.
    pub(super) fn len(&self) -> usize {
        self.state.lock().entries.len()
    }

    /// Writers waiting for room.
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        self.state.lock().waiting
    }

    /// Waits for entries and hands out up to `max` of them (they stay queued until
    /// [`Queue::remove_if`]); `None` once the queue is closed and empty.
    pub(super) fn next_batch(&self, max: usize) -> Option<Vec<Queued>> {
        let mut st = self.state.lock();
        while st.entries.is_empty() {
            if st.closed {
                return None;
            }
            self.arrived.wait(&mut st);
        }
        let from = st.cursor;
        let batch: Vec<Queued> = st
            .entries
            .range(from..)
            .chain(st.entries.range(..from))
            .take(max)
            .map(|(&a, e)| (a, e.seq, e.bytes.clone()))
            .collect();
        st.cursor = batch.last().map_or(0, |&(a, _, _)| a.wrapping_add(1));
        Some(batch)
    }

    /// The sequence number queued for `addr`, if any.
    pub(super) fn seq_of(&self, addr: u64) -> Option<u64> {
        self.state.lock().entries.get(&addr).map(|e| e.seq)
    }

    /// Removes `addr` if its entry still has sequence number `seq` (nothing rewrote it since
    /// it was handed out).
    pub(super) fn remove_if(&self, addr: u64, seq: u64) {
        let mut st = self.state.lock();
        if st.entries.get(&addr).is_some_and(|e| e.seq == seq) {
            st.entries.remove(&addr);
            self.removed(&st);
        }
    }

    /// Removes `addr` whatever is queued for it (the file holds newer bytes).
    pub(super) fn remove(&self, addr: u64) {
        let mut st = self.state.lock();
        if st.entries.remove(&addr).is_some() {
            self.removed(&st);
        }
    }

    fn removed(&self, st: &State) {
        metrics::gauge!("hydramem_backup_queue_pages").set(st.entries.len() as f64);
        self.left.notify_all();
    }

    /// Waits until the queue is empty.
    pub(super) fn wait_empty(&self) {
        let mut st = self.state.lock();
        while !st.entries.is_empty() {
            self.left.wait(&mut st);
        }
    }

    /// Closes the queue: pushes are refused from now on, and the drainer stops once it has
    /// written what is queued.
    pub(super) fn close(&self) {
        let mut st = self.state.lock();
        st.closed = true;
        self.arrived.notify_all();
        self.left.notify_all();
    }
}
