//! Following the membership (a client's side): a thread lists the members and then watches
//! for changes, telling its [`Roster`] (the client) of nodes that join and leave.
//!
//! Invariants: every member etcd lists reaches the roster, even if it joined while the watch
//! was broken (after an error the thread lists again and compares); a node is reported left
//! only when etcd deleted its key (lease expired or revoked), and the roster only suspects it;
//! the thread holds the roster weakly and ends within [`POLL`] of the roster being dropped;
//! while etcd is unreachable it retries with a backoff up to [`MAX_BACKOFF`] and changes
//! nothing.

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{members, Change, EtcdConfig, Member, MembershipError, Registry, Watch};
use crate::sampled::Sampled;

/// Longest wait on the watch before the thread checks that its roster still exists.
pub const POLL: Duration = Duration::from_millis(500);
/// Longest wait between attempts while etcd is unreachable.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What the membership changes: a client's node table.
pub trait Roster: Send + Sync + 'static {
    /// Ids of the nodes it knows.
    fn member_ids(&self) -> Vec<u32>;
    /// A node joined (or its record changed: a known id is left as it is).
    fn joined(&self, m: &Member);
    /// A node's key is gone: suspect it (verify before declaring it failed).
    fn left(&self, id: u32);
}

/// A listing the caller made before the thread starts: the revision it was made at and the
/// ids of the members it found (already in the roster).
#[derive(Debug, Clone, Default)]
pub struct Listed {
    /// The store's revision at the listing.
    pub revision: i64,
    /// The members' ids.
    pub ids: Vec<u32>,
}

/// Starts the thread for `roster`, watching `cfg`'s members from just after `listed` (`None`:
/// it lists first).
pub fn spawn<R: Roster>(
    roster: Weak<R>,
    reg: Arc<dyn Registry>,
    cfg: EtcdConfig,
    listed: Option<Listed>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let mut f = Follower::new(reg, cfg);
    if let Some(l) = listed {
        f.from = l.revision + 1;
        f.present = l.ids.into_iter().collect();
    }
    std::thread::Builder::new()
        .name("hm-members".into())
        .spawn(move || f.run(&roster))
}

/// The thread's state (a struct so that tests drive it step by step).
pub struct Follower {
    reg: Arc<dyn Registry>,
    cfg: EtcdConfig,
    /// Ids etcd listed at the last look (to tell who left during an outage).
    present: HashSet<u32>,
    watch: Option<Box<dyn Watch>>,
    /// The revision to watch from after a listing.
    from: i64,
    /// Failed steps in a row (their warnings sampled).
    failures: Sampled,
}

impl Follower {
    /// A follower of `cfg`'s members in `reg`.
    pub fn new(reg: Arc<dyn Registry>, cfg: EtcdConfig) -> Follower {
        Follower {
            reg,
            cfg,
            present: HashSet::new(),
            watch: None,
            from: 0,
            failures: Sampled::new(100),
        }
    }

    fn run<R: Roster>(mut self, roster: &Weak<R>) {
        loop {
            let Some(r) = roster.upgrade() else { return };
            let wait = match self.step(&*r) {
                Ok(()) => Duration::ZERO,
                Err(e) => {
                    if let Some(failures) = self.failures.hit() {
                        tracing::warn!(error = %e, failures, "membership watch");
                    }
                    metrics::counter!("hydramem_client_membership_errors_total").increment(1);
                    let steps = u32::try_from(self.failures.count().min(25)).unwrap_or(25);
                    (Duration::from_millis(200) * steps).min(MAX_BACKOFF)
                }
            };
            drop(r);
            // Back off in steps of POLL, to notice the roster going away.
            let mut left = wait;
            while !left.is_zero() {
                let d = left.min(POLL);
                std::thread::sleep(d);
                left -= d;
                if roster.strong_count() == 0 {
                    return;
                }
            }
        }
    }

    /// One step: list and open a watch if there is none, else wait up to [`POLL`] for
    /// changes and apply them. An error drops the watch: the next step lists again.
    pub fn step(&mut self, roster: &dyn Roster) -> Result<(), MembershipError> {
        let watch = match &mut self.watch {
            Some(w) => w,
            None => {
                if self.from <= 0 {
                    self.resync(roster)?;
                }
                let w = self.reg.watch(&self.cfg.nodes_prefix(), self.from);
                self.from = 0; // a broken watch lists again
                let w = self.watch.insert(w?);
                if self.failures.reset() > 0 {
                    tracing::info!("membership watch restored");
                }
                w
            }
        };
        match watch.next(POLL) {
            Ok(changes) => {
                for c in changes {
                    self.apply(roster, c);
                }
                Ok(())
            }
            Err(e) => {
                self.watch = None;
                Err(e)
            }
        }
    }

    /// Lists the members: new ones join, ones present before and gone now left.
    fn resync(&mut self, roster: &dyn Roster) -> Result<(), MembershipError> {
        let (found, rev) = members(&*self.reg, &self.cfg)?;
        let now: HashSet<u32> = found.iter().map(|m| m.id).collect();
        let known: HashSet<u32> = roster.member_ids().into_iter().collect();
        for m in &found {
            if !known.contains(&m.id) {
                tracing::info!(id = m.id, addr = %m.addr, "memory node joined the cluster");
                roster.joined(m);
            }
        }
        for gone in self.present.difference(&now) {
            tracing::info!(id = gone, "memory node left the cluster (not in etcd)");
            roster.left(*gone);
        }
        self.present = now;
        self.from = rev + 1;
        Ok(())
    }

    fn apply(&mut self, roster: &dyn Roster, c: Change) {
        match c {
            Change::Put(e) => match Member::parse(&self.cfg, &e.key, &e.value) {
                Ok(m) => {
                    let new = self.present.insert(m.id);
                    if new && !roster.member_ids().contains(&m.id) {
                        tracing::info!(id = m.id, addr = %m.addr, "memory node joined the cluster");
                    }
                    roster.joined(&m);
                }
                Err(reason) => {
                    tracing::warn!(%reason, "skipping a malformed member record in etcd")
                }
            },
            Change::Delete(key) => {
                if let Some(id) = super::key_id(&self.cfg, &key) {
                    if self.present.remove(&id) {
                        tracing::info!(id, "memory node left the cluster (its lease ended)");
                        roster.left(id);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::mem::MemRegistry;
    use parking_lot::Mutex;

    #[derive(Default)]
    struct Log {
        ids: Mutex<Vec<u32>>,
        left: Mutex<Vec<u32>>,
    }

    impl Roster for Log {
        fn member_ids(&self) -> Vec<u32> {
            self.ids.lock().clone()
        }
        fn joined(&self, m: &Member) {
            let mut ids = self.ids.lock();
            if !ids.contains(&m.id) {
                ids.push(m.id);
            }
        }
        fn left(&self, id: u32) {
            self.left.lock().push(id);
        }
    }

    fn member(id: u32) -> Member {
        Member {
            id,
            addr: ([192, 0, 2, 1], 7400 + u16::try_from(id).unwrap()).into(),
            domain: None,
            slab_size: 1 << 20,
            draining: false,
        }
    }

    fn register(reg: &MemRegistry, cfg: &EtcdConfig, id: u32) -> i64 {
        let lease = reg.grant(cfg.ttl()).unwrap();
        reg.put(&cfg.member_key(id), &member(id).to_value(), lease)
            .unwrap();
        lease
    }

    #[test]
    fn joins_and_leaves_reach_the_roster_in_order() {
        let reg = MemRegistry::new();
        let cfg = EtcdConfig::new(vec!["memory".into()]);
        register(&reg, &cfg, 0);
        let roster = Log::default();
        let mut f = Follower::new(Arc::new(reg.clone()), cfg.clone());
        f.step(&roster).unwrap(); // lists, watches
        assert_eq!(roster.member_ids(), vec![0]);
        let lease = register(&reg, &cfg, 1);
        f.step(&roster).unwrap();
        assert_eq!(roster.member_ids(), vec![0, 1]);
        reg.expire(lease);
        f.step(&roster).unwrap();
        assert_eq!(*roster.left.lock(), vec![1]);
        // A malformed record and a foreign key are skipped, not fatal.
        let l = reg.grant(cfg.ttl()).unwrap();
        reg.put(&cfg.member_key(7), b"{not json", l).unwrap();
        reg.put(&cfg.member_key(8), &member(9).to_value(), l)
            .unwrap();
        f.step(&roster).unwrap();
        assert_eq!(roster.member_ids(), vec![0, 1]);
    }

    #[test]
    fn what_changed_during_an_outage_is_applied_when_etcd_is_back() {
        let reg = MemRegistry::new();
        let cfg = EtcdConfig::new(vec!["memory".into()]);
        let gone = register(&reg, &cfg, 0);
        register(&reg, &cfg, 1);
        let roster = Log::default();
        let mut f = Follower::new(Arc::new(reg.clone()), cfg.clone());
        f.step(&roster).unwrap();
        reg.set_unreachable(true);
        assert!(
            f.step(&roster).is_err(),
            "the watch must end with the outage"
        );
        assert!(
            f.step(&roster).is_err(),
            "and listing must fail while etcd is down"
        );
        // Changes the follower cannot see: node 0 leaves, node 2 joins.
        reg.set_unreachable(false);
        reg.expire(gone);
        register(&reg, &cfg, 2);
        reg.set_unreachable(true);
        reg.set_unreachable(false);
        f.step(&roster).unwrap();
        assert_eq!(roster.member_ids(), vec![0, 1, 2]);
        assert_eq!(*roster.left.lock(), vec![0]);
    }

    #[test]
    fn the_thread_ends_when_the_roster_is_dropped() {
        let reg = MemRegistry::new();
        let cfg = EtcdConfig::new(vec!["memory".into()]);
        let roster = Arc::new(Log::default());
        let h = spawn(
            Arc::downgrade(&roster),
            Arc::new(reg.clone()),
            cfg.clone(),
            None,
        )
        .unwrap();
        register(&reg, &cfg, 3);
        assert!(reg.wait_for(Duration::from_secs(10), |_| roster.member_ids() == vec![3]));
        drop(roster);
        h.join().unwrap();
    }
}
