//! `hydramem run -- CMD ARGS…`: starts CMD with the pager preloaded (the hydramem-pager
//! library), which keeps CMD's resident anonymous memory under `--local-memory` by paging
//! its large mappings to the cluster with userfaultfd: no swap device, no cgroup, no root
//! (where userfaultfd is allowed), no change to CMD.
//!
//! This process checks what it can before CMD starts (the library, userfaultfd, the cluster
//! file and its nodes), waits for CMD, passes SIGINT/SIGTERM/SIGHUP on to it, prints what
//! each paged process reported, releases the remote memory of every process that connected
//! (also of one that died without a word), and exits with CMD's status.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use hydramem::backup::BackupConfig;
use hydramem::cluster::Cluster;
use hydramem::run_config::{open_userfaultfd, RunConfig, ENV, MAX_READ_AHEAD};
use hydramem::status::{self, StatusResult};
use hydramem::units::{human, parse_size, Size};
use serde::Deserialize;

use crate::client_cli::ClientArgs;
use crate::run_user::RunAs;

/// `run`'s `--poll-us` unless given: how long the pager's fault thread polls for a page's
/// reply, and for the next fault report, before it sleeps. Longer than other commands' 50 µs
/// because the program is stopped on the fault while it waits, and a reply later than the
/// poll costs two wake-ups (the transport's receiver, then the fault thread): redis under
/// rep2-run served ~20% more GETs with 300 than with 50 at the small size, 2% at full size,
/// and no workload fewer; page-ins were 4–7 µs slower at the p50 (docs/benchmarks.md §12,
/// "Polling longer for a page").
const RUN_POLL_US: u64 = 300;

/// Whether the kernel lets any user make a userfaultfd that handles the kernel's faults.
fn unprivileged_userfaultfd() -> bool {
    std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").is_ok_and(|v| v.trim() == "1")
}

#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// Anonymous memory the program may keep resident (e.g. 512MiB); the rest of its large
    /// mappings is paged to the cluster. Each process the program executes gets this budget.
    #[arg(long, env = "HYDRAMEM_LOCAL_MEMORY", value_parser = parse_size)]
    local_memory: Size,
    /// Remote space for the program's pages that are out; only the part used costs memory
    /// on the nodes.
    #[arg(long, env = "HYDRAMEM_REMOTE_SIZE", default_value = "8GiB", value_parser = parse_size)]
    remote_size: Size,
    /// Smallest anonymous mapping that is paged; smaller ones stay local.
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    min_region: Size,
    /// Pages after a faulting page that are fetched with it, in the same batched read, when
    /// they are out too (objects cross page boundaries) and the program's page-ins show that
    /// it pays: measured as it runs, from how often a page-in follows the page before it;
    /// 0 turns it off.
    #[arg(long, default_value_t = 1)]
    read_ahead: u64,
    /// Part of --local-memory kept for pages taken out of the program but not sent out yet
    /// (a size, or a percentage of --local-memory; default 12.5%): a touch of one costs a
    /// local copy, not a round trip, which is how the pager sees the reads of pages it would
    /// otherwise send out (at least 1MiB).
    #[arg(long, env = "HYDRAMEM_STANDBY", value_parser = parse_size)]
    standby: Option<Size>,
    /// The pager library (default: libhydramem_pager.so beside this executable).
    #[arg(long, env = "HYDRAMEM_PAGER_LIB")]
    pager: Option<PathBuf>,
    /// Also keep the pager's report here: one JSON line when a process connects, one with
    /// its numbers when it exits.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Run the program as this user (a name or a number), with its groups, HOME, USER and
    /// LOGNAME, as `runuser -u` would; the cluster file and its key must be readable by it.
    /// (Not `hydramem run -- setpriv …`: setpriv aborts with the pager's thread in it.)
    #[arg(long)]
    user: Option<String>,
    /// The program and its arguments (after --).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<OsString>,
}

fn bytes(s: Size, flag: &str) -> Result<u64> {
    match s {
        Size::Bytes(b) => Ok(b),
        Size::Percent(_) => bail!("{flag} takes a byte count (e.g. 512MiB), not a percentage"),
    }
}

fn absolute(p: &Path) -> Result<PathBuf> {
    std::path::absolute(p).with_context(|| format!("resolving {}", p.display()))
}

/// The pager library: given, or beside this executable.
fn pager_library(given: Option<PathBuf>) -> Result<PathBuf> {
    let path = match given {
        Some(p) => p,
        None => std::env::current_exe()
            .context("finding this executable")?
            .with_file_name("libhydramem_pager.so"),
    };
    if !path.is_file() {
        bail!(
            "the pager library {} is missing: build it with `cargo build --release -p hydramem-pager` \
             (it goes beside the hydramem executable), or give --pager",
            path.display()
        );
    }
    absolute(&path)
}

#[derive(Deserialize)]
struct Line {
    event: String,
    pid: u32,
    command: String,
    client_id: String,
    stats: Option<Stats>,
    seconds: Option<f64>,
    span: Option<hydramem::span::SpanStats>,
}

#[derive(Deserialize)]
struct Pct {
    p50: u64,
    p99: u64,
}

#[derive(Deserialize)]
struct Stats {
    page_ins: u64,
    page_in_us: Pct,
    zero_fills: u64,
    #[serde(default)]
    zeroed_ahead: u64,
    written: u64,
    clean_drops: u64,
    #[serde(default)]
    read_ahead: u64,
    #[serde(default)]
    standby_ins: u64,
    zero_drops: u64,
    #[serde(default)]
    undroppable: u64,
    lost: u64,
    peak_resident: u64,
    #[serde(default)]
    peak_own: u64,
}

fn short(cmd: &str) -> String {
    let c: String = cmd.chars().take(40).collect();
    if c.len() < cmd.len() {
        format!("{c}…")
    } else {
        c
    }
}

/// Prints what each paged process reported, and returns the identities that connected.
fn summarize(report: &Path, local: u64) -> Vec<String> {
    let text = std::fs::read_to_string(report).unwrap_or_default();
    let lines: Vec<Line> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let mut ids = Vec::new();
    for l in &lines {
        match (l.event.as_str(), &l.stats) {
            ("connected", _) => ids.push(l.client_id.clone()),
            ("exit", Some(s)) => eprintln!(
                "hydramem run: pid {} ({}) ran {:.1} s: {} page-ins (p50 {} µs, p99 {} µs) and \
                 {} pages read ahead, {} touches answered from standby, {} first touches (and {} pages \
                 zeroed ahead of them), {} pages written out, {} clean and {} \
                 zero pages dropped without a write, {} lost; peak resident {} of {} (and the \
                 pager's own {})",
                l.pid,
                short(&l.command),
                l.seconds.unwrap_or(0.0),
                s.page_ins,
                s.page_in_us.p50,
                s.page_in_us.p99,
                s.read_ahead,
                s.standby_ins,
                s.zero_fills,
                s.zeroed_ahead,
                s.written,
                s.clean_drops,
                s.zero_drops,
                s.lost,
                human(s.peak_resident),
                human(local),
                human(s.peak_own)
            ),
            _ => {}
        }
        if let Some(s) = l
            .stats
            .as_ref()
            .filter(|s| l.event == "exit" && s.undroppable > 0)
        {
            eprintln!(
                "hydramem run: pid {}: the kernel refused to drop {} pages (the program locked \
                 them, mlock): they stay in local memory, above the budget if need be",
                l.pid, s.undroppable
            );
        }
        if let Some(sp) = l.span.filter(|sp| sp.rows_written > 0) {
            eprintln!(
                "hydramem run: pid {}'s span rows: {}",
                l.pid,
                sp.summary("the program freed them")
            );
        }
    }
    let exited = lines.iter().filter(|l| l.event == "exit").count();
    if ids.len() > exited {
        eprintln!(
            "hydramem run: {} paged process(es) ended without a report (killed?)",
            ids.len() - exited
        );
    }
    ids
}

/// Releases the remote memory of each identity.
fn release(cluster: &Cluster, ids: &[String]) {
    let mut slabs = 0u64;
    for hex in ids {
        let Ok(id) = hydramem::wire::ClientId::from_hex(hex) else {
            continue;
        };
        for n in hydramem::release::release(cluster, id, Duration::from_secs(5)) {
            match n.result {
                Ok(k) => slabs += k,
                Err(e) if e.in_use() => eprintln!(
                    "hydramem run: node {} ({}) did not release identity {hex}: {e}; a process \
                     that outlived the program still holds it: once it ends, its memory goes \
                     back when the nodes' lease runs out, or at once with `hydramem free \
                     --client-id {hex}`",
                    n.id, n.addr
                ),
                Err(e) => eprintln!(
                    "hydramem run: node {} ({}) did not release identity {hex}: {e}; \
                     run `hydramem free --client-id {hex}` once it answers",
                    n.id, n.addr
                ),
            }
        }
    }
    if slabs > 0 {
        eprintln!(
            "hydramem run: released {} of remote memory ({slabs} slabs)",
            human(slabs * cluster.slab_size)
        );
    }
}

/// `run`'s sizes, checked before anything starts.
struct Sizes {
    local_memory: u64,
    remote_size: u64,
    min_region: u64,
    standby: Option<u64>,
}

impl Sizes {
    fn of(a: &RunArgs) -> Result<Sizes> {
        let local_memory = bytes(a.local_memory, "--local-memory")?;
        if local_memory < 16 << 20 {
            bail!("--local-memory must be at least 16MiB");
        }
        let standby = a.standby.map(|s| match s {
            Size::Bytes(b) => b,
            Size::Percent(p) => (local_memory as f64 * p / 100.0) as u64,
        });
        if let Some(b) = standby.filter(|b| b.saturating_mul(2) > local_memory) {
            bail!(
                "--standby ({}) must be at most half of --local-memory ({}): the rest is the \
                 program's",
                human(b),
                human(local_memory)
            );
        }
        Ok(Sizes {
            local_memory,
            remote_size: bytes(a.remote_size, "--remote-size")?,
            min_region: bytes(a.min_region, "--min-region")?.max(4096),
            standby,
        })
    }
}

pub fn run(a: RunArgs) -> Result<()> {
    // First what the user typed, then what this machine allows, then the cluster.
    let sizes = Sizes::of(&a)?;
    // The client's own checks of its options, with their messages.
    a.client.config(sizes.remote_size)?;
    let backup = a.client.backup.config()?;
    let library = pager_library(a.pager.clone())?;
    // Fails with what to change when this user may not (the descriptor is closed at once).
    open_userfaultfd(libc::O_CLOEXEC, None)?;
    let cluster_path = absolute(&a.client.cluster)?;
    let cluster = a.client.key.load(&cluster_path)?;
    let up = status::collect(&cluster)
        .iter()
        .filter(|n| matches!(n.result, StatusResult::Up(_)))
        .count();
    if up == 0 {
        bail!(
            "no memory node of {} answered: start them (hydramem up) or check the cluster file",
            cluster_path.display()
        );
    }
    let run_as = a.user.as_deref().map(RunAs::lookup).transpose()?;
    let (report, own_report) = report_file(a.report.as_deref(), run_as.as_ref())?;
    let dev = userfaultfd_for(run_as.as_ref())?;
    let config = run_config(&a, (&sizes, &backup), cluster_path, &report, dev.as_ref())?;
    let mut cmd = Command::new(&a.command[0]);
    cmd.args(&a.command[1..])
        .env(ENV, config.to_env())
        .env("LD_PRELOAD", preload(library));
    if let Some(u) = &run_as {
        u.apply(&mut cmd, dev.as_ref());
    }
    let child = cmd.spawn().with_context(|| match &run_as {
        Some(u) => format!(
            "starting {} as {} (uid {})",
            a.command[0].to_string_lossy(),
            u.name,
            u.uid
        ),
        None => format!("starting {}", a.command[0].to_string_lossy()),
    })?;
    drop(dev);
    let status = wait_passing_signals(child)?;
    let ids = summarize(&report, sizes.local_memory);
    release(&cluster, &ids);
    if own_report {
        let _ = std::fs::remove_file(&report);
    }
    std::process::exit(exit_code(status));
}

/// The report file the pager appends to (`given`, or a temporary one this process removes:
/// the flag says which), made empty, and writable by the user the program runs as.
fn report_file(given: Option<&Path>, run_as: Option<&RunAs>) -> Result<(PathBuf, bool)> {
    let report = match given {
        Some(p) => absolute(p)?,
        None => std::env::temp_dir().join(format!("hydramem-run-{}.jsonl", std::process::id())),
    };
    let _ = std::fs::remove_file(&report);
    // The program, as another user, appends to the report that this process reads.
    std::fs::File::create(&report)
        .and_then(|f| match run_as {
            Some(u) => std::os::unix::fs::fchown(&f, Some(u.uid), Some(u.gid)),
            None => Ok(()),
        })
        .with_context(|| format!("creating the report file {}", report.display()))?;
    Ok((report, given.is_none()))
}

/// The userfaultfd device opened for a program that runs as another user than root (`None`
/// where this kernel has no such device or this process may not open it: the program then
/// needs the system call, and an error says how to allow it where it may not).
fn userfaultfd_for(run_as: Option<&RunAs>) -> Result<Option<OwnedFd>> {
    let Some(u) = run_as.filter(|u| u.uid != 0) else {
        return Ok(None);
    };
    let dev = hydramem::run_config::userfaultfd_device()
        .ok()
        .map(OwnedFd::from);
    if dev.is_none() && !unprivileged_userfaultfd() {
        bail!(
            "--user {}: that user may not make a userfaultfd and {} cannot be passed on to it \
             (it does not open here); allow it with `sysctl vm.unprivileged_userfaultfd=1`",
            u.name,
            hydramem::run_config::DEV
        );
    }
    Ok(dev)
}

/// What the pager in the program is told (through [`ENV`]).
fn run_config(
    a: &RunArgs,
    (sizes, backup): (&Sizes, &BackupConfig),
    cluster: PathBuf,
    report: &Path,
    dev: Option<&OwnedFd>,
) -> Result<RunConfig> {
    Ok(RunConfig {
        cluster,
        cluster_key: a
            .client
            .key
            .cluster_key
            .as_deref()
            .map(absolute)
            .transpose()?,
        tls_dir: a.client.key.tls_dir.as_deref().map(absolute).transpose()?,
        scheme: a.client.scheme.to_string(),
        checksums: !a.client.no_checksums,
        poll_us: a.client.poll_us.unwrap_or(RUN_POLL_US),
        op_timeout: a.client.op_timeout,
        error_correction_limit: a.client.error_correction_limit,
        slab_regeneration_limit: a.client.slab_regeneration_limit,
        backup_dir: absolute(&backup.dir)?,
        backup_queue: backup.queue_bytes,
        local_memory: sizes.local_memory,
        remote_size: sizes.remote_size,
        min_region: sizes.min_region,
        read_ahead: a.read_ahead.min(MAX_READ_AHEAD),
        span_max_cost: a.client.span_max_cost,
        standby: sizes.standby,
        report: Some(report.to_path_buf()),
        userfaultfd_dev: dev.map(|d| d.as_raw_fd()),
    })
}

/// LD_PRELOAD with the pager library first, before what the environment preloads already.
fn preload(library: PathBuf) -> OsString {
    match std::env::var_os("LD_PRELOAD") {
        Some(old) if !old.is_empty() => {
            let mut v = library.into_os_string();
            v.push(":");
            v.push(old);
            v
        }
        _ => library.into_os_string(),
    }
}

/// Waits for the program, passing SIGINT, SIGTERM and SIGHUP on to it meanwhile.
fn wait_passing_signals(mut child: std::process::Child) -> Result<std::process::ExitStatus> {
    let pid = child.id() as i32;
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ])
    .context("catching signals to pass them on")?;
    let handle = signals.handle();
    let forward = std::thread::spawn(move || {
        for sig in signals.forever() {
            // SAFETY: kill takes no pointers. The pid is our own child's until `wait` below
            // reaps it; only a signal caught in the instant between that and `close` could
            // reach an ended pid.
            unsafe { libc::kill(pid, sig) };
        }
    });
    let status = child.wait().context("waiting for the program");
    handle.close();
    let _ = forward.join();
    status
}

/// The exit status to end with: the program's, or 128 + the signal that ended it (said).
fn exit_code(status: std::process::ExitStatus) -> i32 {
    match (
        status.code(),
        std::os::unix::process::ExitStatusExt::signal(&status),
    ) {
        (Some(c), _) => c,
        (None, Some(s)) => {
            eprintln!("hydramem run: the program was ended by signal {s}");
            128 + s
        }
        (None, None) => 1,
    }
}
