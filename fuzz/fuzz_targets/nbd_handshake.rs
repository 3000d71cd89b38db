//! Fuzzes the NBD server's handshake: arbitrary bytes as what a client sends from its client
//! flags on, through option haggling and, when the client gets there, into the transmission
//! phase on the same buffered reader, exactly as a real connection goes on (on an in-memory
//! export: no cluster).
//!
//! The first input byte's low four bits `n` raise the server's shutdown after `n - 1` options
//! (0: none); the rest is what the client sends.
//!
//! Checked, besides no panic and libFuzzer's memory limits: the greeting comes first; every
//! option read whole gets its replies, ending in exactly one final reply, for that option and
//! in order; the handshake ends (transmission, the client leaving, or an error) exactly where
//! the protocol says, having read exactly the bytes of the options; the sizes and flags told
//! are the export's; strings are protocol strings; and the transmission phase that follows
//! keeps its own contract (see `hydramem_fuzz::nbd`).
#![no_main]

use hydramem::nbd::handshake::negotiate;
use hydramem::nbd::limits::Deadlined;
use hydramem::nbd::ExportConfig;
use hydramem_fuzz::nbd::{check_handshake, handshake, serve_and_check, stop_after};
use hydramem_fuzz::nbd::{ExportView, HandshakeEnd};
use libfuzzer_sys::fuzz_target;
use std::io::{BufReader, Cursor};

const NAME: &str = "disk";
const DESCRIPTION: &str = "a fuzzed export";
/// Five pages, the last one partial.
const SIZE: u64 = 20_000;

fuzz_target!(|data: &[u8]| {
    let Some((&setting, input)) = data.split_first() else {
        return;
    };
    let shutdown_after = match setting & 0x0f {
        0 => None,
        n => Some(usize::from(n) - 1),
    };
    let config = ExportConfig {
        name: NAME.into(),
        description: DESCRIPTION.into(),
        workers: 1,
        tls: None,
    };
    let view = ExportView {
        name: NAME,
        description: DESCRIPTION,
        size: SIZE,
    };
    let mut r = BufReader::new(Deadlined::new(Cursor::new(input)));
    let mut out = Vec::new();
    let result = negotiate(&mut r, &mut out, &config, SIZE, stop_after(shutdown_after));
    let model = handshake(input, view, shutdown_after);
    let ended_right = match (&result, model.end) {
        (Ok(Some(n)), HandshakeEnd::Transmission { structured, .. }) => n.structured == structured,
        (Ok(None), HandshakeEnd::Left) => true,
        (Err(_), HandshakeEnd::Broken) => true,
        _ => false,
    };
    assert!(
        ended_right,
        "handshake ended with {result:?}; the protocol says {:?}",
        model.end
    );
    check_handshake(&out, &model, view);
    if let Ok(Some(negotiated)) = result {
        let position = usize::try_from(r.get_ref().get_ref().position()).expect("a slice position");
        let consumed = position - r.buffer().len();
        assert_eq!(consumed, model.consumed, "bytes the handshake read");
        serve_and_check(&mut r, &input[consumed..], SIZE, negotiated, 1, None);
    }
});
