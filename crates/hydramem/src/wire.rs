//! The memory-node wire protocol: every byte that crosses a connection between a client and a
//! memory node is defined here and nowhere else.
//!
//! A connection carries a stream of frames in both directions. Each frame is a fixed 20-byte
//! header followed by a body of `body_len` bytes. All integers are little-endian. Requests are
//! pipelined: a client sends many requests without waiting, and the node answers each with a
//! reply that carries the request's id and the request's op with the reply bit set. Replies to
//! the requests of one connection come back in request order (the node serves a connection
//! sequentially), but clients must not rely on it: they match replies by id and, inside vectored
//! replies, by the per-entry cookie.
//!
//! ## Frame header (20 bytes)
//!
//! | offset | size | field      | meaning                                                   |
//! |--------|------|------------|-----------------------------------------------------------|
//! | 0      | 4    | magic      | `48 59 44 4D` ("HYDM")                                    |
//! | 4      | 1    | version    | protocol version, currently 3; a mismatch closes the link |
//! | 5      | 1    | op         | operation (table below); bit 7 set on replies             |
//! | 6      | 2    | status     | 0 in requests; frame-level [`Status`] in replies          |
//! | 8      | 8    | request id | chosen by the client, echoed in the reply                 |
//! | 16     | 4    | body_len   | bytes that follow; at most [`MAX_BODY`]                   |
//!
//! ## Operations and bodies
//!
//! | op   | name    | request body                                   | reply body (status OK)                         |
//! |------|---------|------------------------------------------------|------------------------------------------------|
//! | 0x01 | HELLO   | client id (16), flags u32                      | node id u32, slab_size u64, capacity u64, max_body u32, incarnation u64 |
//! | 0x02 | PING    | empty                                          | empty, or a notice (8 bytes, see [`Notice`])   |
//! | 0x03 | ALLOC   | tag u64, split_len u32 (1..=64 KiB)            | slab u32                                       |
//! | 0x04 | FREE    | slab u32                                       | empty                                          |
//! | 0x05 | LIST    | empty                                          | count u32, count × (slab u32, tag u64,         |
//! |      |         |                                                | newest version u64) (see [`Listed`])           |
//! | 0x06 | STATS   | empty                                          | see [`Stats`]                                  |
//! | 0x10 | WRITEV  | count u32, count × (entry (36), then len bytes | count u32, count × (cookie u64, status u32,    |
//! |      |         | of data)                                       | version u64: the version stored now)           |
//! | 0x11 | READV   | count u32, count × entry (36)                  | count u32, count × (cookie u64, status u32,    |
//! |      |         |                                                | len u32, version u64, crc u32, then len bytes  |
//! |      |         |                                                | of data)                                       |
//! | 0x07 | REGEN   | see [`Regen`]                                  | pages rebuilt u64 (sent when the slab is done) |
//! | 0x08 | RECLAIMS| empty                                          | count u32, count × (slab u32, ms_left u32)     |
//! | 0x09 | DRAIN   | mode u32 (1 start, 0 cancel)                   | empty                                          |
//! | 0x0A | CORRUPT | count u32, count × (slab u32, splits u32,      | accepted u32 (records that named a slab of the |
//! |      |         | cause u8) (see [`CorruptReport`])              | caller; the rest count as unknown slab)        |
//! | 0x20 | FAULT   | kind u32, arg u64 (see [`Fault`])              | empty; FORBIDDEN unless the node allows faults |
//!
//! A vectored entry is 36 bytes:
//!
//! | offset | size | field   | meaning                                                        |
//! |--------|------|---------|----------------------------------------------------------------|
//! | 0      | 4    | slab    | slab id on the node                                            |
//! | 4      | 4    | len     | bytes of the split                                             |
//! | 8      | 8    | offset  | byte offset in the slab (a multiple of the slab's split length) |
//! | 16     | 8    | cookie  | opaque to the node, echoed in the reply entry                  |
//! | 24     | 8    | version | WRITEV: the page version of the split; READV: 0                |
//! | 32     | 4    | crc     | WRITEV: the split's checksum, stored beside the version; READV: 0 |
//!
//! The cookie lets the client land each split where it belongs without a lookup table (the
//! role a work-request id plays in RDMA). In a READV reply an entry that failed carries len 0
//! (and version and crc 0).
//!
//! **Checksums.** The node stores the 32-bit `crc` of every written split next to its version
//! and returns both with the split; it never computes or checks it on the data path. The client
//! that keeps checksums puts the CRC32C of the split bound to its page and version there (see
//! [`crate::integrity`]) and verifies it on every read; a client that does not sends 0. A slot
//! never written has version 0 and crc 0.
//!
//! **Versions.** A slab holds splits of one length, fixed at ALLOC (`split_len`); every access
//! is one whole split at a multiple of it. Next to each split the node keeps the version of the
//! page it belongs to (0 = never written). A WRITEV entry is applied only if its version is
//! newer than the stored one; an equal version is acknowledged without rewriting (a repeated
//! write), an older one is refused with [`Status::Stale`] and changes nothing. Every WRITEV
//! reply entry carries the version stored for the split after the request (the newer one that
//! refused it, for `Stale`), so that a client whose clock is behind what the node holds can
//! move past it and write again: a `Stale` entry is never an acknowledgement. Valid versions
//! are `1..=`[`MAX_VERSION`]; an entry with another version is refused with
//! [`Status::BadRequest`] (so no peer can pin a split at a version no later write can pass,
//! and versions never collide with the markers a regenerating node uses). LIST returns the
//! newest version held in each slab, from which a client that reattaches to its identity
//! seeds its version clock. A READV reply
//! returns each split with its stored version, so that a client never combines splits of
//! different writes of a page (docs/architecture.md, "Versions").
//! Entries and their data are interleaved in both directions so that a sender can append one
//! more entry to a frame it has already started: a client merges the splits that many threads
//! send to one node while a previous frame is still being written into one vectored frame.
//!
//! **Reclaims.** A node that needs memory back (its machine runs short of free memory, or an
//! operator drains it) marks slabs as *reclaimed* and tells their owners in the reply to their
//! next heartbeat (PING): the [`Notice`] counts the asking client's reclaimed slabs and says
//! whether the node takes new slabs at all. The owner asks RECLAIMS which slabs they are and how
//! long it has before the node drops them, regenerates each elsewhere and FREEs it. Until then a
//! reclaimed slab serves reads and writes as before.
//!
//! **Corruption reports.** Only a client can tell that a split is corrupt: the checksum binds
//! the client's page address and version, which the node never sees. A client that found
//! corrupted splits among a node's replies tells that node with CORRUPT, so that the node's
//! STATS, `hydramem status` and metrics show where corruption happens (see [`CorruptReport`]).
//!
//! Every request except HELLO, PING, STATS, FAULT and DRAIN requires a prior HELLO on the connection: the client id
//! given there is the identity that owns slabs. Slabs are visible only to the identity that
//! allocated them; the node answers [`Status::NoSuchSlab`] for a slab that does not exist and for
//! one that belongs to someone else alike, so ownership cannot be probed.
//!
//! A frame whose magic, version, op or length is wrong, or whose body does not parse, is a
//! protocol violation: the node logs the reason and closes that one connection.

use std::fmt;

/// The four magic bytes that open every frame.
pub const MAGIC: [u8; 4] = *b"HYDM";
/// The protocol version this build speaks.
pub const VERSION: u8 = 3;
/// Length of the fixed frame header.
pub const HEADER_LEN: usize = 20;
/// Largest body a peer may send: large enough for a vectored write of 512 pages, small enough
/// that a malicious length cannot make a node allocate much.
pub const MAX_BODY: usize = 4 << 20;
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
/// Bit set in the op byte of replies.
const REPLY_BIT: u8 = 0x80;

/// Errors found while parsing bytes received from a peer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    /// The first four bytes of a frame are not "HYDM".
    #[error("bad magic {0:02x?}: the peer does not speak the hydramem node protocol")]
    BadMagic([u8; 4]),
    /// The peer speaks another protocol version.
    #[error("protocol version {0} is not supported (this build speaks {VERSION}); run the same hydramem release on clients and nodes")]
    BadVersion(u8),
    /// The op byte names no known operation.
    #[error("unknown op 0x{0:02x}")]
    UnknownOp(u8),
    /// The status field of a reply names no known status.
    #[error("unknown status {0}")]
    UnknownStatus(u16),
    /// The declared body length exceeds [`MAX_BODY`].
    #[error("frame body of {0} bytes exceeds the maximum of {MAX_BODY}")]
    TooLarge(u64),
    /// A body ended before a field it must contain.
    #[error("frame body truncated: needed {needed} bytes at offset {at}, body has {len}")]
    Truncated {
        /// Offset at which the read started.
        at: usize,
        /// Bytes that were needed.
        needed: usize,
        /// Length of the body.
        len: usize,
    },
    /// A body had bytes left over after its last field.
    #[error("frame body has {0} trailing bytes")]
    Trailing(usize),
    /// A vectored request declares too many entries.
    #[error("vectored request with {0} entries exceeds the maximum of {MAX_ENTRIES}")]
    TooManyEntries(u32),
    /// A field holds a value that is never valid.
    #[error("invalid field: {0}")]
    Invalid(&'static str),
}

/// Operation codes (without the reply bit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Op {
    /// Identify the client; must precede slab operations.
    Hello = 0x01,
    /// Liveness probe.
    Ping = 0x02,
    /// Allocate a zeroed slab for the caller.
    Alloc = 0x03,
    /// Release one of the caller's slabs.
    Free = 0x04,
    /// List the caller's slabs with their tags.
    List = 0x05,
    /// Node-wide capacity, use and per-slab counters.
    Stats = 0x06,
    /// Rebuild one of the caller's slabs from its coding group's other slabs (see [`Regen`]).
    Regen = 0x07,
    /// The caller's slabs this node wants back, with the time left before it drops them.
    Reclaims = 0x08,
    /// Start (or cancel) draining the node: it takes no new slabs and reclaims all it holds.
    Drain = 0x09,
    /// Report corrupted splits the caller read from this node (see [`CorruptReport`]).
    Corrupt = 0x0A,
    /// Vectored write of splits.
    WriteV = 0x10,
    /// Vectored read of splits.
    ReadV = 0x11,
    /// Inject a fault (testing only; refused unless the node was started to allow it).
    Fault = 0x20,
}

impl Op {
    /// Every operation, for exhaustive tests.
    pub const ALL: [Op; 13] = [
        Op::Hello,
        Op::Ping,
        Op::Alloc,
        Op::Free,
        Op::List,
        Op::Stats,
        Op::WriteV,
        Op::ReadV,
        Op::Fault,
        Op::Regen,
        Op::Reclaims,
        Op::Drain,
        Op::Corrupt,
    ];

    fn from_u8(v: u8) -> Option<Op> {
        Op::ALL.into_iter().find(|op| *op as u8 == v)
    }
}

/// Frame- or entry-level outcome carried in replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// The request was well-formed but asked for something impossible (e.g. zero-length entry).
    BadRequest = 1,
    /// No such slab owned by the caller.
    NoSuchSlab = 2,
    /// Offset + length falls outside the slab.
    OutOfRange = 3,
    /// The node has no free capacity for another slab.
    NoCapacity = 4,
    /// A slab operation arrived before HELLO.
    NotIdentified = 5,
    /// The node failed internally (e.g. the kernel refused memory).
    Internal = 6,
    /// The request is not allowed on this node (fault injection on a production node).
    Forbidden = 7,
    /// A newer version of this split is already stored; nothing was written.
    Stale = 8,
}

impl Status {
    /// Every status, for exhaustive tests.
    pub const ALL: [Status; 9] = [
        Status::Ok,
        Status::BadRequest,
        Status::NoSuchSlab,
        Status::OutOfRange,
        Status::NoCapacity,
        Status::NotIdentified,
        Status::Internal,
        Status::Forbidden,
        Status::Stale,
    ];

    fn from_u16(v: u16) -> Option<Status> {
        Status::ALL.into_iter().find(|s| *s as u16 == v)
    }

    fn from_u32(v: u32) -> Result<Status, WireError> {
        u16::try_from(v)
            .ok()
            .and_then(Status::from_u16)
            .ok_or(WireError::UnknownStatus(v.min(u16::MAX as u32) as u16))
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Status::Ok => "ok",
            Status::BadRequest => "bad request",
            Status::NoSuchSlab => "no such slab for this client",
            Status::OutOfRange => "offset or length outside the slab",
            Status::NoCapacity => "node has no free capacity for another slab",
            Status::NotIdentified => "connection has not said HELLO",
            Status::Internal => "internal node error",
            Status::Forbidden => "not allowed on this node",
            Status::Stale => "a newer version of the split is stored",
        };
        f.write_str(s)
    }
}

/// A parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The operation.
    pub op: Op,
    /// Whether this frame is a reply.
    pub reply: bool,
    /// Frame-level status (always [`Status::Ok`] in requests).
    pub status: Status,
    /// Request id, echoed by replies.
    pub id: u64,
    /// Length of the body that follows.
    pub body_len: u32,
}

impl Header {
    /// Serializes the header into its 20 bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[5] = self.op as u8 | if self.reply { REPLY_BIT } else { 0 };
        b[6..8].copy_from_slice(&(self.status as u16).to_le_bytes());
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..20].copy_from_slice(&self.body_len.to_le_bytes());
        b
    }

    /// Parses and validates a header; the body length is checked against [`MAX_BODY`].
    pub fn parse(b: &[u8; HEADER_LEN]) -> Result<Header, WireError> {
        let magic: [u8; 4] = [b[0], b[1], b[2], b[3]];
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        if b[4] != VERSION {
            return Err(WireError::BadVersion(b[4]));
        }
        let op = Op::from_u8(b[5] & !REPLY_BIT).ok_or(WireError::UnknownOp(b[5]))?;
        let raw_status = u16::from_le_bytes([b[6], b[7]]);
        let status = Status::from_u16(raw_status).ok_or(WireError::UnknownStatus(raw_status))?;
        let body_len = u32::from_le_bytes([b[16], b[17], b[18], b[19]]);
        if body_len as usize > MAX_BODY {
            return Err(WireError::TooLarge(body_len as u64));
        }
        Ok(Header {
            op,
            reply: b[5] & REPLY_BIT != 0,
            status,
            id: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            body_len,
        })
    }
}

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

/// Builds one frame in a caller-owned buffer: header placeholder first, body appended, then
/// [`FrameBuilder::finish`] patches the length. Appending to a `Vec` whose capacity is already
/// large enough never allocates, which keeps the data path allocation-free.
pub struct FrameBuilder {
    start: usize,
}

impl FrameBuilder {
    /// Starts a frame at the end of `out`.
    pub fn begin(out: &mut Vec<u8>, op: Op, reply: bool, status: Status, id: u64) -> FrameBuilder {
        let start = out.len();
        let h = Header {
            op,
            reply,
            status,
            id,
            body_len: 0,
        };
        out.extend_from_slice(&h.encode());
        FrameBuilder { start }
    }

    /// Patches the body length into the header. Returns an error (and removes the partial
    /// frame) if the body grew beyond [`MAX_BODY`].
    pub fn finish(self, out: &mut Vec<u8>) -> Result<(), WireError> {
        let body = out.len() - self.start - HEADER_LEN;
        if body > MAX_BODY {
            out.truncate(self.start);
            return Err(WireError::TooLarge(body as u64));
        }
        out[self.start + 16..self.start + 20].copy_from_slice(&(body as u32).to_le_bytes());
        Ok(())
    }
}

/// A bounds-checked little-endian reader over a frame body.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Reads from the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }

    /// Takes the next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.buf.len() - self.pos < n {
            return Err(WireError::Truncated {
                at: self.pos,
                needed: n,
                len: self.buf.len(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// Reads a u32.
    pub fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.bytes(4)?.try_into().expect("4")))
    }

    /// Reads a u64.
    pub fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.bytes(8)?.try_into().expect("8")))
    }

    /// Reads an entry count and checks it against [`MAX_ENTRIES`].
    pub fn count(&mut self) -> Result<usize, WireError> {
        let n = self.u32()?;
        if n as usize > MAX_ENTRIES {
            return Err(WireError::TooManyEntries(n));
        }
        Ok(n as usize)
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Fails if any byte is left unread.
    pub fn end(&self) -> Result<(), WireError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(WireError::Trailing(n)),
        }
    }
}

/// The 128-bit identity of a client. It is the capability that owns slabs: whoever presents it
/// in HELLO reaches that client's slabs, so it is generated at random and kept secret by its
/// client (it is never shown in full; [`ClientId::fingerprint`] is what status displays).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ClientId(pub [u8; 16]);

impl ClientId {
    /// A fresh random identity.
    pub fn random() -> ClientId {
        ClientId(rand::random())
    }

    /// A short, non-secret label for logs and status (FNV-1a of the id).
    pub fn fingerprint(&self) -> u32 {
        let mut h: u32 = 0x811c_9dc5;
        for b in self.0 {
            h ^= b as u32;
            h = h.wrapping_mul(0x0100_0193);
        }
        h
    }

    /// Parses 32 hex digits.
    pub fn from_hex(s: &str) -> Result<ClientId, WireError> {
        let s = s.trim();
        if s.len() != 32 || !s.is_ascii() {
            return Err(WireError::Invalid("client id must be 32 hex digits"));
        }
        let mut out = [0u8; 16];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
                .map_err(|_| WireError::Invalid("client id must be 32 hex digits"))?;
        }
        Ok(ClientId(out))
    }

    /// The 32 hex digits of the id (secret: for the client's own identity file only).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "client-{:08x}", self.fingerprint())
    }
}

/// HELLO flag: the connection observes only (status tools); it may call PING, STATS and nothing
/// that touches slabs.
pub const HELLO_OBSERVER: u32 = 1;

/// HELLO request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The identity that will own slabs.
    pub client: ClientId,
    /// Bit set of `HELLO_*` flags.
    pub flags: u32,
}

impl Hello {
    /// Appends the body.
    pub fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.client.0);
        out.extend_from_slice(&self.flags.to_le_bytes());
    }
    /// Parses the body.
    pub fn parse(body: &[u8]) -> Result<Hello, WireError> {
        let mut r = Reader::new(body);
        let client = ClientId(r.bytes(16)?.try_into().expect("16"));
        let flags = r.u32()?;
        r.end()?;
        Ok(Hello { client, flags })
    }
}

/// HELLO reply body: what a client must know about the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloReply {
    /// The node's id as configured.
    pub node_id: u32,
    /// Size of every slab this node hands out.
    pub slab_size: u64,
    /// Bytes the node may donate in total.
    pub capacity: u64,
    /// Largest frame body the node accepts.
    pub max_body: u32,
    /// Random at every start of the node process: a client that reconnects and finds another
    /// value knows the node restarted and every slab it held there is gone.
    pub incarnation: u64,
}

impl HelloReply {
    /// Appends the body.
    pub fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.node_id.to_le_bytes());
        out.extend_from_slice(&self.slab_size.to_le_bytes());
        out.extend_from_slice(&self.capacity.to_le_bytes());
        out.extend_from_slice(&self.max_body.to_le_bytes());
        out.extend_from_slice(&self.incarnation.to_le_bytes());
    }
    /// Parses the body.
    pub fn parse(body: &[u8]) -> Result<HelloReply, WireError> {
        let mut r = Reader::new(body);
        let v = HelloReply {
            node_id: r.u32()?,
            slab_size: r.u64()?,
            capacity: r.u64()?,
            max_body: r.u32()?,
            incarnation: r.u64()?,
        };
        r.end()?;
        Ok(v)
    }
}

/// Counters of one slab, as reported by STATS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct SlabStats {
    /// Slab id.
    pub slab: u32,
    /// Fingerprint of the owning client ([`ClientId::fingerprint`]).
    pub owner: u32,
    /// Tag the client gave at allocation.
    pub tag: u64,
    /// Read entries served.
    pub reads: u64,
    /// Write entries served.
    pub writes: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Highest byte offset ever written + 1: the part of the slab that holds data.
    pub touched: u64,
    /// [`SLAB_RECLAIMED`] when the node wants the slab back.
    pub flags: u32,
    /// Recent accesses (decaying count per control period) the node ranks eviction by.
    pub activity: u64,
    /// Corrupted splits of this slab its owner reported (CORRUPT) since the slab was allocated.
    pub corrupt: u64,
}

/// [`SlabStats::flags`]: the node has asked the owner to move this slab away.
pub const SLAB_RECLAIMED: u32 = 1;

const SLAB_STATS_LEN: usize = 4 + 4 + 8 * 6 + 4 + 8 + 8;

/// STATS reply body: node-wide figures then one record per allocated slab.
///
/// | size | field |
/// |------|-------|
/// | 4    | node id |
/// | 8    | capacity (bytes the node may donate) |
/// | 8    | slab size |
/// | 8    | resident set size of the node process, bytes |
/// | 4    | connected clients |
/// | 4    | regenerations in progress on this node |
/// | 8    | pages rebuilt by regenerations since the node started |
/// | 8    | memory of the machine (or its cgroup limit), bytes, as last measured |
/// | 8    | of which available (free for use), bytes |
/// | 8    | headroom the node keeps free for local applications, bytes |
/// | 4    | slabs the node may hold now (its memory budget) |
/// | 4    | pre-allocated, unmapped slabs ready to hand out |
/// | 4    | draining (1) or not (0) |
/// | 4    | slabs reclaimed (owners asked to move them) and not yet gone |
/// | 8    | slabs moved away by their owners after a reclaim, since start |
/// | 8    | slabs dropped before their owner moved them (grace expired), since start |
/// | 8    | corrupted splits clients reported (CORRUPT) since start, all slabs (freed and unknown ones included) |
/// | 4    | count of slab records, then count × 76-byte records: slab u32, owner u32, tag u64, reads u64, writes u64, bytes_read u64, bytes_written u64, touched u64, flags u32, activity u64, corrupt u64 |
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct Stats {
    /// Node id.
    pub node_id: u32,
    /// Bytes the node may donate.
    pub capacity: u64,
    /// Slab size.
    pub slab_size: u64,
    /// Resident set size of the node process.
    pub rss: u64,
    /// Connections that have said HELLO as a client (not observers).
    pub clients: u32,
    /// Regenerations running on this node now.
    pub regenerating: u32,
    /// Pages rebuilt by regenerations since the node started.
    pub regen_pages: u64,
    /// Memory of the machine or its cgroup, as last measured.
    pub mem_total: u64,
    /// Of which available.
    pub mem_available: u64,
    /// Headroom kept free for local applications.
    pub headroom: u64,
    /// Slabs the node may hold now.
    pub budget_slabs: u32,
    /// Pre-allocated slabs ready to hand out.
    pub pool_slabs: u32,
    /// Whether the node is draining.
    pub draining: bool,
    /// Slabs reclaimed and not yet gone.
    pub reclaiming: u32,
    /// Slabs moved away by their owners after a reclaim.
    pub evicted_moved: u64,
    /// Slabs dropped when their grace period expired.
    pub evicted_forced: u64,
    /// Corrupted splits clients reported since the node started (the per-slab counts, plus
    /// those of slabs freed since and of reports that named no slab of their sender).
    pub corrupt_reported: u64,
    /// Every allocated slab.
    pub slabs: Vec<SlabStats>,
}

impl Stats {
    /// Bytes allocated to clients.
    pub fn used(&self) -> u64 {
        self.slabs.len() as u64 * self.slab_size
    }

    /// Appends the body.
    pub fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.node_id.to_le_bytes());
        out.extend_from_slice(&self.capacity.to_le_bytes());
        out.extend_from_slice(&self.slab_size.to_le_bytes());
        out.extend_from_slice(&self.rss.to_le_bytes());
        out.extend_from_slice(&self.clients.to_le_bytes());
        out.extend_from_slice(&self.regenerating.to_le_bytes());
        out.extend_from_slice(&self.regen_pages.to_le_bytes());
        for v in [self.mem_total, self.mem_available, self.headroom] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [
            self.budget_slabs,
            self.pool_slabs,
            self.draining as u32,
            self.reclaiming,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.evicted_moved.to_le_bytes());
        out.extend_from_slice(&self.evicted_forced.to_le_bytes());
        out.extend_from_slice(&self.corrupt_reported.to_le_bytes());
        out.extend_from_slice(&(self.slabs.len() as u32).to_le_bytes());
        for s in &self.slabs {
            out.extend_from_slice(&s.slab.to_le_bytes());
            out.extend_from_slice(&s.owner.to_le_bytes());
            for v in [
                s.tag,
                s.reads,
                s.writes,
                s.bytes_read,
                s.bytes_written,
                s.touched,
            ] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&s.flags.to_le_bytes());
            out.extend_from_slice(&s.activity.to_le_bytes());
            out.extend_from_slice(&s.corrupt.to_le_bytes());
        }
    }

    /// Parses the body.
    pub fn parse(body: &[u8]) -> Result<Stats, WireError> {
        let mut r = Reader::new(body);
        let node_id = r.u32()?;
        let capacity = r.u64()?;
        let slab_size = r.u64()?;
        let rss = r.u64()?;
        let clients = r.u32()?;
        let regenerating = r.u32()?;
        let regen_pages = r.u64()?;
        let mem_total = r.u64()?;
        let mem_available = r.u64()?;
        let headroom = r.u64()?;
        let budget_slabs = r.u32()?;
        let pool_slabs = r.u32()?;
        let draining = r.u32()? != 0;
        let reclaiming = r.u32()?;
        let evicted_moved = r.u64()?;
        let evicted_forced = r.u64()?;
        let corrupt_reported = r.u64()?;
        let n = r.u32()? as usize;
        if n > r.remaining() / SLAB_STATS_LEN {
            return Err(WireError::Invalid("slab count exceeds the body"));
        }
        let mut slabs = Vec::with_capacity(n);
        for _ in 0..n {
            slabs.push(SlabStats {
                slab: r.u32()?,
                owner: r.u32()?,
                tag: r.u64()?,
                reads: r.u64()?,
                writes: r.u64()?,
                bytes_read: r.u64()?,
                bytes_written: r.u64()?,
                touched: r.u64()?,
                flags: r.u32()?,
                activity: r.u64()?,
                corrupt: r.u64()?,
            });
        }
        r.end()?;
        Ok(Stats {
            node_id,
            capacity,
            slab_size,
            rss,
            clients,
            regenerating,
            regen_pages,
            mem_total,
            mem_available,
            headroom,
            budget_slabs,
            pool_slabs,
            draining,
            reclaiming,
            evicted_moved,
            evicted_forced,
            corrupt_reported,
            slabs,
        })
    }
}

/// What a node tells a client in the reply to its heartbeat (PING): how many of the client's
/// slabs it has reclaimed, whether it takes new slabs, and how many slabs it holds for all
/// clients (so that placement sees other clients' allocations within a heartbeat, instead of
/// every client placing on the loads it saw at connect). An empty PING reply (an observer
/// connection, or an older node) means "nothing reclaimed, accepting, load unknown".
///
/// | size | field |
/// |------|-------|
/// | 4    | word: bits 0–30 slabs of the asking client the node has reclaimed; bit 31 = the node refuses new slabs (draining, or out of memory budget) |
/// | 4    | slabs the node holds, for all clients (`u32::MAX`: not reported) |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Notice {
    /// Reclaimed slabs of the asking client.
    pub reclaimed: u32,
    /// The node refuses new slabs.
    pub refusing: bool,
    /// Slabs the node holds (`None`: not reported).
    pub slabs: Option<u32>,
}

const NOTICE_REFUSING: u32 = 1 << 31;

impl Notice {
    /// The notice as one u64, exactly the 8 body bytes read little-endian (word in the low
    /// half, slab count in the high half), for lock-free storage.
    pub fn encode(self) -> u64 {
        let w = self.reclaimed.min(NOTICE_REFUSING - 1)
            | if self.refusing { NOTICE_REFUSING } else { 0 };
        u64::from(w) | u64::from(self.slabs.unwrap_or(u32::MAX)) << 32
    }

    /// Decodes [`Notice::encode`].
    pub fn decode(v: u64) -> Notice {
        let w = v as u32;
        let slabs = (v >> 32) as u32;
        Notice {
            reclaimed: w & !NOTICE_REFUSING,
            refusing: w & NOTICE_REFUSING != 0,
            slabs: (slabs != u32::MAX).then_some(slabs),
        }
    }

    /// Appends the PING reply body.
    pub fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.encode().to_le_bytes());
    }

    /// Decodes a PING reply body (empty = nothing to say).
    pub fn parse(body: &[u8]) -> Result<Notice, WireError> {
        if body.is_empty() {
            return Ok(Notice::default());
        }
        let mut r = Reader::new(body);
        let v = r.u64()?;
        r.end()?;
        Ok(Notice::decode(v))
    }
}

/// One reclaimed slab in a RECLAIMS reply: the slab and the milliseconds left before the node
/// drops it whether or not it was moved (`u32::MAX`: no deadline, the node waits — a drain).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reclaim {
    /// The slab.
    pub slab: u32,
    /// Milliseconds left.
    pub ms_left: u32,
}

/// Appends a RECLAIMS reply body.
pub fn put_reclaims(out: &mut Vec<u8>, list: &[Reclaim]) {
    out.extend_from_slice(&(list.len() as u32).to_le_bytes());
    for c in list {
        out.extend_from_slice(&c.slab.to_le_bytes());
        out.extend_from_slice(&c.ms_left.to_le_bytes());
    }
}

/// Parses a RECLAIMS reply body.
pub fn parse_reclaims(body: &[u8]) -> Result<Vec<Reclaim>, WireError> {
    let mut r = Reader::new(body);
    let n = r.u32()? as usize;
    if n > r.remaining() / 8 {
        return Err(WireError::Invalid("reclaim count exceeds the body"));
    }
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(Reclaim {
            slab: r.u32()?,
            ms_left: r.u32()?,
        });
    }
    r.end()?;
    Ok(v)
}

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
    fn get(r: &mut Reader<'a>) -> Result<CorruptList<'a>, WireError> {
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

/// One slab in a LIST reply.
///
/// | size | field |
/// |------|-------|
/// | 4    | slab id |
/// | 8    | tag given at ALLOC |
/// | 8    | the newest version stored in any split of the slab (0: none written) |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listed {
    /// The slab id.
    pub slab: u32,
    /// The tag given at ALLOC.
    pub tag: u64,
    /// The newest version stored in the slab (0 when nothing was written).
    pub newest: u64,
}

/// Length of one [`Listed`] record.
const LISTED_LEN: usize = 20;

/// Parses a LIST reply body.
pub fn parse_list(body: &[u8]) -> Result<Vec<Listed>, WireError> {
    let mut r = Reader::new(body);
    let n = r.u32()? as usize;
    if n > r.remaining() / LISTED_LEN {
        return Err(WireError::Invalid("slab count exceeds the body"));
    }
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(Listed {
            slab: r.u32()?,
            tag: r.u64()?,
            newest: r.u64()?,
        });
    }
    r.end()?;
    Ok(v)
}

/// Appends a LIST reply body.
pub fn put_list(out: &mut Vec<u8>, slabs: &[Listed]) {
    out.extend_from_slice(&(slabs.len() as u32).to_le_bytes());
    for l in slabs {
        out.extend_from_slice(&l.slab.to_le_bytes());
        out.extend_from_slice(&l.tag.to_le_bytes());
        out.extend_from_slice(&l.newest.to_le_bytes());
    }
}

/// Appends a FREE request body: the slab.
pub fn put_free(out: &mut Vec<u8>, slab: u32) {
    out.extend_from_slice(&slab.to_le_bytes());
}

/// Appends a DRAIN request body: start (`true`) or cancel.
pub fn put_drain(out: &mut Vec<u8>, start: bool) {
    out.extend_from_slice(&u32::from(start).to_le_bytes());
}

/// Parses a REGEN reply body: the pages rebuilt.
pub fn parse_regen_reply(body: &[u8]) -> Result<u64, WireError> {
    let mut r = Reader::new(body);
    let pages = r.u64()?;
    r.end()?;
    Ok(pages)
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

/// One surviving split of a coding group, as a REGEN request names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegenSource {
    /// The split's index in the group (0..k data, k..k+r parity).
    pub split: u8,
    /// The source holds the very bytes the target must get (the slab being moved away, or
    /// another replica): copy it instead of decoding from k splits.
    pub copy: bool,
    /// Its slab on that node.
    pub slab: u32,
    /// The node, by its id in the cluster file; the regenerating node looks its address up in
    /// its own copy of the membership and never connects anywhere a request names.
    pub node: u32,
}

/// Most splits a coding group has (k + r, or the copies of a replicated page): REGEN names at
/// most this many sources.
pub const MAX_GROUP: usize = 32;

/// REGEN request: rebuild split `target` of a coding group into the caller's slab `slab` on
/// this node, reading the surviving splits from their nodes with the caller's identity
/// (paper 4.2: the new node regenerates the slab itself). The node replies when the slab is
/// done, with the number of pages rebuilt; the caller sends it on a connection of its own.
///
/// | size | field |
/// |------|-------|
/// | 16   | client id (the identity that owns every slab named here) |
/// | 1, 1 | k, r |
/// | 1    | target split index |
/// | 1    | flags: bit 0 = the client keeps checksums (verify the sources', store the target's) |
/// | 4    | split_len |
/// | 4    | target slab on this node |
/// | 8    | pages (split slots) to rebuild |
/// | 8    | the address range of the group, which checksums bind |
/// | 4    | count of sources (at most k + r, at most [`MAX_GROUP`]), then count × (split u8, flags u8 (bit 0: copy source), reserved u16 = 0, slab u32, node id u32) |
///
/// k ≥ 1, k + r ≤ [`MAX_GROUP`], target < k + r and every source's split < k + r, or the body
/// is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Regen {
    /// The owner of the slabs.
    pub client: ClientId,
    /// Data splits.
    pub k: u8,
    /// Parity splits.
    pub r: u8,
    /// The split to rebuild.
    pub target: u8,
    /// Bytes per split.
    pub split_len: u32,
    /// The slab on this node to fill.
    pub slab: u32,
    /// Split slots to rebuild.
    pub pages: u64,
    /// The client's address range of the group (see [`crate::integrity`]).
    pub range: u64,
    /// The client keeps per-split checksums: sources are verified and rebuilt splits get theirs.
    pub checksums: bool,
    /// The surviving splits.
    pub sources: Vec<RegenSource>,
}

impl Regen {
    /// Appends the body.
    pub fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.client.0);
        out.extend_from_slice(&[self.k, self.r, self.target, self.checksums as u8]);
        out.extend_from_slice(&self.split_len.to_le_bytes());
        out.extend_from_slice(&self.slab.to_le_bytes());
        out.extend_from_slice(&self.pages.to_le_bytes());
        out.extend_from_slice(&self.range.to_le_bytes());
        out.extend_from_slice(&(self.sources.len() as u32).to_le_bytes());
        for s in &self.sources {
            out.extend_from_slice(&[s.split, s.copy as u8, 0, 0]);
            out.extend_from_slice(&s.slab.to_le_bytes());
            out.extend_from_slice(&s.node.to_le_bytes());
        }
    }

    /// Parses the body.
    pub fn parse(body: &[u8]) -> Result<Regen, WireError> {
        let mut r = Reader::new(body);
        let client = ClientId(r.bytes(16)?.try_into().expect("16"));
        let b = r.bytes(4)?;
        let (k, rr, target) = (b[0], b[1], b[2]);
        if b[3] > 1 {
            return Err(WireError::Invalid("REGEN has unknown flags"));
        }
        let checksums = b[3] == 1;
        let split_len = r.u32()?;
        let slab = r.u32()?;
        let pages = r.u64()?;
        let range = r.u64()?;
        let n = r.u32()? as usize;
        if n > MAX_GROUP {
            return Err(WireError::Invalid("REGEN names more sources than k + r"));
        }
        let mut sources = Vec::with_capacity(n);
        for _ in 0..n {
            let b = r.bytes(4)?;
            if b[1] > 1 || b[2] != 0 || b[3] != 0 {
                return Err(WireError::Invalid("REGEN source has unknown flags"));
            }
            sources.push(RegenSource {
                split: b[0],
                copy: b[1] == 1,
                slab: r.u32()?,
                node: r.u32()?,
            });
        }
        r.end()?;
        let req = Regen {
            client,
            k,
            r: rr,
            target,
            split_len,
            slab,
            pages,
            range,
            checksums,
            sources,
        };
        req.check_shape()?;
        Ok(req)
    }

    /// The shape every REGEN must have, whoever built it: k >= 1, k + r <= [`MAX_GROUP`], the
    /// target and every source's split inside the group, at most k + r sources.
    pub fn check_shape(&self) -> Result<(), WireError> {
        let width = self.k as usize + self.r as usize;
        if self.k == 0 || width > MAX_GROUP || self.target as usize >= width {
            return Err(WireError::Invalid(
                "REGEN needs k >= 1, k + r <= 32 and a target split inside the group",
            ));
        }
        if self.sources.len() > width {
            return Err(WireError::Invalid("REGEN names more sources than k + r"));
        }
        if self.sources.iter().any(|s| s.split as usize >= width) {
            return Err(WireError::Invalid(
                "REGEN source names a split outside the group",
            ));
        }
        Ok(())
    }
}

/// A fault a test asks a node to inject (FAULT request). Nodes refuse them with
/// [`Status::Forbidden`] unless started with `--allow-fault-injection`.
///
/// | kind | fault           | arg                                         |
/// |------|-----------------|---------------------------------------------|
/// | 0    | Clear           | 0                                           |
/// | 1    | DelayReplies    | microseconds                                |
/// | 2    | StopAnswering   | 0                                           |
/// | 3    | DropConnections | 0                                           |
/// | 4    | RefuseAlloc     | 0                                           |
/// | 5    | Crash           | 0                                           |
/// | 6    | MemoryTotal     | bytes                                       |
/// | 7    | MemoryAvailable | bytes                                       |
/// | 8    | CorruptSlab     | slab id                                     |
/// | 9    | CorruptWrites   | a [`Corruption`] (rate, optional slab)      |
/// | 10   | CorruptReplies  | a [`Corruption`]                            |
/// | 11   | MisdirectReads  | a [`Corruption`]                            |
///
/// `Clear` ends every fault, the corruptions included (a corruption already stored stays).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Remove every injected fault.
    Clear,
    /// Hold every reply (on every connection) this many microseconds before sending it.
    DelayReplies(u64),
    /// Stop answering: requests are read but not served until `Clear` (the connections stay
    /// open, as with a process that hangs).
    StopAnswering,
    /// Close every connection except the one that asked.
    DropConnections,
    /// Refuse every ALLOC as if the node were full.
    RefuseAlloc,
    /// Abort the node process at once.
    Crash,
    /// Simulate a machine with this much memory (bytes; 0 = measure the real one again).
    MemoryTotal(u64),
    /// Simulate this much memory available if the node held no slabs (bytes; the node takes
    /// its own slabs off it; `u64::MAX` = measure the real machine again).
    MemoryAvailable(u64),
    /// Flip one random bit in every written split of this slab (any owner's), once: memory
    /// corrupted at rest. Answered [`Status::NoSuchSlab`] if the slab does not exist.
    CorruptSlab(u32),
    /// After storing a written split, flip one random bit of the stored copy, at a rate.
    CorruptWrites(Corruption),
    /// Flip one random bit in the data of a READV reply entry, at a rate; the stored split
    /// is untouched (corruption on the wire).
    CorruptReplies(Corruption),
    /// Answer a READV entry with the data (and checksum) of the neighbouring slot of the same
    /// slab, under the requested slot's version, at a rate: a split of the wrong page whose
    /// metadata looks right (a misaddressed read).
    MisdirectReads(Corruption),
}

/// Which accesses an injected corruption hits: a rate in parts per million, optionally only
/// on one slab. On the wire (the FAULT `arg`): bits 0–30 the rate (at most 1 000 000), bit 31
/// set when the corruption is limited to one slab, bits 32–63 that slab. A rate of 0 turns
/// the corruption off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Corruption {
    /// Accesses hit per million.
    pub ppm: u32,
    /// Only this slab (`None`: every slab).
    pub slab: Option<u32>,
}

/// The largest corruption rate: every access.
pub const PPM_ALL: u32 = 1_000_000;
const CORRUPTION_ONE_SLAB: u64 = 1 << 31;

impl Corruption {
    /// Every access of every slab.
    pub const ALWAYS: Corruption = Corruption {
        ppm: PPM_ALL,
        slab: None,
    };

    /// The FAULT argument.
    pub fn encode(self) -> u64 {
        u64::from(self.ppm.min(PPM_ALL))
            | self
                .slab
                .map_or(0, |s| CORRUPTION_ONE_SLAB | u64::from(s) << 32)
    }

    /// Decodes [`Corruption::encode`]; refuses rates above one million and stray bits.
    pub fn decode(arg: u64) -> Result<Corruption, WireError> {
        let ppm = (arg & (CORRUPTION_ONE_SLAB - 1)) as u32;
        if ppm > PPM_ALL {
            return Err(WireError::Invalid(
                "corruption rate above 1000000 per million",
            ));
        }
        let slab = (arg >> 32) as u32;
        match arg & CORRUPTION_ONE_SLAB != 0 {
            true => Ok(Corruption {
                ppm,
                slab: Some(slab),
            }),
            false if slab == 0 => Ok(Corruption { ppm, slab: None }),
            false => Err(WireError::Invalid(
                "corruption names a slab without its flag",
            )),
        }
    }

    /// Whether this access of `slab` is hit (`draw`: a uniform random number below one
    /// million).
    pub fn hits(self, slab: u32, draw: u32) -> bool {
        self.ppm > draw && self.slab.is_none_or(|s| s == slab)
    }
}

impl Fault {
    /// Appends the FAULT request body.
    pub fn put(&self, out: &mut Vec<u8>) {
        let (kind, arg) = match *self {
            Fault::Clear => (0u32, 0u64),
            Fault::DelayReplies(us) => (1, us),
            Fault::StopAnswering => (2, 0),
            Fault::DropConnections => (3, 0),
            Fault::RefuseAlloc => (4, 0),
            Fault::Crash => (5, 0),
            Fault::MemoryTotal(b) => (6, b),
            Fault::MemoryAvailable(b) => (7, b),
            Fault::CorruptSlab(slab) => (8, u64::from(slab)),
            Fault::CorruptWrites(c) => (9, c.encode()),
            Fault::CorruptReplies(c) => (10, c.encode()),
            Fault::MisdirectReads(c) => (11, c.encode()),
        };
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&arg.to_le_bytes());
    }

    /// Parses a FAULT request body.
    pub fn parse(body: &[u8]) -> Result<Fault, WireError> {
        let mut r = Reader::new(body);
        let kind = r.u32()?;
        let arg = r.u64()?;
        r.end()?;
        if matches!(kind, 0 | 2..=5) && arg != 0 {
            return Err(WireError::Invalid("this fault kind takes no argument (0)"));
        }
        Ok(match kind {
            0 => Fault::Clear,
            1 => Fault::DelayReplies(arg),
            2 => Fault::StopAnswering,
            3 => Fault::DropConnections,
            4 => Fault::RefuseAlloc,
            5 => Fault::Crash,
            6 => Fault::MemoryTotal(arg),
            7 => Fault::MemoryAvailable(arg),
            8 => Fault::CorruptSlab(
                u32::try_from(arg).map_err(|_| WireError::Invalid("slab id above u32"))?,
            ),
            9 => Fault::CorruptWrites(Corruption::decode(arg)?),
            10 => Fault::CorruptReplies(Corruption::decode(arg)?),
            11 => Fault::MisdirectReads(Corruption::decode(arg)?),
            _ => return Err(WireError::Invalid("unknown fault kind")),
        })
    }
}

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

/// The entries of a vectored request, still in wire form (decoded lazily, no allocation).
#[derive(Debug, Clone, Copy)]
pub struct EntryList<'a> {
    raw: &'a [u8],
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
    raw: &'a [u8],
    count: usize,
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
            let start = r.pos;
            for _ in 0..n {
                let e = Entry::get(&mut r)?;
                r.bytes(e.len as usize)?;
            }
            Request::WriteV(WriteList {
                raw: &body[start..r.pos],
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
    use proptest::prelude::*;

    fn frame(op: Op, id: u64, body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut out = Vec::new();
        let fb = FrameBuilder::begin(&mut out, op, false, Status::Ok, id);
        body(&mut out);
        fb.finish(&mut out).unwrap();
        out
    }

    fn split(buf: &[u8]) -> (Header, &[u8]) {
        let h = Header::parse(buf[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(h.body_len as usize, buf.len() - HEADER_LEN);
        (h, &buf[HEADER_LEN..])
    }

    #[test]
    fn header_layout_matches_the_byte_table() {
        let h = Header {
            op: Op::ReadV,
            reply: true,
            status: Status::NoSuchSlab,
            id: 0x0102_0304_0506_0708,
            body_len: 0x0A0B,
        };
        let b = h.encode();
        assert_eq!(&b[0..4], b"HYDM");
        assert_eq!(b[4], 3);
        assert_eq!(b[5], 0x91);
        assert_eq!(&b[6..8], &[2, 0]);
        assert_eq!(&b[8..16], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&b[16..20], &[0x0B, 0x0A, 0, 0]);
        assert_eq!(Header::parse(&b).unwrap(), h);
    }

    #[test]
    fn bad_headers_are_rejected_with_reasons() {
        let good = Header {
            op: Op::Ping,
            reply: false,
            status: Status::Ok,
            id: 1,
            body_len: 0,
        }
        .encode();
        let mut b = good;
        b[0] = b'X';
        assert!(matches!(Header::parse(&b), Err(WireError::BadMagic(_))));
        let mut b = good;
        b[4] = 9;
        assert_eq!(Header::parse(&b), Err(WireError::BadVersion(9)));
        let mut b = good;
        b[5] = 0x7f;
        assert_eq!(Header::parse(&b), Err(WireError::UnknownOp(0x7f)));
        let mut b = good;
        b[16..20].copy_from_slice(&(MAX_BODY as u32 + 1).to_le_bytes());
        assert!(matches!(Header::parse(&b), Err(WireError::TooLarge(_))));
    }

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

    #[test]
    fn list_records_carry_the_newest_version_per_the_table() {
        let l = Listed {
            slab: 7,
            tag: 0x11,
            newest: 0x99,
        };
        let mut out = Vec::new();
        put_list(&mut out, &[l, l]);
        assert_eq!(out.len(), 4 + 2 * LISTED_LEN);
        assert_eq!((out[0], out[4], out[8], out[16]), (2, 7, 0x11, 0x99));
        assert_eq!(parse_list(&out).unwrap(), vec![l, l]);
        assert!(parse_list(&out[..out.len() - 1]).is_err());
    }

    #[test]
    fn free_drain_and_regen_reply_bodies_match_the_byte_table() {
        let parse = |op, put: &dyn Fn(&mut Vec<u8>)| {
            let f = frame(op, 1, put);
            let (h, body) = split(&f);
            assert_eq!(body.len(), 4);
            format!("{:?}", parse_request(&h, body).unwrap())
        };
        assert_eq!(parse(Op::Free, &|o| put_free(o, 7)), "Free { slab: 7 }");
        assert_eq!(parse(Op::Drain, &|o| put_drain(o, true)), "Drain(true)");
        assert_eq!(parse(Op::Drain, &|o| put_drain(o, false)), "Drain(false)");
        assert_eq!(
            parse_regen_reply(&[5, 0, 0, 0, 0, 0, 0, 1]),
            Ok(5 | 1 << 56)
        );
        assert!(parse_regen_reply(&[5, 0, 0, 0]).is_err());
        assert_eq!(parse_regen_reply(&[0; 9]), Err(WireError::Trailing(1)));
    }

    #[test]
    fn client_id_hex_round_trip() {
        let id = ClientId::random();
        assert_eq!(ClientId::from_hex(&id.to_hex()).unwrap(), id);
        assert!(ClientId::from_hex("xyz").is_err());
        assert!(ClientId::from_hex(&"é".repeat(16)).is_err());
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
        fn header_round_trips(op in 0usize..Op::ALL.len(), reply: bool, st in 0usize..9, id: u64, len in 0u32..=MAX_BODY as u32) {
            let h = Header { op: Op::ALL[op], reply, status: Status::ALL[st], id, body_len: len };
            prop_assert_eq!(Header::parse(&h.encode()).unwrap(), h);
        }

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
        fn stats_round_trip(node_id: u32, capacity: u64, rss: u64, n in 0usize..20, seed: u64) {
            let slabs = (0..n).map(|i| SlabStats { slab: i as u32, owner: seed as u32, tag: seed ^ i as u64, reads: i as u64, writes: 2, bytes_read: 3, bytes_written: 4, touched: 5, flags: (i % 2) as u32, activity: seed >> 3, corrupt: seed.rotate_left(i as u32) }).collect();
            let s = Stats { node_id, capacity, slab_size: 1 << 20, rss, clients: 3, regenerating: 1, regen_pages: seed, mem_total: seed ^ 7, mem_available: rss, headroom: capacity, budget_slabs: n as u32, pool_slabs: 2, draining: seed % 2 == 0, reclaiming: 4, evicted_moved: 5, evicted_forced: 6, corrupt_reported: !seed, slabs };
            let mut out = Vec::new();
            s.put(&mut out);
            prop_assert_eq!(Stats::parse(&out).unwrap(), s);
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

        #[test]
        fn notices_round_trip(reclaimed in 0u32..(1 << 31), refusing: bool, slabs in proptest::option::of(0u32..u32::MAX)) {
            let n = Notice { reclaimed, refusing, slabs };
            let mut out = Vec::new();
            n.put(&mut out);
            prop_assert_eq!(Notice::parse(&out).unwrap(), n);
        }

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

        #[test]
        fn reclaims_round_trip(list in proptest::collection::vec((any::<u32>(), any::<u32>()), 0..50)) {
            let list: Vec<Reclaim> = list.into_iter().map(|(slab, ms_left)| Reclaim { slab, ms_left }).collect();
            let mut out = Vec::new();
            put_reclaims(&mut out, &list);
            prop_assert_eq!(parse_reclaims(&out).unwrap(), list);
        }
    }

    #[test]
    fn faults_round_trip_and_bad_corruption_args_are_refused() {
        let one = Corruption {
            ppm: 250,
            slab: Some(7),
        };
        for f in [
            Fault::Clear,
            Fault::DelayReplies(9),
            Fault::MemoryAvailable(u64::MAX),
            Fault::CorruptSlab(u32::MAX),
            Fault::CorruptWrites(Corruption::ALWAYS),
            Fault::CorruptReplies(one),
            Fault::MisdirectReads(Corruption { ppm: 0, slab: None }),
        ] {
            let mut out = Vec::new();
            f.put(&mut out);
            assert_eq!(Fault::parse(&out).unwrap(), f);
        }
        // kind 10, rate 250 on slab 7: bit 31 flags the slab in the high word.
        let mut out = Vec::new();
        Fault::CorruptReplies(one).put(&mut out);
        assert_eq!(out, [10, 0, 0, 0, 250, 0, 0, 0x80, 7, 0, 0, 0]);
        for (kind, bad) in [
            (9u32, PPM_ALL as u64 + 1),
            (10, 7 << 32),
            (11, 1 << 30),
            (0, 1),
        ] {
            let mut out = kind.to_le_bytes().to_vec();
            out.extend_from_slice(&bad.to_le_bytes());
            assert!(
                Fault::parse(&out).is_err(),
                "kind {kind} arg {bad:#x} accepted"
            );
        }
        assert!(one.hits(7, 249) && !one.hits(7, 250) && !one.hits(8, 0));
        assert!(Corruption::ALWAYS.hits(3, PPM_ALL - 1));
    }

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

    #[test]
    fn notice_and_drain_bodies_match_the_tables() {
        assert_eq!(Notice::parse(&[]).unwrap(), Notice::default());
        let n = Notice {
            reclaimed: 3,
            refusing: true,
            slabs: Some(5),
        };
        let mut out = Vec::new();
        n.put(&mut out);
        assert_eq!(out, [3, 0, 0, 0x80, 5, 0, 0, 0]);
        assert!(Notice::parse(&[1, 2, 3, 4]).is_err());
        for (mode, want) in [(1u32, Some(true)), (0, Some(false)), (2, None)] {
            let buf = frame(Op::Drain, 4, |o| o.extend_from_slice(&mode.to_le_bytes()));
            let (h, body) = split(&buf);
            match (parse_request(&h, body), want) {
                (Ok(Request::Drain(d)), Some(w)) => assert_eq!(d, w),
                (Err(_), None) => {}
                (other, _) => panic!("DRAIN {mode} parsed as {other:?}"),
            }
        }
    }

    #[test]
    fn regen_copy_flag_round_trips_and_unknown_flags_are_refused() {
        let req = Regen {
            client: ClientId::random(),
            k: 1,
            r: 1,
            target: 1,
            split_len: 4096,
            slab: 9,
            pages: 16,
            range: 5,
            checksums: true,
            sources: vec![RegenSource {
                split: 1,
                copy: true,
                slab: 3,
                node: 4,
            }],
        };
        let mut out = Vec::new();
        req.put(&mut out);
        assert_eq!(Regen::parse(&out).unwrap(), req);
        // At most k + r sources, each inside the group, and a group of at most 32.
        let mut more = req.clone();
        more.sources = vec![more.sources[0].clone(); 3];
        let mut body = Vec::new();
        more.put(&mut body);
        assert!(Regen::parse(&body).is_err(), "3 sources for k + r = 2");
        more.sources.truncate(1);
        more.sources[0].split = 2;
        body.clear();
        more.put(&mut body);
        assert!(
            Regen::parse(&body).is_err(),
            "source split outside the group"
        );
        let mut wide = req.clone();
        (wide.k, wide.r) = (30, 3);
        body.clear();
        wide.put(&mut body);
        assert!(Regen::parse(&body).is_err(), "k + r = 33");
        // flags byte of the first source: after 16 + 4 + 4 + 4 + 8 + 8 + 4 bytes and the split.
        let mut bad = out.clone();
        bad[16 + 4 + 4 + 4 + 8 + 8 + 4 + 1] = 2;
        assert!(Regen::parse(&bad).is_err());
        // The request's own flags byte.
        out[19] = 3;
        assert!(Regen::parse(&out).is_err());
    }
}
