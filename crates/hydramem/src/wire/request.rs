//! What a node parses: every request body, by op, into a [`Request`] borrowed from the
//! receive buffer.
//!
//! Invariants: a request that parses has exactly the bytes its op's table describes; a body
//! that does not is a protocol violation that closes the connection.

use super::*;

/// A complete request as a node sees it after parsing; borrowed from the receive buffer so that
/// write payloads are copied once, from the buffer into the slab.
#[derive(Debug)]
pub enum Request<'a> {
    /// HELLO.
    Hello(Hello),
    /// AUTH: the client's proof.
    Auth([u8; crate::auth::PROOF_LEN]),
    /// PING.
    Ping,
    /// ALLOC with its tag and split length.
    Alloc {
        /// Client-chosen label stored with the slab (returned by LIST).
        tag: u64,
        /// Length of every split the slab will hold.
        split_len: u32,
    },
    /// FREE of a slab.
    Free {
        /// The slab.
        slab: u32,
    },
    /// DISCARD of a stretch of a slab's split slots.
    Discard {
        /// The slab.
        slab: u32,
        /// The first slot.
        first: u64,
        /// Slots.
        n: u64,
    },
    /// STAMPS of a stretch of a slab's split slots.
    Stamps {
        /// The slab.
        slab: u32,
        /// The first slot.
        first: u64,
        /// Slots (1..=[`MAX_STAMPS`]).
        n: u32,
    },
    /// LIST.
    List,
    /// STATS.
    Stats,
    /// WRITEV: runs, each with its splits' data.
    WriteV(WriteRuns<'a>),
    /// READV: runs.
    ReadV(ReadRuns<'a>),
    /// FAULT.
    Fault(Fault),
    /// REGEN.
    Regen(Regen),
    /// RECLAIMS.
    Reclaims,
    /// DRAIN: start (true) or cancel.
    Drain(bool),
    /// CORRUPT: corrupted splits the caller found among this node's replies.
    Corrupt(CorruptList<'a>),
}

/// Parses a request body for the op in `h`. Vectored requests are checked against the bounds
/// of [`super::runs`], and writes to carry exactly the data their runs declare.
pub fn parse_request<'a>(h: &Header, body: &'a [u8]) -> Result<Request<'a>, WireError> {
    if h.reply {
        return Err(WireError::Invalid("a reply frame was sent to a node"));
    }
    if h.status != Status::Ok {
        return Err(WireError::Invalid("request frame carries a status"));
    }
    let mut r = Reader::new(body);
    let req = match h.op {
        Op::Hello => return Ok(Request::Hello(Hello::parse(body)?)),
        Op::Auth => return Ok(Request::Auth(super::parse_auth(body)?)),
        Op::Fault => return Ok(Request::Fault(Fault::parse(body)?)),
        Op::Regen => return Ok(Request::Regen(Regen::parse(body)?)),
        Op::Ping => Request::Ping,
        Op::Alloc => Request::Alloc {
            tag: r.u64()?,
            split_len: r.u32()?,
        },
        Op::Free => Request::Free { slab: r.u32()? },
        Op::Discard => Request::Discard {
            slab: r.u32()?,
            first: r.u64()?,
            n: r.u64()?,
        },
        Op::Stamps => {
            let (slab, first, n) = (r.u32()?, r.u64()?, r.u32()?);
            if n == 0 || n > MAX_STAMPS {
                return Err(WireError::Invalid("STAMPS asks 1 to 65536 slots"));
            }
            Request::Stamps { slab, first, n }
        }
        Op::List => Request::List,
        Op::Stats => Request::Stats,
        Op::Reclaims => Request::Reclaims,
        Op::Drain => Request::Drain(match r.u32()? {
            0 => false,
            1 => true,
            _ => return Err(WireError::Invalid("DRAIN mode must be 0 or 1")),
        }),
        Op::Corrupt => Request::Corrupt(CorruptList::get(&mut r)?),
        Op::ReadV => Request::ReadV(ReadRuns::get(&mut r)?),
        Op::WriteV => Request::WriteV(WriteRuns::get(&mut r)?),
    };
    r.end()?;
    Ok(req)
}

/// The small fixed bodies of the control requests and their replies. Each has one row in its
/// op's table in [`super::frame`]; these are the only writers and readers of those bytes.
///
/// | body | size | field |
/// |------|------|-------|
/// | ALLOC request | 8, 4 | tag, split_len |
/// | ALLOC reply | 4 | slab id |
/// | FREE request | 4 | slab id |
/// | DISCARD request | 4, 8, 8 | slab id, first split slot, slots |
/// | STAMPS request | 4, 8, 4 | slab id, first split slot, slots (1..=[`MAX_STAMPS`]) |
/// | STAMPS reply | 4, n × (8, 8) | n, per slot in order: stored version, tag (0, 0: never written) |
/// | DRAIN request | 4 | 1 = start, 0 = cancel |
/// | REGEN reply | 8 | pages rebuilt |
pub fn put_alloc(out: &mut Vec<u8>, tag: u64, split_len: u32) {
    out.extend_from_slice(&tag.to_le_bytes());
    out.extend_from_slice(&split_len.to_le_bytes());
}

/// Appends an ALLOC reply body: the new slab's id.
pub fn put_alloc_reply(out: &mut Vec<u8>, slab: u32) {
    out.extend_from_slice(&slab.to_le_bytes());
}

/// Parses an ALLOC reply body: the new slab's id.
pub fn parse_alloc_reply(body: &[u8]) -> Result<u32, WireError> {
    let mut r = Reader::new(body);
    let slab = r.u32()?;
    r.end()?;
    Ok(slab)
}

/// Appends a FREE request body: the slab.
pub fn put_free(out: &mut Vec<u8>, slab: u32) {
    out.extend_from_slice(&slab.to_le_bytes());
}

/// Appends a DISCARD request body: slots `first..first + n` of `slab`.
pub fn put_discard(out: &mut Vec<u8>, slab: u32, first: u64, n: u64) {
    out.extend_from_slice(&slab.to_le_bytes());
    out.extend_from_slice(&first.to_le_bytes());
    out.extend_from_slice(&n.to_le_bytes());
}

/// Most slots one STAMPS request may ask: its reply (16 bytes a slot) stays far below
/// [`MAX_BODY`].
pub const MAX_STAMPS: u32 = 65536;

/// Appends a STAMPS request body: slots `first..first + n` of `slab`.
pub fn put_stamps(out: &mut Vec<u8>, slab: u32, first: u64, n: u32) {
    out.extend_from_slice(&slab.to_le_bytes());
    out.extend_from_slice(&first.to_le_bytes());
    out.extend_from_slice(&n.to_le_bytes());
}

/// Appends a STAMPS reply body: each slot's stored version and tag, in slot order.
pub fn put_stamps_reply(out: &mut Vec<u8>, stamps: impl ExactSizeIterator<Item = (u64, u64)>) {
    let n = u32::try_from(stamps.len()).expect("at most MAX_STAMPS slots");
    out.extend_from_slice(&n.to_le_bytes());
    for (version, tag) in stamps {
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&tag.to_le_bytes());
    }
}

/// Parses a STAMPS reply body into (version, tag) per slot; fails unless it holds exactly
/// `n` slots. Nothing is allocated before the body's length is checked against `n`.
pub fn parse_stamps_reply(body: &[u8], n: u32) -> Result<Vec<(u64, u64)>, WireError> {
    let mut r = Reader::new(body);
    let fits = body.len().saturating_sub(4) as u64 == 16 * u64::from(n);
    if r.u32()? != n || !fits {
        return Err(WireError::Invalid(
            "a STAMPS reply of another length than asked",
        ));
    }
    let mut out = Vec::with_capacity(n as usize);
    for _ in 0..n {
        out.push((r.u64()?, r.u64()?));
    }
    r.end()?;
    Ok(out)
}

/// Appends a DRAIN request body: start (`true`) or cancel.
pub fn put_drain(out: &mut Vec<u8>, start: bool) {
    out.extend_from_slice(&u32::from(start).to_le_bytes());
}

/// Appends a REGEN reply body: the pages rebuilt.
pub fn put_regen_reply(out: &mut Vec<u8>, pages: u64) {
    out.extend_from_slice(&pages.to_le_bytes());
}

/// Parses a REGEN reply body: the pages rebuilt.
pub fn parse_regen_reply(body: &[u8]) -> Result<u64, WireError> {
    let mut r = Reader::new(body);
    let pages = r.u64()?;
    r.end()?;
    Ok(pages)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn control_bodies_match_the_byte_table() {
        use crate::wire::{test_frame as frame, test_split as split};
        let parse = |op, put: &dyn Fn(&mut Vec<u8>)| {
            let f = frame(op, 1, put);
            let (h, body) = split(&f);
            format!("{:?}", parse_request(&h, body).unwrap())
        };
        assert_eq!(parse(Op::Free, &|o| put_free(o, 7)), "Free { slab: 7 }");
        assert_eq!(
            parse(Op::Discard, &|o| put_discard(o, 7, 3, 9)),
            "Discard { slab: 7, first: 3, n: 9 }"
        );
        assert_eq!(
            parse(Op::Stamps, &|o| put_stamps(o, 7, 3, 9)),
            "Stamps { slab: 7, first: 3, n: 9 }"
        );
        for n in [0, MAX_STAMPS + 1] {
            let f = frame(Op::Stamps, 1, |o| put_stamps(o, 7, 3, n));
            let (h, body) = split(&f);
            assert_eq!(
                parse_request(&h, body).unwrap_err(),
                WireError::Invalid("STAMPS asks 1 to 65536 slots")
            );
        }
        let mut reply = Vec::new();
        put_stamps_reply(&mut reply, [(5, 6), (0, 0)].into_iter());
        assert_eq!(reply.len(), 4 + 2 * 16);
        assert_eq!((reply[0], reply[4], reply[12]), (2, 5, 6));
        assert_eq!(parse_stamps_reply(&reply, 2).unwrap(), vec![(5, 6), (0, 0)]);
        assert!(parse_stamps_reply(&reply, 3).is_err());
        assert!(parse_stamps_reply(&reply[..30], 2).is_err());
        assert_eq!(parse(Op::Drain, &|o| put_drain(o, true)), "Drain(true)");
        assert_eq!(parse(Op::Drain, &|o| put_drain(o, false)), "Drain(false)");
        assert_eq!(
            parse(Op::Alloc, &|o| put_alloc(o, 9, 512)),
            "Alloc { tag: 9, split_len: 512 }"
        );
        let mut out = Vec::new();
        put_alloc_reply(&mut out, 0x0102_0304);
        assert_eq!(out, [4, 3, 2, 1]);
        assert_eq!(parse_alloc_reply(&out), Ok(0x0102_0304));
        assert!(parse_alloc_reply(&out[..3]).is_err());
        out.clear();
        put_regen_reply(&mut out, 5 | 1 << 56);
        assert_eq!(out, [5, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(parse_regen_reply(&out), Ok(5 | 1 << 56));
        assert!(parse_regen_reply(&[5, 0, 0, 0]).is_err());
        assert_eq!(parse_regen_reply(&[0; 9]), Err(WireError::Trailing(1)));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if bytes.len() >= HEADER_LEN {
                if let Ok(h) = Header::parse(bytes[..HEADER_LEN].try_into().unwrap()) {
                    let body = &bytes[HEADER_LEN..];
                    let _ = parse_request(&h, body);
                    let mut delivered = 0;
                    let _ = parse_vectored_reply(&h, body, |_, _, d| delivered += d.len());
                    prop_assert!(delivered <= body.len());
                }
            }
            let _ = Stats::parse(&bytes);
            let _ = parse_list(&bytes);
            let _ = parse_reclaims(&bytes);
            let _ = Notice::parse(&bytes);
            let _ = HelloReply::parse(&bytes);
            let _ = parse_corrupt_reply(&bytes);
            if let Ok(list) = parse_corrupt(&bytes) {
                let mut out = Vec::new();
                put_corrupt(&mut out, &list);
                prop_assert_eq!(out, bytes.clone());
            }
            if let Ok(f) = Fault::parse(&bytes) {
                let mut out = Vec::new();
                f.put(&mut out);
                prop_assert_eq!(out, bytes);
            }
        }
    }
}
