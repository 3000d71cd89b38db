//! [`BackedStore`]: a page store over a remote one, with a write-behind copy of every page in
//! a local file and a fallback to it (the design and its invariants are in the module doc of
//! [`crate::backup`]).
//!
//! Locks, always taken in this order and never held across a remote call: `file_lock`, the
//! file-authoritative set, the queue's own lock. The file's writers — the drain thread, one
//! page at a time, and fallback writes — hold `file_lock` exclusively and its readers shared,
//! so a read never sees half a page, and the drainer checks under it that the bytes it copied
//! are still the queued ones: a fallback write that came after it copied them cannot be
//! overwritten with them.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Mutex, RwLock};

use super::file::BackupFile;
use super::queue::{Queue, Queued};
use super::{BackupConfig, BackupError};
use crate::client::{IoError, Page};
use crate::nbd::export::{PageStore, PendingPages, Ready};
use crate::PAGE_SIZE;

/// Pages the drainer takes per look at the queue.
const DRAIN_BATCH: usize = 256;

/// What the store and its drain thread share.
pub(super) struct Shared {
    pub(super) queue: Queue,
    pub(super) file: BackupFile,
    /// Exclusive for the file's writers, shared for its readers (see the module doc).
    pub(super) file_lock: RwLock<()>,
    /// Pages whose remote write failed: the file holds their latest bytes.
    file_auth: RwLock<HashSet<u64>>,
    /// Pages whose latest bytes could not be written behind, with the error.
    stale: Mutex<HashMap<u64, String>>,
    /// Where a fallback was logged already ("node 3"): one warning per node.
    warned: Mutex<HashSet<String>>,
    /// Whether a failed write-behind was logged already.
    drain_failed: AtomicBool,
}

impl Shared {
    /// The file now holds the latest bytes of `addr`: counted, and no longer stale.
    fn in_file(&self, addr: u64) {
        metrics::counter!("hydramem_backup_written_bytes_total").increment(PAGE_SIZE as u64);
        let mut stale = self.stale.lock();
        if !stale.is_empty() {
            stale.remove(&addr);
        }
    }
}

/// A [`PageStore`] with a write-behind backup file (see [`crate::backup`]).
pub struct BackedStore {
    inner: Arc<dyn PageStore>,
    shared: Arc<Shared>,
    drainer: Mutex<Option<JoinHandle<()>>>,
}

/// Whether a failed remote call is the caller's to handle, which the file must not paper
/// over: its mistake (an address no store takes), or a submission the remote store did not
/// start or finish because that would have meant waiting for a slot (the caller reads those
/// pages again with a call that may wait; the remote memory did not fail).
fn callers(e: &IoError) -> bool {
    matches!(
        e,
        IoError::Unaligned { .. }
            | IoError::OutOfRange { .. }
            | IoError::NoSlot { .. }
            | IoError::SubmissionTooLarge { .. }
            | IoError::Again { .. }
    )
}

impl BackedStore {
    /// A store over `inner` whose backup file is created in `config.dir`; starts the drain
    /// thread.
    pub fn new(
        inner: Arc<dyn PageStore>,
        config: &BackupConfig,
    ) -> Result<BackedStore, BackupError> {
        let bad = |reason| BackupError::Queue {
            bytes: config.queue_bytes,
            reason,
        };
        let pages = config.queue_bytes / PAGE_SIZE as u64;
        if pages == 0 {
            return Err(bad("it holds less than one 4 KiB page"));
        }
        let pages = usize::try_from(pages).map_err(|_| bad("this machine cannot address it"))?;
        let file = BackupFile::create(&config.dir)?;
        let shared = Arc::new(Shared {
            queue: Queue::new(pages),
            file,
            file_lock: RwLock::new(()),
            file_auth: RwLock::new(HashSet::new()),
            stale: Mutex::new(HashMap::new()),
            warned: Mutex::new(HashSet::new()),
            drain_failed: AtomicBool::new(false),
        });
        let s = shared.clone();
        let drainer = std::thread::Builder::new()
            .name("hm-backup".into())
            .spawn(move || drain(&s));
        let drainer = match drainer {
            Ok(h) => h,
            Err(e) => {
                shared.file.remove().ok();
                return Err(BackupError::Thread(e));
            }
        };
        tracing::info!(file = %shared.file.path().display(), queue_pages = pages, "backup file created");
        Ok(BackedStore {
            inner,
            shared,
            drainer: Mutex::new(Some(drainer)),
        })
    }

    /// The backup file's path.
    pub fn path(&self) -> &std::path::Path {
        self.shared.file.path()
    }

    /// Pages waiting to be written to the file.
    pub fn queued(&self) -> usize {
        self.shared.queue.len()
    }

    /// Pages whose latest bytes are in the file only (their remote write failed).
    pub fn file_authoritative(&self) -> usize {
        self.shared.file_auth.read().len()
    }

    /// Waits until every page queued so far is in the file.
    pub fn flush(&self) {
        self.shared.queue.wait_empty();
    }

    /// Writes what is queued to the file, stops the drain thread and removes the file. The
    /// store still serves afterwards (from the open file and the remote copy; writes go to
    /// the file at once), but nothing is left on disk once it is dropped.
    pub fn close(&self) -> Result<(), BackupError> {
        self.shared.queue.close();
        if let Some(h) = self.drainer.lock().take() {
            if h.join().is_err() {
                return Err(BackupError::Drainer {
                    path: self.path().into(),
                });
            }
        }
        self.shared.file.remove()
    }

    #[cfg(test)]
    pub(super) fn shared(&self) -> &Shared {
        &self.shared
    }
}

impl Drop for BackedStore {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::error!(error = %e, "closing the backup store");
        }
    }
}

/// The drain thread: writes queued pages to the file until the queue is closed and empty.
fn drain(shared: &Shared) {
    while let Some(batch) = shared.queue.next_batch(DRAIN_BATCH) {
        for (addr, seq, bytes) in batch {
            drain_one(shared, (addr, seq, bytes));
        }
    }
}

fn drain_one(shared: &Shared, (addr, seq, bytes): Queued) {
    let _writer = shared.file_lock.write();
    if shared.queue.seq_of(addr) != Some(seq) {
        // Rewritten since (the next batch has the newer bytes), or written to the file by a
        // fallback write, which removed it: these bytes would be older.
        return;
    }
    match shared.file.write(addr, &bytes) {
        Ok(()) => shared.in_file(addr),
        Err(e) => {
            metrics::counter!("hydramem_backup_write_errors_total").increment(1);
            if !shared.drain_failed.swap(true, Ordering::Relaxed) {
                tracing::error!(file = %shared.file.path().display(), addr, error = %e,
                    "cannot write a page behind to the backup file; pages whose write-behind fails are served from the remote copy only (logged once)");
            }
            shared.stale.lock().insert(addr, e.to_string());
        }
    }
    // Either way the entry goes: the remote copy holds the bytes, and the file is known to
    // lack them (`stale`), so a queue that cannot drain does not stop every writer.
    shared.queue.remove_if(addr, seq);
}

impl BackedStore {
    /// Ends a write of `list` whose remote part returned `remote`.
    fn written(&self, list: &[(u64, &Page)], remote: Result<(), IoError>) -> Result<(), IoError> {
        match remote {
            Ok(()) => {
                if !self.shared.queue.push(list.iter().copied()) {
                    // Closed: nothing drains any more, so the file gets the pages now.
                    return self.write_file(list, None);
                }
                if !self.shared.file_auth.read().is_empty() {
                    let mut auth = self.shared.file_auth.write();
                    for (addr, _) in list {
                        auth.remove(addr);
                    }
                }
                Ok(())
            }
            Err(e) if callers(&e) => Err(e),
            Err(e) => {
                self.warn_once(list.first().map_or(0, |(a, _)| *a), &e);
                metrics::counter!("hydramem_backup_fallback_writes_total")
                    .increment(list.len() as u64);
                self.write_file(list, Some(&e))
            }
        }
    }

    /// Writes `list` to the file now; its pages become file-authoritative. `remote` is how
    /// their remote write failed.
    fn write_file(&self, list: &[(u64, &Page)], remote: Option<&IoError>) -> Result<(), IoError> {
        let sh = &self.shared;
        let _writer = sh.file_lock.write();
        for &(addr, page) in list {
            sh.file
                .write(addr, page)
                .map_err(|source| BackupError::File {
                    what: "write",
                    addr,
                    path: self.path().into(),
                    source,
                    remote: remote.map(|e| e.to_string()),
                })?;
            sh.in_file(addr);
            sh.file_auth.write().insert(addr);
            sh.queue.remove(addr);
        }
        Ok(())
    }

    /// Reads `addr` from the file.
    fn read_file(
        &self,
        addr: u64,
        page: &mut Page,
        remote: Option<&IoError>,
    ) -> Result<(), IoError> {
        let _reader = self.shared.file_lock.read();
        self.shared.file.read(addr, page).map_err(|source| {
            BackupError::File {
                what: "read",
                addr,
                path: self.path().into(),
                source,
                remote: remote.map(|e| e.to_string()),
            }
            .into()
        })
    }

    /// Serves `addr` from the queue, or from the file if it is authoritative for it: `true`;
    /// `false` when the remote copy is the one to read.
    fn read_local(&self, addr: u64, page: &mut Page) -> Result<bool, IoError> {
        if self.shared.queue.get(addr, page) {
            return Ok(true);
        }
        if self.shared.file_auth.read().contains(&addr) {
            self.read_file(addr, page, None)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Serves `addr` after its remote read failed with `remote`: from the queue (written
    /// meanwhile), else from the file, which holds its latest acknowledged bytes unless their
    /// write-behind failed.
    fn read_fallback(&self, addr: u64, page: &mut Page, remote: &IoError) -> Result<(), IoError> {
        if self.shared.queue.get(addr, page) {
            return Ok(());
        }
        if let Some(why) = self.shared.stale.lock().get(&addr) {
            return Err(BackupError::Stale {
                addr,
                path: self.path().into(),
                remote: remote.to_string(),
                why: why.clone(),
            }
            .into());
        }
        self.read_file(addr, page, Some(remote))?;
        metrics::counter!("hydramem_backup_fallback_reads_total").increment(1);
        Ok(())
    }

    /// Logs the first fallback of each location (node) the remote store names.
    fn warn_once(&self, addr: u64, e: &IoError) {
        let at = self
            .inner
            .location(addr)
            .unwrap_or_else(|| "the remote memory".into());
        if self.shared.warned.lock().insert(at.clone()) {
            tracing::warn!(location = %at, file = %self.path().display(), error = %e,
                "the remote copy failed: reads and writes of its pages fall back to the backup file (logged once per node)");
        }
    }

    /// Reads the pages of `list` that are not local from the remote copy in one call, and
    /// from the file if that fails.
    fn read_remote(&self, remote: &mut [(u64, &mut Page)]) -> Result<(), IoError> {
        if remote.is_empty() {
            return Ok(());
        }
        match self.inner.read_list(remote) {
            Ok(()) => Ok(()),
            Err(e) if callers(&e) => Err(e),
            Err(e) => {
                self.warn_once(remote[0].0, &e);
                remote
                    .iter_mut()
                    .try_for_each(|(addr, page)| self.read_fallback(*addr, page, &e))
            }
        }
    }
}

impl PageStore for BackedStore {
    fn read_page(&self, addr: u64, page: &mut Page) -> Result<(), IoError> {
        if self.read_local(addr, page)? {
            return Ok(());
        }
        self.read_remote(&mut [(addr, page)])
    }
    fn write_page(&self, addr: u64, page: &Page) -> Result<(), IoError> {
        self.written(&[(addr, page)], self.inner.write_page(addr, page))
    }
    fn read_pages(&self, addr: u64, pages: &mut [Page]) -> Result<(), IoError> {
        let mut list: Vec<(u64, &mut Page)> = (addr..).step_by(PAGE_SIZE).zip(pages).collect();
        self.read_list(&mut list)
    }
    fn write_pages(&self, addr: u64, pages: &[Page]) -> Result<(), IoError> {
        let list: Vec<(u64, &Page)> = (addr..).step_by(PAGE_SIZE).zip(pages).collect();
        self.written(&list, self.inner.write_pages(addr, pages))
    }
    fn read_list(&self, list: &mut [(u64, &mut Page)]) -> Result<(), IoError> {
        let mut remote: Vec<(u64, &mut Page)> = Vec::with_capacity(list.len());
        for (addr, page) in list.iter_mut() {
            if !self.read_local(*addr, page)? {
                remote.push((*addr, &mut **page));
            }
        }
        self.read_remote(&mut remote)
    }
    fn write_list(&self, list: &[(u64, &Page)]) -> Result<(), IoError> {
        self.written(list, self.inner.write_list(list))
    }
    fn submit_read<'s>(&'s self, addrs: Vec<u64>) -> Result<Box<dyn PendingPages + 's>, IoError> {
        let mut pages = vec![[0u8; PAGE_SIZE]; addrs.len()].into_boxed_slice();
        let mut remote = Vec::new();
        for (i, (&addr, page)) in addrs.iter().zip(pages.iter_mut()).enumerate() {
            if !self.read_local(addr, page)? {
                remote.push(i);
            }
        }
        if remote.is_empty() {
            return Ok(Box::new(Ready(pages)));
        }
        let wanted: Vec<u64> = remote.iter().map(|&i| addrs[i]).collect();
        let pending = match self.inner.submit_read(wanted) {
            Ok(p) => Some(p),
            Err(e) if callers(&e) => return Err(e),
            Err(e) => {
                self.fallback_all(&addrs, &mut pages, &remote, &e)?;
                None
            }
        };
        Ok(Box::new(Submitted {
            store: self,
            addrs,
            pages,
            remote,
            pending,
        }))
    }
    fn known_zero(&self, addr: u64) -> bool {
        self.inner.known_zero(addr)
            && self.shared.queue.seq_of(addr).is_none()
            && !self.shared.file_auth.read().contains(&addr)
    }
    fn location(&self, addr: u64) -> Option<String> {
        self.inner.location(addr)
    }
}

impl BackedStore {
    /// Reads the pages `remote` (indices into `addrs` and `pages`) from the file after their
    /// remote read failed with `e`.
    fn fallback_all(
        &self,
        addrs: &[u64],
        pages: &mut [Page],
        remote: &[usize],
        e: &IoError,
    ) -> Result<(), IoError> {
        if let Some(&i) = remote.first() {
            self.warn_once(addrs[i], e);
        }
        remote
            .iter()
            .try_for_each(|&i| self.read_fallback(addrs[i], &mut pages[i], e))
    }
}

/// Reads started by [`BackedStore::submit_read`]: the local pages already read, the others in
/// flight on the remote store (`None`: already read from the file).
struct Submitted<'s> {
    store: &'s BackedStore,
    addrs: Vec<u64>,
    pages: Box<[Page]>,
    /// Indices of the pages asked from the remote store, in its order.
    remote: Vec<usize>,
    pending: Option<Box<dyn PendingPages + 's>>,
}

impl PendingPages for Submitted<'_> {
    fn wait(self: Box<Self>) -> Result<Box<[Page]>, IoError> {
        let Submitted {
            store,
            addrs,
            mut pages,
            remote,
            pending,
        } = *self;
        let Some(pending) = pending else {
            return Ok(pages);
        };
        match pending.wait() {
            Ok(got) => {
                for (&i, page) in remote.iter().zip(got.iter()) {
                    pages[i] = *page;
                }
            }
            Err(e) if callers(&e) => return Err(e),
            Err(e) => store.fallback_all(&addrs, &mut pages, &remote, &e)?,
        }
        Ok(pages)
    }
}
