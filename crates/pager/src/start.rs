//! Starting and ending the pager of one process: the constructor that runs when the
//! library is loaded, the evictor thread that connects once the program grows, the fork
//! handlers, and the report written at exit (see the crate documentation for the life of a
//! pager).

use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use hydramem::cluster::Cluster;
use hydramem::run_config::{RunConfig, ENV, MAX_READ_AHEAD};
use hydramem::wire::ClientId;
use serde::Serialize;

use crate::pager::Pager;
use crate::throttle::Throttle;
use crate::{evict, hooks, regions, stats, uffd, PAGE};

/// Set in a forked child: the pager does not run there.
static DISABLED: AtomicBool = AtomicBool::new(false);
/// The running pager, once connected.
static PAGER: OnceLock<Arc<Pager>> = OnceLock::new();
/// What this process was started with, and its report file (opened at start), for its
/// report.
static START: OnceLock<(RunConfig, ClientId, Instant, Option<File>)> = OnceLock::new();

/// Whether the pager is off in this process (a forked child).
pub fn disabled() -> bool {
    DISABLED.load(Ordering::Relaxed)
}

/// The running pager, if this process has one.
pub fn running() -> Option<&'static Arc<Pager>> {
    if disabled() {
        return None;
    }
    PAGER.get()
}

/// One line of the report file.
#[derive(Serialize)]
struct ReportLine<'a> {
    event: &'a str,
    pid: u32,
    command: String,
    client_id: String,
    scheme: &'a str,
    local_memory: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stats: Option<stats::Summary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    remote_pages: Option<u64>,
    /// A span scheme's rows: their memory cost, garbage and compaction.
    #[serde(skip_serializing_if = "Option::is_none")]
    span: Option<hydramem::span::SpanStats>,
    /// Thread-local destructors the pager's threads registered, kept on the library's own
    /// list (`hooks::__cxa_thread_atexit_impl`): above 0, its definition is the one bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    own_thread_dtors: Option<usize>,
}

fn command() -> String {
    std::fs::read("/proc/self/cmdline")
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

fn report(event: &str, with_stats: bool) {
    let Some((config, id, start, Some(mut file))) =
        START.get().map(|(c, i, s, f)| (c, i, s, f.as_ref()))
    else {
        return;
    };
    let pager = PAGER.get();
    let line = ReportLine {
        event,
        pid: std::process::id(),
        command: command(),
        client_id: id.to_hex(),
        scheme: &config.scheme,
        local_memory: config.local_memory,
        seconds: with_stats.then(|| start.elapsed().as_secs_f64()),
        stats: pager.filter(|_| with_stats).map(|p| p.stats.summary()),
        remote_pages: pager
            .filter(|_| with_stats)
            .map(|p| p.shared.lock().table.slots_used()),
        span: pager.filter(|_| with_stats).and_then(|p| p.span_stats()),
        own_thread_dtors: with_stats
            .then(|| hooks::DTORS_KEPT.load(std::sync::atomic::Ordering::Relaxed)),
    };
    let mut text = serde_json::to_string(&line).unwrap_or_default();
    text.push('\n');
    // One write of the whole line, appended: lines of processes that share the file do not
    // interleave.
    let _ = file.write_all(text.as_bytes());
}

fn fail(what: &str) -> ! {
    eprintln!("hydramem run: {what}");
    // SAFETY: ends the process at once, as a failed start should.
    unsafe { libc::_exit(70) }
}

/// Makes the pager and starts its fault thread, before it connects: once the evictor has
/// registered the program's regions, their first touches come to the fault thread, so the
/// budget holds from here, not from the end of the connection (35-96 ms, in which a program
/// filled up to 116 MiB: docs/benchmarks.md §12).
fn start(config: &RunConfig, uffd: uffd::Uffd, rss: u64) -> Arc<Pager> {
    let slots = config.remote_size / PAGE as u64;
    let throttle = Throttle::new(config.local_memory)
        .unwrap_or_else(|e| fail(&format!("creating the pager's eventfd: {e}")));
    throttle.measured(rss);
    let pager = Arc::new(Pager::new(
        uffd,
        throttle,
        slots,
        config.local_memory,
        usize::try_from(config.min_region).unwrap_or(usize::MAX),
        config.read_ahead.min(MAX_READ_AHEAD),
        std::time::Duration::from_micros(config.poll_us),
        config.standby_pages(),
    ));
    let _ = PAGER.set(pager.clone());
    let p = pager.clone();
    std::thread::Builder::new()
        .name("hm-fault".into())
        .spawn(move || p.fault_loop())
        .unwrap_or_else(|e| fail(&format!("starting the fault thread: {e}")));
    // Nothing is registered before the fault thread runs (`Pager::fault_loop`).
    pager.wait_ready();
    pager
}

/// What the pager reads or opens as the program starts, while it has the rights it was
/// started with: a server that then drops them (memcached's `-u nobody`) may no longer open
/// its own pagemap (root's once the process is not dumpable), the cluster's key or the report
/// file. A failure to read the cluster file or pagemap ends the process only when the pager
/// needs them (the program grew), as before: a short helper that never grows runs as without
/// the pager.
struct Opened {
    cluster: Result<Cluster, String>,
    pagemap: std::io::Result<regions::Pagemap>,
    statm: File,
}

impl Opened {
    fn open(config: &RunConfig) -> Opened {
        let statm = File::open("/proc/self/statm")
            .unwrap_or_else(|e| fail(&format!("opening /proc/self/statm: {e}")));
        Opened {
            cluster: config.load_cluster().map_err(|e| e.to_string()),
            pagemap: regions::Pagemap::open(),
            statm,
        }
    }
}

/// The evictor thread: waits for the program to grow, starts the pager, registers the
/// program's regions, connects, then keeps the program in budget.
fn evictor(config: RunConfig, id: ClientId, uffd: uffd::Uffd, opened: Opened) {
    let Opened {
        cluster,
        pagemap,
        statm,
    } = opened;
    let rss = loop {
        let rss = regions::resident_anon(&statm).unwrap_or(0);
        if rss > config.local_memory / 2 {
            break rss;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    let began = Instant::now();
    let cluster = cluster.unwrap_or_else(|e| fail(&e));
    let pagemap = pagemap.unwrap_or_else(|e| fail(&format!("opening /proc/self/pagemap: {e}")));
    let pager = start(&config, uffd, rss);
    let mut evictor = evict::Evictor::new(&pager, pagemap, statm);
    evictor.rescan();
    // While connecting, faults are held (each at most `throttle::MAX_HOLD`) if the program
    // runs far past its budget: nothing can go out yet.
    pager.throttle.draining(true);
    let front = config
        .open(&cluster, id)
        .unwrap_or_else(|e| fail(&e.to_string()));
    pager.connected(front);
    // No page goes out before the client's threads have started: they may need the fault
    // thread to start (`hooks::wait_pager_threads_started`), and it may need them (the
    // receiver) to fetch.
    hooks::wait_pager_threads_started();
    report("connected", false);
    tracing::info!(
        "connected to the cluster in {} ms; resident {} MiB then, {} MiB now",
        began.elapsed().as_millis(),
        rss >> 20,
        evictor.resident() >> 20
    );
    evictor.run();
}

/// Most connections of the pager a forked child closes (two descriptors per node).
const MAX_SOCKETS: usize = 4096;
/// The pager's connections to the nodes at the last fork, noted by the parent before it
/// forks for the child to close: each descriptor with the device and inode it named then
/// (plain atomics: the child must not take a lock a thread of the parent may have held at
/// the fork).
static SOCKETS: [AtomicI32; MAX_SOCKETS] = [const { AtomicI32::new(-1) }; MAX_SOCKETS];
static SOCKET_DEVS: [AtomicU64; MAX_SOCKETS] = [const { AtomicU64::new(0) }; MAX_SOCKETS];
static SOCKET_INOS: [AtomicU64; MAX_SOCKETS] = [const { AtomicU64::new(0) }; MAX_SOCKETS];
/// How many of [`SOCKETS`] are noted.
static SOCKETS_NOTED: AtomicUsize = AtomicUsize::new(0);

/// The device and inode `fd` names now, if it is open (async-signal-safe: a forked child
/// calls it).
fn file_of(fd: i32) -> Option<(u64, u64)> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes a `stat` into the buffer it is given, which is large enough, and
    // only reads `fd` (any value is allowed: a closed one fails with EBADF).
    let r = unsafe { libc::fstat(fd, st.as_mut_ptr()) };
    if r != 0 {
        return None;
    }
    // SAFETY: fstat succeeded, so it filled the buffer.
    let st = unsafe { st.assume_init() };
    Some((st.st_dev, st.st_ino))
}

extern "C" fn before_fork() {
    if let Some(p) = running() {
        p.before_fork();
        let mut n = 0;
        for fd in p.sockets() {
            let Some((dev, ino)) = file_of(fd) else {
                continue;
            };
            if n == MAX_SOCKETS {
                break;
            }
            SOCKETS[n].store(fd, Ordering::Relaxed);
            SOCKET_DEVS[n].store(dev, Ordering::Relaxed);
            SOCKET_INOS[n].store(ino, Ordering::Relaxed);
            n += 1;
        }
        SOCKETS_NOTED.store(n, Ordering::Release);
    }
}

extern "C" fn after_fork_parent() {
    if let Some(p) = running() {
        p.after_fork();
    }
}

extern "C" fn after_fork_child() {
    DISABLED.store(true, Ordering::Relaxed);
    // The child goes on without the pager, but with a copy of every connection of its
    // client: while one is open, the nodes count the parent's identity as held, and
    // `hydramem run` could not release the parent's memory once the parent ends while the
    // child lives on (a daemon's fork).
    let noted = SOCKETS_NOTED.swap(0, Ordering::Acquire);
    for i in 0..noted {
        let fd = SOCKETS[i].load(Ordering::Relaxed);
        let noted_file = (
            SOCKET_DEVS[i].load(Ordering::Relaxed),
            SOCKET_INOS[i].load(Ordering::Relaxed),
        );
        // Between the note and the fork, the client may have closed a connection and
        // another thread opened something under the same number: only the same socket goes.
        if file_of(fd) != Some(noted_file) {
            continue;
        }
        // SAFETY: `fd` still names the socket of the pager's client it named when the parent
        // noted it (same device and inode), inherited by this child. Nothing in the child
        // uses or drops that client: the pager is disabled here (no thread of it runs in a
        // child, its exit handler returns at once, and its statics are never dropped), so
        // nothing of the child reads, writes or closes this descriptor after this.
        unsafe { libc::close(fd) };
    }
}

extern "C" fn at_exit() {
    if disabled() {
        return;
    }
    if let Some(p) = PAGER.get() {
        p.stop.store(true, Ordering::Relaxed);
        // Faults held back by the throttle go on now, not when their hold times out: no batch
        // starts after this, so holding them would only delay the program's last threads.
        p.throttle.ring();
        // What the report allocates comes from the pager's heap, never from pages that
        // may be out.
        hooks::set_pager_thread(true);
        report("exit", true);
        hooks::set_pager_thread(false);
    }
}

/// Starts the pager if the process was started by `hydramem run`.
fn init() {
    let Ok(value) = std::env::var(ENV) else {
        return;
    };
    let config = RunConfig::from_env(&value).unwrap_or_else(|e| fail(&e.to_string()));
    hooks::look_up_next();
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HYDRAMEM_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .try_init();
    let uffd = uffd::Uffd::new(config.userfaultfd_dev).unwrap_or_else(|e| fail(&e.to_string()));
    let id = ClientId::random();
    let opened = Opened::open(&config);
    // A report that cannot be written is left out, as it always was.
    let report_file = config.report.as_ref().and_then(|path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| tracing::warn!("opening the report file {}: {e}", path.display()))
            .ok()
    });
    let _ = START.set((config.clone(), id, Instant::now(), report_file));
    // SAFETY: handlers that only touch this library's state.
    unsafe {
        libc::pthread_atfork(
            Some(before_fork),
            Some(after_fork_parent),
            Some(after_fork_child),
        );
        libc::atexit(at_exit);
    }
    std::thread::Builder::new()
        .name("hm-evict".into())
        .spawn(move || evictor(config, id, uffd, opened))
        .unwrap_or_else(|e| fail(&format!("starting the evictor: {e}")));
}

extern "C" fn constructor() {
    hooks::set_pager_thread(true);
    init();
    hooks::set_pager_thread(false);
}

/// Runs `constructor` when the library is loaded, before the program's main.
#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = constructor;
