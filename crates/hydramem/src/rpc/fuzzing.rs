//! Entry point of the fuzz target for the client's side of the handshake (feature
//! `fuzzing`).
//!
//! [`greeting`] plays a hostile node answering [`super::greet`] — what every client, tool and
//! regenerating node says first to a node — with arbitrary reply frames (well-formed headers
//! around arbitrary bodies, built with the wire module's own builder, so that the fuzzer
//! spends its time on what the client parses rather than on request ids it cannot guess).
//! Invariants it asserts: the handshake never panics and reads no more than the replies hold;
//! with a cluster key, no node that does not hold the key gets through; a node that says it
//! is another node than the one the client expects is refused.

use std::io::{self, Read, Write};

use super::{greet, Greeting, Peer};
use crate::auth::ClusterKey;
use crate::wire::{ClientId, FrameBuilder, Header, Op, Status, HEADER_LEN};

/// A node whose replies come from the fuzzer's bytes.
struct Hostile<'a> {
    input: &'a [u8],
    /// Bytes the client wrote, until a whole request frame is there.
    written: Vec<u8>,
    /// The last request's op and id.
    asked: Option<(Op, u64)>,
    /// Reply bytes not read yet.
    pending: Vec<u8>,
    at: usize,
    /// Answer with the request's op and id (else with the fuzzer's).
    matching: bool,
}

impl Hostile<'_> {
    /// Builds the next reply from the input: a byte choosing the op, one the status, one the
    /// body's length, then the body.
    fn next_reply(&mut self) -> bool {
        let [op, status, len, rest @ ..] = self.input else {
            return false;
        };
        let body = &rest[..usize::from(*len).min(rest.len())];
        let (op, id) = match (self.matching, self.asked) {
            (true, Some(asked)) => asked,
            _ => (Op::ALL[usize::from(*op) % Op::ALL.len()], u64::from(*len)),
        };
        let status = Status::ALL[usize::from(*status) % Status::ALL.len()];
        self.pending.clear();
        self.at = 0;
        let fb = FrameBuilder::begin(&mut self.pending, op, true, status, id);
        self.pending.extend_from_slice(body);
        let built = fb.finish(&mut self.pending).is_ok();
        self.input = &rest[body.len()..];
        built
    }
}

impl Read for Hostile<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.at == self.pending.len() && !self.next_reply() {
            return Ok(0); // the node closed the connection
        }
        let n = buf.len().min(self.pending.len() - self.at);
        buf[..n].copy_from_slice(&self.pending[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

impl Write for Hostile<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.written.extend_from_slice(buf);
        if let Some(h) = self
            .written
            .first_chunk::<HEADER_LEN>()
            .and_then(|h| Header::parse(h).ok())
        {
            self.asked = Some((h.op, h.id));
            self.written.clear();
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Feeds `input` to the handshake (see the module doc). Input layout: one byte of flags
/// (bit 0: the client has a cluster key; bit 1: it expects node 3; bit 2: replies carry the
/// fuzzer's op and id instead of the request's), then replies as [`Hostile`] reads them.
/// Returns whether the handshake succeeded.
pub fn greeting(input: &[u8]) -> bool {
    let Some((&flags, rest)) = input.split_first() else {
        return false;
    };
    let key = (flags & 1 == 1).then(|| ClusterKey::from_bytes([7; 32]));
    let mut g = Greeting::client(&ClientId::default(), 0, key.as_ref());
    if flags & 2 == 2 {
        g = g.to_node(3);
    }
    let mut node = Hostile {
        input: rest,
        written: Vec::new(),
        asked: None,
        pending: Vec::new(),
        at: 0,
        matching: flags & 4 == 0,
    };
    let peer = Peer {
        node: None,
        reply: None,
    };
    let greeted = greet(&mut node, peer, &g);
    if key.is_some() {
        assert!(
            greeted.is_err(),
            "a node without the cluster key got through the handshake: {greeted:?}"
        );
    }
    if let (Ok(reply), Some(id)) = (&greeted, g.node_id) {
        assert_eq!(
            reply.node_id, id,
            "a node answering as another node was accepted"
        );
    }
    greeted.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::HelloReply;

    /// Input for [`greeting`]: `flags`, then one HELLO reply of node `id` without a key.
    fn input(flags: u8, id: u32) -> Vec<u8> {
        let reply = HelloReply {
            node_id: id,
            slab_size: 1 << 20,
            capacity: 1 << 30,
            max_body: 1 << 20,
            incarnation: 1,
            auth: crate::auth::AUTH_NONE,
            nonce: [0; crate::auth::NONCE_LEN],
            proof: [0; crate::auth::PROOF_LEN],
        };
        let mut body = Vec::new();
        reply.put(&mut body);
        let mut out = vec![flags, 0, 0, u8::try_from(body.len()).unwrap()];
        out.extend_from_slice(&body);
        out
    }

    #[test]
    fn a_right_answer_gets_through_and_the_wrong_ones_do_not() {
        assert!(greeting(&input(2, 3)), "node 3 without a key, as expected");
        assert!(
            !greeting(&input(3, 3)),
            "a client with a key refuses a node without one"
        );
        assert!(!greeting(&input(2, 4)), "node 4 where node 3 is expected");
        assert!(!greeting(&input(6, 3)), "a reply to another request");
        assert!(!greeting(&[2]), "a node that closes at once");
    }
}
