//! The contract between `hydramem run` and its pager (the preloaded library of the
//! hydramem-pager crate): what the command asked for, passed to the program's process in one
//! environment variable, and how the pager connects to the cluster from it. Both sides use
//! this file alone, so the two cannot disagree on a field.
//!
//! Invariants: the variable holds one JSON object; every path in it is absolute (the program
//! may change directory before its pager connects); sizes are bytes.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backup::{BackupConfig, FrontStore, StoreScheme};
use crate::client::{ClientConfig, RemoteMemory};
use crate::cluster::Cluster;
use crate::wire::ClientId;

/// The environment variable that carries the configuration.
pub const ENV: &str = "HYDRAMEM_PAGER";

/// Most pages read ahead of a fault (`read_ahead` is capped to it on both sides).
pub const MAX_READ_AHEAD: u64 = 64;

/// What `hydramem run` asked the pager of each process it starts to do.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunConfig {
    /// The cluster file (absolute).
    pub cluster: PathBuf,
    /// The cluster key file given to the command (absolute), which overrides the cluster
    /// file's.
    #[serde(default)]
    pub cluster_key: Option<PathBuf>,
    /// The TLS member directory given to the command (absolute), which overrides the
    /// cluster file's.
    #[serde(default)]
    pub tls_dir: Option<PathBuf>,
    /// The scheme, as `--scheme` takes it.
    pub scheme: String,
    /// Per-split checksums.
    pub checksums: bool,
    /// Microseconds a waiting thread polls before it sleeps.
    pub poll_us: u64,
    /// Seconds one page operation may take.
    pub op_timeout: f64,
    /// The paper's ErrorCorrectionLimit.
    pub error_correction_limit: f64,
    /// The paper's SlabRegenerationLimit.
    pub slab_regeneration_limit: f64,
    /// The ssd-backup scheme's directory.
    pub backup_dir: PathBuf,
    /// The ssd-backup scheme's queue, in bytes.
    pub backup_queue: u64,
    /// Anonymous memory the program may keep resident, in bytes.
    pub local_memory: u64,
    /// Bytes of remote space for the program's pages that are out.
    pub remote_size: u64,
    /// Smallest mapping that is paged, in bytes.
    pub min_region: u64,
    /// Pages after a faulting page fetched with it when they are out too.
    #[serde(default)]
    pub read_ahead: u64,
    /// Span schemes' compaction ceiling (`ClientConfig::span_max_cost`); `None`: the default.
    #[serde(default)]
    pub span_max_cost: Option<f64>,
    /// Bytes of the budget kept for pages taken out of the program and not sent out yet
    /// (the standby pool); `None`: an eighth of `local_memory`.
    #[serde(default)]
    pub standby: Option<u64>,
    /// File the pager appends its report lines to (JSON, one per line).
    pub report: Option<PathBuf>,
    /// A descriptor of /dev/userfaultfd that `hydramem run --user` opened (as root) and
    /// passes on to the program, which then runs as a user that may not open it itself.
    #[serde(default)]
    pub userfaultfd_dev: Option<i32>,
}

/// The fewest pages in the standby pool: one of the evictor's largest batches.
pub const MIN_STANDBY_PAGES: u32 = 256;

impl RunConfig {
    /// Pages in the standby pool: `standby` (or an eighth of the budget), at least
    /// [`MIN_STANDBY_PAGES`].
    pub fn standby_pages(&self) -> u32 {
        let bytes = self.standby.unwrap_or(self.local_memory / 8);
        u32::try_from(bytes / 4096)
            .unwrap_or(u32::MAX)
            .max(MIN_STANDBY_PAGES)
    }
}

/// The device that hands out userfaultfds where the system call is not allowed.
pub const DEV: &str = "/dev/userfaultfd";

/// Opens [`DEV`] for reading and writing (where this process may).
pub fn userfaultfd_device() -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new().read(true).write(true).open(DEV)
}

/// This process may not handle its own page faults.
#[derive(Debug, thiserror::Error)]
#[error(
    "this process may not handle its own page faults (userfaultfd: {0}): run as root, or \
     allow it with `sysctl vm.unprivileged_userfaultfd=1`, or give the user read-write \
     access to /dev/userfaultfd"
)]
pub struct UserfaultfdDenied(pub std::io::Error);

/// A userfaultfd for this process with `flags` (O_CLOEXEC, O_NONBLOCK), handling faults
/// from the kernel too (never user-mode only): by the system call, else through
/// /dev/userfaultfd, which may be allowed where the call is not — through `dev` when given
/// (a descriptor of it opened earlier, with rights this process may no longer have; used
/// only if it is one). `hydramem run` calls it to check before starting the program, the
/// pager to get its descriptor.
pub fn open_userfaultfd(flags: i32, dev: Option<i32>) -> Result<OwnedFd, UserfaultfdDenied> {
    // SAFETY: the system call takes flags only.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd >= 0 {
        // SAFETY: a descriptor the kernel just gave us, owned by nobody else.
        return Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) });
    }
    let syscall_error = std::io::Error::last_os_error();
    let given = dev.filter(|&fd| {
        std::fs::read_link(format!("/proc/self/fd/{fd}")).is_ok_and(|p| p == Path::new(DEV))
    });
    let opened;
    let dev = match given {
        Some(fd) => fd,
        None => {
            opened = userfaultfd_device().map_err(|_| UserfaultfdDenied(syscall_error))?;
            opened.as_raw_fd()
        }
    };
    /// USERFAULTFD_IOC_NEW = _IO(0xAA, 0x00): makes a userfaultfd with the flags given.
    const USERFAULTFD_IOC_NEW: libc::c_ulong = 0xAA00;
    // SAFETY: USERFAULTFD_IOC_NEW takes the new descriptor's flags as its argument; `dev`
    // is /dev/userfaultfd (checked above, or just opened).
    let fd = unsafe { libc::ioctl(dev, USERFAULTFD_IOC_NEW, flags) };
    if fd < 0 {
        return Err(UserfaultfdDenied(std::io::Error::last_os_error()));
    }
    // SAFETY: as above.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Why the pager could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunConfigError {
    /// The variable does not parse.
    #[error(
        "{ENV} is not a hydramem run configuration ({0}): start the program with hydramem run"
    )]
    Parse(serde_json::Error),
    /// The scheme does not parse.
    #[error("scheme {0:?}: {1}")]
    Scheme(String, String),
    /// The cluster file does not load.
    #[error("loading the cluster file {}: {}", .0.display(), .1)]
    Cluster(PathBuf, String),
    /// The nodes cannot be reached.
    #[error("connecting to the memory nodes of {} as {scheme}: {source}", .cluster.display())]
    Connect {
        /// The cluster file.
        cluster: PathBuf,
        /// The scheme.
        scheme: String,
        /// What failed.
        source: Box<crate::client::ClientError>,
    },
    /// The scheme's store does not start.
    #[error("starting the {0} store: {1}")]
    Store(String, Box<crate::backup::BackupError>),
}

impl RunConfig {
    /// The configuration as the environment variable's value.
    pub fn to_env(&self) -> String {
        serde_json::to_string(self).expect("a RunConfig always serializes")
    }

    /// The configuration in `value` (the variable's value).
    pub fn from_env(value: &str) -> Result<RunConfig, RunConfigError> {
        serde_json::from_str(value).map_err(RunConfigError::Parse)
    }

    /// The scheme, parsed.
    pub fn store_scheme(&self) -> Result<StoreScheme, RunConfigError> {
        StoreScheme::from_str(&self.scheme)
            .map_err(|e| RunConfigError::Scheme(self.scheme.clone(), e.to_string()))
    }

    /// The client configuration for the remote space, with identity `id`.
    pub fn client_config(&self, id: ClientId) -> Result<ClientConfig, RunConfigError> {
        let scheme = self.store_scheme()?;
        let mut c = ClientConfig::new(scheme.resilience(), self.remote_size);
        c.client_id = id;
        c.poll = Duration::from_micros(self.poll_us);
        c.op_timeout = Duration::from_secs_f64(self.op_timeout);
        c.checksums = self.checksums;
        c.error_correction_limit = self.error_correction_limit;
        c.slab_regeneration_limit = self.slab_regeneration_limit;
        c.span_max_cost = self.span_max_cost;
        Ok(c)
    }

    /// The cluster file with its key and TLS material, read now. The pager reads them as the
    /// program starts, before it runs any of its own code: a server that drops its
    /// privileges (memcached's `-u nobody`, a daemon's setuid) may no longer read them when
    /// it connects.
    pub fn load_cluster(&self) -> Result<Cluster, RunConfigError> {
        Cluster::load(&self.cluster)
            .and_then(|c| c.with_key_flag(self.cluster_key.as_deref()))
            .and_then(|c| c.with_tls_flag(self.tls_dir.as_deref()))
            .map_err(|e| RunConfigError::Cluster(self.cluster.clone(), e.to_string()))
    }

    /// Connects to `cluster` (from [`RunConfig::load_cluster`]) as `id` and opens the
    /// scheme's store over the remote space.
    pub fn open(&self, cluster: &Cluster, id: ClientId) -> Result<FrontStore, RunConfigError> {
        let config = self.client_config(id)?;
        let mem: Arc<RemoteMemory> =
            RemoteMemory::connect(cluster, config).map_err(|source| RunConfigError::Connect {
                cluster: self.cluster.clone(),
                scheme: self.scheme.clone(),
                source: Box::new(source),
            })?;
        let backup = BackupConfig {
            dir: self.backup_dir.clone(),
            queue_bytes: self.backup_queue,
        };
        FrontStore::new(mem, self.store_scheme()?, &backup)
            .map_err(|e| RunConfigError::Store(self.scheme.clone(), Box::new(e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_the_environment() {
        let c = RunConfig {
            cluster: "/etc/hydramem/cluster.toml".into(),
            cluster_key: Some("/etc/hydramem/cluster.key".into()),
            tls_dir: Some("/etc/hydramem/tls".into()),
            scheme: "span-8+2".into(),
            checksums: true,
            poll_us: 50,
            op_timeout: 10.0,
            error_correction_limit: 0.001,
            slab_regeneration_limit: 0.01,
            backup_dir: "/var/tmp".into(),
            backup_queue: 64 << 20,
            local_memory: 256 << 20,
            remote_size: 8 << 30,
            min_region: 1 << 20,
            read_ahead: 1,
            span_max_cost: Some(1.7),
            standby: None,
            report: None,
            userfaultfd_dev: Some(3),
        };
        assert_eq!(RunConfig::from_env(&c.to_env()).unwrap(), c);
        assert!(c.store_scheme().is_ok());
        let client = c.client_config(crate::wire::ClientId::random()).unwrap();
        assert_eq!(client.span_max_cost, Some(1.7));
        assert!(RunConfig::from_env("{}").is_err());
    }
}
