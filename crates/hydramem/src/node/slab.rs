//! One slab: a fixed-size region of a node's memory owned by one client identity, holding
//! splits of one length, each with the version, checksum and tag of the write that stored it.
//!
//! Invariants:
//! - a slab holds `slots = slab_size / split_len` split slots; every access is a *run* of whole
//!   splits, slots `first..first + n` with `first + n <= slots`, checked with arithmetic that
//!   cannot overflow, so no offset a peer sends can reach outside the slab or panic the node;
//! - the bytes, versions and checksums live together behind one lock: readers share it,
//!   a writer holds it exclusively (`&mut`), so a read never sees a torn split or a split with
//!   another split's version; a run takes the lock once, and its bytes, being consecutive
//!   slots, are one contiguous region: one copy serves it;
//! - a split is replaced only by a newer version (`1..=MAX_VERSION`); an equal version is a
//!   repeated write and changes nothing; an older one is refused as `Stale` and the caller
//!   learns the version stored;
//! - `newest` is at least every version stored in the slab (what LIST reports);
//! - `held` counts the slots whose version is not 0 (written and not discarded since), kept
//!   under the write lock beside the versions it counts: it is the memory the slab's data
//!   occupies, holes a client gave back with DISCARD excluded.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use super::memory::{Advisor, SlabMemory};
use crate::wire::{ClientId, SlabStats, Status, MAX_VERSION, SLAB_RECLAIMED};

/// [`Slab::reclaim`] of a slab a drain reclaimed: no deadline.
pub(super) const NO_DEADLINE: u64 = u64::MAX;

/// The slab's bytes and, per split slot, the version (u64 little-endian), the checksum the
/// client gave (u32 little-endian; stored and returned, never computed) and the split's tag
/// (u64 little-endian, likewise). All four mappings are lazily backed, so untouched slots cost
/// nothing.
struct SlabData {
    memory: SlabMemory,
    versions: SlabMemory,
    crcs: SlabMemory,
    tags: SlabMemory,
    /// Slots whose version is not 0.
    held: u64,
}

impl SlabData {
    fn version(&self, slot: u64) -> Result<u64, Status> {
        let mut v = [0u8; 8];
        self.versions
            .read(slot * 8, &mut v)
            .ok_or(Status::Internal)?;
        Ok(u64::from_le_bytes(v))
    }

    fn crc(&self, slot: u64) -> Result<u32, Status> {
        let mut c = [0u8; 4];
        self.crcs.read(slot * 4, &mut c).ok_or(Status::Internal)?;
        Ok(u32::from_le_bytes(c))
    }

    fn tag(&self, slot: u64) -> Result<u64, Status> {
        let mut t = [0u8; 8];
        self.tags.read(slot * 8, &mut t).ok_or(Status::Internal)?;
        Ok(u64::from_le_bytes(t))
    }

    fn set_stamp(&mut self, slot: u64, version: u64, crc: u32, tag: u64) -> Result<(), Status> {
        match (self.version(slot)? == 0, version == 0) {
            (true, false) => self.held += 1,
            (false, true) => self.held -= 1,
            _ => {}
        }
        self.versions
            .write(slot * 8, &version.to_le_bytes())
            .ok_or(Status::Internal)?;
        self.crcs
            .write(slot * 4, &crc.to_le_bytes())
            .ok_or(Status::Internal)?;
        self.tags
            .write(slot * 8, &tag.to_le_bytes())
            .ok_or(Status::Internal)
    }
}

/// A run of splits being read under the slab's read lock (see [`Slab::read_run`]).
pub struct RunView<'a> {
    data: &'a [u8],
    versions: &'a [u8],
    crcs: &'a [u8],
    tags: &'a [u8],
    slab: &'a SlabData,
    first: u64,
    slots: u64,
    split_len: usize,
}

impl<'a> RunView<'a> {
    /// The run's bytes, split i at `i × split_len`.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// The version, checksum and tag stored with split `i`.
    pub fn stamp(&self, i: usize) -> (u64, u32, u64) {
        let v = u64::from_le_bytes(self.versions[8 * i..8 * i + 8].try_into().expect("8"));
        let c = u32::from_le_bytes(self.crcs[4 * i..4 * i + 4].try_into().expect("4"));
        let t = u64::from_le_bytes(self.tags[8 * i..8 * i + 8].try_into().expect("8"));
        (v, c, t)
    }

    /// The bytes and checksum of the slot next to split `i` (the previous one for the slab's
    /// last slot, the slot itself in a slab of one slot): an injected misdirected read.
    pub fn neighbour(&self, i: usize) -> (&'a [u8], u32) {
        let slot = self.first + i as u64;
        let other = if slot + 1 < self.slots {
            slot + 1
        } else {
            slot.saturating_sub(1)
        };
        let bytes = self
            .slab
            .memory
            .bytes(other * self.split_len as u64, self.split_len)
            .expect("a slot of the slab");
        (bytes, self.slab.crc(other).unwrap_or(0))
    }
}

/// Where the splits of a run being stored come from, and where their outcomes go (see
/// [`Slab::store_run`]).
pub trait Landing {
    /// The version of split `i`; one outside `1..=MAX_VERSION` is refused and not stored.
    fn version(&self, i: usize) -> u64;
    /// Writes the data of splits `span` into `dst`, the slab's bytes for them
    /// (`span.len() × split_len`). On error `dst` must be left untouched.
    fn fill(&mut self, span: std::ops::Range<usize>, dst: &mut [u8]) -> Result<(), Status>;
    /// The checksum to store with split `i`, whose bytes are now `data`.
    fn crc(&mut self, i: usize, data: &[u8]) -> u32;
    /// The tag to store with split `i`.
    fn tag(&self, i: usize) -> u64;
    /// Split `i` was stored (after [`Landing::crc`]); `bytes` is its copy in the slab, still
    /// under the lock (injected corruption of stored copies).
    fn landed(&mut self, _i: usize, _bytes: &mut [u8]) {}
    /// The outcome of split `i` and the version stored for it afterwards: `Ok` (stored now,
    /// or that very version already was), `Stale` (a newer one is, and stays) or `BadRequest`
    /// (an invalid version; 0).
    fn outcome(&mut self, _i: usize, _status: Status, _stored: u64) {}
}

/// One split given with its checksum ([`Slab::store`]).
struct OneSplit<'a> {
    data: &'a [u8],
    version: u64,
    crc: u32,
    tag: u64,
    status: Status,
}

impl Landing for OneSplit<'_> {
    fn version(&self, _: usize) -> u64 {
        self.version
    }
    fn fill(&mut self, _: std::ops::Range<usize>, dst: &mut [u8]) -> Result<(), Status> {
        dst.copy_from_slice(self.data);
        Ok(())
    }
    fn crc(&mut self, _: usize, _: &[u8]) -> u32 {
        self.crc
    }
    fn tag(&self, _: usize) -> u64 {
        self.tag
    }
    fn outcome(&mut self, _: usize, status: Status, _: u64) {
        self.status = status;
    }
}

/// One allocated slab.
pub struct Slab {
    pub(super) owner: ClientId,
    pub(super) tag: u64,
    split_len: u64,
    slots: u64,
    data: RwLock<SlabData>,
    /// Advice about `data.memory`'s mapping, given without the lock.
    advisor: Advisor,
    /// At least the newest version stored in any slot.
    newest: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    touched: AtomicU64,
    /// 0: not reclaimed; otherwise the reclaim deadline in milliseconds since the node's
    /// epoch, plus one ([`NO_DEADLINE`]: reclaimed by a drain, which waits for the owner).
    pub(super) reclaim: AtomicU64,
    /// reads + writes at the last control step.
    pub(super) last_accesses: AtomicU64,
    /// Decaying access count: halved every control step, plus the accesses since the last.
    pub(super) activity: AtomicU64,
    /// Corrupted splits its owner reported (CORRUPT).
    pub(super) corrupt: AtomicU64,
}

impl Slab {
    /// A slab of `memory.len()` bytes for splits of `split_len` bytes (validated by the
    /// caller: `0 < split_len <= memory.len()`); maps its version and checksum tables.
    pub(super) fn new(
        owner: ClientId,
        tag: u64,
        split_len: u64,
        memory: SlabMemory,
    ) -> std::io::Result<Slab> {
        let slots = memory.len() as u64 / split_len.max(1);
        let table = |per: u64| {
            usize::try_from(slots.saturating_mul(per).max(per))
                .map_err(|_| std::io::Error::other("slab tables exceed the address space"))
                .and_then(SlabMemory::new)
        };
        let (versions, crcs, tags) = (table(8)?, table(4)?, table(8)?);
        Ok(Slab {
            owner,
            tag,
            split_len,
            slots,
            advisor: memory.advisor(),
            data: RwLock::new(SlabData {
                memory,
                versions,
                crcs,
                tags,
                held: 0,
            }),
            newest: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            touched: AtomicU64::new(0),
            reclaim: AtomicU64::new(0),
            last_accesses: AtomicU64::new(0),
            activity: AtomicU64::new(0),
            corrupt: AtomicU64::new(0),
        })
    }

    /// The length of every split of this slab (fixed at ALLOC).
    pub fn split_len(&self) -> u64 {
        self.split_len
    }

    /// Number of split slots.
    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// At least the newest version stored in the slab (0: nothing written).
    pub fn newest(&self) -> u64 {
        self.newest.load(Ordering::Relaxed)
    }

    /// The first slot of a run of `n` whole splits of `split_len` bytes from `offset`, or the
    /// error for a run this slab cannot serve: another split length or a misaligned offset
    /// ([`Status::BadRequest`]), slots past the end ([`Status::OutOfRange`]). Cannot overflow:
    /// on success `first + n <= slots`, so every split of the run lies within the slab.
    fn run_slots(&self, offset: u64, split_len: u64, n: usize) -> Result<u64, Status> {
        if split_len != self.split_len || !offset.is_multiple_of(self.split_len) || n == 0 {
            return Err(Status::BadRequest);
        }
        let first = offset / self.split_len;
        match first.checked_add(n as u64) {
            Some(end) if end <= self.slots => Ok(first),
            _ => Err(Status::OutOfRange),
        }
    }

    /// Reads the run of `n` splits of `split_len` bytes from `offset` under one read lock:
    /// `f` sees their bytes (contiguous), versions and checksums. Counts the accesses.
    pub fn read_run<R>(
        &self,
        offset: u64,
        split_len: u64,
        n: usize,
        f: impl FnOnce(RunView<'_>) -> R,
    ) -> Result<R, Status> {
        let first = self.run_slots(offset, split_len, n)?;
        let d = self.data.read();
        let len = self.split_len as usize;
        let view = RunView {
            data: d.memory.bytes(offset, n * len).ok_or(Status::Internal)?,
            versions: d.versions.bytes(first * 8, n * 8).ok_or(Status::Internal)?,
            crcs: d.crcs.bytes(first * 4, n * 4).ok_or(Status::Internal)?,
            tags: d.tags.bytes(first * 8, n * 8).ok_or(Status::Internal)?,
            slab: &d,
            first,
            slots: self.slots,
            split_len: len,
        };
        let r = f(view);
        drop(d);
        self.reads.fetch_add(n as u64, Ordering::Relaxed);
        self.bytes_read
            .fetch_add((n * len) as u64, Ordering::Relaxed);
        Ok(r)
    }

    /// Stores the run of `n` splits of `split_len` bytes from `offset` under one write lock,
    /// each through the version check: a split is stored only if its version is newer than
    /// the stored one. Consecutive splits that are all stored are filled in one call of
    /// [`Landing::fill`] (one copy for a run that is newer throughout); every split's outcome
    /// goes to [`Landing::outcome`]. Fails as a whole, storing nothing, for a run the slab
    /// cannot serve, and stops at a fill that fails (the splits before it are stored).
    pub fn store_run(
        &self,
        offset: u64,
        split_len: u64,
        n: usize,
        l: &mut impl Landing,
    ) -> Result<(), Status> {
        let first = self.run_slots(offset, split_len, n)?;
        let len = self.split_len as usize;
        let valid = |v: u64| (1..=MAX_VERSION).contains(&v);
        let mut d = self.data.write();
        let (mut applied, mut newest, mut end) = (0u64, 0u64, 0u64);
        let mut i = 0;
        while i < n {
            let start = i;
            while i < n && valid(l.version(i)) && l.version(i) > d.version(first + i as u64)? {
                i += 1;
            }
            if i > start {
                let at = (first + start as u64) * self.split_len;
                let dst = d.memory.bytes_mut(at, (i - start) * len);
                l.fill(start..i, dst.ok_or(Status::Internal)?)?;
                for j in start..i {
                    let (slot, v) = (first + j as u64, l.version(j));
                    let bytes = d.memory.bytes_mut(slot * self.split_len, len);
                    let bytes = bytes.ok_or(Status::Internal)?;
                    let crc = l.crc(j, bytes);
                    l.landed(j, bytes);
                    d.set_stamp(slot, v, crc, l.tag(j))?;
                    l.outcome(j, Status::Ok, v);
                    newest = newest.max(v);
                }
                applied += (i - start) as u64;
                end = (first + i as u64) * self.split_len;
                continue;
            }
            let (v, stored) = (l.version(i), d.version(first + i as u64)?);
            match v {
                _ if !valid(v) => l.outcome(i, Status::BadRequest, 0),
                _ if v < stored => l.outcome(i, Status::Stale, stored),
                _ => l.outcome(i, Status::Ok, v),
            }
            i += 1;
        }
        drop(d);
        if applied > 0 {
            self.newest.fetch_max(newest, Ordering::Relaxed);
            self.writes.fetch_add(applied, Ordering::Relaxed);
            self.bytes_written
                .fetch_add(applied * self.split_len, Ordering::Relaxed);
            self.touched.fetch_max(end, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Copies one split out of the slab and returns its version, counting the access.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<u64, Status> {
        self.load(offset, out).map(|(version, _)| version)
    }

    /// Copies one split out of the slab and returns its version and checksum, counting the
    /// access.
    pub fn load(&self, offset: u64, out: &mut [u8]) -> Result<(u64, u32), Status> {
        self.read_run(offset, out.len() as u64, 1, |v| {
            out.copy_from_slice(v.data());
            let (version, crc, _) = v.stamp(0);
            (version, crc)
        })
    }

    /// The versions and tags stored in slots `first..first + n` (STAMPS), under one read
    /// lock; refused with [`Status::OutOfRange`] past the slab's end (checked without
    /// overflow).
    pub fn stamps(&self, first: u64, n: u64) -> Result<Vec<(u64, u64)>, Status> {
        let end = first
            .checked_add(n)
            .filter(|end| *end <= self.slots && n > 0)
            .ok_or(Status::OutOfRange)?;
        let d = self.data.read();
        (first..end)
            .map(|slot| Ok((d.version(slot)?, d.tag(slot)?)))
            .collect()
    }

    /// The version stored at `offset` now (0: never written), or the error for an access
    /// [`Slab::load`] would refuse.
    pub fn stored_version(&self, offset: u64) -> Result<u64, Status> {
        let slot = self.run_slots(offset, self.split_len, 1)?;
        self.data.read().version(slot)
    }

    /// [`Slab::store`] with checksum 0 (a client that keeps none).
    pub fn write(&self, offset: u64, data: &[u8], version: u64) -> Result<(), Status> {
        self.store(offset, data, version, 0)
    }

    /// Stores one split of `version` with its checksum unless a newer version is stored
    /// ([`Status::Stale`]: [`Slab::stored_version`] tells which); an equal version is
    /// acknowledged without rewriting. A version outside `1..=MAX_VERSION` is refused with
    /// [`Status::BadRequest`].
    pub fn store(&self, offset: u64, data: &[u8], version: u64, crc: u32) -> Result<(), Status> {
        self.store_tagged(offset, data, (version, crc, 0))
    }

    /// [`Slab::store`] of a split with its tag: `(version, crc, tag)`.
    pub fn store_tagged(
        &self,
        offset: u64,
        data: &[u8],
        (version, crc, tag): (u64, u32, u64),
    ) -> Result<(), Status> {
        let mut one = OneSplit {
            data,
            version,
            crc,
            tag,
            status: Status::Ok,
        };
        self.store_run(offset, data.len() as u64, 1, &mut one)?;
        match one.status {
            Status::Ok => Ok(()),
            st => Err(st),
        }
    }

    /// Injected corruption: flips one random bit of the stored split at `offset` (a whole
    /// split, as for [`Slab::write`]), leaving its version as it was.
    pub fn corrupt(&self, offset: u64) -> Result<(), Status> {
        let len = self.split_len as usize;
        self.run_slots(offset, self.split_len, 1)?;
        let mut d = self.data.write();
        let split = d.memory.bytes_mut(offset, len).ok_or(Status::Internal)?;
        super::flip_random_bit(split);
        Ok(())
    }

    /// Injected corruption at rest: flips one bit in every split that was ever written;
    /// returns how many.
    pub fn corrupt_written(&self) -> u64 {
        let slots = self
            .touched
            .load(Ordering::Relaxed)
            .div_ceil(self.split_len)
            .min(self.slots);
        (0..slots)
            .filter(|&slot| {
                let written = self.data.read().version(slot).is_ok_and(|v| v != 0);
                written && self.corrupt(slot * self.split_len).is_ok()
            })
            .count() as u64
    }

    /// Injected misdirected read: copies the split of the slot next to `offset` (the previous
    /// one for the last slot) with its checksum, and returns the version stored for `offset`,
    /// as a node that reads the wrong address but the right version would.
    pub fn read_misdirected(&self, offset: u64, out: &mut [u8]) -> Result<(u64, u32), Status> {
        self.read_run(offset, out.len() as u64, 1, |v| {
            let (data, crc) = v.neighbour(0);
            out.copy_from_slice(data);
            (v.stamp(0).0, crc)
        })
    }

    /// Gives back the memory of slots `first..first + n` (DISCARD): their bytes read as
    /// zeros, their versions, checksums and tags as never written. When they reach the slab's
    /// high-water mark of written slots, the mark comes down to `first`. Refused with
    /// [`Status::OutOfRange`] past the slab's end (checked without overflow).
    pub fn discard(&self, first: u64, n: u64) -> Result<(), Status> {
        let end = first
            .checked_add(n)
            .filter(|end| *end <= self.slots && n > 0)
            .ok_or(Status::OutOfRange)?;
        let bytes = |per: u64| usize::try_from(n * per).map_err(|_| Status::OutOfRange);
        let mut d = self.data.write();
        let mut written = 0;
        for slot in first..end {
            written += u64::from(d.version(slot)? != 0);
        }
        d.memory
            .discard(first * self.split_len, bytes(self.split_len)?)
            .ok_or(Status::Internal)?;
        d.versions
            .discard(first * 8, bytes(8)?)
            .ok_or(Status::Internal)?;
        d.crcs
            .discard(first * 4, bytes(4)?)
            .ok_or(Status::Internal)?;
        d.tags
            .discard(first * 8, bytes(8)?)
            .ok_or(Status::Internal)?;
        d.held -= written;
        let _ = self
            .touched
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                (t <= end * self.split_len && t > first * self.split_len)
                    .then_some(first * self.split_len)
            });
        Ok(())
    }

    /// Backs the memory of the `n` split slots from `slot` now, so that filling them does
    /// not fault page by page (best effort; no byte changes, and no lock: readers and
    /// writers of the slab go on meanwhile).
    pub fn prefault(&self, slot: u64, n: u64) {
        let len = usize::try_from(n.saturating_mul(self.split_len)).unwrap_or(usize::MAX);
        self.advisor
            .prefault(slot.saturating_mul(self.split_len), len);
    }

    /// The slab's counters for STATS.
    pub(super) fn stats(&self, id: u32) -> SlabStats {
        SlabStats {
            slab: id,
            owner: self.owner.fingerprint(),
            tag: self.tag,
            reads: self.reads.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            held: self.resident(),
            flags: if self.reclaimed() { SLAB_RECLAIMED } else { 0 },
            activity: self.activity.load(Ordering::Relaxed),
            corrupt: self.corrupt.load(Ordering::Relaxed),
        }
    }

    /// reads + writes so far.
    pub(super) fn accesses(&self) -> u64 {
        self.reads.load(Ordering::Relaxed) + self.writes.load(Ordering::Relaxed)
    }

    pub(super) fn reclaimed(&self) -> bool {
        self.reclaim.load(Ordering::Relaxed) != 0
    }

    /// Bytes of memory this slab's data occupies now: its slots that hold a version (written
    /// and not discarded since).
    pub(super) fn resident(&self) -> u64 {
        self.data.read().held * self.split_len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slab(split_len: u64) -> Slab {
        Slab::new(
            ClientId::default(),
            0,
            split_len,
            SlabMemory::new(8192).unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn no_offset_overflows_or_panics_even_with_one_byte_splits() {
        // The reproduction: split_len 1, WRITEV at offset 2^64 - 1.
        let s = slab(1);
        assert_eq!(s.store(u64::MAX, &[1], 5, 0), Err(Status::OutOfRange));
        let mut b = [0u8; 1];
        assert_eq!(s.load(u64::MAX, &mut b), Err(Status::OutOfRange));
        assert_eq!(s.stored_version(u64::MAX), Err(Status::OutOfRange));
        assert_eq!(s.corrupt(u64::MAX), Err(Status::OutOfRange));
        assert_eq!(
            s.read_misdirected(u64::MAX, &mut b),
            Err(Status::OutOfRange)
        );
        // The last slot works, the one after it does not.
        s.store(8191, &[7], 5, 0).unwrap();
        assert_eq!(s.load(8191, &mut b), Ok((5, 0)));
        assert_eq!(s.store(8192, &[1], 5, 0), Err(Status::OutOfRange));
        for offset in [u64::MAX - 511, u64::MAX / 512 * 512, 1 << 63] {
            let s = slab(512);
            assert!(s.store(offset, &[0; 512], 1, 0).is_err());
        }
    }

    #[test]
    fn versions_outside_the_valid_range_are_refused_and_stale_tells_the_stored_one() {
        let s = slab(512);
        assert_eq!(s.store(0, &[1; 512], 0, 0), Err(Status::BadRequest));
        assert_eq!(
            s.store(0, &[1; 512], MAX_VERSION + 1, 0),
            Err(Status::BadRequest)
        );
        assert_eq!(s.store(0, &[1; 512], u64::MAX, 0), Err(Status::BadRequest));
        s.store(512, &[2; 512], 90, 0).unwrap();
        assert_eq!(s.store(512, &[3; 512], 80, 0), Err(Status::Stale));
        assert_eq!(s.stored_version(512), Ok(90));
        assert_eq!(s.newest(), 90);
        s.store(0, &[4; 512], MAX_VERSION, 0).unwrap();
        assert_eq!(s.newest(), MAX_VERSION);
    }

    #[test]
    fn held_counts_the_slots_with_data_and_discarded_holes_leave_it() {
        let s = slab(512);
        for slot in 0..10 {
            s.store(slot * 512, &[1; 512], 5, 0).unwrap();
        }
        s.store(512, &[2; 512], 6, 0).unwrap();
        assert_eq!(s.resident(), 10 * 512, "a rewrite holds no more");
        s.discard(2, 3).unwrap();
        assert_eq!(
            s.resident(),
            7 * 512,
            "a hole in the middle gives its slots back"
        );
        s.discard(2, 4).unwrap();
        assert_eq!(s.resident(), 6 * 512, "slots discarded twice count once");
        s.store(3 * 512, &[3; 512], 7, 0).unwrap();
        assert_eq!(s.resident(), 7 * 512, "a hole written again holds data");
        s.discard(0, 16).unwrap();
        assert_eq!(s.resident(), 0);
    }

    /// Records what [`Slab::store_run`] asks of a landing.
    struct Recorder {
        versions: Vec<u64>,
        fills: Vec<std::ops::Range<usize>>,
        outcomes: Vec<(Status, u64)>,
    }

    impl Landing for Recorder {
        fn version(&self, i: usize) -> u64 {
            self.versions[i]
        }
        fn fill(&mut self, span: std::ops::Range<usize>, dst: &mut [u8]) -> Result<(), Status> {
            for (i, split) in span.clone().zip(dst.chunks_mut(512)) {
                split.fill(self.versions[i] as u8);
            }
            self.fills.push(span);
            Ok(())
        }
        fn crc(&mut self, i: usize, _: &[u8]) -> u32 {
            i as u32
        }
        fn tag(&self, i: usize) -> u64 {
            100 + i as u64
        }
        fn outcome(&mut self, _: usize, status: Status, stored: u64) {
            self.outcomes.push((status, stored));
        }
    }

    fn recorder(versions: &[u64]) -> Recorder {
        Recorder {
            versions: versions.to_vec(),
            fills: Vec::new(),
            outcomes: Vec::new(),
        }
    }

    #[test]
    fn a_run_newer_throughout_lands_in_one_fill_and_a_mixed_one_split_by_split() {
        let s = slab(512);
        let mut all = recorder(&[5, 5, 5, 5]);
        s.store_run(1024, 512, 4, &mut all).unwrap();
        assert_eq!(all.fills, vec![0..4]);
        assert_eq!(all.outcomes, vec![(Status::Ok, 5); 4]);
        // Stale, equal and invalid versions split the run; only newer splits are filled.
        let mut mixed = recorder(&[6, 4, 5, 0, 7]);
        s.store_run(1024, 512, 5, &mut mixed).unwrap();
        assert_eq!(mixed.fills, vec![0..1, 4..5]);
        assert_eq!(
            mixed.outcomes,
            vec![
                (Status::Ok, 6),
                (Status::Stale, 5),
                (Status::Ok, 5),
                (Status::BadRequest, 0),
                (Status::Ok, 7)
            ]
        );
        let (data, stamps) = s
            .read_run(1024, 512, 5, |v| {
                (
                    v.data().to_vec(),
                    (0..5).map(|i| v.stamp(i)).collect::<Vec<_>>(),
                )
            })
            .unwrap();
        assert_eq!(
            stamps,
            vec![
                (6, 0, 100),
                (5, 1, 101),
                (5, 2, 102),
                (5, 3, 103),
                (7, 4, 104)
            ]
        );
        assert_eq!(
            s.stamps(2, 5),
            Ok(vec![(6, 100), (5, 101), (5, 102), (5, 103), (7, 104)])
        );
        assert_eq!(s.stamps(0, 1), Ok(vec![(0, 0)]));
        assert_eq!(s.stamps(15, 2), Err(Status::OutOfRange));
        assert_eq!(s.stamps(u64::MAX, 2), Err(Status::OutOfRange));
        s.discard(2, 1).unwrap();
        assert_eq!(s.stamps(2, 2), Ok(vec![(0, 0), (5, 101)]));
        let firsts: Vec<u8> = data.chunks(512).map(|c| c[0]).collect();
        assert_eq!(firsts, vec![6, 5, 5, 5, 7]);
        assert_eq!((s.newest(), s.stats(0).writes, s.stats(0).reads), (7, 6, 5));
    }

    #[test]
    fn a_run_is_checked_whole_against_the_slab() {
        let s = slab(512); // 16 slots
        let mut r = recorder(&[1; 3]);
        assert_eq!(
            s.store_run(15 * 512, 512, 2, &mut r),
            Err(Status::OutOfRange)
        );
        assert_eq!(s.store_run(100, 512, 1, &mut r), Err(Status::BadRequest));
        assert_eq!(s.store_run(0, 256, 1, &mut r), Err(Status::BadRequest));
        assert_eq!(s.store_run(0, 512, 0, &mut r), Err(Status::BadRequest));
        assert_eq!(
            s.read_run(u64::MAX / 512 * 512, 512, 1, |_| ()),
            Err(Status::OutOfRange)
        );
        assert!(
            r.fills.is_empty() && r.outcomes.is_empty(),
            "nothing stored"
        );
        assert_eq!(s.read_run(14 * 512, 512, 2, |v| v.data().len()), Ok(1024));
    }
}
