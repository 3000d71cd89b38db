//! The NBD server's contract as a model: for the bytes a client sends, which options and
//! requests the server reads, where it stops, and which replies it owes; and checks of what
//! the server really sent against that.
//!
//! The model follows the upstream protocol document and the contract that the server's
//! modules state (`hydramem::nbd::handshake`, `hydramem::nbd::transmission`). It takes the
//! server's constants (magic numbers, limits, the advertised transmission flags) but none of
//! its parsing or dispatch, so a framing or dispatch mistake in the server cannot hide itself.
//!
//! Invariants checked:
//! - handshake: the greeting comes first; every option read whole gets its informational
//!   replies and then exactly one final reply (ACK or an error), answering that option, in
//!   order; the handshake ends (agreement, clean end, STARTTLS acknowledged, or error)
//!   exactly where the protocol says, in each of the server's TLS phases (no TLS, TLS
//!   required and not started, inside TLS); strings sent (error messages, names) are UTF-8
//!   without NUL and at most 4096 bytes;
//! - transmission: every request read whole gets exactly one reply carrying its cookie, with
//!   EINVAL exactly for what the server refuses (unknown command, a flag not offered, over the
//!   maximum payload, outside the export) and success otherwise; a READ returns the export's
//!   bytes as the acknowledged writes before it left them; reading stops at DISC, at the end
//!   of input, at a shutdown, or with an error at broken framing, and at nothing else.

use std::fmt;
use std::io::{BufReader, Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hydramem::nbd::handshake::{
    transmission_flags, Negotiated, Phase, MAX_OPTION_DATA, MAX_OPTION_SKIP,
};
use hydramem::nbd::limits::{Deadlined, Limits};
use hydramem::nbd::transmission::{self, End, Shared};
use hydramem::nbd::wire::{
    Request, CHUNK_HEADER_LEN, CMD_DISC, CMD_FLAG_DF, CMD_FLAG_FUA, CMD_FLAG_NO_HOLE, CMD_FLUSH,
    CMD_READ, CMD_TRIM, CMD_WRITE, CMD_WRITE_ZEROES, EINVAL, FLAG_C_FIXED_NEWSTYLE,
    FLAG_C_NO_ZEROES, GREETING_LEN, IHAVEOPT, INFO_BLOCK_SIZE, INFO_DESCRIPTION, INFO_EXPORT,
    INFO_NAME, MAX_STRING, OPTION_HEADER_LEN, OPTION_REPLY_MAGIC, OPT_ABORT, OPT_EXPORT_NAME,
    OPT_GO, OPT_INFO, OPT_LIST, OPT_STARTTLS, OPT_STRUCTURED_REPLY, REPLY_FLAG_DONE,
    REPLY_TYPE_ERROR, REPLY_TYPE_NONE, REPLY_TYPE_OFFSET_DATA, REP_ACK, REP_ERR_INVALID,
    REP_ERR_SHUTDOWN, REP_ERR_TLS_REQD, REP_ERR_TOO_BIG, REP_ERR_UNKNOWN, REP_ERR_UNSUP, REP_INFO,
    REP_SERVER, REQUEST_LEN, REQUEST_MAGIC, SIMPLE_REPLY_LEN, SIMPLE_REPLY_MAGIC,
    STRUCTURED_REPLY_MAGIC, TFLAG_HAS_FLAGS, TFLAG_READ_ONLY, TFLAG_SEND_DF,
};
use hydramem::nbd::MAX_PAYLOAD;
use hydramem::nbd::{Export, MemStore};
use hydramem::PAGE_SIZE;

/// The export as clients see it.
#[derive(Debug, Clone, Copy)]
pub struct ExportView<'a> {
    /// Its name (the empty name selects it too).
    pub name: &'a str,
    /// Its description.
    pub description: &'a str,
    /// Its size in bytes.
    pub size: u64,
}

impl ExportView<'_> {
    fn serves(&self, name: &[u8]) -> bool {
        name.is_empty() || name == self.name.as_bytes()
    }
}

/// A big-endian integer of `N` bytes at `at`, if the bytes are there.
fn be<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at.checked_add(N)?)?.try_into().ok()
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    be(b, at).map(u16::from_be_bytes)
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    be(b, at).map(u32::from_be_bytes)
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    be(b, at).map(u64::from_be_bytes)
}

/// Takes `n` bytes off the front of `b`, panicking with `what` if they are not all there.
fn take<'a>(b: &mut &'a [u8], n: usize, what: &dyn fmt::Display) -> &'a [u8] {
    assert!(
        b.len() >= n,
        "{what}: {n} bytes expected, only {} sent",
        b.len()
    );
    let (head, rest) = b.split_at(n);
    *b = rest;
    head
}

/// Names the reply being checked in a failure message; formatted only when a check fails, so
/// that checking costs no formatting.
enum At<'a> {
    /// The `i`-th option reply, and what it should be.
    Option(usize, &'a OptionReply),
    /// The `i`-th transmission reply, and the request it answers when known.
    Reply(usize, Option<&'a Expected<'a>>),
}

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            At::Option(i, want) => write!(f, "option reply {i} (expected {want:?})"),
            At::Reply(i, None) => write!(f, "reply {i}"),
            At::Reply(i, Some(e)) => {
                write!(f, "reply {i} to {:?} (owed error {})", e.req, e.error)
            }
        }
    }
}

/// A protocol string: UTF-8, no NUL, at most 4096 bytes.
fn check_string(s: &[u8], what: &dyn fmt::Display) {
    assert!(
        s.len() <= MAX_STRING,
        "{what}: a {}-byte string (the protocol allows {MAX_STRING})",
        s.len()
    );
    let s = std::str::from_utf8(s).unwrap_or_else(|_| panic!("{what}: not UTF-8: {s:?}"));
    assert!(!s.contains('\0'), "{what}: contains NUL: {s:?}");
}

// ---------------------------------------------------------------------------------------------
// Handshake

/// How the handshake ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeEnd {
    /// Transmission is entered: by GO (`export_name: None`) or by EXPORT_NAME
    /// (`Some(no_zeroes)`, which also says whether the reply is padded).
    Transmission {
        /// Structured replies were agreed.
        structured: bool,
        /// Entered by EXPORT_NAME, with the client's NO_ZEROES flag.
        export_name: Option<bool>,
    },
    /// The client left cleanly (ABORT, end of input between messages, or EXPORT_NAME while
    /// the server shuts down).
    Left,
    /// STARTTLS was acknowledged (TLS required, not started yet): the TLS handshake comes next
    /// on the connection, right after the option, and option haggling starts over inside it.
    StartTls,
    /// A protocol violation or input cut inside a message: the server must return an error.
    Broken,
}

/// One option reply the server owes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReply {
    /// The option answered.
    pub option: u32,
    /// Its type (`REP_*`); for `REP_INFO`, `info` says which information.
    pub kind: u32,
    /// The information type of a `REP_INFO`.
    pub info: u16,
    /// Whether structured replies were agreed when the reply was sent (the transmission
    /// flags told depend on it).
    pub structured: bool,
}

/// What the server must do with a handshake input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handshake {
    /// The option replies, in order.
    pub replies: Vec<OptionReply>,
    /// How it ends.
    pub end: HandshakeEnd,
    /// How many input bytes the handshake reads (the transmission phase starts there).
    pub consumed: usize,
}

/// The handshake the server owes a client that sends `input` (client flags onwards), with
/// option haggling in `phase`. `shutdown_after`: the server's "shutting down?" question,
/// asked once for every option read whole and not skipped, answers yes from the `n + 1`-th
/// time on.
///
/// The phases, after the protocol document's TLS section:
/// - [`Phase::Plain`] (its NOTLS mode): STARTTLS is an option like any unsupported one
///   (NBD_REP_ERR_UNSUP), and TLS_REQD is never sent.
/// - [`Phase::TlsRequired`] (FORCEDTLS, TLS not initiated): STARTTLS without data is
///   acknowledged and haggling stops there, the TLS handshake following; STARTTLS with data
///   is invalid (the option carries none); ABORT is served as always; EXPORT_NAME, which
///   cannot be refused, ends the session; every other option, whatever its size, known or
///   not, is refused with NBD_REP_ERR_TLS_REQD.
/// - [`Phase::InTls`]: as `Plain` (nothing agreed before STARTTLS carries over), except that
///   a second STARTTLS is invalid.
///
/// A server shutting down refuses options (other than ABORT) with NBD_REP_ERR_SHUTDOWN in
/// every phase, which the protocol allows for any option.
pub fn handshake(
    input: &[u8],
    export: ExportView,
    shutdown_after: Option<usize>,
    phase: Phase,
) -> Handshake {
    let mut replies = Vec::new();
    let mut asked = 0usize;
    let mut structured = false;
    let end = |replies, end, consumed| Handshake {
        replies,
        end,
        consumed,
    };
    let Some(flags) = u32_at(input, 0) else {
        let e = if input.is_empty() {
            HandshakeEnd::Left
        } else {
            HandshakeEnd::Broken
        };
        return end(replies, e, input.len());
    };
    let known = FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES;
    if flags & !known != 0 || flags & FLAG_C_FIXED_NEWSTYLE == 0 {
        return end(replies, HandshakeEnd::Broken, 4);
    }
    let no_zeroes = flags & FLAG_C_NO_ZEROES != 0;
    let mut at = 4;
    loop {
        let rest = &input[at..];
        if rest.is_empty() {
            return end(replies, HandshakeEnd::Left, at);
        }
        if rest.len() < OPTION_HEADER_LEN || u64_at(rest, 0) != Some(IHAVEOPT) {
            return end(replies, HandshakeEnd::Broken, at);
        }
        let option = u32_at(rest, 8).unwrap_or_default();
        let len = u32_at(rest, 12).unwrap_or_default();
        let reply = |kind, info| OptionReply {
            option,
            kind,
            info,
            structured,
        };
        at += OPTION_HEADER_LEN;
        let available = input.len() - at;
        if len > MAX_OPTION_DATA {
            // Too big to parse: skipped and refused, or too big to skip and the end.
            if option == OPT_EXPORT_NAME || len > MAX_OPTION_SKIP || available < len as usize {
                return end(replies, HandshakeEnd::Broken, at);
            }
            at += len as usize;
            // Refused anyway; before TLS, for want of TLS (STARTTLS and ABORT excepted).
            let kind = match option {
                OPT_STARTTLS | OPT_ABORT => REP_ERR_TOO_BIG,
                _ if phase == Phase::TlsRequired => REP_ERR_TLS_REQD,
                _ => REP_ERR_TOO_BIG,
            };
            replies.push(reply(kind, 0));
            continue;
        }
        if available < len as usize {
            return end(replies, HandshakeEnd::Broken, at);
        }
        let data = &input[at..at + len as usize];
        at += len as usize;
        asked += 1;
        if shutdown_after.is_some_and(|n| asked > n) && option != OPT_ABORT {
            if option == OPT_EXPORT_NAME {
                return end(replies, HandshakeEnd::Left, at);
            }
            replies.push(reply(REP_ERR_SHUTDOWN, 0));
            continue;
        }
        match (phase, option) {
            (Phase::TlsRequired, OPT_STARTTLS) if data.is_empty() => {
                replies.push(reply(REP_ACK, 0));
                return end(replies, HandshakeEnd::StartTls, at);
            }
            // With data, or TLS already started.
            (Phase::TlsRequired | Phase::InTls, OPT_STARTTLS) => {
                replies.push(reply(REP_ERR_INVALID, 0));
                continue;
            }
            (Phase::TlsRequired, OPT_EXPORT_NAME) => {
                return end(replies, HandshakeEnd::Broken, at);
            }
            (Phase::TlsRequired, o) if o != OPT_ABORT => {
                replies.push(reply(REP_ERR_TLS_REQD, 0));
                continue;
            }
            _ => {}
        }
        match option {
            OPT_EXPORT_NAME => {
                let ok = std::str::from_utf8(data).is_ok() && export.serves(data);
                let e = if ok {
                    HandshakeEnd::Transmission {
                        structured,
                        export_name: Some(no_zeroes),
                    }
                } else {
                    HandshakeEnd::Broken
                };
                return end(replies, e, at);
            }
            OPT_ABORT => {
                replies.push(reply(REP_ACK, 0));
                return end(replies, HandshakeEnd::Left, at);
            }
            OPT_LIST if data.is_empty() => {
                replies.push(reply(REP_SERVER, 0));
                replies.push(reply(REP_ACK, 0));
            }
            OPT_STRUCTURED_REPLY if data.is_empty() => {
                structured = true;
                replies.push(OptionReply {
                    option,
                    kind: REP_ACK,
                    info: 0,
                    structured,
                });
            }
            OPT_LIST | OPT_STRUCTURED_REPLY => replies.push(reply(REP_ERR_INVALID, 0)),
            OPT_INFO | OPT_GO => match info_request(data) {
                None => replies.push(reply(REP_ERR_INVALID, 0)),
                Some((name, _)) if !export.serves(name) => replies.push(reply(REP_ERR_UNKNOWN, 0)),
                Some((_, infos)) => {
                    replies.push(reply(REP_INFO, INFO_EXPORT));
                    replies.push(reply(REP_INFO, INFO_BLOCK_SIZE));
                    if infos.contains(&INFO_NAME) {
                        replies.push(reply(REP_INFO, INFO_NAME));
                    }
                    if infos.contains(&INFO_DESCRIPTION) {
                        replies.push(reply(REP_INFO, INFO_DESCRIPTION));
                    }
                    replies.push(reply(REP_ACK, 0));
                    if option == OPT_GO {
                        let e = HandshakeEnd::Transmission {
                            structured,
                            export_name: None,
                        };
                        return end(replies, e, at);
                    }
                }
            },
            _ => replies.push(reply(REP_ERR_UNSUP, 0)),
        }
    }
}

/// The data of INFO/GO: name length u32, name (UTF-8, at most 4096 bytes), count u16, count
/// information types u16, and nothing after. `None` when malformed.
fn info_request(data: &[u8]) -> Option<(&[u8], Vec<u16>)> {
    let name_len = usize::try_from(u32_at(data, 0)?).ok()?;
    if name_len > MAX_STRING {
        return None;
    }
    let name = data.get(4..4 + name_len)?;
    std::str::from_utf8(name).ok()?;
    let count = usize::from(u16_at(data, 4 + name_len)?);
    if data.len() != 4 + name_len + 2 + 2 * count {
        return None;
    }
    let infos = (0..count)
        .map(|i| u16_at(data, 6 + name_len + 2 * i))
        .collect::<Option<Vec<u16>>>()?;
    Some((name, infos))
}

/// Checks `out`, everything the server sent during the handshake, against `model`.
pub fn check_handshake(out: &[u8], model: &Handshake, export: ExportView) {
    let mut b = out;
    let greeting = take(&mut b, GREETING_LEN, &"greeting");
    assert_eq!(&greeting[..8], b"NBDMAGIC", "greeting magic");
    assert_eq!(&greeting[8..16], b"IHAVEOPT", "greeting option magic");
    assert_eq!(
        &greeting[16..],
        &[0, 3],
        "handshake flags: FIXED_NEWSTYLE | NO_ZEROES"
    );
    for (i, want) in model.replies.iter().enumerate() {
        let what = At::Option(i, want);
        let h = take(&mut b, 20, &what);
        assert_eq!(u64_at(h, 0), Some(OPTION_REPLY_MAGIC), "{what}: magic");
        assert_eq!(u32_at(h, 8), Some(want.option), "{what}: option answered");
        assert_eq!(u32_at(h, 12), Some(want.kind), "{what}: reply type");
        let len = u32_at(h, 16).unwrap_or_default() as usize;
        let data = take(&mut b, len, &what);
        check_option_reply_data(want, data, export, &what);
    }
    if let HandshakeEnd::Transmission {
        structured,
        export_name: Some(no_zeroes),
    } = model.end
    {
        let r = take(&mut b, 10, &"EXPORT_NAME reply");
        assert_eq!(u64_at(r, 0), Some(export.size), "EXPORT_NAME reply: size");
        check_flags(u16_at(r, 8).unwrap_or_default(), structured);
        if !no_zeroes {
            let pad = take(&mut b, 124, &"EXPORT_NAME reply padding");
            assert!(pad.iter().all(|&z| z == 0), "EXPORT_NAME padding not zero");
        }
    }
    assert!(
        b.is_empty(),
        "{} bytes sent after the last reply owed: {:?}",
        b.len(),
        &b[..b.len().min(64)]
    );
}

fn check_option_reply_data(
    want: &OptionReply,
    data: &[u8],
    export: ExportView,
    what: &dyn fmt::Display,
) {
    match want.kind {
        REP_ACK => assert!(data.is_empty(), "{what}: ACK with data"),
        REP_SERVER => {
            let n = u32_at(data, 0).expect("REP_SERVER name length") as usize;
            let name = data.get(4..4 + n).expect("REP_SERVER name");
            assert_eq!(name, export.name.as_bytes(), "{what}: export name");
            check_string(&data[4 + n..], what);
        }
        REP_INFO => {
            assert_eq!(u16_at(data, 0), Some(want.info), "{what}: information type");
            let body = &data[2..];
            match want.info {
                INFO_EXPORT => {
                    assert_eq!(body.len(), 10, "{what}: NBD_INFO_EXPORT length");
                    assert_eq!(u64_at(body, 0), Some(export.size), "{what}: size");
                    check_flags(u16_at(body, 8).unwrap_or_default(), want.structured);
                }
                INFO_BLOCK_SIZE => {
                    assert_eq!(body.len(), 12, "{what}: NBD_INFO_BLOCK_SIZE length");
                    let min = u32_at(body, 0).unwrap_or_default();
                    let preferred = u32_at(body, 4).unwrap_or_default();
                    let max = u32_at(body, 8).unwrap_or_default();
                    assert!(
                        min.is_power_of_two() && min <= 65536,
                        "{what}: minimum {min}"
                    );
                    assert!(
                        preferred.is_power_of_two() && preferred >= min.max(512),
                        "{what}: preferred {preferred}"
                    );
                    // The limit the transmission phase enforces, so a client that keeps to
                    // what it was told is never refused for size.
                    assert_eq!(max as usize, MAX_PAYLOAD, "{what}: maximum payload");
                    assert_eq!(preferred as usize, PAGE_SIZE, "{what}: preferred size");
                }
                INFO_NAME => assert_eq!(body, export.name.as_bytes(), "{what}"),
                INFO_DESCRIPTION => assert_eq!(body, export.description.as_bytes(), "{what}"),
                _ => unreachable!("the model asks only for known information"),
            }
        }
        // Errors carry a message: a protocol string.
        _ => check_string(data, what),
    }
}

/// The transmission flags told: those of the server, which say what transmission does (the
/// transmission model refuses DF exactly when it is not told).
fn check_flags(flags: u16, structured: bool) {
    assert_eq!(flags, transmission_flags(structured), "transmission flags");
    assert_ne!(flags & TFLAG_HAS_FLAGS, 0, "HAS_FLAGS not set");
    assert_eq!(
        flags & TFLAG_READ_ONLY,
        0,
        "a writable export told READ_ONLY"
    );
    assert_eq!(
        flags & TFLAG_SEND_DF != 0,
        structured,
        "DF told without structured replies"
    );
}

// ---------------------------------------------------------------------------------------------
// Transmission

/// How the server's reading of requests ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransmissionEnd {
    /// NBD_CMD_DISC.
    Disconnect,
    /// End of input between requests, or the server stopped reading (shutdown).
    Closed,
    /// Broken framing or input cut inside a request: the server must return an error.
    Broken,
}

/// A request the server reads whole, and so owes exactly one reply.
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    /// The request.
    pub req: Request,
    /// A WRITE's data (empty otherwise, and for a WRITE over the maximum payload).
    pub payload: &'a [u8],
    /// The error its reply must carry (0: success).
    pub error: u32,
}

/// The requests the server reads from `input` and how reading ends. `max_requests`: the
/// server's "stopping?" question, asked before each request, answers yes from the
/// `n + 1`-th time on.
pub fn requests(
    input: &[u8],
    structured: bool,
    size: u64,
    max_requests: Option<usize>,
) -> (Vec<Expected<'_>>, TransmissionEnd) {
    let mut v = Vec::new();
    let mut at = 0;
    loop {
        if max_requests.is_some_and(|n| v.len() >= n) {
            return (v, TransmissionEnd::Closed);
        }
        let rest = &input[at..];
        if rest.is_empty() {
            return (v, TransmissionEnd::Closed);
        }
        if rest.len() < REQUEST_LEN || u32_at(rest, 0) != Some(REQUEST_MAGIC) {
            return (v, TransmissionEnd::Broken);
        }
        let req = Request {
            flags: u16_at(rest, 4).unwrap_or_default(),
            kind: u16_at(rest, 6).unwrap_or_default(),
            cookie: u64_at(rest, 8).unwrap_or_default(),
            offset: u64_at(rest, 16).unwrap_or_default(),
            len: u32_at(rest, 24).unwrap_or_default(),
        };
        if req.kind == CMD_DISC {
            return (v, TransmissionEnd::Disconnect);
        }
        at += REQUEST_LEN;
        let payload_len = if req.kind == CMD_WRITE {
            req.len as usize
        } else {
            0
        };
        if input.len() - at < payload_len {
            return (v, TransmissionEnd::Broken);
        }
        let payload = if payload_len <= MAX_PAYLOAD {
            &input[at..at + payload_len]
        } else {
            &[]
        };
        at += payload_len;
        v.push(Expected {
            req,
            payload,
            error: expected_error(&req, structured, size),
        });
    }
}

/// The error the server owes `r` on an export of `size` bytes: EINVAL for an unknown command,
/// a flag not offered for the command (DF only with structured replies, NO_HOLE only for
/// WRITE_ZEROES, FUA for all), a READ or WRITE over the maximum payload, or a range beyond the
/// end (FLUSH has none); 0 otherwise (the in-memory store never fails).
pub fn expected_error(r: &Request, structured: bool, size: u64) -> u32 {
    let allowed = match r.kind {
        CMD_READ if structured => CMD_FLAG_FUA | CMD_FLAG_DF,
        CMD_READ | CMD_WRITE | CMD_FLUSH | CMD_TRIM => CMD_FLAG_FUA,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE,
        _ => return EINVAL,
    };
    if r.flags & !allowed != 0 {
        return EINVAL;
    }
    let in_range = r
        .offset
        .checked_add(u64::from(r.len))
        .is_some_and(|end| end <= size);
    match r.kind {
        CMD_READ | CMD_WRITE if r.len as usize > MAX_PAYLOAD => EINVAL,
        CMD_FLUSH => 0,
        _ if !in_range => EINVAL,
        _ => 0,
    }
}

/// One reply as sent.
struct Reply<'a> {
    cookie: u64,
    error: u32,
    /// OFFSET_DATA: (offset, data).
    data: Option<(u64, &'a [u8])>,
}

/// Reads one structured reply chunk off `b`; it must be the only chunk of its reply (DONE):
/// the server answers every request with one chunk.
fn chunk<'a>(b: &mut &'a [u8], what: &dyn fmt::Display) -> Reply<'a> {
    let h = take(b, CHUNK_HEADER_LEN, what);
    assert_eq!(u32_at(h, 0), Some(STRUCTURED_REPLY_MAGIC), "{what}: magic");
    let flags = u16_at(h, 4).unwrap_or_default();
    let kind = u16_at(h, 6).unwrap_or_default();
    let cookie = u64_at(h, 8).unwrap_or_default();
    let len = u32_at(h, 16).unwrap_or_default() as usize;
    let payload = take(b, len, what);
    assert_eq!(flags, REPLY_FLAG_DONE, "{what}: chunk flags");
    match kind {
        REPLY_TYPE_NONE => {
            assert!(payload.is_empty(), "{what}: NONE chunk with a payload");
            Reply {
                cookie,
                error: 0,
                data: None,
            }
        }
        REPLY_TYPE_OFFSET_DATA => {
            assert!(
                len > 8,
                "{what}: OFFSET_DATA chunk of {len} bytes (needs 9 or more)"
            );
            Reply {
                cookie,
                error: 0,
                data: Some((u64_at(payload, 0).unwrap_or_default(), &payload[8..])),
            }
        }
        REPLY_TYPE_ERROR => {
            let error = u32_at(payload, 0).expect("ERROR chunk: error");
            let n = usize::from(u16_at(payload, 4).expect("ERROR chunk: message length"));
            assert_eq!(payload.len(), 6 + n, "{what}: ERROR chunk length");
            check_string(&payload[6..], what);
            assert_ne!(error, 0, "{what}: ERROR chunk with error 0");
            Reply {
                cookie,
                error,
                data: None,
            }
        }
        k => panic!("{what}: chunk type {k} (this server sends NONE, OFFSET_DATA, ERROR)"),
    }
}

/// Whether `reply` answers `e`: its cookie and error, and data exactly for a successful READ
/// of at least one byte (at the request's offset, of its length).
fn answers(reply: &Reply, e: &Expected) -> bool {
    let wants_data = e.error == 0 && e.req.kind == CMD_READ && e.req.len > 0;
    reply.cookie == e.req.cookie
        && reply.error == e.error
        && match reply.data {
            Some((offset, d)) => {
                wants_data && offset == e.req.offset && d.len() == e.req.len as usize
            }
            None => !wants_data,
        }
}

/// Checks `out`, the bytes the server sent in transmission, against `expected`.
///
/// `in_order` (one worker): replies come in request order; a READ returns `device` as the
/// requests before it left it, and `device` (the export's contents) follows every write the
/// server acknowledged. Otherwise (a worker pool; structured replies only) replies may come in
/// any order, and each must answer a distinct expected request; contents are not checked,
/// since concurrent requests may run in any order.
pub fn check_replies(
    out: &[u8],
    expected: &[Expected],
    structured: bool,
    in_order: bool,
    device: &mut [u8],
) {
    let mut b = out;
    if !in_order {
        assert!(
            structured,
            "replies out of order are checked with structured replies"
        );
        let mut answered = vec![false; expected.len()];
        for i in 0..expected.len() {
            let what = At::Reply(i, None);
            let r = chunk(&mut b, &what);
            let j = (0..expected.len())
                .find(|&j| !answered[j] && answers(&r, &expected[j]))
                .unwrap_or_else(|| {
                    panic!(
                        "{what} (cookie {:#x}, error {}) answers no request still owed one",
                        r.cookie, r.error
                    )
                });
            answered[j] = true;
        }
    } else {
        for (i, e) in expected.iter().enumerate() {
            let what = At::Reply(i, Some(e));
            let r = if structured {
                chunk(&mut b, &what)
            } else {
                let h = take(&mut b, SIMPLE_REPLY_LEN, &what);
                assert_eq!(u32_at(h, 0), Some(SIMPLE_REPLY_MAGIC), "{what}: magic");
                let error = u32_at(h, 4).unwrap_or_default();
                let cookie = u64_at(h, 8).unwrap_or_default();
                let data = (error == 0 && cookie == e.req.cookie && e.req.kind == CMD_READ)
                    .then(|| take(&mut b, e.req.len as usize, &what));
                Reply {
                    cookie,
                    error,
                    data: data.filter(|d| !d.is_empty()).map(|d| (e.req.offset, d)),
                }
            };
            assert!(
                answers(&r, e),
                "{what}: the reply has cookie {:#x}, error {}, {} data bytes",
                r.cookie,
                r.error,
                r.data.map_or(0, |d| d.1.len())
            );
            apply(e, r.data.map(|d| d.1), device);
        }
    }
    assert!(
        b.is_empty(),
        "{} bytes sent after the last reply owed: {:?}",
        b.len(),
        &b[..b.len().min(64)]
    );
}

/// Checks a READ's data against `device` and applies an acknowledged WRITE, TRIM or
/// WRITE_ZEROES to it (the export zeroes trimmed bytes).
fn apply(e: &Expected, read: Option<&[u8]>, device: &mut [u8]) {
    if e.error != 0 {
        return;
    }
    let at = e.req.offset as usize;
    let len = e.req.len as usize;
    match e.req.kind {
        CMD_READ => {
            if let Some(d) = read {
                assert!(d == &device[at..at + len], "READ {:?}: wrong data", e.req);
            }
        }
        CMD_WRITE => device[at..at + len].copy_from_slice(e.payload),
        CMD_TRIM | CMD_WRITE_ZEROES => device[at..at + len].fill(0),
        _ => {}
    }
}

/// The server's reply bytes, shared with the checker (the server's writer must be `'static`:
/// its workers are the server's, not the connection's).
#[derive(Clone, Default)]
pub struct Replies(pub Arc<Mutex<Vec<u8>>>);

impl Write for Replies {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .expect("the reply buffer")
            .extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A stop question that answers yes from its `n + 1`-th asking on (never for `None`): the
/// server's shutdown flag, as the models above count it.
pub fn stop_after(n: Option<usize>) -> impl Fn() -> bool {
    let asked = AtomicUsize::new(0);
    move || n.is_some_and(|n| asked.fetch_add(1, Ordering::Relaxed) >= n)
}

/// Runs the transmission phase on a fresh in-memory export of `size` bytes, reading `input`
/// (the bytes `r` will yield) with `workers` workers, and checks its end, its replies and,
/// with one worker, the export's contents against the model.
pub fn serve_and_check<R: Read>(
    r: &mut BufReader<Deadlined<R>>,
    input: &[u8],
    size: u64,
    negotiated: Negotiated,
    workers: usize,
    max_requests: Option<usize>,
) {
    let export = Arc::new(Export::new(MemStore::new(size, Duration::ZERO), size));
    let replies = Replies::default();
    // A pool per input, joined when dropped: no worker outlives the input (LeakSanitizer).
    let shared = Shared::new(workers, &Limits::default());
    let result = transmission::serve(
        r,
        replies.clone(),
        &export,
        negotiated,
        &shared,
        stop_after(max_requests),
    );
    drop(shared);
    let out = std::mem::take(&mut *replies.0.lock().expect("the reply buffer"));
    let structured = negotiated.structured;
    let (expected, end) = requests(input, structured, size, max_requests);
    let ended_right = matches!(
        (&result, end),
        (Ok(End::Disconnect), TransmissionEnd::Disconnect)
            | (Ok(End::Closed), TransmissionEnd::Closed)
            | (Err(_), TransmissionEnd::Broken)
    );
    assert!(
        ended_right,
        "transmission ended with {result:?}; the protocol says {end:?}"
    );
    let in_order = workers == 1;
    let mut device = vec![0u8; usize::try_from(size).expect("export size fits in memory")];
    check_replies(&out, &expected, structured, in_order, &mut device);
    if in_order {
        let mut all = vec![0u8; device.len()];
        export.read(0, &mut all).expect("reading the whole export");
        assert!(
            all == device,
            "the export's contents differ from the acknowledged writes"
        );
    }
}
