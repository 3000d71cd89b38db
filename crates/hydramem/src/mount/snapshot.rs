//! Keeping a mount's files across a remount with the same client identity: the metadata is
//! saved into the cluster itself at a clean unmount and loaded at the next mount.
//!
//! Layout in the store's address space: page 0 is the superblock, never given to a file; the
//! snapshot (the namespace and every file's written pages as extents, JSON) lies in pages
//! taken from the allocator at unmount, listed as extents in the superblock with the
//! snapshot's length and CRC32C.
//!
//! ```text
//! superblock (page 0), little endian
//!   0  magic "HYDRAFS1"      8
//!   8  format version (1)    4
//!  12  state: 0 open, 1 clean 4
//!  16  file system bytes     8
//!  24  snapshot bytes        8
//!  32  snapshot CRC32C       4
//!  36  extents n             4   (at most 253)
//!  40  n × (first page 8, pages 8)
//! ```
//!
//! Invariants: a snapshot is loaded only from a superblock that says clean, with the same
//! file system size, and whose snapshot passes its CRC; right after loading, the mount writes
//! the superblock back as open, before any page can be allocated — so if the mount process
//! dies, the next mount finds no snapshot and starts empty (the files are lost, as memory's
//! are), instead of loading metadata whose pages were reused since. Unwritten pages are not
//! saved (they read as zeros either way).

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::namespace::{Ino, Kind, Meta};
use super::table::Entry;
use crate::client::{IoError, Page};
use crate::nbd::PageStore;
use crate::PAGE_SIZE;

const MAGIC: &[u8; 8] = b"HYDRAFS1";
const FORMAT: u32 = 1;
const OPEN: u32 = 0;
const CLEAN: u32 = 1;
/// Extents a superblock lists.
pub const MAX_EXTENTS: usize = (PAGE_SIZE - 40) / 16;
const P: u64 = PAGE_SIZE as u64;

/// Why the metadata could not be saved or loaded.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The superblock or snapshot could not be read or written.
    #[error("the file system's metadata could not be read or written in the cluster: {0}")]
    Io(#[from] IoError),
    /// The kept file system has another size.
    #[error("the files kept for this identity belong to a file system of {kept} bytes, not {asked}: mount with --size {kept}")]
    Size {
        /// Size recorded.
        kept: u64,
        /// Size asked.
        asked: u64,
    },
    /// The snapshot is damaged.
    #[error("the saved metadata is damaged ({0}); the files cannot be found again: release this identity (hydramem free) and start anew")]
    Damaged(String),
    /// No room to save the metadata.
    #[error("no room to save the metadata ({pages} pages needed, in at most {MAX_EXTENTS} extents): free some space before unmounting")]
    NoRoom {
        /// Pages needed.
        pages: u64,
    },
}

/// One inode as saved.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SavedInode {
    /// Number.
    pub ino: Ino,
    /// 0 file, 1 directory, 2 symlink, 3 FIFO, 4 socket, 5 character device, 6 block
    /// device.
    pub kind: u8,
    /// A device node's device number (0 otherwise; absent in snapshots from before device
    /// nodes, which had none).
    #[serde(default)]
    pub rdev: u32,
    /// Permission bits.
    pub perm: u16,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Links.
    pub nlink: u32,
    /// Bytes.
    pub size: u64,
    /// atime, mtime, ctime as nanoseconds since the epoch.
    pub times: [u128; 3],
    /// A symlink's target.
    pub target: Vec<u8>,
    /// A directory's parent.
    pub parent: Option<Ino>,
    /// A directory's entries.
    pub entries: Vec<(Vec<u8>, Ino)>,
    /// A file's written pages: (first file page, first store page, pages).
    pub extents: Vec<(u64, u64, u64)>,
}

/// The saved metadata.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Snapshot {
    /// The next inode number.
    pub next_ino: Ino,
    /// Every inode.
    pub inodes: Vec<SavedInode>,
}

fn nanos(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

fn time(n: u128) -> SystemTime {
    let secs = u64::try_from(n / 1_000_000_000).unwrap_or(u64::MAX / 2);
    UNIX_EPOCH + Duration::new(secs, (n % 1_000_000_000) as u32)
}

/// Kind as saved.
pub fn kind_code(k: Kind) -> u8 {
    match k {
        Kind::File => 0,
        Kind::Dir => 1,
        Kind::Symlink => 2,
        Kind::Fifo => 3,
        Kind::Socket => 4,
        Kind::CharDev(_) => 5,
        Kind::BlockDev(_) => 6,
    }
}

/// Kind from its saved code and device number.
pub fn kind_of(code: u8, rdev: u32) -> Result<Kind, SnapshotError> {
    match code {
        0 => Ok(Kind::File),
        1 => Ok(Kind::Dir),
        2 => Ok(Kind::Symlink),
        3 => Ok(Kind::Fifo),
        4 => Ok(Kind::Socket),
        5 => Ok(Kind::CharDev(rdev)),
        6 => Ok(Kind::BlockDev(rdev)),
        c => Err(SnapshotError::Damaged(format!("unknown inode kind {c}"))),
    }
}

/// Saved attributes → [`Meta`].
pub fn meta_of(s: &SavedInode) -> Meta {
    Meta {
        size: s.size,
        perm: s.perm,
        uid: s.uid,
        gid: s.gid,
        nlink: s.nlink,
        atime: time(s.times[0]),
        mtime: time(s.times[1]),
        ctime: time(s.times[2]),
    }
}

/// One inode's attributes and written pages, as saved (entries and parent are the caller's).
pub fn save_inode(
    ino: Ino,
    kind: Kind,
    m: &Meta,
    target: &OsString,
    pages: impl Iterator<Item = (u64, Entry)>,
) -> SavedInode {
    let mut extents: Vec<(u64, u64, u64)> = Vec::new();
    for (fp, e) in pages {
        let Entry::Written(at) = e else { continue };
        match extents.last_mut() {
            Some((f, a, n)) if *f + *n == fp && *a + *n == at => *n += 1,
            _ => extents.push((fp, at, 1)),
        }
    }
    SavedInode {
        ino,
        kind: kind_code(kind),
        rdev: kind.rdev(),
        perm: m.perm,
        uid: m.uid,
        gid: m.gid,
        nlink: m.nlink,
        size: m.size,
        times: [nanos(m.atime), nanos(m.mtime), nanos(m.ctime)],
        target: target.as_bytes().to_vec(),
        parent: None,
        entries: Vec::new(),
        extents,
    }
}

/// A name as saved → OsString.
pub fn name(bytes: &[u8]) -> OsString {
    OsString::from_vec(bytes.to_vec())
}

/// The superblock's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Superblock {
    state: u32,
    size: u64,
    len: u64,
    crc: u32,
    extents: Vec<(u64, u64)>,
}

impl Superblock {
    fn encode(&self) -> Page {
        let mut p = [0u8; PAGE_SIZE];
        p[..8].copy_from_slice(MAGIC);
        p[8..12].copy_from_slice(&FORMAT.to_le_bytes());
        p[12..16].copy_from_slice(&self.state.to_le_bytes());
        p[16..24].copy_from_slice(&self.size.to_le_bytes());
        p[24..32].copy_from_slice(&self.len.to_le_bytes());
        p[32..36].copy_from_slice(&self.crc.to_le_bytes());
        // At most MAX_EXTENTS (checked by the caller), so the count fits.
        p[36..40].copy_from_slice(&(self.extents.len() as u32).to_le_bytes());
        for (i, (s, n)) in self.extents.iter().enumerate() {
            let at = 40 + i * 16;
            p[at..at + 8].copy_from_slice(&s.to_le_bytes());
            p[at + 8..at + 16].copy_from_slice(&n.to_le_bytes());
        }
        p
    }

    /// The superblock of `p`, None if the page holds none (never written: zeros).
    fn decode(p: &Page) -> Result<Option<Superblock>, SnapshotError> {
        if &p[..8] != MAGIC {
            return Ok(None);
        }
        let u32_at = |i: usize| u32::from_le_bytes(p[i..i + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |i: usize| u64::from_le_bytes(p[i..i + 8].try_into().unwrap_or([0; 8]));
        if u32_at(8) != FORMAT {
            return Err(SnapshotError::Damaged(format!(
                "superblock format {} is not {FORMAT}",
                u32_at(8)
            )));
        }
        let n = u32_at(36) as usize;
        if n > MAX_EXTENTS {
            return Err(SnapshotError::Damaged(format!(
                "{n} extents in the superblock"
            )));
        }
        Ok(Some(Superblock {
            state: u32_at(12),
            size: u64_at(16),
            len: u64_at(24),
            crc: u32_at(32),
            extents: (0..n)
                .map(|i| (u64_at(40 + i * 16), u64_at(48 + i * 16)))
                .collect(),
        }))
    }
}

fn crc(bytes: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

/// Reads the snapshot of a file system of `size` bytes from `store`, if a clean one is
/// there, and marks the superblock open (see the module's invariants).
pub fn load(store: &dyn PageStore, size: u64) -> Result<Option<Snapshot>, SnapshotError> {
    let mut page = [0u8; PAGE_SIZE];
    store.read_page(0, &mut page)?;
    let Some(sb) = Superblock::decode(&page)? else {
        return Ok(None);
    };
    if sb.size != size {
        return Err(SnapshotError::Size {
            kept: sb.size,
            asked: size,
        });
    }
    if sb.state != CLEAN {
        tracing::warn!(
            "this identity's previous mount did not stop cleanly: its files' metadata was not \
             saved, so the file system starts empty"
        );
        return Ok(None);
    }
    let pages: u64 = sb.extents.iter().map(|e| e.1).sum();
    if sb.len > pages * P || sb.extents.iter().any(|e| e.0 == 0 || e.0 + e.1 > size / P) {
        return Err(SnapshotError::Damaged(
            "superblock extents out of range".into(),
        ));
    }
    let mut bytes = vec![[0u8; PAGE_SIZE]; pages as usize];
    {
        let mut list: Vec<(u64, &mut Page)> = sb
            .extents
            .iter()
            .flat_map(|&(s, n)| (s..s + n).map(|p| p * P))
            .zip(bytes.iter_mut())
            .collect();
        store.read_list(&mut list)?;
    }
    let mut bytes = bytes.into_flattened();
    bytes.truncate(sb.len as usize);
    if crc(&bytes) != sb.crc {
        return Err(SnapshotError::Damaged("snapshot checksum mismatch".into()));
    }
    let snap: Snapshot = serde_json::from_slice(&bytes)
        .map_err(|e| SnapshotError::Damaged(format!("snapshot does not parse: {e}")))?;
    mark_open(store, size)?;
    Ok(Some(snap))
}

/// Marks a fresh file system's superblock open (so that an old clean snapshot of this
/// identity can never be loaded once pages are reused).
pub fn mark_open(store: &dyn PageStore, size: u64) -> Result<(), SnapshotError> {
    let open = Superblock {
        state: OPEN,
        size,
        len: 0,
        crc: 0,
        extents: Vec::new(),
    };
    store.write_page(0, &open.encode())?;
    Ok(())
}

/// Writes `snap` into the pages `extents` (enough for it, at most [`MAX_EXTENTS`]) and then
/// the superblock that names them, marked clean.
pub fn save(
    store: &dyn PageStore,
    size: u64,
    snap: &Snapshot,
    extents: &[(u64, u64)],
) -> Result<(), SnapshotError> {
    let bytes = serde_json::to_vec(snap)
        .map_err(|e| SnapshotError::Damaged(format!("snapshot does not serialize: {e}")))?;
    let pages = pages_for(snap)?;
    if extents.len() > MAX_EXTENTS || extents.iter().map(|e| e.1).sum::<u64>() < pages {
        return Err(SnapshotError::NoRoom { pages });
    }
    let mut buf = vec![[0u8; PAGE_SIZE]; pages as usize];
    buf.as_flattened_mut()[..bytes.len()].copy_from_slice(&bytes);
    let list: Vec<(u64, &Page)> = extents
        .iter()
        .flat_map(|&(s, n)| (s..s + n).map(|p| p * P))
        .zip(buf.iter())
        .collect();
    store.write_list(&list)?;
    let sb = Superblock {
        state: CLEAN,
        size,
        len: bytes.len() as u64,
        crc: crc(&bytes),
        extents: extents.to_vec(),
    };
    store.write_page(0, &sb.encode())?;
    Ok(())
}

/// Pages the snapshot takes.
pub fn pages_for(snap: &Snapshot) -> Result<u64, SnapshotError> {
    let len = serde_json::to_vec(snap)
        .map_err(|e| SnapshotError::Damaged(format!("snapshot does not serialize: {e}")))?
        .len() as u64;
    Ok(len.div_ceil(P).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblocks_round_trip_and_zeros_hold_none() {
        let sb = Superblock {
            state: CLEAN,
            size: 1 << 30,
            len: 12345,
            crc: 0xdead_beef,
            extents: vec![(1, 3), (10, 1)],
        };
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), Some(sb));
        assert_eq!(Superblock::decode(&[0u8; PAGE_SIZE]).unwrap(), None);
        let mut bad = [0u8; PAGE_SIZE];
        bad[..8].copy_from_slice(MAGIC);
        bad[8] = 9;
        assert!(Superblock::decode(&bad).is_err());
    }

    #[test]
    fn written_pages_are_saved_as_extents() {
        let m = Meta {
            size: 5 * P,
            perm: 0o644,
            uid: 1,
            gid: 2,
            nlink: 1,
            atime: UNIX_EPOCH + Duration::new(5, 7),
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
        };
        let pages = [
            (0, Entry::Written(10)),
            (1, Entry::Written(11)),
            (2, Entry::Unwritten(12)),
            (3, Entry::Written(13)),
            (4, Entry::Written(20)),
        ];
        let s = save_inode(3, Kind::File, &m, &OsString::new(), pages.into_iter());
        assert_eq!(s.extents, vec![(0, 10, 2), (3, 13, 1), (4, 20, 1)]);
        assert_eq!(meta_of(&s).atime, m.atime);
    }
}
