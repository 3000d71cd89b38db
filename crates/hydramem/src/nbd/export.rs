//! The export: a byte-addressed block device of `size` bytes over whole remote pages.
//!
//! NBD addresses bytes (the advertised minimum block size is 1); the remote memory reads and
//! writes whole 4 KiB pages, each acknowledged under the client's resilience mode before
//! `write_page` returns. [`Export`] maps one onto the other:
//!
//! - a read of any range reads each page it touches, straight into the reply buffer when the
//!   page is covered whole, through a page-sized bounce buffer otherwise;
//! - a write covering a whole page writes it directly; a write of part of a page reads the
//!   page, patches it and writes it back (read-modify-write), holding the page's stripe of
//!   [`PageLocks`] throughout, so that a concurrent write to another part of the same page —
//!   from any connection — is never lost;
//! - zeroing (TRIM, WRITE_ZEROES) writes zero pages the same way. A page of an address range
//!   that was never written already reads as zeros and is skipped, so discarding a fresh
//!   device (mkfs does) costs no remote traffic. The client has no way to release single
//!   pages (slabs belong to whole address ranges), so zeroing is how remote pages are
//!   "released": their contents are gone, their memory stays with the range.
//!
//! [`MemStore`] keeps the pages in process memory instead: an export with no cluster behind it,
//! for the tests and fuzz targets of the NBD server.
//!
//! Invariants: nothing is written outside `[0, size)` (callers check with [`Export::check`]);
//! when a write returns `Ok`, every page it touched is acknowledged remotely, so FLUSH and FUA
//! have nothing left to do and every connection sees the data at once (multi-conn safe).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::page_locks::PageLocks;
use crate::client::{IoError, Page, RemoteMemory};
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;

/// What an export stores its pages in: the remote memory, or an in-memory stand-in in tests.
pub trait PageStore: Send + Sync {
    /// Reads the page at `addr` (a multiple of 4096).
    fn read_page(&self, addr: u64, page: &mut Page) -> Result<(), IoError>;
    /// Writes the page at `addr`; returns once it is acknowledged under the resilience mode.
    fn write_page(&self, addr: u64, page: &Page) -> Result<(), IoError>;
    /// Whether the page at `addr` certainly reads as zeros without being asked (never
    /// written); `false` when unsure.
    fn known_zero(&self, _addr: u64) -> bool {
        false
    }
}

impl PageStore for RemoteMemory {
    fn read_page(&self, addr: u64, page: &mut Page) -> Result<(), IoError> {
        RemoteMemory::read_page(self, addr, page)
    }
    fn write_page(&self, addr: u64, page: &Page) -> Result<(), IoError> {
        RemoteMemory::write_page(self, addr, page)
    }
    fn known_zero(&self, addr: u64) -> bool {
        // An address range is mapped on its first write; until then it reads as zeros.
        self.group_of(addr).is_none()
    }
}

/// Why a request on the export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The request reaches beyond the end of the export.
    #[error("{len} bytes at offset {offset} reach beyond the end of the {size}-byte export")]
    OutOfRange {
        /// Request offset.
        offset: u64,
        /// Request length.
        len: u64,
        /// Export size.
        size: u64,
    },
    /// The remote memory failed a page operation.
    #[error(transparent)]
    Io(#[from] IoError),
}

/// A block device of `size` bytes over a page store.
pub struct Export {
    store: Arc<dyn PageStore>,
    size: u64,
    locks: PageLocks,
}

/// The part of page `page_addr` that the byte range `[offset, end)` covers: (start within
/// the page, length).
fn piece(page_addr: u64, offset: u64, end: u64) -> (usize, usize) {
    let from = offset.max(page_addr);
    let to = end.min(page_addr + PAGE);
    ((from - page_addr) as usize, (to - from) as usize)
}

/// Page addresses touched by `[offset, offset + len)`, `len > 0`.
fn pages(offset: u64, len: u64) -> impl Iterator<Item = u64> {
    let first = offset / PAGE * PAGE;
    let end = offset + len;
    (first..end).step_by(PAGE_SIZE)
}

impl Export {
    /// An export of `size` bytes; the store must hold at least `size` rounded up to pages.
    pub fn new(store: Arc<dyn PageStore>, size: u64) -> Export {
        Export {
            store,
            size,
            locks: PageLocks::new(),
        }
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Checks that `[offset, offset + len)` lies inside the export.
    pub fn check(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(ExportError::OutOfRange {
                offset,
                len,
                size: self.size,
            }),
        }
    }

    /// Reads `buf.len()` bytes at `offset`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.check(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        let end = offset + buf.len() as u64;
        let mut bounce = [0u8; PAGE_SIZE];
        for p in pages(offset, buf.len() as u64) {
            let (at, n) = piece(p, offset, end);
            let dst = &mut buf[(p + at as u64 - offset) as usize..][..n];
            match <&mut Page>::try_from(dst) {
                Ok(whole) => self.store.read_page(p, whole)?,
                Err(_) => {
                    self.store.read_page(p, &mut bounce)?;
                    buf[(p + at as u64 - offset) as usize..][..n]
                        .copy_from_slice(&bounce[at..at + n]);
                }
            }
        }
        Ok(())
    }

    /// Writes `data` at `offset`; returns once every page touched is acknowledged.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), ExportError> {
        self.check(offset, data.len() as u64)?;
        let fill = |p: u64, at: usize, n: usize, page: &mut Page| {
            page[at..at + n].copy_from_slice(&data[(p + at as u64 - offset) as usize..][..n]);
        };
        self.apply(offset, data.len() as u64, |_| false, fill)
    }

    /// Makes `len` bytes at `offset` read as zeros; returns once every page touched is
    /// acknowledged. Pages that were never written are skipped (they read as zeros).
    pub fn zero(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.check(offset, len)?;
        let skip = |p: u64| self.store.known_zero(p);
        let fill = |_: u64, at: usize, n: usize, page: &mut Page| page[at..at + n].fill(0);
        self.apply(offset, len, skip, fill)
    }

    /// For every page touched by `[offset, offset + len)`, under that page's lock: unless
    /// `skip(page_addr)`, read the page (only when the range covers part of it), let
    /// `fill(page_addr, at, n, page)` set bytes `[at, at + n)`, and write the page back.
    fn apply(
        &self,
        offset: u64,
        len: u64,
        skip: impl Fn(u64) -> bool,
        mut fill: impl FnMut(u64, usize, usize, &mut Page),
    ) -> Result<(), ExportError> {
        if len == 0 {
            return Ok(());
        }
        let end = offset + len;
        let mut page = [0u8; PAGE_SIZE];
        for p in pages(offset, len) {
            let (at, n) = piece(p, offset, end);
            let _guard = self.locks.lock(p / PAGE);
            if skip(p) {
                continue;
            }
            if n < PAGE_SIZE {
                self.store.read_page(p, &mut page)?;
            }
            fill(p, at, n, &mut page);
            self.store.write_page(p, &page)?;
        }
        Ok(())
    }
}

/// Pages in process memory: an export that needs no cluster, for tests, fuzzing and trying
/// the NBD server out. Every page reads as zeros until written; `pause` sleeps inside every
/// read (zero for none) to widen the window in which an unlocked read-modify-write would lose
/// a concurrent write. Addresses are those [`Export`] passes: multiples of 4096 below the
/// size given to [`MemStore::new`] rounded up to pages.
pub struct MemStore {
    bytes: Mutex<Vec<u8>>,
    written: Mutex<Vec<bool>>,
    writes: AtomicU64,
    pause: Duration,
}

impl MemStore {
    /// A store of `size` bytes rounded up to whole pages, all zero.
    ///
    /// # Panics
    /// If `size` does not fit the address space (the store is allocated whole).
    pub fn new(size: u64, pause: Duration) -> Arc<MemStore> {
        let pages = usize::try_from(size.div_ceil(PAGE)).expect("MemStore size fits in memory");
        Arc::new(MemStore {
            bytes: Mutex::new(vec![0; pages * PAGE_SIZE]),
            written: Mutex::new(vec![false; pages]),
            writes: AtomicU64::new(0),
            pause,
        })
    }

    /// Pages written so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }
}

impl PageStore for MemStore {
    fn read_page(&self, addr: u64, page: &mut Page) -> Result<(), IoError> {
        page.copy_from_slice(&self.bytes.lock()[addr as usize..][..PAGE_SIZE]);
        if !self.pause.is_zero() {
            std::thread::sleep(self.pause);
        }
        Ok(())
    }
    fn write_page(&self, addr: u64, page: &Page) -> Result<(), IoError> {
        self.bytes.lock()[addr as usize..][..PAGE_SIZE].copy_from_slice(page);
        self.written.lock()[(addr / PAGE) as usize] = true;
        self.writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn known_zero(&self, addr: u64) -> bool {
        !self.written.lock()[(addr / PAGE) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn out_of_range_is_refused_without_writing() {
        let store = MemStore::new(10_000, Default::default());
        let e = Export::new(store.clone(), 10_000);
        assert!(e.write(9_999, &[1]).is_ok());
        assert!(matches!(
            e.write(9_999, &[1, 2]),
            Err(ExportError::OutOfRange { .. })
        ));
        assert!(e.read(u64::MAX, &mut [0]).is_err());
        assert!(e.zero(10_000, 1).is_err());
        assert!(e.zero(10_000, 0).is_ok());
        assert_eq!(store.writes(), 1);
    }

    #[test]
    fn zeroing_skips_pages_never_written() {
        let store = MemStore::new(1 << 20, Default::default());
        let e = Export::new(store.clone(), 1 << 20);
        e.zero(0, 1 << 20).unwrap();
        assert_eq!(store.writes(), 0);
        e.write(5000, &[9; 10]).unwrap();
        e.zero(0, 1 << 20).unwrap();
        assert_eq!(store.writes(), 2);
        let mut b = [1u8; 20];
        e.read(4995, &mut b).unwrap();
        assert_eq!(b, [0; 20]);
    }

    #[test]
    fn concurrent_writes_to_two_halves_of_a_page_both_survive() {
        // Without the page lock both writers read the old page during the pause and the
        // second write-back erases the first half.
        let store = MemStore::new(4 * PAGE, Duration::from_millis(2));
        let e = Arc::new(Export::new(store, 4 * PAGE));
        for round in 0..20u8 {
            let hs: Vec<_> = [0usize, 2048]
                .into_iter()
                .map(|half| {
                    let e = e.clone();
                    std::thread::spawn(move || {
                        let v = if half == 0 { round } else { round + 100 };
                        e.write(PAGE + half as u64, &[v; 2048]).unwrap()
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            let mut page = vec![0u8; PAGE_SIZE];
            e.read(PAGE, &mut page).unwrap();
            assert!(page[..2048].iter().all(|&b| b == round), "round {round}");
            assert!(
                page[2048..].iter().all(|&b| b == round + 100),
                "round {round}"
            );
        }
    }

    /// One operation of the model test.
    #[derive(Debug, Clone)]
    enum Op {
        Write(u64, Vec<u8>),
        Zero(u64, u64),
        Read(u64, usize),
    }

    fn arb_op(size: u64) -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..size, proptest::collection::vec(any::<u8>(), 0..9000))
                .prop_map(|(o, d)| Op::Write(o, d)),
            (0..size, 0u64..9000).prop_map(|(o, l)| Op::Zero(o, l)),
            (0..size, 0usize..9000).prop_map(|(o, l)| Op::Read(o, l)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Any sequence of unaligned writes, zeroings and reads behaves like a byte array of
        /// the export's size; requests reaching beyond it fail and change nothing.
        #[test]
        fn behaves_like_a_byte_array(ops in proptest::collection::vec(arb_op(40_000), 1..40)) {
            let size = 37_123u64;
            let e = Export::new(MemStore::new(size, Default::default()), size);
            let mut model = vec![0u8; size as usize];
            for op in ops {
                match op {
                    Op::Write(o, d) => {
                        let fits = o + d.len() as u64 <= size;
                        prop_assert_eq!(e.write(o, &d).is_ok(), fits);
                        if fits {
                            model[o as usize..][..d.len()].copy_from_slice(&d);
                        }
                    }
                    Op::Zero(o, l) => {
                        let fits = o + l <= size;
                        prop_assert_eq!(e.zero(o, l).is_ok(), fits);
                        if fits {
                            model[o as usize..][..l as usize].fill(0);
                        }
                    }
                    Op::Read(o, l) => {
                        let mut b = vec![0xAA; l];
                        let fits = o + l as u64 <= size;
                        prop_assert_eq!(e.read(o, &mut b).is_ok(), fits);
                        if fits {
                            prop_assert_eq!(&b[..], &model[o as usize..][..l]);
                        }
                    }
                }
            }
            let mut all = vec![0u8; size as usize];
            e.read(0, &mut all).unwrap();
            prop_assert_eq!(all, model);
        }
    }
}
