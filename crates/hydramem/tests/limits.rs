//! A node's bounds on connections against real node processes: connections beyond
//! --max-connections are closed at once while the clients inside keep working; a peer that
//! never says HELLO is cut off after --handshake-timeout; a trickled frame is cut off after
//! --frame-timeout; legitimate clients are untouched by either; an identity holds at most
//! --max-connections-per-identity connections.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use hydramem::client::{ClientConfig, RemoteMemory};
use hydramem::wire::{ClientId, Op};
use hydramem::PAGE_SIZE;

use common::{Raw, HYDRA, SLAB};

#[test]
fn connections_beyond_the_cap_are_closed_and_the_clients_inside_keep_working() {
    let c = common::cluster_with(10, SLAB, 8, &["--max-connections", "16"]);
    let mem = RemoteMemory::connect(c.cluster(), ClientConfig::new(HYDRA, 64 * PAGE_SIZE as u64))
        .unwrap();
    mem.write_page(0, &[1u8; PAGE_SIZE]).unwrap();
    let addr = c.cluster().nodes[0].addr;
    // The client holds one connection to node 0; fill the rest, then some.
    let mut idle: Vec<TcpStream> = Vec::new();
    let mut refused = 0;
    for _ in 0..40 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut b = [0u8; 1];
        match s.read(&mut b) {
            Ok(0) => refused += 1,
            _ => idle.push(s),
        }
    }
    assert!(
        refused >= 40 - 15,
        "only {refused} of 40 extra connections were refused"
    );
    let mut back = [0u8; PAGE_SIZE];
    mem.read_page(0, &mut back).unwrap();
    assert_eq!(back, [1u8; PAGE_SIZE], "the client inside the cap reads on");
}

#[test]
fn a_silent_peer_and_a_trickling_one_are_cut_off_and_a_client_is_not() {
    let c = common::cluster_with(
        1,
        SLAB,
        8,
        &["--handshake-timeout", "2s", "--frame-timeout", "2s"],
    );
    let addr = c.cluster().nodes[0].addr;
    // A peer that connects and says nothing.
    let mut silent = TcpStream::connect(addr).unwrap();
    // An identified peer that trickles a frame: the header's first bytes, then a byte a second.
    let mut trickler = Raw::connect(addr);
    trickler.hello(ClientId([5; 16]));
    let mut slow = trickler.s.try_clone().unwrap();
    let dribble = std::thread::spawn(move || {
        for b in b"HYDM\x07\x02\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00" {
            if slow.write_all(&[*b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(700));
        }
    });
    // A client that identified itself and then idles past both timeouts keeps its connection.
    let mut patient = Raw::connect(addr);
    patient.hello(ClientId([6; 16]));
    let silent_for = common::closed_after(&mut silent);
    assert!(silent_for < Duration::from_secs(15), "{silent_for:?}");
    let trickled_for = common::closed_after(&mut trickler.s);
    assert!(trickled_for < Duration::from_secs(15), "{trickled_for:?}");
    dribble.join().unwrap();
    let (h, _) = patient.call(Op::Ping, &[]);
    assert_eq!(
        h.status,
        hydramem::wire::Status::Ok,
        "the idle client was cut off"
    );
}

#[test]
fn an_identity_beyond_its_connections_is_refused_and_other_identities_are_not() {
    let c = common::cluster_with(1, SLAB, 8, &["--max-connections-per-identity", "2"]);
    let addr = c.cluster().nodes[0].addr;
    let id = ClientId([7; 16]);
    let mut held = [Raw::connect(addr), Raw::connect(addr)];
    for r in &mut held {
        r.hello(id);
    }
    // A third connection of the same identity: OVER_QUOTA, then closed.
    let mut third = Raw::connect(addr);
    let mut b = Vec::new();
    hydramem::wire::Hello {
        client: id,
        flags: 0,
        nonce: [0; hydramem::auth::NONCE_LEN],
        // The same process as the two held (another would be refused IDENTITY_IN_USE).
        instance: hydramem::rpc::process_instance(),
    }
    .put(&mut b);
    let (h, _) = third.call(Op::Hello, &b);
    assert_eq!(h.status, hydramem::wire::Status::OverQuota);
    assert!(common::closed_after(&mut third.s) < Duration::from_secs(15));
    // Another identity is not affected, and one of the two held goes on working.
    let mut other = Raw::connect(addr);
    other.hello(ClientId([8; 16]));
    let (h, _) = held[0].call(Op::Ping, &[]);
    assert_eq!(h.status, hydramem::wire::Status::Ok);
    // Connections closed free their places for the identity (once the node has seen them
    // close: asked again until it has).
    drop(held);
    let admitted = (0..200).any(|_| {
        let mut again = Raw::connect(addr);
        let (h, _) = again.call(Op::Hello, &b);
        h.status == hydramem::wire::Status::Ok
            || (std::thread::sleep(Duration::from_millis(20)), false).1
    });
    assert!(
        admitted,
        "the identity's closed connections were never given back"
    );
}
