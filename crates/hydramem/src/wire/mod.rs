//! The memory-node wire protocol: every byte that crosses a connection between a client and a
//! memory node is defined here and nowhere else.
//!
//! A connection carries a stream of frames in both directions. Each frame is a fixed 20-byte
//! header followed by a body of `body_len` bytes. All integers are little-endian. Requests are
//! pipelined: a client sends many requests without waiting, and the node answers each with a
//! reply that carries the request's id and the request's op with the reply bit set. Replies to
//! the requests of one connection come back in request order (the node serves a connection
//! sequentially), but clients must not rely on it: they match replies by id and, inside vectored
//! replies, by the per-split cookie.
//!
//! ## Frame header (20 bytes)
//!
//! | offset | size | field      | meaning                                                   |
//! |--------|------|------------|-----------------------------------------------------------|
//! | 0      | 4    | magic      | `48 59 44 4D` ("HYDM")                                    |
//! | 4      | 1    | version    | protocol version, currently 8; a mismatch closes the link |
//! | 5      | 1    | op         | operation (table below); bit 7 set on replies             |
//! | 6      | 2    | status     | 0 in requests; frame-level [`Status`] in replies          |
//! | 8      | 8    | request id | chosen by the client, echoed in the reply                 |
//! | 16     | 4    | body_len   | bytes that follow; at most [`MAX_BODY`]                   |
//!
//! ## Operations and bodies
//!
//! | op   | name    | request body                                   | reply body (status OK)                         |
//! |------|---------|------------------------------------------------|------------------------------------------------|
//! | 0x01 | HELLO   | owner (16), flags u32, nonce (16), instance u64 | node id u32, slab_size u64, capacity u64, max_body u32, incarnation u64, auth u32, nonce (16), proof (32) |
//! | 0x02 | PING    | empty                                          | empty, or a notice (8 bytes, see [`Notice`])   |
//! | 0x03 | ALLOC   | tag u64, split_len u32 (1..=64 KiB)            | slab u32                                       |
//! | 0x04 | FREE    | slab u32                                       | empty                                          |
//! | 0x05 | LIST    | empty                                          | count u32, count × (slab u32, tag u64,         |
//! |      |         |                                                | newest version u64) (see [`Listed`])           |
//! | 0x06 | STATS   | empty                                          | see [`Stats`]                                  |
//! | 0x10 | WRITEV  | count u32, count × write run (see [`runs`])     | count u32, count × (cookie u64, status u32,    |
//! |      |         |                                                | version u64: the version stored now)           |
//! | 0x11 | READV   | count u32, count × read run (see [`runs`])      | count u32, count × reply run (see [`runs`])     |
//! | 0x07 | REGEN   | see [`Regen`]                                  | pages rebuilt u64 (sent when the slab is done) |
//! | 0x08 | RECLAIMS| empty                                          | count u32, count × (slab u32, ms_left u32)     |
//! | 0x09 | DRAIN   | mode u32 (1 start, 0 cancel)                   | empty                                          |
//! | 0x0A | CORRUPT | count u32, count × (slab u32, splits u32,      | accepted u32 (records that named a slab of the |
//! |      |         | cause u8) (see [`CorruptReport`])              | caller; the rest count as unknown slab)        |
//! | 0x0B | DISCARD | slab u32, first slot u64, slots u64            | empty; NO_SUCH_SLAB, OUT_OF_RANGE as for runs  |
//! | 0x0C | STAMPS  | slab u32, first slot u64, slots u32 (≤ 65536)  | n u32, n × (version u64, tag u64); errors as   |
//! |      |         |                                                | for DISCARD                                    |
//! | 0x0D | AUTH    | proof (32)                                     | empty; UNAUTHENTICATED, then the node closes   |
//! | 0x20 | FAULT   | kind u32, arg u64 (see [`Fault`])              | empty; FORBIDDEN unless the node allows faults |
//!
//! **Data: runs.** WRITEV and READV carry vectors of *runs*: `n` consecutive split slots of one
//! slab, their per-split fields (cookie, version, checksum, tag) in one block and their data in
//! another, so that a node serves and lands a run with one copy. The byte tables, the bounds
//! and the version rules are in [`runs`]; a READV reply returns each split with its stored
//! version, so that a client never combines splits of different writes of a page
//! (docs/architecture.md, "Versions"). LIST returns the newest version held in each slab,
//! from which a client that reattaches to its identity seeds its version clock; STAMPS returns
//! the versions and tags of a stretch of slots without their data, from which a span-coded
//! client that reattaches rebuilds its page map (a span piece's tag names its page).
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
//! **Identity and authentication** ([`crate::auth`] has the design and the proofs). HELLO
//! names the identity that owns slabs, its flags ([`HELLO_OBSERVER`], [`HELLO_OPERATOR`])
//! and a client nonce. A node *without* a cluster key answers `auth` = 0 and the connection is
//! identified at once; every request except HELLO, PING, STATS, FAULT and DRAIN requires it.
//! A node *with* a key answers `auth` = 1, its nonce and its proof; the connection is
//! identified only once AUTH carries the client's proof, and before that every request but
//! HELLO and AUTH is answered [`Status::NotIdentified`] — STATS, PING, DRAIN and FAULT too;
//! DRAIN and FAULT then also need the operator flag ([`Status::Unauthenticated`]). A wrong
//! proof is answered UNAUTHENTICATED and the connection closed. Slabs are visible only to the
//! identity that allocated them; the node answers [`Status::NoSuchSlab`] for a slab that does
//! not exist and for one that belongs to someone else alike, so ownership cannot be probed.
//! An identity may hold at most the node's quota of slabs ([`Status::OverQuota`]).
//! HELLO also names the *instance*, a random number a process draws once: while connections
//! of one instance hold an identity on a node, a HELLO of that identity from another instance
//! is answered [`Status::IdentityInUse`] and its connection closed, so that two processes
//! never write into one identity's slabs (docs/architecture.md, "Who holds an identity").

//! A frame whose magic, version, op or length is wrong, or whose body does not parse, is a
//! protocol violation: the node logs the reason and closes that one connection.

mod control;
mod corrupt;
mod fault;
mod frame;
mod regen;
mod request;
pub mod runs;

pub use control::*;
pub use corrupt::*;
pub use fault::*;
pub use frame::*;
pub use regen::*;
pub use request::*;
pub use runs::*;

/// A request frame of `op` whose body `body` writes (for tests).
#[cfg(test)]
fn test_frame(op: Op, id: u64, body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::new();
    let fb = FrameBuilder::begin(&mut out, op, false, Status::Ok, id);
    body(&mut out);
    fb.finish(&mut out).unwrap();
    out
}

/// The header and body of a frame built by [`test_frame`].
#[cfg(test)]
fn test_split(buf: &[u8]) -> (Header, &[u8]) {
    let h = Header::parse(buf[..HEADER_LEN].try_into().unwrap()).unwrap();
    assert_eq!(h.body_len as usize, buf.len() - HEADER_LEN);
    (h, &buf[HEADER_LEN..])
}
