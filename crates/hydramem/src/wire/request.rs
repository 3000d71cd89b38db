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
        Op::Fault => return Ok(Request::Fault(Fault::parse(body)?)),
        Op::Regen => return Ok(Request::Regen(Regen::parse(body)?)),
        Op::Ping => Request::Ping,
        Op::Alloc => Request::Alloc {
            tag: r.u64()?,
            split_len: r.u32()?,
        },
        Op::Free => Request::Free { slab: r.u32()? },
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if bytes.len() >= HEADER_LEN {
                if let Ok(h) = Header::parse(bytes[..HEADER_LEN].try_into().unwrap()) {
                    let body = &bytes[HEADER_LEN..];
                    let _ = parse_request(&h, body);
                    let mut delivered = 0;
                    let _ = parse_vectored_reply(&h, body, |_, _, _, _, d| delivered += d.len());
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
