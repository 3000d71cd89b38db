//! Back-pressure: while the program is far over its budget and the evictor is catching up,
//! the fault thread holds back the faults that would map more pages (first touches and
//! page-ins), as the kernel's direct reclaim makes an allocating task wait, so that a program
//! that allocates faster than pages can be written out stays near `--local-memory` instead of
//! running past it.
//!
//! Invariants:
//! - faults are held only while the evictor is draining (over the budget, with a batch under
//!   way or its last batch having dropped pages; not while the cluster refuses its writes or
//!   after a batch that found nothing to page out, and, while the pager connects, from the
//!   start); when it stops draining — under the budget, stuck (nothing left to page out),
//!   refused, paused for a fork, or stopped — it says so and the held faults go on at once;
//! - no fault is held longer than [`MAX_HOLD`], whatever the evictor does: back-pressure can
//!   slow a program, never hang it;
//! - the resident estimate is the evictor's last measurement plus the pages the fault thread
//!   mapped since: it may lag by a batch, never drift.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::PAGE;

/// How far over the budget faults are held. Twice the point where the evictor switches to its
/// large batches, so that it is already writing as fast as it can.
pub const HOLD_OVER: u64 = 8 << 20;
/// The longest one fault is held.
pub const MAX_HOLD: Duration = Duration::from_millis(50);

/// The state the fault thread and the evictor share for back-pressure.
pub struct Throttle {
    budget: u64,
    /// Resident anonymous bytes at the evictor's last measurement.
    measured: AtomicU64,
    /// Pages the fault thread mapped since that measurement.
    mapped_since: AtomicU64,
    /// The evictor is over the budget and dropping pages (or about to: see the module doc).
    draining: AtomicBool,
    /// Rung by the evictor after each batch, whenever it stops draining and when it hands
    /// faults it read to the fault thread; and at exit.
    bell: OwnedFd,
}

impl Throttle {
    /// Back-pressure for a budget of `budget` bytes.
    pub fn new(budget: u64) -> std::io::Result<Throttle> {
        // SAFETY: eventfd takes no pointers; the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Throttle {
            budget,
            measured: AtomicU64::new(0),
            mapped_since: AtomicU64::new(0),
            draining: AtomicBool::new(false),
            // SAFETY: `fd` is a new descriptor that nothing else owns.
            bell: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// The descriptor that becomes readable when the evictor rings.
    pub fn fd(&self) -> i32 {
        self.bell.as_raw_fd()
    }

    /// The fault thread mapped `pages` pages.
    pub fn mapped(&self, pages: u64) {
        self.mapped_since.fetch_add(pages, Ordering::Relaxed);
    }

    /// The evictor measured `rss` resident anonymous bytes.
    pub fn measured(&self, rss: u64) {
        self.measured.store(rss, Ordering::Relaxed);
        self.mapped_since.store(0, Ordering::Relaxed);
    }

    /// The resident anonymous bytes now, as far as the pager knows.
    pub fn estimate(&self) -> u64 {
        self.measured.load(Ordering::Relaxed)
            + self.mapped_since.load(Ordering::Relaxed) * PAGE as u64
    }

    /// The evictor is draining (or not): when it stops, the held faults go on.
    pub fn draining(&self, on: bool) {
        let was = self.draining.swap(on, Ordering::Relaxed);
        if was != on {
            tracing::debug!(
                "evictor {} draining at ~{} MiB resident",
                if on { "starts" } else { "stops" },
                self.estimate() >> 20
            );
        }
        if was && !on {
            self.ring();
        }
    }

    /// Whether a fault that maps a page should wait.
    pub fn hold(&self) -> bool {
        self.draining.load(Ordering::Relaxed) && self.estimate() > self.budget + HOLD_OVER
    }

    /// Wakes the fault thread (a batch was dropped, draining ended, faults were handed to
    /// it, or the program exits).
    pub fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd. A full counter (never
        // reached: the fault thread drains it) would only fail with EAGAIN.
        unsafe { libc::write(self.fd(), (&one as *const u64).cast(), 8) };
    }

    /// Clears the bell after it rang.
    pub fn drain(&self) {
        let mut n: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live u64; non-blocking, so EAGAIN when unrung.
        unsafe { libc::read(self.fd(), (&mut n as *mut u64).cast(), 8) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rung(t: &Throttle) -> bool {
        crate::uffd::readable(t.fd(), 0)
    }

    #[test]
    fn holds_only_while_draining_and_far_over() {
        let t = Throttle::new(64 << 20).unwrap();
        t.measured(80 << 20);
        assert!(!t.hold(), "the evictor is not draining yet");
        t.draining(true);
        assert!(t.hold());
        t.measured(70 << 20);
        assert!(!t.hold(), "within HOLD_OVER of the budget");
        // Pages the fault thread maps count until the evictor measures again.
        t.mapped((HOLD_OVER as usize / PAGE) as u64);
        assert_eq!(t.estimate(), (70 << 20) + HOLD_OVER);
        assert!(t.hold());
        t.measured(60 << 20);
        assert!(!t.hold());
    }

    #[test]
    fn the_bell_rings_when_draining_ends_and_is_cleared() {
        let t = Throttle::new(1 << 20).unwrap();
        t.draining(true);
        assert!(!rung(&t), "starting to drain wakes nobody");
        t.draining(false);
        assert!(rung(&t), "held faults must go on when draining ends");
        t.drain();
        assert!(!rung(&t));
        t.ring();
        t.ring();
        assert!(rung(&t));
        t.drain();
        assert!(!rung(&t), "one read clears every ring");
    }
}
