//! Registering a node (its side of the membership): a thread puts the node's [`Member`]
//! record under a lease of its own and renews the lease every third of its time to live.
//!
//! Invariants: the record in etcd is the node's current one (a drain that starts or stops is
//! written at the next renewal); a lease that expired while etcd was unreachable (or an etcd
//! that lost its data) is noticed at the first renewal that reaches etcd, and the node
//! registers again under a new lease; the node's serving never waits on etcd; stopping
//! revokes the lease, so that clients see the node leave at once rather than a lease later.
//! The thread also hands the member list it reads at each renewal to the node
//! ([`Node::set_listed`]), which looks up there the regeneration sources that the cluster
//! file does not list.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::{members, EtcdConfig, Member, MembershipError, Registry};
use crate::node::Node;
use crate::sampled::Sampled;

/// A running registration; dropping it stops the thread and revokes the lease.
pub struct Registration {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Shared {
    stop: Mutex<bool>,
    wake: Condvar,
    /// The lease the record is attached to now (0: not registered).
    lease: std::sync::atomic::AtomicI64,
}

impl Registration {
    /// Registers `node`, reachable at `addr` and in failure domain `domain`, in the etcd of
    /// `cfg`, and hands it the members listed at every renewal.
    pub fn for_node(
        node: Arc<Node>,
        cfg: EtcdConfig,
        addr: std::net::SocketAddr,
        domain: Option<String>,
    ) -> Result<Registration, MembershipError> {
        let reg: Arc<dyn Registry> = Arc::new(super::etcd::EtcdRegistry::connect(&cfg)?);
        let n = node.clone();
        let state = move || Member {
            id: n.config().id,
            addr,
            domain: domain.clone(),
            slab_size: n.config().slab_size,
            draining: n.draining(),
        };
        let listed = move |m: Vec<Member>| node.set_listed(m.iter().map(Member::entry).collect());
        Registration::start(reg, cfg, state, listed).map_err(MembershipError::Runtime)
    }

    /// Starts registering the node whose current record `state` gives; `listed` gets the
    /// members etcd lists at each renewal.
    pub fn start(
        reg: Arc<dyn Registry>,
        cfg: EtcdConfig,
        state: impl Fn() -> Member + Send + 'static,
        listed: impl Fn(Vec<Member>) + Send + 'static,
    ) -> std::io::Result<Registration> {
        let shared = Arc::new(Shared {
            stop: Mutex::new(false),
            wake: Condvar::new(),
            lease: std::sync::atomic::AtomicI64::new(0),
        });
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("hm-register".into())
            .spawn(move || Registrar::new(reg, cfg).run(&sh, &state, &listed))?;
        Ok(Registration {
            shared,
            thread: Some(thread),
        })
    }

    /// The lease the node's record is attached to (0 while not registered).
    pub fn lease(&self) -> i64 {
        self.shared.lease.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        *self.shared.stop.lock() = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The registration's state (a struct so that tests drive it step by step).
pub struct Registrar {
    reg: Arc<dyn Registry>,
    cfg: EtcdConfig,
    /// The lease and the record put under it.
    current: Option<(i64, Member)>,
    /// Failed renewals in a row (their warnings sampled).
    failures: Sampled,
}

impl Registrar {
    /// A registrar of `cfg`'s membership in `reg`.
    pub fn new(reg: Arc<dyn Registry>, cfg: EtcdConfig) -> Registrar {
        Registrar {
            reg,
            cfg,
            current: None,
            failures: Sampled::new(100),
        }
    }

    fn run(mut self, sh: &Shared, state: &dyn Fn() -> Member, listed: &dyn Fn(Vec<Member>)) {
        loop {
            let stepped = self.step(&state());
            // The lease is published before the members are handed on, so that whoever sees
            // the listing sees the registration that made it.
            let lease = self.current.as_ref().map_or(0, |c| c.0);
            sh.lease.store(lease, std::sync::atomic::Ordering::Relaxed);
            metrics::gauge!("hydramem_node_etcd_registered").set(if lease != 0 {
                1.0
            } else {
                0.0
            });
            let wait = match stepped {
                Ok(members) => {
                    listed(members);
                    self.cfg.ttl() / 3
                }
                Err(e) => {
                    if let Some(failures) = self.failures.hit() {
                        tracing::warn!(error = %e, failures, "cannot renew this node's registration in etcd; serving on");
                    }
                    metrics::counter!("hydramem_node_etcd_errors_total").increment(1);
                    Duration::from_secs(1).min(self.cfg.ttl() / 3)
                }
            };
            let mut stop = sh.stop.lock();
            if !*stop {
                sh.wake.wait_for(&mut stop, wait);
            }
            if *stop {
                drop(stop);
                self.leave();
                return;
            }
        }
    }

    /// One renewal: register if not registered (or the lease is gone), else renew and
    /// rewrite the record if it changed; then list the members.
    pub fn step(&mut self, now: &Member) -> Result<Vec<Member>, MembershipError> {
        if let Some((lease, _)) = &self.current {
            if !self.reg.keep_alive(*lease)? {
                tracing::warn!(
                    lease,
                    "this node's etcd lease had expired: registering again"
                );
                self.current = None;
            }
        }
        let key = self.cfg.member_key(now.id);
        match &mut self.current {
            None => {
                let lease = self.reg.grant(self.cfg.ttl())?;
                self.reg.put(&key, &now.to_value(), lease)?;
                tracing::info!(id = now.id, addr = %now.addr, lease, ttl_s = self.cfg.lease_ttl, "registered in etcd");
                self.current = Some((lease, now.clone()));
            }
            Some((lease, last)) if last != now => {
                self.reg.put(&key, &now.to_value(), *lease)?;
                tracing::info!(
                    draining = now.draining,
                    "updated this node's record in etcd"
                );
                *last = now.clone();
            }
            Some(_) => {}
        }
        if self.failures.reset() > 0 {
            tracing::info!("etcd reachable again");
        }
        let listed = members(&*self.reg, &self.cfg)?.0;
        // The record deleted under a live lease (an operator's `etcdctl del`): write it again.
        if let Some((lease, _)) = &self.current {
            if !listed.iter().any(|m| m.id == now.id) {
                tracing::warn!(
                    id = now.id,
                    "this node's record was gone from etcd: writing it again"
                );
                self.reg.put(&key, &now.to_value(), *lease)?;
            }
        }
        Ok(listed)
    }

    /// Revokes the lease (best effort): the node leaves the membership now.
    pub fn leave(&mut self) {
        if let Some((lease, _)) = self.current.take() {
            match self.reg.revoke(lease) {
                Ok(()) => tracing::info!("left the etcd membership"),
                Err(e) => {
                    tracing::warn!(error = %e, "could not revoke this node's etcd lease; it ends by itself")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::mem::MemRegistry;

    fn me(draining: bool) -> Member {
        Member {
            id: 4,
            addr: ([192, 0, 2, 1], 7404).into(),
            domain: Some("rack-a".into()),
            slab_size: 1 << 20,
            draining,
        }
    }

    #[test]
    fn registers_renews_records_a_drain_and_leaves() {
        let reg = MemRegistry::new();
        let cfg = EtcdConfig::new(vec!["memory".into()]);
        let mut r = Registrar::new(Arc::new(reg.clone()), cfg.clone());
        let listed = r.step(&me(false)).unwrap();
        assert_eq!(listed, vec![me(false)]);
        let lease = reg.leases()[0];
        r.step(&me(true)).unwrap();
        let v = reg.get(&cfg.member_key(4)).unwrap();
        assert_eq!(
            Member::parse(&cfg, &cfg.member_key(4), &v).unwrap(),
            me(true)
        );
        assert_eq!(reg.leases(), vec![lease], "a renewal keeps its lease");
        r.leave();
        assert!(reg.get(&cfg.member_key(4)).is_none());
        assert!(reg.leases().is_empty());
    }

    #[test]
    fn an_expired_lease_or_an_outage_ends_in_a_new_registration() {
        let reg = MemRegistry::new();
        let cfg = EtcdConfig::new(vec!["memory".into()]);
        let mut r = Registrar::new(Arc::new(reg.clone()), cfg.clone());
        r.step(&me(false)).unwrap();
        let first = reg.leases()[0];
        reg.set_unreachable(true);
        assert!(r.step(&me(false)).is_err());
        reg.set_unreachable(false);
        reg.expire(first); // it could not renew in time
        assert!(reg.get(&cfg.member_key(4)).is_none());
        r.step(&me(false)).unwrap();
        assert!(reg.get(&cfg.member_key(4)).is_some(), "registered again");
        assert_ne!(reg.leases(), vec![first]);
    }

    #[test]
    fn a_record_deleted_under_a_live_lease_is_written_again() {
        let reg = MemRegistry::new();
        let cfg = EtcdConfig::new(vec!["memory".into()]);
        let mut r = Registrar::new(Arc::new(reg.clone()), cfg.clone());
        r.step(&me(false)).unwrap();
        reg.delete(&cfg.member_key(4));
        r.step(&me(false)).unwrap();
        assert!(reg.get(&cfg.member_key(4)).is_some());
    }

    #[test]
    fn the_thread_registers_and_revokes_on_drop() {
        let reg = MemRegistry::new();
        let cfg = EtcdConfig::new(vec!["memory".into()]);
        let key = cfg.member_key(4);
        let reg_ = Arc::new(reg.clone());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen_ = seen.clone();
        let registration =
            Registration::start(reg_, cfg, || me(false), move |m| *seen_.lock() = m).unwrap();
        assert!(reg.wait_for(Duration::from_secs(10), |_| !seen.lock().is_empty()));
        assert_eq!(*seen.lock(), vec![me(false)]);
        assert_ne!(registration.lease(), 0);
        drop(registration);
        assert!(reg.get(&key).is_none(), "a stopped node leaves at once");
    }
}
