//! The evictor: keeps the program's resident anonymous memory under its budget by sending
//! cold pages to the cluster and dropping them.
//!
//! Which pages are cold: a clock over the registered regions' resident pages, in address
//! order, where a page faulted in since the hand last passed it keeps its place once (second
//! chance). User space cannot see the accessed bits the kernel's own reclaim uses (reading
//! them needs root and physical addresses); what the pager sees is its own faults, so a page
//! it brought in is young, and a page it never saw is as old as the hand says.
//!
//! A page leaves in two steps: to the standby pool (`standby.rs`), which is how its reads
//! are seen, and from there, once it is among the oldest in standby, to the cluster.
//!
//! One batch, in order (see `table/mod.rs` for the invariants it keeps):
//! 1. if the pool lacks free buffers for the batch, send out the oldest pages in standby:
//!    clean → its slot already holds it; otherwise → written to its slot, the whole flush in
//!    one batched write; then commit them (faults on them wait meanwhile);
//! 2. select up to `BATCH` resident pages, `CATCH_UP_BATCH` while far over the budget (they
//!    become `evicting`: faults on them wait), one free buffer each;
//! 3. write-protect them — a failure means the range is no longer registered: left alone;
//! 4. copy them into their buffers (process_vm_readv, so a page the program unmapped
//!    meanwhile is an error, not a crash): all zeros → nothing to keep, else → standby;
//! 5. under the lock, once every report the userfaultfd holds is read and applied (by the
//!    fault thread while this waits a little, then by the evictor, handing the missing faults
//!    to the fault thread): commit each page, drop the committed ones (MADV_DONTNEED, one
//!    call per run of consecutive pages; a page the kernel refuses to drop — the program
//!    locked it — is resident again and not selected until the program unlocks it), wake the
//!    faults that waited. A flush drops nothing, and its commit does not wait for reports.
//!
//! While it drains — over the budget, from the start of a batch (unless writes are being
//! refused or the last batch found nothing to page out) — the fault thread holds back new
//! page-ins and first touches (`throttle.rs`). A write the cluster refuses keeps its pages
//! resident and stops that until a write succeeds again:
//! the program runs over its budget, and the evictor waits before it writes again (1 s,
//! doubling to 16 s while writes keep failing), since such a write can take seconds to fail
//! and the faults on its pages wait for it.

use std::fs::File;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::MutexGuard;

use hydramem::nbd::PageStore;

use crate::alloc;
use crate::pager::{Pager, Shared};
use crate::print::Print;
use crate::regions::{self, Pagemap, Region};
use crate::stats::Stats;
use crate::table::{Commit, Dest, Outcome};
use crate::PAGE;

/// Pages sent out per batch while the resident memory is near the budget. Smaller batches
/// than [`CATCH_UP_BATCH`] cost redis under rep2 fewer faults (306k against 326–331k with 256
/// alone; docs/benchmarks.md §12), but a scheme whose batch writes are slow (span) then falls
/// behind a program: its memory ran to 253–283 MiB against a 152 MiB budget.
const BATCH: usize = 64;
/// Pages per batch while the resident memory is more than [`CATCH_UP`] bytes over the budget,
/// so that the evictor keeps up with a program that allocates fast or a scheme that writes
/// slowly.
const CATCH_UP_BATCH: usize = 256;
/// How far over the budget the evictor switches to [`CATCH_UP_BATCH`].
const CATCH_UP: u64 = 4 << 20;
/// Pages the hand reads from pagemap at a time.
const SCAN: usize = 512;
/// How long the evictor waits after the cluster refused a write, doubling up to
/// [`MAX_BACKOFF`] while writes keep failing.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait after a refused write.
const MAX_BACKOFF: Duration = Duration::from_secs(16);
/// The shortest time between two looks at the maps made because the evictor, over the
/// budget, found nothing to page out.
const RESCAN_STARVED: Duration = Duration::from_millis(50);
/// How often the pager's own memory is counted again (it changes slowly: buffers are made
/// once, the page table grows a few bytes per page).
const OWN_EVERY: Duration = Duration::from_millis(50);

/// The clock hand: a region and an address in it.
struct Hand {
    region: usize,
    addr: usize,
}

/// The evictor's own state.
pub struct Evictor<'p> {
    pager: &'p Pager,
    pagemap: Pagemap,
    statm: File,
    hand: Hand,
    last_scan: Instant,
    /// The last batch's write failed.
    write_failed: bool,
    /// The last batch found pages the kernel refused to drop (locked by the program): not
    /// starved — they are not selected again while locked, and the next batch looks past them.
    found_locked: bool,
    /// The wait after the next refused write.
    backoff: Duration,
    /// The pager's own memory at the last look (its heap less the standby pool), and when.
    own: (u64, Instant),
    /// mincore's vector for that look.
    own_buf: Vec<u8>,
}

impl<'p> Evictor<'p> {
    /// An evictor for `pager`, reading the process's `pagemap` and `statm` (opened at start,
    /// see `start.rs`).
    pub fn new(pager: &'p Pager, pagemap: Pagemap, statm: File) -> Evictor<'p> {
        Evictor {
            pager,
            pagemap,
            statm,
            hand: Hand { region: 0, addr: 0 },
            last_scan: Instant::now() - Duration::from_secs(10),
            write_failed: false,
            found_locked: false,
            backoff: FIRST_BACKOFF,
            own: (0, Instant::now() - OWN_EVERY),
            own_buf: Vec::new(),
        }
    }

    /// The program's resident anonymous memory now: the process's, less the pager's own
    /// (its heap — the client, its buffers, the page table — but not the standby pool, which
    /// holds the program's pages). The pager's memory is what a swap path's daemon and page
    /// cache are to a program under swap: outside its limit, and reported beside it.
    pub fn resident(&mut self) -> u64 {
        let process = regions::resident_anon(&self.statm).unwrap_or(0);
        if self.own.1.elapsed() >= OWN_EVERY {
            let pool = u64::from(self.pager.standby.len()) * PAGE as u64;
            let own = alloc::resident(&mut self.own_buf).saturating_sub(pool);
            self.pager.stats.own(own);
            self.own = (own, Instant::now());
        }
        process.saturating_sub(self.own.0)
    }

    /// Runs until the pager stops.
    pub fn run(&mut self) {
        let p = self.pager;
        let low = p.budget - (p.budget / 64).max(1 << 20).min(p.budget / 2);
        let mut warned = false;
        // The last batch found nothing to page out: the next one does not hold faults from
        // its start.
        let mut starved = false;
        while !p.stop.load(Ordering::Relaxed) {
            let rss = self.resident();
            p.stats.resident(rss);
            p.throttle.measured(rss);
            if rss <= p.budget || p.shared.lock().paused {
                p.throttle.draining(false);
                let mut g = p.kick_lock.lock();
                p.kick.wait_for(&mut g, Duration::from_millis(2));
                continue;
            }
            // Evict down to the low mark, a batch at a time, reading the memory again
            // between batches.
            let most = if rss > p.budget + CATCH_UP {
                CATCH_UP_BATCH
            } else {
                BATCH
            };
            let want = ((rss - low) as usize).div_ceil(PAGE).min(most);
            // Over the budget: faults are held from now, not from the end of this batch — on
            // a core shared with a program filling memory at full speed the first batch can
            // take long enough for the program to fill everything unheld. Not while writes
            // are being refused (the retry's write may take seconds to fail: faults would be
            // held all that while) or when the last batch found nothing to page out.
            if self.backoff == FIRST_BACKOFF && !starved {
                p.throttle.draining(true);
            }
            let freed = self.batch(want);
            let found_locked = std::mem::take(&mut self.found_locked);
            starved = freed == 0 && !found_locked;
            // Faults are held while this drains (`throttle.rs`); each batch dropped lets the
            // fault thread look again. A write the cluster refused means the budget cannot be
            // held: faults go on, and the next write waits a while (a write that cannot be
            // placed, with more nodes lost than placements allow, fails only after seconds,
            // and faults on its pages wait for it).
            let refused = std::mem::take(&mut self.write_failed);
            p.throttle.draining(freed > 0 && !refused);
            if freed > 0 {
                p.throttle.ring();
            }
            if refused {
                tracing::warn!(
                    "the program stays over --local-memory while the cluster refuses writes; trying again in {} s",
                    self.backoff.as_secs()
                );
                let mut g = p.kick_lock.lock();
                let until = Instant::now() + self.backoff;
                while Instant::now() < until && !p.stop.load(Ordering::Relaxed) {
                    p.kick.wait_until(&mut g, until);
                }
                self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                continue;
            }
            if starved {
                if self.last_scan.elapsed() >= RESCAN_STARVED {
                    // Over the budget with nothing to pick: the program's memory may be in a
                    // mapping not registered yet (a program loading at full speed maps new
                    // arenas faster than the once-a-second look at the maps finds them).
                    // Look now.
                    p.shared.lock().rescan = true;
                    continue;
                }
                if !warned {
                    tracing::warn!(
                        "the program's resident memory ({} MiB) is above --local-memory ({} MiB) \
                         and nothing more can be paged out (the rest is its brk heap, stacks, \
                         small mappings, or the pager's own)",
                        rss >> 20,
                        p.budget >> 20
                    );
                    warned = true;
                }
                let mut g = p.kick_lock.lock();
                p.kick.wait_for(&mut g, Duration::from_millis(20));
            }
        }
        p.throttle.draining(false);
    }

    /// Reads the regions again and registers them (idempotent for those already registered).
    pub fn rescan(&mut self) {
        let maps = match regions::read_maps() {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!("reading /proc/self/maps: {e}");
                return;
            }
        };
        let found = regions::pageable(&maps, self.pager.min_region, crate::exclude::overlaps);
        let mut registered = Vec::with_capacity(found.len());
        for r in found {
            // SAFETY: `pageable` lists the program's anonymous mappings outside every range
            // of the pager's own (its heap, its threads' stacks): no Rust reference points
            // into them.
            match unsafe { self.pager.uffd.register(r.start, r.end - r.start) } {
                Ok(()) => registered.push(r),
                Err(e) => tracing::debug!("{e}"),
            }
        }
        *self.pager.regions.lock() = registered;
        self.last_scan = Instant::now();
    }

    /// Picks up to `n` pages with the clock; returns (address, generation) of each.
    fn choose(&mut self, n: usize) -> Vec<(usize, u64)> {
        let p = self.pager;
        {
            let mut s = p.shared.lock();
            if s.rescan || self.last_scan.elapsed() > Duration::from_secs(1) {
                s.rescan = false;
                drop(s);
                self.rescan();
            }
        }
        let regions: Vec<Region> = p.regions.lock().clone();
        let total: usize = regions.iter().map(|r| (r.end - r.start) / PAGE).sum();
        let mut chosen = Vec::with_capacity(n);
        let mut scanned = 0usize;
        let mut resident = Vec::with_capacity(SCAN);
        while chosen.len() < n && scanned <= 2 * total && !regions.is_empty() {
            if self.hand.region >= regions.len() {
                self.hand = Hand { region: 0, addr: 0 };
            }
            let r = regions[self.hand.region];
            if self.hand.addr < r.start || self.hand.addr >= r.end {
                self.hand.addr = r.start;
            }
            let count = ((r.end - self.hand.addr) / PAGE).min(SCAN);
            resident.clear();
            if self
                .pagemap
                .resident(self.hand.addr, count, |a| resident.push(a))
                .is_err()
            {
                resident.clear();
            }
            {
                let mut s = p.shared.lock();
                if !s.batch_may_start() {
                    return Vec::new();
                }
                for &a in &resident {
                    if chosen.len() == n {
                        break;
                    }
                    if let Some(g) = s.table.select((a / PAGE) as u64) {
                        chosen.push((a, g));
                    }
                }
                if !chosen.is_empty() {
                    s.in_batch = true;
                }
            }
            let stop_at = chosen
                .last()
                .map(|&(a, _)| a + PAGE)
                .filter(|_| chosen.len() == n)
                .unwrap_or(self.hand.addr + count * PAGE);
            self.hand.addr = stop_at;
            if self.hand.addr >= r.end {
                self.hand = Hand {
                    region: self.hand.region + 1,
                    addr: 0,
                };
            }
            scanned += count;
        }
        chosen
    }

    /// One batch of at most `n` pages; returns how many pages were dropped.
    fn batch(&mut self, n: usize) -> usize {
        let p = self.pager;
        // The evictor runs once the pager is connected (`start.rs`).
        let Some(store) = p.store() else {
            return 0;
        };
        let free = p.shared.lock().table.free_bufs();
        if free < n {
            self.flush(store.as_ref(), (n - free).max(BATCH));
        }
        let bufs = p.shared.lock().table.take_bufs(n);
        let chosen = if bufs.is_empty() {
            Vec::new()
        } else {
            self.choose(bufs.len())
        };
        if chosen.is_empty() {
            p.shared.lock().table.give_back(bufs);
            return 0;
        }
        // Write-protect each run of consecutive pages.
        let mut ok = vec![true; chosen.len()];
        let mut i = 0;
        while i < chosen.len() {
            let mut j = i + 1;
            while j < chosen.len() && chosen[j].0 == chosen[j - 1].0 + PAGE {
                j += 1;
            }
            if !p.uffd.protect(chosen[i].0, (j - i) * PAGE) {
                ok[i..j].iter_mut().for_each(|o| *o = false);
            }
            i = j;
        }
        // Copy each into its buffer, and decide.
        self.copy(&chosen, &bufs, &mut ok);
        let mut outcome = vec![Outcome::Kept; chosen.len()];
        let mut unused = bufs[chosen.len()..].to_vec();
        for (k, &buf) in bufs.iter().enumerate().take(chosen.len()) {
            if ok[k] {
                // SAFETY: the buffer is reserved by this thread, and the kernel wrote it
                // above (the copy landed).
                let copy = unsafe { p.standby.page(buf) };
                if copy.iter().any(|&b| b != 0) {
                    // Its fingerprint tells whether the page is still what its slot holds.
                    let print = Print::of(copy);
                    outcome[k] = Outcome::Standby { buf, print };
                    continue;
                }
                outcome[k] = Outcome::Zero;
            }
            unused.push(buf);
        }
        p.shared.lock().table.give_back(unused);
        self.commit(&chosen, &outcome)
    }

    /// Sends the oldest `n` pages in standby out to the cluster (those whose slot holds them
    /// already are dropped without a write); their buffers become free.
    fn flush(&mut self, store: &dyn PageStore, n: usize) {
        let p = self.pager;
        let taken = {
            let mut s = p.shared.lock();
            if !s.batch_may_start() {
                return;
            }
            let taken = s.table.begin_flush(n);
            if !taken.is_empty() {
                s.in_batch = true;
            }
            taken
        };
        if taken.is_empty() {
            return;
        }
        let mut outcome = vec![Outcome::Kept; taken.len()];
        let mut writes: Vec<(usize, u64)> = Vec::new();
        {
            let mut s = p.shared.lock();
            for (k, &(v, g, _)) in taken.iter().enumerate() {
                match s.table.slot_for(v, g) {
                    Ok(Dest::Clean(slot)) => {
                        outcome[k] = Outcome::Stored { slot };
                        Stats::add(&p.stats.clean_drops, 1);
                    }
                    Ok(Dest::Write(slot)) => {
                        outcome[k] = Outcome::Stored { slot };
                        writes.push((k, slot));
                    }
                    // Commit leaves it.
                    Ok(Dest::Changed) => {}
                    Err(full) => {
                        tracing::warn!("{full}");
                        Stats::add(&p.stats.kept, 1);
                    }
                }
            }
        }
        if !writes.is_empty() {
            self.write(store, &taken, &writes, &mut outcome);
        }
        let pages: Vec<(usize, u64)> = taken
            .iter()
            .map(|&(v, g, _)| (v as usize * PAGE, g))
            .collect();
        self.commit(&pages, &outcome);
    }

    /// Writes the pages of a flush (`writes`: index into `taken`, slot) in one batched
    /// write; those it could not write are `Kept`.
    fn write(
        &mut self,
        store: &dyn PageStore,
        taken: &[(u64, u64, u32)],
        writes: &[(usize, u64)],
        outcome: &mut [Outcome],
    ) {
        let p = self.pager;
        let start = Instant::now();
        let list: Vec<(u64, &[u8; PAGE])> = writes
            .iter()
            .map(|&(k, slot)| {
                // SAFETY: the entry names the buffer and is `evicting` (faults on it wait),
                // and only this thread reserves buffers.
                (slot * PAGE as u64, unsafe { p.standby.page(taken[k].2) })
            })
            .collect();
        match store.write_list(&list) {
            Ok(()) => {
                self.backoff = FIRST_BACKOFF;
                p.stats.batch(start.elapsed());
                Stats::add(&p.stats.written, writes.len() as u64);
            }
            Err(e) => {
                self.write_failed = true;
                tracing::error!(
                    "writing {} pages to the cluster failed ({e}): they stay in local memory",
                    writes.len()
                );
                Stats::add(&p.stats.kept, writes.len() as u64);
                for &(k, _) in writes {
                    outcome[k] = Outcome::Kept;
                }
            }
        }
    }

    /// Copies the chosen pages into their standby buffers `bufs`; a failure ends the copy,
    /// and the pages from there on are no longer `ok` (left).
    fn copy(&mut self, chosen: &[(usize, u64)], bufs: &[u32], ok: &mut [bool]) {
        let local: Vec<libc::iovec> = bufs[..chosen.len()]
            .iter()
            .map(|&b| libc::iovec {
                iov_base: self.pager.standby.ptr(b).cast(),
                iov_len: PAGE,
            })
            .collect();
        let remote: Vec<libc::iovec> = chosen
            .iter()
            .map(|&(a, _)| libc::iovec {
                iov_base: a as *mut libc::c_void,
                iov_len: PAGE,
            })
            .collect();
        // SAFETY: the local iovecs cover standby buffers reserved by this thread (no entry
        // names them, so nobody else reads or writes them), alive for the call; the remote
        // ones are only read, by the kernel, which fails instead of faulting on an address
        // that is not mapped.
        let got = unsafe {
            libc::process_vm_readv(
                libc::getpid(),
                local.as_ptr(),
                local.len() as libc::c_ulong,
                remote.as_ptr(),
                remote.len() as libc::c_ulong,
                0,
            )
        };
        let pages = if got < 0 { 0 } else { got as usize / PAGE };
        for o in ok.iter_mut().skip(pages) {
            *o = false;
        }
    }

    /// Commits the batch under the lock, drops the pages whose bytes are safe (once every
    /// pending report is applied), and wakes the faults that waited. Returns the pages
    /// dropped.
    fn commit(&mut self, chosen: &[(usize, u64)], outcome: &[Outcome]) -> usize {
        let p = self.pager;
        let mut s = p.shared.lock();
        // Only a demotion (to standby, or a page of zeros) drops a page; a flush's pages are
        // out of the program's memory already, and its commit protects nothing by waiting.
        if outcome
            .iter()
            .any(|o| matches!(o, Outcome::Standby { .. } | Outcome::Zero))
        {
            s = self.apply_pending(s);
        }
        let mut drops = Vec::new();
        for (&(a, g), &o) in chosen.iter().zip(outcome) {
            if s.table.commit((a / PAGE) as u64, g, o) == Commit::Drop {
                drops.push((a, o == Outcome::Zero));
            }
        }
        let dropped = self.drop_pages(&mut s, &drops);
        p.forget_freed(&mut s);
        s.in_batch = false;
        let waiters = std::mem::take(&mut s.waiters);
        drop(s);
        for a in waiters {
            p.uffd.wake(a);
        }
        dropped
    }

    /// Returns the lock once every munmap or mremap report pending when it was called is
    /// applied: the pages a report names may no longer be the ones selected. The fault
    /// thread reads them, with the faults before them, while this waits with the lock let
    /// go (so faults are resolved meanwhile); under a stream of faults that may not end, and
    /// then the reports left are taken here (`take_reports`: the faults among them wait for
    /// this commit). Taking them at once instead, every time, made page-ins slower:
    /// memcached ETC under run, p99 339–429 → 555–595 µs (rep2), 579–623 → 663–687 (span)
    /// (docs/benchmarks.md §12, "Where the CPU goes under `run`").
    fn apply_pending(&self, mut s: MutexGuard<'p, Shared>) -> MutexGuard<'p, Shared> {
        let p = self.pager;
        let mut tries = 0;
        while p.pending() && tries < 1000 {
            drop(s);
            std::thread::yield_now();
            tries += 1;
            s = p.shared.lock();
        }
        p.take_reports(&mut s);
        s
    }

    /// Drops the committed pages `drops` (address, whether all zeros) from the program's
    /// memory, under the lock `s`: one `madvise` per run of consecutive pages (each call
    /// costs a TLB shootdown on every core the program runs on). A page the kernel refuses
    /// to drop because the program locked it (mlock) is given back to the table as resident
    /// and locked (`Table::undo_drop`). Returns the pages dropped.
    fn drop_pages(&mut self, s: &mut Shared, drops: &[(usize, bool)]) -> usize {
        let p = self.pager;
        let mut dropped = 0;
        let mut i = 0;
        while i < drops.len() {
            let mut j = i + 1;
            while j < drops.len() && drops[j].0 == drops[j - 1].0 + PAGE {
                j += 1;
            }
            let run = &drops[i..j];
            // SAFETY: the table committed each page of the run as dropped, under the lock
            // held here: each is the program's, write-protected since it was selected, with
            // its bytes in its standby buffer (or all zeros).
            if unsafe { discard(run[0].0, run.len()) }.is_ok() {
                dropped += run.len();
                Stats::add(
                    &p.stats.zero_drops,
                    run.iter().filter(|d| d.1).count() as u64,
                );
            } else {
                // Page by page: only those the kernel does not drop stay.
                for &(a, zero) in run {
                    // SAFETY: as for the run, of which it is one page.
                    match unsafe { discard(a, 1) } {
                        Ok(()) => {
                            dropped += 1;
                            Stats::add(&p.stats.zero_drops, u64::from(zero));
                        }
                        // No longer mapped there: the program moved or unmapped it after
                        // the reports were read, and the report on its way moves or forgets
                        // the entry as committed. Not made resident: its bytes may have been
                        // dropped at the address they moved to, if that page was in this
                        // batch too (`mremap` onto a chosen page), and then only its buffer
                        // holds them. A page moved and not dropped stays recorded in standby
                        // while resident at its new address: a buffer, then a slot, held
                        // until it is unmapped (never read: it faults on nothing).
                        Err(libc::ENOMEM) => {}
                        Err(_) => {
                            s.table.undo_drop((a / PAGE) as u64);
                            Stats::add(&p.stats.undroppable, 1);
                            self.found_locked = true;
                        }
                    }
                }
            }
            i = j;
        }
        dropped
    }
}

/// Drops the `n` pages from `addr` from the program's memory (MADV_DONTNEED): a later touch
/// faults. The kernel's error if it did not: EINVAL for pages the program locked, ENOMEM for
/// addresses no longer mapped (the mapped ones are dropped).
///
/// # Safety
///
/// The pages are the program's, in a region registered with the userfaultfd, and their bytes
/// are kept elsewhere (a standby buffer, or they are all zeros and stored as such), recorded
/// by the table under its lock, which the caller holds: a fault on them gets the bytes back.
unsafe fn discard(addr: usize, n: usize) -> Result<(), i32> {
    // SAFETY: the caller's contract: the range is the program's, and what it holds is kept.
    let r = unsafe { libc::syscall(libc::SYS_madvise, addr, n * PAGE, libc::MADV_DONTNEED) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::FaultPlan;

    /// The case a review found: a batch holds page X and page D, and the program moves X onto
    /// D (mremap, MREMAP_FIXED) after the batch's reports were read. The kernel queues the
    /// move's reports after the move, so the drops run first: X's fails (no longer mapped),
    /// and D's drops X's bytes where they now are. X must stay in standby — its buffer holds
    /// the only copy — so that the move carries it to D and a fault there is answered from it.
    #[test]
    fn a_page_moved_onto_another_of_the_batch_keeps_its_bytes_in_standby() {
        let Some(p) = crate::pager::test_pager(4) else {
            eprintln!("skipped: no userfaultfd for this user");
            return;
        };
        let mut ev = Evictor::new(
            &p,
            Pagemap::open().unwrap(),
            File::open("/proc/self/statm").unwrap(),
        );
        let base = crate::uffd::test_mapping(4 * PAGE);
        let (x, d) = (base, base + 2 * PAGE);
        for a in [x, d] {
            // SAFETY: inside the test's own mapping, not registered yet.
            unsafe { std::ptr::write_bytes(a as *mut u8, a as u8, PAGE) };
        }
        // SAFETY: the mapping is this test's; no reference points into it.
        unsafe { p.uffd.register(base, 4 * PAGE) }.unwrap();
        // Both pages resident, then selected and committed to standby, as a batch does.
        let bx = {
            let mut s = p.shared.lock();
            let mut bufs = s.table.take_bufs(2);
            let standby = |s: &mut Shared, a: usize, buf: u32| {
                let v = (a / PAGE) as u64;
                let g = s.table.select(v).or_else(|| s.table.select(v)).unwrap();
                let print = Print::of(&[a as u8; PAGE]);
                let c = s.table.commit(v, g, Outcome::Standby { buf, print });
                assert_eq!(c, Commit::Drop);
            };
            let (b1, b2) = (bufs.pop().unwrap(), bufs.pop().unwrap());
            standby(&mut s, x, b1);
            standby(&mut s, d, b2);
            b1
        };
        // The move, in a thread of its own: it waits in the kernel until its reports are
        // read.
        let mover = std::thread::spawn(move || {
            // SAFETY: moves the test's own page X onto its page D; nothing refers to either.
            let r = unsafe {
                libc::mremap(
                    x as *mut libc::c_void,
                    PAGE,
                    PAGE,
                    libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                    d as *mut libc::c_void,
                )
            };
            r as usize
        });
        let reported = crate::uffd::readable(p.uffd.fd(), 10_000);
        // The drops run before the reports are read.
        let dropped = {
            let mut s = p.shared.lock();
            ev.drop_pages(&mut s, &[(x, false), (d, false)])
        };
        // Then every report the move makes (it returns once they are read).
        let end = Instant::now() + Duration::from_secs(10);
        while !mover.is_finished() && Instant::now() < end {
            let mut s = p.shared.lock();
            p.take_reports(&mut s);
            drop(s);
            std::thread::yield_now();
        }
        let plan = p.shared.lock().table.on_missing((d / PAGE) as u64);
        drop(ev);
        drop(p);
        assert_eq!(mover.join().unwrap(), d, "the move landed on D");
        assert!(reported, "the move's reports came only after the move");
        assert_eq!(dropped, 1, "D is dropped, X was no longer mapped");
        assert_eq!(
            plan,
            FaultPlan::Local {
                buf: bx,
                clean: false
            },
            "a fault at D is answered from X's buffer"
        );
        // SAFETY: the test's own mapping, no longer used.
        unsafe { libc::munmap(base as *mut libc::c_void, 4 * PAGE) };
    }

    /// The kernel's answers `drop_pages` tells apart: a locked page is refused with EINVAL
    /// (and keeps its bytes), an address no longer mapped with ENOMEM.
    #[test]
    fn discard_says_why_the_kernel_did_not_drop() {
        // SAFETY: a new private anonymous mapping of two pages, this test's alone.
        let m = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(m, libc::MAP_FAILED);
        let a = m as usize;
        // SAFETY: the mapping is this test's, mapped and writable.
        unsafe { *(a as *mut u8) = 7 };
        // SAFETY: the mapping is this test's; its bytes are not needed after a drop.
        assert_eq!(unsafe { discard(a, 1) }, Ok(()));
        // SAFETY: as above; the page reads back as zeros after the drop.
        assert_eq!(unsafe { *(a as *const u8) }, 0);
        // SAFETY: as above.
        unsafe { *(a as *mut u8) = 7 };
        // SAFETY: locking the test's own page.
        if unsafe { libc::mlock(m, PAGE) } == 0 {
            // SAFETY: as above.
            assert_eq!(unsafe { discard(a, 1) }, Err(libc::EINVAL));
            // SAFETY: as above; the refused page kept its byte.
            assert_eq!(unsafe { *(a as *const u8) }, 7);
        } else {
            eprintln!("mlock refused (ulimit -l): the locked case is not checked");
        }
        // SAFETY: unmapping the test's own second page, not used after.
        let r = unsafe { libc::munmap((a + PAGE) as *mut libc::c_void, PAGE) };
        assert_eq!(r, 0);
        // SAFETY: the address is unmapped: nothing of anyone's is dropped.
        assert_eq!(unsafe { discard(a + PAGE, 1) }, Err(libc::ENOMEM));
        // SAFETY: unmapping the rest of the test's mapping.
        unsafe { libc::munmap(m, PAGE) };
    }
}
