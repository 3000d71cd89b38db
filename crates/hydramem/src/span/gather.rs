//! Group commit of span writes: the pages of concurrent write calls share rows.
//!
//! A row is written whole, so a call of one page alone costs a row of k + r pieces and
//! leaves a partial row for compaction. Under concurrency that is avoidable: while a batch's
//! rows are in flight, the calls that arrive queue their pages, and the next write takes all
//! of them together, k to a row. No call waits for company: a call that finds no write in
//! flight writes at once (queue depth 1 costs nothing), and the batches grow by themselves
//! with the load — the classic group commit of database logs. Nor does a full row wait for
//! the batch ahead of it: once the queue holds a row's worth of pages (k) and none of them is
//! in a batch in flight, its batch is written at once beside those in flight, up to
//! [`MAX_IN_FLIGHT`] batches — one batch at a time held sixteen single-page writers to one
//! row's round trip per row (docs/benchmarks.md §11, "Group commit with batches in flight").
//!
//! Protocol: a call enqueues its pages into the batch being filled and then either leads
//! (its batch is the one being filled, and either no batch is in flight, or fewer than
//! [`MAX_IN_FLIGHT`] are, the queue holds at least k pages and shares none with them: it
//! takes the whole queue as one batch and writes it) or waits until its batch is done. A
//! batch's outcome goes to every call that had pages in it. Pages are not copied: the queue
//! holds pointers to the callers' pages, which stay borrowed until their batch is done (see
//! [`Gather::write`]).
//!
//! Invariants: a batch holds pages of whole calls, in the order they were enqueued; a call
//! returns only once its batch's rows are acknowledged and its pages mapped, or with the
//! batch's error; **batches in flight together share no page**, so the writes of one page
//! are never concurrent and each takes its version after the one before it ended — what the
//! page map's unconditional move and a reattaching client's "newest version wins" rely on
//! (`super::reattach`: were a newer batch to fail after k of a row's pieces landed while an
//! older one carrying the same page succeeded, a reattach would bring back the failed
//! write's bytes over the acknowledged one).

use std::collections::{HashMap, HashSet};

use parking_lot::{Condvar, Mutex};

use crate::client::{IoError, Page};

/// Batches written at once, at most: each is a round of row writes to k + r nodes.
pub const MAX_IN_FLIGHT: usize = 4;

/// A page of a queued call: its number and a pointer to the caller's bytes.
#[derive(Clone, Copy)]
struct Pending {
    page: u64,
    bytes: *const Page,
}

// SAFETY: the pointer is only dereferenced by the leader while the call that owns the page
// waits for its batch (see `Gather::write`): sending it to the leader's thread is sending a
// shared borrow that outlives its use.
unsafe impl Send for Pending {}

#[derive(Default)]
struct State {
    /// Pages of the batch being filled.
    queue: Vec<Pending>,
    /// Calls with pages in it.
    queued_calls: usize,
    /// The id of the batch being filled; batches below it were taken by a leader.
    filling: u64,
    /// Batches being written.
    in_flight: usize,
    /// The pages of the batches being written.
    flying: HashSet<u64>,
    /// Per batch done and not yet collected by all its calls: its error, and the calls that
    /// have still to collect it.
    outcomes: HashMap<u64, (Option<String>, usize)>,
}

/// What writes one batch: (page number, bytes) in order.
pub type WriteBatch<'a> = dyn Fn(&[(u64, &Page)]) -> Result<(), IoError> + 'a;

/// The gathering point of one span store's writes.
pub struct Gather {
    /// Pages in a full row (k): a queue this long is written without waiting.
    full: usize,
    state: Mutex<State>,
    changed: Condvar,
}

impl Gather {
    /// The gathering point of a store whose rows hold `full` pages.
    pub fn new(full: usize) -> Gather {
        Gather {
            full: full.max(1),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        }
    }

    /// Whether the call whose pages are in batch `mine` writes that batch now.
    fn leads(&self, s: &State, mine: u64) -> bool {
        debug_assert!(s.in_flight > 0 || s.flying.is_empty());
        mine == s.filling
            && s.in_flight < MAX_IN_FLIGHT
            && (s.in_flight == 0
                || (s.queue.len() >= self.full
                    && !s.queue.iter().any(|p| s.flying.contains(&p.page))))
    }

    /// Writes `pages` (page number, bytes) together with whatever other calls queue
    /// meanwhile, through `write` (which writes one batch whole: [`super::Core`]'s
    /// packed write); returns once they are written, or with their batch's error.
    pub fn write(&self, pages: &[(u64, &Page)], write: &WriteBatch<'_>) -> Result<(), IoError> {
        if pages.is_empty() {
            return Ok(());
        }
        let mut s = self.state.lock();
        let mine = s.filling;
        s.queue.extend(pages.iter().map(|(page, bytes)| Pending {
            page: *page,
            bytes: *bytes,
        }));
        s.queued_calls += 1;
        let mut own: Option<Result<(), IoError>> = None;
        while !s.outcomes.contains_key(&mine) {
            if !self.leads(&s, mine) {
                self.changed.wait(&mut s);
                continue;
            }
            // Lead: take the queue (this call's pages are in it) as one batch and write it.
            s.in_flight += 1;
            s.filling += 1;
            let taken = std::mem::take(&mut s.queue);
            let members = std::mem::take(&mut s.queued_calls);
            let pages: Vec<u64> = taken.iter().map(|p| p.page).collect();
            s.flying.extend(pages.iter().copied());
            drop(s);
            let mut lead = Leading {
                gather: self,
                batch: mine,
                members,
                pages,
                finished: false,
            };
            // SAFETY: every pointer in `taken` is a page of a call that is still inside this
            // function waiting for `mine` (calls leave only once their batch's outcome is
            // in, which `lead.finish` below puts there after the write); the pages are
            // shared borrows, nothing writes them meanwhile.
            let list: Vec<(u64, &Page)> = taken
                .iter()
                .map(|p| (p.page, unsafe { &*p.bytes }))
                .collect();
            let result = write(&list);
            lead.finish(result.as_ref().err().map(|e| e.to_string()));
            own = Some(result);
            s = self.state.lock();
        }
        // Collect this call's outcome (the leader has its own first hand).
        let collected = match s.outcomes.get_mut(&mine) {
            Some((error, left)) => {
                *left -= 1;
                let e = error.clone();
                if *left == 0 {
                    s.outcomes.remove(&mine);
                }
                e
            }
            None => None,
        };
        drop(s);
        match own {
            Some(r) => r,
            None => collected.map_or(Ok(()), |e| {
                Err(IoError::Store(
                    format!("write gathered with other writes failed: {e}").into(),
                ))
            }),
        }
    }
}

/// A batch being written: marks it done (with its outcome) when finished, or — should the
/// write unwind — as failed, so that its calls are not left waiting.
struct Leading<'g> {
    gather: &'g Gather,
    batch: u64,
    members: usize,
    /// Its pages (in no other batch in flight).
    pages: Vec<u64>,
    finished: bool,
}

impl Leading<'_> {
    fn finish(&mut self, error: Option<String>) {
        self.finished = true;
        let mut s = self.gather.state.lock();
        // Its members: the calls whose pages it took, the leader among them.
        s.outcomes.insert(self.batch, (error, self.members));
        s.in_flight -= 1;
        for p in &self.pages {
            s.flying.remove(p);
        }
        drop(s);
        self.gather.changed.notify_all();
    }
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.finish(Some("the writing thread panicked".into()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn concurrent_calls_share_batches_and_every_page_is_written_once() {
        let g = Arc::new(Gather::new(8));
        let written = Arc::new(Mutex::new(Vec::<(u64, u8)>::new()));
        let batches = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let (g, written, batches) = (g.clone(), written.clone(), batches.clone());
                std::thread::spawn(move || {
                    for i in 0..50u64 {
                        let page = [t as u8; 4096];
                        let p = t * 1000 + i;
                        g.write(&[(p, &page)], &|list| {
                            batches.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(std::time::Duration::from_micros(200));
                            written.lock().extend(list.iter().map(|(p, b)| (*p, b[0])));
                            Ok(())
                        })
                        .expect("written");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut w = written.lock().clone();
        w.sort_unstable();
        let want: Vec<(u64, u8)> = (0..8u64)
            .flat_map(|t| (0..50).map(move |i| (t * 1000 + i, t as u8)))
            .collect();
        assert_eq!(w, want, "every page once, with its own bytes");
        assert!(
            batches.load(Ordering::SeqCst) < 400,
            "calls shared batches: {} batches for 400 calls",
            batches.load(Ordering::SeqCst)
        );
    }

    /// A batch whose queue holds a full row is written beside the one in flight; a partial
    /// one, or one sharing a page with a batch in flight, waits for it; never more than
    /// [`MAX_IN_FLIGHT`] at once.
    #[test]
    fn a_full_row_is_written_beside_the_batch_in_flight_a_partial_one_waits() {
        use std::sync::mpsc;
        let g = Arc::new(Gather::new(2));
        let (started_tx, started) = mpsc::channel::<Vec<u64>>();
        let (release_tx, release) = mpsc::channel::<()>();
        let release = Arc::new(Mutex::new(release));
        let (in_flight, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let call = |pages: Vec<u64>| {
            let (g, started_tx, release) = (g.clone(), started_tx.clone(), release.clone());
            let (in_flight, most) = (in_flight.clone(), most.clone());
            std::thread::spawn(move || {
                let bytes = [0u8; 4096];
                let list: Vec<(u64, &Page)> = pages.iter().map(|p| (*p, &bytes)).collect();
                g.write(&list, &|batch| {
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    started_tx
                        .send(batch.iter().map(|(p, _)| *p).collect())
                        .unwrap();
                    release.lock().recv().unwrap();
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    Ok(())
                })
                .expect("written");
            })
        };
        let wait = |what: &str| {
            started
                .recv_timeout(std::time::Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("{what}"))
        };
        // No batch starts within 200 ms: a wait that can only miss a start, never invent one.
        let stays_waiting = |what: &str| {
            assert!(
                started
                    .recv_timeout(std::time::Duration::from_millis(200))
                    .is_err(),
                "{what}"
            );
        };
        let first = call(vec![1]);
        assert_eq!(wait("the first call writes at once"), [1]);
        // One page queued: less than a row, so it waits for the batch in flight...
        let partial = call(vec![2]);
        // ...until a second call fills the row, and the two go out together beside it.
        let filler = call(vec![3]);
        let mut second = wait("a full row goes out beside the batch in flight");
        second.sort_unstable();
        assert_eq!(second, [2, 3]);
        for _ in 0..2 {
            release_tx.send(()).unwrap();
        }
        for t in [first, partial, filler] {
            t.join().unwrap();
        }
        assert_eq!(
            most.load(Ordering::SeqCst),
            2,
            "two batches were in flight at once"
        );

        // Many full rows queued: never more than MAX_IN_FLIGHT batches at once.
        let calls: Vec<_> = (0..4 * MAX_IN_FLIGHT as u64)
            .map(|i| call(vec![10 + 2 * i, 11 + 2 * i]))
            .collect();
        for _ in 0..MAX_IN_FLIGHT {
            wait("full rows go out");
        }
        // Whoever else has started, the rest wait for a release.
        for _ in 0..4 * MAX_IN_FLIGHT {
            release_tx.send(()).unwrap();
        }
        for t in calls {
            t.join().unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), MAX_IN_FLIGHT);

        // A full row that shares a page with the batch in flight waits for it, and so does a
        // partial one; each goes once nothing is in flight. (What the calls above left
        // unread — starts, releases — is drained first: they all returned.)
        while started.try_recv().is_ok() {}
        while release.lock().try_recv().is_ok() {}
        most.store(0, Ordering::SeqCst);
        let first = call(vec![100]);
        assert_eq!(wait("a call alone writes at once"), [100]);
        let sharing = call(vec![100, 101]);
        stays_waiting("a batch sharing a page with one in flight waits");
        release_tx.send(()).unwrap();
        first.join().unwrap();
        assert_eq!(wait("it goes once the other is done"), [100, 101]);
        let partial = call(vec![102]);
        stays_waiting("a partial queue waits for the batch in flight");
        release_tx.send(()).unwrap();
        sharing.join().unwrap();
        assert_eq!(
            wait("a partial queue goes once nothing is in flight"),
            [102]
        );
        release_tx.send(()).unwrap();
        partial.join().unwrap();
        assert_eq!(most.load(Ordering::SeqCst), 1, "never two of them at once");
    }

    #[test]
    fn a_batch_error_reaches_every_call_in_it() {
        let g = Arc::new(Gather::new(8));
        let page = [1u8; 4096];
        let err = g
            .write(&[(1, &page)], &|_| {
                Err(IoError::Store("the nodes are gone".into()))
            })
            .expect_err("the leader's own error");
        assert!(err.to_string().contains("the nodes are gone"));
        // And the next call is not affected.
        g.write(&[(2, &page)], &|_| Ok(())).expect("a fresh batch");
    }
}
