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
//! paused or partitioned one keeps it until this is run again). Releasing an identity that a
//! client is still using destroys that client's data: stop the client first.

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

/// Frees every slab `client` holds on every node of `cluster`, each node within `timeout`.
pub fn release(cluster: &Cluster, client: ClientId, timeout: Duration) -> Vec<NodeRelease> {
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
            ),
        })
        .collect()
}

/// Frees the identity's slabs on the node at `addr`; returns how many.
fn release_on(addr: SocketAddr, g: &Greeting, timeout: Duration) -> Result<u64, ReleaseError> {
    let mut c = Connection::open(addr, Some(g), timeout, timeout)?;
    let list = c.call(Op::List, &[], wire::parse_list)?;
    for slab in list.iter().map(|l| l.slab) {
        let mut body = Vec::new();
        wire::put_free(&mut body, slab);
        c.request(Op::Free, &body)
            .map_err(|source| ReleaseError::Free { slab, source })?;
    }
    Ok(list.len() as u64)
}
