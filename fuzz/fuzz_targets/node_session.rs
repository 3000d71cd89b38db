//! Fuzzes the memory node's request handler statefully: sequences of HELLO, ALLOC, WRITEV,
//! READV, FREE, LIST, REGEN, PING, STATS, DRAIN, CORRUPT, RECLAIMS and raw frames from two
//! identities on one in-memory node, checked against a model of acknowledged writes (see
//! `hydramem::node::fuzzing`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| hydramem::node::fuzzing::requests(data));
