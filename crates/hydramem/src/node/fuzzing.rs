//! Entry point of the stateful fuzz target for the node's request handler (feature `fuzzing`).
//!
//! [`requests`] turns arbitrary bytes into a sequence of requests — HELLO, ALLOC, WRITEV,
//! READV, FREE, LIST, REGEN, PING, STATS, DRAIN, CORRUPT, RECLAIMS and raw frames — from two
//! identities, on sessions of one in-memory node, exactly as the server would hand them to
//! [`Session::handle`]. Invariants it asserts against a model of what was acknowledged:
//! every request that parses gets exactly one well-formed reply with its op and id; a split
//! reads back exactly as the newest acknowledged write of it left it, with that version; a
//! stale write reports the stored version; one identity never reaches another's slabs; and
//! nothing panics (the fuzzer sees a panic as a crash).

use std::collections::HashMap;

use super::session::Session;
use super::{Node, NodeConfig};
use crate::wire::{
    self, ClientId, Entry, FrameBuilder, Header, Hello, Op, Reader, ReplyEntry, Status, HEADER_LEN,
};

/// The model: (identity, slab, offset) → (version, bytes) of the newest acknowledged write.
type Model = HashMap<(u8, u32, u64), (u64, Vec<u8>)>;

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

/// Feeds `input` to sessions of one node (see the module doc).
pub fn requests(input: &[u8]) {
    let node = Node::new(NodeConfig {
        id: 1,
        capacity: 8 << 16,
        slab_size: 1 << 16,
        allow_faults: false,
        membership: None,
    })
    .expect("valid node");
    let ids = [ClientId([1; 16]), ClientId([2; 16])];
    let mut sessions: [Session; 2] = [Session::new(node.clone()), Session::new(node.clone())];
    let mut slabs: Vec<(u8, u32, u64)> = Vec::new(); // (identity, slab, split_len)
    let mut model = Model::new();
    let mut b = Bytes(input);
    let mut id = 0u64;
    while !b.0.is_empty() {
        let who = b.u8() % 2;
        id += 1;
        let pick = b.u8();
        let (op, body) = request(&mut b, pick, who, &ids, &slabs);
        let mut frame = Vec::new();
        let fb = FrameBuilder::begin(&mut frame, op, false, Status::Ok, id);
        frame.extend_from_slice(&body);
        if fb.finish(&mut frame).is_err() {
            continue;
        }
        let h = Header::parse(frame[..HEADER_LEN].try_into().expect("20")).expect("built");
        let mut out = Vec::new();
        let s = &mut sessions[who as usize];
        if s.handle(&h, &frame[HEADER_LEN..], &mut out).is_err() {
            // A protocol violation closes the connection: a new one starts afresh.
            sessions[who as usize] = Session::new(node.clone());
            assert!(out.is_empty(), "a refused frame got a reply");
            continue;
        }
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
        check(
            &mut model,
            &mut slabs,
            who,
            &frame[HEADER_LEN..],
            &rh,
            &out[HEADER_LEN..],
        );
    }
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
    let op = match pick % 12 {
        0 => {
            Hello {
                client: ids[who as usize],
                flags: u32::from(b.u8() == 0xFF),
            }
            .put(&mut body);
            Op::Hello
        }
        1 => {
            body.extend_from_slice(&b.u64().to_le_bytes());
            let len: u32 = match b.u8() % 4 {
                0 => 1,
                1 => 512,
                2 => 4096,
                _ => b.u64() as u32,
            };
            body.extend_from_slice(&len.to_le_bytes());
            Op::Alloc
        }
        2 | 3 => {
            let n = 1 + b.u8() % 4;
            body.extend_from_slice(&u32::from(n).to_le_bytes());
            for _ in 0..n {
                let (_, slab, len) = slab_of(b);
                let offset = b.aimed(len);
                let version = b.small_or_any(1);
                let fill = b.u8();
                entry(
                    &mut body,
                    slab,
                    len as u32,
                    offset,
                    version,
                    u32::from(fill),
                );
                body.extend(std::iter::repeat_n(fill, len as usize));
            }
            Op::WriteV
        }
        4 | 5 => {
            let n = 1 + b.u8() % 4;
            body.extend_from_slice(&u32::from(n).to_le_bytes());
            for _ in 0..n {
                let (_, slab, len) = slab_of(b);
                let offset = b.aimed(len);
                entry(&mut body, slab, len as u32, offset, 0, 0);
            }
            Op::ReadV
        }
        6 => {
            body.extend_from_slice(&slab_of(b).1.to_le_bytes());
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
        _ => {
            let op = Op::ALL[b.u8() as usize % Op::ALL.len()];
            let n = b.u8() as usize;
            body.extend_from_slice(b.take(n));
            op
        }
    };
    (op, body)
}

fn entry(out: &mut Vec<u8>, slab: u32, len: u32, offset: u64, version: u64, crc: u32) {
    Entry {
        slab,
        len,
        offset,
        cookie: offset ^ u64::from(slab),
        version,
        crc,
    }
    .put(out);
}

/// Checks a reply against the model and updates it.
fn check(
    model: &mut Model,
    slabs: &mut Vec<(u8, u32, u64)>,
    who: u8,
    req: &[u8],
    h: &Header,
    reply: &[u8],
) {
    match h.op {
        Op::Alloc if h.status == Status::Ok => {
            let slab = u32::from_le_bytes(reply.try_into().expect("ALLOC reply is 4 bytes"));
            let len = u32::from_le_bytes(req[8..12].try_into().expect("len"));
            slabs.push((who, slab, u64::from(len)));
        }
        Op::Free if h.status == Status::Ok => {
            let slab = u32::from_le_bytes(req.try_into().expect("4 bytes"));
            slabs.retain(|s| !(s.0 == who && s.1 == slab));
            model.retain(|k, _| !(k.0 == who && k.1 == slab));
        }
        Op::WriteV if h.status == Status::Ok => {
            let Ok(wire::Request::WriteV(list)) = wire::parse_request(h, req) else {
                return;
            };
            let mut r = Reader::new(reply);
            assert_eq!(r.count().expect("count"), list.len());
            for (e, data) in list.iter() {
                let got = ReplyEntry::get_write(&mut r).expect("entry");
                assert_eq!(got.cookie, e.cookie);
                let key = (who, e.slab, e.offset);
                match got.status {
                    Status::Ok => {
                        let stored = model.entry(key).or_insert((0, Vec::new()));
                        assert!(e.version >= stored.0, "older version acknowledged");
                        if e.version > stored.0 {
                            *stored = (e.version, data.to_vec());
                        }
                        assert_eq!(got.version, e.version);
                    }
                    Status::Stale => {
                        let stored = model.get(&key).map_or(0, |s| s.0);
                        assert!(got.version > e.version && got.version == stored);
                    }
                    _ => {}
                }
            }
        }
        Op::ReadV if h.status == Status::Ok => {
            let Ok(wire::Request::ReadV(list)) = wire::parse_request(h, req) else {
                return;
            };
            let mut r = Reader::new(reply);
            assert_eq!(r.count().expect("count"), list.len());
            for e in list.iter() {
                let got = ReplyEntry::get_read(&mut r).expect("entry");
                let data = r.bytes(got.len as usize).expect("data");
                if got.status != Status::Ok {
                    continue;
                }
                match model.get(&(who, e.slab, e.offset)) {
                    Some((v, bytes)) => {
                        assert_eq!((got.version, data), (*v, &bytes[..]), "read back wrong")
                    }
                    None => assert!(got.version == 0 && data.iter().all(|b| *b == 0)),
                }
            }
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
