//! REGEN: the request that makes a node rebuild one of its caller's slabs from the other
//! splits of its coding group.
//!
//! Invariants: a parsed [`Regen`] has the shape [`Regen::check_shape`] describes, and
//! re-encodes to a body that parses to the same request.

use super::{ClientId, Reader, WireError};

/// One surviving split of a coding group, as a REGEN request names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegenSource {
    /// The split's index in the group (0..k data, k..k+r parity).
    pub split: u8,
    /// The source holds the very bytes the target must get (the slab being moved away, or
    /// another replica): copy it instead of decoding from k splits.
    pub copy: bool,
    /// Its slab on that node.
    pub slab: u32,
    /// The node, by its id in the cluster file; the regenerating node looks its address up in
    /// its own copy of the membership and never connects anywhere a request names.
    pub node: u32,
}

/// Most splits a coding group has (k + r, or the copies of a replicated page): REGEN names at
/// most this many sources.
pub const MAX_GROUP: usize = 32;

/// REGEN request: rebuild split `target` of a coding group into the caller's slab `slab` on
/// this node, reading the surviving splits from their nodes with the caller's identity
/// (paper 4.2: the new node regenerates the slab itself). The node replies when the slab is
/// done, with the number of pages rebuilt; the caller sends it on a connection of its own.
///
/// | size | field |
/// |------|-------|
/// | 16   | client id (the identity that owns every slab named here) |
/// | 1, 1 | k, r |
/// | 1    | target split index |
/// | 1    | flags: bit 0 = the client keeps checksums (verify the sources', store the target's) |
/// | 4    | split_len |
/// | 4    | target slab on this node |
/// | 8    | pages (split slots) to rebuild |
/// | 8    | the address range of the group, which checksums bind |
/// | 4    | count of sources (at most k + r, at most [`MAX_GROUP`]), then count × (split u8, flags u8 (bit 0: copy source), reserved u16 = 0, slab u32, node id u32) |
///
/// k ≥ 1, k + r ≤ [`MAX_GROUP`], target < k + r and every source's split < k + r, or the body
/// is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Regen {
    /// The owner of the slabs.
    pub client: ClientId,
    /// Data splits.
    pub k: u8,
    /// Parity splits.
    pub r: u8,
    /// The split to rebuild.
    pub target: u8,
    /// Bytes per split.
    pub split_len: u32,
    /// The slab on this node to fill.
    pub slab: u32,
    /// Split slots to rebuild.
    pub pages: u64,
    /// The client's address range of the group (see [`crate::integrity`]).
    pub range: u64,
    /// The client keeps per-split checksums: sources are verified and rebuilt splits get theirs.
    pub checksums: bool,
    /// The surviving splits.
    pub sources: Vec<RegenSource>,
}

impl Regen {
    /// Appends the body.
    pub fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.client.0);
        out.extend_from_slice(&[self.k, self.r, self.target, self.checksums as u8]);
        out.extend_from_slice(&self.split_len.to_le_bytes());
        out.extend_from_slice(&self.slab.to_le_bytes());
        out.extend_from_slice(&self.pages.to_le_bytes());
        out.extend_from_slice(&self.range.to_le_bytes());
        out.extend_from_slice(&(self.sources.len() as u32).to_le_bytes());
        for s in &self.sources {
            out.extend_from_slice(&[s.split, s.copy as u8, 0, 0]);
            out.extend_from_slice(&s.slab.to_le_bytes());
            out.extend_from_slice(&s.node.to_le_bytes());
        }
    }

    /// Parses the body.
    pub fn parse(body: &[u8]) -> Result<Regen, WireError> {
        let mut r = Reader::new(body);
        let client = ClientId(r.bytes(16)?.try_into().expect("16"));
        let b = r.bytes(4)?;
        let (k, rr, target) = (b[0], b[1], b[2]);
        if b[3] > 1 {
            return Err(WireError::Invalid("REGEN has unknown flags"));
        }
        let checksums = b[3] == 1;
        let split_len = r.u32()?;
        let slab = r.u32()?;
        let pages = r.u64()?;
        let range = r.u64()?;
        let n = r.u32()? as usize;
        if n > MAX_GROUP {
            return Err(WireError::Invalid("REGEN names more sources than k + r"));
        }
        let mut sources = Vec::with_capacity(n);
        for _ in 0..n {
            let b = r.bytes(4)?;
            if b[1] > 1 || b[2] != 0 || b[3] != 0 {
                return Err(WireError::Invalid("REGEN source has unknown flags"));
            }
            sources.push(RegenSource {
                split: b[0],
                copy: b[1] == 1,
                slab: r.u32()?,
                node: r.u32()?,
            });
        }
        r.end()?;
        let req = Regen {
            client,
            k,
            r: rr,
            target,
            split_len,
            slab,
            pages,
            range,
            checksums,
            sources,
        };
        req.check_shape()?;
        Ok(req)
    }

    /// The shape every REGEN must have, whoever built it: k >= 1, k + r <= [`MAX_GROUP`], the
    /// target and every source's split inside the group, at most k + r sources.
    pub fn check_shape(&self) -> Result<(), WireError> {
        let width = self.k as usize + self.r as usize;
        if self.k == 0 || width > MAX_GROUP || self.target as usize >= width {
            return Err(WireError::Invalid(
                "REGEN needs k >= 1, k + r <= 32 and a target split inside the group",
            ));
        }
        if self.sources.len() > width {
            return Err(WireError::Invalid("REGEN names more sources than k + r"));
        }
        if self.sources.iter().any(|s| s.split as usize >= width) {
            return Err(WireError::Invalid(
                "REGEN source names a split outside the group",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regen_copy_flag_round_trips_and_unknown_flags_are_refused() {
        let req = Regen {
            client: ClientId::random(),
            k: 1,
            r: 1,
            target: 1,
            split_len: 4096,
            slab: 9,
            pages: 16,
            range: 5,
            checksums: true,
            sources: vec![RegenSource {
                split: 1,
                copy: true,
                slab: 3,
                node: 4,
            }],
        };
        let mut out = Vec::new();
        req.put(&mut out);
        assert_eq!(Regen::parse(&out).unwrap(), req);
        // At most k + r sources, each inside the group, and a group of at most 32.
        let mut more = req.clone();
        more.sources = vec![more.sources[0].clone(); 3];
        let mut body = Vec::new();
        more.put(&mut body);
        assert!(Regen::parse(&body).is_err(), "3 sources for k + r = 2");
        more.sources.truncate(1);
        more.sources[0].split = 2;
        body.clear();
        more.put(&mut body);
        assert!(
            Regen::parse(&body).is_err(),
            "source split outside the group"
        );
        let mut wide = req.clone();
        (wide.k, wide.r) = (30, 3);
        body.clear();
        wide.put(&mut body);
        assert!(Regen::parse(&body).is_err(), "k + r = 33");
        // flags byte of the first source: after 16 + 4 + 4 + 4 + 8 + 8 + 4 bytes and the split.
        let mut bad = out.clone();
        bad[16 + 4 + 4 + 4 + 8 + 8 + 4 + 1] = 2;
        assert!(Regen::parse(&bad).is_err());
        // The request's own flags byte.
        out[19] = 3;
        assert!(Regen::parse(&out).is_err());
    }
}
