//! The backup file: one sparse local file per store, page `addr` at byte offset `addr`,
//! created under a name no other process uses (`hydramem-backup-<pid>-<n>-<nanos>`) and
//! removed when the store closes. A range never written reads as zeros (a hole, or past the
//! end of the file). The file is a copy against losing the remote copy's node, not against
//! losing this process: it is never synced, and it goes with the process.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::BackupError;
use crate::client::Page;

/// Files this process has created, for unique names.
static CREATED: AtomicU64 = AtomicU64::new(0);

/// Whether `file` lies on a file system held in RAM (tmpfs, ramfs); `false` when unsure.
fn in_memory(file: &File) -> bool {
    use std::os::fd::AsRawFd;
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    // SAFETY: fstatfs writes one `statfs` to the pointer, which points to a zeroed value of
    // that type owned by this frame; the descriptor is `file`'s, open for this whole call.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } != 0 {
        return false;
    }
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between architectures
    let kind = st.f_type as i64;
    kind == TMPFS_MAGIC || kind == RAMFS_MAGIC
}

/// An open backup file.
pub(super) struct BackupFile {
    file: File,
    path: PathBuf,
    /// Writes fail with an injected error while set (tests of a failing disk).
    #[cfg(test)]
    pub(super) fail_writes: std::sync::atomic::AtomicBool,
}

impl BackupFile {
    /// Creates a new, empty file in `dir` (readable and writable by this user only).
    pub(super) fn create(dir: &Path) -> Result<BackupFile, BackupError> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let n = CREATED.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!(
            "hydramem-backup-{}-{n}-{nanos:09}",
            std::process::id()
        ));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| BackupError::Create {
                path: path.clone(),
                source,
            })?;
        if in_memory(&file) {
            tracing::warn!(
                dir = %dir.display(),
                "the backup directory is on tmpfs or ramfs: the backup copies take this \
                 machine's RAM, which remote memory is meant to spare; pass --backup-dir on a \
                 local disk"
            );
        }
        Ok(BackupFile {
            file,
            path,
            #[cfg(test)]
            fail_writes: Default::default(),
        })
    }

    /// Its path.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the page at `addr`; what lies past the end of the file reads as zeros.
    pub(super) fn read(&self, addr: u64, page: &mut Page) -> io::Result<()> {
        let mut done = 0;
        while done < page.len() {
            match self.file.read_at(&mut page[done..], addr + done as u64) {
                Ok(0) => {
                    page[done..].fill(0);
                    return Ok(());
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Writes the page at `addr`.
    pub(super) fn write(&self, addr: u64, page: &Page) -> io::Result<()> {
        #[cfg(test)]
        if self.fail_writes.load(Ordering::SeqCst) {
            return Err(io::Error::other("injected write failure"));
        }
        self.file.write_all_at(page, addr)
    }

    /// Removes the file (its blocks are freed once it is closed).
    pub(super) fn remove(&self) -> Result<(), BackupError> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(BackupError::Remove {
                path: self.path.clone(),
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_on_tmpfs_is_seen_as_in_memory() {
        // /dev/shm is tmpfs on every Linux this runs on.
        let f = tempfile::tempfile_in("/dev/shm").expect("a file in /dev/shm");
        assert!(in_memory(&f));
    }
}
