//! Members joining a running client ([`RemoteMemory::join_member`]): a new node gets new
//! ranges at once, the ranges already mapped stay, every page reads back, and a client whose
//! node table is full says so.

use std::net::SocketAddr;
use std::time::Duration;

use super::{Model, PAGE, SLAB};
use crate::client::mem::{cluster, connect, MemOptions};
use crate::client::transport::TransportError;
use crate::client::{ClientConfig, ClientError};

fn addr(i: u16) -> SocketAddr {
    SocketAddr::from(([192, 0, 2, 2], i))
}

#[test]
fn a_node_that_joins_gets_the_next_ranges_and_the_old_ones_stay() {
    // hydra 4+2 on 6 nodes, room for 2 more; 64 pages per range.
    let per_range = 64;
    let pages = 8 * per_range;
    let mut config = ClientConfig::new("hydra-4+2-d1".parse().unwrap(), pages * PAGE);
    config.seed = Some(7);
    config.op_timeout = Duration::from_secs(5);
    let options = MemOptions {
        slabs_per_node: 64,
        seed: 3,
        spare: 2,
    };
    let (mem, _ctl) = connect(&cluster(6, SLAB), config, options).unwrap();
    let mut model = Model::default();
    model.write(&mem, 0, per_range, true).unwrap();
    let before = mem.group_of(0).unwrap();

    assert_eq!(mem.join_member(100, addr(1), None).unwrap(), 6);
    assert_eq!(mem.join_member(101, addr(2), Some("rack-b")).unwrap(), 7);
    assert_eq!(
        mem.join_member(100, addr(9), None).unwrap(),
        6,
        "a known id keeps its index"
    );
    assert_eq!(mem.member_ids(), vec![0, 1, 2, 3, 4, 5, 100, 101]);
    assert_eq!(mem.transport().nodes(), 8);

    // The next range goes to the least loaded nodes: the two new ones among them.
    model
        .write(&mem, per_range * PAGE, per_range, true)
        .unwrap();
    let next = mem.group_of(per_range * PAGE).unwrap();
    let width = mem.layout().width;
    assert!(
        next.nodes[..width].contains(&6) && next.nodes[..width].contains(&7),
        "{next:?}"
    );
    assert_eq!(
        mem.group_of(0).unwrap().nodes,
        before.nodes,
        "mapped ranges stay"
    );
    model
        .write(&mem, 2 * per_range * PAGE, pages - 2 * per_range, true)
        .unwrap();
    model.read_all(&mem, pages);

    // No room for a third.
    match mem.join_member(102, addr(3), None) {
        Err(ClientError::Transport(TransportError::Full { capacity: 8, .. })) => {}
        other => panic!("expected a full node table, got {other:?}"),
    }
}
