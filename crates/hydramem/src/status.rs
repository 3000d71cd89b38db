//! Cluster status: asks every node for its STATS over a short-lived observer connection.
//!
//! Observer connections say HELLO with [`wire::HELLO_OBSERVER`], so they are not counted as
//! clients and cannot touch slabs. A node that does not answer within the timeout is reported
//! down with the reason, and the others are still shown. Draining a node (DRAIN) is asked
//! here too: the operator follows it in the node's status.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;

use crate::cluster::Cluster;
use crate::rpc::{Access, Connection, RpcError};
use crate::units::human;
use crate::wire::{self, Op, Stats};

/// One node's status.
#[derive(Debug, Serialize)]
pub struct NodeStatus {
    /// Node id from the cluster file.
    pub id: u32,
    /// Its address.
    pub addr: SocketAddr,
    /// Its STATS, or why they could not be had.
    #[serde(flatten)]
    pub result: StatusResult,
}

/// STATS or the error.
#[derive(Debug, Serialize)]
#[serde(rename_all = "lowercase", tag = "health")]
pub enum StatusResult {
    /// The node answered.
    Up(Stats),
    /// It did not.
    Down {
        /// Why.
        error: String,
    },
    /// It answered, but the two ends do not share the cluster key (see [`crate::auth`]).
    Refused {
        /// Why.
        error: String,
    },
}

/// Fetches STATS from one node, as an observer (proving the cluster's key, if it has one).
pub fn fetch(addr: SocketAddr, access: &Access, timeout: Duration) -> Result<Stats, RpcError> {
    let observer = access.observer();
    Connection::open(addr, Some(&observer), timeout, timeout)?.call(Op::Stats, &[], Stats::parse)
}

/// Starts (`start`) or cancels draining the node at `addr` (DRAIN, an operator's request:
/// with a cluster key, it proves the key as an operator).
pub fn drain(
    addr: SocketAddr,
    start: bool,
    access: &Access,
    timeout: Duration,
) -> Result<(), RpcError> {
    let mut body = Vec::new();
    wire::put_drain(&mut body, start);
    Connection::open(addr, access.operator().as_ref(), timeout, timeout)?
        .request(Op::Drain, &body)
        .map(drop)
}

/// Status of every node of the cluster, in cluster-file order.
pub fn collect(cluster: &Cluster) -> Vec<NodeStatus> {
    cluster
        .nodes
        .iter()
        .map(|n| NodeStatus {
            id: n.id,
            addr: n.addr,
            result: match fetch(n.addr, &Access::of(cluster), Duration::from_secs(2)) {
                Ok(s) => StatusResult::Up(s),
                Err(e @ RpcError::Auth { .. }) => StatusResult::Refused {
                    error: e.to_string(),
                },
                Err(e) => StatusResult::Down {
                    error: e.to_string(),
                },
            },
        })
        .collect()
}

/// A human-readable table of the status.
pub fn table(cluster: &Cluster, rows: &[NodeStatus]) -> String {
    let mut o = String::new();
    let up = rows
        .iter()
        .filter(|r| matches!(r.result, StatusResult::Up(_)))
        .count();
    let _ = writeln!(
        o,
        "cluster: {} nodes ({} up), slab size {}",
        rows.len(),
        up,
        human(cluster.slab_size)
    );
    let _ = writeln!(
        o,
        "{:>4}  {:<21} {:<6} {:>10} {:>10} {:>6} {:>7} {:>10} {:>8} {:>10} {:>12} {:>12} {:>7} {:>6}",
        "node",
        "address",
        "health",
        "capacity",
        "used",
        "slabs",
        "budget",
        "mem avail",
        "clients",
        "rss",
        "reads",
        "writes",
        "corrupt",
        "regen"
    );
    let (mut cap, mut used) = (0u64, 0u64);
    for r in rows {
        match &r.result {
            StatusResult::Up(s) => {
                cap += s.capacity;
                used += s.used();
                let reads: u64 = s.slabs.iter().map(|x| x.reads).sum();
                let writes: u64 = s.slabs.iter().map(|x| x.writes).sum();
                // drain: the node is being drained; evict: it reclaimed slabs (memory pressure).
                let health = if s.draining {
                    "drain"
                } else if s.reclaiming > 0 {
                    "evict"
                } else {
                    "up"
                };
                let _ = writeln!(
                    o,
                    "{:>4}  {:<21} {:<6} {:>10} {:>10} {:>6} {:>7} {:>10} {:>8} {:>10} {:>12} {:>12} {:>7} {:>6}",
                    r.id,
                    r.addr.to_string(),
                    health,
                    human(s.capacity),
                    human(s.used()),
                    s.slabs.len(),
                    s.budget_slabs,
                    human(s.mem_available),
                    s.clients,
                    human(s.rss),
                    reads,
                    writes,
                    s.corrupt_reported,
                    s.regenerating
                );
            }
            StatusResult::Down { error } | StatusResult::Refused { error } => {
                let health = match r.result {
                    StatusResult::Refused { .. } => "KEY?",
                    _ => "DOWN",
                };
                let _ = writeln!(
                    o,
                    "{:>4}  {:<21} {:<6} {}",
                    r.id,
                    r.addr.to_string(),
                    health,
                    error
                );
            }
        }
    }
    let regen: u32 = rows
        .iter()
        .filter_map(|r| match &r.result {
            StatusResult::Up(s) => Some(s.regenerating),
            _ => None,
        })
        .sum();
    let (mut reclaiming, mut moved, mut forced, mut corrupt) = (0u64, 0u64, 0u64, 0u64);
    for r in rows {
        if let StatusResult::Up(s) = &r.result {
            reclaiming += s.reclaiming as u64;
            moved += s.evicted_moved;
            forced += s.evicted_forced;
            corrupt += s.corrupt_reported;
        }
    }
    let _ = writeln!(
        o,
        "total: {} of {} donated memory in use; {regen} slab regenerations in progress; \
         {reclaiming} slabs reclaimed and being moved ({moved} moved, {forced} dropped so far); \
         {corrupt} corrupted splits reported by clients",
        human(used),
        human(cap)
    );
    access_line(&mut o, rows, cluster.tls.is_some());
    let slab_rows: Vec<_> = rows
        .iter()
        .filter_map(|r| match &r.result {
            StatusResult::Up(s) => Some((r.id, s)),
            _ => None,
        })
        .flat_map(|(id, s)| s.slabs.iter().map(move |x| (id, x)))
        .collect();
    if !slab_rows.is_empty() {
        let _ = writeln!(o, "\nslabs (per-slab access counters):");
        let _ = writeln!(
            o,
            "{:>4} {:>10} {:>10} {:>18} {:>12} {:>12} {:>7} {:>10} {:>9}",
            "node", "slab", "client", "tag", "reads", "writes", "corrupt", "holds", "state"
        );
        for (id, x) in slab_rows.iter().take(200) {
            let _ = writeln!(
                o,
                "{:>4} {:>10} {:>10} {:>#18x} {:>12} {:>12} {:>7} {:>10} {:>9}",
                id,
                x.slab,
                format!("{:08x}", x.owner),
                x.tag,
                x.reads,
                x.writes,
                x.corrupt,
                human(x.held),
                if x.flags & wire::SLAB_RECLAIMED != 0 {
                    "reclaimed"
                } else {
                    "mapped"
                }
            );
        }
        if slab_rows.len() > 200 {
            let _ = writeln!(
                o,
                "... and {} more (use --json for all)",
                slab_rows.len() - 200
            );
        }
    }
    o
}

/// Seconds as the largest whole unit that fits them: 600 → "10m", 604800 → "7d".
fn span(secs: u32) -> String {
    match secs {
        s if s >= 86400 && s % 86400 == 0 => format!("{}d", s / 86400),
        s if s >= 3600 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if s >= 60 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// One line on who may connect: how many nodes have the cluster key, whether this tool
/// reached them over TLS, their quota and leases, and the identities they track (see
/// `node::tenants`).
fn access_line(o: &mut String, rows: &[NodeStatus], tls: bool) {
    let up: Vec<&Stats> = rows
        .iter()
        .filter_map(|r| match &r.result {
            StatusResult::Up(s) => Some(s),
            _ => None,
        })
        .collect();
    let Some(first) = up.first().map(|s| s.tenancy) else {
        return;
    };
    let keyed = up.iter().filter(|s| s.tenancy.keyed).count();
    let key = match keyed {
        0 => "NO cluster key (anyone who connects reaches every slab)".to_string(),
        k if k == up.len() => "cluster key on every node".to_string(),
        k => format!("cluster key on only {k} of {} nodes", up.len()),
    };
    let tls = if tls {
        "TLS (certificates from the cluster CA)"
    } else {
        "no TLS (traffic in the clear)"
    };
    let quota = match first.quota {
        0 => "no quota".to_string(),
        q => format!("quota {q} slabs per identity per node"),
    };
    let (ids, connected) = up.iter().fold((0u64, 0u64), |(a, b), s| {
        (
            a + u64::from(s.tenancy.identities),
            b + u64::from(s.tenancy.connected),
        )
    });
    let _ = writeln!(
        o,
        "access: {key}; {tls}; {quota}; leases {}, kept {}; {ids} identities on the nodes \
         ({connected} connected)",
        span(first.lease_s),
        span(first.kept_lease_s)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The end column of `header`'s `name` and of the value that follows below it agree.
    fn aligned(text: &str, header: &str, name: &str, row: &str, value: &str) {
        let h = text.lines().find(|l| l.starts_with(header)).unwrap();
        let r = text.lines().find(|l| l.starts_with(row)).unwrap();
        let end = h.find(name).unwrap() + name.len();
        assert_eq!(&r[end - value.len()..end], value, "\n{h}\n{r}");
    }

    #[test]
    fn corrupted_splits_have_their_columns_per_node_and_per_slab() {
        let cluster = Cluster {
            etcd: None,
            slab_size: 1 << 20,
            placement: None,
            key_file: None,
            tls_dir: None,
            tls: None,
            key: None,
            nodes: Vec::new(),
        };
        let stats = Stats {
            slab_size: 1 << 20,
            corrupt_reported: 1234,
            slabs: vec![wire::SlabStats {
                slab: 2_000_000_000,
                corrupt: 987,
                ..Default::default()
            }],
            ..Default::default()
        };
        let rows = [NodeStatus {
            id: 0,
            addr: "127.0.0.1:7400".parse().unwrap(),
            result: StatusResult::Up(stats),
        }];
        let text = table(&cluster, &rows);
        aligned(&text, "node  address", "corrupt", "   0  127.0.0.1", "1234");
        aligned(
            &text,
            "node       slab",
            "corrupt",
            "   0 2000000000",
            "987",
        );
        aligned(
            &text,
            "node       slab",
            "slab",
            "   0 2000000000",
            "2000000000",
        );
        assert!(
            text.contains("1234 corrupted splits reported by clients"),
            "{text}"
        );
        let json = serde_json::to_value(&rows).unwrap();
        assert_eq!(json[0]["corrupt_reported"], 1234);
        assert_eq!(json[0]["slabs"][0]["corrupt"], 987);
    }
}
