//! Membership on etcd: which memory nodes are in the cluster, kept in etcd instead of (or
//! beside) the static cluster file, so that nodes join and leave without restarting clients.
//!
//! Layout in etcd: one key per node, `PREFIX/nodes/ID` (the id zero-padded to ten digits),
//! whose value is the node's [`Member`] record as JSON, attached to a lease of the node's
//! own. A node registers itself and keeps its lease alive ([`register`]); when it stops it
//! revokes the lease, and when it dies the lease expires after `lease_ttl`: either way etcd
//! deletes the key. Its drain state is part of the record.
//!
//! A client lists the members when it connects and then watches the prefix ([`follow`]): a
//! new key is a node that joined, and the client adds it to its node table and to placement
//! (new ranges go to it; existing ranges stay where they are); a deleted key is a node that
//! left, which the client only *suspects* — its failure detector verifies it over a fresh
//! connection before declaring it failed, as for a missed heartbeat.
//!
//! Invariants:
//! - etcd is never on the data path: reads, writes and repairs use the node table the client
//!   already has, so an etcd that is down or slow costs new members, never an I/O;
//! - a client's node table only grows (a node that left stays in it, down), so node indices
//!   held by coding groups stay valid;
//! - whatever etcd holds is untrusted input: a record that does not parse is logged and
//!   skipped, never a panic;
//! - every etcd call has a deadline ([`EtcdConfig::timeout`]).
//!
//! [`Registry`] is the seam: [`etcd::EtcdRegistry`] talks to a real etcd, [`mem::MemRegistry`]
//! keeps the keys in memory and injects the faults (etcd unreachable, a lease that expires)
//! that the unit tests of [`register`] and [`follow`] need.

pub mod etcd;
pub mod follow;
pub mod mem;
pub mod register;
pub mod server;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cluster::{Cluster, NodeEntry};

/// The `[etcd]` table of a cluster file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdConfig {
    /// etcd's client URLs (`http://host:2379`).
    pub endpoints: Vec<String>,
    /// Key prefix of this cluster (several clusters may share one etcd).
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// Seconds a node's registration outlives its last keep-alive.
    #[serde(default = "default_ttl")]
    pub lease_ttl: u64,
    /// Nodes that may join while a client runs (the room its node table keeps for them).
    #[serde(default = "default_room")]
    pub room: usize,
}

fn default_prefix() -> String {
    "/hydramem/default".into()
}
fn default_ttl() -> u64 {
    10
}
fn default_room() -> usize {
    64
}

impl EtcdConfig {
    /// A configuration with the defaults for `endpoints`.
    pub fn new(endpoints: Vec<String>) -> EtcdConfig {
        EtcdConfig {
            endpoints,
            prefix: default_prefix(),
            lease_ttl: default_ttl(),
            room: default_room(),
        }
    }

    /// Checks what a cluster file cannot work with.
    pub fn validate(&self) -> Result<(), String> {
        if self.endpoints.is_empty() {
            return Err("[etcd] lists no endpoints; give etcd's client URLs, e.g. \
                        endpoints = [\"http://127.0.0.1:2379\"]"
                .into());
        }
        if !(1..=3600).contains(&self.lease_ttl) {
            return Err(format!(
                "[etcd] lease_ttl is {} s; it must be 1 to 3600",
                self.lease_ttl
            ));
        }
        if self.prefix.is_empty() || self.prefix.ends_with('/') {
            return Err(format!(
                "[etcd] prefix {:?} must be non-empty and not end with '/'",
                self.prefix
            ));
        }
        Ok(())
    }

    /// The lease's time to live.
    pub fn ttl(&self) -> Duration {
        Duration::from_secs(self.lease_ttl)
    }

    /// The deadline of one etcd call: a third of the lease, at most 3 s, so that a node
    /// that cannot reach etcd has tried its keep-alive several times before its lease ends.
    pub fn timeout(&self) -> Duration {
        (self.ttl() / 3).clamp(Duration::from_millis(200), Duration::from_secs(3))
    }

    /// The prefix under which the nodes' keys live.
    pub fn nodes_prefix(&self) -> String {
        format!("{}/nodes/", self.prefix)
    }

    /// The key of node `id`.
    pub fn member_key(&self, id: u32) -> String {
        format!("{}{id:010}", self.nodes_prefix())
    }
}

/// Why [`etcd_of_file`] found no usable `[etcd]` table.
#[derive(Debug, thiserror::Error)]
pub enum EtcdFileError {
    /// The file cannot be read as TOML now (it may be being written).
    #[error("{0}")]
    Unreadable(String),
    /// It has an `[etcd]` table that cannot work.
    #[error("{0}")]
    Invalid(String),
}

/// The `[etcd]` table of the cluster file at `path`, read leniently for a node's start: a
/// node needs nothing else from the file until its first regeneration, and test harnesses
/// and older scripts write the file while their nodes start (no node listed yet, or half
/// written). `Ok(None)`: the file does not exist or has no `[etcd]`.
pub fn etcd_of_file(path: &std::path::Path) -> Result<Option<EtcdConfig>, EtcdFileError> {
    #[derive(Deserialize)]
    struct Only {
        etcd: Option<EtcdConfig>,
    }
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(EtcdFileError::Unreadable(format!(
                "cannot read {}: {e}",
                path.display()
            )))
        }
    };
    let only: Only = toml::from_str(&text).map_err(|e| {
        EtcdFileError::Unreadable(format!("{} is not valid TOML: {e}", path.display()))
    })?;
    if let Some(cfg) = &only.etcd {
        cfg.validate()
            .map_err(|e| EtcdFileError::Invalid(format!("cluster file {}: {e}", path.display())))?;
    }
    Ok(only.etcd)
}

/// A node's record in etcd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Its id (its `--id`).
    pub id: u32,
    /// Where clients reach it.
    pub addr: SocketAddr,
    /// Its failure domain, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Its slab size (a client refuses a node of another).
    pub slab_size: u64,
    /// Draining: it takes no new slabs and its clients move everything away.
    #[serde(default)]
    pub draining: bool,
}

impl Member {
    /// The record as the value of its key.
    pub fn to_value(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A record read from etcd, checked against its key (`nodes_prefix` + id).
    pub fn parse(cfg: &EtcdConfig, key: &str, value: &[u8]) -> Result<Member, String> {
        let m: Member = serde_json::from_slice(value)
            .map_err(|e| format!("{key}: not a member record: {e}"))?;
        match key_id(cfg, key) {
            Some(id) if id == m.id => Ok(m),
            _ => Err(format!("{key}: the record is of node {}", m.id)),
        }
    }

    /// The record as a cluster-file entry.
    pub fn entry(&self) -> NodeEntry {
        NodeEntry {
            id: self.id,
            addr: self.addr,
            domain: self.domain.clone(),
        }
    }
}

/// The node id a key names, if it is a member key of `cfg`.
pub fn key_id(cfg: &EtcdConfig, key: &str) -> Option<u32> {
    key.strip_prefix(&cfg.nodes_prefix())?.parse().ok()
}

/// A key and its value, with the lease it is attached to (0: none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key.
    pub key: String,
    /// The value.
    pub value: Vec<u8>,
    /// Its lease.
    pub lease: i64,
}

/// One change a watch saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A key was written.
    Put(Entry),
    /// A key was deleted (or its lease expired).
    Delete(String),
}

/// Errors of the membership store.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    /// etcd did not answer (down, unreachable, or slower than the deadline).
    #[error(
        "etcd at {endpoints} did not answer {what}: {reason}; is etcd running there? \
         (the data path keeps working on the membership it last saw)"
    )]
    Unreachable {
        /// The endpoints tried.
        endpoints: String,
        /// The call.
        what: &'static str,
        /// What failed.
        reason: String,
    },
    /// A watch ended (etcd compacted past it, restarted, or cancelled it): list again.
    #[error("the etcd watch ended: {0}; listing the members again")]
    WatchEnded(String),
    /// The local runtime of the etcd client could not start.
    #[error("cannot start the etcd client's runtime: {0}")]
    Runtime(std::io::Error),
}

/// A key-value store with leases and watches: etcd's part of its API that membership uses.
/// Every call returns within the store's deadline.
pub trait Registry: Send + Sync {
    /// A new lease of `ttl`; returns its id.
    fn grant(&self, ttl: Duration) -> Result<i64, MembershipError>;
    /// Renews `lease`; `false` if it has already expired (keys attached to it are gone).
    fn keep_alive(&self, lease: i64) -> Result<bool, MembershipError>;
    /// Ends `lease` now: its keys are deleted.
    fn revoke(&self, lease: i64) -> Result<(), MembershipError>;
    /// Seconds `lease` has left (`None` if it has expired).
    fn time_to_live(&self, lease: i64) -> Result<Option<i64>, MembershipError>;
    /// Writes `key` attached to `lease`.
    fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<(), MembershipError>;
    /// Every key under `prefix` and the store's revision at that moment.
    fn list(&self, prefix: &str) -> Result<(Vec<Entry>, i64), MembershipError>;
    /// The changes under `prefix` from revision `from` on.
    fn watch(&self, prefix: &str, from: i64) -> Result<Box<dyn Watch>, MembershipError>;
}

/// A watch on a prefix.
pub trait Watch: Send {
    /// The next changes, waiting up to `wait` for some (an empty list when none came). An
    /// error ends the watch: list and watch again.
    fn next(&mut self, wait: Duration) -> Result<Vec<Change>, MembershipError>;
}

/// The members listed under `cfg`'s prefix (records that do not parse are logged and
/// skipped) and the revision of the listing.
pub fn members(
    reg: &dyn Registry,
    cfg: &EtcdConfig,
) -> Result<(Vec<Member>, i64), MembershipError> {
    let (listed, rev) = listed(reg, cfg)?;
    Ok((listed.into_iter().map(|(m, _)| m).collect(), rev))
}

/// [`members`], each with the lease its record is attached to.
fn listed(
    reg: &dyn Registry,
    cfg: &EtcdConfig,
) -> Result<(Vec<(Member, i64)>, i64), MembershipError> {
    let (entries, rev) = reg.list(&cfg.nodes_prefix())?;
    let members = entries
        .iter()
        .filter_map(|e| match Member::parse(cfg, &e.key, &e.value) {
            Ok(m) => Some((m, e.lease)),
            Err(reason) => {
                tracing::warn!(%reason, "skipping a malformed member record in etcd");
                None
            }
        })
        .collect();
    Ok((members, rev))
}

/// The members registered in `cfg`'s etcd now (a tool's one look, on a connection of its
/// own).
pub fn registered(cfg: &EtcdConfig) -> Result<Vec<Member>, MembershipError> {
    Ok(members(&etcd::EtcdRegistry::connect(cfg)?, cfg)?.0)
}

/// What a client joins: the cluster file's nodes and, with `[etcd]`, the members etcd lists,
/// and the watch that follows them afterwards ([`Joined::follow`]).
pub struct Joined<'a> {
    cluster: std::borrow::Cow<'a, Cluster>,
    etcd: Option<(Arc<dyn Registry>, EtcdConfig, Option<follow::Listed>)>,
}

impl<'a> Joined<'a> {
    /// The cluster as the client should join it. Without `[etcd]` it is the cluster file.
    /// With it, the members etcd lists are added to the file's nodes (the file's entry wins
    /// for an id both name). If etcd cannot be reached, the file's nodes are used when there
    /// are any, and the watch catches up when etcd is back; with none it is an error.
    pub fn resolve(cluster: &'a Cluster) -> Result<Joined<'a>, MembershipError> {
        let Some(cfg) = cluster.etcd.clone() else {
            return Ok(Joined {
                cluster: std::borrow::Cow::Borrowed(cluster),
                etcd: None,
            });
        };
        let reg: Arc<dyn Registry> = Arc::new(etcd::EtcdRegistry::connect(&cfg)?);
        let mut merged = cluster.clone();
        let listed = match members(&*reg, &cfg) {
            Ok((found, revision)) => {
                merged.add_nodes(found.iter().map(Member::entry));
                Some(follow::Listed {
                    revision,
                    ids: found.iter().map(|m| m.id).collect(),
                })
            }
            Err(e) if !cluster.nodes.is_empty() => {
                tracing::warn!(error = %e, nodes = cluster.nodes.len(), "starting on the cluster file's nodes only");
                None
            }
            Err(e) => return Err(e),
        };
        Ok(Joined {
            cluster: std::borrow::Cow::Owned(merged),
            etcd: Some((reg, cfg, listed)),
        })
    }

    /// The cluster to connect to.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// Room to keep for nodes that join later (0 without etcd).
    pub fn room(&self) -> usize {
        self.etcd.as_ref().map_or(0, |(_, cfg, _)| cfg.room)
    }

    /// Starts following the membership for `roster` (a thread that ends with it).
    pub fn follow<R: follow::Roster>(self, roster: &Arc<R>) -> std::io::Result<()> {
        if let Some((reg, cfg, listed)) = self.etcd {
            follow::spawn(Arc::downgrade(roster), reg, cfg, listed)?;
        }
        Ok(())
    }
}

/// What `hydramem status` says of the membership in etcd: the members registered (to add to
/// the cluster file's nodes) and one line — where etcd is, how many nodes are registered,
/// which drain, the time left on their leases — or why etcd could not be read.
pub fn report(cfg: &EtcdConfig) -> (Vec<Member>, String) {
    let at = format!("etcd at {}, prefix {}", cfg.endpoints.join(","), cfg.prefix);
    let read = etcd::EtcdRegistry::connect(cfg).and_then(|reg| {
        let (found, _) = listed(&reg, cfg)?;
        Ok(found
            .into_iter()
            .map(|(m, lease)| (m, reg.time_to_live(lease).ok().flatten()))
            .collect::<Vec<_>>())
    });
    match read {
        Err(e) => (Vec::new(), format!("membership: {at}: UNREACHABLE ({e})")),
        Ok(found) => {
            let draining: Vec<String> = found
                .iter()
                .filter(|(m, _)| m.draining)
                .map(|(m, _)| m.id.to_string())
                .collect();
            let ttls: Vec<i64> = found.iter().filter_map(|(_, t)| *t).collect();
            let leases = match (ttls.iter().min(), ttls.iter().max()) {
                (Some(lo), Some(hi)) => format!("{lo}–{hi} s left of {} s", cfg.lease_ttl),
                _ => format!("lease {} s", cfg.lease_ttl),
            };
            let line = format!(
                "membership: {at}: {} nodes registered ({leases}); draining: {}",
                found.len(),
                if draining.is_empty() {
                    "none".to_string()
                } else {
                    draining.join(", ")
                }
            );
            (found.into_iter().map(|(m, _)| m).collect(), line)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_reads_only_the_etcd_table_and_tolerates_a_file_being_written() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c.toml");
        assert!(etcd_of_file(&p).unwrap().is_none(), "no file: no etcd");
        std::fs::write(&p, "slab_size = 4194304\n").unwrap();
        assert!(
            etcd_of_file(&p).unwrap().is_none(),
            "no node listed yet: fine"
        );
        std::fs::write(&p, "slab_size = 4194304\n[[node]]\nid = 0\naddr = \"127.0").unwrap();
        assert!(matches!(
            etcd_of_file(&p),
            Err(EtcdFileError::Unreadable(_))
        ));
        std::fs::write(
            &p,
            "slab_size = 1\n[etcd]\nendpoints = [\"http://e:2379\"]\n",
        )
        .unwrap();
        let cfg = etcd_of_file(&p).unwrap().unwrap();
        assert_eq!(
            (cfg.lease_ttl, cfg.prefix.as_str()),
            (10, "/hydramem/default")
        );
        std::fs::write(&p, "[etcd]\nendpoints = []\n").unwrap();
        assert!(matches!(etcd_of_file(&p), Err(EtcdFileError::Invalid(_))));
    }
}
