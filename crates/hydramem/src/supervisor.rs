//! Keeping an embedded cluster running: what `hydramem up` does while it waits for Ctrl-C.
//!
//! A node process that exits — a crash, an out-of-memory kill, an operator's `kill -9` — is
//! one machine of the cluster failing, which is what the clients are built to survive; so the
//! survivors keep running and the death is reported ([`Event::Exited`]: which node, its
//! address and pid, how it ended, how many nodes still run). Under [`RestartPolicy::Always`]
//! the node is started again on its old address, empty, as a rebooted machine would be: its
//! clients reconnect, find its slabs gone and rebuild them elsewhere or on it.
//!
//! Invariants: a node is restarted only after its [`Backoff`] delay, which doubles from
//! [`Backoff::FIRST`] to [`Backoff::MAX`] while the node keeps dying within
//! [`Backoff::STABLE`] of its start (or its restart fails), and falls back to the first delay
//! once it has run that long, so a node that crashes at once costs a restart every few seconds,
//! not a spinning loop. The supervisor never blocks on a node except while one restarts (until
//! it announces its address or exits).

use std::fmt;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::embedded::{describe_exit, EmbeddedCluster, EmbeddedError, NodeExit};

/// What to do when a node process exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RestartPolicy {
    /// Leave it down; the survivors keep serving.
    #[default]
    Never,
    /// Start it again on its old address, empty, after a growing backoff.
    Always,
}

/// The delay before a node's next restart.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff { next: Self::FIRST }
    }
}

impl Backoff {
    /// The delay after a node that ran for a while exits.
    pub const FIRST: Duration = Duration::from_millis(100);
    /// The longest delay.
    pub const MAX: Duration = Duration::from_secs(5);
    /// A node that ran this long was healthy: its next exit is restarted after [`Self::FIRST`].
    pub const STABLE: Duration = Duration::from_secs(10);

    /// The delay before restarting a node that exited (or failed to start) after running for
    /// `ran`; each call in a row of short runs doubles the next delay, up to [`Self::MAX`].
    pub fn after(&mut self, ran: Duration) -> Duration {
        if ran >= Self::STABLE {
            self.next = Self::FIRST;
        }
        let delay = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        delay
    }
}

/// Something that happened to a node, as `up` reports it.
#[derive(Debug)]
pub enum Event {
    /// A node process ended.
    Exited {
        /// How.
        exit: NodeExit,
        /// Nodes still running.
        running: usize,
        /// Nodes in the cluster.
        total: usize,
        /// When it will be restarted (`None`: it stays down).
        restart_in: Option<Duration>,
    },
    /// A node was started again, empty.
    Restarted {
        /// Node index.
        node: usize,
        /// Its (old) address.
        addr: SocketAddr,
        /// Its new process id.
        pid: u32,
        /// How many times it has been restarted (successfully).
        restart: u64,
        /// Nodes running now.
        running: usize,
        /// Nodes in the cluster.
        total: usize,
    },
    /// A restart failed (its old address taken, the binary gone); it is tried again.
    RestartFailed {
        /// Node index.
        node: usize,
        /// Failed attempts in a row, this one included.
        attempt: u64,
        /// Why.
        error: EmbeddedError,
        /// When it is tried again.
        retry_in: Duration,
    },
}

/// "0.1 s", "5.0 s": a duration the way the events print it.
fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Exited {
                exit,
                running,
                total,
                restart_in,
            } => {
                write!(
                    f,
                    "node {} at {} (pid {}) died: {} after {}; {running} of {total} nodes running",
                    exit.node,
                    exit.addr,
                    exit.pid,
                    describe_exit(exit.status),
                    secs(exit.ran),
                )?;
                match restart_in {
                    Some(d) => write!(f, "; restarting it in {}", secs(*d)),
                    None => write!(f, "; it stays down (restart policy: never)"),
                }
            }
            Event::Restarted {
                node,
                addr,
                pid,
                restart,
                running,
                total,
            } => write!(
                f,
                "node {node} restarted on {addr} (restart {restart}), pid {pid}, empty: its \
                 clients rebuild what it held; {running} of {total} nodes running"
            ),
            Event::RestartFailed {
                node,
                attempt,
                error,
                retry_in,
            } => write!(
                f,
                "node {node} not restarted (attempt {attempt}): {error}; trying again in {}",
                secs(*retry_in)
            ),
        }
    }
}

#[derive(Debug, Default, Clone)]
struct Watch {
    backoff: Backoff,
    /// When a dead node is due to restart.
    due: Option<Instant>,
    /// Successful restarts.
    restarts: u64,
    /// Failed restart attempts since the last success.
    failures: u64,
}

/// Watches the nodes of an embedded cluster and restarts them by its policy.
#[derive(Debug)]
pub struct Supervisor {
    policy: RestartPolicy,
    nodes: Vec<Watch>,
}

impl Supervisor {
    /// A supervisor of `nodes` nodes, all running.
    pub fn new(policy: RestartPolicy, nodes: usize) -> Supervisor {
        Supervisor {
            policy,
            nodes: vec![Watch::default(); nodes],
        }
    }

    /// Reaps the nodes that exited and restarts those due; returns what happened, in order.
    /// Call it every few tens of milliseconds.
    pub fn poll(&mut self, cluster: &mut EmbeddedCluster, now: Instant) -> Vec<Event> {
        let mut events = Vec::new();
        while let Some(exit) = cluster.try_wait_any() {
            let restart_in = match self.policy {
                RestartPolicy::Never => None,
                RestartPolicy::Always => {
                    let w = &mut self.nodes[exit.node];
                    let d = w.backoff.after(exit.ran);
                    w.due = Some(now + d);
                    Some(d)
                }
            };
            events.push(Event::Exited {
                exit,
                running: cluster.running(),
                total: cluster.len(),
                restart_in,
            });
        }
        for (node, w) in self.nodes.iter_mut().enumerate() {
            if w.due.is_none_or(|due| due > now) {
                continue;
            }
            match cluster.restart(node) {
                Ok(pid) => {
                    w.due = None;
                    w.restarts += 1;
                    w.failures = 0;
                    events.push(Event::Restarted {
                        node,
                        addr: cluster.cluster().nodes[node].addr,
                        pid,
                        restart: w.restarts,
                        running: cluster.running(),
                        total: cluster.len(),
                    });
                }
                Err(error) => {
                    let retry_in = w.backoff.after(Duration::ZERO);
                    w.due = Some(now + retry_in);
                    w.failures += 1;
                    events.push(Event::RestartFailed {
                        node,
                        attempt: w.failures,
                        error,
                        retry_in,
                    });
                }
            }
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_resets_after_a_stable_run() {
        let mut b = Backoff::default();
        let quick = Duration::from_millis(5);
        let delays: Vec<u128> = (0..8).map(|_| b.after(quick).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        // A node that ran long enough is healthy again: the next restart is quick.
        assert_eq!(b.after(Backoff::STABLE), Backoff::FIRST);
        assert_eq!(b.after(quick), Duration::from_millis(200));
        assert_eq!(
            b.after(Backoff::STABLE - Duration::from_millis(1)),
            Duration::from_millis(400)
        );
    }

    #[test]
    fn delays_print_in_seconds() {
        assert_eq!(secs(Duration::from_millis(100)), "0.1 s");
        assert_eq!(secs(Duration::from_secs(5)), "5.0 s");
        assert_eq!(secs(Duration::from_millis(12_345)), "12.3 s");
    }
}
