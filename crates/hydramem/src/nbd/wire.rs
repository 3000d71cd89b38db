//! The NBD wire format: every byte of the Network Block Device protocol that this server reads
//! or writes is defined here and nowhere else, as pure functions over byte slices (no I/O), so
//! that framing can be tested exhaustively and a malformed message is an error, never a panic.
//!
//! All integers are **big-endian** (network byte order), as the upstream protocol document
//! (`doc/proto.md` of the NetworkBlockDevice project) specifies. Only the fixed newstyle
//! handshake is spoken (oldstyle is not). TLS is STARTTLS's: NBD_OPT_STARTTLS answered
//! `REP_ACK`, then a TLS handshake on the same socket, then option haggling goes on inside TLS
//! (with TLS required, other options before it get `REP_ERR_TLS_REQD`).
//!
//! ## Handshake (server greeting, client flags)
//!
//! | dir | size | field                                                          |
//! |-----|------|----------------------------------------------------------------|
//! | S   | 8    | `NBDMAGIC` `4e 42 44 4d 41 47 49 43`                           |
//! | S   | 8    | `IHAVEOPT` `49 48 41 56 45 4f 50 54`                           |
//! | S   | 2    | handshake flags: bit 0 FIXED_NEWSTYLE, bit 1 NO_ZEROES         |
//! | C   | 4    | client flags: bit 0 C_FIXED_NEWSTYLE, bit 1 C_NO_ZEROES        |
//!
//! ## Option request (client → server, 16 bytes + data)
//!
//! | offset | size | field                               |
//! |--------|------|-------------------------------------|
//! | 0      | 8    | magic `IHAVEOPT`                    |
//! | 8      | 4    | option (`OPT_*`)                    |
//! | 12     | 4    | length of the option data           |
//! | 16     | len  | option data                         |
//!
//! `NBD_OPT_INFO`/`NBD_OPT_GO` data: name length u32, name, count u16, count × info type u16.
//!
//! ## Option reply (server → client, 20 bytes + data)
//!
//! | offset | size | field                                                      |
//! |--------|------|------------------------------------------------------------|
//! | 0      | 8    | magic `00 03 e8 89 04 55 65 a9`                            |
//! | 8      | 4    | the option replied to                                      |
//! | 12     | 4    | reply type (`REP_*`; bit 31 set for errors)                |
//! | 16     | 4    | length of the reply data                                   |
//! | 20     | len  | data: `REP_SERVER` name length u32 + name; `REP_INFO` type |
//! |        |      | u16 + payload; errors a message string                     |
//!
//! `NBD_INFO_EXPORT` payload: size u64, transmission flags u16 (length 12 with the type).
//! `NBD_INFO_BLOCK_SIZE` payload: minimum u32, preferred u32, maximum payload u32 (length 14).
//! `NBD_OPT_EXPORT_NAME` is answered without a reply header: size u64, transmission flags u16,
//! then 124 zero bytes unless both sides set NO_ZEROES.
//!
//! ## Request (client → server, 28 bytes + payload of a WRITE)
//!
//! | offset | size | field                                                  |
//! |--------|------|--------------------------------------------------------|
//! | 0      | 4    | magic `25 60 95 13`                                    |
//! | 4      | 2    | command flags (`CMD_FLAG_*`)                           |
//! | 6      | 2    | type (`CMD_*`)                                         |
//! | 8      | 8    | cookie, echoed in the reply                            |
//! | 16     | 8    | offset                                                 |
//! | 24     | 4    | length                                                 |
//!
//! ## Simple reply (server → client, 16 bytes + data of a successful READ)
//!
//! | offset | size | field                            |
//! |--------|------|----------------------------------|
//! | 0      | 4    | magic `67 44 66 98`              |
//! | 4      | 4    | error (`E*`, 0 on success)       |
//! | 8      | 8    | cookie                           |
//!
//! ## Structured reply chunk (server → client, 20 bytes + payload)
//!
//! | offset | size | field                                                        |
//! |--------|------|--------------------------------------------------------------|
//! | 0      | 4    | magic `66 8e 33 ef`                                          |
//! | 4      | 2    | flags: bit 0 DONE (the last chunk of the reply)              |
//! | 6      | 2    | type: 0 NONE, 1 OFFSET_DATA (offset u64 + data), 32769 ERROR |
//! |        |      | (error u32, message length u16, message)                     |
//! | 8      | 8    | cookie                                                       |
//! | 16     | 4    | payload length                                               |

use std::fmt;

/// "NBDMAGIC": the first 8 bytes a server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": the newstyle magic, also opening every option request.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of every transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flag: the server speaks fixed newstyle.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Handshake flag: the server can omit the 124 zero bytes after `NBD_OPT_EXPORT_NAME`.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flag: the client speaks fixed newstyle.
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: omit the 124 zero bytes.
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flag: must always be set.
pub const TFLAG_HAS_FLAGS: u16 = 1 << 0;
/// Transmission flag: the export is read-only.
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
/// Transmission flag: `NBD_CMD_FLUSH` is supported.
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
/// Transmission flag: `NBD_CMD_FLAG_FUA` is supported.
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
/// Transmission flag: the medium is rotational.
pub const TFLAG_ROTATIONAL: u16 = 1 << 4;
/// Transmission flag: `NBD_CMD_TRIM` is supported.
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
/// Transmission flag: `NBD_CMD_WRITE_ZEROES` (and `NO_HOLE`) is supported.
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// Transmission flag: `NBD_CMD_FLAG_DF` is supported (only with structured replies).
pub const TFLAG_SEND_DF: u16 = 1 << 7;
/// Transmission flag: FLUSH and FUA take effect across every connection to the export.
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;

/// Option: choose an export and enter transmission (no error channel).
pub const OPT_EXPORT_NAME: u32 = 1;
/// Option: end the session.
pub const OPT_ABORT: u32 = 2;
/// Option: list the exports.
pub const OPT_LIST: u32 = 3;
/// Option: upgrade to TLS (not supported).
pub const OPT_STARTTLS: u32 = 5;
/// Option: describe an export.
pub const OPT_INFO: u32 = 6;
/// Option: describe an export and enter transmission.
pub const OPT_GO: u32 = 7;
/// Option: use structured replies in transmission.
pub const OPT_STRUCTURED_REPLY: u32 = 8;

/// Option reply: success, end of the option's replies.
pub const REP_ACK: u32 = 1;
/// Option reply: one export of a LIST.
pub const REP_SERVER: u32 = 2;
/// Option reply: one item of information of INFO/GO.
pub const REP_INFO: u32 = 3;
/// Option error: unknown option.
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
/// Option error: known option, invalid data.
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
/// Option error: the platform cannot do this (TLS).
pub const REP_ERR_PLATFORM: u32 = (1 << 31) + 4;
/// Option error: the server requires TLS first (NBD_OPT_STARTTLS).
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
/// Option error: no such export.
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
/// Option error: the server is shutting down.
pub const REP_ERR_SHUTDOWN: u32 = (1 << 31) + 7;
/// Option error: the option's data is too large.
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

/// Information type: size and transmission flags (mandatory on success).
pub const INFO_EXPORT: u16 = 0;
/// Information type: the canonical export name.
pub const INFO_NAME: u16 = 1;
/// Information type: a human-readable description.
pub const INFO_DESCRIPTION: u16 = 2;
/// Information type: block size constraints.
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Command: read.
pub const CMD_READ: u16 = 0;
/// Command: write (the request carries the payload).
pub const CMD_WRITE: u16 = 1;
/// Command: soft disconnect.
pub const CMD_DISC: u16 = 2;
/// Command: make completed writes durable.
pub const CMD_FLUSH: u16 = 3;
/// Command: discard a region (its contents become unspecified).
pub const CMD_TRIM: u16 = 4;
/// Command: write zeroes to a region.
pub const CMD_WRITE_ZEROES: u16 = 6;

/// Command flag: force unit access (reply only once durable).
pub const CMD_FLAG_FUA: u16 = 1 << 0;
/// Command flag: WRITE_ZEROES must not leave a hole.
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
/// Command flag: READ must be answered in one content chunk.
pub const CMD_FLAG_DF: u16 = 1 << 2;

/// Structured reply flag: the last chunk of this reply.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
/// Chunk type: no payload (success of a command without data).
pub const REPLY_TYPE_NONE: u16 = 0;
/// Chunk type: offset u64 + data.
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// Chunk type: error u32, message length u16, message.
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

/// Error: input/output error (the remote memory failed the operation).
pub const EIO: u32 = 5;
/// Error: invalid argument (out of range, unknown command or flag, oversized request).
pub const EINVAL: u32 = 22;
/// Error: the server is shutting down.
pub const ESHUTDOWN: u32 = 108;

/// Length of the server greeting.
pub const GREETING_LEN: usize = 18;
/// Length of an option request header.
pub const OPTION_HEADER_LEN: usize = 16;
/// Length of a transmission request header.
pub const REQUEST_LEN: usize = 28;
/// Length of a simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Length of a structured reply chunk header.
pub const CHUNK_HEADER_LEN: usize = 20;
/// Longest string (export name, message) the protocol allows.
pub const MAX_STRING: usize = 4096;
/// Bytes of zero padding after the `NBD_OPT_EXPORT_NAME` reply, unless NO_ZEROES.
pub const EXPORT_NAME_PADDING: usize = 124;

/// A message from a client that is not valid NBD: the connection that sent it is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A magic number is not the one the protocol puts there.
    #[error("bad {what} magic {found:#x}: the peer does not speak NBD (or lost framing)")]
    BadMagic {
        /// Which message.
        what: &'static str,
        /// What was found.
        found: u64,
    },
    /// A message is shorter than its fixed fields.
    #[error("{what} truncated: {needed} bytes needed, {got} present")]
    Truncated {
        /// Which message.
        what: &'static str,
        /// Bytes needed.
        needed: usize,
        /// Bytes present.
        got: usize,
    },
    /// A field holds a value the protocol forbids.
    #[error("invalid {0}")]
    Invalid(&'static str),
}

/// Reads a big-endian integer of `N` bytes at `at`, or reports `what` as truncated.
fn be<const N: usize>(b: &[u8], at: usize, what: &'static str) -> Result<[u8; N], WireError> {
    b.get(at..at + N)
        .and_then(|s| s.try_into().ok())
        .ok_or(WireError::Truncated {
            what,
            needed: at + N,
            got: b.len(),
        })
}

/// The server's first message: both magics and the handshake flags.
pub fn greeting() -> [u8; GREETING_LEN] {
    let mut g = [0u8; GREETING_LEN];
    g[..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    g[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    g[16..].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    g
}

/// What the client's flags allow, or why they end the session (unknown bits must close it).
pub fn parse_client_flags(b: [u8; 4]) -> Result<ClientFlags, WireError> {
    let f = u32::from_be_bytes(b);
    if f & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(WireError::Invalid("client flags (unknown bits set)"));
    }
    if f & FLAG_C_FIXED_NEWSTYLE == 0 {
        return Err(WireError::Invalid(
            "client flags (fixed newstyle not set; this server speaks only fixed newstyle)",
        ));
    }
    Ok(ClientFlags {
        no_zeroes: f & FLAG_C_NO_ZEROES != 0,
    })
}

/// The client's handshake flags that change what the server sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientFlags {
    /// Omit the 124 zero bytes after `NBD_OPT_EXPORT_NAME`.
    pub no_zeroes: bool,
}

/// The fixed part of an option request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    /// The option (`OPT_*`).
    pub option: u32,
    /// Bytes of option data that follow.
    pub len: u32,
}

impl OptionHeader {
    /// Parses the 16-byte header; a wrong magic means the client lost framing.
    pub fn parse(b: &[u8; OPTION_HEADER_LEN]) -> Result<OptionHeader, WireError> {
        let magic = u64::from_be_bytes(be(b, 0, "option header")?);
        if magic != IHAVEOPT {
            return Err(WireError::BadMagic {
                what: "option",
                found: magic,
            });
        }
        Ok(OptionHeader {
            option: u32::from_be_bytes(be(b, 8, "option header")?),
            len: u32::from_be_bytes(be(b, 12, "option header")?),
        })
    }

    /// Encodes the header (for tests and clients).
    pub fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&IHAVEOPT.to_be_bytes());
        out.extend_from_slice(&self.option.to_be_bytes());
        out.extend_from_slice(&self.len.to_be_bytes());
    }
}

/// Appends an option error reply (`reply` is a `REP_ERR_*`) whose data is `message`, cut to
/// [`MAX_STRING`] bytes on a character boundary: the protocol's limit for every string, which a
/// message quoting what the client sent could otherwise pass.
pub fn put_option_error(out: &mut Vec<u8>, option: u32, reply: u32, message: &str) {
    put_option_reply(
        out,
        option,
        reply,
        truncate_str(message, MAX_STRING).as_bytes(),
    );
}

/// Appends an option reply with its data.
pub fn put_option_reply(out: &mut Vec<u8>, option: u32, reply: u32, data: &[u8]) {
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

/// The data of an `NBD_OPT_INFO` or `NBD_OPT_GO` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    /// The export asked for ("" is the default export).
    pub name: String,
    /// Information types asked for, in the client's order.
    pub infos: Vec<u16>,
}

impl InfoRequest {
    /// Parses the option data; its lengths must add up exactly.
    pub fn parse(data: &[u8]) -> Result<InfoRequest, WireError> {
        let what = "INFO/GO option data";
        let name_len = u32::from_be_bytes(be(data, 0, what)?) as usize;
        if name_len > MAX_STRING || name_len > data.len().saturating_sub(6) {
            return Err(WireError::Invalid("INFO/GO export name length"));
        }
        let name = std::str::from_utf8(&data[4..4 + name_len])
            .map_err(|_| WireError::Invalid("INFO/GO export name (not UTF-8)"))?
            .to_string();
        let at = 4 + name_len;
        let count = u16::from_be_bytes(be(data, at, what)?) as usize;
        if data.len() != at + 2 + 2 * count {
            return Err(WireError::Invalid("INFO/GO information request count"));
        }
        let infos = (0..count)
            .map(|i| u16::from_be_bytes([data[at + 2 + 2 * i], data[at + 3 + 2 * i]]))
            .collect();
        Ok(InfoRequest { name, infos })
    }

    /// Encodes the option data (for tests and clients).
    pub fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.name.len() as u32).to_be_bytes());
        out.extend_from_slice(self.name.as_bytes());
        out.extend_from_slice(&(self.infos.len() as u16).to_be_bytes());
        for i in &self.infos {
            out.extend_from_slice(&i.to_be_bytes());
        }
    }
}

/// `NBD_INFO_EXPORT` as the data of an `NBD_REP_INFO`.
pub fn info_export(size: u64, flags: u16) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[..2].copy_from_slice(&INFO_EXPORT.to_be_bytes());
    b[2..10].copy_from_slice(&size.to_be_bytes());
    b[10..].copy_from_slice(&flags.to_be_bytes());
    b
}

/// `NBD_INFO_BLOCK_SIZE` as the data of an `NBD_REP_INFO`.
pub fn info_block_size(min: u32, preferred: u32, max: u32) -> [u8; 14] {
    let mut b = [0u8; 14];
    b[..2].copy_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    b[2..6].copy_from_slice(&min.to_be_bytes());
    b[6..10].copy_from_slice(&preferred.to_be_bytes());
    b[10..].copy_from_slice(&max.to_be_bytes());
    b
}

/// `NBD_INFO_NAME` or `NBD_INFO_DESCRIPTION` (`kind`) as the data of an `NBD_REP_INFO`.
pub fn info_string(kind: u16, s: &str) -> Vec<u8> {
    let mut b = kind.to_be_bytes().to_vec();
    b.extend_from_slice(truncate_str(s, MAX_STRING).as_bytes());
    b
}

/// The data of an `NBD_REP_SERVER` (one export of a LIST): name length, name, description.
pub fn rep_server(name: &str, description: &str) -> Vec<u8> {
    let mut b = (name.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(truncate_str(description, MAX_STRING).as_bytes());
    b
}

/// The reply to `NBD_OPT_EXPORT_NAME`: size, flags, and the padding unless NO_ZEROES.
pub fn export_name_reply(size: u64, flags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut b = Vec::with_capacity(10 + EXPORT_NAME_PADDING);
    b.extend_from_slice(&size.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    if !no_zeroes {
        b.resize(10 + EXPORT_NAME_PADDING, 0);
    }
    b
}

/// A transmission request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Command flags (`CMD_FLAG_*`).
    pub flags: u16,
    /// Command type (`CMD_*`; unknown ones are answered EINVAL).
    pub kind: u16,
    /// Opaque value echoed in the reply.
    pub cookie: u64,
    /// Byte offset in the export.
    pub offset: u64,
    /// Byte length (of the payload, for a WRITE).
    pub len: u32,
}

impl Request {
    /// Parses the 28-byte header; a wrong magic means the client lost framing.
    pub fn parse(b: &[u8; REQUEST_LEN]) -> Result<Request, WireError> {
        let what = "request";
        let magic = u32::from_be_bytes(be(b, 0, what)?);
        if magic != REQUEST_MAGIC {
            return Err(WireError::BadMagic {
                what,
                found: magic as u64,
            });
        }
        Ok(Request {
            flags: u16::from_be_bytes(be(b, 4, what)?),
            kind: u16::from_be_bytes(be(b, 6, what)?),
            cookie: u64::from_be_bytes(be(b, 8, what)?),
            offset: u64::from_be_bytes(be(b, 16, what)?),
            len: u32::from_be_bytes(be(b, 24, what)?),
        })
    }

    /// Encodes the header (for tests and clients).
    pub fn to_bytes(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Bytes of payload that follow this header on the wire.
    pub fn payload_len(&self) -> u32 {
        if self.kind == CMD_WRITE {
            self.len
        } else {
            0
        }
    }
}

/// The name of a command type, for logs and metrics.
pub fn command_name(kind: u16) -> &'static str {
    match kind {
        CMD_READ => "read",
        CMD_WRITE => "write",
        CMD_DISC => "disc",
        CMD_FLUSH => "flush",
        CMD_TRIM => "trim",
        CMD_WRITE_ZEROES => "write_zeroes",
        _ => "other",
    }
}

/// A simple reply header.
pub fn simple_reply(error: u32, cookie: u64) -> [u8; SIMPLE_REPLY_LEN] {
    let mut b = [0u8; SIMPLE_REPLY_LEN];
    b[..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// A structured reply chunk header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    /// `REPLY_FLAG_*`.
    pub flags: u16,
    /// `REPLY_TYPE_*`.
    pub kind: u16,
    /// The request's cookie.
    pub cookie: u64,
    /// Payload bytes that follow.
    pub len: u32,
}

impl ChunkHeader {
    /// Encodes the header.
    pub fn to_bytes(&self) -> [u8; CHUNK_HEADER_LEN] {
        let mut b = [0u8; CHUNK_HEADER_LEN];
        b[..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Parses a header (for tests and clients).
    pub fn parse(b: &[u8; CHUNK_HEADER_LEN]) -> Result<ChunkHeader, WireError> {
        let what = "structured reply";
        let magic = u32::from_be_bytes(be(b, 0, what)?);
        if magic != STRUCTURED_REPLY_MAGIC {
            return Err(WireError::BadMagic {
                what,
                found: magic as u64,
            });
        }
        Ok(ChunkHeader {
            flags: u16::from_be_bytes(be(b, 4, what)?),
            kind: u16::from_be_bytes(be(b, 6, what)?),
            cookie: u64::from_be_bytes(be(b, 8, what)?),
            len: u32::from_be_bytes(be(b, 16, what)?),
        })
    }
}

/// The header and offset field of the single, final `OFFSET_DATA` chunk answering a read of
/// `len` bytes at `offset`; the data follows on the wire.
pub fn read_chunk_prefix(cookie: u64, offset: u64, len: u32) -> [u8; CHUNK_HEADER_LEN + 8] {
    let mut b = [0u8; CHUNK_HEADER_LEN + 8];
    b[..CHUNK_HEADER_LEN].copy_from_slice(
        &ChunkHeader {
            flags: REPLY_FLAG_DONE,
            kind: REPLY_TYPE_OFFSET_DATA,
            cookie,
            len: len + 8,
        }
        .to_bytes(),
    );
    b[CHUNK_HEADER_LEN..].copy_from_slice(&offset.to_be_bytes());
    b
}

/// The final `NONE` chunk: success of a command without data.
pub fn done_chunk(cookie: u64) -> [u8; CHUNK_HEADER_LEN] {
    ChunkHeader {
        flags: REPLY_FLAG_DONE,
        kind: REPLY_TYPE_NONE,
        cookie,
        len: 0,
    }
    .to_bytes()
}

/// The final `ERROR` chunk with a human-readable message (cut to the protocol's limit).
pub fn error_chunk(cookie: u64, error: u32, message: &str) -> Vec<u8> {
    let msg = truncate_str(message, MAX_STRING).as_bytes();
    let mut b = Vec::with_capacity(CHUNK_HEADER_LEN + 6 + msg.len());
    b.extend_from_slice(
        &ChunkHeader {
            flags: REPLY_FLAG_DONE,
            kind: REPLY_TYPE_ERROR,
            cookie,
            len: 6 + msg.len() as u32,
        }
        .to_bytes(),
    );
    b.extend_from_slice(&error.to_be_bytes());
    b.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    b.extend_from_slice(msg);
    b
}

/// `s` cut to at most `max` bytes on a character boundary.
fn truncate_str(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// An option code by name, for logs.
pub struct OptionName(pub u32);

impl fmt::Display for OptionName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            OPT_EXPORT_NAME => f.write_str("EXPORT_NAME"),
            OPT_ABORT => f.write_str("ABORT"),
            OPT_LIST => f.write_str("LIST"),
            OPT_STARTTLS => f.write_str("STARTTLS"),
            OPT_INFO => f.write_str("INFO"),
            OPT_GO => f.write_str("GO"),
            OPT_STRUCTURED_REPLY => f.write_str("STRUCTURED_REPLY"),
            o => write!(f, "option {o}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn greeting_bytes() {
        let g = greeting();
        assert_eq!(&g[..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(&g[16..], &[0, 3]);
    }

    #[test]
    fn client_flags() {
        assert_eq!(
            parse_client_flags([0, 0, 0, 3]),
            Ok(ClientFlags { no_zeroes: true })
        );
        assert_eq!(
            parse_client_flags([0, 0, 0, 1]),
            Ok(ClientFlags { no_zeroes: false })
        );
        assert!(parse_client_flags([0, 0, 0, 0]).is_err());
        assert!(parse_client_flags([0, 0, 0, 5]).is_err());
        assert!(parse_client_flags([0x80, 0, 0, 1]).is_err());
    }

    #[test]
    fn request_bytes_match_the_table() {
        let r = Request {
            flags: CMD_FLAG_FUA,
            kind: CMD_WRITE,
            cookie: 0x0102_0304_0506_0708,
            offset: 0x1000,
            len: 512,
        };
        let b = r.to_bytes();
        assert_eq!(
            b,
            [
                0x25, 0x60, 0x95, 0x13, 0, 1, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0x10,
                0, 0, 0, 2, 0
            ]
        );
        assert_eq!(r.payload_len(), 512);
        let mut bad = b;
        bad[0] = 0;
        assert!(matches!(
            Request::parse(&bad),
            Err(WireError::BadMagic { .. })
        ));
    }

    #[test]
    fn info_payloads_have_the_protocol_lengths() {
        assert_eq!(info_export(1, 2).len(), 12);
        assert_eq!(info_block_size(1, 4096, 1 << 25)[2..6], [0, 0, 0, 1]);
        assert_eq!(export_name_reply(1, 1, false).len(), 134);
        assert_eq!(export_name_reply(1, 1, true).len(), 10);
        let mut out = Vec::new();
        put_option_reply(&mut out, OPT_GO, REP_ACK, &[]);
        assert_eq!(
            out,
            [0, 3, 0xe8, 0x89, 4, 0x55, 0x65, 0xa9, 0, 0, 0, 7, 0, 0, 0, 1, 0, 0, 0, 0]
        );
    }

    #[test]
    fn info_request_rejects_inconsistent_lengths() {
        let mut d = Vec::new();
        InfoRequest {
            name: "x".into(),
            infos: vec![INFO_BLOCK_SIZE],
        }
        .put(&mut d);
        assert!(InfoRequest::parse(&d).is_ok());
        assert!(InfoRequest::parse(&d[..d.len() - 1]).is_err());
        let mut longer = d.clone();
        longer.push(0);
        assert!(InfoRequest::parse(&longer).is_err());
        // Name length pointing past the data.
        let mut bad = d.clone();
        bad[3] = 200;
        assert!(InfoRequest::parse(&bad).is_err());
        // Not UTF-8.
        let mut bad = d;
        bad[4] = 0xff;
        assert!(InfoRequest::parse(&bad).is_err());
    }

    #[test]
    fn messages_are_cut_on_char_boundaries() {
        let long = "é".repeat(3000); // 6000 bytes
        let c = error_chunk(7, EIO, &long);
        let h = ChunkHeader::parse(c[..CHUNK_HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(h.len as usize, c.len() - CHUNK_HEADER_LEN);
        let msg_len = u16::from_be_bytes([c[24], c[25]]) as usize;
        assert!(msg_len <= MAX_STRING);
        assert!(std::str::from_utf8(&c[26..]).is_ok());

        let mut out = Vec::new();
        put_option_error(&mut out, OPT_GO, REP_ERR_UNKNOWN, &long);
        let len = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
        assert_eq!(len, out.len() - 20);
        assert!(len <= MAX_STRING && len > MAX_STRING - 4);
        assert!(std::str::from_utf8(&out[20..]).is_ok());
    }

    fn arb_request() -> impl Strategy<Value = Request> {
        (
            any::<u16>(),
            any::<u16>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
        )
            .prop_map(|(flags, kind, cookie, offset, len)| Request {
                flags,
                kind,
                cookie,
                offset,
                len,
            })
    }

    proptest! {
        #[test]
        fn requests_round_trip(r in arb_request()) {
            prop_assert_eq!(Request::parse(&r.to_bytes()), Ok(r));
        }

        #[test]
        fn chunk_headers_round_trip(flags: u16, kind: u16, cookie: u64, len: u32) {
            let h = ChunkHeader { flags, kind, cookie, len };
            prop_assert_eq!(ChunkHeader::parse(&h.to_bytes()), Ok(h));
        }

        #[test]
        fn read_chunks_frame_their_data(cookie: u64, offset: u64, len in 0u32..(1 << 25)) {
            let p = read_chunk_prefix(cookie, offset, len);
            let h = ChunkHeader::parse(p[..CHUNK_HEADER_LEN].try_into().unwrap()).unwrap();
            prop_assert_eq!(h.len, len + 8);
            prop_assert_eq!(h.flags, REPLY_FLAG_DONE);
            prop_assert_eq!(u64::from_be_bytes(p[CHUNK_HEADER_LEN..].try_into().unwrap()), offset);
        }

        #[test]
        fn info_requests_round_trip(name in "[a-z0-9/ é]{0,40}", infos in proptest::collection::vec(any::<u16>(), 0..8)) {
            let r = InfoRequest { name, infos };
            let mut d = Vec::new();
            r.put(&mut d);
            prop_assert_eq!(InfoRequest::parse(&d), Ok(r));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = InfoRequest::parse(&bytes);
            if let Ok(b) = <[u8; REQUEST_LEN]>::try_from(bytes.get(..REQUEST_LEN).unwrap_or(&[])) {
                let _ = Request::parse(&b);
            }
            if let Ok(b) = <[u8; OPTION_HEADER_LEN]>::try_from(bytes.get(..OPTION_HEADER_LEN).unwrap_or(&[])) {
                let _ = OptionHeader::parse(&b);
            }
            if let Ok(b) = <[u8; 4]>::try_from(bytes.get(..4).unwrap_or(&[])) {
                let _ = parse_client_flags(b);
            }
        }

        #[test]
        fn error_chunks_are_well_formed(cookie: u64, error in 1u32.., msg in ".{0,300}") {
            let c = error_chunk(cookie, error, &msg);
            let h = ChunkHeader::parse(c[..CHUNK_HEADER_LEN].try_into().unwrap()).unwrap();
            prop_assert_eq!(h.kind, REPLY_TYPE_ERROR);
            prop_assert_eq!(h.cookie, cookie);
            prop_assert_eq!(h.len as usize, c.len() - CHUNK_HEADER_LEN);
            let n = u16::from_be_bytes([c[24], c[25]]) as usize;
            prop_assert_eq!(n + 6, h.len as usize);
            prop_assert_eq!(&c[26..], msg.as_bytes());
        }
    }
}
