//! `hydramem::rpc` against real node processes: each request kind the tools and the client
//! make outside the data path, a refusal, and a node that stops answering.

mod common;

use std::time::Duration;

use hydramem::rpc::{self, Connection, Greeting, RpcError};
use hydramem::wire::{self, ClientId, Fault, Op, Status};

use common::SLAB;

const WAIT: Duration = Duration::from_secs(10);

#[test]
fn requests_and_refusals_on_real_nodes() {
    let plain = common::cluster(1, SLAB, 4);
    let faulty = common::cluster_with(1, SLAB, 4, &["--allow-fault-injection"]);
    let node = plain.cluster().nodes[0].clone();
    let observer = Greeting::observer(None);
    let stats = Connection::open(node.addr, Some(&observer), WAIT, WAIT)
        .unwrap()
        .call(Op::Stats, &[], wire::Stats::parse)
        .unwrap();
    assert_eq!((stats.node_id, stats.slab_size), (node.id, SLAB));
    let me = Greeting::client(&ClientId::random(), 0, None);
    let mut c = Connection::open(node.addr, Some(&me), WAIT, WAIT).unwrap();
    assert_eq!(c.node(), node.addr);
    assert!(c.call(Op::List, &[], wire::parse_list).unwrap().is_empty());
    let mut free = Vec::new();
    wire::put_free(&mut free, 12345);
    let e = c.request(Op::Free, &free).unwrap_err();
    assert_eq!(e.refused(), Some(Status::NoSuchSlab), "{e}");
    let e = rpc::inject(node.addr, Fault::Clear, &rpc::Access::open(), WAIT).unwrap_err();
    assert_eq!(e.refused(), Some(Status::Forbidden), "{e}");
    rpc::inject(
        faulty.cluster().nodes[0].addr,
        Fault::Clear,
        &rpc::Access::open(),
        WAIT,
    )
    .unwrap();
}

#[test]
fn a_stopped_node_is_a_timeout() {
    let c = common::cluster(1, SLAB, 4);
    let addr = c.cluster().nodes[0].addr;
    let reply = Duration::from_millis(300);
    let mut conn = Connection::open(addr, None, WAIT, reply).unwrap();
    c.pause(0).unwrap();
    let e = conn.request(Op::Stats, &[]).unwrap_err();
    c.resume(0).unwrap();
    assert!(
        matches!(e, RpcError::Timeout { op: Op::Stats, timeout, node: Some(a) } if timeout == reply && a == addr),
        "{e:?}"
    );
    // The node serves again on a new connection (the old one is out of step).
    let mut again = Connection::open(addr, None, WAIT, WAIT).unwrap();
    again.call(Op::Stats, &[], wire::Stats::parse).unwrap();
}
