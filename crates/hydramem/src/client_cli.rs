//! The options of a command that connects one client to the cluster (`nbd`, `mount`): the
//! cluster file, the scheme and the client's tuning, turned into a [`ClientConfig`] with the
//! same checks and messages for every such command, and the `ssd-backup` scheme's backup file
//! ([`BackupArgs`], which `bench` takes too); and the cluster key every command that talks
//! to nodes takes ([`KeyArgs`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use hydramem::backup::{BackupConfig, FrontStore, StoreScheme};
use hydramem::client::{ClientConfig, RemoteMemory};
use hydramem::cluster::Cluster;
use hydramem::span::compact::Thresholds;
use hydramem::units::{parse_size, Size};
use hydramem::wire::ClientId;

/// The cluster key (see `hydramem key new`) and TLS (see `hydramem tls`): what nodes and
/// clients prove to each other.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct KeyArgs {
    /// The cluster key file (`hydramem key new FILE` makes one): the nodes and clients of a
    /// cluster with a key prove it to each other at every connection. Overrides the cluster
    /// file's `key_file`.
    #[arg(long, env = "HYDRAMEM_CLUSTER_KEY_FILE")]
    pub cluster_key: Option<PathBuf>,
    /// TLS member directory (`hydramem tls issue` makes one: ca.pem, cert.pem, key.pem):
    /// connections to the nodes are TLS, both ends showing a certificate from the cluster's
    /// CA. Overrides the cluster file's `tls_dir`.
    #[arg(long = "tls", env = "HYDRAMEM_TLS_DIR")]
    pub tls_dir: Option<PathBuf>,
}

impl KeyArgs {
    /// The cluster file at `path` with its key and TLS: these flags', else the file's.
    pub fn load(&self, path: &Path) -> Result<Cluster> {
        Ok(Cluster::load(path)?
            .with_key_flag(self.cluster_key.as_deref())?
            .with_tls_flag(self.tls_dir.as_deref())?)
    }

    /// The key and TLS alone: these flags', else those of the cluster file at `cluster` if
    /// there is one (a command that names a node by address needs no cluster file).
    pub fn access(&self, cluster: &Path) -> Result<hydramem::rpc::Access> {
        let mut access = if cluster.exists() {
            hydramem::rpc::Access::of(&self.load(cluster)?)
        } else {
            hydramem::rpc::Access::open()
        };
        if let Some(f) = &self.cluster_key {
            access.key = Some(hydramem::auth::ClusterKey::load(f)?);
        }
        if let Some(d) = &self.tls_dir {
            access.tls = Some(hydramem::tls::Tls::load(d)?);
        }
        Ok(access)
    }
}

/// Where the `ssd-backup` scheme keeps its local copy.
#[derive(clap::Args)]
pub struct BackupArgs {
    /// Directory of the ssd-backup scheme's local copy: a file hydramem-backup-<pid>-... is
    /// created there and removed at exit. It needs room for every page written; give a
    /// local disk, not a tmpfs such as /tmp often is (that would keep the copy in memory).
    #[arg(long, env = "HYDRAMEM_BACKUP_DIR", default_value = hydramem::backup::DEFAULT_DIR)]
    pub backup_dir: PathBuf,
    /// Pages the ssd-backup scheme may hold acknowledged but not yet written to its file;
    /// writers wait while it is full.
    #[arg(long, env = "HYDRAMEM_BACKUP_QUEUE", default_value = "64MiB", value_parser = parse_size)]
    pub backup_queue: Size,
}

impl BackupArgs {
    /// The backup store's configuration.
    pub fn config(&self) -> Result<BackupConfig> {
        match self.backup_queue {
            Size::Bytes(queue_bytes) => Ok(BackupConfig {
                dir: self.backup_dir.clone(),
                queue_bytes,
            }),
            Size::Percent(_) => {
                bail!("--backup-queue takes a byte count (e.g. 64MiB), not a percentage")
            }
        }
    }
}

#[derive(clap::Args)]
pub struct ClientArgs {
    /// The cluster file.
    #[arg(
        long,
        env = "HYDRAMEM_CLUSTER",
        default_value = "hydramem.cluster.toml"
    )]
    pub cluster: PathBuf,
    #[command(flatten)]
    pub key: KeyArgs,
    /// Resilience scheme: hydra-K+R-dD (e.g. hydra-8+2-d1; add -ec for EC-only, -det for
    /// corruption detection, -cor for correction), span-K+R (e.g. span-8+2: whole pages, one
    /// message per read, parity across the pages of a row), repN, single, or ssd-backup (one remote
    /// copy plus a local backup file in --backup-dir, the paper's Infiniswap baseline), as
    /// `bench --schemes` takes them.
    #[arg(long, env = "HYDRAMEM_SCHEME", default_value = "hydra-8+2-d1")]
    pub scheme: StoreScheme,
    /// Turn off the per-split CRC32C checksums (on by default: a split corrupted on a node or
    /// on the wire is then read around, never returned).
    #[arg(long, env = "HYDRAMEM_NO_CHECKSUMS")]
    pub no_checksums: bool,
    /// Share of corrupted splits from one node above which reads involving it start with
    /// every split they may need (the paper's ErrorCorrectionLimit).
    #[arg(long, env = "HYDRAMEM_ERROR_CORRECTION_LIMIT", default_value_t = 0.001)]
    pub error_correction_limit: f64,
    /// Share of corrupted splits from one node above which the client moves its slabs off
    /// that node and avoids it until it restarts (the paper's SlabRegenerationLimit).
    #[arg(long, env = "HYDRAMEM_SLAB_REGENERATION_LIMIT", default_value_t = 0.01)]
    pub slab_regeneration_limit: f64,
    /// Microseconds a waiting thread polls before it sleeps [default: 50; for `run`, 300:
    /// its fault thread is the one that waits, with the program stopped on the fault].
    #[arg(long, env = "HYDRAMEM_POLL_US")]
    pub poll_us: Option<u64>,
    /// Seconds one page operation may take before the request fails with EIO.
    #[arg(long, env = "HYDRAMEM_OP_TIMEOUT", default_value_t = 10.0)]
    pub op_timeout: f64,
    /// Span schemes: remote bytes held per byte of data above which compaction starts while
    /// writes flow [default: 1.16 × the code's cost, 1.45 for span-8+2]. Higher holds more
    /// garbage and moves fewer pages (memcached under `run`: 1.7 moved a third as many);
    /// once writes pause, compaction still goes down to 1.04 × the code's cost. Other
    /// schemes ignore it
    #[arg(long, env = "HYDRAMEM_SPAN_MAX_COST")]
    pub span_max_cost: Option<f64>,
    #[command(flatten)]
    pub backup: BackupArgs,
}

impl ClientArgs {
    /// The client configuration for an address space of `size` bytes, with a random identity.
    pub fn config(&self, size: u64) -> Result<ClientConfig> {
        if !(self.op_timeout.is_finite() && self.op_timeout > 0.0) {
            bail!("--op-timeout must be a positive number of seconds");
        }
        for (name, v) in [
            ("--error-correction-limit", self.error_correction_limit),
            ("--slab-regeneration-limit", self.slab_regeneration_limit),
        ] {
            if !(0.0..=1.0).contains(&v) {
                bail!("{name} {v} is not a share between 0 and 1 (e.g. 0.01 for 1 % of splits)");
            }
        }
        let mut config = ClientConfig::new(self.scheme.resilience(), size);
        // Without the flag, the library's default (`ClientConfig::new`).
        if let Some(us) = self.poll_us {
            config.poll = Duration::from_micros(us);
        }
        config.op_timeout = Duration::from_secs_f64(self.op_timeout);
        config.checksums = !self.no_checksums;
        config.error_correction_limit = self.error_correction_limit;
        config.slab_regeneration_limit = self.slab_regeneration_limit;
        if let Some(cost) = self.span_max_cost {
            Thresholds::of_scheme(config.resilience, Some(cost))
                .with_context(|| format!("--span-max-cost {cost} with --scheme {}", self.scheme))?;
            config.span_max_cost = Some(cost);
        }
        Ok(config)
    }

    /// The scheme as printed, with "with checksums" when they are on.
    pub fn label(&self) -> String {
        if self.no_checksums {
            self.scheme.label()
        } else {
            format!("{} with checksums", self.scheme.label())
        }
    }

    /// Connects a client with an address space of `size` bytes to `cluster`, as `client_id`
    /// (32 hex digits) or a random identity, and wraps it as the scheme says.
    pub fn open(
        &self,
        cluster: &Cluster,
        size: u64,
        client_id: Option<&str>,
    ) -> Result<FrontStore> {
        if self.scheme == StoreScheme::SsdBackup && client_id.is_some() {
            bail!(
                "--client-id keeps the data on the memory nodes past this process, but the \
                 ssd-backup scheme's local copy goes with it: use another scheme with --client-id"
            );
        }
        let backup = self.backup.config()?;
        let mem = self.connect(cluster, size, client_id)?;
        FrontStore::new(mem, self.scheme, &backup).context("starting the store")
    }

    /// Connects a client with an address space of `size` bytes to `cluster`, as `client_id`
    /// (32 hex digits) or a random identity.
    fn connect(
        &self,
        cluster: &Cluster,
        size: u64,
        client_id: Option<&str>,
    ) -> Result<Arc<RemoteMemory>> {
        let mut config = self.config(size)?;
        if let Some(id) = client_id {
            config.client_id =
                ClientId::from_hex(id).map_err(|e| anyhow::anyhow!("--client-id {id:?}: {e}"))?;
            config.kept = true;
        }
        RemoteMemory::connect(cluster, config).with_context(|| {
            format!(
                "connecting to the memory nodes of {} as {}",
                self.cluster.display(),
                self.scheme.label()
            )
        })
    }
}
