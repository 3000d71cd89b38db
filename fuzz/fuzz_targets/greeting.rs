//! Fuzzes the client's side of the handshake: arbitrary replies of a hostile node to HELLO
//! and AUTH (see `hydramem::rpc::fuzzing`): no panic, and no node without the cluster key, or
//! answering as another node, gets through.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    hydramem::rpc::fuzzing::greeting(data);
});
