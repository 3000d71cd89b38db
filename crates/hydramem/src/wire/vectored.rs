//! WRITEV and READV: vectored entries, their reply entries, and the lists a node parses.
//!
//! Invariants: an [`EntryList`] or [`WriteList`] was checked at parse time to hold exactly the
//! entries (and, for writes, the data) its count declares, so iterating it cannot fail.

use super::{Header, Op, Reader, Status, WireError};

/// Most entries one vectored request may carry.
pub const MAX_ENTRIES: usize = 8192;
/// Length of one vectored entry on the wire.
pub const ENTRY_LEN: usize = 36;
/// The largest valid split version (versions are `1..=MAX_VERSION`; 0 means never written).
/// Wall-clock nanoseconds stay below it until the year 2262.
pub const MAX_VERSION: u64 = (1 << 63) - 1;
/// The longest split a slab may hold (ALLOC refuses more): far above any scheme's split (at
/// most a 4096-byte page), far below what one reply frame carries.
pub const MAX_SPLIT_LEN: u32 = 64 << 10;
/// Length of a WRITEV reply entry: cookie u64, status u32, stored version u64.
pub const WRITE_REPLY_LEN: usize = 20;

/// One split addressed by a vectored request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Entry {
    /// Slab id on the node.
    pub slab: u32,
    /// Bytes to transfer.
    pub len: u32,
    /// Byte offset inside the slab.
    pub offset: u64,
    /// Opaque to the node; echoed in the reply entry.
    pub cookie: u64,
    /// WRITEV: the version of the page this split belongs to (0 in READV).
    pub version: u64,
    /// WRITEV: the split's checksum, stored with it (0 in READV, and from clients without
    /// checksums).
    pub crc: u32,
}

impl Entry {
    /// Appends the entry's 36 bytes to `out`.
    pub fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.slab.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.cookie.to_le_bytes());
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.crc.to_le_bytes());
    }

    /// Reads one entry.
    pub fn get(r: &mut Reader<'_>) -> Result<Entry, WireError> {
        Ok(Entry {
            slab: r.u32()?,
            len: r.u32()?,
            offset: r.u64()?,
            cookie: r.u64()?,
            version: r.u64()?,
            crc: r.u32()?,
        })
    }
}

/// Length of a READV reply entry header: cookie u64, status u32, len u32, version u64, crc u32.
pub const READ_REPLY_LEN: usize = 28;

/// One reply entry of a WRITEV or READV as parsed by a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyEntry {
    /// The cookie of the request entry.
    pub cookie: u64,
    /// Its outcome.
    pub status: Status,
    /// Data bytes that follow (READV only).
    pub len: u32,
    /// Version stored with the split: READV, the version of the data; WRITEV, the version
    /// stored after the write (the newer one that refused it, for [`Status::Stale`]).
    pub version: u64,
    /// Checksum stored with the split (READV only).
    pub crc: u32,
}

impl ReplyEntry {
    /// Appends a WRITEV reply entry ([`WRITE_REPLY_LEN`] bytes): the cookie, the outcome and
    /// the version stored for the split now (0 when the entry named no split it could read).
    pub fn put_write(out: &mut Vec<u8>, cookie: u64, status: Status, stored: u64) {
        out.extend_from_slice(&cookie.to_le_bytes());
        out.extend_from_slice(&(status as u32).to_le_bytes());
        out.extend_from_slice(&stored.to_le_bytes());
    }
    /// Parses a WRITEV reply entry.
    pub fn get_write(r: &mut Reader<'_>) -> Result<ReplyEntry, WireError> {
        Ok(ReplyEntry {
            cookie: r.u64()?,
            status: Status::from_u32(r.u32()?)?,
            len: 0,
            version: r.u64()?,
            crc: 0,
        })
    }
    /// Appends a READV reply entry header ([`READ_REPLY_LEN`] bytes); the caller appends `len`
    /// data bytes.
    pub fn put_read(
        out: &mut Vec<u8>,
        cookie: u64,
        status: Status,
        len: u32,
        version: u64,
        crc: u32,
    ) {
        out.extend_from_slice(&cookie.to_le_bytes());
        out.extend_from_slice(&(status as u32).to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&crc.to_le_bytes());
    }
    /// Appends a successful READV reply entry of `len` data bytes, zeroed, and returns them
    /// for the caller to fill in place (one copy from the slab into the reply); its version
    /// and checksum are set afterwards with [`ReplyEntry::stamp_read`].
    pub fn begin_read(out: &mut Vec<u8>, cookie: u64, len: u32) -> &mut [u8] {
        ReplyEntry::put_read(out, cookie, Status::Ok, len, 0, 0);
        let start = out.len();
        out.resize(start + len as usize, 0);
        &mut out[start..]
    }

    /// Sets version and checksum of the READV reply entry that `entry` starts with (as
    /// appended by [`ReplyEntry::begin_read`]).
    pub fn stamp_read(entry: &mut [u8], version: u64, crc: u32) {
        entry[16..24].copy_from_slice(&version.to_le_bytes());
        entry[24..28].copy_from_slice(&crc.to_le_bytes());
    }

    /// Parses a READV reply entry header; the data follows in the reader.
    pub fn get_read(r: &mut Reader<'_>) -> Result<ReplyEntry, WireError> {
        let e = ReplyEntry {
            cookie: r.u64()?,
            status: Status::from_u32(r.u32()?)?,
            len: r.u32()?,
            version: r.u64()?,
            crc: r.u32()?,
        };
        if e.status != Status::Ok && e.len != 0 {
            return Err(WireError::Invalid("failed read entry carries data"));
        }
        Ok(e)
    }
}

/// Parses the body of a WRITEV or READV reply with status OK, calling
/// `f(cookie, status, version, crc, data)` for every entry in order (`data` is empty for
/// writes and for failed reads; for writes `version` is the version stored now and crc is 0).
/// Stops at the first malformed entry; entries before it have been delivered.
pub fn parse_vectored_reply<'a>(
    h: &Header,
    body: &'a [u8],
    mut f: impl FnMut(u64, Status, u64, u32, &'a [u8]),
) -> Result<(), WireError> {
    if !h.reply {
        return Err(WireError::Invalid("expected a reply frame"));
    }
    if h.status != Status::Ok {
        return Err(WireError::Invalid("vectored request refused as a whole"));
    }
    let mut r = Reader::new(body);
    let n = r.count()?;
    match h.op {
        Op::WriteV => {
            for _ in 0..n {
                let e = ReplyEntry::get_write(&mut r)?;
                f(e.cookie, e.status, e.version, 0, &[]);
            }
        }
        Op::ReadV => {
            for _ in 0..n {
                let e = ReplyEntry::get_read(&mut r)?;
                f(
                    e.cookie,
                    e.status,
                    e.version,
                    e.crc,
                    r.bytes(e.len as usize)?,
                );
            }
        }
        _ => return Err(WireError::Invalid("not a vectored op")),
    }
    r.end()
}

/// The entries of a vectored request, still in wire form (decoded lazily, no allocation).
#[derive(Debug, Clone, Copy)]
pub struct EntryList<'a> {
    pub(super) raw: &'a [u8],
}

impl<'a> EntryList<'a> {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.raw.len() / ENTRY_LEN
    }
    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }
    /// Iterates the entries.
    pub fn iter(&self) -> impl Iterator<Item = Entry> + 'a {
        self.raw.chunks_exact(ENTRY_LEN).map(|c| {
            let mut r = Reader::new(c);
            Entry::get(&mut r).expect("chunk holds exactly one entry")
        })
    }
}

/// The entries of a WRITEV, each followed by its data, validated at parse time.
#[derive(Debug, Clone, Copy)]
pub struct WriteList<'a> {
    pub(super) raw: &'a [u8],
    pub(super) count: usize,
}

impl<'a> WriteList<'a> {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.count
    }
    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    /// Total data bytes.
    pub fn data_len(&self) -> usize {
        self.raw.len() - self.count * ENTRY_LEN
    }
    /// Iterates (entry, data) pairs.
    pub fn iter(&self) -> impl Iterator<Item = (Entry, &'a [u8])> + 'a {
        let mut r = Reader::new(self.raw);
        (0..self.count).map(move |_| {
            let e = Entry::get(&mut r).expect("validated at parse time");
            let d = r.bytes(e.len as usize).expect("validated at parse time");
            (e, d)
        })
    }
}
