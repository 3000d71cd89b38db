//! The node's side of the run format: the runs of a parsed WRITEV or READV request, and the
//! replies it builds (see the byte tables in [`super`]).
//!
//! Invariants: request runs were checked at parse time (bounds, and data of exactly the
//! declared length), so iterating them cannot fail and allocates nothing; a reply is complete
//! (count and length patched) only after its `finish`, and holds its runs in request order.

use std::marker::PhantomData;

use super::{add_splits, Run, SplitFields, SPLIT_FIELDS_LEN};
use crate::wire::{FrameBuilder, Header, Op, Reader, Status, WireError, MAX_BODY};

/// The runs of a WRITEV or READV request, still in wire form: their bounds (and, for writes,
/// the length of their data) were checked at parse time, so iterating cannot fail and
/// allocates nothing. [`ReadRuns`] and [`WriteRuns`] name the two.
#[derive(Debug, Clone, Copy)]
pub struct Runs<'a, K> {
    raw: &'a [u8],
    runs: usize,
    splits: usize,
    data_len: usize,
    kind: PhantomData<K>,
}

/// The runs of a READV request.
pub type ReadRuns<'a> = Runs<'a, Reads>;
/// The runs of a WRITEV request, with their data.
pub type WriteRuns<'a> = Runs<'a, Writes>;

/// [`Runs`] of READV: each run's head is followed by its cookies.
#[derive(Debug, Clone, Copy)]
pub enum Reads {}
/// [`Runs`] of WRITEV: each run's head is followed by its split fields, then its data.
#[derive(Debug, Clone, Copy)]
pub enum Writes {}

/// What follows a run's head in a request of one op ([`Reads`] or [`Writes`]).
pub trait RunKind {
    /// Bytes of per-split fields (cookies for READV).
    fn fields_len(run: &Run) -> usize;
    /// Bytes of data.
    fn data_len(run: &Run) -> usize;
}

impl RunKind for Reads {
    fn fields_len(run: &Run) -> usize {
        8 * run.n as usize
    }
    fn data_len(_: &Run) -> usize {
        0
    }
}

impl RunKind for Writes {
    fn fields_len(run: &Run) -> usize {
        SPLIT_FIELDS_LEN * run.n as usize
    }
    fn data_len(run: &Run) -> usize {
        run.data_len()
    }
}

impl<'a, K> Runs<'a, K> {
    /// Number of runs.
    pub fn len(&self) -> usize {
        self.runs
    }

    /// Whether there are no runs.
    pub fn is_empty(&self) -> bool {
        self.runs == 0
    }

    /// Splits in all runs.
    pub fn splits(&self) -> usize {
        self.splits
    }

    /// Data bytes the request carries in all runs (0 for READV).
    pub fn data_len(&self) -> usize {
        self.data_len
    }
}

impl<'a, K: RunKind> Runs<'a, K> {
    pub(crate) fn get(r: &mut Reader<'a>) -> Result<Runs<'a, K>, WireError> {
        let runs = r.count()?;
        let start = r.pos();
        let (mut splits, mut data_len) = (0, 0);
        for _ in 0..runs {
            let run = Run::get(r)?;
            add_splits(&mut splits, run.n as usize)?;
            r.bytes(K::fields_len(&run))?;
            r.bytes(K::data_len(&run))?;
            data_len += K::data_len(&run);
        }
        Ok(Runs {
            raw: &r.consumed()[start..],
            runs,
            splits,
            data_len,
            kind: PhantomData,
        })
    }

    /// Every run's head, fields and data, in request order.
    fn parts(&self) -> impl Iterator<Item = (Run, &'a [u8], &'a [u8])> + 'a {
        let mut r = Reader::new(self.raw);
        (0..self.runs).map(move |_| {
            let run = Run::get(&mut r).expect("checked at parse time");
            let fields = r.bytes(K::fields_len(&run)).expect("checked at parse time");
            let data = r.bytes(K::data_len(&run)).expect("checked at parse time");
            (run, fields, data)
        })
    }
}

impl<'a> Runs<'a, Reads> {
    /// The runs in request order.
    pub fn iter(&self) -> impl Iterator<Item = ReadRun<'a>> + 'a {
        self.parts()
            .map(|(run, cookies, _)| ReadRun { run, cookies })
    }
}

impl<'a> Runs<'a, Writes> {
    /// The runs in request order.
    pub fn iter(&self) -> impl Iterator<Item = WriteRun<'a>> + 'a {
        self.parts()
            .map(|(run, fields, data)| WriteRun { run, fields, data })
    }
}

/// One run of a READV request.
#[derive(Debug, Clone, Copy)]
pub struct ReadRun<'a> {
    /// The slots asked.
    pub run: Run,
    cookies: &'a [u8],
}

impl<'a> ReadRun<'a> {
    /// The cookie of split `i` (`i < n`).
    pub fn cookie(&self, i: usize) -> u64 {
        super::u64_at(self.cookies, 8 * i)
    }

    /// The cookies in slot order.
    pub fn cookies(&self) -> impl Iterator<Item = u64> + 'a {
        self.cookies.chunks_exact(8).map(|c| super::u64_at(c, 0))
    }
}

/// One run of a WRITEV request: its slots, its splits' fields and its data.
#[derive(Debug, Clone, Copy)]
pub struct WriteRun<'a> {
    /// The slots written.
    pub run: Run,
    fields: &'a [u8],
    data: &'a [u8],
}

impl<'a> WriteRun<'a> {
    /// The fields of split `i` (`i < n`).
    pub fn split(&self, i: usize) -> SplitFields {
        SplitFields::at(self.fields, i)
    }

    /// The data of the whole run (`n × split_len` bytes, split i at `i × split_len`).
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// The data of split `i`.
    pub fn split_data(&self, i: usize) -> &'a [u8] {
        let len = self.run.split_len as usize;
        &self.data[i * len..(i + 1) * len]
    }
}

/// A READV reply being built by a node: runs are appended in request order, then
/// [`ReadReply::finish`] completes the frame.
pub struct ReadReply(Counted);

/// A reply frame whose body starts with a count of what follows (runs or splits).
struct Counted {
    frame: FrameBuilder,
    body_at: usize,
    count: u32,
}

impl Counted {
    fn begin(out: &mut Vec<u8>, op: Op, h: &Header) -> Counted {
        let frame = FrameBuilder::begin(out, op, true, Status::Ok, h.id);
        let body_at = out.len();
        out.extend_from_slice(&0u32.to_le_bytes());
        Counted {
            frame,
            body_at,
            count: 0,
        }
    }

    fn finish(self, out: &mut Vec<u8>) -> Result<(), WireError> {
        out[self.body_at..self.body_at + 4].copy_from_slice(&self.count.to_le_bytes());
        self.frame.finish(out)
    }
}

/// Where a served run lies in a reply buffer, to alter single splits afterwards (injected
/// faults).
#[derive(Debug, Clone, Copy)]
pub struct ServedRun {
    fields_at: usize,
    data_at: usize,
    split_len: usize,
}

impl ServedRun {
    /// The reply's copy of split `i`'s data.
    pub fn data_mut<'o>(&self, out: &'o mut [u8], i: usize) -> &'o mut [u8] {
        let at = self.data_at + i * self.split_len;
        &mut out[at..at + self.split_len]
    }

    /// Replaces the checksum the reply carries for split `i`.
    pub fn set_crc(&self, out: &mut [u8], i: usize, crc: u32) {
        let at = self.fields_at + i * SPLIT_FIELDS_LEN + 16;
        out[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    }
}

impl ReadReply {
    /// Starts the reply to READV `h` at the end of `out`.
    pub fn begin(out: &mut Vec<u8>, h: &Header) -> ReadReply {
        ReadReply(Counted::begin(out, Op::ReadV, h))
    }

    /// Whether serving `run` keeps the reply within [`MAX_BODY`].
    pub fn fits(&self, out: &[u8], run: &Run) -> bool {
        out.len() - self.0.body_at + run.read_reply_len() <= MAX_BODY
    }

    /// Appends `run` refused with `status`: no data, versions and checksums 0.
    pub fn refuse(&mut self, out: &mut Vec<u8>, run: &ReadRun<'_>, status: Status) {
        self.head(out, status, run.run.n, 0);
        for cookie in run.cookies() {
            SplitFields {
                cookie,
                ..SplitFields::default()
            }
            .put(out);
        }
    }

    /// Appends `run` served: `stamp(i)` gives split i's stored version, checksum and tag, `data`
    /// is the run's bytes (`n × split_len`), copied once into the reply. The caller checked
    /// [`ReadReply::fits`].
    pub fn serve(
        &mut self,
        out: &mut Vec<u8>,
        run: &ReadRun<'_>,
        mut stamp: impl FnMut(usize) -> (u64, u32, u64),
        data: &[u8],
    ) -> ServedRun {
        debug_assert_eq!(data.len(), run.run.data_len());
        self.head(out, Status::Ok, run.run.n, data.len() as u32);
        let fields_at = out.len();
        for (i, cookie) in run.cookies().enumerate() {
            let (version, crc, tag) = stamp(i);
            SplitFields {
                cookie,
                version,
                crc,
                tag,
            }
            .put(out);
        }
        let data_at = out.len();
        out.extend_from_slice(data);
        ServedRun {
            fields_at,
            data_at,
            split_len: run.run.split_len as usize,
        }
    }

    /// Appends a run given in full: its status, every split's fields and its data (empty for
    /// a failed run); for a peer that answers without a slab behind it (a test's stand-in).
    pub fn put_run(
        &mut self,
        out: &mut Vec<u8>,
        status: Status,
        splits: &[SplitFields],
        data: &[u8],
    ) {
        self.head(out, status, splits.len() as u32, data.len() as u32);
        for s in splits {
            s.put(out);
        }
        out.extend_from_slice(data);
    }

    fn head(&mut self, out: &mut Vec<u8>, status: Status, n: u32, len: u32) {
        out.extend_from_slice(&(status as u32).to_le_bytes());
        out.extend_from_slice(&n.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        self.0.count += 1;
    }

    /// Completes the frame (the run count and the body length).
    pub fn finish(self, out: &mut Vec<u8>) -> Result<(), WireError> {
        self.0.finish(out)
    }
}

/// A WRITEV reply being built by a node: one entry per split, in request order.
pub struct WriteReply(Counted);

impl WriteReply {
    /// Starts the reply to WRITEV `h` at the end of `out`.
    pub fn begin(out: &mut Vec<u8>, h: &Header) -> WriteReply {
        WriteReply(Counted::begin(out, Op::WriteV, h))
    }

    /// Appends the outcome of one split and the version stored for it now.
    pub fn put(&mut self, out: &mut Vec<u8>, cookie: u64, status: Status, stored: u64) {
        out.extend_from_slice(&cookie.to_le_bytes());
        out.extend_from_slice(&(status as u32).to_le_bytes());
        out.extend_from_slice(&stored.to_le_bytes());
        self.0.count += 1;
    }

    /// Completes the frame (the split count and the body length).
    pub fn finish(self, out: &mut Vec<u8>) -> Result<(), WireError> {
        self.0.finish(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::run;
    use super::*;
    use crate::wire::{
        parse_request, test_split as split, OpenRuns, Request, MAX_ENTRIES, MAX_SPLIT_LEN,
        RUN_HEAD_LEN,
    };

    #[test]
    fn read_runs_match_the_byte_table() {
        let mut buf = Vec::new();
        let mut f = OpenRuns::begin(&mut buf, Op::ReadV, 9).unwrap();
        f.read_run(
            &mut buf,
            run(7, 512, 1024, 2),
            &mut [0xA1, 0xA2].into_iter(),
        )
        .unwrap();
        let (h, body) = split(&buf);
        assert_eq!((h.op, h.id), (Op::ReadV, 9));
        assert_eq!(body.len(), 4 + RUN_HEAD_LEN + 16);
        assert_eq!(&body[0..4], &[1, 0, 0, 0]);
        assert_eq!(&body[4..8], &[7, 0, 0, 0]);
        assert_eq!(&body[8..12], &512u32.to_le_bytes());
        assert_eq!(&body[12..20], &1024u64.to_le_bytes());
        assert_eq!(&body[20..24], &[2, 0, 0, 0]);
        assert_eq!((body[24], body[32]), (0xA1, 0xA2));
        let Ok(Request::ReadV(runs)) = parse_request(&h, body) else {
            panic!("not a READV");
        };
        assert_eq!((runs.len(), runs.splits()), (1, 2));
        let r = runs.iter().next().unwrap();
        assert_eq!(r.run, run(7, 512, 1024, 2));
        assert_eq!(r.cookies().collect::<Vec<_>>(), vec![0xA1, 0xA2]);
        assert_eq!(r.run.split_offset(1), 1536);
    }

    #[test]
    fn malformed_runs_are_protocol_errors() {
        let parse = |op: Op, body: &[u8]| {
            let mut buf = Vec::new();
            let fb = FrameBuilder::begin(&mut buf, op, false, Status::Ok, 1);
            buf.extend_from_slice(body);
            fb.finish(&mut buf).unwrap();
            let (h, body) = split(&buf);
            parse_request(&h, body).map(|_| ())
        };
        let head = |slab: u32, len: u32, offset: u64, n: u32| {
            let mut b = 1u32.to_le_bytes().to_vec();
            run(slab, len, offset, n).put(&mut b);
            b
        };
        let with = |mut b: Vec<u8>, extra: usize| {
            b.resize(b.len() + extra, 0);
            b
        };
        // Well formed: a READV run of one, a WRITEV run of one 4-byte split.
        assert!(parse(Op::ReadV, &with(head(0, 4, 0, 1), 8)).is_ok());
        assert!(parse(Op::WriteV, &with(head(0, 4, 0, 1), 32)).is_ok());
        for (op, body) in [
            (Op::ReadV, with(head(0, 4, 0, 0), 0)), // no splits
            (Op::ReadV, with(head(0, 0, 0, 1), 8)), // 0-byte splits
            (Op::ReadV, with(head(0, MAX_SPLIT_LEN + 1, 0, 1), 8)), // too long
            (Op::ReadV, with(head(0, 4, u64::MAX - 3, 1), 8)), // reaches past 2^64
            (Op::ReadV, with(head(0, 4, 0, 2), 8)), // a cookie short
            (Op::ReadV, with(head(0, 4, 0, 1), 9)), // a byte trailing
            (Op::ReadV, with(head(0, 1, 0, MAX_ENTRIES as u32 + 1), 0)),
            (Op::WriteV, with(head(0, 4, 0, 1), 31)), // data short
            (Op::WriteV, with(head(0, 4, 0, 1), 33)), // data long
        ] {
            assert!(parse(op, &body).is_err(), "{op:?} {:?}", &body[..24]);
        }
        // More splits in all runs than a frame may carry.
        let mut b = 2u32.to_le_bytes().to_vec();
        for _ in 0..2 {
            run(0, 1, 0, 4097).put(&mut b);
            b.resize(b.len() + 8 * 4097, 0);
        }
        assert!(matches!(
            parse(Op::ReadV, &b),
            Err(WireError::TooManyEntries(8194))
        ));
    }
}
