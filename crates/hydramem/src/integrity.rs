//! Per-split checksums: a CRC32C of every split, computed by the client when it writes the
//! split and verified by the client when the split comes back, so that a split corrupted in a
//! node's memory or on the wire is never combined into a page.
//!
//! The checksum covers the split's bytes *and* where the split belongs: its address range,
//! its page within the range, its split index in the coding group and the page version. A node
//! that answers with another page's split, another split of the same page or an older version
//! of the right split therefore fails the check even though the bytes themselves are intact.
//! These identifiers are the client's own and independent of placement (no node or slab id),
//! so a split keeps its checksum when its slab is regenerated or moved to another node.
//!
//! A split slot never written has version 0 and checksum 0 and must hold only zeros: that is
//! what a fresh slab stores, and nothing a client writes has version 0.
//!
//! CRC32C through `crc-fast`: it folds with carry-less multiplication (PCLMULQDQ/VPCLMULQDQ,
//! chosen at run time) and its digest is a plain value, so the data path computes it without
//! allocating. The 25 bytes of the binding are then folded in with the CPU's own CRC32C
//! instruction (SSE4.2) where there is one: a second pass through `crc-fast` costs about as
//! much as the 512 bytes themselves, most of it dispatch. `cargo bench -p hydramem --bench
//! integrity` measures a bound 512-byte split; the ten splits of an 8+2 page cost well under 1%
//! of one page operation over loopback, and a regenerating node verifies k of them per page.
//! The `crc32fast` crate computes the other CRC-32 polynomial, and a table-driven CRC32C is
//! several times slower.

use crc_fast::{CrcAlgorithm, Digest};

/// The checksum of split `split` of page `page` of address range `range` at `version`.
pub fn split_crc(data: &[u8], range: u64, page: u64, split: usize, version: u64) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        let bytes = crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, data) as u32;
        // SAFETY: the CPU has SSE4.2 (checked just above), the only feature `bind_sse42`
        // enables.
        return unsafe { bind_sse42(bytes, range, page, version, split as u8) };
    }
    split_crc_portable(data, range, page, split, version)
}

/// Continues the finished CRC32C `crc` over the binding (range, page, version, split index:
/// the same bytes as [`split_crc_portable`] appends) with the CPU's CRC32C instruction,
/// which works on the register state (the finished value inverted) and little-endian words.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
fn bind_sse42(crc: u32, range: u64, page: u64, version: u64, split: u8) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut state = u64::from(!crc);
    for word in [range, page, version] {
        state = _mm_crc32_u64(state, word);
    }
    !_mm_crc32_u8(state as u32, split)
}

/// [`split_crc`] in two passes of `crc-fast` (CPUs without a CRC32C instruction).
fn split_crc_portable(data: &[u8], range: u64, page: u64, split: usize, version: u64) -> u32 {
    let mut bind = [0u8; 25];
    bind[0..8].copy_from_slice(&range.to_le_bytes());
    bind[8..16].copy_from_slice(&page.to_le_bytes());
    bind[16..24].copy_from_slice(&version.to_le_bytes());
    bind[24] = split as u8;
    let mut d = Digest::new(CrcAlgorithm::Crc32Iscsi);
    d.update(data);
    d.update(&bind);
    d.finalize() as u32
}

/// Whether a split that came back with `version` and `crc` is the one its reader asked for
/// (see the module doc for version 0).
pub fn verify(data: &[u8], crc: u32, range: u64, page: u64, split: usize, version: u64) -> bool {
    if version == 0 {
        return crc == 0 && data.iter().all(|b| *b == 0);
    }
    split_crc(data, range, page, split, version) == crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_checksum_is_crc32c_of_the_bytes_then_the_binding() {
        // CRC32C check value of the standard test vector, with the binding appended.
        let mut whole = b"123456789".to_vec();
        whole.extend_from_slice(&[0u8; 25]);
        assert_eq!(
            split_crc(b"123456789", 0, 0, 0, 0),
            crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, &whole) as u32
        );
        assert_eq!(
            crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, b"123456789"),
            0xe306_9283
        );
    }

    #[test]
    fn unwritten_splits_verify_only_as_zeros_with_crc_zero() {
        assert!(verify(&[0; 512], 0, 3, 4, 5, 0));
        assert!(!verify(&[0; 512], 1, 3, 4, 5, 0));
        let mut one = [0u8; 512];
        one[100] = 4;
        assert!(!verify(&one, 0, 3, 4, 5, 0));
    }

    proptest! {
        /// The CPU's instruction binds exactly as the portable computation does.
        #[test]
        fn the_binding_is_the_same_with_and_without_the_crc_instruction(
            data in proptest::collection::vec(any::<u8>(), 0..600),
            range: u64, page: u64, split in 0usize..32, version: u64,
        ) {
            prop_assert_eq!(
                split_crc(&data, range, page, split, version),
                split_crc_portable(&data, range, page, split, version)
            );
        }

        /// Any change of a bit, of the page, the split, the range or the version fails.
        #[test]
        fn every_flip_and_every_misbinding_fails(
            data in proptest::collection::vec(any::<u8>(), 512),
            range in 0u64..1000, page in 0u64..4096, split in 0usize..32, version in 1u64..u64::MAX,
            bit in 0usize..4096, other in 1u64..1000,
        ) {
            let crc = split_crc(&data, range, page, split, version);
            prop_assert!(verify(&data, crc, range, page, split, version));
            let mut flipped = data.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(!verify(&flipped, crc, range, page, split, version));
            prop_assert!(!verify(&data, crc, range + other, page, split, version));
            prop_assert!(!verify(&data, crc, range, page ^ other, split, version));
            prop_assert!(!verify(&data, crc, range, page, (split + 1) % 32, version));
            prop_assert!(!verify(&data, crc, range, page, split, version.wrapping_add(other).max(1)));
        }
    }
}
