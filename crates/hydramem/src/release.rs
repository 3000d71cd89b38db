//! Releasing everything one client identity holds on a cluster, without connecting as that
//! client: no scheme or size is needed, only the identity.
//!
//! A client that keeps its identity (`hydramem nbd --client-id`) leaves its slabs on the
//! nodes when it stops, so that the next client with that identity finds its data again. This
//! is how an operator gives that memory back: each node is asked, on a connection of its own
//! that says HELLO as the identity, for the identity's slabs (LIST), and each is freed (FREE).
//! Slabs of other identities cannot be named on that connection, so nothing else is touched.
//!
//! Invariants: a node is reported released only when every slab it listed was freed; a node
//! that cannot be reached is reported with the reason, and the others are still released (a
//! node that restarts holds nothing of anyone, so a dead node's share is gone already, but a
//! paused or partitioned one keeps it until this is run again). An identity that a client
//! still uses is not released: its nodes refuse this connection while the client's are open
//! ([`ReleaseError::in_use`]), so stop the client first.

use std::net::SocketAddr;
use std::time::Duration;

use crate::cluster::Cluster;
use crate::rpc::{Connection, Greeting, RpcError};
use crate::wire::{self, ClientId, Op};

/// What releasing did on one node.
#[derive(Debug)]
pub struct NodeRelease {
    /// Node id from the cluster file.
    pub id: u32,
    /// Its address.
    pub addr: SocketAddr,
    /// Slabs freed, or why the node could not be released.
    pub result: Result<u64, ReleaseError>,
}

/// Why a node could not be released.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    /// The identity's slabs could not be listed (the node is unreachable, or refused).
    #[error(transparent)]
    List(#[from] RpcError),
    /// A slab could not be freed; the slabs listed after it were not tried.
    #[error("freeing slab {slab}: {source}")]
    Free {
        /// The slab.
        slab: u32,
        /// Why.
        source: RpcError,
    },
}

impl ReleaseError {
    /// Whether the node refused because a running process holds the identity there.
    pub fn in_use(&self) -> bool {
        matches!(self, ReleaseError::List(e) if e.in_use())
    }
}

/// Frees every slab `client` holds on every node of `cluster`, each node within `timeout`.
pub fn release(cluster: &Cluster, client: ClientId, timeout: Duration) -> Vec<NodeRelease> {
    let grace = std::time::Instant::now() + crate::rpc::IN_USE_GRACE;
    cluster
        .nodes
        .iter()
        .map(|n| NodeRelease {
            id: n.id,
            addr: n.addr,
            result: release_on(
                n.addr,
                &Greeting::client(&client, 0, cluster.key.as_ref())
                    .with_tls(cluster.tls.as_ref())
                    .to_node(n.id),
                timeout,
                grace,
            ),
        })
        .collect()
}

/// Frees the identity's slabs on the node at `addr`; returns how many. A node that says
/// another process holds the identity is asked again until `grace`
/// ([`crate::rpc::patiently`]): the process whose memory this releases may have just exited.
fn release_on(
    addr: SocketAddr,
    g: &Greeting,
    timeout: Duration,
    grace: std::time::Instant,
) -> Result<u64, ReleaseError> {
    let mut c = crate::rpc::patiently(grace, RpcError::in_use, || {
        Connection::open(addr, Some(g), timeout, timeout)
    })?;
    let list = c.call(Op::List, &[], wire::parse_list)?;
    for slab in list.iter().map(|l| l.slab) {
        let mut body = Vec::new();
        wire::put_free(&mut body, slab);
        c.request(Op::Free, &body)
            .map_err(|source| ReleaseError::Free { slab, source })?;
    }
    Ok(list.len() as u64)
}
