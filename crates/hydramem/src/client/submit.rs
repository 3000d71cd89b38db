//! The asynchronous form of the multi-page API: submit the reads or writes of many pages and
//! come back for them later, so that a front end keeps many requests in flight from one thread
//! (the NBD server's connection thread submits, and one completer thread per connection ends
//! the submissions in order) instead of blocking a thread per request.
//!
//! [`RemoteMemory::submit_read`] and [`RemoteMemory::submit_write`] take the pages' slots and
//! post their splits as runs (as [`RemoteMemory::read_list`] does), then return at once with a
//! submission that owns the pages' buffers. [`PendingRead::wait`] / [`PendingWrite::wait`]
//! end it from any thread: completions then wake that thread. `is_ready` says, without
//! blocking, whether every page has what it needs.
//!
//! Slots held by submissions come back only when their submissions are ended, and one thread
//! may end many (the NBD server's completer ends every READ its connection started), so
//! neither submitting nor waiting ever waits for a slot: such a wait could be for a slot that
//! only the waiting thread would give back, a deadlock.
//!
//! Invariants:
//! - a submission's operations point only into its own heap buffer, allocated once and freed
//!   only after every operation of the submission is closed (its window is ended or dropped
//!   first), so no completer ever writes freed memory, and moving the submission moves nothing
//!   they point to;
//! - a submission is one window: at most [`WINDOW`] pages
//!   ([`IoError::SubmissionTooLarge`] beyond), all in flight when `submit_*` returns; it takes
//!   every page's slot at once or none ([`IoError::NoSlot`], nothing sent), so `wait` needs no
//!   slot but those it holds;
//! - a page that needs a second attempt (a read that met a write in flight, a write refused
//!   as stale or short of nodes) fails `wait` with [`IoError::Again`]: the caller does it again
//!   with a call that may wait for a slot;
//! - dropping a submission without waiting closes its operations: late replies are dropped,
//!   and a dropped write may or may not have landed, as a failed one.

use std::ptr::NonNull;
use std::time::Instant;

use super::batch::{ReadWindow, Taking, WriteWindow, WINDOW};
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
    pages: usize,
    buffer: Buffer,
}

/// Writes submitted with [`RemoteMemory::submit_write`].
pub struct PendingWrite<'c> {
    // Field order matters: the window (and its operations) is dropped before the buffer.
    window: Option<WriteWindow<'c>>,
    client: &'c RemoteMemory,
    pages: usize,
    _buffer: Buffer,
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
    /// Submits the reads of the pages at `addrs` (page-aligned, inside the address space, at
    /// most [`WINDOW`]) and returns at once with all of them in flight, or fails without
    /// sending anything if not every page's slot is free (see the module doc).
    pub fn submit_read(&self, addrs: Vec<u64>) -> Result<PendingRead<'_>, IoError> {
        self.check_submission("read", &addrs)?;
        let buffer = Buffer::new(vec![[0u8; PAGE_SIZE]; addrs.len()].into_boxed_slice());
        let items: Vec<(u64, *mut Page)> = addrs.iter().copied().zip(buffer.pointers()).collect();
        let window = if items.is_empty() {
            None
        } else {
            // SAFETY: distinct pointers into `buffer`, owned by the submission and freed only
            // after its window (field order); nothing else accesses it until `wait` returns
            // it.
            Some(unsafe { self.begin_read(&items, Instant::now(), Taking::Submission)? })
        };
        debug_assert!(window.as_ref().is_none_or(|w| w.taken() == addrs.len()));
        Ok(PendingRead {
            window,
            client: self,
            pages: addrs.len(),
            buffer,
        })
    }

    /// Submits the writes of `pages` (address, bytes; page-aligned, inside the address space,
    /// written in list order, at most [`WINDOW`]) and returns at once with all of them in
    /// flight, or fails without sending anything if not every page's slot is free (see the
    /// module doc).
    pub fn submit_write(&self, pages: Vec<(u64, Page)>) -> Result<PendingWrite<'_>, IoError> {
        let (addrs, data): (Vec<u64>, Vec<Page>) = pages.into_iter().unzip();
        self.check_submission("write", &addrs)?;
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
            Some(unsafe { self.begin_write(&items, Instant::now(), Taking::Submission)? })
        };
        debug_assert!(window.as_ref().is_none_or(|w| w.taken() == addrs.len()));
        Ok(PendingWrite {
            window,
            client: self,
            pages: addrs.len(),
            _buffer: buffer,
        })
    }
}

impl PendingRead<'_> {
    /// Pages submitted.
    pub fn len(&self) -> usize {
        self.pages
    }

    /// Whether nothing was submitted.
    pub fn is_empty(&self) -> bool {
        self.pages == 0
    }

    /// Whether `wait` would return without waiting for a node: every page has what it needs
    /// (and is concluded). Never blocks.
    pub fn is_ready(&mut self) -> bool {
        match &mut self.window {
            Some(w) => self.client.look_read(w),
            None => true,
        }
    }

    /// Waits until every page is read (from the calling thread, whichever submitted) and
    /// returns them, in the order of the addresses submitted. On error, none is returned.
    /// Never waits for a slot (see the module doc).
    pub fn wait(mut self) -> Result<Box<[Page]>, IoError> {
        if let Some(w) = self.window.take() {
            self.client.end_read(w)?;
        }
        let PendingRead { buffer, .. } = self;
        Ok(buffer.into_box())
    }
}

impl PendingWrite<'_> {
    /// Pages submitted.
    pub fn len(&self) -> usize {
        self.pages
    }

    /// Whether nothing was submitted.
    pub fn is_empty(&self) -> bool {
        self.pages == 0
    }

    /// Whether `wait` would return without waiting for a node: every page is acknowledged as
    /// the mode requires (or certainly failed). Never blocks.
    pub fn is_ready(&self) -> bool {
        self.window
            .as_ref()
            .is_none_or(|w| self.client.write_ready(w))
    }

    /// Waits until every page is acknowledged as the mode requires (from the calling thread,
    /// whichever submitted). Never waits for a slot (see the module doc).
    pub fn wait(mut self) -> Result<(), IoError> {
        match self.window.take() {
            Some(w) => self.client.end_write(w).map(drop),
            None => Ok(()),
        }
    }
}

impl RemoteMemory {
    /// Refuses a submission of `addrs` that is not all pages of the address space, or is
    /// larger than one window.
    fn check_submission(&self, what: &'static str, addrs: &[u64]) -> Result<(), IoError> {
        for &a in addrs {
            self.check_page(a)?;
        }
        if addrs.len() > WINDOW {
            return Err(IoError::SubmissionTooLarge {
                what,
                pages: addrs.len(),
                max: WINDOW,
            });
        }
        Ok(())
    }
}
