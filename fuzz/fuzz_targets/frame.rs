//! Fuzzes every parser that reads bytes from a peer: the node's request parser and the client's
//! reply parsers. None may panic, loop or read out of bounds on any input; a frame that parses
//! must re-encode to a header that parses to the same value.
#![no_main]

use hydramem::wire::{self, Header, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() >= HEADER_LEN {
        let hb: &[u8; HEADER_LEN] = data[..HEADER_LEN].try_into().unwrap();
        if let Ok(h) = Header::parse(hb) {
            assert_eq!(Header::parse(&h.encode()), Ok(h));
            let body = &data[HEADER_LEN..];
            if let Ok(req) = wire::parse_request(&h, body) {
                if let wire::Request::WriteV(w) = req {
                    // Every run carries exactly n splits of its length, within the bounds.
                    let mut splits = 0;
                    let total: usize = w
                        .iter()
                        .map(|r| {
                            assert!(r.run.check().is_ok());
                            assert_eq!(r.data().len(), r.run.data_len());
                            splits += r.run.n as usize;
                            r.data().len()
                        })
                        .sum();
                    assert_eq!((total, splits), (w.data_len(), w.splits()));
                    assert!(splits <= wire::MAX_ENTRIES);
                }
                if let wire::Request::ReadV(runs) = req {
                    let splits: usize = runs.iter().map(|r| r.cookies().count()).sum();
                    assert_eq!(splits, runs.splits());
                    assert!(splits <= wire::MAX_ENTRIES);
                }
                if let wire::Request::Corrupt(list) = req {
                    // The layout checks out; the values may still be refused, never panic.
                    assert_eq!(4 + list.len() * wire::CORRUPT_REPORT_LEN, body.len());
                    let _ = list.reports();
                }
            }
            let mut n = 0usize;
            let _ = wire::parse_vectored_reply(&h, body, |_, _, d| n += d.len());
            assert!(n <= body.len());
        }
    }
    let _ = wire::Stats::parse(data);
    let _ = wire::parse_list(data);
    let _ = wire::parse_reclaims(data);
    let _ = wire::Notice::parse(data);
    let _ = wire::HelloReply::parse(data);
    let _ = wire::Hello::parse(data);
    if let Ok(req) = wire::Regen::parse(data) {
        // A REGEN that parses re-encodes to a body that parses to the same request.
        let mut out = Vec::new();
        req.put(&mut out);
        assert_eq!(wire::Regen::parse(&out), Ok(req));
    }
    let _ = wire::parse_corrupt_reply(data);
    if let Some(n) = data.get(..4) {
        // A STAMPS reply of the length it claims: exactly n slots, or refused.
        let n = u32::from_le_bytes(n.try_into().expect("4 bytes"));
        if let Ok(stamps) = wire::parse_stamps_reply(data, n) {
            assert_eq!((stamps.len(), data.len()), (n as usize, 4 + 16 * n as usize));
        }
    }
    if let Ok(list) = wire::parse_corrupt(data) {
        // Every byte of a CORRUPT body means something: a list that parses re-encodes to it.
        let mut out = Vec::new();
        wire::put_corrupt(&mut out, &list);
        assert_eq!(out, data);
    }
    if let Ok(f) = wire::Fault::parse(data) {
        // A fault that parses re-encodes to the very bytes (corruption args included).
        let mut out = Vec::new();
        f.put(&mut out);
        assert_eq!(out, data);
    }
});
