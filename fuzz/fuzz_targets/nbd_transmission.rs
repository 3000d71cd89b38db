//! Fuzzes the NBD server's transmission phase: arbitrary bytes as the requests of a client
//! that has finished the handshake, served on an in-memory export (no cluster).
//!
//! The first input byte chooses the setting: bit 0 structured replies; bit 1 a pool of two
//! workers (replies in completion order; implies structured replies, which frame themselves);
//! bits 2-3 the export size (0, 4096, 20,000 or 65,536 bytes); bits 4-7 `n`, a shutdown
//! raised after `n - 1` requests (0: none). The rest is what the client sends.
//!
//! Checked, besides no panic and libFuzzer's memory limits: reading stops exactly at DISC, at
//! the end of input, at the shutdown, or with an error at broken framing; every request read
//! whole gets exactly one well-formed reply with its cookie and the error the protocol owes
//! it; READs return what the acknowledged writes left (one worker), and so does the whole
//! export at the end (see `hydramem_fuzz::nbd`).
#![no_main]

use hydramem::nbd::handshake::{transmission_flags, Negotiated};
use hydramem::nbd::limits::Deadlined;
use hydramem_fuzz::nbd::serve_and_check;
use libfuzzer_sys::fuzz_target;
use std::io::BufReader;

const SIZES: [u64; 4] = [0, 4096, 20_000, 65_536];

fuzz_target!(|data: &[u8]| {
    let Some((&setting, input)) = data.split_first() else {
        return;
    };
    let pool = setting & 2 != 0;
    let structured = setting & 1 != 0 || pool;
    let size = SIZES[usize::from(setting >> 2) % SIZES.len()];
    let max_requests = match setting >> 4 {
        0 => None,
        n => Some(usize::from(n) - 1),
    };
    let negotiated = Negotiated {
        structured,
        flags: transmission_flags(structured),
    };
    let workers = if pool { 2 } else { 1 };
    let mut r = BufReader::new(Deadlined::new(input));
    serve_and_check(&mut r, input, size, negotiated, workers, max_requests);
});
