//! `hydramem mount DIR`: a file system whose files live in the cluster's memory (see
//! [`hydramem::mount`]), served over FUSE until it is unmounted (`umount DIR`) or the command
//! gets SIGINT/SIGTERM (then it unmounts DIR itself, once nothing uses it).
//!
//! The metadata lives in this process, so the files are gone when it stops, and the remote
//! memory is released then (memory semantics) — unless `--client-id` keeps the identity: then
//! the metadata is saved into the cluster at unmount, and the next mount with the same
//! identity, scheme and size finds the files again. `--in-memory` serves the same file system from
//! this process's memory instead of a cluster: the ceiling of the FUSE path, which no remote
//! memory behind it can beat.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hydramem::cluster::Cluster;
use hydramem::mount::fuse::{serve, MountOptions};
use hydramem::mount::{Capacity, HydraFs};
use hydramem::nbd::{MemStore, PageStore};
use hydramem::status::{self, StatusResult};
use hydramem::units::{human, parse_size, Size};
use parking_lot::Mutex;

use crate::client_cli::ClientArgs;

#[derive(clap::Args)]
pub struct MountArgs {
    /// Directory to mount the file system on (it must exist).
    dir: PathBuf,
    #[command(flatten)]
    client: ClientArgs,
    /// Size of the file system (e.g. 8GiB). Without it: what the cluster's nodes can hold
    /// under the scheme when the mount starts.
    #[arg(long, env = "HYDRAMEM_SIZE", value_parser = parse_size)]
    size: Option<Size>,
    /// Serve the files from this process's memory instead of a cluster (needs --size): the
    /// ceiling of the FUSE path, for comparisons and trying it out.
    #[arg(long)]
    in_memory: bool,
    /// Threads serving requests, each with its own FUSE descriptor: requests in flight at
    /// once (a loop device or fio at queue depth 16 needs 16).
    #[arg(long, env = "HYDRAMEM_THREADS", default_value_t = 16)]
    threads: usize,
    /// Client identity (32 hex digits) that owns the files' memory. Given, the files outlive
    /// the mount: the metadata is saved into the cluster when it stops cleanly and the next
    /// mount with the same identity (and --scheme, --size) finds them; `hydramem free`
    /// releases them. Without it, the files are gone when the mount stops.
    #[arg(long, env = "HYDRAMEM_CLIENT_ID", requires = "size")]
    client_id: Option<String>,
    /// Let other users than the one mounting use the file system (non-root mounts need
    /// user_allow_other in /etc/fuse.conf).
    #[arg(long)]
    allow_other: bool,
}

/// Bytes of data the up nodes of `cluster` can still take under a scheme that stores `width`
/// splits for every `k` (None if no node answered).
fn cluster_free(cluster: &Cluster, k: u64, width: u64) -> Option<u64> {
    let mut free = None;
    for n in status::collect(cluster) {
        if let StatusResult::Up(s) = n.result {
            let slabs = u64::from(s.budget_slabs).saturating_sub(s.slabs.len() as u64);
            *free.get_or_insert(0) += slabs * s.slab_size;
        }
    }
    free.map(|f: u64| f / width * k)
}

/// The cluster's free capacity for statfs, asked at most every two seconds.
fn capacity(cluster: Cluster, k: u64, width: u64) -> Capacity {
    let cache: Mutex<Option<(Instant, Option<u64>)>> = Mutex::new(None);
    Box::new(move || {
        let mut c = cache.lock();
        match *c {
            Some((at, v)) if at.elapsed() < Duration::from_secs(2) => v,
            _ => {
                let v = cluster_free(&cluster, k, width);
                *c = Some((Instant::now(), v));
                v
            }
        }
    })
}

pub fn run(a: MountArgs, stop: Arc<AtomicBool>) -> Result<()> {
    if a.threads == 0 {
        bail!("--threads must be at least 1");
    }
    if !a.dir.is_dir() {
        bail!(
            "{} is not a directory: create it first (mkdir -p {})",
            a.dir.display(),
            a.dir.display()
        );
    }
    let size = match a.size {
        Some(Size::Bytes(b)) if b < 1 << 20 => bail!("--size must be at least 1MiB"),
        Some(Size::Bytes(b)) => Some(b),
        Some(Size::Percent(_)) => bail!("--size takes a byte count (e.g. 8GiB), not a percentage"),
        None => None,
    };
    if a.in_memory && a.client_id.is_some() {
        bail!("--client-id keeps files in a cluster; --in-memory has none to keep them in");
    }
    let (fs, front, what) = if a.in_memory {
        let Some(size) = size else {
            bail!("--in-memory needs --size (e.g. --size 4GiB): the memory it may use");
        };
        let store: Arc<dyn PageStore> = MemStore::new(size, Duration::ZERO);
        let fs = HydraFs::new(store, size, uid(), gid(), None);
        (
            fs,
            None,
            format!("{} in this process's memory", human(size)),
        )
    } else {
        let cluster = a.client.key.load(&a.client.cluster)?;
        let probe = a.client.config(1 << 20)?;
        let layout = hydramem::client::Layout::new(probe.resilience, cluster.slab_size)
            .context("the scheme does not fit the cluster's slab size")?;
        let (k, width) = (layout.k as u64, layout.width as u64);
        let size = match size {
            Some(s) => s,
            None => match cluster_free(&cluster, k, width) {
                Some(f) if f >= 1 << 20 => f,
                Some(f) => bail!(
                    "the cluster has only {} free for data as {}: free memory on the nodes, or give --size",
                    human(f),
                    a.client.scheme.label()
                ),
                None => bail!(
                    "no memory node of {} answered: start them (hydramem up) or check the cluster file",
                    a.client.cluster.display()
                ),
            },
        };
        let front = a.client.open(&cluster, size, a.client_id.as_deref())?;
        let nodes = cluster.nodes.len();
        let store = front.store();
        let cap = Some(capacity(cluster, k, width));
        let fs = if a.client_id.is_some() {
            HydraFs::open(store, size, uid(), gid(), cap).context(
                "loading the files kept for this --client-id (the cluster holds its memory)",
            )?
        } else {
            HydraFs::new(store, size, uid(), gid(), cap)
        };
        let what = format!(
            "{} as {} on {} memory nodes",
            human(size),
            a.client.label(),
            nodes
        );
        (fs, Some(front), what)
    };
    let opts = MountOptions {
        threads: a.threads,
        allow_other: a.allow_other,
        fsname: "hydramem".into(),
    };
    let fate = if a.client_id.is_some() {
        let n = fs.files() - 1;
        format!("{n} files and directories kept for this --client-id; they stay when it stops")
    } else {
        "the files are gone when it stops".to_string()
    };
    println!(
        "mounted {}: {what}; umount it or press Ctrl-C to stop ({fate})",
        a.dir.display()
    );
    let fs = Arc::new(fs);
    let watch = stop.clone();
    serve(fs.clone(), &a.dir, &opts, move || {
        watch.load(Ordering::Relaxed)
    })
    .with_context(|| format!("mounting and serving {}", a.dir.display()))?;
    if let Some(line) = front
        .as_ref()
        .and_then(|f| f.span_summary("files deleted, truncated or punched"))
    {
        println!("{line}");
    }
    if a.client_id.is_some() {
        fs.save().context(
            "saving the files' metadata into the cluster at unmount: the files cannot be found again",
        )?;
        println!(
            "unmounted {}; {} files and directories stay on the memory nodes for this \
             --client-id: mount it again with the same --client-id, --scheme and --size to \
             find them (hydramem free releases them)",
            a.dir.display(),
            fs.files() - 1
        );
    } else if let Some(front) = front {
        front.close()?;
        front
            .mem()
            .free_all()
            .context("releasing the remote memory at exit (the nodes keep it until restarted)")?;
        println!("unmounted {}; remote memory released", a.dir.display());
    } else {
        println!("unmounted {}", a.dir.display());
    }
    Ok(())
}

fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

fn gid() -> u32 {
    // SAFETY: getgid has no preconditions and cannot fail.
    unsafe { libc::getgid() }
}
