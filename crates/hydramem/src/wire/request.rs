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
    /// WRITEV: entries, each with its data.
    WriteV(WriteList<'a>),
    /// READV: entries.
    ReadV(EntryList<'a>),
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

/// Parses a request body for the op in `h`. Vectored writes are checked to carry exactly the
/// data their entries declare.
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
        Op::ReadV => {
            let n = r.count()?;
            Request::ReadV(EntryList {
                raw: r.bytes(n * ENTRY_LEN)?,
            })
        }
        Op::WriteV => {
            let n = r.count()?;
            let start = r.pos();
            for _ in 0..n {
                let e = Entry::get(&mut r)?;
                r.bytes(e.len as usize)?;
            }
            Request::WriteV(WriteList {
                raw: &body[start..r.pos()],
                count: n,
            })
        }
    };
    r.end()?;
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{test_frame as frame, test_split as split};
    use proptest::prelude::*;

    #[test]
    fn writev_checks_data_length() {
        let e = Entry {
            slab: 1,
            len: 4,
            offset: 0,
            cookie: 9,
            version: 3,
            crc: 0xdead_beef,
        };
        let ok = frame(Op::WriteV, 1, |o| {
            o.extend_from_slice(&1u32.to_le_bytes());
            e.put(o);
            o.extend_from_slice(&[1, 2, 3, 4]);
        });
        let (h, body) = split(&ok);
        match parse_request(&h, body).unwrap() {
            Request::WriteV(es) => {
                assert_eq!(
                    es.iter().collect::<Vec<_>>(),
                    vec![(e, &[1u8, 2, 3, 4][..])]
                );
            }
            other => panic!("parsed as {other:?}"),
        }
        let short = frame(Op::WriteV, 1, |o| {
            o.extend_from_slice(&1u32.to_le_bytes());
            e.put(o);
            o.extend_from_slice(&[1, 2, 3]);
        });
        let (h, body) = split(&short);
        assert!(parse_request(&h, body).is_err());
    }

    #[test]
    fn vectored_entries_match_the_byte_tables() {
        let e = Entry {
            slab: 1,
            len: 2,
            offset: 3,
            cookie: 4,
            version: 5,
            crc: 0x0607_0809,
        };
        let mut out = Vec::new();
        e.put(&mut out);
        assert_eq!(out.len(), ENTRY_LEN);
        assert_eq!(&out[0..8], &[1, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!((out[8], out[16], out[24]), (3, 4, 5));
        assert_eq!(&out[32..36], &[9, 8, 7, 6]);
        let mut out = Vec::new();
        ReplyEntry::put_read(&mut out, 4, Status::Stale, 0, 5, 0x0607_0809);
        assert_eq!(out.len(), READ_REPLY_LEN);
        assert_eq!((out[0], out[8], out[12], out[16]), (4, 8, 0, 5));
        assert_eq!(&out[24..28], &[9, 8, 7, 6]);
        let got = ReplyEntry::get_read(&mut Reader::new(&out)).unwrap();
        assert_eq!((got.version, got.crc), (5, 0x0607_0809));
        // A WRITEV reply entry carries the version stored now, the newer one when Stale.
        let mut out = Vec::new();
        ReplyEntry::put_write(&mut out, 4, Status::Stale, 0x0102_0304_0506_0708);
        assert_eq!(out.len(), WRITE_REPLY_LEN);
        assert_eq!((out[0], out[8], out[12], out[19]), (4, 8, 8, 1));
        let got = ReplyEntry::get_write(&mut Reader::new(&out)).unwrap();
        assert_eq!(
            (got.status, got.version),
            (Status::Stale, 0x0102_0304_0506_0708)
        );
    }

    fn arb_entry() -> impl Strategy<Value = Entry> {
        (
            any::<u32>(),
            0u32..2048,
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
        )
            .prop_map(|(slab, len, offset, cookie, version, crc)| Entry {
                slab,
                len,
                offset,
                cookie,
                version,
                crc,
            })
    }

    proptest! {
        #[test]
        fn vectored_requests_round_trip(entries in proptest::collection::vec(arb_entry(), 0..40), write: bool, id: u64) {
            let op = if write { Op::WriteV } else { Op::ReadV };
            let buf = frame(op, id, |o| {
                o.extend_from_slice(&(entries.len() as u32).to_le_bytes());
                for e in &entries {
                    e.put(o);
                    if write { o.extend(std::iter::repeat_n(e.cookie as u8, e.len as usize)); }
                }
            });
            let (h, body) = split(&buf);
            prop_assert_eq!(h.id, id);
            match parse_request(&h, body).unwrap() {
                Request::WriteV(es) => {
                    prop_assert!(write);
                    let got: Vec<_> = es.iter().collect();
                    prop_assert_eq!(got.len(), entries.len());
                    for ((ge, gd), e) in got.iter().zip(&entries) {
                        prop_assert_eq!(ge, e);
                        prop_assert!(gd.len() == e.len as usize && gd.iter().all(|b| *b == e.cookie as u8));
                    }
                }
                Request::ReadV(es) => {
                    prop_assert!(!write);
                    prop_assert_eq!(es.iter().collect::<Vec<_>>(), entries.clone());
                }
                other => prop_assert!(false, "parsed as {:?}", other),
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if bytes.len() >= HEADER_LEN {
                if let Ok(h) = Header::parse(bytes[..HEADER_LEN].try_into().unwrap()) {
                    let _ = parse_request(&h, &bytes[HEADER_LEN..]);
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
