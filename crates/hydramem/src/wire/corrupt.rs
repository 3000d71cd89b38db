//! CORRUPT: the corrupted splits a client found among a node's replies.
//!
//! Invariants: a body's layout (count and record length) is checked at parse time; its values
//! are checked separately so that a node can answer them with a status.

#[cfg(doc)]
use super::{parse_request, Status};
use super::{Reader, WireError};

/// Most records one CORRUPT request may carry; a client with more sends several requests.
pub const MAX_CORRUPT_REPORTS: usize = 1024;
/// Length of one CORRUPT record on the wire: slab u32, splits u32, cause u8.
pub const CORRUPT_REPORT_LEN: usize = 9;

/// How a client found the splits of a [`CorruptReport`] corrupt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum CorruptCause {
    /// The split failed its checksum (see [`crate::integrity`]): its bytes, or the page or
    /// version it answered for, were wrong.
    Checksum = 1,
    /// The split disagreed with the codeword the other splits of its page form, and a
    /// correcting read singled it out (the paper's correction mode; clients that keep
    /// checksums send [`CorruptCause::Checksum`]).
    Codeword = 2,
}

impl CorruptCause {
    /// Every cause, for exhaustive tests.
    pub const ALL: [CorruptCause; 2] = [CorruptCause::Checksum, CorruptCause::Codeword];

    /// The cause's name in logs and metric labels.
    pub fn label(self) -> &'static str {
        match self {
            CorruptCause::Checksum => "checksum",
            CorruptCause::Codeword => "codeword",
        }
    }

    fn from_u8(v: u8) -> Option<CorruptCause> {
        CorruptCause::ALL.into_iter().find(|c| *c as u8 == v)
    }
}

/// One record of a CORRUPT request: the caller found `splits` splits it read from its slab
/// `slab` on this node corrupt, by `cause`. The node is the only place that can show where
/// corruption happens across clients, but only a client can detect it (the checksum binds the
/// client's page address and version), hence the report.
///
/// | size | field |
/// |------|-------|
/// | 4    | slab id on the node |
/// | 4    | corrupted splits found (at least 1) |
/// | 1    | cause: 1 failed checksum, 2 codeword mismatch ([`CorruptCause`]) |
///
/// The request body is a count u32 then that many records (at most [`MAX_CORRUPT_REPORTS`]);
/// the reply body is the number of records that named a slab of the caller. The node adds
/// every record to its node-wide count, and to the slab's own count when the slab is the
/// caller's. A record naming no slab of the caller (freed or moved since the read, or never
/// its own) is counted as an unknown slab instead of refused: the corruption still happened
/// on this node, and a foreign slab's count is never touched, so a client can neither blame
/// another client's slab nor learn whether it exists.
///
/// A body whose length does not match its count, or a count above the maximum, is a protocol
/// violation like any malformed frame. A well-formed body with a record of 0 splits or an
/// unknown cause is answered [`Status::BadRequest`] and none of it is counted; the
/// connection stays open, because reports travel on the client's data connection and a cause
/// an older node does not know must cost one refused report, not the client's I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CorruptReport {
    /// The caller's slab on this node.
    pub slab: u32,
    /// Corrupted splits found in it.
    pub splits: u32,
    /// How they were found.
    pub cause: CorruptCause,
}

/// Appends a CORRUPT request body. At most [`MAX_CORRUPT_REPORTS`] records: split longer
/// lists over several requests.
pub fn put_corrupt(out: &mut Vec<u8>, reports: &[CorruptReport]) {
    out.extend_from_slice(&(reports.len() as u32).to_le_bytes());
    for c in reports {
        out.extend_from_slice(&c.slab.to_le_bytes());
        out.extend_from_slice(&c.splits.to_le_bytes());
        out.push(c.cause as u8);
    }
}

/// Parses a CORRUPT request body, layout and values (a node parses the layout in
/// [`parse_request`] and the values with [`CorruptList::reports`], to answer bad values with a
/// status instead of closing the connection).
pub fn parse_corrupt(body: &[u8]) -> Result<Vec<CorruptReport>, WireError> {
    let mut r = Reader::new(body);
    let list = CorruptList::get(&mut r)?;
    r.end()?;
    list.reports()
}

/// Appends a CORRUPT reply body: how many records the node accepted.
pub fn put_corrupt_reply(out: &mut Vec<u8>, accepted: u32) {
    out.extend_from_slice(&accepted.to_le_bytes());
}

/// Parses a CORRUPT reply body: the records that named a slab of the caller.
pub fn parse_corrupt_reply(body: &[u8]) -> Result<u32, WireError> {
    let mut r = Reader::new(body);
    let accepted = r.u32()?;
    r.end()?;
    Ok(accepted)
}

/// The records of a CORRUPT request, still in wire form: their layout is checked at parse
/// time, their values by [`CorruptList::reports`].
#[derive(Debug, Clone, Copy)]
pub struct CorruptList<'a> {
    raw: &'a [u8],
}

impl<'a> CorruptList<'a> {
    pub(super) fn get(r: &mut Reader<'a>) -> Result<CorruptList<'a>, WireError> {
        let n = r.u32()? as usize;
        if n > MAX_CORRUPT_REPORTS {
            return Err(WireError::Invalid(
                "CORRUPT carries more than 1024 records; send several requests",
            ));
        }
        Ok(CorruptList {
            raw: r.bytes(n * CORRUPT_REPORT_LEN)?,
        })
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.raw.len() / CORRUPT_REPORT_LEN
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// The records, or why their values are unacceptable (a record of 0 splits, an unknown
    /// cause).
    pub fn reports(&self) -> Result<Vec<CorruptReport>, WireError> {
        self.raw
            .chunks_exact(CORRUPT_REPORT_LEN)
            .map(|c| {
                let splits = u32::from_le_bytes(c[4..8].try_into().expect("4"));
                if splits == 0 {
                    return Err(WireError::Invalid("CORRUPT record of 0 splits"));
                }
                Ok(CorruptReport {
                    slab: u32::from_le_bytes(c[0..4].try_into().expect("4")),
                    splits,
                    cause: CorruptCause::from_u8(c[8])
                        .ok_or(WireError::Invalid("CORRUPT record of an unknown cause"))?,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::*;
    use crate::wire::{test_frame as frame, test_split as split};
    use proptest::prelude::*;

    #[test]
    fn corrupt_body_matches_the_table_and_bad_records_are_refused() {
        let one = CorruptReport {
            slab: 0x0102_0304,
            splits: 5,
            cause: CorruptCause::Codeword,
        };
        let mut out = Vec::new();
        put_corrupt(&mut out, &[one]);
        assert_eq!(out, [1, 0, 0, 0, 4, 3, 2, 1, 5, 0, 0, 0, 2]);
        assert_eq!(CorruptCause::Checksum as u8, 1);
        let parse = |body: &[u8]| {
            let buf = frame(Op::Corrupt, 1, |o| o.extend_from_slice(body));
            let (h, body) = split(&buf);
            parse_request(&h, body).map(|r| match r {
                Request::Corrupt(l) => l.reports(),
                other => panic!("parsed as {other:?}"),
            })
        };
        assert_eq!(parse(&out), Ok(Ok(vec![one])));
        // Bad values parse (the node answers them with a status and keeps the connection).
        for (at, v) in [(8, 0u8), (12, 0), (12, 3), (12, 0xff)] {
            let mut bad = out.clone();
            if at == 8 {
                bad[8..12].fill(v);
            } else {
                bad[at] = v;
            }
            assert!(
                matches!(parse(&bad), Ok(Err(WireError::Invalid(_)))),
                "{bad:?}"
            );
        }
        // A layout that does not match the count, or too many records, does not.
        assert!(parse(&out[..12]).is_err());
        assert!(parse(&[out.as_slice(), &[0]].concat()).is_err());
        let many = (MAX_CORRUPT_REPORTS as u32 + 1).to_le_bytes();
        let body: Vec<u8> = many
            .iter()
            .copied()
            .chain(std::iter::repeat_n(
                1,
                (MAX_CORRUPT_REPORTS + 1) * CORRUPT_REPORT_LEN,
            ))
            .collect();
        assert!(matches!(parse(&body), Err(WireError::Invalid(_))));
        assert_eq!(parse(&0u32.to_le_bytes()), Ok(Ok(vec![])));
        assert!(parse_corrupt_reply(&[1, 0, 0]).is_err());
    }

    proptest! {
        #[test]
        fn corrupt_reports_round_trip(list in proptest::collection::vec((any::<u32>(), 1u32.., 0usize..CorruptCause::ALL.len()), 0..MAX_CORRUPT_REPORTS), id: u64) {
            let list: Vec<CorruptReport> = list.into_iter().map(|(slab, splits, c)| CorruptReport { slab, splits, cause: CorruptCause::ALL[c] }).collect();
            let buf = frame(Op::Corrupt, id, |o| put_corrupt(o, &list));
            let (h, body) = split(&buf);
            prop_assert_eq!(body.len(), 4 + list.len() * CORRUPT_REPORT_LEN);
            match parse_request(&h, body).unwrap() {
                Request::Corrupt(l) => {
                    prop_assert_eq!(l.len(), list.len());
                    prop_assert_eq!(l.reports().unwrap(), list.clone());
                }
                other => prop_assert!(false, "parsed as {:?}", other),
            }
            prop_assert_eq!(parse_corrupt(body).unwrap(), list);
            prop_assert_eq!(parse_corrupt_reply(&(id as u32).to_le_bytes()).unwrap(), id as u32);
        }
    }
}
