//! `hydramem mount`: files whose bytes live in resilient remote memory (the paper's Remote
//! Regions front end), served to the kernel over FUSE.
//!
//! [`HydraFs`] is the file system in POSIX terms, with no FUSE type in it: a [`Namespace`]
//! (inodes, attributes, directories: the metadata, kept in this process) and [`Data`] (each
//! file's pages in a [`PageStore`] — the cluster through the batched page API, or process
//! memory for the front end's own ceiling and for tests). [`fuse`] translates the kernel's
//! requests into its calls, on several threads at once. A file page is one 4 KiB page of the
//! store's address space, chosen by the page allocator ([`alloc`]) so that a file written in
//! order is contiguous and its requests travel as runs.
//!
//! Semantics, stated for users in docs/architecture.md ("Files"):
//! - a write is acknowledged to the kernel only once every page it touched is acknowledged
//!   under the scheme's resilience mode, so `fsync` has nothing left to do and an unmount
//!   loses nothing that was acknowledged;
//! - the metadata lives in this process: the files are gone when the mount stops (memory
//!   semantics), and the remote memory is released then;
//! - a read that cannot be served (more nodes lost than the scheme tolerates) fails that
//!   request with EIO, never with wrong bytes, and the rest of the file system keeps working;
//!   the address space or the cluster running out of memory fails a write with ENOSPC.
//!
//! Invariants: namespace changes are serialized by one lock; a file's I/O holds its page
//! table for reading (see [`data`]); an inode's pages are freed only when it is gone
//! (unlinked and forgotten by the kernel).

pub mod alloc;
pub mod data;
pub mod fuse;
pub mod namespace;
pub mod snapshot;
pub mod table;

use std::ffi::{OsStr, OsString};
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::RwLock;

pub use data::Data;
pub use namespace::{Ino, Kind, Namespace, ROOT};

use crate::client::{ClientError, IoError};
use crate::nbd::PageStore;
use crate::PAGE_SIZE;
use namespace::{Inode, NewInode};

/// Why a file system call failed; [`FsError::errno`] is what the caller sees.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// No such file or directory.
    #[error("no such file or directory")]
    NotFound,
    /// The name exists.
    #[error("file exists")]
    Exists,
    /// Not a directory.
    #[error("not a directory")]
    NotDir,
    /// A directory where a file was expected.
    #[error("is a directory")]
    IsDir,
    /// The directory is not empty.
    #[error("directory not empty")]
    NotEmpty,
    /// A name longer than 255 bytes.
    #[error("file name too long")]
    NameTooLong,
    /// An invalid argument (a name with '/', a directory moved into itself, ...).
    #[error("invalid argument")]
    Invalid,
    /// Not permitted (a hard link to a directory).
    #[error("operation not permitted")]
    NotPermitted,
    /// An offset beyond the largest file.
    #[error("file too large")]
    TooBig,
    /// A mode this file system does not implement.
    #[error("operation not supported")]
    Unsupported,
    /// The address space is full.
    #[error(transparent)]
    NoSpace(#[from] alloc::NoSpace),
    /// The remote memory failed the pages' I/O.
    #[error(transparent)]
    Io(#[from] IoError),
}

impl FsError {
    /// The errno the kernel passes on to the application.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::Exists => libc::EEXIST,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::NotEmpty => libc::ENOTEMPTY,
            FsError::NameTooLong => libc::ENAMETOOLONG,
            FsError::Invalid => libc::EINVAL,
            FsError::NotPermitted => libc::EPERM,
            FsError::TooBig => libc::EFBIG,
            FsError::Unsupported => libc::EOPNOTSUPP,
            FsError::NoSpace(_) => libc::ENOSPC,
            FsError::Io(IoError::Map(ClientError::OutOfCapacity { .. })) => libc::ENOSPC,
            FsError::Io(_) => libc::EIO,
        }
    }
}

/// The attributes of an inode, as stat(2) shows them.
#[derive(Debug, Clone)]
pub struct Attr {
    /// Inode number.
    pub ino: Ino,
    /// What it is.
    pub kind: Kind,
    /// Bytes.
    pub size: u64,
    /// Pages allocated.
    pub pages: u64,
    /// Permission bits.
    pub perm: u16,
    /// Links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Last access.
    pub atime: SystemTime,
    /// Last modification.
    pub mtime: SystemTime,
    /// Last change.
    pub ctime: SystemTime,
}

/// Changes asked by setattr; `None` leaves a field alone.
#[derive(Debug, Clone, Default)]
pub struct SetAttr {
    /// New permission bits.
    pub perm: Option<u16>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate or extend).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<SystemTime>,
    /// New modification time.
    pub mtime: Option<SystemTime>,
}

/// Space figures for statfs, in 4 KiB blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// Blocks of the address space.
    pub blocks: u64,
    /// Blocks free: free in the address space and, when the cluster's free memory is known,
    /// no more than it can still hold under the scheme.
    pub free: u64,
    /// Inodes in use.
    pub files: u64,
}

/// Free bytes the cluster can still take for this mount's data (after the scheme's overhead),
/// if known.
pub type Capacity = Box<dyn Fn() -> Option<u64> + Send + Sync>;

/// fallocate(2) modes the file system implements.
const FALLOC_KEEP_SIZE: i32 = libc::FALLOC_FL_KEEP_SIZE;
const FALLOC_PUNCH_HOLE: i32 = libc::FALLOC_FL_PUNCH_HOLE;
const FALLOC_ZERO_RANGE: i32 = libc::FALLOC_FL_ZERO_RANGE;

/// The file system.
pub struct HydraFs {
    ns: RwLock<Namespace>,
    data: Data,
    capacity: Option<Capacity>,
    /// Bytes of the address space.
    bytes: u64,
}

impl HydraFs {
    /// A file system with an empty root (mode 0755, owned by `uid`:`gid`) over `store`, whose
    /// address space holds `bytes` (rounded down to pages).
    pub fn new(
        store: Arc<dyn PageStore>,
        bytes: u64,
        uid: u32,
        gid: u32,
        capacity: Option<Capacity>,
    ) -> HydraFs {
        HydraFs {
            ns: RwLock::new(Namespace::new(0o755, uid, gid)),
            data: Data::new(store, bytes / PAGE_SIZE as u64),
            capacity,
            bytes,
        }
    }

    /// The file system a kept identity saved in `store` at its last clean unmount
    /// ([`snapshot`]), or a new empty one (see [`HydraFs::new`]) if there is none; either way
    /// the saved metadata is marked stale until [`HydraFs::save`].
    pub fn open(
        store: Arc<dyn PageStore>,
        bytes: u64,
        uid: u32,
        gid: u32,
        capacity: Option<Capacity>,
    ) -> Result<HydraFs, snapshot::SnapshotError> {
        let mut fs = HydraFs::new(store, bytes, uid, gid, capacity);
        match snapshot::load(fs.data.store(), bytes)? {
            Some(snap) => {
                let ns = Namespace::restore(&snap)?;
                for inode in ns.inodes() {
                    if !fs.data.adopt(&inode.table.read()) {
                        return Err(snapshot::SnapshotError::Damaged(format!(
                            "pages of inode {} overlap others or lie outside the space",
                            inode.ino
                        )));
                    }
                }
                fs.ns = RwLock::new(ns);
            }
            None => snapshot::mark_open(fs.data.store(), bytes)?,
        }
        fs.data.forget_free();
        Ok(fs)
    }

    /// Saves the metadata into the store (after the last request: at unmount), so that
    /// [`HydraFs::open`] with the same identity finds the files again.
    pub fn save(&self) -> Result<(), snapshot::SnapshotError> {
        let snap = self.ns.read().save();
        let pages = snapshot::pages_for(&snap)?;
        let extents = self
            .data
            .take(pages)
            .map_err(|_| snapshot::SnapshotError::NoRoom { pages })?;
        snapshot::save(self.data.store(), self.bytes, &snap, &extents)
    }

    /// Files and directories (inodes, the root included).
    pub fn files(&self) -> u64 {
        self.ns.read().count()
    }

    fn attr(inode: &Inode) -> Attr {
        let m = inode.meta.lock();
        Attr {
            ino: inode.ino,
            kind: inode.kind,
            size: m.size,
            pages: inode.table.read().mapped(),
            perm: m.perm,
            nlink: m.nlink,
            uid: m.uid,
            gid: m.gid,
            atime: m.atime,
            mtime: m.mtime,
            ctime: m.ctime,
        }
    }

    fn inode(&self, ino: Ino) -> Result<Arc<Inode>, FsError> {
        self.ns.read().get(ino)
    }

    /// The entry `name` of `parent`; the kernel holds a reference to it from now on.
    pub fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Attr, FsError> {
        let inode = self.ns.read().lookup(parent, name)?;
        inode.looked_up();
        Ok(Self::attr(&inode))
    }

    /// The kernel dropped `n` references to `ino`: a file gone from every directory and from
    /// the kernel gives its pages back.
    pub fn forget(&self, ino: Ino, n: u64) {
        let gone = self.ns.write().forget(ino, n);
        if let Some(inode) = gone {
            self.data.release(&inode);
        }
    }

    /// stat(2).
    pub fn getattr(&self, ino: Ino) -> Result<Attr, FsError> {
        Ok(Self::attr(&*self.inode(ino)?))
    }

    /// chmod, chown, truncate, utimes.
    pub fn setattr(&self, ino: Ino, set: &SetAttr) -> Result<Attr, FsError> {
        let inode = self.inode(ino)?;
        if let Some(size) = set.size {
            if inode.kind != Kind::File {
                return Err(if inode.kind == Kind::Dir {
                    FsError::IsDir
                } else {
                    FsError::Invalid
                });
            }
            if size > data::MAX_FILE_SIZE {
                return Err(FsError::TooBig);
            }
            let old = inode.meta.lock().size;
            if size < old {
                self.data.truncate(&inode, size)?;
            }
        }
        let now = SystemTime::now();
        {
            let mut m = inode.meta.lock();
            if let Some(size) = set.size {
                m.size = size;
                m.mtime = now;
            }
            if let Some(p) = set.perm {
                m.perm = p & 0o7777;
            }
            if let Some(u) = set.uid {
                m.uid = u;
            }
            if let Some(g) = set.gid {
                m.gid = g;
            }
            if let Some(t) = set.atime {
                m.atime = t;
            }
            if let Some(t) = set.mtime {
                m.mtime = t;
            }
            m.ctime = now;
        }
        Ok(Self::attr(&inode))
    }

    /// Creates a file, directory, symlink (`target`), FIFO, socket or device node named
    /// `name` in `parent`; the kernel holds a reference to it from now on.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        parent: Ino,
        name: &OsStr,
        kind: Kind,
        perm: u16,
        uid: u32,
        gid: u32,
        target: &OsStr,
    ) -> Result<Attr, FsError> {
        let new = NewInode {
            kind,
            perm: perm & 0o7777,
            uid,
            gid,
            target: target.to_owned(),
        };
        let inode = self.ns.write().create(parent, name, &new)?;
        inode.looked_up();
        Ok(Self::attr(&inode))
    }

    /// A hard link `parent/name` to `ino`.
    pub fn link(&self, ino: Ino, parent: Ino, name: &OsStr) -> Result<Attr, FsError> {
        let inode = self.ns.write().link(ino, parent, name)?;
        inode.looked_up();
        Ok(Self::attr(&inode))
    }

    /// Removes a file or symlink.
    pub fn unlink(&self, parent: Ino, name: &OsStr) -> Result<(), FsError> {
        let gone = self.ns.write().unlink(parent, name)?;
        if let Some(inode) = gone {
            self.data.release(&inode);
        }
        Ok(())
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, parent: Ino, name: &OsStr) -> Result<(), FsError> {
        self.ns.write().rmdir(parent, name).map(drop)
    }

    /// rename(2), with RENAME_NOREPLACE and RENAME_EXCHANGE.
    pub fn rename(
        &self,
        from: (Ino, &OsStr),
        to: (Ino, &OsStr),
        noreplace: bool,
        exchange: bool,
    ) -> Result<(), FsError> {
        let gone = self.ns.write().rename(from, to, noreplace, exchange)?;
        if let Some(inode) = gone {
            self.data.release(&inode);
        }
        Ok(())
    }

    /// A symlink's target.
    pub fn readlink(&self, ino: Ino) -> Result<OsString, FsError> {
        let inode = self.inode(ino)?;
        if inode.kind != Kind::Symlink {
            return Err(FsError::Invalid);
        }
        Ok(inode.target.clone())
    }

    /// A directory's entries, `.` and `..` first.
    pub fn entries(&self, ino: Ino) -> Result<Vec<(Ino, Kind, OsString)>, FsError> {
        self.ns.read().entries(ino)
    }

    fn file(&self, ino: Ino) -> Result<Arc<Inode>, FsError> {
        let inode = self.inode(ino)?;
        match inode.kind {
            Kind::File => Ok(inode),
            Kind::Dir => Err(FsError::IsDir),
            _ => Err(FsError::Invalid),
        }
    }

    /// Reads up to `len` bytes at `offset` (fewer at the end of the file).
    pub fn read(&self, ino: Ino, offset: u64, len: usize) -> Result<Vec<u8>, FsError> {
        let inode = self.file(ino)?;
        let size = inode.meta.lock().size;
        let len = (len as u64).min(size.saturating_sub(offset)) as usize;
        self.data.read(&inode, offset, len)
    }

    /// Writes `bytes` at `offset`, growing the file if it ends past it; returns once every
    /// page touched is acknowledged.
    pub fn write(&self, ino: Ino, offset: u64, bytes: &[u8]) -> Result<(), FsError> {
        let inode = self.file(ino)?;
        let end = offset
            .checked_add(bytes.len() as u64)
            .filter(|&e| e <= data::MAX_FILE_SIZE)
            .ok_or(FsError::TooBig)?;
        self.data.write(&inode, offset, bytes)?;
        let now = SystemTime::now();
        let mut m = inode.meta.lock();
        m.size = m.size.max(end);
        m.mtime = now;
        m.ctime = now;
        Ok(())
    }

    /// fallocate(2): preallocation (mode 0 or KEEP_SIZE), PUNCH_HOLE (with KEEP_SIZE) and
    /// ZERO_RANGE; other modes are not supported.
    pub fn fallocate(&self, ino: Ino, offset: u64, len: u64, mode: i32) -> Result<(), FsError> {
        let inode = self.file(ino)?;
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= data::MAX_FILE_SIZE)
            .ok_or(FsError::TooBig)?;
        let keep = mode & FALLOC_KEEP_SIZE != 0;
        match mode & !FALLOC_KEEP_SIZE {
            0 => self.data.allocate(&inode, offset, len)?,
            FALLOC_PUNCH_HOLE if keep => self.data.punch(&inode, offset, len)?,
            FALLOC_ZERO_RANGE => {
                self.data.punch(&inode, offset, len)?;
                self.data.allocate(&inode, offset, len)?;
            }
            _ => return Err(FsError::Unsupported),
        }
        if !keep {
            let mut m = inode.meta.lock();
            m.size = m.size.max(end);
            m.ctime = SystemTime::now();
        }
        Ok(())
    }

    /// Blocks and inodes for statfs.
    pub fn space(&self) -> Space {
        let (blocks, free) = self.data.usage();
        let cluster = self
            .capacity
            .as_ref()
            .and_then(|c| c())
            .map_or(u64::MAX, |b| b / PAGE_SIZE as u64);
        Space {
            blocks,
            free: free.min(cluster),
            files: self.ns.read().count(),
        }
    }
}

#[cfg(test)]
mod tests;
