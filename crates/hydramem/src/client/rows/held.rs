//! What the nodes hold of a span client's rows, read back for a client that reattaches: every
//! piece's version and tag (STAMPS, no data), and per row the newest version k pieces carry
//! with the pages it names.

use super::{HeldRow, RangeStamps};
use crate::client::slots::{self};
use crate::client::{IoError, RemoteMemory};

impl RemoteMemory {
    /// The versions and tags every node holds for the rows of every address range this
    /// identity holds (STAMPS, no data): what a span client that reattaches rebuilds its page
    /// map from. A piece whose node is gone or fails to answer is `None` (its tag can be
    /// decoded from k others).
    fn row_stamps(&self) -> Vec<RangeStamps> {
        let l = &self.layout;
        let mut out = Vec::new();
        for (range, slot) in self.ranges.iter().enumerate() {
            let Some(group) = slot.load_full() else {
                continue;
            };
            let pieces = (0..l.width)
                .map(|j| {
                    let node = group.nodes[j];
                    if node == slots::NO_NODE {
                        return None;
                    }
                    let got = self
                        .transport
                        .stamps(node, group.slabs[j], 0, l.pages_per_range);
                    got.map_err(|e| {
                        tracing::warn!(range, piece = j, error = %e, "reading the stamps of a piece failed; decoding its tags from the others")
                    })
                    .ok()
                })
                .collect();
            out.push(RangeStamps {
                first_row: range as u64 * l.pages_per_range,
                pieces,
            });
        }
        out
    }

    /// Every row of the row space that the nodes hold decodable: for each, the newest version
    /// that at least k of its pieces carry and the pages its data positions name (their
    /// tags, decoded from k pieces where a data piece's node is gone or holds another
    /// version). Rows that some piece holds but that have no such version (a write that
    /// failed part way) are in the second list: they occupy memory and hold no page.
    ///
    /// # Errors
    /// A row whose pieces of one version carry tags that are not one codeword (a node's
    /// metadata is corrupt): the page map cannot be trusted, and reattaching stops.
    pub fn held_rows(&self) -> Result<(Vec<HeldRow>, Vec<u64>), IoError> {
        let (k, width) = (self.layout.k, self.layout.width);
        let mut rows = Vec::new();
        let mut garbage = Vec::new();
        for range in self.row_stamps() {
            for i in 0..self.layout.pages_per_range {
                let row = range.first_row + i;
                let pieces: Vec<Option<(u64, u64)>> = range
                    .pieces
                    .iter()
                    .map(|p| p.as_ref().and_then(|s| s.get(i as usize).copied()))
                    .collect();
                if pieces.iter().all(|p| p.is_none_or(|(v, _)| v == 0)) {
                    continue;
                }
                match resolve_row(self.codec.as_ref(), k, width, &pieces) {
                    Ok(Some((version, pages))) => rows.push(HeldRow {
                        row,
                        version,
                        pages,
                    }),
                    Ok(None) => garbage.push(row),
                    Err(why) => {
                        return Err(IoError::Store(
                            format!(
                                "row {row}: {why}; the nodes' metadata for it is corrupt, so \
                                 the page map cannot be rebuilt (start with a new identity, or \
                                 remove the node that holds the bad piece)"
                            )
                            .into(),
                        ))
                    }
                }
            }
        }
        Ok((rows, garbage))
    }
}

/// A row's newest whole version and the (position, page) its data positions name.
type Resolved = (u64, Vec<(usize, u64)>);

/// The newest version at least k of a row's pieces `(version, tag)` carry, with the pages its
/// data positions name (`None`: no version has k pieces). Every piece of that version beyond
/// the k decoded from is checked against them.
fn resolve_row(
    codec: Option<&hydramem_isal::Codec>,
    k: usize,
    width: usize,
    pieces: &[Option<(u64, u64)>],
) -> Result<Option<Resolved>, String> {
    let holding = |v: u64| {
        pieces
            .iter()
            .enumerate()
            .filter_map(move |(j, p)| p.filter(|(pv, _)| *pv == v).map(|(_, t)| (j, t)))
    };
    let newest = pieces
        .iter()
        .flatten()
        .map(|(v, _)| *v)
        .filter(|v| *v != 0 && holding(*v).count() >= k)
        .max();
    let Some(version) = newest else {
        return Ok(None);
    };
    let base: Vec<(usize, u64)> = holding(version).take(k).collect();
    let tag_of = |j: usize| match codec {
        Some(c) => crate::tags::reconstruct(c, base.iter().copied(), j)
            .map_err(|e| format!("decoding piece {j}'s tag: {e}")),
        None => Ok(base[0].1),
    };
    for (j, tag) in holding(version).skip(k) {
        if tag_of(j)? != tag {
            return Err(format!(
                "the tags of version {version}'s pieces disagree (piece {j} of {width})"
            ));
        }
    }
    let mut pages = Vec::new();
    for (j, piece) in pieces.iter().enumerate().take(k) {
        let tag = match *piece {
            Some((v, t)) if v == version => t,
            _ => tag_of(j)?,
        };
        if tag != 0 {
            pages.push((j, tag - 1));
        }
    }
    Ok(Some((version, pages)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row's pieces: data tags page + 1 for `pages`, parity from the code, all at `v`.
    fn row(codec: &hydramem_isal::Codec, pages: &[u64], v: u64) -> Vec<Option<(u64, u64)>> {
        let mut tags = [0u64; 6];
        for (t, p) in tags.iter_mut().zip(pages) {
            *t = p + 1;
        }
        let (data, parity) = tags.split_at_mut(4);
        crate::tags::encode(codec, data, parity).unwrap();
        tags.iter().map(|t| Some((v, *t))).collect()
    }

    #[test]
    fn a_row_resolves_to_its_newest_whole_version_with_lost_names_decoded() {
        let codec = hydramem_isal::Codec::new(4, 2).unwrap();
        let c = Some(&codec);
        let old = row(&codec, &[10, 11, 12, 13], 5);
        assert_eq!(
            resolve_row(c, 4, 6, &old),
            Ok(Some((5, vec![(0, 10), (1, 11), (2, 12), (3, 13)])))
        );
        // Two data pieces lost: their names are decoded from the other four.
        let mut lost = old.clone();
        lost[0] = None;
        lost[2] = None;
        assert_eq!(
            resolve_row(c, 4, 6, &lost),
            Ok(resolve_row(c, 4, 6, &old).unwrap())
        );
        // A reuse of the row that reached only three pieces: the old version still has k.
        let new = row(&codec, &[20, 21], 9);
        let mut torn = old.clone();
        torn[..3].clone_from_slice(&new[..3]);
        assert_eq!(
            resolve_row(c, 4, 6, &torn),
            Ok(None),
            "neither version has k pieces"
        );
        torn[..2].clone_from_slice(&old[..2]);
        assert_eq!(resolve_row(c, 4, 6, &torn).unwrap().unwrap().0, 5);
        // A reuse that reached k pieces wins, padding positions name no page.
        let mut reused = new.clone();
        reused[5] = old[5];
        assert_eq!(
            resolve_row(c, 4, 6, &reused),
            Ok(Some((9, vec![(0, 20), (1, 21)])))
        );
        // Tags that are not one codeword are refused, never guessed.
        let mut bad = old.clone();
        bad[1] = Some((5, 99));
        assert!(resolve_row(c, 4, 6, &bad).unwrap_err().contains("disagree"));
        assert_eq!(resolve_row(c, 4, 6, &[None; 6]), Ok(None));
    }
}
