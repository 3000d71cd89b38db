//! Frames: the 20-byte header every message starts with, its ops and statuses, the errors a
//! parser reports, and the two tools every body is built and read with ([`FrameBuilder`],
//! [`Reader`]).
//!
//! Invariants: a header that parses has the magic, this build's version, a known op and
//! status, and a body length of at most [`MAX_BODY`]; a [`Reader`] never reads past its
//! buffer; [`FrameBuilder::finish`] never leaves a frame longer than [`MAX_BODY`] behind.

#[cfg(doc)]
use super::{CorruptReport, Regen};
use std::fmt;

use super::MAX_ENTRIES;

/// The four magic bytes that open every frame.
pub const MAGIC: [u8; 4] = *b"HYDM";
/// The protocol version this build speaks.
pub const VERSION: u8 = 8;
/// Length of the fixed frame header.
pub const HEADER_LEN: usize = 20;
/// Largest body a peer may send: large enough for a vectored write of 512 pages, small enough
/// that a malicious length cannot make a node allocate much.
pub const MAX_BODY: usize = 4 << 20;
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
    /// Give back the memory of a stretch of one of the caller's slabs' split slots: their
    /// bytes read as zeros and their versions as never written afterwards.
    Discard = 0x0B,
    /// The versions and tags stored in a stretch of one of the caller's slabs' split slots,
    /// without their data: what a client that reattaches to its identity rebuilds its span
    /// page map from.
    Stamps = 0x0C,
    /// Vectored write of splits.
    WriteV = 0x10,
    /// Vectored read of splits.
    ReadV = 0x11,
    /// The client's proof of the cluster key, after a HELLO whose reply asked for it
    /// (see [`crate::auth`]).
    Auth = 0x0D,
    /// Inject a fault (testing only; refused unless the node was started to allow it).
    Fault = 0x20,
}

impl Op {
    /// Every operation, for exhaustive tests.
    pub const ALL: [Op; 16] = [
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
        Op::Discard,
        Op::Stamps,
        Op::Auth,
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
    /// A slab operation arrived before HELLO (or, on a node with a cluster key, before AUTH).
    NotIdentified = 5,
    /// The node failed internally (e.g. the kernel refused memory).
    Internal = 6,
    /// The request is not allowed on this node (fault injection on a production node).
    Forbidden = 7,
    /// A newer version of this split is already stored; nothing was written.
    Stale = 8,
    /// AUTH's proof is wrong, or the request needs a credential the connection did not
    /// prove (an operator's, for DRAIN and FAULT); the node closes the connection after an
    /// AUTH refused.
    Unauthenticated = 9,
    /// The caller's identity already holds as many slabs on this node as its quota allows.
    OverQuota = 10,
    /// HELLO named an identity that another process holds on this node (its connections are
    /// open); the node closes the connection.
    IdentityInUse = 11,
}

impl Status {
    /// Every status, for exhaustive tests.
    pub const ALL: [Status; 12] = [
        Status::Ok,
        Status::BadRequest,
        Status::NoSuchSlab,
        Status::OutOfRange,
        Status::NoCapacity,
        Status::NotIdentified,
        Status::Internal,
        Status::Forbidden,
        Status::Stale,
        Status::Unauthenticated,
        Status::OverQuota,
        Status::IdentityInUse,
    ];

    fn from_u16(v: u16) -> Option<Status> {
        Status::ALL.into_iter().find(|s| *s as u16 == v)
    }

    pub(super) fn from_u32(v: u32) -> Result<Status, WireError> {
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
            Status::Unauthenticated => {
                "not authenticated: the cluster key's proof is missing or wrong, or the request \
                 needs an operator's credential"
            }
            Status::OverQuota => {
                "this identity holds as many slabs (or connections) on the node as its quota \
                 allows"
            }
            Status::IdentityInUse => {
                "this identity is in use by another process, whose connections to the node are \
                 open (a node lets go of a vanished machine's connections within 30 s)"
            }
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

    /// Sets the body length of the frame that `frame` starts with (a header already
    /// encoded), for a sender that appends to a frame after beginning it.
    pub fn patch_body_len(frame: &mut [u8], body_len: u32) {
        frame[16..20].copy_from_slice(&body_len.to_le_bytes());
    }

    /// Checks the four bytes a frame opens with, so that a reader can turn away a peer that
    /// speaks another protocol before it waits for a whole header.
    pub fn check_magic(b: &[u8; 4]) -> Result<(), WireError> {
        match *b == MAGIC {
            true => Ok(()),
            false => Err(WireError::BadMagic(*b)),
        }
    }

    /// Parses and validates a header; the body length is checked against [`MAX_BODY`].
    pub fn parse(b: &[u8; HEADER_LEN]) -> Result<Header, WireError> {
        Header::check_magic(b[..4].try_into().expect("4 bytes"))?;
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
        Header::patch_body_len(&mut out[self.start..], body as u32);
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

    /// Offset of the next byte to read.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// The bytes read so far.
    pub fn consumed(&self) -> &'a [u8] {
        &self.buf[..self.pos]
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
        assert_eq!(b[4], 8);
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

    proptest! {
        #[test]
        fn header_round_trips(op in 0usize..Op::ALL.len(), reply: bool, st in 0usize..9, id: u64, len in 0u32..=MAX_BODY as u32) {
            let h = Header { op: Op::ALL[op], reply, status: Status::ALL[st], id, body_len: len };
            prop_assert_eq!(Header::parse(&h.encode()).unwrap(), h);
        }
    }
}
