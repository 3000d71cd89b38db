//! The TCP transport's failure detector (CubicRing's recipe, see [`super`]): a monitor thread
//! PINGs every member that is up each `heartbeat`; one that does not answer within
//! `heartbeat_timeout`, or that the membership says left ([`super::TcpTransport`]'s
//! `suspect`), is verified over a fresh connection before it is declared failed; members that
//! are down are retried every `reconnect_interval`.
//!
//! Invariant: a node is marked down only by a failed verification or a broken connection,
//! never by one slow heartbeat or by the membership alone.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Shared, Wake};
use crate::rpc::Greeting;
use crate::wire::Op;

/// The failure detector: heartbeats to nodes that are up, verification of suspects, and
/// reconnection of nodes that are down (see the module doc).
pub(super) fn monitor_loop(sh: Arc<Shared>) {
    let o = sh.options;
    let mut last_reconnect = Instant::now();
    loop {
        {
            let (m, cv) = &sh.monitor_wake;
            let mut wake = m.lock();
            if *wake == Wake::Sleep {
                cv.wait_for(&mut wake, o.heartbeat);
            }
            if *wake == Wake::Stop {
                return;
            }
            *wake = Wake::Sleep;
        }
        let reconnect_now = last_reconnect.elapsed() >= o.reconnect_interval;
        if reconnect_now {
            last_reconnect = Instant::now();
        }
        for node in 0..sh.members() as u16 {
            if sh.stop.load(Ordering::SeqCst) {
                return;
            }
            let Some(c) = sh.slot(node) else { continue };
            if c.up.load(Ordering::Acquire) {
                // The membership said it left (its lease expired): verify at once, without
                // waiting for a heartbeat to go unanswered.
                let left = c.left.swap(false, Ordering::AcqRel);
                if !left && sh.ping(node, o.heartbeat_timeout) {
                    continue;
                }
                if sh.stop.load(Ordering::SeqCst) {
                    return;
                }
                if !c.up.load(Ordering::Acquire) {
                    continue; // lost meanwhile, already handled
                }
                metrics::counter!("hydramem_client_suspicions_total").increment(1);
                match verify(c.addr, c.id, &sh.greeting, o.verify_timeout) {
                    Ok(()) => {
                        tracing::info!(node, addr = %c.addr, left, "suspected node answered a fresh connection: slow, not failed");
                    }
                    Err(e) => {
                        tracing::warn!(node, addr = %c.addr, error = %e, left, "memory node failed verification: declaring it failed");
                        metrics::counter!("hydramem_client_failures_detected_total").increment(1);
                        sh.mark_down(node);
                    }
                }
            } else if reconnect_now {
                sh.reconnect(node);
            }
        }
    }
}

/// Verifies a suspect over a fresh connection: connect, HELLO as an observer, PING.
fn verify(addr: SocketAddr, id: u32, greeting: &Greeting, timeout: Duration) -> io::Result<()> {
    // An observer with the client's key and TLS; the node must be node `id`. The PING's
    // reply is checked to answer this very PING (op and id), which proves the node alive.
    let observer = crate::rpc::Greeting::observer(greeting.key.as_ref())
        .with_tls(greeting.tls.as_ref())
        .to_node(id);
    crate::rpc::Connection::open(addr, Some(&observer), timeout, timeout)
        .and_then(|mut c| c.request(Op::Ping, &[]))
        .map(drop)
        .map_err(io::Error::other)
}
