//! The asynchronous form of the multi-page API: submit the reads or writes of many pages and
//! come back for them later, so that a front end keeps many requests in flight from one thread
//! (the NBD server's connection thread submits, and one completer thread per connection ends
//! the submissions in order) instead of blocking a thread per request.
//!
//! [`RemoteMemory::submit_read`] and [`RemoteMemory::submit_write`] take the pages' slots and
//! post their splits as runs (as [`RemoteMemory::read_list`] does), then return at once with a
//! submission that owns the pages' buffers. [`PendingRead::wait`] / [`PendingWrite::wait`]
//! end it from any thread: completions then wake that thread. `is_ready` says, without
//! blocking, whether every page of the first window has what it needs.
//!
//! Invariants:
//! - a submission's operations point only into its own heap buffer, allocated once and freed
//!   only after every operation of the submission is closed (its window is ended or dropped
//!   first), so no completer ever writes freed memory, and moving the submission moves nothing
//!   they point to;
//! - the pages of one window (at most [`super::batch::WINDOW`], and no more than the slots free
//!   at submission) are in flight after `submit_*` returns; the rest of a longer submission is
//!   read or written window after window inside `wait`. Neither ever blocks for a slot
//!   (slots held by submissions not yet waited for come back only when they are): with none
//!   free, submitting leaves everything to `wait`, and `wait` retries until the operation
//!   timeout, then fails with [`IoError::NoSlot`] saying so;
//! - dropping a submission without waiting closes its operations: late replies are dropped,
//!   and a dropped write may or may not have landed, as a failed one.

use std::ptr::NonNull;
use std::time::Instant;

use super::batch::{ReadWindow, WriteWindow};
use super::{IoError, Page, RemoteMemory};
use crate::PAGE_SIZE;

/// Page buffers owned through a raw pointer, so that operations may point into them while the
/// submission holding them moves (a `Box` would claim unique access whenever it moves).
struct Buffer {
    pages: NonNull<[Page]>,
}

impl Buffer {
    fn new(pages: Box<[Page]>) -> Buffer {
        Buffer {
            pages: NonNull::from(Box::leak(pages)),
        }
    }

    /// Pointers to every page, in order.
    fn pointers(&self) -> impl Iterator<Item = *mut Page> + '_ {
        let base = self.pages.as_ptr().cast::<Page>();
        // SAFETY: `i < len`: inside the allocation.
        (0..self.pages.len()).map(move |i| unsafe { base.add(i) })
    }

    /// The pages back as a box; the caller must have ended every operation pointing into
    /// them.
    fn into_box(self) -> Box<[Page]> {
        let pages = self.pages;
        std::mem::forget(self);
        // SAFETY: allocated by `Box::leak` in `new` and not freed (`self` was forgotten).
        unsafe { Box::from_raw(pages.as_ptr()) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: allocated by `Box::leak` in `new`; its owner drops it after its operations
        // (field order), so nothing points into it any more.
        drop(unsafe { Box::from_raw(self.pages.as_ptr()) });
    }
}

/// Reads submitted with [`RemoteMemory::submit_read`].
pub struct PendingRead<'c> {
    // Field order matters: the window (and its operations) is dropped before the buffer.
    window: Option<ReadWindow<'c>>,
    client: &'c RemoteMemory,
    addrs: Vec<u64>,
    /// Pages the first window took (the rest are read in `wait`).
    taken: usize,
    buffer: Buffer,
}

/// Writes submitted with [`RemoteMemory::submit_write`].
pub struct PendingWrite<'c> {
    // Field order matters: the window (and its operations) is dropped before the buffer.
    window: Option<WriteWindow<'c>>,
    client: &'c RemoteMemory,
    addrs: Vec<u64>,
    taken: usize,
    buffer: Buffer,
}

// SAFETY: the raw pointers of a submission (in its window, and its buffer's) reach only its
// own buffer, which it owns: moving the submission to another thread moves ownership of all
// they point to. Completers write the buffer concurrently whichever thread owns it, as they
// do for a blocked owner, and `wait` registers the thread that waits. The rest (operations,
// plans, errors) is `Send`.
unsafe impl Send for PendingRead<'_> {}
// SAFETY: as for `PendingRead`; completers never write a write's pages.
unsafe impl Send for PendingWrite<'_> {}

impl RemoteMemory {
    /// Submits the reads of the pages at `addrs` (page-aligned, inside the address space) and
    /// returns at once, with the first window's pages in flight (see the module doc).
    pub fn submit_read(&self, addrs: Vec<u64>) -> Result<PendingRead<'_>, IoError> {
        for &a in &addrs {
            self.check_page(a)?;
        }
        let buffer = Buffer::new(vec![[0u8; PAGE_SIZE]; addrs.len()].into_boxed_slice());
        let items: Vec<(u64, *mut Page)> = addrs.iter().copied().zip(buffer.pointers()).collect();
        let window = if items.is_empty() {
            None
        } else {
            // SAFETY: distinct pointers into `buffer`, owned by the submission and freed only
            // after its window (field order); nothing else accesses it until `wait` returns
            // it.
            Some(unsafe { self.begin_read(&items, Instant::now(), false)? })
        };
        let taken = window.as_ref().map_or(0, ReadWindow::taken);
        Ok(PendingRead {
            window,
            client: self,
            addrs,
            taken,
            buffer,
        })
    }

    /// Submits the writes of `pages` (address, bytes; page-aligned, inside the address space,
    /// written in list order) and returns at once, with the first window's pages in flight
    /// (see the module doc).
    pub fn submit_write(&self, pages: Vec<(u64, Page)>) -> Result<PendingWrite<'_>, IoError> {
        for (a, _) in &pages {
            self.check_page(*a)?;
        }
        let (addrs, data): (Vec<u64>, Vec<Page>) = pages.into_iter().unzip();
        let buffer = Buffer::new(data.into_boxed_slice());
        let items: Vec<(u64, *const Page)> = addrs
            .iter()
            .copied()
            .zip(buffer.pointers().map(|p| p.cast_const()))
            .collect();
        let window = if items.is_empty() {
            None
        } else {
            // SAFETY: pointers into `buffer`, owned by the submission, never written, and
            // freed only after its window (field order).
            Some(unsafe { self.begin_write(&items, Instant::now(), false)? })
        };
        let taken = window.as_ref().map_or(0, WriteWindow::taken);
        Ok(PendingWrite {
            window,
            client: self,
            addrs,
            taken,
            buffer,
        })
    }
}

impl PendingRead<'_> {
    /// Pages submitted.
    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    /// Whether nothing was submitted.
    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    /// Whether `wait` would return without waiting for a node: every page of the first window
    /// has what it needs (and concluded), and no later window is left. Never blocks.
    pub fn is_ready(&mut self) -> bool {
        let window_done = match &mut self.window {
            Some(w) => self.client.look_read(w),
            None => true,
        };
        window_done && self.taken == self.addrs.len()
    }

    /// Waits until every page is read (from the calling thread, whichever submitted) and
    /// returns them, in the order of the addresses submitted. On error, none is returned.
    pub fn wait(mut self) -> Result<Box<[Page]>, IoError> {
        let start = Instant::now();
        if let Some(w) = self.window.take() {
            self.client.end_read(w)?;
        }
        let items: Vec<(u64, *mut Page)> = self
            .addrs
            .iter()
            .copied()
            .zip(self.buffer.pointers())
            .collect();
        let mut done = self.taken;
        while done < items.len() {
            // SAFETY: distinct pointers into the submission's buffer, which nothing else
            // accesses (earlier windows are ended).
            let w = unsafe { self.client.begin_read(&items[done..], start, false)? };
            if w.taken() == 0 {
                self.client.no_slot_yet("read", items[done].0, start)?;
                continue;
            }
            done += self.client.end_read(w)?;
        }
        let PendingRead { buffer, .. } = self;
        Ok(buffer.into_box())
    }
}

impl PendingWrite<'_> {
    /// Pages submitted.
    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    /// Whether nothing was submitted.
    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    /// Whether `wait` would return without waiting for a node: every page of the first window
    /// is acknowledged as the mode requires (or certainly failed), and no later window is
    /// left. Never blocks.
    pub fn is_ready(&self) -> bool {
        let window_done = self
            .window
            .as_ref()
            .is_none_or(|w| self.client.write_ready(w));
        window_done && self.taken == self.addrs.len()
    }

    /// Waits until every page is acknowledged as the mode requires (from the calling thread,
    /// whichever submitted).
    pub fn wait(mut self) -> Result<(), IoError> {
        let start = Instant::now();
        if let Some(w) = self.window.take() {
            self.client.end_write(w)?;
        }
        let items: Vec<(u64, *const Page)> = self
            .addrs
            .iter()
            .copied()
            .zip(self.buffer.pointers().map(|p| p.cast_const()))
            .collect();
        let mut done = self.taken;
        while done < items.len() {
            // SAFETY: pointers into the submission's buffer, valid and unchanged until it is
            // dropped, after this call.
            let w = unsafe { self.client.begin_write(&items[done..], start, false)? };
            if w.taken() == 0 {
                self.client.no_slot_yet("write", items[done].0, start)?;
                continue;
            }
            done += self.client.end_write(w)?;
        }
        Ok(())
    }
}

impl RemoteMemory {
    /// A submission found no free slot to go on with: waits a little for one (slots come free
    /// as other threads end their operations), or fails once the operation timeout has passed
    /// since `start` — all slots may be held by submissions of the calling thread itself.
    fn no_slot_yet(&self, what: &'static str, addr: u64, start: Instant) -> Result<(), IoError> {
        if start.elapsed() >= self.config.op_timeout {
            return Err(IoError::NoSlot {
                what,
                addr,
                slots: self.config.max_in_flight,
                waited: start.elapsed(),
            });
        }
        std::thread::park_timeout(std::time::Duration::from_millis(1));
        Ok(())
    }
}
