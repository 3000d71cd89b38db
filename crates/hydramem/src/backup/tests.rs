//! Tests of the backup store over a remote store in memory that fails as a node does: every
//! acknowledged write reads back exactly whatever the remote copy does, the queue coalesces
//! and holds writers back when full, and closing drains it. The drain thread is held back by
//! taking the file's write lock from the test, never by sleeping.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use proptest::prelude::*;

use super::*;
use crate::client::Page;
use crate::nbd::PageStore;
use crate::PAGE_SIZE;

const P: u64 = PAGE_SIZE as u64;

/// A remote store in memory. `fail_reads` / `fail_writes` make its calls fail with the data
/// kept (a partition: after it, pages written meanwhile are stale there); `kill` loses every
/// page, whose reads then fail until rewritten (a single copy whose node died, its range
/// moved to a fresh slab); addresses from `size` on are out of range.
struct Flaky {
    pages: Mutex<HashMap<u64, Page>>,
    lost: Mutex<HashSet<u64>>,
    fail_reads: AtomicBool,
    fail_writes: AtomicBool,
    /// Calls of a list of more than one page.
    lists: AtomicU64,
    size: u64,
}

impl Flaky {
    fn new(size: u64) -> Arc<Flaky> {
        Arc::new(Flaky {
            pages: Mutex::new(HashMap::new()),
            lost: Mutex::new(HashSet::new()),
            fail_reads: AtomicBool::new(false),
            fail_writes: AtomicBool::new(false),
            lists: AtomicU64::new(0),
            size,
        })
    }

    fn kill(&self) {
        let mut pages = self.pages.lock();
        self.lost.lock().extend(pages.keys().copied());
        pages.clear();
    }

    fn fail(&self, what: &'static str, addr: u64) -> IoError {
        IoError::Unavailable {
            what,
            addr,
            range: 0,
            needed: 1,
            got: 0,
            nodes: "node 0 at 127.0.0.1:1 (down)".into(),
        }
    }

    fn check(&self, what: &'static str, addr: u64) -> Result<(), IoError> {
        if addr >= self.size {
            return Err(IoError::OutOfRange {
                addr,
                size: self.size,
            });
        }
        let failing = match what {
            "read" => &self.fail_reads,
            _ => &self.fail_writes,
        };
        if failing.load(Ordering::SeqCst) || (what == "read" && self.lost.lock().contains(&addr)) {
            return Err(self.fail(what, addr));
        }
        Ok(())
    }
}

impl PageStore for Flaky {
    fn read_page(&self, addr: u64, page: &mut Page) -> Result<(), IoError> {
        self.check("read", addr)?;
        *page = self
            .pages
            .lock()
            .get(&addr)
            .copied()
            .unwrap_or([0; PAGE_SIZE]);
        Ok(())
    }
    fn write_page(&self, addr: u64, page: &Page) -> Result<(), IoError> {
        self.check("write", addr)?;
        self.pages.lock().insert(addr, *page);
        self.lost.lock().remove(&addr);
        Ok(())
    }
    fn read_list(&self, list: &mut [(u64, &mut Page)]) -> Result<(), IoError> {
        if list.len() > 1 {
            self.lists.fetch_add(1, Ordering::SeqCst);
        }
        list.iter_mut()
            .try_for_each(|(addr, page)| self.read_page(*addr, page))
    }
    fn write_list(&self, list: &[(u64, &Page)]) -> Result<(), IoError> {
        if list.len() > 1 {
            self.lists.fetch_add(1, Ordering::SeqCst);
        }
        list.iter()
            .try_for_each(|(addr, page)| self.write_page(*addr, page))
    }
    fn location(&self, _addr: u64) -> Option<String> {
        Some("node 0".into())
    }
}

/// A page that names its address and its version.
fn page(addr: u64, v: u8) -> Page {
    let mut p = [v; PAGE_SIZE];
    p[..8].copy_from_slice(&addr.to_le_bytes());
    p
}

fn store(remote: &Arc<Flaky>, queue_pages: u64) -> (tempfile::TempDir, BackedStore) {
    let dir = tempfile::tempdir().unwrap();
    let config = BackupConfig {
        dir: dir.path().into(),
        queue_bytes: queue_pages * P,
    };
    let s = BackedStore::new(remote.clone(), &config).unwrap();
    (dir, s)
}

/// Yields until `f` holds (the drain thread or a writer reaches a state).
fn until(mut f: impl FnMut() -> bool) {
    while !f() {
        std::thread::yield_now();
    }
}

/// Reads every page of `want` back through each read call of the store.
fn check_all(s: &BackedStore, want: &HashMap<u64, Page>) {
    let mut got = [0u8; PAGE_SIZE];
    for (&addr, p) in want {
        s.read_page(addr, &mut got).unwrap();
        assert!(got == *p, "read_page of {addr:#x}");
    }
    let addrs: Vec<u64> = want.keys().copied().collect();
    let mut pages = vec![[0u8; PAGE_SIZE]; addrs.len()];
    let mut list: Vec<(u64, &mut Page)> = addrs.iter().copied().zip(pages.iter_mut()).collect();
    s.read_list(&mut list).unwrap();
    let submitted = s.submit_read(addrs.clone()).unwrap().wait().unwrap();
    for (i, addr) in addrs.iter().enumerate() {
        assert!(pages[i] == want[addr], "read_list of {addr:#x}");
        assert!(submitted[i] == want[addr], "submit_read of {addr:#x}");
    }
}

#[test]
fn every_page_reads_back_from_the_file_when_remote_reads_fail() {
    let remote = Flaky::new(1 << 30);
    let (_dir, s) = store(&remote, 1024);
    let want: HashMap<u64, Page> = (0..64).map(|i| (i * P, page(i * P, 1))).collect();
    let list: Vec<(u64, &Page)> = want.iter().map(|(a, p)| (*a, p)).collect();
    s.write_list(&list).unwrap();
    s.flush();
    remote.fail_reads.store(true, Ordering::SeqCst);
    check_all(&s, &want);
    let mut got = [1u8; PAGE_SIZE];
    s.read_page(1000 * P, &mut got).unwrap();
    assert!(got == [0; PAGE_SIZE], "a page never written reads as zeros");
    // The node dies: its pages are gone for good, and its reads keep failing.
    remote.fail_reads.store(false, Ordering::SeqCst);
    remote.kill();
    check_all(&s, &want);
}

#[test]
fn writes_the_remote_copy_refuses_go_to_the_file_until_it_takes_them_again() {
    let remote = Flaky::new(1 << 30);
    let (_dir, s) = store(&remote, 1024);
    for i in 0..8 {
        s.write_page(i * P, &page(i * P, 1)).unwrap();
    }
    remote.fail_writes.store(true, Ordering::SeqCst);
    let mut want = HashMap::new();
    for i in 0..8 {
        want.insert(i * P, page(i * P, 2));
        s.write_page(i * P, &want[&(i * P)]).unwrap();
    }
    assert_eq!(s.file_authoritative(), 8);
    // The remote copy answers again, with the bytes it had before: the file still wins.
    remote.fail_writes.store(false, Ordering::SeqCst);
    check_all(&s, &want);
    // A write it takes makes it authoritative again.
    want.insert(0, page(0, 3));
    s.write_page(0, &want[&0]).unwrap();
    assert_eq!(s.file_authoritative(), 7);
    s.flush();
    check_all(&s, &want);
    remote.fail_reads.store(true, Ordering::SeqCst);
    check_all(&s, &want);
}

#[test]
fn a_full_queue_holds_writers_until_the_file_takes_pages() {
    let remote = Flaky::new(1 << 30);
    let (_dir, s) = store(&remote, 2);
    let s = Arc::new(s);
    let held = s.shared().file_lock.write();
    let writer = {
        let s = s.clone();
        std::thread::spawn(move || {
            for i in 0..6 {
                s.write_page(i * P, &page(i * P, 7)).unwrap();
            }
        })
    };
    until(|| s.shared().queue.waiting() == 1);
    assert_eq!(s.queued(), 2, "the queue never holds more than its bound");
    assert!(!writer.is_finished());
    drop(held);
    writer.join().unwrap();
    s.flush();
    remote.fail_reads.store(true, Ordering::SeqCst);
    check_all(&s, &(0..6).map(|i| (i * P, page(i * P, 7))).collect());
}

#[test]
fn rewrites_coalesce_to_the_latest_bytes() {
    let remote = Flaky::new(1 << 30);
    let (_dir, s) = store(&remote, 16);
    let held = s.shared().file_lock.write();
    // The drain thread may have taken the first write already; it waits on the lock.
    for v in 1..=20 {
        s.write_page(5 * P, &page(5 * P, v)).unwrap();
    }
    assert_eq!(s.queued(), 1, "one entry per address");
    remote.fail_reads.store(true, Ordering::SeqCst);
    let mut got = [0u8; PAGE_SIZE];
    s.read_page(5 * P, &mut got).unwrap();
    assert!(got == page(5 * P, 20), "the queue serves the latest bytes");
    drop(held);
    s.flush();
    s.read_page(5 * P, &mut got).unwrap();
    assert!(
        got == page(5 * P, 20),
        "the file ends with the latest bytes"
    );
}

#[test]
fn closing_drains_the_queue_and_removes_the_file() {
    let remote = Flaky::new(1 << 30);
    let (_dir, s) = store(&remote, 4096);
    let held = s.shared().file_lock.write();
    let want: HashMap<u64, Page> = (0..100).map(|i| (i * P, page(i * P, 9))).collect();
    for (&a, p) in &want {
        s.write_page(a, p).unwrap();
    }
    let path = s.path().to_path_buf();
    assert!(path.exists());
    drop(held);
    s.close().unwrap();
    assert_eq!(s.queued(), 0);
    assert!(!path.exists(), "{} is left behind", path.display());
    // The file stays open until the store goes: it holds every page.
    let mut got = [0u8; PAGE_SIZE];
    for (&a, p) in &want {
        s.shared().file.read(a, &mut got).unwrap();
        assert!(got == *p, "page {a:#x} missing from the file");
    }
    remote.kill();
    check_all(&s, &want);
    s.write_page(0, &page(0, 10)).unwrap();
    s.read_page(0, &mut got).unwrap();
    assert!(got == page(0, 10), "a write after closing is kept");
}

#[test]
fn a_page_whose_write_behind_failed_is_never_served_from_the_file() {
    let remote = Flaky::new(1 << 30);
    let (_dir, s) = store(&remote, 64);
    s.write_page(0, &page(0, 1)).unwrap();
    s.flush();
    s.shared().file.fail_writes.store(true, Ordering::SeqCst);
    s.write_page(0, &page(0, 2)).unwrap();
    s.flush();
    let mut got = [0u8; PAGE_SIZE];
    s.read_page(0, &mut got).unwrap();
    assert!(got == page(0, 2), "the remote copy still serves it");
    remote.fail_reads.store(true, Ordering::SeqCst);
    let e = s.read_page(0, &mut got).unwrap_err().to_string();
    assert!(e.contains("lacks the page's latest bytes"), "{e}");
    // A write the file takes serves it again.
    s.shared().file.fail_writes.store(false, Ordering::SeqCst);
    remote.fail_writes.store(true, Ordering::SeqCst);
    s.write_page(0, &page(0, 3)).unwrap();
    s.read_page(0, &mut got).unwrap();
    assert!(got == page(0, 3));
    // Neither copy takes a write: the write fails, saying both.
    s.shared().file.fail_writes.store(true, Ordering::SeqCst);
    let e = s.write_page(P, &page(P, 1)).unwrap_err().to_string();
    assert!(
        e.contains("backup file") && e.contains("remote copy failed"),
        "{e}"
    );
}

#[test]
fn batched_calls_stay_batched_and_caller_errors_pass_through() {
    let remote = Flaky::new(64 * P);
    let (_dir, s) = store(&remote, 1024);
    let pages: Vec<Page> = (0..8).map(|i| page(i * P, 4)).collect();
    let list: Vec<(u64, &Page)> = (0..).step_by(PAGE_SIZE).zip(pages.iter()).collect();
    s.write_list(&list).unwrap();
    s.flush();
    let mut back = vec![[0u8; PAGE_SIZE]; 8];
    s.read_pages(0, &mut back).unwrap();
    s.submit_read((0..8).map(|i| i * P).collect())
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(back, pages);
    assert_eq!(remote.lists.load(Ordering::SeqCst), 3, "one list call each");
    // An address beyond the remote store is refused, not written to the file.
    let e = s.write_page(100 * P, &page(0, 1)).unwrap_err();
    assert!(matches!(e, IoError::OutOfRange { .. }), "{e}");
    assert_eq!(s.file_authoritative(), 0);
}

#[test]
fn a_backup_file_that_cannot_be_created_says_where_and_what_to_do() {
    let remote = Flaky::new(P);
    let config = BackupConfig {
        dir: "/nonexistent/hydramem-backup-test".into(),
        queue_bytes: DEFAULT_QUEUE_BYTES,
    };
    let e = BackedStore::new(remote.clone(), &config)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("/nonexistent/hydramem-backup-test/hydramem-backup-"),
        "{e}"
    );
    assert!(e.contains("--backup-dir"), "{e}");
    let config = BackupConfig {
        queue_bytes: 100,
        ..BackupConfig::default()
    };
    let e = BackedStore::new(remote, &config).err().unwrap().to_string();
    assert!(e.contains("--backup-queue"), "{e}");
}

/// One step of the model test.
#[derive(Debug, Clone)]
enum Op {
    Write(u64, u8),
    WriteList(Vec<(u64, u8)>),
    Read(u64),
    ReadList(Vec<u64>),
    FailReads(bool),
    FailWrites(bool),
    Kill,
    Drain,
}

fn arb_op() -> impl Strategy<Value = Op> {
    let page = 0u64..24;
    prop_oneof![
        4 => (page.clone(), any::<u8>()).prop_map(|(p, v)| Op::Write(p, v)),
        2 => proptest::collection::vec((page.clone(), any::<u8>()), 1..8).prop_map(Op::WriteList),
        4 => page.clone().prop_map(Op::Read),
        2 => proptest::collection::vec(page, 1..8).prop_map(Op::ReadList),
        1 => any::<bool>().prop_map(Op::FailReads),
        1 => any::<bool>().prop_map(Op::FailWrites),
        1 => Just(Op::Kill),
        1 => Just(Op::Drain),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Whatever the remote copy does — fail reads, fail writes and come back stale, lose
    /// every page — every acknowledged write reads back exactly, through a queue small enough
    /// to fill.
    #[test]
    fn every_acknowledged_write_reads_back(ops in proptest::collection::vec(arb_op(), 1..60)) {
        let remote = Flaky::new(1 << 20);
        let (_dir, s) = store(&remote, 3);
        let mut model: HashMap<u64, Page> = HashMap::new();
        let mut got = [0u8; PAGE_SIZE];
        for op in ops {
            match op {
                Op::Write(p, v) => {
                    s.write_page(p * P, &page(p * P, v)).unwrap();
                    model.insert(p * P, page(p * P, v));
                }
                Op::WriteList(l) => {
                    let pages: Vec<(u64, Page)> = l.iter().map(|&(p, v)| (p * P, page(p * P, v))).collect();
                    let list: Vec<(u64, &Page)> = pages.iter().map(|(a, pg)| (*a, pg)).collect();
                    s.write_list(&list).unwrap();
                    model.extend(pages);
                }
                Op::Read(p) => {
                    s.read_page(p * P, &mut got).unwrap();
                    let want = model.get(&(p * P)).copied().unwrap_or([0; PAGE_SIZE]);
                    prop_assert!(got == want, "page {}", p);
                }
                Op::ReadList(l) => {
                    let addrs: Vec<u64> = l.iter().map(|p| p * P).collect();
                    let pages = s.submit_read(addrs.clone()).unwrap().wait().unwrap();
                    for (a, pg) in addrs.iter().zip(pages.iter()) {
                        let want = model.get(a).copied().unwrap_or([0; PAGE_SIZE]);
                        prop_assert!(*pg == want, "page {:#x}", a);
                    }
                }
                Op::FailReads(on) => remote.fail_reads.store(on, Ordering::SeqCst),
                Op::FailWrites(on) => remote.fail_writes.store(on, Ordering::SeqCst),
                Op::Kill => remote.kill(),
                Op::Drain => s.flush(),
            }
        }
        remote.fail_reads.store(true, Ordering::SeqCst);
        check_all(&s, &model);
    }
}
