//! The cluster file: the list of memory nodes a client may use, and the slab size they share.
//!
//! `hydramem up` writes it and every client command reads it with `--cluster FILE`. It is TOML:
//!
//! ```toml
//! slab_size = 1073741824
//!
//! [[node]]
//! id = 0
//! addr = "127.0.0.1:7400"
//! domain = "rack-a"   # optional failure domain
//!
//! [placement]          # optional; this is the default
//! policy = "codingsets" # or "ec-cache", "power-of-two"
//! l = 2                 # CodingSets' load-balancing factor (codingsets only)
//! ```
//!
//! An optional top-level `key_file = "cluster.key"` names the cluster key (see
//! [`crate::auth`]), relative to the cluster file's directory; `HYDRAMEM_CLUSTER_KEY_FILE`
//! overrides it, and a command's `--cluster-key` both ([`Cluster::with_key_flag`]).
//!
//! An optional top-level `tls_dir = "tls/client"` names a TLS member directory (see
//! [`crate::tls`]), relative to the same directory; `HYDRAMEM_TLS_DIR` overrides it, and a
//! command's `--tls` both ([`Cluster::with_tls_flag`]).
//!
//! An optional `[etcd]` table ([`crate::membership::EtcdConfig`]: `endpoints`, `prefix`,
//! `lease_ttl`, `room`) adds the members registered in etcd to the nodes listed here; nodes
//! read it to register themselves, clients to follow nodes that join and leave. With it the
//! file may list no node at all.
//!
//! The placement policy lives in the cluster file, not in each client's settings, because
//! CodingSets only keeps its copyset count low when every client forms the same extended groups
//! from the same nodes with the same l.
//!
//! Invariants checked on load: at least one and at most [`MAX_NODES`] nodes, distinct ids and
//! addresses, addresses that
//! parse, a slab size that is a positive multiple of 4096, a known placement policy, and `l`
//! given only for CodingSets.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::auth::{ClusterKey, KeyError};
use crate::placement::{Policy, PolicyKind};
use crate::tls::{Tls, TlsError, TLS_DIR_ENV};

/// Most nodes a cluster file may list: clients number nodes with 16 bits and keep the
/// largest value to mean "no node".
pub const MAX_NODES: usize = u16::MAX as usize;

/// One memory node as the cluster file lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEntry {
    /// The node's id (its `--id`).
    pub id: u32,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Optional failure domain (rack, power feed): placement never puts two splits of one
    /// address range in one domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
}

/// The optional `[placement]` table: which policy clients use to place address ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlacementConfig {
    /// `codingsets` (Hydra's, the default), `ec-cache` or `power-of-two`.
    pub policy: PolicyKind,
    /// CodingSets' load-balancing factor (spare nodes per extended group); when absent the
    /// client's own setting applies (2 by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l: Option<usize>,
}

/// The whole cluster file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cluster {
    /// Size of every slab on every node of this cluster.
    pub slab_size: u64,
    /// How clients place address ranges; CodingSets with the client's l when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<PlacementConfig>,
    /// The cluster key's file, relative to the cluster file's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// The member directory of TLS (see [`crate::tls`]), relative to the cluster file's
    /// directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_dir: Option<PathBuf>,
    /// Membership in etcd, beside (or instead of) the nodes listed here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<crate::membership::EtcdConfig>,
    /// The memory nodes.
    #[serde(rename = "node", default)]
    pub nodes: Vec<NodeEntry>,
    /// The cluster key, as [`Cluster::load`] or [`Cluster::with_key_flag`] found it; never
    /// written to the file.
    #[serde(skip)]
    pub key: Option<ClusterKey>,
    /// TLS, as [`Cluster::load`] or [`Cluster::with_tls_flag`] found it; never written.
    #[serde(skip)]
    pub tls: Option<Tls>,
}

/// Errors reading or writing a cluster file.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The file could not be read or written.
    #[error("cannot {what} cluster file {path}: {cause}")]
    Io {
        /// read or write.
        what: &'static str,
        /// The file.
        path: String,
        /// The OS error (in the message, not a separate source, so that it is said once).
        cause: std::io::Error,
    },
    /// The file is not valid TOML of the expected shape.
    #[error("cluster file {path} is malformed: {reason}")]
    Parse {
        /// The file.
        path: String,
        /// What the parser said.
        reason: String,
    },
    /// The file parses but cannot describe a working cluster.
    #[error("cluster file {path} is invalid: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The cluster key it names could not be used.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The TLS member directory it names could not be used.
    #[error(transparent)]
    Tls(#[from] TlsError),
}

impl Cluster {
    /// Reads and validates a cluster file.
    pub fn load(path: &Path) -> Result<Cluster, ClusterError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|cause| ClusterError::Io {
            what: "read",
            path: p.clone(),
            cause,
        })?;
        let c: Cluster = toml::from_str(&text).map_err(|e| ClusterError::Parse {
            path: p.clone(),
            reason: e.to_string(),
        })?;
        let mut c = c;
        c.validate()
            .map_err(|reason| ClusterError::Invalid { path: p, reason })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let named = c.key_file.as_ref().map(|f| dir.join(f));
        c.key = crate::auth::key_from(None, named.as_deref())?;
        let tls_dir = std::env::var_os(TLS_DIR_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or(c.tls_dir.as_ref().map(|d| dir.join(d)));
        c.tls = tls_dir.map(|d| Tls::load(&d)).transpose()?;
        Ok(c)
    }

    /// The same cluster with the TLS member directory of `--tls DIR`, if given (it overrides
    /// `HYDRAMEM_TLS_DIR` and the file's `tls_dir`).
    pub fn with_tls_flag(mut self, flag: Option<&Path>) -> Result<Cluster, ClusterError> {
        if let Some(d) = flag {
            self.tls = Some(Tls::load(d)?);
        }
        Ok(self)
    }

    /// The same cluster with the key of `--cluster-key FILE`, if given (it overrides the
    /// environment and the file's `key_file`).
    pub fn with_key_flag(mut self, flag: Option<&Path>) -> Result<Cluster, ClusterError> {
        if let Some(f) = flag {
            self.key = Some(ClusterKey::load(f)?);
        }
        Ok(self)
    }

    /// Adds each of `nodes` whose id the cluster does not list yet (a listed entry wins).
    pub fn add_nodes(&mut self, nodes: impl IntoIterator<Item = NodeEntry>) {
        for n in nodes {
            if !self.nodes.iter().any(|m| m.id == n.id) {
                self.nodes.push(n);
            }
        }
    }

    /// Checks the invariants listed in the module doc.
    pub fn validate(&self) -> Result<(), String> {
        if self.slab_size == 0 || !self.slab_size.is_multiple_of(4096) {
            return Err(format!(
                "slab_size {} must be a positive multiple of 4096",
                self.slab_size
            ));
        }
        if let Some(e) = &self.etcd {
            e.validate()?;
        } else if self.nodes.is_empty() {
            return Err(
                "it lists no [[node]] and no [etcd]; start nodes with `hydramem up` \
                        or add them"
                    .into(),
            );
        }
        if self.nodes.len() > MAX_NODES {
            return Err(format!(
                "it lists {} nodes; a cluster has at most {MAX_NODES}",
                self.nodes.len()
            ));
        }
        if let Some(PlacementConfig { policy, l: Some(l) }) = self.placement {
            if policy != PolicyKind::Codingsets {
                return Err(format!(
                    "[placement] sets l = {l} for policy \"{policy}\", but l applies to \
                     codingsets only; remove l or use policy = \"codingsets\""
                ));
            }
        }
        let mut ids = HashSet::new();
        let mut addrs = HashSet::new();
        for n in &self.nodes {
            if !ids.insert(n.id) {
                return Err(format!("node id {} appears twice", n.id));
            }
            if !addrs.insert(n.addr) {
                return Err(format!("address {} appears twice", n.addr));
            }
        }
        Ok(())
    }

    /// The placement policy clients of this cluster use: the `[placement]` table's, with
    /// `default_l` as CodingSets' l when the file gives none; CodingSets with `default_l` when
    /// the file has no `[placement]` table.
    pub fn placement_policy(&self, default_l: usize) -> Policy {
        match self.placement {
            Some(p) => p.policy.with_l(p.l.unwrap_or(default_l)),
            None => Policy::CodingSets { l: default_l },
        }
    }

    /// Writes the file atomically (temporary file, then rename), so a reader never sees half.
    pub fn save(&self, path: &Path) -> Result<(), ClusterError> {
        let p = path.display().to_string();
        let text = toml::to_string_pretty(self).map_err(|e| ClusterError::Parse {
            path: p.clone(),
            reason: e.to_string(),
        })?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|cause| ClusterError::Io {
                what: "write",
                path: p,
                cause,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_validation() {
        let dir = std::env::temp_dir().join(format!("hm-cluster-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        let c = Cluster {
            etcd: None,
            slab_size: 1 << 20,
            placement: None,
            key_file: None,
            tls_dir: None,
            tls: None,
            key: None,
            nodes: vec![
                NodeEntry {
                    id: 0,
                    addr: "127.0.0.1:1".parse().unwrap(),
                    domain: None,
                },
                NodeEntry {
                    id: 1,
                    addr: "127.0.0.1:2".parse().unwrap(),
                    domain: Some("r1".into()),
                },
            ],
        };
        c.save(&path).unwrap();
        assert_eq!(Cluster::load(&path).unwrap(), c);
        let mut dup = c.clone();
        dup.nodes[1].id = 0;
        assert!(dup.validate().unwrap_err().contains("twice"));
        std::fs::write(&path, "slab_size = 100\n").unwrap();
        let e = Cluster::load(&path).unwrap_err().to_string();
        assert!(e.contains("multiple of 4096"), "{e}");
        std::fs::write(&path, "garbage = [").unwrap();
        assert!(matches!(
            Cluster::load(&path),
            Err(ClusterError::Parse { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn placement_setting() {
        let base = "slab_size = 4096\n[[node]]\nid = 0\naddr = \"127.0.0.1:1\"\n";
        let parse = |extra: &str| -> Result<Cluster, String> {
            let c: Cluster =
                toml::from_str(&format!("{base}{extra}")).map_err(|e| e.to_string())?;
            c.validate().map(|()| c)
        };
        let c = parse("").unwrap();
        assert_eq!(c.placement, None);
        assert_eq!(c.placement_policy(2), Policy::CodingSets { l: 2 });
        let c = parse("[placement]\npolicy = \"codingsets\"\nl = 4\n").unwrap();
        assert_eq!(c.placement_policy(2), Policy::CodingSets { l: 4 });
        let c = parse("[placement]\npolicy = \"codingsets\"\n").unwrap();
        assert_eq!(c.placement_policy(3), Policy::CodingSets { l: 3 });
        let c = parse("[placement]\npolicy = \"ec-cache\"\n").unwrap();
        assert_eq!(c.placement_policy(2), Policy::EcCache);
        let c = parse("[placement]\npolicy = \"power-of-two\"\n").unwrap();
        assert_eq!(c.placement_policy(2), Policy::PowerOfTwo);
        let e = parse("[placement]\npolicy = \"power-of-two\"\nl = 1\n").unwrap_err();
        assert!(e.contains("codingsets only"), "{e}");
        let e = parse("[placement]\npolicy = \"copysets\"\n").unwrap_err();
        assert!(e.contains("copysets"), "{e}");
        let e = parse("[placement]\npolicy = \"ec-cache\"\nspare = 1\n").unwrap_err();
        assert!(e.contains("spare"), "{e}");
        // The table survives a round trip through the writer.
        let c = parse("[placement]\npolicy = \"codingsets\"\nl = 1\n").unwrap();
        let text = toml::to_string_pretty(&c).unwrap();
        assert_eq!(toml::from_str::<Cluster>(&text).unwrap(), c);
    }
}
