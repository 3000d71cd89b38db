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
//! ```
//!
//! Invariants checked on load: at least one node, distinct ids and addresses, addresses that
//! parse, and a slab size that is a positive multiple of 4096.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

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

/// The whole cluster file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cluster {
    /// Size of every slab on every node of this cluster.
    pub slab_size: u64,
    /// The memory nodes.
    #[serde(rename = "node", default)]
    pub nodes: Vec<NodeEntry>,
}

/// Errors reading or writing a cluster file.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The file could not be read or written.
    #[error("cannot {what} cluster file {path}: {source}")]
    Io {
        /// read or write.
        what: &'static str,
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
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
}

impl Cluster {
    /// Reads and validates a cluster file.
    pub fn load(path: &Path) -> Result<Cluster, ClusterError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ClusterError::Io {
            what: "read",
            path: p.clone(),
            source,
        })?;
        let c: Cluster = toml::from_str(&text).map_err(|e| ClusterError::Parse {
            path: p.clone(),
            reason: e.to_string(),
        })?;
        c.validate()
            .map_err(|reason| ClusterError::Invalid { path: p, reason })?;
        Ok(c)
    }

    /// Checks the invariants listed in the module doc.
    pub fn validate(&self) -> Result<(), String> {
        if self.slab_size == 0 || !self.slab_size.is_multiple_of(4096) {
            return Err(format!(
                "slab_size {} must be a positive multiple of 4096",
                self.slab_size
            ));
        }
        if self.nodes.is_empty() {
            return Err("it lists no [[node]]; start nodes with `hydramem up` or add them".into());
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
            .map_err(|source| ClusterError::Io {
                what: "write",
                path: p,
                source,
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
            slab_size: 1 << 20,
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
}
