//! The identities a node serves: how many slabs each may hold (its quota) and how long its
//! slabs outlive its last connection (its lease).
//!
//! An identity *holds a lease* while any of its connections is open (observers do not count):
//! every connection renews it. When its last connection closes, the lease runs out after
//! [`TenancyConfig::lease`] — or [`TenancyConfig::kept_lease`] for an identity that said in
//! HELLO it is kept (a `--client-id` that is meant to be reattached later) — and the node then
//! frees every slab of the identity: a crashed client's memory comes back, and capacity cannot
//! be squatted by identities that never return. A client that reconnects before then finds its
//! slabs as it left them.
//!
//! An identity is *held* by one process at a time: every connection says its process's
//! instance in HELLO, and while an identity has connections open, a connection of another
//! instance is refused ([`Refusal::InUse`]). Two processes that write into one identity's
//! slabs (a second `--client-id` started by mistake, `hydramem free` run against a client
//! still running) would each take the other's splits for their own; this way the second is
//! told so at once. Once the holder's last connection closes, any instance may take the
//! identity (a restart, or a client on another machine); a holder whose machine vanished
//! without closing its connections loses them to TCP keepalive ([`super::limits::keep_alive`]).
//!
//! Invariants: the connections open for an identity are all of one instance; an identity is
//! tracked while it has a connection open or a lease running, and
//! forgotten when its lease expires, so the table is bounded by the connections plus the
//! identities that disconnected within one lease; [`Tenants::expired`] reports each expiry
//! once; the quota is checked and the slab inserted under the node's allocation lock, so an
//! identity never holds more than its quota (counted by the node, not here).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::wire::ClientId;

/// Quotas and leases of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenancyConfig {
    /// Most slabs one identity may hold on this node; 0: no limit but the node's capacity.
    pub quota: u64,
    /// How long the slabs of an identity outlive its last connection.
    pub lease: Duration,
    /// The same for an identity that said it is kept.
    pub kept_lease: Duration,
    /// Most connections one identity may hold open on this node (observers not counted); 0:
    /// no limit but the node's. A client holds one, plus one per regeneration and tool.
    pub max_connections: u32,
}

impl Default for TenancyConfig {
    /// No quota; ten minutes for a client that lost its connections (long enough to ride out
    /// a network partition or a node's restart of its listener, short enough that a crashed
    /// client's memory comes back soon); seven days for kept identities; 64 connections per
    /// identity.
    fn default() -> TenancyConfig {
        TenancyConfig {
            quota: 0,
            lease: Duration::from_secs(600),
            kept_lease: Duration::from_secs(7 * 24 * 3600),
            max_connections: 64,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Tenant {
    connections: u32,
    /// The instance whose connections are open (meaningful while `connections > 0`).
    holder: u64,
    kept: bool,
    /// When the last connection closed (`None` while one is open).
    idle_since: Option<Instant>,
}

/// Why a connection was not admitted for its identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The identity holds as many connections as it may on this node.
    TooManyConnections,
    /// Another instance (process) holds the identity with this many connections open.
    InUse {
        /// Its connections open here.
        connections: u32,
    },
}

/// The identities of one node (see the module doc).
#[derive(Debug)]
pub struct Tenants {
    config: TenancyConfig,
    map: Mutex<HashMap<ClientId, Tenant>>,
}

impl Tenants {
    /// No identity yet.
    pub fn new(config: TenancyConfig) -> Tenants {
        Tenants {
            config,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &TenancyConfig {
        &self.config
    }

    /// A connection of `owner` opened by `instance` (it renews the lease); `kept` if it said
    /// so. Refused, and nothing changed, if the identity holds as many connections as it may,
    /// or if another instance's connections hold it.
    pub fn connected(&self, owner: ClientId, kept: bool, instance: u64) -> Result<(), Refusal> {
        let mut map = self.map.lock();
        let t = map.entry(owner).or_insert(Tenant {
            connections: 0,
            holder: instance,
            kept,
            idle_since: None,
        });
        if t.connections > 0 && t.holder != instance {
            return Err(Refusal::InUse {
                connections: t.connections,
            });
        }
        let max = self.config.max_connections;
        if max > 0 && t.connections >= max {
            return Err(Refusal::TooManyConnections);
        }
        t.connections += 1;
        t.holder = instance;
        t.kept |= kept;
        t.idle_since = None;
        Ok(())
    }

    /// A connection of `owner` closed at `now`; the lease runs from the last one.
    pub fn disconnected(&self, owner: ClientId, now: Instant) {
        let mut map = self.map.lock();
        if let Some(t) = map.get_mut(&owner) {
            t.connections = t.connections.saturating_sub(1);
            if t.connections == 0 {
                t.idle_since = Some(now);
            }
        }
    }

    /// The identities whose lease ran out by `now`, forgotten as they are returned.
    pub fn expired(&self, now: Instant) -> Vec<(ClientId, Duration)> {
        let mut out = Vec::new();
        self.map.lock().retain(|owner, t| {
            let lease = if t.kept {
                self.config.kept_lease
            } else {
                self.config.lease
            };
            match t.idle_since {
                Some(since) if now.saturating_duration_since(since) >= lease => {
                    out.push((*owner, lease));
                    false
                }
                _ => true,
            }
        });
        out
    }

    /// Identities tracked now, and how many of them have a connection open.
    pub fn counts(&self) -> (usize, usize) {
        let map = self.map.lock();
        (
            map.len(),
            map.values().filter(|t| t.connections > 0).count(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_runs_from_the_last_connection_and_kept_identities_get_the_long_one() {
        let tenants = Tenants::new(TenancyConfig {
            quota: 0,
            lease: Duration::from_secs(10),
            kept_lease: Duration::from_secs(100),
            max_connections: 0,
        });
        let (a, k) = (ClientId([1; 16]), ClientId([2; 16]));
        let t0 = Instant::now();
        assert!(tenants.connected(a, false, 1).is_ok());
        assert!(tenants.connected(a, false, 1).is_ok());
        assert!(tenants.connected(k, true, 1).is_ok());
        tenants.disconnected(a, t0);
        // One connection of `a` is still open: no lease runs.
        assert!(tenants.expired(t0 + Duration::from_secs(50)).is_empty());
        tenants.disconnected(a, t0 + Duration::from_secs(50));
        tenants.disconnected(k, t0 + Duration::from_secs(50));
        assert!(tenants.expired(t0 + Duration::from_secs(59)).is_empty());
        assert_eq!(
            tenants.expired(t0 + Duration::from_secs(60)),
            vec![(a, Duration::from_secs(10))]
        );
        // Reported once, then forgotten.
        assert!(tenants.expired(t0 + Duration::from_secs(61)).is_empty());
        // A reconnection renews the kept identity's lease.
        tenants.connected(k, false, 2).unwrap();
        tenants.disconnected(k, t0 + Duration::from_secs(140));
        assert!(tenants.expired(t0 + Duration::from_secs(200)).is_empty());
        assert_eq!(tenants.expired(t0 + Duration::from_secs(240)).len(), 1);
        assert_eq!(tenants.counts(), (0, 0));
    }

    #[test]
    fn an_identity_holds_at_most_its_connections_and_others_are_unaffected() {
        let tenants = Tenants::new(TenancyConfig {
            max_connections: 2,
            ..TenancyConfig::default()
        });
        let (a, b) = (ClientId([1; 16]), ClientId([2; 16]));
        assert!(tenants.connected(a, false, 1).is_ok());
        assert!(tenants.connected(a, false, 1).is_ok());
        assert_eq!(
            tenants.connected(a, false, 1),
            Err(Refusal::TooManyConnections),
            "a third connection of a"
        );
        assert!(
            tenants.connected(b, false, 1).is_ok(),
            "b has its own allowance"
        );
        tenants.disconnected(a, Instant::now());
        assert!(
            tenants.connected(a, false, 1).is_ok(),
            "a connection freed is one more"
        );
        assert_eq!(tenants.counts(), (2, 2));
    }

    #[test]
    fn an_identity_is_held_by_one_instance_until_its_last_connection_closes() {
        let tenants = Tenants::new(TenancyConfig::default());
        let (a, b) = (ClientId([1; 16]), ClientId([2; 16]));
        let t0 = Instant::now();
        assert!(tenants.connected(a, true, 7).is_ok());
        assert!(
            tenants.connected(a, true, 7).is_ok(),
            "the holder's reconnection"
        );
        assert_eq!(
            tenants.connected(a, true, 8),
            Err(Refusal::InUse { connections: 2 }),
            "a second process with the same identity"
        );
        assert!(
            tenants.connected(b, true, 8).is_ok(),
            "another identity is another matter"
        );
        // A refusal changed nothing: one close leaves one connection of the holder.
        tenants.disconnected(a, t0);
        assert_eq!(
            tenants.connected(a, false, 8),
            Err(Refusal::InUse { connections: 1 })
        );
        tenants.disconnected(a, t0);
        // The holder is gone: the next process takes the identity, slabs and lease alike.
        assert!(tenants.connected(a, true, 8).is_ok());
        assert_eq!(
            tenants.connected(a, true, 7),
            Err(Refusal::InUse { connections: 1 }),
            "the old holder, back too late"
        );
        assert!(tenants
            .expired(t0 + Duration::from_secs(30 * 24 * 3600))
            .is_empty());
    }
}
