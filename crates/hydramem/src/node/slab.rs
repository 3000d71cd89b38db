//! One slab: a fixed-size region of a node's memory owned by one client identity, holding
//! splits of one length, each with the version and checksum of the write that stored it.
//!
//! Invariants:
//! - a slab holds `slots = slab_size / split_len` split slots; every access is one whole split
//!   at `slot × split_len` with `slot < slots`, checked with arithmetic that cannot overflow, so
//!   no offset a peer sends can reach outside the slab or panic the node;
//! - the bytes, versions and checksums live together behind one lock: readers share it,
//!   a writer holds it exclusively (`&mut`), so a read never sees a torn split or a split with
//!   another split's version;
//! - a split is replaced only by a newer version (`1..=MAX_VERSION`); an equal version is a
//!   repeated write and changes nothing; an older one is refused as `Stale` and the caller
//!   learns the version stored;
//! - `newest` is at least every version stored in the slab (what LIST reports).

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use super::memory::SlabMemory;
use crate::wire::{ClientId, SlabStats, Status, MAX_VERSION, SLAB_RECLAIMED};

/// [`Slab::reclaim`] of a slab a drain reclaimed: no deadline.
pub(super) const NO_DEADLINE: u64 = u64::MAX;

/// The slab's bytes and, per split slot, the version (u64 little-endian) and the checksum the
/// client gave (u32 little-endian; stored and returned, never computed). All three mappings
/// are lazily backed, so untouched slots cost nothing.
struct SlabData {
    memory: SlabMemory,
    versions: SlabMemory,
    crcs: SlabMemory,
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
}

/// One allocated slab.
pub struct Slab {
    pub(super) owner: ClientId,
    pub(super) tag: u64,
    split_len: u64,
    slots: u64,
    data: RwLock<SlabData>,
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
        let (versions, crcs) = (table(8)?, table(4)?);
        Ok(Slab {
            owner,
            tag,
            split_len,
            slots,
            data: RwLock::new(SlabData {
                memory,
                versions,
                crcs,
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

    /// The slot index of a whole split at `offset`, or the error for a misaligned or
    /// out-of-range access. Cannot overflow: `slot < slots`, so `slot × split_len` and the
    /// split's end lie within the slab.
    fn slot(&self, offset: u64, len: usize) -> Result<u64, Status> {
        if len as u64 != self.split_len || !offset.is_multiple_of(self.split_len) {
            return Err(Status::BadRequest);
        }
        let slot = offset / self.split_len;
        if slot >= self.slots {
            return Err(Status::OutOfRange);
        }
        Ok(slot)
    }

    /// Copies one split out of the slab and returns its version, counting the access.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<u64, Status> {
        self.load(offset, out).map(|(version, _)| version)
    }

    /// Copies one split out of the slab and returns its version and checksum, counting the
    /// access.
    pub fn load(&self, offset: u64, out: &mut [u8]) -> Result<(u64, u32), Status> {
        let slot = self.slot(offset, out.len())?;
        let d = self.data.read();
        d.memory.read(offset, out).ok_or(Status::OutOfRange)?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.bytes_read
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        Ok((d.version(slot)?, d.crc(slot)?))
    }

    /// The version stored at `offset` now (0: never written), or the error for an access
    /// [`Slab::load`] would refuse.
    pub fn stored_version(&self, offset: u64) -> Result<u64, Status> {
        let slot = self.slot(offset, self.split_len as usize)?;
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
        let slot = self.slot(offset, data.len())?;
        if version == 0 || version > MAX_VERSION {
            return Err(Status::BadRequest);
        }
        let mut d = self.data.write();
        let stored = d.version(slot)?;
        if version < stored {
            return Err(Status::Stale);
        }
        if version == stored {
            return Ok(());
        }
        d.memory.write(offset, data).ok_or(Status::OutOfRange)?;
        d.versions
            .write(slot * 8, &version.to_le_bytes())
            .ok_or(Status::Internal)?;
        d.crcs
            .write(slot * 4, &crc.to_le_bytes())
            .ok_or(Status::Internal)?;
        drop(d);
        self.newest.fetch_max(version, Ordering::Relaxed);
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.bytes_written
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        self.touched
            .fetch_max(offset + data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Injected corruption: flips one random bit of the stored split at `offset` (a whole
    /// split, as for [`Slab::write`]), leaving its version as it was.
    pub fn corrupt(&self, offset: u64) -> Result<(), Status> {
        let len = self.split_len as usize;
        self.slot(offset, len)?;
        let mut d = self.data.write();
        let mut buf = [0u8; 1];
        let bit = rand::random_range(0..len * 8);
        let at = offset + (bit / 8) as u64;
        d.memory.read(at, &mut buf).ok_or(Status::OutOfRange)?;
        buf[0] ^= 1 << (bit % 8);
        d.memory.write(at, &buf).ok_or(Status::OutOfRange)?;
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
        let slot = self.slot(offset, out.len())?;
        let other = if slot + 1 < self.slots {
            slot + 1
        } else {
            slot.saturating_sub(1)
        };
        let d = self.data.read();
        d.memory
            .read(other * self.split_len, out)
            .ok_or(Status::OutOfRange)?;
        Ok((d.version(slot)?, d.crc(other)?))
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
            touched: self.touched.load(Ordering::Relaxed),
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

    /// Bytes of memory this slab occupies now (approximated by how far it was written).
    pub(super) fn resident(&self) -> u64 {
        self.touched.load(Ordering::Relaxed)
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
}
