//! The pager of one process: its userfaultfd, its page table, the cluster store its pages
//! go out to, and the fault thread, which resolves every fault the kernel reports — a page
//! that is out is fetched and mapped writable with the fingerprint of its bytes (so a later
//! write costs the program no fault: the evictor tells a clean page by its fingerprint), a
//! first touch gets zeros, a write to a page the evictor is copying waits for it — and
//! follows the program's munmap and mremap (reports the evictor may read first, before it
//! drops a batch: [`Pager::take_reports`]).
//!
//! Invariants (with `table/mod.rs`):
//! - the lock of `Shared` is held while a report is read from the userfaultfd and while its
//!   decision is applied to memory, but never across a remote read or write: so the program's
//!   munmap/mremap (reported as events) and discards (the madvise hook) are ordered with every
//!   fault and every eviction commit;
//! - a page the store cannot return (more nodes lost than the scheme survives) is poisoned:
//!   the thread that touches it gets SIGBUS and a log line says which page, never other bytes.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use hydramem::backup::FrontStore;
use hydramem::client::IoError;
use hydramem::nbd::PageStore;
use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::ahead::Ahead;
use crate::print::Print;
use crate::regions::Region;
use crate::standby::Pool;
use crate::stats::{PageIn, Stats};
use crate::table::{FaultPlan, Table};
use crate::throttle::{Throttle, MAX_HOLD};
use crate::uffd::{Report, Uffd};
use crate::PAGE;

/// A page of zeros, mapped by a first write.
static ZEROS: [u8; PAGE] = [0; PAGE];

/// Pages after a first touch that get the zero page with it (64 KiB in all, the kernel's
/// fault-around window for files).
const ZERO_AHEAD: u64 = 15;

/// State shared by the fault thread, the evictor and the madvise hook.
pub struct Shared {
    /// The page table.
    pub table: Table,
    /// Faults that wait for the eviction in flight to end.
    pub waiters: Vec<usize>,
    /// The regions changed (munmap, mremap): the evictor reads /proc/self/maps again.
    pub rescan: bool,
    /// No eviction may start (a fork is being prepared).
    pub paused: bool,
    /// An eviction batch is between its selection and its commit.
    pub in_batch: bool,
    /// Whether page-ins read ahead (the fault thread's).
    pub ahead: Ahead,
    /// Missing faults the evictor read while it emptied the userfaultfd before a commit
    /// ([`Pager::take_reports`]), with when: the fault thread resolves them before any it
    /// reads itself (they came first).
    pub handed: VecDeque<(Instant, Fault)>,
}

impl Shared {
    /// Whether an eviction batch may start: not once a fork being prepared has seen none
    /// under way (`Pager::before_fork` waits only for one that had started), or pages dropped
    /// then would be missing from the child. One already started may go on.
    pub fn batch_may_start(&self) -> bool {
        !self.paused || self.in_batch
    }
}

/// One process's pager.
pub struct Pager {
    /// The program's userfaultfd.
    pub uffd: Uffd,
    /// What the fault thread, the evictor and the hook share.
    pub shared: Mutex<Shared>,
    /// Where pages go out to, and the scheme's store it comes from (kept open for the life
    /// of the process), once connected (`connected`). Nothing is out before: only the evictor
    /// sends pages out, and it starts after.
    store: OnceLock<(Arc<dyn PageStore>, FrontStore)>,
    /// What the pager did.
    pub stats: Stats,
    /// Back-pressure: faults held while the program is far over its budget.
    pub throttle: Throttle,
    /// Anonymous bytes the program may keep resident.
    pub budget: u64,
    /// Smallest mapping that is paged, in bytes.
    pub min_region: usize,
    /// Pages after a faulting page read with it when they are out too.
    pub read_ahead: u64,
    /// How long the fault thread looks for the next report before it sleeps (`--poll-us`).
    poll: Duration,
    /// Set at exit: no more evictions. The fault thread never stops: the program's exit
    /// path (later exit handlers, stdio flushes, other threads) may still touch pages that
    /// are out, up to the moment the process is gone.
    pub stop: AtomicBool,
    /// Wakes the evictor early (page-ins raise the resident memory).
    pub kick: Condvar,
    /// The lock `kick` waits with.
    pub kick_lock: Mutex<()>,
    /// The regions registered with the userfaultfd (the evictor's view).
    pub regions: Mutex<Vec<Region>>,
    /// The pages taken out of the program and not sent out yet (`standby.rs`).
    pub standby: Pool,
    /// `Shared::handed` holds faults: the fault thread looks before it sleeps.
    handed: AtomicBool,
    /// The fault thread runs, its per-thread state set up (`fault_loop`).
    ready: AtomicBool,
}

/// A missing fault: its address, whether a write, the faulting thread.
pub type Fault = (usize, bool, i32);

fn vpn(addr: usize) -> u64 {
    (addr / PAGE) as u64
}

impl Pager {
    /// A pager with a store of `slots` pages and a standby pool of `standby` pages, not
    /// connected yet: it resolves first touches and follows the program's mappings from now
    /// on, and pages out once `connected`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        uffd: Uffd,
        throttle: Throttle,
        slots: u64,
        budget: u64,
        min_region: usize,
        read_ahead: u64,
        poll: Duration,
        standby: u32,
    ) -> Pager {
        let standby = Pool::new(standby);
        Pager {
            uffd,
            shared: Mutex::new(Shared {
                table: Table::new(slots, standby.len()),
                waiters: Vec::new(),
                rescan: true,
                paused: false,
                in_batch: false,
                ahead: Ahead::new(read_ahead),
                handed: VecDeque::new(),
            }),
            store: OnceLock::new(),
            stats: Stats::default(),
            throttle,
            budget,
            min_region,
            read_ahead,
            poll,
            stop: AtomicBool::new(false),
            kick: Condvar::new(),
            kick_lock: Mutex::new(()),
            regions: Mutex::new(Vec::new()),
            standby,
            handed: AtomicBool::new(false),
            ready: AtomicBool::new(false),
        }
    }

    /// The pager is connected to the cluster through `front`.
    pub fn connected(&self, front: FrontStore) {
        let _ = self.store.set((front.store(), front));
    }

    /// What the span store holds and has done (its rows, garbage and compaction), for a
    /// span scheme once connected.
    pub fn span_stats(&self) -> Option<hydramem::span::SpanStats> {
        let (_, front) = self.store.get()?;
        front.span().map(|s| s.stats())
    }

    /// The store pages go out to; None before `connected`.
    pub fn store(&self) -> Option<&Arc<dyn PageStore>> {
        self.store.get().map(|(store, _)| store)
    }

    /// Waits until the userfaultfd has a report, the evictor rings, or `timeout` passes.
    fn wait_readable(&self, timeout: Duration) {
        let mut p = [self.uffd.fd(), self.throttle.fd()].map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: two valid pollfds for the duration of the call.
        unsafe { libc::poll(p.as_mut_ptr(), 2, ms) };
        if p[1].revents != 0 {
            self.throttle.drain();
        }
    }

    /// Looks for a report for `poll` before the fault thread sleeps in poll(2); whether one
    /// came. A program that faults on one page often faults on another soon after it runs
    /// again, and the wake-up from poll costs more than the look: redis under rep2-run served
    /// 6–17% more GETs with 30 µs than with none, the same with 100 (docs/benchmarks.md §12);
    /// `hydramem run` gives 300 µs, the time it also polls for a page's reply. Each look
    /// yields the core, which the program and the nodes share.
    fn spin_for_report(&self) -> bool {
        if self.handed.load(Ordering::Relaxed) {
            return true;
        }
        if self.poll.is_zero() {
            return false;
        }
        let until = Instant::now() + self.poll;
        loop {
            if self.pending() || self.handed.load(Ordering::Relaxed) {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::yield_now();
        }
    }

    /// Waits until the fault thread runs ([`Pager::fault_loop`]), saying so every 10 s while
    /// it does not (a stopped or frozen process): before, nothing may be registered — the
    /// C library's start of a thread reads the program's locale data, in its brk heap, and a
    /// fault thread that first ran after that page went out faulted on it itself, with no
    /// one to answer (seen: a python program hung at start).
    pub fn wait_ready(&self) {
        crate::hooks::wait_started("the pager's fault thread", || {
            self.ready.load(Ordering::Acquire)
        });
    }

    /// Whether reports are waiting to be read.
    pub fn pending(&self) -> bool {
        crate::uffd::readable(self.uffd.fd(), 0)
    }

    /// The fault thread: resolves reports for the life of the process. Missing faults are
    /// held back (in arrival order, each at most [`MAX_HOLD`]) while the throttle says the
    /// program is far over its budget; every other report is applied at once. The missing
    /// faults the evictor read before a commit ([`Pager::take_reports`]) come first.
    pub fn fault_loop(&self) {
        // What this thread keeps per thread with a destructor (parking_lot's thread data,
        // tracing's buffer) is registered with the library's own list, not under the
        // dynamic loader's lock (`hooks::__cxa_thread_atexit_impl`) — if that definition is
        // the one the process binds (a program may define its own). In case it is not, what
        // can be is set up now, before anything is registered (`wait_ready`), while no page
        // can be out: parking_lot's thread data (made by the first wait) and the thread's
        // handle.
        let _ = std::thread::current();
        {
            let (m, c) = (Mutex::new(()), Condvar::new());
            let _ = c.wait_for(&mut m.lock(), Duration::ZERO);
        }
        self.ready.store(true, Ordering::Release);
        // The faulting page and the pages read ahead with it.
        let mut pages = vec![[0u8; PAGE]; 1 + self.read_ahead as usize];
        let mut held: VecDeque<(Instant, Fault)> = VecDeque::new();
        let mut since_kick = 0u32;
        loop {
            let hold = self.throttle.hold() && !self.stop.load(Ordering::Relaxed);
            if let Some(&(at, fault)) = held.front() {
                let waited = at.elapsed();
                if !hold || waited >= MAX_HOLD {
                    held.pop_front();
                    self.stats.held(waited);
                    let s = self.shared.lock();
                    self.resolve(s, fault, Duration::ZERO, &mut pages, &mut since_kick);
                    continue;
                }
                self.wait_readable(MAX_HOLD - waited);
            } else if !self.spin_for_report() {
                self.wait_readable(Duration::from_millis(200));
            }
            let mut readable = Instant::now();
            let mut s = self.shared.lock();
            let mut lock_wait = readable.elapsed();
            let fault = if let Some((at, fault)) = s.handed.pop_front() {
                self.handed.store(!s.handed.is_empty(), Ordering::Relaxed);
                // Counted from when the evictor read it.
                readable = at;
                lock_wait = at.elapsed();
                fault
            } else {
                let Some(report) = self.next_report() else {
                    continue;
                };
                match self.apply(&mut s, report) {
                    Some(fault) => fault,
                    None => continue,
                }
            };
            if hold || !held.is_empty() {
                held.push_back((readable, fault));
                continue;
            }
            self.resolve(s, fault, lock_wait, &mut pages, &mut since_kick);
        }
    }

    /// Reads the next report from the userfaultfd, if one is pending (a failed read is
    /// logged, and read as none).
    fn next_report(&self) -> Option<Report> {
        self.uffd.read().unwrap_or_else(|e| {
            tracing::warn!("reading a fault report: {e}");
            None
        })
    }

    /// Applies a report under the lock — a write to a protected page, an unmap, a move —
    /// and gives back a missing fault, which its caller resolves or hands on.
    fn apply(&self, s: &mut Shared, report: Report) -> Option<Fault> {
        match report {
            Report::Missing { addr, write, tid } => return Some((addr, write, tid)),
            Report::WriteProtect { addr } => {
                Stats::add(&self.stats.write_protect_faults, 1);
                if s.table.on_write_protect(vpn(addr)) {
                    self.uffd.unprotect(addr);
                } else {
                    Stats::add(&self.stats.deferred, 1);
                    s.waiters.push(addr);
                }
            }
            Report::Remap { from, to, len } => {
                s.table.remap(vpn(from), vpn(to), (len / PAGE) as u64);
                self.forget_freed(s);
                s.rescan = true;
            }
            Report::Unmap { start, end } => {
                s.table.forget(vpn(start), ((end - start) / PAGE) as u64);
                self.forget_freed(s);
                s.rescan = true;
            }
        }
        None
    }

    /// Reads every report the userfaultfd holds and applies it under the lock `s`, handing
    /// the missing faults among them to the fault thread (which is woken): afterwards every
    /// unmap or move report queued before this call is applied. The evictor calls it before
    /// it drops pages, once its wait for the fault thread to empty the queue gave up: the
    /// kernel hands out faults before those reports, so under a stream of faults the wait
    /// may not end (476 of 12,551 commits in a memcached run), and the evictor used to drop
    /// the batch anyway — a page unmapped, or moved onto a chosen address, meanwhile could
    /// be dropped.
    pub fn take_reports(&self, s: &mut Shared) {
        let mut handed = false;
        while let Some(report) = self.next_report() {
            if let Some(fault) = self.apply(s, report) {
                s.handed.push_back((Instant::now(), fault));
                Stats::add(&self.stats.handed, 1);
                handed = true;
            }
        }
        if handed {
            self.handed.store(true, Ordering::Relaxed);
            self.throttle.ring();
        }
    }

    /// Resolves one missing fault under the lock `s`, and counts it.
    fn resolve(
        &self,
        s: MutexGuard<'_, Shared>,
        fault: Fault,
        lock_wait: Duration,
        pages: &mut [[u8; PAGE]],
        since_kick: &mut u32,
    ) {
        let start = Instant::now();
        if let Some(phases) = self.missing(s, fault, lock_wait, pages) {
            self.stats.page_in(start.elapsed(), phases);
            *since_kick += 1;
            if *since_kick >= 32 {
                *since_kick = 0;
                self.kick.notify_one();
            }
        }
    }

    /// Resolves a missing-page fault (`addr`, whether a write, the faulting thread), whose
    /// report waited `lock_wait` for the lock `s`; if the page came from the cluster, where
    /// its page-in's time went.
    fn missing(
        &self,
        mut s: MutexGuard<'_, Shared>,
        (addr, write, tid): Fault,
        lock_wait: Duration,
        pages: &mut [[u8; PAGE]],
    ) -> Option<PageIn> {
        let v = vpn(addr);
        match s.table.on_missing(v) {
            FaultPlan::Zero => {
                // A first write gets a page of zeros of its own: the shared zero page would be
                // read-only, and the write would fault again for the kernel to copy it.
                let mapped = if write {
                    self.uffd.copy(addr, &ZEROS)
                } else {
                    self.uffd.zero(addr)
                };
                if mapped {
                    s.table.zeroed(v);
                    self.throttle.mapped(1);
                    Stats::add(&self.stats.zero_fills, 1);
                    self.zero_ahead(&mut s, v);
                } else {
                    // Mapped meanwhile (or no longer registered): the entry, if any, is right.
                    self.uffd.wake(addr);
                    Stats::add(&self.stats.stale_reports, 1);
                }
                None
            }
            FaultPlan::Defer => {
                Stats::add(&self.stats.deferred, 1);
                s.waiters.push(addr);
                None
            }
            FaultPlan::Fetch { slot, gen } => {
                self.fetch(s, (addr, write, tid), (slot, gen), lock_wait, pages)
            }
            FaultPlan::Local { buf, clean } => {
                // SAFETY: the entry names `buf`, and the lock held keeps the evictor from
                // reserving it again until `standby_in` gives it back.
                let page = unsafe { self.standby.page(buf) };
                let print = (clean && !write).then(|| Print::of(page));
                if self.uffd.copy(addr, page) {
                    s.table.standby_in(v, print);
                    self.throttle.mapped(1);
                    Stats::add(&self.stats.standby_ins, 1);
                } else {
                    self.uffd.wake(addr);
                    Stats::add(&self.stats.stale_reports, 1);
                }
                None
            }
        }
    }

    /// After a first touch of page `v`: maps the shared zero page at the next pages the
    /// pager has never known (up to [`ZERO_AHEAD`], stopping at the first it knows or the
    /// kernel has mapped, or where the registered range ends), so that a program filling
    /// memory in order writes them with the kernel's own copy-on-write fault instead of a
    /// round trip to this thread each (first writes' p50 18 → 11 µs, docs/benchmarks.md §12,
    /// "Zeros ahead of a first touch"). A page never known to the pager and not mapped
    /// was never touched: zeros are its bytes. The zero page costs no memory until written,
    /// but the writes then escape the throttle, so nothing is mapped ahead while it holds
    /// faults back.
    fn zero_ahead(&self, s: &mut MutexGuard<'_, Shared>, v: u64) {
        if self.throttle.hold() {
            return;
        }
        for w in (v + 1)..=(v + ZERO_AHEAD) {
            if s.table.get(w).is_some() || !self.uffd.zero(w as usize * PAGE) {
                break;
            }
            s.table.zeroed(w);
            Stats::add(&self.stats.zeroed_ahead, 1);
        }
    }

    /// Fetches page `addr` (the fault: address, whether a write, the faulting thread) from
    /// `slot` and maps it with the pages read ahead, if the entry still has generation `gen`;
    /// where the page-in's time went.
    fn fetch(
        &self,
        s: MutexGuard<'_, Shared>,
        (addr, write, tid): Fault,
        (slot, gen): (u64, u64),
        lock_wait: Duration,
        pages: &mut [[u8; PAGE]],
    ) -> Option<PageIn> {
        let v = vpn(addr);
        let Some(store) = self.store() else {
            // Cannot be: a page is out only after the evictor, which starts once the
            // store is set, wrote it. Said, and the thread faults again.
            tracing::error!("page {addr:#x} is out but the pager has no store yet");
            self.uffd.wake(addr);
            return None;
        };
        // Read ahead, while the program's page-ins say it pays (`ahead.rs`): the next
        // pages, if they are out too, in the same batched read (a program's objects cross
        // page boundaries: redis's 4 KiB values sit in 5 KiB slots).
        let ahead: Vec<(u64, u64, u64)> = (1..=s.ahead.pages())
            .map_while(|d| s.table.out(v + d).map(|(sl, g)| (v + d, sl, g)))
            .collect();
        let evicting = s.in_batch;
        drop(s);
        let fetching = Instant::now();
        let pages = &mut pages[..1 + ahead.len()];
        let (read, ahead_read) = read_with_ahead(store.as_ref(), slot, &ahead, pages);
        let mapping = Instant::now();
        let fetch = mapping - fetching;
        // A page fetched for a write is dirty at once; the others are clean while their bytes
        // keep these fingerprints.
        let print = (read.is_ok() && !write).then(|| Print::of(&pages[0]));
        let ahead_prints: Vec<Print> = if ahead_read {
            pages[1..].iter().map(Print::of).collect()
        } else {
            Vec::new()
        };
        let mut s = self.shared.lock();
        if !s.table.still(v, slot, gen) {
            // The program discarded or moved it meanwhile: the thread faults again
            // and gets what the page is now.
            self.uffd.wake(addr);
            return None;
        }
        match read {
            Ok(()) => {
                if let Some(w) = s.ahead.paged_in(v) {
                    self.stats.ahead_window(w);
                }
                if self.uffd.copy(addr, &pages[0]) {
                    s.table.fetched(v, slot, gen, print);
                    self.throttle.mapped(1);
                } else {
                    self.uffd.wake(addr);
                }
                let woken = Instant::now();
                // After the faulting page, so its thread runs on at once. Mapping the
                // pages ahead first (in case the woken thread touches the next page
                // before this thread maps it) was measured: no stale report in 952k
                // redis faults, and 8% fewer GETs at the median (docs/benchmarks.md §12).
                if ahead_read {
                    self.map_ahead(&mut s, &ahead, &pages[1..], &ahead_prints);
                }
                Some(PageIn {
                    lock_wait,
                    fetch,
                    evicting,
                    map: woken - mapping,
                    ahead: if ahead_read {
                        woken.elapsed()
                    } else {
                        Duration::ZERO
                    },
                })
            }
            Err(e) => {
                self.lost(store.as_ref(), addr, tid, slot, &e);
                None
            }
        }
    }

    /// Maps the pages read ahead (`ahead`: page, slot, generation; their bytes and
    /// fingerprints) that are still where they were read from, clean.
    fn map_ahead(
        &self,
        s: &mut MutexGuard<'_, Shared>,
        ahead: &[(u64, u64, u64)],
        pages: &[[u8; PAGE]],
        prints: &[Print],
    ) {
        for (k, &(n, sl, g)) in ahead.iter().enumerate() {
            if s.table.still(n, sl, g) && self.uffd.copy(n as usize * PAGE, &pages[k]) {
                s.table.read_ahead(n, sl, g, prints[k]);
                self.throttle.mapped(1);
                Stats::add(&self.stats.read_ahead, 1);
            }
        }
    }

    /// The cluster could not return page `addr` of thread `tid` (at `slot`): said, and the
    /// page poisoned, so the thread gets SIGBUS on it and never other bytes.
    fn lost(&self, store: &dyn PageStore, addr: usize, tid: i32, slot: u64, e: &IoError) {
        Stats::add(&self.stats.lost, 1);
        let at = store.location(slot * PAGE as u64).unwrap_or_default();
        // Said before the page is poisoned: poisoning wakes the thread, whose
        // SIGBUS may end the process (this thread with it) at once.
        tracing::error!(
            "page {addr:#x} (thread {tid}) could not be read from the cluster ({e}; {at}): \
             more memory nodes are lost than the scheme survives; the program gets SIGBUS on it"
        );
        if !self.uffd.poison(addr) {
            tracing::error!(
                "this kernel cannot poison page {addr:#x} (Linux 6.6 can): ending the \
                 program with SIGBUS"
            );
            // SAFETY: tgkill on this process's own thread.
            unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGBUS) };
        }
    }

    /// The program discards `[addr, addr + len)` (madvise DONTNEED, FREE or REMOVE): the pages
    /// that were out are forgotten, then `apply` does the discard, under the lock, so no
    /// eviction or fault can slip between the two.
    pub fn discard(&self, addr: usize, len: usize, apply: impl FnOnce() -> i32) -> i32 {
        let first = addr / PAGE;
        let last = addr.saturating_add(len).div_ceil(PAGE);
        let mut s = self.shared.lock();
        s.table.forget(first as u64, (last - first) as u64);
        self.forget_freed(&mut s);
        apply()
    }

    /// The program unlocked `[addr, addr + len)` (munlock; munlockall: all of its memory):
    /// the pages there that the evictor found locked may be paged again.
    pub fn unlocked(&self, addr: usize, len: usize) {
        // No page was ever found locked: nothing to walk (munlockall names all memory).
        if self.stats.undroppable.load(Ordering::Relaxed) == 0 {
            return;
        }
        let first = addr / PAGE;
        let last = addr.saturating_add(len).div_ceil(PAGE);
        let mut s = self.shared.lock();
        s.table.unlock(first as u64, (last - first) as u64);
    }

    /// Tells the store to forget what the slots the table freed held (see
    /// `Table::take_freed`): under the lock `s`, so that none is taken and written again
    /// first. For span coding this is what keeps compaction from moving the copies of pages
    /// the program freed.
    pub fn forget_freed(&self, s: &mut Shared) {
        let freed = s.table.take_freed();
        if let (false, Some(store)) = (freed.is_empty(), self.store()) {
            let addrs: Vec<u64> = freed.iter().map(|sl| sl * PAGE as u64).collect();
            store.forget(&addrs);
        }
    }

    /// Before a fork: no eviction may run, and every page that is out comes back, so that
    /// the child (which the pager does not follow) has all of the program's bytes. Runs on
    /// the program's forking thread, as a pager thread for the while (what it allocates comes
    /// from the pager's heap), and reads without the lock, which the fault thread needs if
    /// another thread of the program faults meanwhile.
    pub fn before_fork(&self) {
        let was = crate::hooks::is_pager_thread();
        crate::hooks::set_pager_thread(true);
        loop {
            let mut s = self.shared.lock();
            s.paused = true;
            if !s.in_batch {
                break;
            }
            drop(s);
            std::thread::sleep(Duration::from_micros(200));
        }
        // Not connected yet: nothing is out.
        let Some(store) = self.store() else {
            crate::hooks::set_pager_thread(was);
            return;
        };
        let out: Vec<(u64, u64, u64)> = {
            let mut s = self.shared.lock();
            // The pages in standby first: their bytes are here.
            for (v, buf) in s.table.standby_pages() {
                // SAFETY: the entry names `buf`; the lock is held until it is given back.
                let page = unsafe { self.standby.page(buf) };
                if self.uffd.copy(v as usize * PAGE, page) {
                    s.table.standby_in(v, Some(Print::of(page)));
                }
            }
            s.table.out_pages().collect()
        };
        let mut page = Box::new([0u8; PAGE]);
        for (v, slot, gen) in out {
            let addr = v as usize * PAGE;
            match store.read_page(slot * PAGE as u64, &mut page) {
                Ok(()) => {
                    let mut s = self.shared.lock();
                    if s.table.still(v, slot, gen) && self.uffd.copy(addr, &page) {
                        s.table.fetched(v, slot, gen, Some(Print::of(&page)));
                    }
                }
                Err(e) => tracing::error!("bringing page {addr:#x} back before fork: {e}"),
            }
        }
        crate::hooks::set_pager_thread(was);
    }

    /// The file descriptors of the store's connections to the nodes (none before
    /// `connected`): a forked child closes them (see `start::after_fork_child`).
    pub fn sockets(&self) -> Vec<std::os::fd::RawFd> {
        self.store
            .get()
            .map(|(_, front)| front.mem().sockets())
            .unwrap_or_default()
    }

    /// After a fork, in the parent: evictions go on.
    pub fn after_fork(&self) {
        self.shared.lock().paused = false;
    }
}

/// Reads the page at `slot` into `pages[0]` and, in the same batched read, the pages `ahead`
/// (page, slot, generation) into the rest; whether those ahead were read. A page ahead may be
/// the one that failed: then the faulting page is read alone, and nothing ahead.
fn read_with_ahead(
    store: &dyn PageStore,
    slot: u64,
    ahead: &[(u64, u64, u64)],
    pages: &mut [[u8; PAGE]],
) -> (Result<(), IoError>, bool) {
    if ahead.is_empty() {
        return (store.read_page(slot * PAGE as u64, &mut pages[0]), false);
    }
    let mut list: Vec<(u64, &mut [u8; PAGE])> = std::iter::once(slot)
        .chain(ahead.iter().map(|a| a.1))
        .map(|sl| sl * PAGE as u64)
        .zip(pages.iter_mut())
        .collect();
    match store.read_list(&mut list) {
        Ok(()) => (Ok(()), true),
        Err(_) => (store.read_page(slot * PAGE as u64, &mut pages[0]), false),
    }
}

/// A pager for tests (64 slots, a 1 MiB budget, `standby` buffers, no polling), or None when
/// this user may not use userfaultfd.
#[cfg(test)]
pub(crate) fn test_pager(standby: u32) -> Option<Pager> {
    let uffd = Uffd::new(None).ok()?;
    let throttle = Throttle::new(1 << 20).unwrap();
    Some(Pager::new(
        uffd,
        throttle,
        64,
        1 << 20,
        PAGE,
        0,
        Duration::ZERO,
        standby,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_evictor_takes_the_reports_queued_behind_faults_and_hands_the_faults_on() {
        let Some(p) = test_pager(0) else {
            eprintln!("skipped: no userfaultfd for this user");
            return;
        };
        let len = 4 * PAGE;
        let base = crate::uffd::test_mapping(len);
        // SAFETY: the mapping is this test's; no reference points into it.
        unsafe { p.uffd.register(base, len) }.unwrap();
        p.shared.lock().rescan = false;
        // Where thread `tid` of this process sleeps in the kernel, within 10 s.
        let sleeps_in = |tid: i32, what: &str| {
            let path = format!("/proc/self/task/{tid}/wchan");
            let end = Instant::now() + Duration::from_secs(10);
            while Instant::now() < end {
                if std::fs::read_to_string(&path).is_ok_and(|w| w.contains(what)) {
                    return true;
                }
                std::thread::yield_now();
            }
            false
        };
        let (tids, tid) = std::sync::mpsc::channel();
        // A thread touches a page that was never there: a missing fault, which waits.
        let t = tids.clone();
        let toucher = std::thread::spawn(move || {
            // SAFETY: gettid takes nothing and touches no memory.
            t.send(unsafe { libc::gettid() }).unwrap();
            // SAFETY: inside the registered mapping, which stays mapped until this thread
            // is joined.
            unsafe { std::ptr::read_volatile(base as *const u8) }
        });
        let waits = sleeps_in(tid.recv().unwrap(), "userfault");
        // Another unmaps the last page: its report queues behind the fault (the kernel gives
        // faults first), and munmap returns only once the report is read.
        let unmapper = std::thread::spawn(move || {
            // SAFETY: gettid takes nothing and touches no memory.
            tids.send(unsafe { libc::gettid() }).unwrap();
            // SAFETY: the last page of the test's mapping, which nothing uses.
            unsafe { libc::munmap((base + 3 * PAGE) as *mut libc::c_void, PAGE) }
        });
        let queued = waits && sleeps_in(tid.recv().unwrap(), "userfault");
        // One call takes both.
        let (handed, rescan) = {
            let mut s = p.shared.lock();
            p.take_reports(&mut s);
            let handed: Vec<usize> = s.handed.iter().map(|h| h.1 .0).collect();
            (handed, s.rescan)
        };
        let rung = p.handed.load(Ordering::Relaxed) && crate::uffd::readable(p.throttle.fd(), 0);
        let left = p.uffd.read().ok().flatten();
        // Closing the descriptor lets both threads go on, whatever happened above: the
        // toucher reads zeros, the unmapper's report is no longer waited for.
        drop(p);
        assert_eq!(unmapper.join().unwrap(), 0);
        assert_eq!(toucher.join().unwrap(), 0);
        assert!(queued, "the fault and the unmap did not both come");
        assert_eq!(handed, [base], "the fault read on the way is handed on");
        assert!(
            rescan,
            "the unmap was applied (the maps are to be read again)"
        );
        assert!(left.is_none(), "a report was left for later: {left:?}");
        assert!(rung, "the fault thread is woken");
        // SAFETY: the test's own mapping, no longer used.
        unsafe { libc::munmap(base as *mut libc::c_void, 3 * PAGE) };
    }

    #[test]
    fn a_fork_being_prepared_stops_new_batches_but_not_one_under_way() {
        let mut s = Shared {
            table: Table::new(16, 0),
            waiters: Vec::new(),
            rescan: false,
            paused: false,
            in_batch: false,
            ahead: Ahead::new(0),
            handed: VecDeque::new(),
        };
        assert!(s.batch_may_start(), "no fork: batches start");
        s.paused = true;
        assert!(
            !s.batch_may_start(),
            "before_fork saw no batch under way: none may start until the fork is done"
        );
        s.in_batch = true;
        assert!(
            s.batch_may_start(),
            "a batch already under way goes on (before_fork waits for its end)"
        );
    }
}
