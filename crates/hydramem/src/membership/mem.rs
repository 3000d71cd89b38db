//! [`Registry`] in memory, with the faults membership must survive: the store unreachable
//! (every call and every open watch fails until it is back) and a lease that expires (its
//! keys are deleted, as etcd does when a node stops renewing). Leases expire only when a test
//! says so ([`MemRegistry::expire`]), so tests never depend on time.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::{Change, Entry, MembershipError, Registry, Watch};

#[derive(Default)]
struct State {
    kv: BTreeMap<String, (Vec<u8>, i64)>,
    leases: HashMap<i64, Duration>,
    next_lease: i64,
    revision: i64,
    /// Every change, with the revision that made it.
    log: Vec<(i64, Change)>,
    unreachable: bool,
    /// Bumped when the store becomes unreachable: open watches end.
    outage: u64,
    calls: u64,
}

/// An in-memory registry (see the module doc). Clones share the store.
#[derive(Clone, Default)]
pub struct MemRegistry {
    inner: Arc<(Mutex<State>, Condvar)>,
}

impl MemRegistry {
    /// An empty store.
    pub fn new() -> MemRegistry {
        MemRegistry::default()
    }

    /// Makes the store unreachable (`true`) or reachable again.
    pub fn set_unreachable(&self, down: bool) {
        let mut st = self.inner.0.lock();
        st.unreachable = down;
        if down {
            st.outage += 1;
        }
        self.inner.1.notify_all();
    }

    /// `lease` expires now: its keys are deleted.
    pub fn expire(&self, lease: i64) {
        let mut st = self.inner.0.lock();
        drop_lease(&mut st, lease);
        self.inner.1.notify_all();
    }

    /// The leases alive now.
    pub fn leases(&self) -> Vec<i64> {
        let mut l: Vec<i64> = self.inner.0.lock().leases.keys().copied().collect();
        l.sort_unstable();
        l
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.inner.0.lock().kv.get(key).map(|(v, _)| v.clone())
    }

    /// Deletes `key` (as an operator's `etcdctl del` would).
    pub fn delete(&self, key: &str) {
        let mut st = self.inner.0.lock();
        if st.kv.remove(key).is_some() {
            log(&mut st, Change::Delete(key.to_string()));
        }
        self.inner.1.notify_all();
    }

    /// Calls made so far (successful or not).
    pub fn calls(&self) -> u64 {
        self.inner.0.lock().calls
    }

    /// Waits until `cond` holds of the store or `timeout` passes; whether it holds.
    pub fn wait_for(&self, timeout: Duration, cond: impl Fn(&MemRegistry) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if cond(self) {
                return true;
            }
            let mut st = self.inner.0.lock();
            if Instant::now() >= deadline {
                return false;
            }
            self.inner.1.wait_until(
                &mut st,
                deadline.min(Instant::now() + Duration::from_millis(50)),
            );
        }
    }

    fn enter(
        &self,
        what: &'static str,
    ) -> Result<parking_lot::MutexGuard<'_, State>, MembershipError> {
        let mut st = self.inner.0.lock();
        st.calls += 1;
        self.inner.1.notify_all();
        if st.unreachable {
            return Err(MembershipError::Unreachable {
                endpoints: "memory".into(),
                what,
                reason: "injected outage".into(),
            });
        }
        Ok(st)
    }
}

fn log(st: &mut State, c: Change) {
    st.revision += 1;
    let rev = st.revision;
    st.log.push((rev, c));
}

fn drop_lease(st: &mut State, lease: i64) {
    if st.leases.remove(&lease).is_none() {
        return;
    }
    let gone: Vec<String> = st
        .kv
        .iter()
        .filter(|(_, (_, l))| *l == lease)
        .map(|(k, _)| k.clone())
        .collect();
    for k in gone {
        st.kv.remove(&k);
        log(st, Change::Delete(k));
    }
}

impl Registry for MemRegistry {
    fn grant(&self, ttl: Duration) -> Result<i64, MembershipError> {
        let mut st = self.enter("LeaseGrant")?;
        st.next_lease += 1;
        let id = st.next_lease;
        st.leases.insert(id, ttl);
        Ok(id)
    }

    fn keep_alive(&self, lease: i64) -> Result<bool, MembershipError> {
        Ok(self.enter("LeaseKeepAlive")?.leases.contains_key(&lease))
    }

    fn revoke(&self, lease: i64) -> Result<(), MembershipError> {
        let mut st = self.enter("LeaseRevoke")?;
        drop_lease(&mut st, lease);
        self.inner.1.notify_all();
        Ok(())
    }

    fn time_to_live(&self, lease: i64) -> Result<Option<i64>, MembershipError> {
        let st = self.enter("LeaseTimeToLive")?;
        Ok(st
            .leases
            .get(&lease)
            .map(|t| i64::try_from(t.as_secs()).unwrap_or(i64::MAX)))
    }

    fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<(), MembershipError> {
        let mut st = self.enter("Put")?;
        if lease != 0 && !st.leases.contains_key(&lease) {
            return Err(MembershipError::Unreachable {
                endpoints: "memory".into(),
                what: "Put",
                reason: format!("lease {lease} not found"),
            });
        }
        st.kv.insert(key.to_string(), (value.to_vec(), lease));
        log(
            &mut st,
            Change::Put(Entry {
                key: key.to_string(),
                value: value.to_vec(),
                lease,
            }),
        );
        self.inner.1.notify_all();
        Ok(())
    }

    fn list(&self, prefix: &str) -> Result<(Vec<Entry>, i64), MembershipError> {
        let st = self.enter("Range")?;
        let entries = st
            .kv
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, (v, l))| Entry {
                key: k.clone(),
                value: v.clone(),
                lease: *l,
            })
            .collect();
        Ok((entries, st.revision))
    }

    fn watch(&self, prefix: &str, from: i64) -> Result<Box<dyn Watch>, MembershipError> {
        let st = self.enter("Watch")?;
        let from = if from <= 0 { st.revision + 1 } else { from };
        Ok(Box::new(MemWatch {
            reg: self.clone(),
            prefix: prefix.to_string(),
            next: from,
            outage: st.outage,
        }))
    }
}

struct MemWatch {
    reg: MemRegistry,
    prefix: String,
    /// The first revision not delivered yet.
    next: i64,
    /// The outage count when the watch opened: any later outage ends it.
    outage: u64,
}

impl Watch for MemWatch {
    fn next(&mut self, wait: Duration) -> Result<Vec<Change>, MembershipError> {
        let (m, cv) = &*self.reg.inner;
        let deadline = Instant::now() + wait;
        let mut st = m.lock();
        loop {
            if st.outage != self.outage {
                return Err(MembershipError::WatchEnded("injected outage".into()));
            }
            let out: Vec<Change> = st
                .log
                .iter()
                .filter(|(rev, _)| *rev >= self.next)
                .map(|(_, c)| c.clone())
                .filter(|c| match c {
                    Change::Put(e) => e.key.starts_with(&self.prefix),
                    Change::Delete(k) => k.starts_with(&self.prefix),
                })
                .collect();
            self.next = st.revision + 1;
            if !out.is_empty() || Instant::now() >= deadline {
                return Ok(out);
            }
            cv.wait_until(&mut st, deadline);
        }
    }
}
