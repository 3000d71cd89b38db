//! WRITEV and READV: vectors of *runs*, each a stretch of consecutive split slots of one slab.
//!
//! Consecutive pages of an address range lie in consecutive split slots of every slab of its
//! coding group, so a range of pages is one run per node, and a scattered batch is a vector
//! of runs in one frame. A run carries its splits' per-split fields (cookie, version,
//! checksum, tag) in one fixed-size area and its data in one contiguous area, in slot order, so that
//! a node serves a read run with one copy from the slab into the reply and lands a written run
//! with one copy into the slab.
//!
//! ## READV
//!
//! Request body: `count u32` (runs), then `count` runs:
//!
//! | size  | field     | meaning                                                            |
//! |-------|-----------|--------------------------------------------------------------------|
//! | 4     | slab      | slab id on the node                                                |
//! | 4     | split_len | bytes per split (1..=[`MAX_SPLIT_LEN`]; must be the slab's)        |
//! | 8     | offset    | byte offset of the run's first split (a multiple of split_len)     |
//! | 4     | n         | splits in the run (at least 1)                                     |
//! | 8 × n | cookies   | one per split, in slot order; opaque to the node, echoed           |
//!
//! Reply body (frame status OK): `count u32` (runs, one per request run, in request order),
//! then `count` runs:
//!
//! | size   | field   | meaning                                                            |
//! |--------|---------|--------------------------------------------------------------------|
//! | 4      | status  | the run's outcome ([`Status`]); a run succeeds or fails as a whole |
//! | 4      | n       | splits in the run, as asked                                        |
//! | 4      | len     | data bytes at the end of the run: n × split_len if OK, else 0      |
//! | 28 × n | splits  | per split, in slot order: cookie u64, version u64, crc u32, tag    |
//! |        |         | u64 (stored with the split; 0, 0 and 0 in a failed run)            |
//! | len    | data    | the run's split slots exactly as they lie in the slab              |
//!
//! ## WRITEV
//!
//! Request body: `count u32` (runs), then `count` runs:
//!
//! | size              | field     | meaning                                                |
//! |-------------------|-----------|--------------------------------------------------------|
//! | 4                 | slab      | as in READV                                            |
//! | 4                 | split_len | as in READV                                            |
//! | 8                 | offset    | as in READV                                            |
//! | 4                 | n         | as in READV                                            |
//! | 28 × n            | splits    | per split: cookie u64, version u64 (of the page the    |
//! |                   |           | split belongs to), crc u32 and tag u64 (stored beside  |
//! |                   |           | the version)                                           |
//! | n × split_len     | data      | split i at byte i × split_len                          |
//!
//! Reply body (frame status OK): `count u32` (splits: the sum of the request's n), then per
//! split in request order `cookie u64, status u32, version u64` — the version stored for the
//! split after the request (the newer one that refused it for [`Status::Stale`]; 0 when the run
//! named no slot the node could read).
//!
//! ## Why this layout
//!
//! - **Per-split fields first, data after, each in one block.** The data of a run is then one
//!   contiguous region on the wire that matches one contiguous region of the slab: one copy
//!   each way, one lock and one range check per run. The per-split area has a fixed size
//!   (28 × n), so a sender reserves it and fills it split by split while it copies each split's
//!   data from wherever it lies (a client's splits of consecutive pages come from different
//!   page buffers): no list is built first ([`OpenRuns`], [`RunWriter`]).
//! - **Runs are self-describing.** A reply run repeats n and every cookie, so a client lands
//!   each split where it belongs without a table of what it asked (the role a work-request id
//!   plays in RDMA), and a frame merges runs that many threads posted.
//! - **A READV run has one status**, because everything that can fail for it (the slab, the
//!   split length, the range) is the same for all its splits; a WRITEV split has its own,
//!   because versions are per split.
//!
//! ## Bounds
//!
//! A frame carries at most [`MAX_ENTRIES`] splits in all runs together (so at most that many
//! runs), a run at least one; split_len is 1..=[`MAX_SPLIT_LEN`], and `offset + n × split_len`
//! must not overflow. A body that breaks any of these, or whose length does not match its
//! runs, is a protocol violation: the node closes that connection. A run that is well formed
//! but wrong for the slab (another split length, a misaligned offset, slots past the end) is
//! answered with a status and the connection stays. A READV whose reply would not fit one
//! frame ([`MAX_BODY`]) gets [`Status::BadRequest`] for the runs that do not fit.
//!
//! ## Versions and checksums
//!
//! Next to each split slot the node keeps the version of the page the split belongs to
//! (0 = never written) and the 32-bit checksum the client gave. A written split is applied
//! only if its version is newer than the stored one; an equal version is acknowledged without
//! rewriting (a repeated write); an older one is refused with [`Status::Stale`] and changes
//! nothing. Valid versions are `1..=`[`MAX_VERSION`]; a split with another is refused with
//! [`Status::BadRequest`]. When every split of a run is newer than what is stored the run
//! lands with one copy; otherwise each split is judged on its own. The node stores and
//! returns the checksum and never computes it (see [`crate::integrity`]); a slot never written
//! has version 0 and crc 0.

mod post;
mod serve;

pub use post::*;
pub use serve::*;

use super::{Reader, WireError};

/// Most splits one vectored frame may carry, in all its runs together.
pub const MAX_ENTRIES: usize = 8192;
/// The largest valid split version (versions are `1..=MAX_VERSION`; 0 means never written).
/// Wall-clock nanoseconds stay below it until the year 2262.
pub const MAX_VERSION: u64 = (1 << 63) - 1;
/// The longest split a slab may hold (ALLOC refuses more): far above any scheme's split (at
/// most a 4096-byte page), far below what one reply frame carries.
pub const MAX_SPLIT_LEN: u32 = 64 << 10;
/// Length of a run's head: slab u32, split_len u32, offset u64, n u32.
pub const RUN_HEAD_LEN: usize = 20;
/// Length of one split's fields in a WRITEV request run and in a READV reply run: cookie u64,
/// version u64, crc u32, tag u64.
pub const SPLIT_FIELDS_LEN: usize = 28;
/// Length of a READV reply run's head: status u32, n u32, len u32.
pub const READ_REPLY_HEAD_LEN: usize = 12;
/// Length of a WRITEV reply entry: cookie u64, status u32, stored version u64.
pub const WRITE_REPLY_LEN: usize = 20;

/// Which split slots a run covers: `n` consecutive slots of `split_len` bytes of slab `slab`,
/// the first at byte `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// Slab id on the node.
    pub slab: u32,
    /// Bytes per split.
    pub split_len: u32,
    /// Byte offset of the first split in the slab.
    pub offset: u64,
    /// Splits in the run.
    pub n: u32,
}

impl Run {
    /// Checks the bounds every run must keep (see the module doc): `1 <= n <= MAX_ENTRIES`,
    /// `1 <= split_len <= MAX_SPLIT_LEN`, and `offset + n × split_len` representable.
    pub fn check(&self) -> Result<(), WireError> {
        if self.n == 0 || self.n as usize > MAX_ENTRIES {
            return Err(WireError::Invalid("a run holds 1 to 8192 splits"));
        }
        if self.split_len == 0 || self.split_len > MAX_SPLIT_LEN {
            return Err(WireError::Invalid(
                "a run's split length is 1 to 65536 bytes",
            ));
        }
        self.offset
            .checked_add(self.data_len() as u64)
            .ok_or(WireError::Invalid("a run reaches past 2^64"))?;
        Ok(())
    }

    /// Bytes of data of the whole run: `n × split_len` (at most 2^29 for a checked run).
    pub fn data_len(&self) -> usize {
        self.n as usize * self.split_len as usize
    }

    /// The byte offset of split `i` (`i < n`; cannot overflow for a checked run).
    pub fn split_offset(&self, i: usize) -> u64 {
        self.offset + i as u64 * u64::from(self.split_len)
    }

    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.slab.to_le_bytes());
        out.extend_from_slice(&self.split_len.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.n.to_le_bytes());
    }

    fn get(r: &mut Reader<'_>) -> Result<Run, WireError> {
        let run = Run {
            slab: r.u32()?,
            split_len: r.u32()?,
            offset: r.u64()?,
            n: r.u32()?,
        };
        run.check()?;
        Ok(run)
    }

    /// Bytes of this run in a READV reply that serves it.
    fn read_reply_len(&self) -> usize {
        READ_REPLY_HEAD_LEN + self.n as usize * SPLIT_FIELDS_LEN + self.data_len()
    }
}

/// One split as a client posts it on its own: a run of one (see [`Entry::run`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Entry {
    /// Slab id on the node.
    pub slab: u32,
    /// Bytes of the split.
    pub len: u32,
    /// Byte offset inside the slab.
    pub offset: u64,
    /// Opaque to the node; echoed in the reply.
    pub cookie: u64,
    /// WRITEV: the version of the page this split belongs to (0 in READV).
    pub version: u64,
    /// WRITEV: the split's checksum, stored with it (0 in READV, and from clients without
    /// checksums).
    pub crc: u32,
    /// WRITEV: the split's tag, stored with it (see [`SplitFields::tag`]; 0 in READV).
    pub tag: u64,
}

impl Entry {
    /// The run of this one split.
    pub fn run(&self) -> Run {
        Run {
            slab: self.slab,
            split_len: self.len,
            offset: self.offset,
            n: 1,
        }
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Adds a run's splits to a frame's total, refusing more than [`MAX_ENTRIES`].
fn add_splits(total: &mut usize, n: usize) -> Result<(), WireError> {
    *total += n;
    if *total > MAX_ENTRIES {
        return Err(WireError::TooManyEntries(*total as u32));
    }
    Ok(())
}

/// One split's fields in a WRITEV run or a READV reply run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SplitFields {
    /// Echoed in the reply.
    pub cookie: u64,
    /// The version of the page the split belongs to.
    pub version: u64,
    /// The split's checksum.
    pub crc: u32,
    /// What the client says the split is, stored beside the version and returned with it:
    /// a span row's piece names its page (see [`crate::span`]); 0 for a Hydra page's split.
    /// Opaque to the node, except that a regeneration decodes it like the split's bytes.
    pub tag: u64,
}

impl SplitFields {
    /// The fields of split `i` in a block of split fields.
    fn at(block: &[u8], i: usize) -> SplitFields {
        let at = SPLIT_FIELDS_LEN * i;
        SplitFields {
            cookie: u64_at(block, at),
            version: u64_at(block, at + 8),
            crc: u32_at(block, at + 16),
            tag: u64_at(block, at + 20),
        }
    }

    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.cookie.to_le_bytes());
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.crc.to_le_bytes());
        out.extend_from_slice(&self.tag.to_le_bytes());
    }

    fn write_into(&self, f: &mut [u8]) {
        f[0..8].copy_from_slice(&self.cookie.to_le_bytes());
        f[8..16].copy_from_slice(&self.version.to_le_bytes());
        f[16..20].copy_from_slice(&self.crc.to_le_bytes());
        f[20..28].copy_from_slice(&self.tag.to_le_bytes());
    }
}

/// A run (for tests).
#[cfg(test)]
fn run(slab: u32, split_len: u32, offset: u64, n: u32) -> Run {
    Run {
        slab,
        split_len,
        offset,
        n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{parse_request, test_split as split, Request};
    use crate::wire::{Header, Op, Status};
    use proptest::prelude::*;

    fn read_frame(runs: &[(Run, Vec<u64>)], id: u64) -> Vec<u8> {
        let mut buf = Vec::new();
        let mut f = OpenRuns::begin(&mut buf, Op::ReadV, id).unwrap();
        for (run, cookies) in runs {
            f.read_run(&mut buf, *run, &mut cookies.iter().copied())
                .unwrap();
        }
        buf
    }

    /// A write run's splits: their fields and the byte that fills the split.
    type Splits = Vec<(SplitFields, u8)>;

    fn write_frame(runs: &[(Run, Splits)], id: u64) -> Vec<u8> {
        let mut buf = Vec::new();
        let mut f = OpenRuns::begin(&mut buf, Op::WriteV, id).unwrap();
        for (run, splits) in runs {
            let mut w = f.write_run(&mut buf, *run).unwrap();
            for (s, fill) in splits {
                let data = vec![*fill; run.split_len as usize];
                w.split(*s, &data).unwrap();
            }
            w.finish().unwrap();
        }
        buf
    }

    #[test]
    fn write_runs_match_the_byte_table_and_their_data_is_contiguous() {
        let f = |cookie, version, crc, tag| SplitFields {
            cookie,
            version,
            crc,
            tag,
        };
        let buf = write_frame(
            &[(
                run(3, 4, 8, 2),
                vec![(f(1, 5, 0xC1, 0x71), 0x11), (f(2, 6, 0xC2, 0x72), 0x22)],
            )],
            4,
        );
        let (h, body) = split(&buf);
        assert_eq!(body.len(), 4 + RUN_HEAD_LEN + 2 * SPLIT_FIELDS_LEN + 8);
        // Split fields after the head: cookie, version, crc, tag.
        let at = 4 + RUN_HEAD_LEN;
        assert_eq!(
            (body[at], body[at + 8], body[at + 16], body[at + 20]),
            (1, 5, 0xC1, 0x71)
        );
        assert_eq!(
            (body[at + 28], body[at + 36], body[at + 44], body[at + 48]),
            (2, 6, 0xC2, 0x72)
        );
        assert_eq!(
            &body[at + 56..],
            &[0x11, 0x11, 0x11, 0x11, 0x22, 0x22, 0x22, 0x22]
        );
        let Ok(Request::WriteV(runs)) = parse_request(&h, body) else {
            panic!("not a WRITEV");
        };
        assert_eq!((runs.splits(), runs.data_len()), (2, 8));
        let r = runs.iter().next().unwrap();
        assert_eq!(r.split(1), f(2, 6, 0xC2, 0x72));
        assert_eq!(r.split_data(1), &[0x22; 4]);
        assert_eq!(r.data().len(), 8);

        // The reply: one entry per split, as in the table.
        let mut out = Vec::new();
        let mut reply = WriteReply::begin(&mut out, &h);
        reply.put(&mut out, 1, Status::Ok, 5);
        reply.put(&mut out, 2, Status::Stale, 0x0102_0304_0506_0708);
        reply.finish(&mut out).unwrap();
        let (rh, rb) = split(&out);
        assert_eq!(rb.len(), 4 + 2 * WRITE_REPLY_LEN);
        assert_eq!(
            (rb[0], rb[4], rb[12], rb[24], rb[32], rb[43]),
            (2, 1, 0, 2, 8, 1)
        );
        let mut got = Vec::new();
        parse_vectored_reply(&rh, rb, |st, s, d| {
            got.push((s.cookie, st, s.version, s.crc, d.len()))
        })
        .unwrap();
        assert_eq!(
            got,
            vec![
                (1, Status::Ok, 5, 0, 0),
                (2, Status::Stale, 0x0102_0304_0506_0708, 0, 0)
            ]
        );
    }

    #[test]
    fn a_served_run_is_its_fields_then_its_data_and_hands_out_each_split() {
        let buf = read_frame(
            &[(run(1, 4, 0, 2), vec![10, 11]), (run(2, 4, 0, 1), vec![12])],
            3,
        );
        let (h, body) = split(&buf);
        let Ok(Request::ReadV(runs)) = parse_request(&h, body) else {
            panic!("not a READV");
        };
        let mut out = Vec::new();
        let mut reply = ReadReply::begin(&mut out, &h);
        let mut it = runs.iter();
        let first = it.next().unwrap();
        assert!(reply.fits(&out, &first.run));
        let data = [1, 1, 1, 1, 2, 2, 2, 2];
        let served = reply.serve(
            &mut out,
            &first,
            |i| (50 + i as u64, 0xC0 + i as u32, 0x70 + i as u64),
            &data,
        );
        served.data_mut(&mut out, 1)[0] = 9;
        served.set_crc(&mut out, 1, 0xEE);
        reply.refuse(&mut out, &it.next().unwrap(), Status::NoSuchSlab);
        reply.finish(&mut out).unwrap();
        let (rh, rb) = split(&out);
        assert_eq!(rb.len(), 4 + (12 + 56 + 8) + (12 + 28));
        // First run: status 0, n 2, len 8, then the split fields, then the data.
        assert_eq!((rb[4], rb[8], rb[12]), (0, 2, 8));
        assert_eq!((rb[16], rb[24], rb[32], rb[36]), (10, 50, 0xC0, 0x70));
        assert_eq!((rb[44], rb[52], rb[60], rb[64]), (11, 51, 0xEE, 0x71));
        assert_eq!(&rb[72..80], &[1, 1, 1, 1, 9, 2, 2, 2]);
        // Second run: refused, no data.
        assert_eq!((rb[80], rb[84], rb[88], rb[92]), (2, 1, 0, 12));
        // Where each served split's data lies (the refused run has none).
        assert_eq!(reply_split_spans(rb).unwrap(), vec![72..76, 76..80]);
        assert!(reply_split_spans(&rb[..76]).is_err());
        let mut got = Vec::new();
        parse_vectored_reply(&rh, rb, |st, s, d| {
            got.push((s.cookie, st, s.version, s.crc, d.to_vec()))
        })
        .unwrap();
        assert_eq!(
            got,
            vec![
                (10, Status::Ok, 50, 0xC0, vec![1; 4]),
                (11, Status::Ok, 51, 0xEE, vec![9, 2, 2, 2]),
                (12, Status::NoSuchSlab, 0, 0, vec![])
            ]
        );
    }

    fn arb_run() -> impl Strategy<Value = (Run, Vec<(SplitFields, u8)>)> {
        (any::<u32>(), 1u32..64, 0u64..1 << 40, 1usize..6).prop_flat_map(
            |(slab, len, offset, n)| {
                let splits = proptest::collection::vec(
                    (
                        any::<u64>(),
                        any::<u64>(),
                        any::<u32>(),
                        any::<u64>(),
                        any::<u8>(),
                    )
                        .prop_map(|(cookie, version, crc, tag, fill)| {
                            (
                                SplitFields {
                                    cookie,
                                    version,
                                    crc,
                                    tag,
                                },
                                fill,
                            )
                        }),
                    n,
                );
                splits.prop_map(move |s| (run(slab, len, offset, s.len() as u32), s))
            },
        )
    }

    proptest! {
        #[test]
        fn requests_round_trip(runs in proptest::collection::vec(arb_run(), 0..8), id: u64) {
            let buf = write_frame(&runs, id);
            let (h, body) = split(&buf);
            let Ok(Request::WriteV(parsed)) = parse_request(&h, body) else {
                return Err(TestCaseError::fail("WRITEV did not parse"));
            };
            prop_assert_eq!(parsed.len(), runs.len());
            for (got, (run, splits)) in parsed.iter().zip(&runs) {
                prop_assert_eq!(got.run, *run);
                for (i, (s, fill)) in splits.iter().enumerate() {
                    prop_assert_eq!(got.split(i), *s);
                    prop_assert!(got.split_data(i).iter().all(|b| b == fill));
                }
            }
            let reads: Vec<(Run, Vec<u64>)> = runs
                .iter()
                .map(|(r, s)| (*r, s.iter().map(|(f, _)| f.cookie).collect()))
                .collect();
            let buf = read_frame(&reads, id);
            let (h, body) = split(&buf);
            let Ok(Request::ReadV(parsed)) = parse_request(&h, body) else {
                return Err(TestCaseError::fail("READV did not parse"));
            };
            for (got, (run, cookies)) in parsed.iter().zip(&reads) {
                prop_assert_eq!(got.run, *run);
                prop_assert_eq!(&got.cookies().collect::<Vec<_>>(), cookies);
            }
        }

        #[test]
        fn read_replies_round_trip(runs in proptest::collection::vec((arb_run(), 0usize..Status::ALL.len()), 0..8), id: u64) {
            let h = Header { op: Op::ReadV, reply: false, status: Status::Ok, id, body_len: 0 };
            let mut out = Vec::new();
            let mut reply = ReadReply::begin(&mut out, &h);
            let mut want = Vec::new();
            for ((run, splits), st) in &runs {
                let status = Status::ALL[*st];
                let fields: Vec<SplitFields> = splits.iter().map(|(f, _)| *f).collect();
                let mut data = Vec::new();
                if status == Status::Ok {
                    for (f, fill) in splits {
                        data.extend(std::iter::repeat_n(*fill, run.split_len as usize));
                        want.push((status, *f, vec![*fill; run.split_len as usize]));
                    }
                } else {
                    for f in &fields {
                        want.push((status, *f, vec![]));
                    }
                }
                reply.put_run(&mut out, status, &fields, &data);
            }
            reply.finish(&mut out).unwrap();
            let (rh, rb) = split(&out);
            let mut got = Vec::new();
            parse_vectored_reply(&rh, rb, |st, s, d| got.push((st, s, d.to_vec()))).unwrap();
            prop_assert_eq!(got, want);
        }
    }
}
