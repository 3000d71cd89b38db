//! Members that join the cluster while the client runs ([`crate::membership`]): a new node
//! becomes the next index of the node table (transport, loads, failure domains, ids), the
//! placer is rebuilt over the larger table, and new ranges may go to it at once. Ranges
//! already mapped stay where they are. A member that left is only suspected: the transport
//! verifies it before declaring it failed.
//!
//! Invariants: joins are serialized (by the write lock of the node ids), so the transport's
//! members and placement's tables grow in the same order; the connection to a new member is
//! made before the placement lock is taken, so I/O and placement go on while it dials; every
//! per-node vector placement indexes (loads, domains) grows together under the placement
//! lock, and placement offers a node only once it is in them.

use std::net::SocketAddr;

use super::ranges::node_views;
use super::{ClientError, RemoteMemory};
use crate::membership::{follow::Roster, Member};
use crate::placement::Placer;

impl RemoteMemory {
    /// The ids of this client's nodes, in index order.
    pub fn member_ids(&self) -> Vec<u32> {
        self.node_ids.read().clone()
    }

    /// Adds node `id` at `addr` (failure domain `domain`) to this client; returns its index
    /// (its existing one if it is a member already: the address it had is kept, and a change
    /// is logged, since live groups name the node by index).
    pub fn join_member(
        &self,
        id: u32,
        addr: SocketAddr,
        domain: Option<&str>,
    ) -> Result<u16, ClientError> {
        let mut ids = self.node_ids.write();
        if let Some(i) = ids.iter().position(|&x| x == id) {
            let i = u16::try_from(i).unwrap_or(u16::MAX);
            let known = self.transport.addr(i);
            if known != addr.to_string() {
                tracing::warn!(id, %addr, %known, "a member's address changed; this client keeps the old one until it restarts");
            }
            return Ok(i);
        }
        let node = self.transport.join(id, addr)?;
        let mut pl = self.placement.lock();
        debug_assert_eq!(usize::from(node), pl.loads.len(), "joins are serialized");
        pl.loads
            .push(self.transport.notice(node).slabs.map_or(0, u64::from));
        pl.domains.push(domain);
        ids.push(id);
        drop(ids);
        let views = node_views(&*self.transport, &pl.loads, &pl.domains.of, &self.health);
        // More nodes never make a placer impossible that was possible with fewer.
        pl.placer = Placer::new(pl.policy, self.layout.width, &views, pl.seed)
            .map_err(|source| ClientError::Placement { range: 0, source })?;
        metrics::gauge!("hydramem_client_nodes").set(self.transport.nodes() as f64);
        tracing::info!(node, id, %addr, up = self.transport.is_up(node), "memory node added: new ranges may go to it");
        Ok(node)
    }

    /// Node `id` left the membership: verify it now (it is declared failed only if it does
    /// not answer a fresh connection).
    pub fn member_left(&self, id: u32) {
        if let Some(i) = self.node_ids.read().iter().position(|&x| x == id) {
            if let Ok(node) = u16::try_from(i) {
                self.transport.suspect(node);
            }
        }
    }
}

impl Roster for RemoteMemory {
    fn member_ids(&self) -> Vec<u32> {
        RemoteMemory::member_ids(self)
    }

    fn joined(&self, m: &Member) {
        if m.slab_size != self.layout.slab_size {
            tracing::warn!(id = m.id, addr = %m.addr, node_slab = m.slab_size, "a member with another slab size is not used");
            return;
        }
        if let Err(e) = self.join_member(m.id, m.addr, m.domain.as_deref()) {
            tracing::warn!(id = m.id, addr = %m.addr, error = %e, "cannot add the new memory node");
        }
    }

    fn left(&self, id: u32) {
        self.member_left(id);
    }
}
