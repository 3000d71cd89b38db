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
//! still uses is not released anywhere: its nodes refuse this connection while the client's
//! are open, and one refusal stops the release on every node ([`release`],
//! [`ReleaseError::in_use`]), so stop the client first.

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
    /// Another node said a running process holds the identity: nothing was released here
    /// either.
    #[error(
        "not released: another node says a running process holds this identity, so none of \
         its memory is released"
    )]
    HeldElsewhere,
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
    /// Whether the release was refused because a running process holds the identity (on
    /// this node, or on another).
    pub fn in_use(&self) -> bool {
        match self {
            ReleaseError::List(e) => e.in_use(),
            ReleaseError::HeldElsewhere => true,
            ReleaseError::Free { .. } => false,
        }
    }
}

/// Frees every slab `client` holds on every node of `cluster`, each node within `timeout`.
///
/// In two steps, so that a running client's memory is released nowhere: first every node is
/// greeted as the identity (asked again for a few seconds while one says another process
/// holds it: [`crate::rpc::patiently`], since the process whose memory this releases may have
/// just exited). If any node still says so, nothing is listed or freed anywhere — a node
/// where that process has no connection just now would admit this one — and every node
/// reports it. Otherwise each node greeted LISTs and FREEs on its connection, which holds
/// the identity there meanwhile.
pub fn release(cluster: &Cluster, client: ClientId, timeout: Duration) -> Vec<NodeRelease> {
    let grace = std::time::Instant::now() + crate::rpc::IN_USE_GRACE;
    let greeted: Vec<Result<Connection, RpcError>> = cluster
        .nodes
        .iter()
        .map(|n| {
            let g = Greeting::client(&client, 0, cluster.key.as_ref())
                .with_tls(cluster.tls.as_ref())
                .to_node(n.id);
            crate::rpc::patiently(grace, RpcError::in_use, || {
                Connection::open(n.addr, Some(&g), timeout, timeout)
            })
        })
        .collect();
    let in_use = greeted
        .iter()
        .any(|c| c.as_ref().is_err_and(RpcError::in_use));
    cluster
        .nodes
        .iter()
        .zip(greeted)
        .map(|(n, c)| NodeRelease {
            id: n.id,
            addr: n.addr,
            result: match c {
                Err(e) => Err(ReleaseError::List(e)),
                Ok(_) if in_use => Err(ReleaseError::HeldElsewhere),
                Ok(mut c) => release_on(&mut c),
            },
        })
        .collect()
}

/// Frees the identity's slabs on the node `c` is greeted by; returns how many.
fn release_on(c: &mut Connection) -> Result<u64, ReleaseError> {
    let list = c.call(Op::List, &[], wire::parse_list)?;
    for slab in list.iter().map(|l| l.slab) {
        let mut body = Vec::new();
        wire::put_free(&mut body, slab);
        c.request(Op::Free, &body)
            .map_err(|source| ReleaseError::Free { slab, source })?;
    }
    Ok(list.len() as u64)
}
