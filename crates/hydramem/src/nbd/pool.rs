//! The NBD server's worker threads, one pool shared by every connection.
//!
//! A connection's pipelined requests (writes, partial pages, zeroing) run here, so the threads
//! a server holds are the pool's plus one reader per connection, however many connections
//! there are; before this pool each connection started sixteen workers of its own, and 200
//! idle connections held 3,395 threads. A connection may have at most
//! [`Pool::per_connection`] tasks queued or running at once (half the pool), so one client
//! cannot take every worker from the others.
//!
//! Written here rather than taken from rayon: rayon's pool is made for tasks that compute and
//! never block, and its scoped spawning is what would let tasks borrow the connection; these
//! tasks wait on the network for most of their life and own what they use (an `Arc` of the
//! export and of the connection's reply writer). What they need is a queue and threads that
//! sleep on it, which is what this is.
//!
//! Invariants: every submitted task runs exactly once, on a pool thread or — if the pool has
//! no thread left — given back to the caller to run; dropping the pool lets the threads finish
//! the queue and joins them (thread-local destructors included), so no worker outlives it.

use std::sync::mpsc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

/// A unit of work: one request or batch, with what it needs to reply.
pub type Task = Box<dyn FnOnce() + Send + 'static>;

/// Worker threads shared by the connections of one server (see the module doc).
#[derive(Debug)]
pub struct Pool {
    tx: Option<mpsc::SyncSender<Task>>,
    threads: Vec<JoinHandle<()>>,
}

impl Pool {
    /// A pool of `threads` workers (as many as the system lets start; a failure to start one
    /// is logged).
    pub fn new(threads: usize) -> Pool {
        let (tx, rx) = mpsc::sync_channel::<Task>(threads.max(1) * 4);
        let rx = std::sync::Arc::new(Mutex::new(rx));
        let mut started = Vec::new();
        for i in 0..threads {
            let rx = rx.clone();
            let worker = move || loop {
                let task = rx.lock().recv();
                match task {
                    Ok(task) => task(),
                    Err(_) => return,
                }
            };
            match std::thread::Builder::new()
                .name(format!("nbd-worker-{i}"))
                .spawn(worker)
            {
                Ok(handle) => started.push(handle),
                Err(e) => tracing::warn!(error = %e, "cannot start an NBD worker thread"),
            }
        }
        Pool {
            tx: (!started.is_empty()).then_some(tx),
            threads: started,
        }
    }

    /// Worker threads running.
    pub fn size(&self) -> usize {
        self.threads.len()
    }

    /// Most tasks one connection may have queued or running: half the pool (at least one).
    pub fn per_connection(&self) -> usize {
        (self.threads.len() / 2).max(1)
    }

    /// Queues `task` (waiting while the queue is full); gives it back if no worker is left.
    pub fn submit(&self, task: Task) -> Result<(), Task> {
        match &self.tx {
            Some(tx) => tx.send(task).map_err(|mpsc::SendError(t)| t),
            None => Err(task),
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        drop(self.tx.take()); // the workers finish the queue, then find it closed
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn every_task_runs_once_and_dropping_joins_the_workers() {
        let ran = Arc::new(AtomicUsize::new(0));
        let pool = Pool::new(3);
        assert_eq!((pool.size(), pool.per_connection()), (3, 1));
        for _ in 0..100 {
            let ran = ran.clone();
            pool.submit(Box::new(move || {
                ran.fetch_add(1, Ordering::SeqCst);
            }))
            .unwrap_or_else(|t| t());
        }
        drop(pool);
        assert_eq!(ran.load(Ordering::SeqCst), 100);
        assert_eq!(Arc::strong_count(&ran), 1, "a task outlived the pool");
    }

    #[test]
    fn a_pool_without_threads_gives_tasks_back() {
        let pool = Pool::new(0);
        assert_eq!(pool.per_connection(), 1);
        assert!(pool.submit(Box::new(|| {})).is_err());
    }
}
