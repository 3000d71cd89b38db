//! One client's session with the node: what each request means, independent of sockets.
//!
//! A [`Session`] holds what a connection has said about itself (the identity given in HELLO,
//! whether it is an observer or an operator, and — on a node with a cluster key — whether it
//! proved the key with AUTH, see [`crate::auth`]) and turns one parsed request frame into its
//! reply, appended to an output buffer. The server ([`super::server`]) owns the socket and calls
//! [`Session::handle`] for every frame it reads; the fuzz target drives the same function with
//! arbitrary frames on an in-memory node.
//!
//! Invariants: every request that parses gets exactly one reply frame, whatever its content; a
//! request that does not parse is an error that ends the connection, and changes nothing; no
//! input panics (slot arithmetic is checked in [`super::slab`], REGEN is validated before it
//! allocates or connects, see [`super::regen`]); a session that counted itself as a connected
//! client uncounts itself when dropped, on every path out of a connection, unwinding included;
//! on a node with a key, nothing but HELLO and AUTH is served before AUTH succeeded, and a
//! failed AUTH ends the connection.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::tenants::Refusal;
use super::{Faults, Landing, Node, RunView};
use crate::auth::{self, Transcript, AUTH_HMAC, AUTH_NONE};
use crate::wire::{
    self, ClientId, Fault, FrameBuilder, Header, HelloReply, ReadReply, Request, Status, WireError,
    WriteReply, HELLO_KEPT, HELLO_OBSERVER, HELLO_OPERATOR, MAX_BODY,
};

/// Connections refused because their identity held its connections already, and because
/// another process held it (their log lines are sampled).
static OVER_CONNECTIONS: crate::sampled::Sampled = crate::sampled::Sampled::new(100);
static IN_USE: crate::sampled::Sampled = crate::sampled::Sampled::new(100);

/// What the connection must do after a request, besides sending the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// Nothing more.
    Reply,
    /// Injected fault: drop every other connection of the node.
    DropOtherConnections,
    /// Close this connection once the reply is sent (a failed AUTH).
    Close,
}

/// The state of one connection's conversation with the node.
pub struct Session {
    node: Arc<Node>,
    /// The identity, once HELLO (and, with a key, AUTH) set it.
    client: Option<ClientId>,
    observer: bool,
    operator: bool,
    counted: bool,
    /// The instance said in HELLO (the process speaking for the identity).
    instance: u64,
    /// With a key: the HELLO whose AUTH is awaited, as both proofs cover it.
    pending: Option<(Transcript, wire::Hello)>,
}

impl Drop for Session {
    fn drop(&mut self) {
        if let (true, Some(c)) = (self.counted, self.client) {
            self.node.client_disconnected(c);
        }
    }
}

impl Session {
    /// A session that has not said HELLO yet.
    pub fn new(node: Arc<Node>) -> Session {
        Session {
            node,
            client: None,
            observer: false,
            operator: false,
            counted: false,
            instance: 0,
            pending: None,
        }
    }

    /// The identity said in HELLO, if any.
    pub fn client(&self) -> Option<ClientId> {
        self.client
    }

    /// Serves one request frame: appends its reply to `out`. An error means the frame is a
    /// protocol violation and the connection must be closed (nothing was changed).
    pub fn handle(
        &mut self,
        h: &Header,
        body: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<After, WireError> {
        self.handle_watching(h, body, out, &|| false)
    }

    /// [`Session::handle`] for a requester that may leave meanwhile: a long request (REGEN)
    /// asks `gone` between its steps and stops early once it says the requester left or the
    /// node stops, so that a dead process's regeneration neither runs on for nothing nor
    /// holds its identity from a successor (see [`super::tenants`]).
    pub fn handle_watching(
        &mut self,
        h: &Header,
        body: &[u8],
        out: &mut Vec<u8>,
        gone: &dyn Fn() -> bool,
    ) -> Result<After, WireError> {
        let req = wire::parse_request(h, body)?;
        let identified = match (self.client, self.observer) {
            (Some(c), false) => Some(c),
            _ => None,
        };
        if let Some(st) = self.refusal(&req, identified.is_some()) {
            reply_status(out, h, st)?;
            return Ok(After::Reply);
        }
        let client = identified.unwrap_or_default();
        let node = self.node.clone();
        match req {
            Request::Hello(hello) => return self.hello(h, hello, out),
            Request::Auth(proof) => return self.auth(h, &proof, out),
            Request::Ping => {
                let fb = ok(out, h);
                // A client's heartbeat learns whether the node wants slabs back.
                if let Some(c) = identified {
                    node.notice_for(&c).put(out);
                }
                fb.finish(out)?
            }
            Request::Reclaims => {
                let fb = ok(out, h);
                wire::put_reclaims(out, &node.reclaims_for(&client));
                fb.finish(out)?;
            }
            Request::Drain(start) => {
                node.drain(start);
                ok(out, h).finish(out)?;
            }
            Request::Corrupt(list) => match list.reports() {
                Ok(reports) => {
                    let accepted = node.report_corrupt(&client, &reports);
                    let fb = ok(out, h);
                    wire::put_corrupt_reply(out, accepted);
                    fb.finish(out)?;
                }
                Err(e) => {
                    // Refused as a whole, connection kept (see `wire::CorruptReport`).
                    tracing::warn!(reason = %e, records = list.len(), "CORRUPT report refused");
                    reply_status(out, h, Status::BadRequest)?;
                }
            },
            Request::Regen(req) => {
                match super::regen::serve(&node, (&client, self.instance), &req, gone) {
                    Ok(pages) => {
                        let fb = ok(out, h);
                        wire::put_regen_reply(out, pages);
                        fb.finish(out)?;
                    }
                    Err(st) => reply_status(out, h, st)?,
                }
            }
            Request::Fault(fault) => {
                let (st, after) = self.fault(fault);
                reply_status(out, h, st)?;
                return Ok(after);
            }
            Request::Stats => {
                let fb = ok(out, h);
                node.stats().put(out);
                fb.finish(out)?;
            }
            Request::Alloc { tag, split_len } => match node.alloc(client, tag, split_len) {
                Ok(slab) => {
                    let fb = ok(out, h);
                    wire::put_alloc_reply(out, slab);
                    fb.finish(out)?;
                }
                Err(st) => reply_status(out, h, st)?,
            },
            Request::Free { slab } => {
                let st = node.free(&client, slab).err().unwrap_or(Status::Ok);
                reply_status(out, h, st)?;
            }
            Request::Discard { slab, first, n } => {
                let st = node
                    .discard(&client, slab, first, n)
                    .err()
                    .unwrap_or(Status::Ok);
                reply_status(out, h, st)?;
            }
            Request::Stamps { slab, first, n } => {
                match node
                    .slab(&client, slab)
                    .and_then(|s| s.stamps(first, n.into()))
                {
                    Ok(stamps) => {
                        let fb = ok(out, h);
                        wire::put_stamps_reply(out, stamps.into_iter());
                        fb.finish(out)?;
                    }
                    Err(st) => reply_status(out, h, st)?,
                }
            }
            Request::List => {
                let fb = ok(out, h);
                wire::put_list(out, &node.list(&client));
                fb.finish(out)?;
            }
            Request::WriteV(runs) => write_v(&node, &client, h, &runs, out)?,
            Request::ReadV(runs) => read_v(&node, &client, h, &runs, out)?,
        }
        Ok(After::Reply)
    }

    /// Why `req` is refused on this connection now, if it is: an open request (PING, STATS,
    /// and DRAIN and FAULT, which are an operator's) needs nothing on a node without a key,
    /// and the key's proof (and for the operator's, the operator flag) on a node with one;
    /// every other request but HELLO and AUTH needs an identified, non-observer connection.
    fn refusal(&self, req: &Request, identified: bool) -> Option<Status> {
        let keyed = self.node.credential().is_some();
        let proven = self.client.is_some();
        match req {
            Request::Hello(_) | Request::Auth(_) => None,
            Request::Ping | Request::Stats | Request::Drain(_) | Request::Fault(_)
                if keyed && !proven =>
            {
                Some(Status::NotIdentified)
            }
            Request::Drain(_) | Request::Fault(_) if keyed && !self.operator => {
                Some(Status::Unauthenticated)
            }
            Request::Ping | Request::Stats | Request::Drain(_) | Request::Fault(_) => None,
            _ if identified => None,
            _ => Some(Status::NotIdentified),
        }
    }

    fn hello(
        &mut self,
        h: &Header,
        hello: wire::Hello,
        out: &mut Vec<u8>,
    ) -> Result<After, WireError> {
        let node = self.node.clone();
        let mut reply = HelloReply {
            node_id: node.config().id,
            slab_size: node.config().slab_size,
            capacity: node.config().capacity,
            max_body: MAX_BODY as u32,
            incarnation: node.incarnation(),
            auth: AUTH_NONE,
            nonce: [0; auth::NONCE_LEN],
            proof: [0; auth::PROOF_LEN],
        };
        if let Some(cred) = node.credential() {
            // The identity is set by AUTH, once the client proved the key for this HELLO.
            if self.client.is_some() {
                return Err(WireError::Invalid(
                    "HELLO again after AUTH on one connection",
                ));
            }
            let t = Transcript {
                node_id: node.config().id,
                owner: hello.client,
                flags: hello.flags,
                client_nonce: hello.nonce,
                node_nonce: auth::nonce(),
                instance: hello.instance,
            };
            reply.auth = AUTH_HMAC;
            reply.nonce = t.node_nonce;
            reply.proof = auth::node_proof(cred, &t);
            self.pending = Some((t, hello));
        } else {
            if self.client.is_some()
                && (self.client != Some(hello.client) || self.instance != hello.instance)
            {
                return Err(WireError::Invalid(
                    "HELLO with a different identity or instance on one connection",
                ));
            }
            if let Err(st) = self.identify(hello) {
                reply_status(out, h, st)?;
                return Ok(After::Close);
            }
        }
        let fb = ok(out, h);
        reply.put(out);
        fb.finish(out)?;
        Ok(After::Reply)
    }

    /// AUTH: the client's proof for the pending HELLO. Right: the connection is identified.
    /// Wrong, or without a pending HELLO: UNAUTHENTICATED, and the connection is closed.
    fn auth(
        &mut self,
        h: &Header,
        proof: &[u8; auth::PROOF_LEN],
        out: &mut Vec<u8>,
    ) -> Result<After, WireError> {
        let node = self.node.clone();
        let verified = match (node.credential(), self.pending.take()) {
            (Some(cred), Some((t, hello))) if auth::client_proof_ok(cred, &t, proof) => Some(hello),
            _ => None,
        };
        match verified.map(|hello| self.identify(hello)) {
            Some(Ok(())) => {
                reply_status(out, h, Status::Ok)?;
                Ok(After::Reply)
            }
            Some(Err(st)) => {
                reply_status(out, h, st)?;
                Ok(After::Close)
            }
            None => {
                metrics::counter!("hydramem_node_auth_refused_total").increment(1);
                tracing::warn!(
                    "AUTH refused: the peer does not hold this cluster's key (or sent AUTH \
                     without HELLO, or to a node without a key); closing its connection"
                );
                reply_status(out, h, Status::Unauthenticated)?;
                Ok(After::Close)
            }
        }
    }

    /// The connection is `hello`'s identity from now on — unless the identity holds as many
    /// connections as it may on this node, or another process holds it: then the status to
    /// refuse it with (the connection stays unidentified, and is closed).
    fn identify(&mut self, hello: wire::Hello) -> Result<(), Status> {
        let observer = hello.flags & HELLO_OBSERVER != 0;
        if !observer && !self.counted {
            let kept = hello.flags & HELLO_KEPT != 0;
            match self
                .node
                .client_connected(hello.client, kept, hello.instance)
            {
                Ok(()) => self.counted = true,
                Err(Refusal::TooManyConnections) => {
                    metrics::counter!("hydramem_node_identity_connections_refused_total")
                        .increment(1);
                    if let Some(refused_so_far) = OVER_CONNECTIONS.hit() {
                        tracing::warn!(
                            client = ?hello.client,
                            max = self.node.tenants.config().max_connections,
                            refused_so_far,
                            "refusing a connection: its identity holds \
                             --max-connections-per-identity already; closing it"
                        );
                    }
                    return Err(Status::OverQuota);
                }
                Err(Refusal::InUse { connections }) => {
                    metrics::counter!("hydramem_node_identity_in_use_refused_total").increment(1);
                    // A refused process asks again for a few seconds: sampled, as floods are.
                    if let Some(refused_so_far) = IN_USE.hit() {
                        tracing::warn!(
                            client = ?hello.client,
                            connections,
                            refused_so_far,
                            "refusing a connection: another process holds its identity here \
                             (its connections are open); closing it"
                        );
                    }
                    return Err(Status::IdentityInUse);
                }
            }
        }
        self.observer = observer;
        self.operator = hello.flags & HELLO_OPERATOR != 0;
        self.client = Some(hello.client);
        self.instance = hello.instance;
        tracing::debug!(client = ?hello.client, observer = self.observer, "hello");
        Ok(())
    }

    /// Applies a FAULT request; `Forbidden` unless the node allows fault injection.
    fn fault(&self, fault: Fault) -> (Status, After) {
        let node = &self.node;
        if !node.config().allow_faults {
            tracing::warn!(
                ?fault,
                "fault injection refused: node not started with --allow-fault-injection"
            );
            return (Status::Forbidden, After::Reply);
        }
        tracing::warn!(?fault, "injecting fault");
        let f = &node.faults;
        match fault {
            Fault::Clear => {
                f.delay_us.store(0, Ordering::Relaxed);
                f.refuse_alloc.store(false, Ordering::Relaxed);
                node.simulated.total.store(0, Ordering::Relaxed);
                node.simulated.available.store(u64::MAX, Ordering::Relaxed);
                f.clear_corruption();
                *f.stopped.lock() = false;
                f.resumed.notify_all();
            }
            Fault::DelayReplies(us) => f.delay_us.store(us, Ordering::Relaxed),
            Fault::StopAnswering => *f.stopped.lock() = true,
            Fault::RefuseAlloc => f.refuse_alloc.store(true, Ordering::Relaxed),
            Fault::DropConnections => return (Status::Ok, After::DropOtherConnections),
            // Dies on the spot, without replying or cleaning up; exit rather than abort so
            // that test machines do not collect core dumps.
            Fault::Crash => std::process::exit(134),
            Fault::MemoryTotal(b) => node.simulated.total.store(b, Ordering::Relaxed),
            Fault::MemoryAvailable(b) => node.simulated.available.store(b, Ordering::Relaxed),
            Fault::CorruptSlab(slab) => match node.corrupt_slab(slab) {
                Ok(splits) => tracing::warn!(slab, splits, "corrupted stored splits"),
                Err(st) => return (st, After::Reply),
            },
            Fault::CorruptWrites(c) => f.corrupt_writes.store(c.encode(), Ordering::Relaxed),
            Fault::CorruptReplies(c) => f.corrupt_replies.store(c.encode(), Ordering::Relaxed),
            Fault::MisdirectReads(c) => f.misdirect_reads.store(c.encode(), Ordering::Relaxed),
        }
        (Status::Ok, After::Reply)
    }
}

fn ok(out: &mut Vec<u8>, h: &Header) -> FrameBuilder {
    FrameBuilder::begin(out, h.op, true, Status::Ok, h.id)
}

fn reply_status(out: &mut Vec<u8>, h: &Header, st: Status) -> Result<(), WireError> {
    FrameBuilder::begin(out, h.op, true, st, h.id).finish(out)
}

/// WRITEV: stores every run through the slab's version check (one lock, and one copy when
/// every split of the run is newer than what is stored); each split's reply entry carries the
/// version stored afterwards (the newer one that refused a `Stale` split).
fn write_v(
    node: &Node,
    client: &ClientId,
    h: &Header,
    runs: &wire::WriteRuns<'_>,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    let mut reply = WriteReply::begin(out, h);
    for run in runs.iter() {
        let r = run.run;
        let mut landing = WriteLanding {
            run: &run,
            reply: &mut reply,
            out,
            faults: &node.faults,
        };
        let stored = node
            .slab(client, r.slab)
            .and_then(|s| s.store_run(r.offset, r.split_len.into(), r.n as usize, &mut landing));
        if let Err(st) = stored {
            for i in 0..r.n as usize {
                reply.put(out, run.split(i).cookie, st, 0);
            }
        }
    }
    metrics::counter!("hydramem_node_write_entries_total").increment(runs.splits() as u64);
    metrics::counter!("hydramem_node_write_runs_total").increment(runs.len() as u64);
    metrics::counter!("hydramem_node_bytes_written_total").increment(runs.data_len() as u64);
    reply.finish(out)
}

/// A WRITEV run landing in its slab: data copied from the request, outcomes appended to the
/// reply in slot order.
struct WriteLanding<'r, 'a> {
    run: &'r wire::WriteRun<'a>,
    reply: &'r mut WriteReply,
    out: &'r mut Vec<u8>,
    faults: &'r Faults,
}

impl Landing for WriteLanding<'_, '_> {
    fn version(&self, i: usize) -> u64 {
        self.run.split(i).version
    }
    fn fill(&mut self, span: std::ops::Range<usize>, dst: &mut [u8]) -> Result<(), Status> {
        let len = self.run.run.split_len as usize;
        dst.copy_from_slice(&self.run.data()[span.start * len..span.end * len]);
        Ok(())
    }
    fn crc(&mut self, i: usize, _: &[u8]) -> u32 {
        self.run.split(i).crc
    }
    fn tag(&self, i: usize) -> u64 {
        self.run.split(i).tag
    }
    fn landed(&mut self, _: usize, bytes: &mut [u8]) {
        // Injected corruption of the stored copy (one relaxed load while off).
        if Faults::hits(&self.faults.corrupt_writes, self.run.run.slab) {
            super::flip_random_bit(bytes);
        }
    }
    fn outcome(&mut self, i: usize, status: Status, stored: u64) {
        self.reply
            .put(self.out, self.run.split(i).cookie, status, stored);
    }
}

/// READV: every run's splits with their versions, checksums and tags, each run copied once from
/// its slab into the reply frame (a run that would not fit the frame is refused).
fn read_v(
    node: &Node,
    client: &ClientId,
    h: &Header,
    runs: &wire::ReadRuns<'_>,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    let mut reply = ReadReply::begin(out, h);
    let mut bytes = 0u64;
    for run in runs.iter() {
        let r = run.run;
        if !reply.fits(out, &r) {
            reply.refuse(out, &run, Status::BadRequest);
            continue;
        }
        let served = node.slab(client, r.slab).and_then(|s| {
            s.read_run(r.offset, r.split_len.into(), r.n as usize, |v| {
                let served = reply.serve(out, &run, |i| v.stamp(i), v.data());
                inject_read_faults(node, r.slab, &v, &served, r.n as usize, out);
            })
        });
        match served {
            Ok(()) => bytes += r.data_len() as u64,
            Err(st) => reply.refuse(out, &run, st),
        }
    }
    metrics::counter!("hydramem_node_read_entries_total").increment(runs.splits() as u64);
    metrics::counter!("hydramem_node_read_runs_total").increment(runs.len() as u64);
    metrics::counter!("hydramem_node_bytes_read_total").increment(bytes);
    reply.finish(out)
}

/// Injected read faults, split by split: the neighbouring slot's bytes and checksum under the
/// split's own version (a misdirected read), or one bit flipped on the wire. One relaxed load
/// each while off.
fn inject_read_faults(
    node: &Node,
    slab: u32,
    v: &RunView<'_>,
    served: &wire::ServedRun,
    n: usize,
    out: &mut [u8],
) {
    let f = &node.faults;
    let misdirect = f.misdirect_reads.load(Ordering::Relaxed) != 0;
    let corrupt = f.corrupt_replies.load(Ordering::Relaxed) != 0;
    if !misdirect && !corrupt {
        return;
    }
    for i in 0..n {
        if misdirect && Faults::hits(&f.misdirect_reads, slab) {
            let (data, crc) = v.neighbour(i);
            served.data_mut(out, i).copy_from_slice(data);
            served.set_crc(out, i, crc);
        }
        if corrupt && Faults::hits(&f.corrupt_replies, slab) {
            super::flip_random_bit(served.data_mut(out, i));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::HEADER_LEN;

    fn node() -> Arc<Node> {
        crate::node::test_node(4)
    }

    /// HELLO on `s` as `client` and `instance`: the reply's status and what the connection
    /// must do, or the protocol violation.
    fn hello(
        s: &mut Session,
        client: ClientId,
        instance: u64,
    ) -> Result<(Status, After), WireError> {
        let mut frame = Vec::new();
        let fb = FrameBuilder::begin(&mut frame, wire::Op::Hello, false, Status::Ok, 1);
        wire::Hello {
            client,
            flags: HELLO_KEPT,
            nonce: [0; auth::NONCE_LEN],
            instance,
        }
        .put(&mut frame);
        fb.finish(&mut frame).unwrap();
        let h = Header::parse(frame[..HEADER_LEN].try_into().unwrap()).unwrap();
        let mut out = Vec::new();
        let after = s.handle(&h, &frame[HEADER_LEN..], &mut out)?;
        let rh = Header::parse(out[..HEADER_LEN].try_into().unwrap()).unwrap();
        Ok((rh.status, after))
    }

    #[test]
    fn an_identity_is_refused_to_a_second_process_while_the_first_holds_it() {
        let n = node();
        let id = ClientId([3; 16]);
        let mut first = Session::new(n.clone());
        assert_eq!(hello(&mut first, id, 7), Ok((Status::Ok, After::Reply)));
        let mut again = Session::new(n.clone());
        assert_eq!(
            hello(&mut again, id, 7),
            Ok((Status::Ok, After::Reply)),
            "its own reconnection"
        );
        let mut second = Session::new(n.clone());
        assert_eq!(
            hello(&mut second, id, 8),
            Ok((Status::IdentityInUse, After::Close))
        );
        assert_eq!(
            second.client(),
            None,
            "the refused connection stays unidentified"
        );
        // A connection cannot change its instance once identified.
        assert!(hello(&mut first, id, 8).is_err());
        drop((first, again));
        let mut second = Session::new(n);
        assert_eq!(
            hello(&mut second, id, 8),
            Ok((Status::Ok, After::Reply)),
            "the holder is gone"
        );
    }
}
