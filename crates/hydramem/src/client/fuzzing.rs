//! Entry point of the fuzz target for the client's completion path (feature `fuzzing`).
//!
//! [`replies`] plays a hostile node: arbitrary bytes become a stream of frames that arrive on
//! arbitrary connections and go through the very code the receiver thread runs
//! ([`super::transport::deliver`] into the slot table), while a read and a write are in
//! flight. Invariants it asserts: nothing is written outside the read's page (the guard pages
//! around it stay zero), a split lands or fails only from the node it was posted to, and the
//! table stays usable afterwards. Out-of-bounds writes that the guards cannot see are ASan's.

use super::layout::{Layout, Mode, Resilience};
use super::slots::Slots;
use super::transport::{deliver, Completions};
use crate::wire::{Header, HEADER_LEN};

/// Nodes the in-flight splits are posted to (split j on node j % NODES); frames arrive on
/// connections 0..=NODES, the last one holding none of them.
const NODES: u16 = 3;

/// Feeds `input` to the completion path (see the module doc). Input layout: one byte of
/// flags (bit 0: checksums on, bit 1: a node fails half-way), then records of a connection
/// byte, a 20-byte frame header and up to `body_len` bytes of body.
pub fn replies(input: &[u8]) {
    let Some((&flags, mut rest)) = input.split_first() else {
        return;
    };
    let layout = Layout::new(
        Resilience::Hydra {
            k: 8,
            r: 2,
            delta: 1,
            mode: Mode::FailureRecovery,
        },
        1 << 20,
    )
    .expect("8+2 is a valid layout");
    let slots = Slots::new(layout, 4).with_checksums(flags & 1 == 1);
    // The read's page between two guard pages.
    let mut pages = vec![[0u8; 4096]; 3];
    let page = pages[1].as_mut_ptr();
    // SAFETY: `pages` is not touched until `read` is dropped below.
    let read = unsafe { slots.acquire_read(page) };
    read.bind(1, 2);
    let write = slots.acquire_write();
    for j in 0..layout.width {
        read.posting(j, j as u16 % NODES);
        write.posting(j, j as u16 % NODES);
    }
    let mut frames = 0;
    while rest.len() > HEADER_LEN {
        let node = u16::from(rest[0]) % (NODES + 1);
        let Ok(h) = Header::parse(rest[1..=HEADER_LEN].try_into().expect("20 bytes")) else {
            break;
        };
        let len = (h.body_len as usize).min(rest.len() - 1 - HEADER_LEN);
        let body = &rest[1 + HEADER_LEN..1 + HEADER_LEN + len];
        // A malformed frame closes its connection in the real receiver; here the next one
        // is fed all the same (a harsher peer).
        let _ = deliver(&slots, node, &h, body);
        rest = &rest[1 + HEADER_LEN + len..];
        frames += 1;
        if flags & 2 != 0 && frames == 2 {
            slots.node_down(1);
        }
    }
    for (op, what) in [(&read, "read"), (&write, "write")] {
        let p = op.progress();
        assert_eq!(
            p.landed & !p.posted,
            0,
            "{what}: a split never posted landed"
        );
        assert_eq!(
            p.failed & !p.posted,
            0,
            "{what}: a split never posted failed"
        );
        assert_eq!(
            p.corrupt & !p.failed,
            0,
            "{what}: a corrupt split counted as good"
        );
    }
    if flags & 1 == 1 {
        // With checksums, nothing that fails its check lands: a forged split cannot.
        assert_eq!(read.progress().landed & read.progress().corrupt, 0);
    }
    drop(read);
    drop(write);
    assert!(
        pages[0].iter().chain(pages[2].iter()).all(|b| *b == 0),
        "a reply wrote outside the read's page"
    );
    // The table is usable: a fresh write lands its acknowledgements.
    let w = slots.acquire_write();
    w.posting(0, 0);
    slots.write_done(0, w.cookie(0), crate::wire::Status::Ok, 1);
    assert_eq!(w.progress().landed, 1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Header, Op, ReadReply, SplitFields, Status};

    #[test]
    fn forged_replies_do_not_land_and_real_ones_do() {
        // Empty, garbage and a well-formed forged READV on every connection.
        replies(&[]);
        replies(&[0xff; 300]);
        for conn in 0..4u8 {
            let mut input = vec![1u8, conn];
            let mut f = Vec::new();
            let h = Header {
                op: Op::ReadV,
                reply: false,
                status: Status::Ok,
                id: 1,
                body_len: 0,
            };
            let mut reply = ReadReply::begin(&mut f, &h);
            let splits = [(1u64 << 8) | 3, (2 << 8) | 4].map(|cookie| SplitFields {
                cookie,
                version: 9,
                ..SplitFields::default()
            });
            reply.put_run(&mut f, Status::Ok, &splits, &[0x77; 1024]);
            reply.finish(&mut f).unwrap();
            input.extend_from_slice(&f);
            replies(&input);
        }
    }
}
