//! Fuzzes the client's completion path: arbitrary reply frames from arbitrary nodes through
//! the receiver's own delivery code into a slot table with a read and a write in flight,
//! with guard pages around the read's page (see `hydramem::client::fuzzing`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| hydramem::client::fuzzing::replies(data));
