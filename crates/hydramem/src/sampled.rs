//! Sampled log lines: a flood of one event (connections refused or cut off, TLS handshakes
//! failed, an etcd that stays unreachable) logs its first occurrence and then one line per
//! `every`, with the count so far, so that the log says the flood is happening and how big it
//! is without growing with it. The metrics count every occurrence.
//!
//! Invariant: of `n` occurrences, exactly `ceil(n / every)` are logged, the first among them,
//! whatever the threads that count them.

use std::sync::atomic::{AtomicU64, Ordering};

/// A counter that says which occurrences to log (see the module doc).
#[derive(Debug)]
pub struct Sampled {
    count: AtomicU64,
    every: u64,
}

impl Sampled {
    /// A counter that logs the first of every `every` occurrences (`every` 0 counts as 1).
    pub const fn new(every: u64) -> Sampled {
        Sampled {
            count: AtomicU64::new(0),
            every: if every == 0 { 1 } else { every },
        }
    }

    /// Counts one occurrence: `Some(count so far, this one included)` when it is to be
    /// logged.
    pub fn hit(&self) -> Option<u64> {
        let n = self.count.fetch_add(1, Ordering::Relaxed);
        n.is_multiple_of(self.every).then_some(n + 1)
    }

    /// Occurrences counted since the start or the last reset.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Starts counting again (the flood ended); returns the count it had.
    pub fn reset(&self) -> u64 {
        self.count.swap(0, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_of_every_n_is_logged_with_the_count() {
        let s = Sampled::new(1000);
        let logged: Vec<u64> = (0..2500).filter_map(|_| s.hit()).collect();
        assert_eq!(logged, vec![1, 1001, 2001]);
        assert_eq!(s.reset(), 2500);
        assert_eq!(s.hit(), Some(1));
        assert_eq!(Sampled::new(0).hit(), Some(1));
    }
}
