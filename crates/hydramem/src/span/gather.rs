//! Group commit of span writes: the pages of concurrent write calls share rows.
//!
//! A row is written whole, so a call of one page alone costs a row of k + r pieces and
//! leaves a partial row for compaction. Under concurrency that is avoidable: while one call's
//! rows are in flight, the calls that arrive queue their pages, and the next write takes all
//! of them together, k to a row. No call waits for company: a call that finds no write in
//! flight writes at once (queue depth 1 costs nothing), and the batches grow by themselves
//! with the load — the classic group commit of database logs.
//!
//! Protocol: a call enqueues its pages into the batch being filled and then either leads
//! (no leader is writing: it takes the whole queue as one batch and writes it) or waits until
//! its batch is done, taking over as leader whenever none is writing and its batch is still
//! queued. A batch's outcome goes to every call that had pages in it. Pages are not copied:
//! the queue holds pointers to the callers' pages, which stay borrowed until their batch is
//! done (see [`Gather::write`]).
//!
//! Invariants: a batch holds pages of whole calls, in the order they were enqueued (so of two
//! concurrent writes of one page, the later enqueued wins, as either may); a call returns only
//! once its batch's rows are acknowledged and its pages mapped, or with the batch's error.

use std::collections::HashMap;

use parking_lot::{Condvar, Mutex};

use crate::client::{IoError, Page};

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
    /// The id of the batch being filled; batches below it were taken by a leader.
    filling: u64,
    /// Batches below this one are done.
    done: u64,
    /// A leader is writing.
    leading: bool,
    /// Per batch done and not yet collected by all its calls: its error, and the calls that
    /// have still to collect it.
    outcomes: HashMap<u64, (Option<String>, usize)>,
    /// Calls with pages in each batch not yet done.
    members: HashMap<u64, usize>,
}

/// What writes one batch: (page number, bytes) in order.
pub type WriteBatch<'a> = dyn Fn(&[(u64, &Page)]) -> Result<(), IoError> + 'a;

/// The gathering point of one span store's writes.
#[derive(Default)]
pub struct Gather {
    state: Mutex<State>,
    changed: Condvar,
}

impl Gather {
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
        *s.members.entry(mine).or_insert(0) += 1;
        let mut own: Option<Result<(), IoError>> = None;
        while s.done <= mine {
            if s.leading {
                self.changed.wait(&mut s);
                continue;
            }
            // Lead: take the queue as one batch (this call's pages are in it or an earlier
            // one still queued, since batches are taken in order) and write it.
            s.leading = true;
            let batch = s.filling;
            s.filling += 1;
            let taken = std::mem::take(&mut s.queue);
            let members = s.members.remove(&batch).unwrap_or(0);
            drop(s);
            let mut lead = Leading {
                gather: self,
                batch,
                members,
                finished: false,
            };
            // SAFETY: every pointer in `taken` is a page of a call that is still inside this
            // function waiting for `batch` (calls leave only once `done` passes their batch,
            // which `lead.finish` below sets after the write); the pages are shared borrows,
            // nothing writes them meanwhile.
            let list: Vec<(u64, &Page)> = taken
                .iter()
                .map(|p| (p.page, unsafe { &*p.bytes }))
                .collect();
            let result = write(&list);
            let error = result.as_ref().err().map(|e| e.to_string());
            if batch == mine {
                own = Some(result);
            }
            lead.finish(error);
            s = self.state.lock();
        }
        // Collect this call's outcome (the leader of its own batch has it first hand).
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
    finished: bool,
}

impl Leading<'_> {
    fn finish(&mut self, error: Option<String>) {
        self.finished = true;
        let mut s = self.gather.state.lock();
        if self.members > 0 {
            s.outcomes.insert(self.batch, (error, self.members));
        }
        s.done = self.batch + 1;
        s.leading = false;
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
        let g = Arc::new(Gather::default());
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

    #[test]
    fn a_batch_error_reaches_every_call_in_it() {
        let g = Arc::new(Gather::default());
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
