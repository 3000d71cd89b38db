//! Tests of the file system without a kernel: POSIX behaviour over an in-memory store, and
//! failures of the store reaching the caller as the right errno, the rest of the file system
//! unharmed.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::*;
use crate::client::{ClientError, IoError, Page};
use crate::nbd::MemStore;

const P: u64 = PAGE_SIZE as u64;

/// A store in memory whose pages in `failing` fail (as pages on too many lost nodes do), and
/// that fails every write of a page never written before with OutOfCapacity when `full`.
struct FaultyStore {
    inner: Arc<MemStore>,
    failing: Mutex<HashSet<u64>>,
    full: Mutex<bool>,
    /// Every list call's addresses, in order.
    calls: Mutex<Vec<Vec<u64>>>,
    /// Pages forgotten and not written since: reading one breaks [`PageStore::forget`]'s
    /// contract (a span store may answer an older write), so it fails here.
    forgotten: Mutex<HashSet<u64>>,
    /// Every page ever forgotten, in order.
    forgets: Mutex<Vec<u64>>,
}

impl FaultyStore {
    fn new(bytes: u64) -> Arc<FaultyStore> {
        Arc::new(FaultyStore {
            inner: MemStore::new(bytes, Duration::ZERO),
            failing: Mutex::new(HashSet::new()),
            full: Mutex::new(false),
            calls: Mutex::new(Vec::new()),
            forgotten: Mutex::new(HashSet::new()),
            forgets: Mutex::new(Vec::new()),
        })
    }

    fn check(&self, addr: u64, what: &'static str) -> Result<(), IoError> {
        if what == "read" {
            assert!(
                !self.forgotten.lock().contains(&addr),
                "page {addr:#x} read after it was forgotten and before a write"
            );
        } else {
            self.forgotten.lock().remove(&addr);
        }
        if self.failing.lock().contains(&addr) {
            return Err(IoError::Unavailable {
                what,
                addr,
                range: 0,
                needed: 8,
                got: 7,
                nodes: "3 nodes down".into(),
            });
        }
        if what == "write" && *self.full.lock() && self.inner.known_zero(addr) {
            return Err(IoError::Map(ClientError::OutOfCapacity {
                range: 0,
                full: "every node".into(),
            }));
        }
        Ok(())
    }
}

impl PageStore for FaultyStore {
    fn read_page(&self, addr: u64, page: &mut Page) -> Result<(), IoError> {
        self.check(addr, "read")?;
        self.inner.read_page(addr, page)
    }
    fn write_page(&self, addr: u64, page: &Page) -> Result<(), IoError> {
        self.check(addr, "write")?;
        self.inner.write_page(addr, page)
    }
    fn read_list(&self, list: &mut [(u64, &mut Page)]) -> Result<(), IoError> {
        self.calls
            .lock()
            .push(list.iter().map(|(a, _)| *a).collect());
        list.iter_mut()
            .try_for_each(|(addr, page)| self.read_page(*addr, page))
    }
    fn write_list(&self, list: &[(u64, &Page)]) -> Result<(), IoError> {
        self.calls
            .lock()
            .push(list.iter().map(|(a, _)| *a).collect());
        list.iter()
            .try_for_each(|(addr, page)| self.write_page(*addr, page))
    }
    fn forget(&self, addrs: &[u64]) {
        self.forgotten.lock().extend(addrs);
        self.forgets.lock().extend(addrs);
    }
}

fn fs_over(store: Arc<FaultyStore>, bytes: u64) -> HydraFs {
    HydraFs::new(store, bytes, 0, 0, None)
}

fn file(fs: &HydraFs, name: &str) -> Ino {
    fs.create(ROOT, name.as_ref(), Kind::File, 0o644, 0, 0, OsStr::new(""))
        .unwrap()
        .ino
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn bytes_read_back_at_any_offset_with_holes_as_zeros() {
    let store = FaultyStore::new(1 << 20);
    let fs = fs_over(store, 1 << 20);
    let f = file(&fs, "f");
    // Unaligned, across pages, then a write far beyond the end leaving a hole.
    let a = pattern(10_000, 1);
    fs.write(f, 1000, &a).unwrap();
    let b = pattern(300, 2);
    fs.write(f, 5 * P + 17, &b).unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, 5 * P + 317);
    let all = fs.read(f, 0, 1 << 20).unwrap();
    assert_eq!(all.len() as u64, 5 * P + 317);
    let mut want = vec![0u8; all.len()];
    want[1000..11_000].copy_from_slice(&a);
    want[(5 * P + 17) as usize..].copy_from_slice(&b);
    assert_eq!(all, want);
    // Page 3 and 4 were never touched: holes, no page of the store spent on them.
    assert_eq!(fs.getattr(f).unwrap().pages, 4);
    // Overwrite part of one page: its other bytes stay.
    fs.write(f, 1500, &[9; 10]).unwrap();
    want[1500..1510].fill(9);
    assert_eq!(fs.read(f, 0, want.len()).unwrap(), want);
    // Reads past the end are short, at the end empty.
    assert_eq!(fs.read(f, 5 * P + 300, 100).unwrap().len(), 17);
    assert!(fs.read(f, 1 << 40, 100).unwrap().is_empty());
}

#[test]
fn a_file_written_in_order_is_one_run_of_pages_per_request() {
    let store = FaultyStore::new(8 << 20);
    let fs = fs_over(store.clone(), 8 << 20);
    let other = file(&fs, "other");
    let f = file(&fs, "f");
    for i in 0..4u64 {
        fs.write(f, i * 64 * P, &pattern(64 * PAGE_SIZE, i as u8))
            .unwrap();
        // Another file growing in between does not break this one's contiguity.
        fs.write(other, i * P, &pattern(PAGE_SIZE, 9)).unwrap();
    }
    store.calls.lock().clear();
    let bytes = fs.read(f, 0, 256 * PAGE_SIZE).unwrap();
    assert_eq!(&bytes[..64 * PAGE_SIZE], &pattern(64 * PAGE_SIZE, 0)[..]);
    let calls = store.calls.lock();
    assert_eq!(calls.len(), 1, "one list call for one request");
    let runs = calls[0].windows(2).filter(|w| w[1] != w[0] + P).count() + 1;
    assert!(runs <= 4, "256 pages in {runs} runs");
}

#[test]
fn truncate_and_regrow_show_zeros_and_free_pages() {
    let store = FaultyStore::new(1 << 20);
    let fs = fs_over(store, 1 << 20);
    let f = file(&fs, "f");
    fs.write(f, 0, &pattern(3 * PAGE_SIZE, 5)).unwrap();
    let (_, free_before) = fs.data.usage();
    let set = |size| SetAttr {
        size: Some(size),
        ..SetAttr::default()
    };
    fs.setattr(f, &set(100)).unwrap();
    assert_eq!(fs.data.usage().1, free_before + 2);
    fs.setattr(f, &set(2 * P)).unwrap();
    let bytes = fs.read(f, 0, 2 * PAGE_SIZE).unwrap();
    assert_eq!(&bytes[..100], &pattern(100, 5)[..]);
    assert!(bytes[100..].iter().all(|&b| b == 0));
}

#[test]
fn pages_of_a_deleted_file_read_as_zeros_in_the_next_one() {
    // 64 pages for files, and page 0 for the superblock.
    let store = FaultyStore::new(65 * P);
    let fs = fs_over(store, 65 * P);
    let f = file(&fs, "old");
    fs.write(f, 0, &vec![0xaa; 64 * PAGE_SIZE]).unwrap();
    fs.unlink(ROOT, "old".as_ref()).unwrap();
    fs.forget(f, 1);
    assert_eq!(
        fs.data.usage().1,
        64,
        "pages freed once unlinked and forgotten"
    );
    let g = file(&fs, "new");
    fs.fallocate(g, 0, 8 * P, 0).unwrap();
    assert_eq!(fs.getattr(g).unwrap().size, 8 * P);
    assert!(fs
        .read(g, 0, 8 * PAGE_SIZE)
        .unwrap()
        .iter()
        .all(|&b| b == 0));
    // A partial write to a reused page starts from zeros, not from the old file's bytes.
    fs.write(g, 10, &[1, 2, 3]).unwrap();
    let page = fs.read(g, 0, PAGE_SIZE).unwrap();
    assert_eq!(&page[10..13], &[1, 2, 3]);
    assert_eq!(page.iter().filter(|&&b| b != 0).count(), 3);
}

#[test]
fn an_unlinked_file_keeps_its_pages_while_the_kernel_holds_it() {
    let store = FaultyStore::new(17 * P);
    let fs = fs_over(store, 17 * P);
    let f = file(&fs, "f"); // create counts one kernel reference
    fs.write(f, 0, &pattern(4 * PAGE_SIZE, 3)).unwrap();
    fs.unlink(ROOT, "f".as_ref()).unwrap();
    assert_eq!(
        fs.read(f, 0, 4 * PAGE_SIZE).unwrap(),
        pattern(4 * PAGE_SIZE, 3)
    );
    assert_eq!(fs.data.usage().1, 12);
    fs.forget(f, 1);
    assert_eq!(fs.data.usage().1, 16);
    assert!(matches!(fs.getattr(f), Err(FsError::NotFound)));
}

#[test]
fn fallocate_punches_zeroes_and_keeps_size() {
    let store = FaultyStore::new(1 << 20);
    let fs = fs_over(store, 1 << 20);
    let f = file(&fs, "f");
    let data = pattern(4 * PAGE_SIZE, 7);
    fs.write(f, 0, &data).unwrap();
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    fs.fallocate(f, 100, 2 * P, punch).unwrap();
    let mut want = data.clone();
    want[100..100 + 2 * PAGE_SIZE].fill(0);
    assert_eq!(fs.read(f, 0, 4 * PAGE_SIZE).unwrap(), want);
    // Page 1 was covered whole: freed.
    assert_eq!(fs.getattr(f).unwrap().pages, 3);
    fs.fallocate(f, 3 * P, P, libc::FALLOC_FL_ZERO_RANGE)
        .unwrap();
    want[3 * PAGE_SIZE..].fill(0);
    assert_eq!(fs.read(f, 0, 4 * PAGE_SIZE).unwrap(), want);
    fs.fallocate(f, 8 * P, P, libc::FALLOC_FL_KEEP_SIZE)
        .unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, 4 * P);
    assert!(matches!(
        fs.fallocate(f, 0, P, libc::FALLOC_FL_PUNCH_HOLE),
        Err(FsError::Unsupported)
    ));
    assert!(matches!(
        fs.fallocate(f, 0, P, libc::FALLOC_FL_COLLAPSE_RANGE),
        Err(FsError::Unsupported)
    ));
}

#[test]
fn concurrent_partial_writes_to_one_page_are_all_kept() {
    let store = FaultyStore::new(1 << 20);
    let fs = Arc::new(fs_over(store, 1 << 20));
    let f = file(&fs, "f");
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let fs = fs.clone();
            s.spawn(move || {
                for i in 0..64u64 {
                    // Thread t owns bytes t*8..t*8+8 of every 64-byte slot of page 0 and 1.
                    let at = (i * 64 + t * 8) % (2 * P);
                    fs.write(f, at, &[t as u8 + 1; 8]).unwrap();
                }
            });
        }
    });
    let bytes = fs.read(f, 0, 2 * PAGE_SIZE).unwrap();
    for i in 0..64u64 {
        for t in 0..8u64 {
            let at = ((i * 64 + t * 8) % (2 * P)) as usize;
            assert_eq!(&bytes[at..at + 8], &[t as u8 + 1; 8], "slot {i} thread {t}");
        }
    }
}

#[test]
fn lost_pages_fail_their_requests_with_eio_and_nothing_else() {
    let store = FaultyStore::new(1 << 20);
    let fs = fs_over(store.clone(), 1 << 20);
    let f = file(&fs, "f");
    let g = file(&fs, "g");
    fs.write(f, 0, &pattern(2 * PAGE_SIZE, 1)).unwrap();
    fs.write(g, 0, &pattern(2 * PAGE_SIZE, 2)).unwrap();
    // The pages of f are lost (more nodes down than the scheme tolerates).
    store.failing.lock().extend([0, P]);
    let e = fs.read(f, 0, 10).unwrap_err();
    assert_eq!(e.errno(), libc::EIO);
    assert_eq!(fs.write(f, 5, &[1]).unwrap_err().errno(), libc::EIO);
    // The rest of the file system goes on.
    assert_eq!(
        fs.read(g, 0, 2 * PAGE_SIZE).unwrap(),
        pattern(2 * PAGE_SIZE, 2)
    );
    let h = file(&fs, "h");
    fs.write(h, 0, b"still works").unwrap();
    assert_eq!(fs.read(h, 0, 11).unwrap(), b"still works");
    // A failed write is not marked written: once the pages are back, f is as it was.
    store.failing.lock().clear();
    assert_eq!(
        fs.read(f, 0, 2 * PAGE_SIZE).unwrap(),
        pattern(2 * PAGE_SIZE, 1)
    );
}

#[test]
fn out_of_space_is_enospc_from_the_address_space_and_from_the_cluster() {
    let store = FaultyStore::new(9 * P);
    let fs = fs_over(store.clone(), 9 * P);
    let f = file(&fs, "f");
    fs.write(f, 0, &vec![1; 6 * PAGE_SIZE]).unwrap();
    let e = fs.write(f, 6 * P, &vec![1; 4 * PAGE_SIZE]).unwrap_err();
    assert_eq!(e.errno(), libc::ENOSPC);
    // Nothing was allocated by the refused write.
    assert_eq!(fs.data.usage().1, 2);
    *store.full.lock() = true;
    let e = fs.write(f, 6 * P, &[1; 10]).unwrap_err();
    assert_eq!(e.errno(), libc::ENOSPC);
    // Pages already held are still written.
    fs.write(f, 0, &[2; 10]).unwrap();
    assert_eq!(fs.read(f, 0, 10).unwrap(), [2; 10]);
}

#[test]
fn statfs_counts_free_pages_and_the_clusters_capacity() {
    let store = FaultyStore::new(1 << 20);
    let cap: Capacity = Box::new(|| Some(10 * P));
    let fs = HydraFs::new(store, 1 << 20, 0, 0, Some(cap));
    let f = file(&fs, "f");
    fs.write(f, 0, &[1; 10]).unwrap();
    assert_eq!(
        fs.space(),
        Space {
            blocks: 256,
            free: 10,
            files: 2
        }
    );
    let fs = fs_over(FaultyStore::new(1 << 20), 1 << 20);
    assert_eq!(fs.space().free, 255, "all but the superblock's page");
}

#[test]
fn directories_symlinks_and_links_through_the_file_system() {
    let fs = fs_over(FaultyStore::new(1 << 20), 1 << 20);
    let d = fs
        .create(ROOT, "d".as_ref(), Kind::Dir, 0o755, 0, 0, OsStr::new(""))
        .unwrap();
    let l = fs
        .create(
            d.ino,
            "l".as_ref(),
            Kind::Symlink,
            0o777,
            0,
            0,
            "../f".as_ref(),
        )
        .unwrap();
    assert_eq!(fs.readlink(l.ino).unwrap(), "../f");
    assert_eq!(l.size, 4);
    let f = file(&fs, "f");
    fs.link(f, d.ino, "hard".as_ref()).unwrap();
    fs.write(f, 0, b"x").unwrap();
    assert_eq!(fs.getattr(f).unwrap().nlink, 2);
    let names: Vec<_> = fs
        .entries(d.ino)
        .unwrap()
        .into_iter()
        .map(|e| e.2)
        .collect();
    assert_eq!(names, [".", "..", "hard", "l"]);
    assert!(matches!(fs.read(d.ino, 0, 1), Err(FsError::IsDir)));
    assert!(matches!(
        fs.rmdir(ROOT, "d".as_ref()),
        Err(FsError::NotEmpty)
    ));
}

fn kept(store: &Arc<FaultyStore>, bytes: u64) -> HydraFs {
    HydraFs::open(store.clone(), bytes, 0, 0, None).unwrap()
}

#[test]
fn a_kept_identity_finds_its_files_after_a_clean_unmount() {
    let store = FaultyStore::new(4 << 20);
    let fs = kept(&store, 4 << 20);
    let d = fs
        .create(ROOT, "dir".as_ref(), Kind::Dir, 0o700, 5, 6, OsStr::new(""))
        .unwrap();
    let f = fs
        .create(
            d.ino,
            "data".as_ref(),
            Kind::File,
            0o600,
            5,
            6,
            OsStr::new(""),
        )
        .unwrap()
        .ino;
    let bytes = pattern(300_000, 4);
    fs.write(f, 123, &bytes).unwrap();
    fs.fallocate(f, 1 << 20, 8 * P, 0).unwrap();
    fs.create(
        ROOT,
        "link".as_ref(),
        Kind::Symlink,
        0o777,
        0,
        0,
        "dir/data".as_ref(),
    )
    .unwrap();
    let before = fs.getattr(f).unwrap();
    let free = fs.data.usage().1;
    fs.save().unwrap();
    drop(fs);

    let fs = kept(&store, 4 << 20);
    let d2 = fs.lookup(ROOT, "dir".as_ref()).unwrap();
    assert_eq!((d2.perm, d2.uid, d2.gid, d2.nlink), (0o700, 5, 6, 2));
    let f2 = fs.lookup(d2.ino, "data".as_ref()).unwrap();
    assert_eq!(f2.ino, f);
    assert_eq!((f2.size, f2.mtime), (before.size, before.mtime));
    assert_eq!(fs.read(f, 123, bytes.len()).unwrap(), bytes);
    assert!(fs
        .read(f, 1 << 20, 8 * PAGE_SIZE)
        .unwrap()
        .iter()
        .all(|&b| b == 0));
    let l = fs.lookup(ROOT, "link".as_ref()).unwrap();
    assert_eq!(fs.readlink(l.ino).unwrap(), "dir/data");
    // The kept pages are the files' again (the unwritten ones are free), so new files
    // cannot overwrite them.
    assert_eq!(fs.data.usage().1, free + 8);
    let g = file(&fs, "new");
    fs.write(g, 0, &vec![0xee; 900 * PAGE_SIZE]).unwrap();
    assert_eq!(fs.read(f, 123, bytes.len()).unwrap(), bytes);
}

#[test]
fn fifos_sockets_and_device_nodes_are_attributes_only_and_are_kept() {
    let store = FaultyStore::new(1 << 20);
    let fs = kept(&store, 1 << 20);
    let dev = (8 << 8) | 3; // makedev(8, 3) in the old 16-bit encoding
    let kinds = [
        ("fifo", Kind::Fifo),
        ("sock", Kind::Socket),
        ("chr", Kind::CharDev(dev)),
        ("blk", Kind::BlockDev(dev + 1)),
    ];
    for (name, kind) in kinds {
        let a = fs
            .create(ROOT, name.as_ref(), kind, 0o640, 7, 8, OsStr::new(""))
            .unwrap();
        assert_eq!((a.kind, a.size, a.pages, a.nlink), (kind, 0, 0, 1));
        // No bytes of their own: reading, writing or sizing one is refused.
        assert!(matches!(fs.read(a.ino, 0, 10), Err(FsError::Invalid)));
        assert!(matches!(fs.write(a.ino, 0, b"x"), Err(FsError::Invalid)));
    }
    fs.save().unwrap();
    drop(fs);

    let fs = kept(&store, 1 << 20);
    for (name, kind) in kinds {
        let a = fs.lookup(ROOT, name.as_ref()).unwrap();
        assert_eq!(
            (a.kind, a.perm, a.uid, a.gid),
            (kind, 0o640, 7, 8),
            "{name}"
        );
    }
    assert_eq!(Kind::BlockDev(dev + 1).rdev(), dev + 1);
    assert_eq!(Kind::Fifo.rdev(), 0);
}

#[test]
fn a_mount_that_died_leaves_no_snapshot_to_load() {
    let store = FaultyStore::new(1 << 20);
    let fs = kept(&store, 1 << 20);
    let f = file(&fs, "f");
    fs.write(f, 0, b"saved").unwrap();
    fs.save().unwrap();
    drop(fs);
    // The next mount loads it and marks it stale; it dies without saving.
    let fs = kept(&store, 1 << 20);
    let g = file(&fs, "g");
    fs.write(g, 0, &vec![1; 64 * PAGE_SIZE]).unwrap();
    drop(fs);
    // Its pages may have been reused: the old snapshot is never loaded again.
    let fs = kept(&store, 1 << 20);
    assert!(matches!(
        fs.lookup(ROOT, "f".as_ref()),
        Err(FsError::NotFound)
    ));
    assert_eq!(fs.files(), 1);
}

#[test]
fn a_kept_file_system_refuses_another_size_and_a_damaged_snapshot() {
    let store = FaultyStore::new(2 << 20);
    let fs = kept(&store, 1 << 20);
    let f = file(&fs, "f");
    fs.write(f, 0, b"x").unwrap();
    fs.save().unwrap();
    drop(fs);
    let e = HydraFs::open(store.clone(), 2 << 20, 0, 0, None)
        .err()
        .unwrap();
    assert!(e.to_string().contains("mount with --size 1048576"), "{e}");
    // Flip a byte of the snapshot (the page after the file's).
    let mut page = [0u8; PAGE_SIZE];
    store.inner.read_page(2 * P, &mut page).unwrap();
    page[3] ^= 1;
    store.inner.write_page(2 * P, &page).unwrap();
    let e = HydraFs::open(store.clone(), 1 << 20, 0, 0, None)
        .err()
        .unwrap();
    assert!(e.to_string().contains("damaged"), "{e}");
}

/// The store addresses of the pages file `ino` holds, in file order.
fn held(fs: &HydraFs, ino: Ino) -> Vec<u64> {
    fs.ns
        .read()
        .get(ino)
        .unwrap()
        .table
        .read()
        .entries()
        .filter_map(|(_, e)| e.page())
        .map(|at| at * P)
        .collect()
}

#[test]
fn deleted_truncated_and_punched_pages_are_forgotten_and_not_read_before_written_again() {
    // 16 pages for files, and page 0 for the superblock: the next file must reuse them.
    let store = FaultyStore::new(17 * P);
    let fs = fs_over(store.clone(), 17 * P);
    let f = file(&fs, "f");
    fs.write(f, 0, &pattern(8 * PAGE_SIZE, 1)).unwrap();
    let pages = held(&fs, f);
    assert_eq!(pages.len(), 8);
    // Truncating to 3 pages and a bit forgets the 4 pages past the cut, not the last kept.
    let size = |n| SetAttr {
        size: Some(n),
        ..SetAttr::default()
    };
    fs.setattr(f, &size(3 * P + 100)).unwrap();
    assert_eq!(*store.forgets.lock(), pages[4..].to_vec());
    // Punching page 1 whole forgets it; the partly covered page 2 keeps its copy.
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    fs.fallocate(f, P, P + 10, punch).unwrap();
    assert_eq!(store.forgets.lock().len(), 5);
    assert_eq!(store.forgets.lock()[4], pages[1]);
    // Deleting forgets the rest.
    fs.unlink(ROOT, "f".as_ref()).unwrap();
    fs.forget(f, 1);
    let mut all = store.forgets.lock().clone();
    all.sort_unstable();
    assert_eq!(all, pages);
    // A new file fills all 16 pages, the forgotten ones among them, and reads back its own
    // bytes: no page was read between its forget and its next write (the store asserts it).
    let g = file(&fs, "g");
    fs.write(g, 10, &pattern(16 * PAGE_SIZE - 10, 2)).unwrap();
    assert_eq!(
        fs.read(g, 10, 16 * PAGE_SIZE).unwrap(),
        pattern(16 * PAGE_SIZE - 10, 2)
    );
    assert!(
        store.forgotten.lock().is_empty(),
        "every page written again"
    );
}

#[test]
fn a_remount_forgets_every_page_no_file_holds() {
    let store = FaultyStore::new(1 << 20);
    let fs = kept(&store, 1 << 20);
    let (a, b) = (file(&fs, "a"), file(&fs, "b"));
    fs.write(a, 0, &pattern(4 * PAGE_SIZE, 1)).unwrap();
    fs.write(b, 0, &pattern(4 * PAGE_SIZE, 2)).unwrap();
    let files: Vec<u64> = held(&fs, a).into_iter().chain(held(&fs, b)).collect();
    fs.save().unwrap();
    drop(fs);
    store.forgets.lock().clear();
    // The reattach (a span store's) may find the snapshot's pages and old copies again: the
    // remount forgets every page but the superblock and the files'.
    let fs = kept(&store, 1 << 20);
    let forgotten: HashSet<u64> = store.forgets.lock().iter().copied().collect();
    assert_eq!(forgotten.len() as u64, (1 << 20) / P - 1 - 8);
    assert!(!forgotten.contains(&0), "the superblock");
    assert!(
        files.iter().all(|p| !forgotten.contains(p)),
        "a file's page"
    );
    // The files read back (a forgotten page read before a write fails the store's check).
    assert_eq!(
        fs.read(a, 0, 4 * PAGE_SIZE).unwrap(),
        pattern(4 * PAGE_SIZE, 1)
    );
    assert_eq!(
        fs.read(b, 0, 4 * PAGE_SIZE).unwrap(),
        pattern(4 * PAGE_SIZE, 2)
    );
}
