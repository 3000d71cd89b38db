//! The SSD-backup scheme (`ssd-backup`), the Infiniswap baseline of the Hydra paper: one
//! remote copy of every page plus an asynchronous write-behind copy in a local file.
//!
//! [`BackedStore`] is a [`PageStore`](crate::nbd::PageStore) over another (a client of the `single` scheme). A write
//! is acknowledged once the remote copy is; the page is then queued (`queue`: the latest
//! bytes per address, bounded, a writer waits while it is full) for a background thread that
//! writes it at its address in a sparse local file (`file`). A write the remote copy refuses
//! (its node gone, out of capacity, ...) goes to the file at once, and the page is marked
//! file-authoritative until a later remote write succeeds. A read takes the queued bytes if
//! any, then the file if it is authoritative, else the remote copy, and the file when the
//! remote read fails. Invariants:
//!
//! - an acknowledged write is in the queue, or in the file, or both, as long as the store is
//!   open: an address leaves the queue only once the file holds bytes at least as new;
//! - so a read that falls back to the file returns the latest acknowledged bytes, and a page
//!   never written reads as zeros (a hole in the file);
//! - a page whose write-behind failed (the disk) is never served from the file: a read that
//!   would need it fails and says why, never returning older bytes.
//!
//! [`StoreScheme`] is where `ssd-backup` is named beside the client's resilience schemes, for
//! every front end that parses a scheme (`nbd`, `mount`, `bench`), and [`FrontStore`] is the
//! store such a front end reads and writes through.

use std::path::PathBuf;

use crate::client::IoError;

mod file;
mod queue;
mod scheme;
mod store;
#[cfg(test)]
mod tests;

pub use scheme::{FrontStore, StoreScheme, StoreSchemeError, SSD_BACKUP};
pub use store::BackedStore;

/// Where the backup file goes and how far writing it may lag behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupConfig {
    /// Directory of the backup file: a local disk with room for the pages written (not a
    /// tmpfs, which would hold the copy in the memory it is meant to spare).
    pub dir: PathBuf,
    /// Bytes of pages the write-behind queue may hold before writers wait (whole pages).
    pub queue_bytes: u64,
}

/// The backup file's default directory: local disk on common Linux systems (`/tmp` is often
/// a tmpfs).
pub const DEFAULT_DIR: &str = "/var/tmp";

/// The write-behind queue's default bound.
pub const DEFAULT_QUEUE_BYTES: u64 = 64 << 20;

impl Default for BackupConfig {
    fn default() -> BackupConfig {
        BackupConfig {
            dir: PathBuf::from(DEFAULT_DIR),
            queue_bytes: DEFAULT_QUEUE_BYTES,
        }
    }
}

/// Why the backup store could not start, or could not serve a page from its file.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The span store could not open: its configuration was refused, or a client that
    /// reattached to its identity could not rebuild its page map from the memory nodes.
    #[error("cannot open the span store: {0}")]
    SpanMap(crate::client::IoError),
    /// The file could not be created.
    #[error("cannot create the backup file {}: {source}; pass --backup-dir on a local disk with room", path.display())]
    Create {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The queue bound holds no page, or more than this machine can address.
    #[error("a write-behind queue of {bytes} bytes is not usable: {reason}; give --backup-queue a size such as 64MiB")]
    Queue {
        /// The bound given.
        bytes: u64,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The write-behind thread could not start.
    #[error("cannot start the backup file's write-behind thread: {0}; the system is out of threads or memory")]
    Thread(std::io::Error),
    /// A read or write of the file failed.
    #[error("{what} of page {addr:#x} in the backup file {} failed: {source}{}; free room on that disk, or pass --backup-dir on a healthy local disk", path.display(), remote_too(remote))]
    File {
        /// "read" or "write".
        what: &'static str,
        /// The page.
        addr: u64,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
        /// How the remote copy failed, when the file was the fallback.
        remote: Option<String>,
    },
    /// The remote copy failed and the file lacks the page's latest bytes.
    #[error("read of page {addr:#x} failed: the remote copy failed ({remote}) and the backup file {} lacks the page's latest bytes, whose write-behind failed ({why}); the page cannot be served until it is written again: check the disk of the backup file", path.display())]
    Stale {
        /// The page.
        addr: u64,
        /// The file.
        path: PathBuf,
        /// How the remote copy failed.
        remote: String,
        /// How the write-behind failed.
        why: String,
    },
    /// The write-behind thread ended abnormally.
    #[error("the write-behind thread of the backup file {} panicked: pages queued for it may be missing from it", path.display())]
    Drainer {
        /// The file.
        path: PathBuf,
    },
    /// The file could not be removed when the store closed.
    #[error("cannot remove the backup file {} at exit: {source}; remove it by hand", path.display())]
    Remove {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

fn remote_too(remote: &Option<String>) -> String {
    remote.as_ref().map_or(String::new(), |r| {
        format!(" (and the remote copy failed: {r})")
    })
}

impl From<BackupError> for IoError {
    fn from(e: BackupError) -> IoError {
        IoError::Store(Box::new(e))
    }
}
