//! Split tags: what the client says a split is, stored by the node beside the split's version
//! and checksum (see [`crate::wire::SplitFields::tag`]), coded like the split's bytes.
//!
//! A span row's data pieces are tagged with their page number + 1 (0: a zero-padded position),
//! and its r parity pieces with the same Reed-Solomon code's parity over the k data tags taken
//! as eight-byte pieces. So any k pieces of one version name every page of the row, and a
//! regeneration that decodes a lost piece's bytes decodes its tag the same way, exactly. A
//! Hydra page's splits are tagged 0 throughout, which the code maps to 0: nothing to decode.
//!
//! Invariant: for every row, `parity tags = encode(data tags)`, whatever pieces were lost and
//! rebuilt since.

use hydramem_isal::{Codec, CodecError, MAX_SPLITS};

/// Writes the r parity tags of the k data tags `data` into `parity` (`data.len()` must be
/// the codec's k, `parity.len()` its r).
pub fn encode(codec: &Codec, data: &[u64], parity: &mut [u64]) -> Result<(), CodecError> {
    let bytes: Vec<[u8; 8]> = data.iter().map(|t| t.to_le_bytes()).collect();
    let refs: Vec<&[u8]> = bytes.iter().map(|b| &b[..]).collect();
    let mut out = vec![[0u8; 8]; parity.len()];
    let mut outs: Vec<&mut [u8]> = out.iter_mut().map(|b| &mut b[..]).collect();
    codec.encode(&refs, &mut outs)?;
    for (p, b) in parity.iter_mut().zip(&out) {
        *p = u64::from_le_bytes(*b);
    }
    Ok(())
}

/// The tag of piece `target`, decoded from k pieces' tags `(piece index, tag)`; tags that are
/// all 0 give 0 without a decode.
pub fn reconstruct(
    codec: &Codec,
    present: impl Iterator<Item = (usize, u64)>,
    target: usize,
) -> Result<u64, CodecError> {
    let mut bytes = [[0u8; 8]; MAX_SPLITS];
    let mut index = [0usize; MAX_SPLITS];
    let mut k = 0;
    for ((b, i), (piece, tag)) in bytes.iter_mut().zip(&mut index).zip(present) {
        *b = tag.to_le_bytes();
        *i = piece;
        k += 1;
    }
    if bytes[..k].iter().all(|b| *b == [0; 8]) {
        return Ok(0);
    }
    if let Some(at) = index[..k].iter().position(|i| *i == target) {
        return Ok(u64::from_le_bytes(bytes[at]));
    }
    let mut refs: [(usize, &[u8]); MAX_SPLITS] = [(0, &[]); MAX_SPLITS];
    for (r, (i, b)) in refs.iter_mut().zip(index.iter().zip(&bytes)).take(k) {
        *r = (*i, &b[..]);
    }
    let mut out = [0u8; 8];
    codec.reconstruct(&refs[..k], &mut [(target, &mut out[..])])?;
    Ok(u64::from_le_bytes(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_k_pieces_give_back_every_tag(
            tags in proptest::collection::vec(any::<u64>(), 4),
            lost in proptest::collection::btree_set(0usize..6, 2),
        ) {
            let codec = Codec::new(4, 2).unwrap();
            let mut parity = [0u64; 2];
            encode(&codec, &tags, &mut parity).unwrap();
            let all: Vec<u64> = tags.iter().chain(&parity).copied().collect();
            let present: Vec<(usize, u64)> =
                (0..6).filter(|i| !lost.contains(i)).map(|i| (i, all[i])).collect();
            for (target, want) in all.iter().enumerate() {
                prop_assert_eq!(
                    reconstruct(&codec, present.iter().copied(), target).unwrap(),
                    *want
                );
            }
        }
    }

    #[test]
    fn zero_tags_code_to_zero() {
        let codec = Codec::new(4, 2).unwrap();
        let mut parity = [9u64; 2];
        encode(&codec, &[0; 4], &mut parity).unwrap();
        assert_eq!(parity, [0, 0]);
        let present = [(0, 0), (1, 0), (4, 0), (5, 0)];
        assert_eq!(reconstruct(&codec, present.into_iter(), 2).unwrap(), 0);
    }
}
