//! Landing a chunk of the target slab: decoded from k sources, or copied from one.
//!
//! **Decoding.** For every page of a chunk the k active sources' splits are checked (their
//! checksums, when the client keeps them) and compared: where all k carry one version, the
//! page is *plain*. Reed-Solomon works byte by byte, so the lost split of a stretch of plain
//! pages is one decode of the k sources' stretches — the contiguous data of their reply runs,
//! used where it was received — written straight into the slab's memory under the slab's
//! lock ([`Slab::store_run`], which stores only the pages whose stored version is older: a page
//! the client wrote meanwhile keeps its newer split). No page is copied on the way. The other
//! pages (splits that disagree — a write in flight — or fail their checksum) are rebuilt one by
//! one from k splits of one version among every source, the spares read for that chunk too;
//! a page with no k splits of one version is left to the write that races it. Pages never
//! written (version 0 everywhere) are skipped.
//!
//! **Copying.** A copy source holds the very bytes the target must get: its chunk lands with
//! one copy, every split through the same version check. A split that fails its checksum makes
//! the whole copy untrustworthy: the caller then decodes instead.
//!
//! Invariants: a page is rebuilt only from k splits of one version that passed their
//! checksums, and stored with that version and the checksum bound to the target split, so a
//! corrupted source is never laundered into a rebuilt split with a fresh, valid checksum.

use std::ops::Range;

use hydramem_isal::Codec;

use super::pipeline::Pipeline;
use super::source::Source;
use super::RegenError;
use crate::integrity;
use crate::node::{Landing, Slab};
use crate::wire::{Regen, ReplyRun, Status, MAX_GROUP};

/// Slots landed per slab lock: a client's write to the slab waits at most for one such
/// stretch to be decoded.
const LAND_SLOTS: usize = 128;

/// Versions from here up mark a source split that failed its checksum (one per split index);
/// no stored version reaches them (they are above [`crate::wire::MAX_VERSION`]).
const CORRUPT: u64 = u64::MAX - 256;

/// One regeneration's target, and the buffers it reuses from chunk to chunk.
pub struct Rebuild<'a> {
    slab: &'a Slab,
    req: &'a Regen,
    /// The client's address range when it keeps checksums.
    check: Option<u64>,
    /// Per source (active, then extra), per page: the split's version, or a [`CORRUPT`] marker.
    good: Vec<Vec<u64>>,
    /// Per page: the version to land by decoding (0: not a plain page).
    plain: Vec<u64>,
    /// Per page of the chunk being decoded: the target split's tag, decoded.
    tags: Vec<u64>,
    /// One rebuilt split.
    split: Vec<u8>,
}

/// Slots `first..first + n` of the slab: what one request to a source covers.
#[derive(Debug, Clone, Copy)]
pub struct Chunk {
    /// The first slot.
    pub first: u64,
    /// Slots.
    pub n: usize,
}

/// The version of split `p` of `run` (slot `slot`, split index `split`) if it passes its
/// checksum (`check`: the client's range, when it keeps checksums), else a [`CORRUPT`]
/// marker. Splits never written are not checked (a page whose splits are all unwritten is
/// skipped either way).
fn judge(check: Option<u64>, run: &ReplyRun<'_>, p: usize, slot: u64, split: usize) -> u64 {
    let f = run.split(p);
    match check {
        Some(range)
            if f.version != 0
                && !integrity::verify(run.split_data(p), f.crc, range, slot, split, f.version) =>
        {
            metrics::counter!("hydramem_node_regen_corrupt_splits_total").increment(1);
            tracing::warn!(
                split,
                slot,
                "regeneration source returned a split that fails its checksum; \
                 rebuilding that page from the other sources"
            );
            CORRUPT + split as u64
        }
        _ => f.version,
    }
}

/// The target split's tag, decoded from k sources' tags (split index, tag) as its bytes are
/// (see [`crate::tags`]).
fn decode_tag(
    codec: &Codec,
    tags: impl Iterator<Item = (usize, u64)>,
    target: usize,
) -> Result<u64, RegenError> {
    crate::tags::reconstruct(codec, tags, target)
        .map_err(|e| RegenError::Invalid(format!("decoding a split's tag: {e}")))
}

impl<'a> Rebuild<'a> {
    /// A rebuild of `slab` as `req` asks.
    pub fn new(slab: &'a Slab, req: &'a Regen) -> Rebuild<'a> {
        Rebuild {
            slab,
            req,
            check: req.checksums.then_some(req.range),
            good: Vec::new(),
            plain: Vec::new(),
            tags: Vec::new(),
            split: Vec::new(),
        }
    }

    fn split_len(&self) -> usize {
        self.req.split_len as usize
    }

    /// Judges chunk `c` of every source in `sources` into `good[base..]`.
    fn judge_all(&mut self, sources: &mut [Source], c: Chunk, base: usize) {
        if self.good.len() < base + sources.len() {
            self.good.resize_with(base + sources.len(), Vec::new);
        }
        for (src, g) in sources.iter_mut().zip(&mut self.good[base..]) {
            g.clear();
            let run = src.fetched();
            let split = src.split;
            g.extend((0..c.n).map(|p| judge(self.check, &run, p, c.first + p as u64, split)));
            src.corrupt += g.iter().filter(|v| **v >= CORRUPT).count() as u32;
        }
    }

    /// Lands chunk `c` by decoding (see the module doc); returns the pages rebuilt.
    pub fn decode_chunk(
        &mut self,
        codec: &Codec,
        p: &mut Pipeline<'_>,
        c: Chunk,
    ) -> Result<u64, RegenError> {
        let k = p.active.len();
        self.judge_all(&mut p.active, c, 0);
        self.plain.clear();
        let mut others = 0;
        for page in 0..c.n {
            let v = self.good[0][page];
            let agree = (1..k).all(|i| self.good[i][page] == v);
            self.plain.push(if agree && v < CORRUPT { v } else { 0 });
            others += usize::from(!agree || v >= CORRUPT);
        }
        let mut done = self.plain.iter().filter(|v| **v != 0).count() as u64;
        if done > 0 {
            self.tags.clear();
            let target = self.req.target as usize;
            for page in 0..c.n {
                let tags = p
                    .active
                    .iter()
                    .map(|s| (s.split, s.fetched().split(page).tag));
                let tag = match self.plain[page] {
                    0 => 0,
                    _ => decode_tag(codec, tags, target)?,
                };
                self.tags.push(tag);
            }
            self.slab.prefault(c.first, c.n as u64);
            let present: Vec<(usize, &[u8])> = p
                .active
                .iter()
                .map(|src| (src.split, src.fetched().data()))
                .collect();
            for start in (0..c.n).step_by(LAND_SLOTS) {
                let pages = start..c.n.min(start + LAND_SLOTS);
                if self.plain[pages.clone()].iter().all(|v| *v == 0) {
                    continue;
                }
                let from = From::Decode {
                    codec,
                    present: &present,
                };
                self.land(from, &self.plain, c.first, pages)?;
            }
        }
        if others > 0 {
            done += self.decode_others(codec, p, c)?;
        }
        Ok(done)
    }

    /// Rebuilds, one by one, the pages of chunk `c` whose active splits do not make a plain
    /// page, from k splits of one version among every source.
    fn decode_others(
        &mut self,
        codec: &Codec,
        p: &mut Pipeline<'_>,
        c: Chunk,
    ) -> Result<u64, RegenError> {
        let (k, len) = (p.active.len(), self.split_len());
        p.fetch_extra(c.first, c.n as u64);
        self.judge_all(&mut p.extra, c, k);
        let all: Vec<(usize, &[u8])> = p
            .active
            .iter()
            .chain(&p.extra)
            .map(|src| (src.split, src.fetched().data()))
            .collect();
        let tags: Vec<Vec<u64>> = p
            .active
            .iter()
            .chain(&p.extra)
            .map(|src| (0..c.n).map(|page| src.fetched().split(page).tag).collect())
            .collect();
        self.split.resize(len, 0);
        let (target, check, slab) = (self.req.target as usize, self.check, self.slab);
        let (good, plain, rebuilt) = (&self.good, &self.plain, &mut self.split);
        let mut done = 0;
        for page in (0..c.n).filter(|page| plain[*page] == 0) {
            let sources = all.len();
            let holders = move |v: u64| (0..sources).filter(move |i| good[*i][page] == v);
            let newest = (0..sources)
                .map(|i| good[i][page])
                .filter(|v| *v != 0 && *v < CORRUPT && holders(*v).count() >= k)
                .max();
            let Some(v) = newest else { continue };
            let mut present: [(usize, &[u8]); MAX_GROUP] = [(0, &[]); MAX_GROUP];
            for (slot, i) in present.iter_mut().zip(holders(v).take(k)) {
                *slot = (all[i].0, &all[i].1[page * len..(page + 1) * len]);
            }
            codec
                .reconstruct(&present[..k], &mut [(target, &mut rebuilt[..])])
                .map_err(|e| RegenError::Invalid(e.to_string()))?;
            let tags = holders(v).take(k).map(|i| (all[i].0, tags[i][page]));
            let tag = decode_tag(codec, tags, target)?;
            let slot = c.first + page as u64;
            let crc = check.map_or(0, |range| {
                integrity::split_crc(rebuilt, range, slot, target, v)
            });
            match slab.store_tagged(slot * len as u64, rebuilt, (v, crc, tag)) {
                Ok(()) | Err(Status::Stale) => done += 1,
                Err(st) => return Err(RegenError::Invalid(format!("storing slot {slot}: {st}"))),
            }
        }
        Ok(done)
    }

    /// Lands chunk `c` of the one active (copy) source with one copy; returns the splits
    /// stored, or an error if any failed its checksum (the copy is then not trusted).
    pub fn copy_chunk(&mut self, p: &mut Pipeline<'_>, c: Chunk) -> Result<u64, RegenError> {
        self.judge_all(&mut p.active[..1], c, 0);
        let src = &p.active[0];
        if let Some(page) = self.good[0].iter().position(|v| *v >= CORRUPT) {
            return Err(RegenError::Source(format!(
                "copy source split {} failed its checksum at slot {}",
                src.split,
                c.first + page as u64
            )));
        }
        let done = self.good[0].iter().filter(|v| **v != 0).count() as u64;
        if done > 0 {
            self.slab.prefault(c.first, c.n as u64);
            let run = src.fetched();
            for start in (0..c.n).step_by(LAND_SLOTS) {
                let from = From::Copy {
                    run: &run,
                    same_split: src.split == self.req.target as usize,
                };
                self.land(
                    from,
                    &self.good[0],
                    c.first,
                    start..c.n.min(start + LAND_SLOTS),
                )?;
            }
        }
        Ok(done)
    }

    /// Stores pages `pages` of the chunk from slot `first` (whose versions are
    /// `versions[pages]`, 0 to skip) through the slab's version check, their data coming
    /// `from` decoding or a copy.
    fn land(
        &self,
        from: From<'_>,
        versions: &[u64],
        first: u64,
        pages: Range<usize>,
    ) -> Result<(), RegenError> {
        let len = self.req.split_len as u64;
        let at = first + pages.start as u64;
        let m = pages.len();
        let mut stretch = Stretch {
            r: self,
            from,
            versions: &versions[pages.clone()],
            at: pages.start,
            first: at,
        };
        self.slab
            .store_run(at * len, len, m, &mut stretch)
            .map_err(|st| RegenError::Invalid(format!("storing slots from {at}: {st}")))
    }
}

/// Where the splits of a stretch come from.
enum From<'a> {
    /// Decoded from the k sources' chunk data (split index, data).
    Decode {
        codec: &'a Codec,
        present: &'a [(usize, &'a [u8])],
    },
    /// Copied from a copy source's reply run. When the source is the target's own split (a
    /// moved slab) its checksums carry over as they are; another split's (a replica's) are
    /// bound again to the target's index.
    Copy {
        run: &'a ReplyRun<'a>,
        same_split: bool,
    },
}

/// A stretch of pages of a chunk landing in the slab.
struct Stretch<'a, 'b> {
    r: &'a Rebuild<'b>,
    from: From<'a>,
    /// Per page of the stretch: the version to land, 0 to skip.
    versions: &'a [u64],
    /// The stretch's first page in the chunk.
    at: usize,
    /// The stretch's first slot.
    first: u64,
}

impl Landing for Stretch<'_, '_> {
    fn version(&self, i: usize) -> u64 {
        self.versions[i]
    }

    fn fill(&mut self, span: Range<usize>, dst: &mut [u8]) -> Result<(), Status> {
        let len = self.r.split_len();
        let bytes = (self.at + span.start) * len..(self.at + span.end) * len;
        match self.from {
            From::Decode { codec, present } => {
                let mut stretch: [(usize, &[u8]); MAX_GROUP] = [(0, &[]); MAX_GROUP];
                for (slot, (split, data)) in stretch.iter_mut().zip(present) {
                    *slot = (*split, &data[bytes.clone()]);
                }
                let target = self.r.req.target as usize;
                codec
                    .reconstruct(&stretch[..present.len()], &mut [(target, dst)])
                    .map_err(|_| Status::Internal)
            }
            From::Copy { run, .. } => {
                dst.copy_from_slice(&run.data()[bytes]);
                Ok(())
            }
        }
    }

    fn tag(&self, i: usize) -> u64 {
        match self.from {
            From::Copy { run, .. } => run.split(self.at + i).tag,
            From::Decode { .. } => self.r.tags[self.at + i],
        }
    }

    fn crc(&mut self, i: usize, data: &[u8]) -> u32 {
        let Some(range) = self.r.check else { return 0 };
        match self.from {
            From::Copy {
                run,
                same_split: true,
            } => run.split(self.at + i).crc,
            _ => {
                let (slot, target) = (self.first + i as u64, self.r.req.target as usize);
                integrity::split_crc(data, range, slot, target, self.versions[i])
            }
        }
    }
}
