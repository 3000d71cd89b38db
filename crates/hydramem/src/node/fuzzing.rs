//! Entry point of the stateful fuzz target for the node's request handler (feature `fuzzing`).
//!
//! [`requests`] turns arbitrary bytes into a sequence of requests — HELLO, ALLOC, WRITEV,
//! READV, FREE, LIST, REGEN, PING, STATS, DRAIN, CORRUPT, RECLAIMS, DISCARD, STAMPS and raw frames — from two
//! identities, on sessions of one in-memory node, exactly as the server would hand them to
//! [`Session::handle`]. WRITEV and READV carry one to four runs of one to four splits each.
//! Invariants it asserts against a model of what was acknowledged: every request that parses
//! gets exactly one well-formed reply with its op and id; a split reads back exactly as the
//! newest acknowledged write of it left it, with that version and tag, whatever run it was
//! written or read in, and STAMPS reports that version and tag; a stale write reports the
//! stored version; a discarded split reads as never written; one identity never reaches another's slabs; and nothing panics (the fuzzer sees a
//! panic as a crash). Inputs of odd length run a node with a cluster key, with AUTH requests
//! (right and wrong proofs) among the rest: no request but HELLO and AUTH is served before
//! the right proof, and a wrong one ends the connection.

use std::collections::HashMap;

use super::session::{After, Session};
use super::{Node, NodeConfig};
use crate::auth::ClusterKey;
use crate::wire::{
    self, ClientId, FrameBuilder, Header, Hello, HelloReply, Op, OpenRuns, ReplyRuns, Run, Status,
    HEADER_LEN,
};

/// The model: (identity, slab, offset) → (version, bytes, tag) of the newest acknowledged
/// write.
type Model = HashMap<(u8, u32, u64), (u64, Vec<u8>, u64)>;

/// A cursor over the fuzz input; reads past the end give zeros.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        let (b, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        b
    }
    fn u64(&mut self) -> u64 {
        (0..8).fold(0, |v, i| v | u64::from(self.u8()) << (8 * i))
    }
    /// Mostly `unit` times a small number (an aligned slot, a small version), sometimes any.
    fn small_or_any(&mut self, unit: u64) -> u64 {
        if self.u8() < 200 {
            u64::from(self.u8()) * unit
        } else {
            self.u64()
        }
    }
    /// A split offset: mostly a slot near the start of a slab of `len`-byte splits.
    fn aimed(&mut self, len: u64) -> u64 {
        self.small_or_any(len)
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
}

/// Feeds `input` to sessions of one node (see the module doc). An input of odd length runs
/// a node with a cluster key: a session is identified only by AUTH with the right proof for
/// its last HELLO, and until then every other request must be refused as not identified.
pub fn requests(input: &[u8]) {
    let key = (input.len() % 2 == 1).then(|| ClusterKey::from_bytes([7; 32]));
    let node = Node::new(NodeConfig {
        id: 1,
        capacity: 8 << 16,
        slab_size: 1 << 16,
        allow_faults: false,
        membership: None,
        key: key.clone(),
        tls: None,
        tenancy: Default::default(),
    })
    .expect("valid node");
    let ids = [ClientId([1; 16]), ClientId([2; 16])];
    let mut sessions: [Session; 2] = [Session::new(node.clone()), Session::new(node.clone())];
    // With a key: whether each session proved it, and the HELLO (and reply) AUTH answers.
    let mut proven = [false; 2];
    let mut pending: [Option<(Hello, HelloReply)>; 2] = [None, None];
    let mut slabs: Vec<(u8, u32, u64)> = Vec::new(); // (identity, slab, split_len)
    let mut model = Model::new();
    let mut b = Bytes(input);
    let mut id = 0u64;
    while !b.0.is_empty() {
        let who = b.u8() % 2;
        id += 1;
        let pick = b.u8();
        let (op, body) = match &key {
            Some(k) if pick >= 240 => auth_request(&mut b, k, pending[who as usize].as_ref()),
            _ => request(&mut b, pick, who, &ids, &slabs),
        };
        let mut frame = Vec::new();
        let fb = FrameBuilder::begin(&mut frame, op, false, Status::Ok, id);
        frame.extend_from_slice(&body);
        if fb.finish(&mut frame).is_err() {
            continue;
        }
        let h = Header::parse(frame[..HEADER_LEN].try_into().expect("20")).expect("built");
        let mut out = Vec::new();
        let s = &mut sessions[who as usize];
        let after = match s.handle(&h, &frame[HEADER_LEN..], &mut out) {
            Ok(after) => after,
            Err(_) => {
                // A protocol violation closes the connection: a new one starts afresh.
                sessions[who as usize] = Session::new(node.clone());
                (proven[who as usize], pending[who as usize]) = (false, None);
                assert!(out.is_empty(), "a refused frame got a reply");
                continue;
            }
        };
        let rh = Header::parse(out[..HEADER_LEN].try_into().expect("a reply")).expect("parses");
        assert!(
            rh.reply && rh.op == op && rh.id == id,
            "reply {rh:?} to {op:?} #{id}"
        );
        assert_eq!(
            out.len(),
            HEADER_LEN + rh.body_len as usize,
            "one reply frame"
        );
        let w = who as usize;
        if after == After::Close {
            // A refused AUTH: the connection ends.
            assert_eq!((op, rh.status), (Op::Auth, Status::Unauthenticated));
            sessions[w] = Session::new(node.clone());
            (proven[w], pending[w]) = (false, None);
            continue;
        }
        if key.is_some() {
            match op {
                Op::Hello => {
                    let hello = Hello::parse(&body).expect("an accepted HELLO parses");
                    let reply = HelloReply::parse(&out[HEADER_LEN..]).expect("a HELLO reply");
                    pending[w] = Some((hello, reply));
                }
                Op::Auth => {
                    assert!(!proven[w] && pending[w].is_some(), "AUTH accepted unasked");
                    proven[w] = true;
                }
                _ if !proven[w] => {
                    assert_eq!(rh.status, Status::NotIdentified, "{op:?} before AUTH");
                    continue;
                }
                _ => {}
            }
        }
        check(
            &mut model,
            &mut slabs,
            who,
            (&h, &frame[HEADER_LEN..]),
            &rh,
            &out[HEADER_LEN..],
        );
    }
}

/// An AUTH: mostly with the right proof for the session's pending HELLO (when it has one),
/// sometimes with a wrong one.
fn auth_request(
    b: &mut Bytes<'_>,
    key: &ClusterKey,
    pending: Option<&(Hello, HelloReply)>,
) -> (Op, Vec<u8>) {
    let right = pending
        .filter(|_| b.u8() < 200)
        .and_then(|(hello, reply)| crate::auth::respond(Some(key), hello, reply).ok().flatten());
    let proof = right.unwrap_or([b.u8(); crate::auth::PROOF_LEN]);
    let mut body = Vec::new();
    wire::put_auth(&mut body, &proof);
    (Op::Auth, body)
}

/// Builds one request of identity `who`: mostly well-formed, aimed at its slabs (or the
/// other's), sometimes raw.
fn request(
    b: &mut Bytes<'_>,
    pick: u8,
    who: u8,
    ids: &[ClientId; 2],
    slabs: &[(u8, u32, u64)],
) -> (Op, Vec<u8>) {
    let mut body = Vec::new();
    let slab_of = |b: &mut Bytes<'_>| {
        let i = b.u8() as usize;
        slabs
            .get(i % slabs.len().max(1))
            .copied()
            .unwrap_or((who, b.u8().into(), 512))
    };
    let op = match pick % 14 {
        0 => {
            Hello {
                client: ids[who as usize],
                flags: u32::from(b.u8() == 0xFF),
                nonce: [b.u8(); crate::auth::NONCE_LEN],
                // Each identity's own process, and now and then another one (a HELLO again
                // with another instance ends the connection).
                instance: if b.u8() == 0xFF {
                    b.u64()
                } else {
                    u64::from(who) + 1
                },
            }
            .put(&mut body);
            Op::Hello
        }
        1 => {
            let tag = b.u64();
            let len: u32 = match b.u8() % 4 {
                0 => 1,
                1 => 512,
                2 => 4096,
                _ => b.u64() as u32,
            };
            wire::put_alloc(&mut body, tag, len);
            Op::Alloc
        }
        2 | 3 => {
            let mut f = OpenRuns::begin(&mut body, Op::WriteV, 0).expect("WRITEV");
            for _ in 0..1 + b.u8() % 4 {
                let slab = slab_of(b);
                let run = run_of(b, &slab);
                let Ok(mut w) = f.write_run(&mut body, run) else {
                    continue;
                };
                for i in 0..run.n {
                    let version = b.small_or_any(1);
                    let fill = b.u8();
                    let data = vec![fill; run.split_len as usize];
                    let cookie = run.split_offset(i as usize) ^ u64::from(run.slab);
                    let fields = wire::SplitFields {
                        cookie,
                        version,
                        crc: u32::from(fill),
                        tag: u64::from(fill),
                    };
                    let _ = w.split(fields, &data);
                }
                let _ = w.finish();
            }
            body.drain(..HEADER_LEN);
            Op::WriteV
        }
        4 | 5 => {
            let mut f = OpenRuns::begin(&mut body, Op::ReadV, 0).expect("READV");
            for _ in 0..1 + b.u8() % 4 {
                let slab = slab_of(b);
                let run = run_of(b, &slab);
                let cookies =
                    (0..run.n as usize).map(|i| run.split_offset(i) ^ u64::from(run.slab));
                let _ = f.read_run(&mut body, run, &mut cookies.into_iter());
            }
            body.drain(..HEADER_LEN);
            Op::ReadV
        }
        6 => {
            wire::put_free(&mut body, slab_of(b).1);
            Op::Free
        }
        7 => Op::List,
        8 => {
            body.extend_from_slice(ids[who as usize].0.as_slice());
            body.extend_from_slice(b.take(64));
            Op::Regen
        }
        9 => [Op::Ping, Op::Stats, Op::Reclaims][b.u8() as usize % 3],
        10 => {
            body.extend_from_slice(b.take(16));
            [Op::Drain, Op::Corrupt][b.u8() as usize % 2]
        }
        11 => {
            let (_, slab, _) = slab_of(b);
            wire::put_discard(&mut body, slab, b.small_or_any(1), b.small_or_any(1));
            Op::Discard
        }
        12 => {
            let (_, slab, _) = slab_of(b);
            let n = u32::try_from(b.small_or_any(1)).unwrap_or(u32::MAX);
            wire::put_stamps(&mut body, slab, b.small_or_any(1), n);
            Op::Stamps
        }
        _ => {
            let op = Op::ALL[b.u8() as usize % Op::ALL.len()];
            let n = b.u8() as usize;
            body.extend_from_slice(b.take(n));
            op
        }
    };
    (op, body)
}

/// A run of one to four splits of a slab, mostly aimed near its start.
fn run_of(b: &mut Bytes<'_>, &(_, slab, len): &(u8, u32, u64)) -> Run {
    Run {
        slab,
        split_len: len as u32,
        offset: b.aimed(len),
        n: u32::from(1 + b.u8() % 4),
    }
}

/// The split length of `who`'s slab `slab`, which an OK reply to `op` says exists.
fn split_len(slabs: &[(u8, u32, u64)], who: u8, slab: u32, op: &str) -> u64 {
    slabs
        .iter()
        .find(|s| s.0 == who && s.1 == slab)
        .map(|s| s.2)
        .unwrap_or_else(|| panic!("{op} succeeded on a slab that is not the caller's"))
}

/// Checks a reply against the model and updates it.
fn check(
    model: &mut Model,
    slabs: &mut Vec<(u8, u32, u64)>,
    who: u8,
    (req_h, req): (&Header, &[u8]),
    h: &Header,
    reply: &[u8],
) {
    match h.op {
        Op::Alloc if h.status == Status::Ok => {
            let slab = wire::parse_alloc_reply(reply).expect("an OK ALLOC reply names the slab");
            let Ok(wire::Request::Alloc { split_len, .. }) = wire::parse_request(req_h, req) else {
                panic!("the node allocated for an ALLOC it should have refused");
            };
            slabs.push((who, slab, u64::from(split_len)));
        }
        Op::Free if h.status == Status::Ok => {
            let Ok(wire::Request::Free { slab }) = wire::parse_request(req_h, req) else {
                panic!("the node freed for a FREE it should have refused");
            };
            slabs.retain(|s| !(s.0 == who && s.1 == slab));
            model.retain(|k, _| !(k.0 == who && k.1 == slab));
        }
        Op::Discard if h.status == Status::Ok => {
            let Ok(wire::Request::Discard { slab, first, n }) = wire::parse_request(req_h, req)
            else {
                panic!("the node discarded for a DISCARD it should have refused");
            };
            let len = split_len(slabs, who, slab, "DISCARD");
            let slots = first..first + n;
            model.retain(|k, _| !(k.0 == who && k.1 == slab && slots.contains(&(k.2 / len))));
        }
        Op::Stamps if h.status == Status::Ok => {
            let Ok(wire::Request::Stamps { slab, first, n }) = wire::parse_request(req_h, req)
            else {
                panic!("the node answered a STAMPS it should have refused");
            };
            let len = split_len(slabs, who, slab, "STAMPS");
            let got = wire::parse_stamps_reply(reply, n).expect("a well-formed STAMPS reply");
            for (slot, (version, tag)) in (first..).zip(got) {
                let want = model
                    .get(&(who, slab, slot * len))
                    .map_or((0, 0), |(v, _, t)| (*v, *t));
                assert_eq!((version, tag), want, "STAMPS of slot {slot}");
            }
        }
        Op::WriteV if h.status == Status::Ok => {
            let Ok(wire::Request::WriteV(runs)) = wire::parse_request(req_h, req) else {
                return;
            };
            let mut got = Vec::new();
            wire::parse_vectored_reply(h, reply, |status, s, _| {
                got.push((s.cookie, status, s.version))
            })
            .expect("a well-formed WRITEV reply");
            assert_eq!(got.len(), runs.splits(), "one reply entry per split");
            let splits = runs
                .iter()
                .flat_map(|r| (0..r.run.n as usize).map(move |i| (r, i)));
            for ((r, i), (cookie, status, version)) in splits.zip(got) {
                let e = r.split(i);
                assert_eq!(cookie, e.cookie);
                let key = (who, r.run.slab, r.run.split_offset(i));
                match status {
                    Status::Ok => {
                        let stored = model.entry(key).or_insert((0, Vec::new(), 0));
                        assert!(e.version >= stored.0, "older version acknowledged");
                        if e.version > stored.0 {
                            *stored = (e.version, r.split_data(i).to_vec(), e.tag);
                        }
                        assert_eq!(version, e.version);
                    }
                    Status::Stale => {
                        let stored = model.get(&key).map_or(0, |s| s.0);
                        assert!(version > e.version && version == stored);
                    }
                    _ => {}
                }
            }
        }
        Op::ReadV if h.status == Status::Ok => {
            let Ok(wire::Request::ReadV(runs)) = wire::parse_request(req_h, req) else {
                return;
            };
            let mut replies = ReplyRuns::new(reply).expect("a READV reply");
            assert_eq!(replies.remaining(), runs.len(), "one reply run per run");
            for r in runs.iter() {
                let got = replies.next_run().expect("well formed").expect("a run");
                assert_eq!(got.n, r.run.n as usize);
                for i in 0..got.n {
                    assert_eq!(got.split(i).cookie, r.cookie(i));
                    if got.status != Status::Ok {
                        continue;
                    }
                    let f = got.split(i);
                    let data = got.split_data(i);
                    match model.get(&(who, r.run.slab, r.run.split_offset(i))) {
                        Some((v, bytes, tag)) => assert_eq!(
                            (f.version, data, f.tag),
                            (*v, &bytes[..], *tag),
                            "read back wrong"
                        ),
                        None => assert!(f.version == 0 && data.iter().all(|b| *b == 0)),
                    }
                }
            }
            assert!(replies.next_run().expect("nothing trailing").is_none());
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sequences_of_requests_keep_the_model() {
        // A few deterministic sequences; the fuzzer explores the rest.
        for seed in 0..200u64 {
            let bytes: Vec<u8> = (0..400)
                .map(|i| (seed.wrapping_mul(0x9E37_79B9).wrapping_add(i * 31) >> 3) as u8)
                .collect();
            super::requests(&bytes);
        }
        super::requests(&[
            0, 0, 0, 0, 1, 1, 0, 2, 0, 1, 2, 0, 0, 0, 5, 9, 0, 4, 1, 0, 0, 0,
        ]);
    }
}
