//! The scheme a front end (`nbd`, `mount`, `bench`) stores its pages under: the client's own
//! resilience ([`Resilience`]: `hydra-8+2-d1`, `rep2`, `single`, ...) or `ssd-backup`, which
//! is a `single` client with a local backup file around it ([`BackedStore`]). The redundancy
//! of the client stays [`Resilience`]'s; the file is the front end's choice, so the two are
//! named together here, in the one place every front end parses a scheme from.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use super::{BackedStore, BackupConfig, BackupError};
use crate::client::layout::SCHEME_FORMS;
use crate::client::{RemoteMemory, Resilience};
use crate::nbd::PageStore;
use crate::span::SpanStore;

/// The name of the SSD-backup scheme.
pub const SSD_BACKUP: &str = "ssd-backup";

/// How a front end stores its pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreScheme {
    /// In the remote memory under this resilience scheme.
    Remote(Resilience),
    /// One remote copy (`single`) plus a write-behind copy in a local file.
    SsdBackup,
}

/// A scheme name that is none of the accepted forms.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("unknown scheme {name:?}: use {SCHEME_FORMS}, or {SSD_BACKUP} (one remote copy plus a local backup file)")]
pub struct StoreSchemeError {
    /// The name as given.
    pub name: String,
}

impl StoreScheme {
    /// The client's resilience scheme: `single` for `ssd-backup`.
    pub fn resilience(&self) -> Resilience {
        match *self {
            StoreScheme::Remote(r) => r,
            StoreScheme::SsdBackup => Resilience::Replication { copies: 1 },
        }
    }

    /// A short human label: "hydra 8+2 Δ=1", "single copy + SSD backup".
    pub fn label(&self) -> String {
        match self {
            StoreScheme::Remote(r) => r.label(),
            StoreScheme::SsdBackup => "single copy + SSD backup".into(),
        }
    }
}

impl fmt::Display for StoreScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreScheme::Remote(r) => r.fmt(f),
            StoreScheme::SsdBackup => f.write_str(SSD_BACKUP),
        }
    }
}

impl FromStr for StoreScheme {
    type Err = StoreSchemeError;

    fn from_str(s: &str) -> Result<StoreScheme, StoreSchemeError> {
        if s == SSD_BACKUP {
            return Ok(StoreScheme::SsdBackup);
        }
        s.parse()
            .map(StoreScheme::Remote)
            .map_err(|_| StoreSchemeError { name: s.into() })
    }
}

impl From<Resilience> for StoreScheme {
    fn from(r: Resilience) -> StoreScheme {
        StoreScheme::Remote(r)
    }
}

/// The store a front end reads and writes: a connected client, wrapped as its
/// [`StoreScheme`] says.
pub struct FrontStore {
    mem: Arc<RemoteMemory>,
    backed: Option<Arc<BackedStore>>,
    span: Option<Arc<SpanStore>>,
}

impl FrontStore {
    /// Wraps `mem`, a client connected with `scheme.resilience()`, for `scheme`; `ssd-backup`
    /// creates its backup file as `backup` says.
    pub fn new(
        mem: Arc<RemoteMemory>,
        scheme: StoreScheme,
        backup: &BackupConfig,
    ) -> Result<FrontStore, BackupError> {
        let backed = match scheme {
            StoreScheme::Remote(_) => None,
            StoreScheme::SsdBackup => Some(Arc::new(BackedStore::new(mem.clone(), backup)?)),
        };
        // Span coding's pages live in rows that only its page map knows.
        let span = match mem.layout().span() {
            true => Some(SpanStore::new(mem.clone()).map_err(BackupError::SpanMap)?),
            false => None,
        };
        Ok(FrontStore { mem, backed, span })
    }

    /// What the front end reads and writes.
    pub fn store(&self) -> Arc<dyn PageStore> {
        match (&self.backed, &self.span) {
            (Some(b), _) => b.clone(),
            (None, Some(s)) => s.clone(),
            (None, None) => self.mem.clone(),
        }
    }

    /// The span store, for span schemes (its memory cost and compaction).
    pub fn span(&self) -> Option<&Arc<SpanStore>> {
        self.span.as_ref()
    }

    /// What the span rows hold and what compaction did, in one line for a front end to print
    /// when it stops (`None` for other schemes); `forgot` says who freed the forgotten pages.
    pub fn span_summary(&self, forgot: &str) -> Option<String> {
        let sp = self.span.as_ref()?.stats();
        Some(format!("span rows: {}", sp.summary(forgot)))
    }

    /// The client (its statistics, releasing its memory).
    pub fn mem(&self) -> &Arc<RemoteMemory> {
        &self.mem
    }

    /// The backup store, for `ssd-backup`.
    pub fn backup(&self) -> Option<&Arc<BackedStore>> {
        self.backed.as_ref()
    }

    /// Ends the store: stops span's compaction (which would otherwise read rows whose memory
    /// is being freed), writes what is queued to the backup file and removes it (nothing more
    /// to do for a remote scheme). Call it before releasing the client's memory.
    pub fn close(&self) -> Result<(), BackupError> {
        if let Some(span) = &self.span {
            span.stop_compaction();
        }
        self.backed.as_ref().map_or(Ok(()), |b| b.close())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back_and_unknown_ones_list_every_form() {
        for name in [
            "ssd-backup",
            "single",
            "rep2",
            "hydra-8+2-d1",
            "hydra-4+2-d0-ec",
        ] {
            let s: StoreScheme = name.parse().unwrap();
            assert_eq!(s.to_string(), name);
        }
        assert_eq!(
            "ssd-backup".parse::<StoreScheme>().unwrap().resilience(),
            Resilience::Replication { copies: 1 }
        );
        for bad in ["ssd", "ssd-backup2", "SSD-backup", ""] {
            let text = bad.parse::<StoreScheme>().unwrap_err().to_string();
            for form in ["hydra-K+R-dD", "repN", "single", "ssd-backup"] {
                assert!(text.contains(form), "{form:?} missing from {text:?}");
            }
        }
    }
}
