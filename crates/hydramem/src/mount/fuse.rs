//! The kernel's side: [`HydraFs`] served over FUSE with the `fuser` crate, on several threads
//! each with its own cloned `/dev/fuse` descriptor, so that requests of one file (a loop
//! device's queue, fio's iodepth) run concurrently.
//!
//! Why fuser: it is the maintained pure-Rust FUSE library (no libfuse), mounts directly as
//! root, and serves a file from RAM through loop at the disk's latency; FUSE over io_uring
//! measured no faster for reads (docs/architecture.md, "Why fuser"), and this kernel ships
//! with it off. The connection asks for 1 MiB requests (max_write, max_pages), asynchronous
//! direct I/O, parallel directory operations and parallel direct writes; a file opened with
//! O_DIRECT is served without the page cache (FOPEN_DIRECT_IO), any other keeps its cache
//! across opens, since this process is the only writer.
//!
//! Invariants: every request gets exactly one reply; the reply to a write is sent only after
//! [`HydraFs::write`] returned, i.e. after the cluster acknowledged every page.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};

use super::{Attr, FsError, HydraFs, Kind, SetAttr};
use crate::PAGE_SIZE;

/// Largest read or write request the kernel sends (and max_pages follows).
pub const MAX_REQUEST: u32 = 1 << 20;

/// How long the kernel may cache attributes and entries: this process is the only one that
/// changes them, and it answers every change through the kernel.
const TTL: Duration = Duration::from_secs(1);

/// How the file system is mounted.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Threads reading requests (each with its own /dev/fuse descriptor).
    pub threads: usize,
    /// Let users other than the one mounting use it (needs `user_allow_other` in
    /// /etc/fuse.conf when not root).
    pub allow_other: bool,
    /// Source name shown by mount(8) and df.
    pub fsname: String,
}

/// The FUSE front of a [`HydraFs`].
pub struct Fuse {
    fs: Arc<HydraFs>,
}

fn errno(e: &FsError) -> Errno {
    if matches!(e, FsError::Io(_) | FsError::NoSpace(_)) {
        tracing::warn!("file system request failed: {e}");
    }
    Errno::from_i32(e.errno())
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDev(_) => FileType::CharDevice,
        Kind::BlockDev(_) => FileType::BlockDevice,
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.pages * (PAGE_SIZE as u64 / 512),
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.ctime,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.kind.rdev(),
        blksize: PAGE_SIZE as u32,
        flags: 0,
    }
}

fn time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

/// FOPEN flags for a file opened with `flags`.
fn open_flags(flags: i32) -> FopenFlags {
    if flags & libc::O_DIRECT != 0 {
        FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
    } else {
        FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
    }
}

fn entry(reply: ReplyEntry, r: Result<Attr, FsError>) {
    match r {
        Ok(a) => reply.entry(&TTL, &file_attr(&a), Generation(0)),
        Err(e) => reply.error(errno(&e)),
    }
}

fn empty(reply: ReplyEmpty, r: Result<(), FsError>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

impl Filesystem for Fuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_REQUEST);
        let _ = config.set_max_readahead(MAX_REQUEST);
        let wanted = InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP
            | InitFlags::FUSE_ASYNC_READ;
        let offered = config.capabilities();
        let _ = config.add_capabilities(wanted & offered);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        entry(reply, self.fs.lookup(parent.0, name));
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(ino.0) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            perm: mode.map(|m| (m & 0o7777) as u16),
            uid,
            gid,
            size,
            atime: atime.map(time),
            mtime: mtime.map(time),
        };
        match self.fs.setattr(ino.0, &set) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(ino.0) {
            Ok(t) => reply.data(t.as_encoded_bytes()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        // FIFOs, sockets and device nodes are attributes only: the kernel serves them.
        let kind = match mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDev(rdev),
            libc::S_IFBLK => Kind::BlockDev(rdev),
            _ => {
                reply.error(Errno::EINVAL);
                return;
            }
        };
        let perm = (mode & !umask & 0o7777) as u16;
        let r = self.fs.create(
            parent.0,
            name,
            kind,
            perm,
            req.uid(),
            req.gid(),
            OsStr::new(""),
        );
        entry(reply, r);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let perm = (mode & !umask & 0o7777) as u16;
        let r = self.fs.create(
            parent.0,
            name,
            Kind::Dir,
            perm,
            req.uid(),
            req.gid(),
            OsStr::new(""),
        );
        entry(reply, r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.fs.unlink(parent.0, name));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.fs.rmdir(parent.0, name));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let r = self.fs.create(
            parent.0,
            link_name,
            Kind::Symlink,
            0o777,
            req.uid(),
            req.gid(),
            target.as_os_str(),
        );
        entry(reply, r);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            reply.error(Errno::EINVAL);
            return;
        }
        let r = self.fs.rename(
            (parent.0, name),
            (newparent.0, newname),
            flags.contains(RenameFlags::RENAME_NOREPLACE),
            flags.contains(RenameFlags::RENAME_EXCHANGE),
        );
        empty(reply, r);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        entry(reply, self.fs.link(ino.0, newparent.0, newname));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.getattr(ino.0) {
            Ok(a) if a.kind == Kind::Dir => reply.error(Errno::EISDIR),
            Ok(_) => reply.opened(FileHandle(0), open_flags(flags.0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.fs.read(ino.0, offset, size as usize) {
            Ok(bytes) => reply.data(&bytes),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.fs.write(ino.0, offset, data) {
            // A request is at most MAX_REQUEST bytes, so its length fits.
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Every write was acknowledged by the cluster before it was answered.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // As flush: nothing acknowledged is held back.
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let list = match self.fs.entries(ino.0) {
            Ok(l) => l,
            Err(e) => return reply.error(errno(&e)),
        };
        let skip = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, (child, kind, name)) in list.iter().enumerate().skip(skip) {
            if reply.add(INodeNo(*child), i as u64 + 1, file_type(*kind), name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.fs.space();
        let bsize = PAGE_SIZE as u32;
        let name_max = super::namespace::NAME_MAX as u32;
        reply.statfs(
            s.blocks,
            s.free,
            s.free,
            s.files + (1 << 32),
            1 << 32,
            bsize,
            name_max,
            bsize,
        );
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let perm = (mode & !umask & 0o7777) as u16;
        match self.fs.create(
            parent.0,
            name,
            Kind::File,
            perm,
            req.uid(),
            req.gid(),
            OsStr::new(""),
        ) {
            Ok(a) => reply.created(
                &TTL,
                &file_attr(&a),
                Generation(0),
                FileHandle(0),
                open_flags(flags),
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.fs.fallocate(ino.0, offset, length, mode));
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        // No extended attributes: the kernel stops asking after this answer.
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: fuser::ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }
}

/// Mounts `fs` on `dir` and serves it until it is unmounted (`umount DIR`, or `stop`
/// returning true, which unmounts it unless it is busy: then it goes on serving and says why).
pub fn serve(
    fs: Arc<HydraFs>,
    dir: &Path,
    opts: &MountOptions,
    stop: impl Fn() -> bool + Send + 'static,
) -> std::io::Result<()> {
    let options = vec![
        MountOption::FSName(opts.fsname.clone()),
        MountOption::Subtype("hydramem".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
    ];
    let mut config = fuser::Config::default();
    config.mount_options = options;
    if opts.allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config.n_threads = Some(opts.threads.max(1));
    config.clone_fd = true;
    let mut session = fuser::Session::new(Fuse { fs }, dir, &config)?;
    let mut unmounter = session.unmount_callable();
    let path = std::ffi::CString::new(dir.canonicalize()?.into_os_string().into_encoded_bytes())?;
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let done = done.clone();
        let dir = dir.to_path_buf();
        std::thread::Builder::new()
            .name("mount-signals".into())
            .spawn(move || {
                let mut warned = false;
                while !done.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                    if !stop() {
                        continue;
                    }
                    // umount2 itself, not fuser's unmounter: that one gives up its mount on
                    // the first attempt, so after an EBUSY every later call is a no-op that
                    // reports success and the file system would never be unmounted.
                    // SAFETY: `path` is a NUL-terminated string that outlives the call.
                    let e = match unsafe { libc::umount2(path.as_ptr(), 0) } {
                        0 => break,
                        _ => std::io::Error::last_os_error(),
                    };
                    match e.raw_os_error() {
                        // Not mounted any more: someone unmounted it, the session is ending.
                        Some(libc::EINVAL) | Some(libc::ENOENT) => break,
                        // Not root: fuser's way (fusermount -u).
                        Some(libc::EPERM) => {
                            if let Err(e) = unmounter.unmount() {
                                tracing::warn!("cannot unmount {}: {e}", dir.display());
                            }
                            break;
                        }
                        _ if !warned => {
                            warned = true;
                            tracing::warn!(
                                "cannot unmount {}: {e}; still serving it, and it unmounts \
                                 as soon as nothing uses it: stop what does (swapoff, \
                                 losetup -d, close its files)",
                                dir.display()
                            );
                        }
                        _ => {}
                    }
                }
            })?
    };
    let r = session.run();
    done.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    r
}
