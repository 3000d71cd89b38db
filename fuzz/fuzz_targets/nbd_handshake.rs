//! Fuzzes the NBD server's handshake: arbitrary bytes as what a client sends from its client
//! flags on, through option haggling and, when the client gets there, into the transmission
//! phase on the same buffered reader, exactly as a real connection goes on (on an in-memory
//! export: no cluster).
//!
//! The first input byte's low four bits `n` raise the server's shutdown after `n - 1` options
//! (0: none); its bits 4-5 choose the server's TLS phase for option haggling: 1 TLS required
//! and not started (`Phase::TlsRequired`), 2 inside TLS (`Phase::InTls`), 0 or 3 no TLS (the
//! server's `negotiate`). The rest is what the client sends. The TLS phases run `greet` and
//! then `haggle` in that phase on the same plain bytes, with no TLS session: what is checked
//! is the option haggling, which is the same over any transport. After an acknowledged
//! STARTTLS the target stops, where the TLS handshake would begin.
//!
//! Checked, besides no panic and libFuzzer's memory limits: the greeting comes first; every
//! option read whole gets its replies, ending in exactly one final reply, for that option and
//! in order; the handshake ends (transmission, the client leaving, STARTTLS acknowledged, or
//! an error) exactly where the protocol says for the phase, having read exactly the bytes of
//! the options when it enters transmission or TLS; the sizes and flags told are the export's;
//! strings are protocol strings; and the transmission phase that follows keeps its own
//! contract (see `hydramem_fuzz::nbd`).
#![no_main]

use hydramem::nbd::handshake::{greet, haggle, negotiate, Haggled, Phase};
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
    let phase = match (setting >> 4) & 3 {
        1 => Phase::TlsRequired,
        2 => Phase::InTls,
        _ => Phase::Plain,
    };
    // `tls` is not read by the haggling: the phase says where it stands.
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
    let stop = stop_after(shutdown_after);
    let result = if phase == Phase::Plain {
        negotiate(&mut r, &mut out, &config, SIZE, stop)
            .map(|n| n.map_or(Haggled::Ended, Haggled::Transmission))
    } else {
        greet(&mut r, &mut out).and_then(|client| match client {
            None => Ok(Haggled::Ended),
            Some(client) => haggle(&mut r, &mut out, client, &config, SIZE, phase, stop),
        })
    };
    let model = handshake(input, view, shutdown_after, phase);
    let ended_right = match (&result, model.end) {
        (Ok(Haggled::Transmission(n)), HandshakeEnd::Transmission { structured, .. }) => {
            n.structured == structured
        }
        (Ok(Haggled::Ended), HandshakeEnd::Left) => true,
        (Ok(Haggled::StartTls), HandshakeEnd::StartTls) => true,
        (Err(_), HandshakeEnd::Broken) => true,
        _ => false,
    };
    assert!(
        ended_right,
        "handshake in {phase:?} ended with {result:?}; the protocol says {:?}",
        model.end
    );
    check_handshake(&out, &model, view);
    let position = usize::try_from(r.get_ref().get_ref().position()).expect("a slice position");
    let consumed = position - r.buffer().len();
    match result {
        Ok(Haggled::Transmission(negotiated)) => {
            assert_eq!(consumed, model.consumed, "bytes the handshake read");
            serve_and_check(&mut r, &input[consumed..], SIZE, negotiated, 1, None);
        }
        // The TLS handshake starts on the very next byte: none may have been taken.
        Ok(Haggled::StartTls) => {
            assert_eq!(consumed, model.consumed, "bytes read up to STARTTLS");
        }
        _ => {}
    }
});
