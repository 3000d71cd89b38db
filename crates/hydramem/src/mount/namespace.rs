//! The namespace of a mount: inodes, their attributes, and the directory tree. Pure data in
//! the client's memory; no I/O happens here (file bytes are in [`super::data`]).
//!
//! Invariants: every directory entry names a live inode; a directory has exactly one entry
//! naming it (no hard links to directories) and `parent` names the directory holding it (the
//! root is its own parent); a directory's `nlink` is 2 plus its subdirectories, a file's or
//! link's is the number of entries naming it. An inode leaves the table only when no entry
//! names it (`nlink == 0`) and the kernel holds no reference to it (`lookups == 0`): the last
//! `forget` or the `unlink` of a file nobody looked up returns it, and its caller frees its
//! pages. Callers serialize changes with the namespace's lock (`RwLock<Namespace>`); an
//! inode's own attributes and page table have their own locks.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::{Mutex, RwLock};

use super::snapshot::{self, SavedInode, Snapshot, SnapshotError};
use super::table::PageTable;
use super::FsError;

/// Inode number.
pub type Ino = u64;

/// The root directory's inode number (FUSE's).
pub const ROOT: Ino = 1;

/// Longest name in a directory.
pub const NAME_MAX: usize = 255;

/// What an inode is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file: bytes in remote memory.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A named pipe: only its attributes live here; the kernel runs the pipe itself.
    Fifo,
    /// A Unix socket's name: only its attributes live here; the kernel binds it.
    Socket,
    /// A character device node with its device number (opening it is the kernel's; the
    /// mount is `nodev`, so it cannot be opened through it).
    CharDev(u32),
    /// A block device node with its device number (as for [`Kind::CharDev`]).
    BlockDev(u32),
}

impl Kind {
    /// The device number of a device node, 0 for every other kind.
    pub fn rdev(self) -> u32 {
        match self {
            Kind::CharDev(d) | Kind::BlockDev(d) => d,
            _ => 0,
        }
    }
}

/// Attributes of an inode.
#[derive(Debug, Clone)]
pub struct Meta {
    /// Size in bytes (a symlink: its target's length).
    pub size: u64,
    /// Permission bits (and set-id, sticky).
    pub perm: u16,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Directory entries naming it (a directory: 2 + subdirectories).
    pub nlink: u32,
    /// Last access.
    pub atime: SystemTime,
    /// Last change of the bytes.
    pub mtime: SystemTime,
    /// Last change of the inode.
    pub ctime: SystemTime,
}

/// One inode.
#[derive(Debug)]
pub struct Inode {
    /// Its number.
    pub ino: Ino,
    /// File, directory or link.
    pub kind: Kind,
    /// Attributes.
    pub meta: Mutex<Meta>,
    /// Where a file's pages are (empty for other kinds). Held for reading during every I/O
    /// of the file, for writing while pages are mapped or unmapped.
    pub table: RwLock<PageTable>,
    /// A symlink's target.
    pub target: OsString,
    /// References the kernel holds (entries replied minus forgotten).
    lookups: AtomicU64,
}

impl Inode {
    /// The kernel got one more reference (an entry was replied for it).
    pub fn looked_up(&self) {
        self.lookups.fetch_add(1, Ordering::Relaxed);
    }
}

/// What a new inode is created with.
#[derive(Debug, Clone)]
pub struct NewInode {
    /// Kind.
    pub kind: Kind,
    /// Permission bits.
    pub perm: u16,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// A symlink's target (empty otherwise).
    pub target: OsString,
}

/// The tree.
#[derive(Debug)]
pub struct Namespace {
    inodes: HashMap<Ino, Arc<Inode>>,
    /// Entries of each directory.
    dirs: HashMap<Ino, BTreeMap<OsString, Ino>>,
    /// Parent of each directory.
    parents: HashMap<Ino, Ino>,
    next: Ino,
}

fn check_name(name: &OsStr) -> Result<(), FsError> {
    if name.len() > NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    if name.is_empty() || name == "." || name == ".." || name.as_encoded_bytes().contains(&b'/') {
        return Err(FsError::Invalid);
    }
    Ok(())
}

impl Namespace {
    /// A namespace holding an empty root directory owned by `uid`:`gid` with `perm`.
    pub fn new(perm: u16, uid: u32, gid: u32) -> Namespace {
        let mut ns = Namespace {
            inodes: HashMap::new(),
            dirs: HashMap::new(),
            parents: HashMap::new(),
            next: ROOT,
        };
        let root = ns.insert(&NewInode {
            kind: Kind::Dir,
            perm,
            uid,
            gid,
            target: OsString::new(),
        });
        ns.parents.insert(root.ino, root.ino);
        root.lookups.store(1, Ordering::Relaxed);
        ns
    }

    /// The inode `ino`, if it exists.
    pub fn get(&self, ino: Ino) -> Result<Arc<Inode>, FsError> {
        self.inodes.get(&ino).cloned().ok_or(FsError::NotFound)
    }

    /// Inodes in the table.
    pub fn count(&self) -> u64 {
        self.inodes.len() as u64
    }

    /// The entry `name` of directory `parent`.
    pub fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Arc<Inode>, FsError> {
        let dir = self.dirs.get(&parent).ok_or(FsError::NotDir)?;
        if name == "." {
            return self.get(parent);
        }
        if name == ".." {
            return self.get(self.parents[&parent]);
        }
        if name.len() > NAME_MAX {
            return Err(FsError::NameTooLong);
        }
        self.get(*dir.get(name).ok_or(FsError::NotFound)?)
    }

    fn insert(&mut self, new: &NewInode) -> Arc<Inode> {
        let now = SystemTime::now();
        let ino = self.next;
        self.next += 1;
        let inode = Arc::new(Inode {
            ino,
            kind: new.kind,
            meta: Mutex::new(Meta {
                size: if new.kind == Kind::Symlink {
                    new.target.len() as u64
                } else {
                    0
                },
                perm: new.perm,
                uid: new.uid,
                gid: new.gid,
                // A directory counts its own `.` and its entry; a file or link gets its link
                // from the entry that names it (link_entry).
                nlink: if new.kind == Kind::Dir { 2 } else { 0 },
                atime: now,
                mtime: now,
                ctime: now,
            }),
            table: RwLock::new(PageTable::new()),
            target: new.target.clone(),
            lookups: AtomicU64::new(0),
        });
        self.inodes.insert(ino, inode.clone());
        if new.kind == Kind::Dir {
            self.dirs.insert(ino, BTreeMap::new());
        }
        inode
    }

    /// Creates `name` in directory `parent`.
    pub fn create(
        &mut self,
        parent: Ino,
        name: &OsStr,
        new: &NewInode,
    ) -> Result<Arc<Inode>, FsError> {
        check_name(name)?;
        let dir = self.dirs.get(&parent).ok_or(FsError::NotDir)?;
        if dir.contains_key(name) {
            return Err(FsError::Exists);
        }
        let inode = self.insert(new);
        self.link_entry(parent, name, &inode);
        if new.kind == Kind::Dir {
            self.parents.insert(inode.ino, parent);
        }
        Ok(inode)
    }

    /// Adds the entry `name` → `inode` to `parent` (absent) and counts the link.
    fn link_entry(&mut self, parent: Ino, name: &OsStr, inode: &Inode) {
        if let Some(d) = self.dirs.get_mut(&parent) {
            d.insert(name.to_owned(), inode.ino);
        }
        let now = SystemTime::now();
        if inode.kind == Kind::Dir {
            if let Some(p) = self.inodes.get(&parent) {
                p.meta.lock().nlink += 1;
            }
        } else {
            let mut m = inode.meta.lock();
            m.nlink += 1;
            m.ctime = now;
        }
        self.touch_dir(parent, now);
    }

    /// Another entry `name` in `parent` for the file or link `ino` (a hard link).
    pub fn link(&mut self, ino: Ino, parent: Ino, name: &OsStr) -> Result<Arc<Inode>, FsError> {
        check_name(name)?;
        let inode = self.get(ino)?;
        if inode.kind == Kind::Dir {
            return Err(FsError::NotPermitted);
        }
        let dir = self.dirs.get(&parent).ok_or(FsError::NotDir)?;
        if dir.contains_key(name) {
            return Err(FsError::Exists);
        }
        self.link_entry(parent, name, &inode);
        Ok(inode)
    }

    fn touch_dir(&self, dir: Ino, now: SystemTime) {
        if let Some(d) = self.inodes.get(&dir) {
            let mut m = d.meta.lock();
            m.mtime = now;
            m.ctime = now;
        }
    }

    /// Removes the entry `name` → `ino` from `parent` and uncounts the link; returns the
    /// inode when it is gone from the table (no link, no kernel reference): its pages are the
    /// caller's to free.
    fn unlink_entry(&mut self, parent: Ino, name: &OsStr, ino: Ino) -> Option<Arc<Inode>> {
        if let Some(d) = self.dirs.get_mut(&parent) {
            d.remove(name);
        }
        let now = SystemTime::now();
        self.touch_dir(parent, now);
        let inode = self.inodes.get(&ino)?.clone();
        {
            let mut m = inode.meta.lock();
            m.ctime = now;
            if inode.kind == Kind::Dir {
                m.nlink = 0;
                if let Some(p) = self.inodes.get(&parent) {
                    let mut pm = p.meta.lock();
                    pm.nlink = pm.nlink.saturating_sub(1);
                }
            } else {
                m.nlink = m.nlink.saturating_sub(1);
            }
        }
        self.reap(ino)
    }

    /// Drops `ino` from the table if nothing refers to it any more; returns it then.
    fn reap(&mut self, ino: Ino) -> Option<Arc<Inode>> {
        let inode = self.inodes.get(&ino)?;
        if ino == ROOT || inode.meta.lock().nlink > 0 || inode.lookups.load(Ordering::Relaxed) > 0 {
            return None;
        }
        self.dirs.remove(&ino);
        self.parents.remove(&ino);
        self.inodes.remove(&ino)
    }

    /// Removes the file or link `name` from `parent`; returns the inode if it is gone.
    pub fn unlink(&mut self, parent: Ino, name: &OsStr) -> Result<Option<Arc<Inode>>, FsError> {
        let inode = self.lookup_entry(parent, name)?;
        if inode.kind == Kind::Dir {
            return Err(FsError::IsDir);
        }
        Ok(self.unlink_entry(parent, name, inode.ino))
    }

    /// Removes the empty directory `name` from `parent`.
    pub fn rmdir(&mut self, parent: Ino, name: &OsStr) -> Result<Option<Arc<Inode>>, FsError> {
        let inode = self.lookup_entry(parent, name)?;
        if inode.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        if !self.dirs[&inode.ino].is_empty() {
            return Err(FsError::NotEmpty);
        }
        Ok(self.unlink_entry(parent, name, inode.ino))
    }

    /// The inode an entry (not `.` or `..`) names.
    fn lookup_entry(&self, parent: Ino, name: &OsStr) -> Result<Arc<Inode>, FsError> {
        if name == "." || name == ".." {
            return Err(FsError::Invalid);
        }
        self.lookup(parent, name)
    }

    /// Whether directory `dir` is `ancestor` or lies below it.
    fn is_within(&self, mut dir: Ino, ancestor: Ino) -> bool {
        loop {
            if dir == ancestor {
                return true;
            }
            match self.parents.get(&dir) {
                Some(&p) if p != dir => dir = p,
                _ => return false,
            }
        }
    }

    /// Renames `parent/name` to `newparent/newname`, replacing what is there (a file by a
    /// file, an empty directory by a directory), as rename(2); `noreplace` refuses an
    /// existing target, `exchange` swaps the two. Returns the replaced inode if it is gone.
    pub fn rename(
        &mut self,
        from: (Ino, &OsStr),
        to: (Ino, &OsStr),
        noreplace: bool,
        exchange: bool,
    ) -> Result<Option<Arc<Inode>>, FsError> {
        let ((parent, name), (newparent, newname)) = (from, to);
        check_name(newname)?;
        let src = self.lookup_entry(parent, name)?;
        if !self.dirs.contains_key(&newparent) {
            return Err(FsError::NotDir);
        }
        let dst = self.dirs[&newparent].get(newname).copied();
        if src.kind == Kind::Dir && self.is_within(newparent, src.ino) {
            return Err(FsError::Invalid);
        }
        if dst == Some(src.ino) {
            return Ok(None);
        }
        if exchange {
            let dst = self.get(dst.ok_or(FsError::NotFound)?)?;
            if dst.kind == Kind::Dir && self.is_within(parent, dst.ino) {
                return Err(FsError::Invalid);
            }
            self.dirs
                .get_mut(&parent)
                .map(|d| d.insert(name.to_owned(), dst.ino));
            self.dirs
                .get_mut(&newparent)
                .map(|d| d.insert(newname.to_owned(), src.ino));
            self.move_dir(&src, parent, newparent);
            self.move_dir(&dst, newparent, parent);
            return Ok(None);
        }
        let mut gone = None;
        if let Some(d) = dst {
            if noreplace {
                return Err(FsError::Exists);
            }
            let target = self.get(d)?;
            match (src.kind == Kind::Dir, target.kind == Kind::Dir) {
                (true, false) => return Err(FsError::NotDir),
                (false, true) => return Err(FsError::IsDir),
                (true, true) if !self.dirs[&d].is_empty() => return Err(FsError::NotEmpty),
                _ => {}
            }
            gone = self.unlink_entry(newparent, newname, d);
        }
        self.dirs.get_mut(&parent).map(|d| d.remove(name));
        self.dirs
            .get_mut(&newparent)
            .map(|d| d.insert(newname.to_owned(), src.ino));
        self.move_dir(&src, parent, newparent);
        let now = SystemTime::now();
        src.meta.lock().ctime = now;
        self.touch_dir(parent, now);
        self.touch_dir(newparent, now);
        Ok(gone)
    }

    /// A directory moved from `old` to `new`: its parent and both link counts follow.
    fn move_dir(&mut self, inode: &Inode, old: Ino, new: Ino) {
        if inode.kind != Kind::Dir || old == new {
            return;
        }
        self.parents.insert(inode.ino, new);
        if let Some(p) = self.inodes.get(&old) {
            let mut m = p.meta.lock();
            m.nlink = m.nlink.saturating_sub(1);
        }
        if let Some(p) = self.inodes.get(&new) {
            p.meta.lock().nlink += 1;
        }
    }

    /// The entries of directory `ino` with `.` and `..` first: (inode, kind, name).
    pub fn entries(&self, ino: Ino) -> Result<Vec<(Ino, Kind, OsString)>, FsError> {
        let dir = self.dirs.get(&ino).ok_or(FsError::NotDir)?;
        let mut out = vec![
            (ino, Kind::Dir, OsString::from(".")),
            (self.parents[&ino], Kind::Dir, OsString::from("..")),
        ];
        out.extend(
            dir.iter()
                .filter_map(|(n, &i)| Some((i, self.inodes.get(&i)?.kind, n.clone()))),
        );
        Ok(out)
    }

    /// The kernel dropped `n` references to `ino`; returns the inode if it is gone.
    pub fn forget(&mut self, ino: Ino, n: u64) -> Option<Arc<Inode>> {
        let inode = self.inodes.get(&ino)?;
        let _ = inode
            .lookups
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| {
                Some(l.saturating_sub(n))
            });
        self.reap(ino)
    }

    /// Every inode, for a snapshot or to free everything.
    pub fn inodes(&self) -> impl Iterator<Item = &Arc<Inode>> {
        self.inodes.values()
    }
}

impl Namespace {
    /// The whole namespace as saved: every inode still named by a directory, with its
    /// written pages.
    pub fn save(&self) -> Snapshot {
        let mut inodes: Vec<SavedInode> = self
            .inodes
            .values()
            .filter(|i| i.ino == ROOT || i.meta.lock().nlink > 0)
            .map(|i| {
                let m = i.meta.lock().clone();
                let table = i.table.read();
                let mut s = snapshot::save_inode(i.ino, i.kind, &m, &i.target, table.entries());
                if let Some(d) = self.dirs.get(&i.ino) {
                    s.parent = self.parents.get(&i.ino).copied();
                    s.entries = d
                        .iter()
                        .map(|(n, &c)| (n.as_encoded_bytes().to_vec(), c))
                        .collect();
                }
                s
            })
            .collect();
        inodes.sort_by_key(|i| i.ino);
        Snapshot {
            next_ino: self.next,
            inodes,
        }
    }

    /// The namespace a snapshot saved, checked for consistency (the pages are the caller's
    /// to adopt).
    pub fn restore(snap: &Snapshot) -> Result<Namespace, SnapshotError> {
        let damaged = |what: String| SnapshotError::Damaged(what);
        let mut ns = Namespace {
            inodes: HashMap::new(),
            dirs: HashMap::new(),
            parents: HashMap::new(),
            next: snap.next_ino,
        };
        for s in &snap.inodes {
            let kind = snapshot::kind_of(s.kind, s.rdev)?;
            if s.ino == 0 || s.ino >= snap.next_ino {
                return Err(damaged(format!("inode {} out of range", s.ino)));
            }
            let mut table = PageTable::new();
            for &(fp, at, n) in &s.extents {
                for i in 0..n {
                    table.map(fp + i, at + i);
                    table.mark_written(fp + i);
                }
            }
            let inode = Arc::new(Inode {
                ino: s.ino,
                kind,
                meta: Mutex::new(snapshot::meta_of(s)),
                table: RwLock::new(table),
                target: snapshot::name(&s.target),
                lookups: AtomicU64::new(u64::from(s.ino == ROOT)),
            });
            if ns.inodes.insert(s.ino, inode).is_some() {
                return Err(damaged(format!("inode {} saved twice", s.ino)));
            }
            if kind == Kind::Dir {
                let entries = s.entries.iter().map(|(n, c)| (snapshot::name(n), *c));
                ns.dirs.insert(s.ino, entries.collect());
                ns.parents.insert(s.ino, s.parent.unwrap_or(ROOT));
            }
        }
        let root_ok = ns.inodes.get(&ROOT).is_some_and(|r| r.kind == Kind::Dir);
        let dangling = ns
            .dirs
            .values()
            .flat_map(|d| d.values())
            .chain(ns.parents.values())
            .any(|c| !ns.inodes.contains_key(c));
        if !root_ok || dangling {
            return Err(damaged("the directory tree names missing inodes".into()));
        }
        Ok(ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(kind: Kind) -> NewInode {
        NewInode {
            kind,
            perm: 0o755,
            uid: 0,
            gid: 0,
            target: OsString::new(),
        }
    }

    fn names(ns: &Namespace, dir: Ino) -> Vec<String> {
        ns.entries(dir)
            .unwrap()
            .into_iter()
            .map(|(_, _, n)| n.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn create_lookup_unlink_and_link_counts() {
        let mut ns = Namespace::new(0o755, 0, 0);
        let d = ns.create(ROOT, "d".as_ref(), &new(Kind::Dir)).unwrap();
        let f = ns.create(d.ino, "f".as_ref(), &new(Kind::File)).unwrap();
        assert_eq!(ns.get(ROOT).unwrap().meta.lock().nlink, 3);
        assert_eq!(ns.lookup(d.ino, "..".as_ref()).unwrap().ino, ROOT);
        assert_eq!(names(&ns, d.ino), [".", "..", "f"]);
        assert!(matches!(
            ns.create(d.ino, "f".as_ref(), &new(Kind::File)),
            Err(FsError::Exists)
        ));
        assert!(matches!(
            ns.rmdir(ROOT, "d".as_ref()),
            Err(FsError::NotEmpty)
        ));
        ns.link(f.ino, ROOT, "g".as_ref()).unwrap();
        assert_eq!(f.meta.lock().nlink, 2);
        assert!(ns.unlink(d.ino, "f".as_ref()).unwrap().is_none());
        // The last link of a file the kernel never looked up: gone at once.
        let gone = ns.unlink(ROOT, "g".as_ref()).unwrap().unwrap();
        assert_eq!(gone.ino, f.ino);
        assert!(ns.get(f.ino).is_err());
        assert!(ns.rmdir(ROOT, "d".as_ref()).unwrap().is_some());
        assert_eq!(ns.get(ROOT).unwrap().meta.lock().nlink, 2);
    }

    #[test]
    fn an_open_unlinked_file_lives_until_forgotten() {
        let mut ns = Namespace::new(0o755, 0, 0);
        let f = ns.create(ROOT, "f".as_ref(), &new(Kind::File)).unwrap();
        f.looked_up();
        assert!(ns.unlink(ROOT, "f".as_ref()).unwrap().is_none());
        assert!(ns.get(f.ino).is_ok());
        assert_eq!(ns.forget(f.ino, 1).unwrap().ino, f.ino);
        assert!(ns.get(f.ino).is_err());
    }

    #[test]
    fn rename_replaces_refuses_and_exchanges_as_rename_2() {
        let mut ns = Namespace::new(0o755, 0, 0);
        let a = ns.create(ROOT, "a".as_ref(), &new(Kind::Dir)).unwrap();
        let b = ns.create(a.ino, "b".as_ref(), &new(Kind::Dir)).unwrap();
        let f = ns.create(ROOT, "f".as_ref(), &new(Kind::File)).unwrap();
        let g = ns.create(ROOT, "g".as_ref(), &new(Kind::File)).unwrap();
        // A directory into itself.
        assert!(matches!(
            ns.rename((ROOT, "a".as_ref()), (b.ino, "x".as_ref()), false, false),
            Err(FsError::Invalid)
        ));
        assert!(matches!(
            ns.rename((ROOT, "f".as_ref()), (ROOT, "g".as_ref()), true, false),
            Err(FsError::Exists)
        ));
        assert!(matches!(
            ns.rename((ROOT, "f".as_ref()), (ROOT, "a".as_ref()), false, false),
            Err(FsError::IsDir)
        ));
        ns.rename((ROOT, "f".as_ref()), (ROOT, "g".as_ref()), false, true)
            .unwrap();
        assert_eq!(ns.lookup(ROOT, "f".as_ref()).unwrap().ino, g.ino);
        let gone = ns
            .rename((ROOT, "f".as_ref()), (ROOT, "g".as_ref()), false, false)
            .unwrap();
        assert_eq!(gone.unwrap().ino, f.ino);
        assert_eq!(names(&ns, ROOT), [".", "..", "a", "g"]);
        // A directory moves: link counts and `..` follow.
        ns.rename((a.ino, "b".as_ref()), (ROOT, "b".as_ref()), false, false)
            .unwrap();
        assert_eq!(ns.lookup(b.ino, "..".as_ref()).unwrap().ino, ROOT);
        assert_eq!(a.meta.lock().nlink, 2);
        assert_eq!(ns.get(ROOT).unwrap().meta.lock().nlink, 4);
    }

    #[test]
    fn bad_names_are_refused() {
        let mut ns = Namespace::new(0o755, 0, 0);
        let long = "x".repeat(NAME_MAX + 1);
        for (name, want) in [
            (long.as_str(), "NameTooLong"),
            ("a/b", "Invalid"),
            ("..", "Invalid"),
            ("", "Invalid"),
        ] {
            let e = ns
                .create(ROOT, name.as_ref(), &new(Kind::File))
                .unwrap_err();
            assert_eq!(format!("{e:?}"), want);
        }
    }
}
