//! The sender's side of the run format: an open request frame that runs are appended to
//! ([`OpenRuns`], [`RunWriter`]), and the reading of replies ([`ReplyRuns`],
//! [`parse_vectored_reply`]) — see the byte tables in [`super`].
//!
//! Invariants: an open frame is complete after every append and never exceeds its bounds (a
//! run that would is refused and leaves the buffer as it was); a reply is read without
//! trusting any length further than the body it came in.

use super::{
    add_splits, Run, SplitFields, MAX_ENTRIES, RUN_HEAD_LEN, SPLIT_FIELDS_LEN, WRITE_REPLY_LEN,
};
use crate::wire::{FrameBuilder, Header, Op, Reader, Status, WireError, HEADER_LEN, MAX_BODY};

/// One run of a READV reply as a client (or a regenerating node) reads it.
#[derive(Debug, Clone, Copy)]
pub struct ReplyRun<'a> {
    /// The run's outcome.
    pub status: Status,
    /// Splits in the run.
    pub n: usize,
    fields: &'a [u8],
    data: &'a [u8],
}

impl<'a> ReplyRun<'a> {
    /// Bytes per split (0 for a failed run).
    pub fn split_len(&self) -> usize {
        self.data.len() / self.n
    }

    /// The fields of split `i` (`i < n`): cookie, stored version and checksum.
    pub fn split(&self, i: usize) -> SplitFields {
        SplitFields::at(self.fields, i)
    }

    /// The data of the whole run (empty for a failed run).
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// The data of split `i` (empty for a failed run).
    pub fn split_data(&self, i: usize) -> &'a [u8] {
        let len = self.split_len();
        &self.data[i * len..(i + 1) * len]
    }

    fn get(r: &mut Reader<'a>, total: &mut usize) -> Result<ReplyRun<'a>, WireError> {
        let status = Status::from_u32(r.u32()?)?;
        let n = r.u32()? as usize;
        let len = r.u32()? as usize;
        if n == 0 {
            return Err(WireError::Invalid("a reply run of no splits"));
        }
        add_splits(total, n)?;
        match status {
            Status::Ok if len == 0 || !len.is_multiple_of(n) => {
                return Err(WireError::Invalid(
                    "a served run's data is not n splits of one length",
                ))
            }
            Status::Ok => {}
            _ if len != 0 => return Err(WireError::Invalid("a failed run carries data")),
            _ => {}
        }
        Ok(ReplyRun {
            status,
            n,
            fields: r.bytes(SPLIT_FIELDS_LEN * n)?,
            data: r.bytes(len)?,
        })
    }
}

/// Reads the runs of a READV reply body one by one; stops at the first malformed run.
pub struct ReplyRuns<'a> {
    r: Reader<'a>,
    left: usize,
    splits: usize,
}

impl<'a> ReplyRuns<'a> {
    /// Starts reading a READV reply body.
    pub fn new(body: &'a [u8]) -> Result<ReplyRuns<'a>, WireError> {
        let mut r = Reader::new(body);
        let left = r.count()?;
        Ok(ReplyRuns { r, left, splits: 0 })
    }

    /// Runs not read yet.
    pub fn remaining(&self) -> usize {
        self.left
    }

    /// The next run, or `None` after the last (then the body must have ended: an error
    /// otherwise).
    pub fn next_run(&mut self) -> Result<Option<ReplyRun<'a>>, WireError> {
        if self.left == 0 {
            self.r.end()?;
            return Ok(None);
        }
        self.left -= 1;
        ReplyRun::get(&mut self.r, &mut self.splits).map(Some)
    }
}

/// Where the data of every served split of a READV reply body lies in that body, in order
/// (a failed run carries none): what a test transport needs to corrupt replies on the wire
/// without knowing their byte layout. At most [`MAX_ENTRIES`] spans; fails like
/// [`ReplyRuns::next_run`] on a malformed body.
pub fn reply_split_spans(body: &[u8]) -> Result<Vec<std::ops::Range<usize>>, WireError> {
    let mut spans = Vec::new();
    let mut runs = ReplyRuns::new(body)?;
    while let Some(run) = runs.next_run()? {
        let len = run.split_len();
        if len == 0 {
            continue;
        }
        // A run's data is its last field: it ends where the reader stands.
        let start = runs.r.pos() - run.data.len();
        spans.extend((0..run.n).map(|i| start + i * len..start + (i + 1) * len));
    }
    Ok(spans)
}

/// Parses the body of a WRITEV or READV reply with status OK, calling
/// `f(status, fields, data)` for every split in order (`data` is empty for writes and for
/// failed reads; for writes the fields' version is the version stored now, crc and tag 0).
/// Stops at the first malformed run or entry; splits before it have been delivered.
pub fn parse_vectored_reply<'a>(
    h: &Header,
    body: &'a [u8],
    mut f: impl FnMut(Status, SplitFields, &'a [u8]),
) -> Result<(), WireError> {
    if !h.reply {
        return Err(WireError::Invalid("expected a reply frame"));
    }
    if h.status != Status::Ok {
        return Err(WireError::Invalid("vectored request refused as a whole"));
    }
    match h.op {
        Op::WriteV => {
            let mut r = Reader::new(body);
            for _ in 0..r.count()? {
                let cookie = r.u64()?;
                let status = Status::from_u32(r.u32()?)?;
                let version = r.u64()?;
                let fields = SplitFields {
                    cookie,
                    version,
                    ..SplitFields::default()
                };
                f(status, fields, &[]);
            }
            r.end()
        }
        Op::ReadV => {
            let mut runs = ReplyRuns::new(body)?;
            while let Some(run) = runs.next_run()? {
                for i in 0..run.n {
                    f(run.status, run.split(i), run.split_data(i));
                }
            }
            Ok(())
        }
        _ => Err(WireError::Invalid("not a vectored op")),
    }
}

/// An open WRITEV or READV request frame at the end of a sender's buffer, to which runs are
/// appended while it stays open: a client merges the splits that many threads post to one
/// node into one frame. After every append the frame is complete (its run count and body
/// length patched), so the buffer can be sent at any moment between appends. The buffer must
/// not be changed by anything else while the frame is open (a sender that sends or truncates
/// its buffer drops the `OpenRuns`).
#[derive(Debug, Clone, Copy)]
pub struct OpenRuns {
    start: usize,
    op: Op,
    runs: u32,
    splits: usize,
    /// Body length of the reply this request will get at most.
    reply_len: usize,
}

impl OpenRuns {
    /// Opens an empty WRITEV or READV (`op`) frame with request id `id` at the end of `buf`.
    pub fn begin(buf: &mut Vec<u8>, op: Op, id: u64) -> Result<OpenRuns, WireError> {
        if !matches!(op, Op::WriteV | Op::ReadV) {
            return Err(WireError::Invalid("not a vectored op"));
        }
        let start = buf.len();
        let frame = FrameBuilder::begin(buf, op, false, Status::Ok, id);
        buf.extend_from_slice(&0u32.to_le_bytes());
        frame.finish(buf)?;
        Ok(OpenRuns {
            start,
            op,
            runs: 0,
            splits: 0,
            reply_len: 4,
        })
    }

    /// The frame's op.
    pub fn op(&self) -> Op {
        self.op
    }

    /// Splits in the frame so far.
    pub fn splits(&self) -> usize {
        self.splits
    }

    /// Bytes of the request body a run adds.
    fn request_len(&self, run: &Run) -> usize {
        let n = run.n as usize;
        RUN_HEAD_LEN
            + match self.op {
                Op::WriteV => SPLIT_FIELDS_LEN * n + run.data_len(),
                _ => 8 * n,
            }
    }

    /// Bytes of the reply body a run adds.
    fn reply_len(&self, run: &Run) -> usize {
        match self.op {
            Op::WriteV => WRITE_REPLY_LEN * run.n as usize,
            _ => run.read_reply_len(),
        }
    }

    /// Whether `run` can join this frame with its request body staying within `limit` bytes
    /// (and [`MAX_BODY`]), its reply within [`MAX_BODY`] and its splits within
    /// [`MAX_ENTRIES`].
    pub fn fits(&self, buf: &[u8], run: &Run, limit: usize) -> bool {
        let body = buf.len() - self.start - HEADER_LEN;
        run.check().is_ok()
            && body + self.request_len(run) <= limit.min(MAX_BODY)
            && self.reply_len + self.reply_len(run) <= MAX_BODY
            && self.splits + run.n as usize <= MAX_ENTRIES
    }

    /// Appends a READV run with its `n` cookies. Fails, leaving the frame as it was, if the
    /// op is not READV, the run breaks the bounds, does not fit the frame, or `cookies` does
    /// not yield exactly `n` cookies.
    pub fn read_run(
        &mut self,
        buf: &mut Vec<u8>,
        run: Run,
        cookies: &mut dyn Iterator<Item = u64>,
    ) -> Result<(), WireError> {
        self.admit(buf, Op::ReadV, &run)?;
        let rollback = buf.len();
        run.put(buf);
        let mut got = 0;
        for c in cookies.take(run.n as usize) {
            buf.extend_from_slice(&c.to_le_bytes());
            got += 1;
        }
        if got != run.n {
            buf.truncate(rollback);
            return Err(WireError::Invalid("fewer cookies than the run's splits"));
        }
        self.close_run(buf, &run);
        Ok(())
    }

    /// Starts a WRITEV run: reserves its split fields, then takes its splits one by one
    /// ([`RunWriter::split`]) and joins the frame at [`RunWriter::finish`]. Fails like
    /// [`OpenRuns::read_run`].
    pub fn write_run<'b>(
        &'b mut self,
        buf: &'b mut Vec<u8>,
        run: Run,
    ) -> Result<RunWriter<'b>, WireError> {
        self.admit(buf, Op::WriteV, &run)?;
        let rollback = buf.len();
        run.put(buf);
        let fields_at = buf.len();
        buf.resize(fields_at + SPLIT_FIELDS_LEN * run.n as usize, 0);
        Ok(RunWriter {
            frame: self,
            buf,
            run,
            rollback,
            fields_at,
            next: 0,
        })
    }

    fn admit(&self, buf: &[u8], op: Op, run: &Run) -> Result<(), WireError> {
        if self.op != op {
            return Err(WireError::Invalid("a run of another op"));
        }
        run.check()?;
        if !self.fits(buf, run, MAX_BODY) {
            return Err(WireError::TooLarge(
                (buf.len() - self.start - HEADER_LEN + self.request_len(run)) as u64,
            ));
        }
        Ok(())
    }

    /// Counts a complete run and patches the frame's run count and body length.
    fn close_run(&mut self, buf: &mut [u8], run: &Run) {
        self.runs += 1;
        self.splits += run.n as usize;
        self.reply_len += self.reply_len(run);
        let body = (buf.len() - self.start - HEADER_LEN) as u32;
        let count_at = self.start + HEADER_LEN;
        buf[count_at..count_at + 4].copy_from_slice(&self.runs.to_le_bytes());
        Header::patch_body_len(&mut buf[self.start..], body);
    }
}

/// A WRITEV run being written into an [`OpenRuns`] frame: split fields are filled and data
/// appended split by split, in slot order. Dropped before [`RunWriter::finish`], it removes
/// the partial run and leaves the frame as it was.
pub struct RunWriter<'b> {
    frame: &'b mut OpenRuns,
    buf: &'b mut Vec<u8>,
    run: Run,
    rollback: usize,
    fields_at: usize,
    next: u32,
}

impl RunWriter<'_> {
    /// Adds the next split: its fields (cookie, version, checksum, tag) and data (exactly
    /// split_len bytes).
    pub fn split(&mut self, fields: SplitFields, data: &[u8]) -> Result<(), WireError> {
        if self.next == self.run.n {
            return Err(WireError::Invalid("more splits than the run holds"));
        }
        if data.len() != self.run.split_len as usize {
            return Err(WireError::Invalid(
                "a split's data is not the run's split length",
            ));
        }
        let at = self.fields_at + SPLIT_FIELDS_LEN * self.next as usize;
        fields.write_into(&mut self.buf[at..at + SPLIT_FIELDS_LEN]);
        self.buf.extend_from_slice(data);
        self.next += 1;
        Ok(())
    }

    /// Joins the run to the frame; fails (and removes the run) unless all `n` splits were
    /// given.
    pub fn finish(mut self) -> Result<(), WireError> {
        if self.next != self.run.n {
            return Err(WireError::Invalid("fewer splits than the run holds"));
        }
        let run = self.run;
        self.frame.close_run(self.buf, &run);
        self.rollback = usize::MAX;
        Ok(())
    }
}

impl Drop for RunWriter<'_> {
    fn drop(&mut self) {
        if self.rollback != usize::MAX {
            self.buf.truncate(self.rollback);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::run;
    use super::*;

    fn fields(cookie: u64) -> SplitFields {
        SplitFields {
            cookie,
            version: 1,
            ..SplitFields::default()
        }
    }

    #[test]
    fn a_run_that_cannot_be_written_leaves_the_open_frame_as_it_was() {
        let mut buf = Vec::new();
        let mut f = OpenRuns::begin(&mut buf, Op::WriteV, 1).unwrap();
        let mut w = f.write_run(&mut buf, run(0, 4, 0, 1)).unwrap();
        w.split(fields(1), &[1; 4]).unwrap();
        w.finish().unwrap();
        let good = buf.clone();
        // Data of another length, too few splits, too many, an abandoned writer.
        let mut w = f.write_run(&mut buf, run(0, 4, 4, 2)).unwrap();
        assert!(w.split(fields(2), &[1; 3]).is_err());
        w.split(fields(2), &[2; 4]).unwrap();
        assert!(w.finish().is_err());
        assert_eq!(buf, good);
        let mut w = f.write_run(&mut buf, run(0, 4, 4, 1)).unwrap();
        w.split(fields(2), &[2; 4]).unwrap();
        assert!(w.split(fields(3), &[2; 4]).is_err());
        drop(w);
        assert_eq!(buf, good);
        // A run of another op, and runs that break the bounds.
        assert!(f
            .read_run(&mut buf, run(0, 4, 0, 1), &mut [1].into_iter())
            .is_err());
        assert!(f.write_run(&mut buf, run(0, 4, 0, 0)).is_err());
        assert!(f.write_run(&mut buf, run(0, 1 << 20, 0, 1)).is_err());
        assert_eq!(buf, good);
        // A READV run whose cookies run out.
        let mut rbuf = Vec::new();
        let mut r = OpenRuns::begin(&mut rbuf, Op::ReadV, 2).unwrap();
        let empty = rbuf.clone();
        assert!(r
            .read_run(&mut rbuf, run(0, 4, 0, 3), &mut [1, 2].into_iter())
            .is_err());
        assert_eq!(rbuf, empty);
        assert_eq!(r.splits(), 0);
    }

    #[test]
    fn an_open_frame_admits_runs_while_request_reply_and_splits_stay_bounded() {
        let mut buf = Vec::new();
        let mut f = OpenRuns::begin(&mut buf, Op::ReadV, 1).unwrap();
        // 4096-byte splits: the reply, not the request, is what fills up.
        let big = run(0, 4096, 0, 1000);
        assert!(f.fits(&buf, &big, 64 << 10));
        let cookies = 0..1000u64;
        f.read_run(&mut buf, big, &mut cookies.clone()).unwrap();
        assert!(
            !f.fits(&buf, &big, 64 << 10),
            "two replies of 4 MB exceed a frame"
        );
        assert!(f.fits(&buf, &run(0, 512, 0, 100), 64 << 10));
        // The request limit applies to what the frame's body would become.
        assert!(!f.fits(&buf, &run(0, 8, 0, 8000), 64 << 10));
        // Splits beyond MAX_ENTRIES in all.
        let mut wbuf = Vec::new();
        let mut w = OpenRuns::begin(&mut wbuf, Op::WriteV, 2).unwrap();
        let mut rw = w.write_run(&mut wbuf, run(0, 1, 0, 8000)).unwrap();
        for i in 0..8000 {
            rw.split(fields(i), &[0]).unwrap();
        }
        rw.finish().unwrap();
        assert!(!w.fits(&wbuf, &run(0, 1, 0, 193), MAX_BODY));
        assert!(w.fits(&wbuf, &run(0, 1, 0, 192), MAX_BODY));
    }
}
