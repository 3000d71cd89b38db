//! The embedded cluster: N memory nodes on loopback as child processes.
//!
//! Used by `hydramem up`, `hydramem demo` and the integration tests. Each node is a real
//! `hydramem node` process listening on port 0; it announces its address on its first stdout
//! line, which is how the parent learns it. Children get `PR_SET_PDEATHSIG`, so they die with
//! the parent even when it is SIGKILLed; dropping an [`EmbeddedCluster`] kills and reaps them.
//! Nodes can be killed, paused, resumed and restarted individually (fault injection); a
//! restarted node listens on its old address and starts empty, as a rebooted machine would.
//!
//! Every node is started with `--cluster FILE`, the membership it resolves regeneration
//! sources from. The addresses are known only once every node has announced its own, so the
//! file is written then, before [`EmbeddedCluster::start`] returns (nodes read it lazily, at
//! their first REGEN). It is the caller's file when [`EmbeddedOptions::cluster_file`] names
//! one, else a file in a private temporary directory that is removed with the cluster. With
//! membership on etcd ([`EmbeddedOptions::etcd`]) the file is first written before the nodes
//! start, with its `[etcd]` table and no node, so that each node registers itself there.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::{Cluster, ClusterError, NodeEntry};

/// How long a node process may take from its start to announcing its address. A node
/// announces right after binding its socket, before it serves or sizes anything, so only a
/// hung one takes longer.
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(30);

/// The path to run this very program again: `/proc/self/exe`, which still names the running
/// binary after it was replaced on disk (a rebuild), unlike the path `current_exe` returns.
pub fn self_exe() -> std::io::Result<PathBuf> {
    let proc = PathBuf::from("/proc/self/exe");
    if proc.exists() {
        Ok(proc)
    } else {
        std::env::current_exe()
    }
}

/// How to start the nodes.
#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    /// The `hydramem` binary to run.
    pub binary: PathBuf,
    /// Number of nodes.
    pub nodes: usize,
    /// Slab size of the cluster.
    pub slab_size: u64,
    /// Capacity of each node in bytes.
    pub capacity: u64,
    /// Extra arguments for every node (e.g. `--log warn`).
    pub extra_args: Vec<String>,
    /// The cluster file to write and to give every node as `--cluster`; `None`: one in a
    /// private temporary directory, removed when the cluster is dropped (a cluster that is
    /// never dropped, e.g. kept for the life of the process, leaves it behind: give it a file).
    pub cluster_file: Option<PathBuf>,
    /// The cluster key's file: every node is started with it, the cluster file names it and
    /// the cluster carries the key, so its clients prove it (see [`crate::auth`]); `None`: a
    /// cluster without a key.
    pub key_file: Option<PathBuf>,
    /// A TLS member directory (see [`crate::tls`]): every node is started with it, the
    /// cluster file names it and the cluster carries it, so its clients connect with TLS;
    /// `None`: plain TCP.
    pub tls_dir: Option<PathBuf>,
    /// Membership in etcd: the cluster file gets this `[etcd]` table before the nodes start,
    /// so that every node registers there (see [`crate::membership`]).
    pub etcd: Option<crate::membership::EtcdConfig>,
}

impl EmbeddedOptions {
    /// `nodes` nodes of `binary` with slabs of `slab_size` and `capacity` bytes each, that log
    /// errors only and take injected faults ([`EmbeddedCluster::inject`]): what the failure
    /// benchmarks and experiments start.
    pub fn fault_injecting(
        binary: PathBuf,
        nodes: usize,
        slab_size: u64,
        capacity: u64,
    ) -> EmbeddedOptions {
        EmbeddedOptions {
            etcd: None,
            binary,
            nodes,
            slab_size,
            capacity,
            extra_args: vec![
                "--log".into(),
                "error".into(),
                "--allow-fault-injection".into(),
            ],
            cluster_file: None,
            key_file: None,
            tls_dir: None,
        }
    }
}

/// Errors starting or controlling the embedded cluster.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    /// A node process could not be started or did not announce its address.
    #[error("memory node {node} failed to start ({binary}): {reason}")]
    Start {
        /// Node index.
        node: usize,
        /// The binary run.
        binary: String,
        /// Why.
        reason: String,
    },
    /// A signal could not be sent.
    #[error("cannot signal memory node {node}: {source}")]
    Signal {
        /// Node index.
        node: usize,
        /// The OS error.
        source: std::io::Error,
    },
    /// The cluster key could not be read.
    #[error(transparent)]
    Key(#[from] crate::auth::KeyError),
    /// The TLS member directory could not be used.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// The private directory for the cluster file could not be made.
    #[error(
        "cannot create a private directory for the cluster file in {dir}: {source}; \
         set TMPDIR to a writable directory or pass a cluster file"
    )]
    TempDir {
        /// The parent directory.
        dir: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The cluster file the nodes read their membership from could not be written.
    #[error(
        "memory nodes started, but {0}; they were stopped: name a file in a writable directory"
    )]
    ClusterFile(ClusterError),
}

/// How a node process ended, as [`EmbeddedCluster::try_wait_any`] found it.
#[derive(Debug, Clone, Copy)]
pub struct NodeExit {
    /// Node index (its id in the cluster file).
    pub node: usize,
    /// The address it listened on.
    pub addr: SocketAddr,
    /// Its process id.
    pub pid: u32,
    /// Its exit status.
    pub status: ExitStatus,
    /// How long it ran since its (re)start.
    pub ran: Duration,
}

/// "exited with status 3", "killed by signal 9 (SIGKILL)": how a process ended, in words.
pub fn describe_exit(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exited with status {code}");
    }
    let Some(sig) = status.signal() else {
        return status.to_string();
    };
    let core = if status.core_dumped() {
        ", core dumped"
    } else {
        ""
    };
    match signal_name(sig) {
        Some(name) => format!("killed by signal {sig} ({name}){core}"),
        None => format!("killed by signal {sig}{core}"),
    }
}

/// The name of a common signal.
fn signal_name(sig: i32) -> Option<&'static str> {
    const NAMES: [(i32, &str); 15] = [
        (libc::SIGHUP, "SIGHUP"),
        (libc::SIGINT, "SIGINT"),
        (libc::SIGQUIT, "SIGQUIT"),
        (libc::SIGILL, "SIGILL"),
        (libc::SIGTRAP, "SIGTRAP"),
        (libc::SIGABRT, "SIGABRT"),
        (libc::SIGBUS, "SIGBUS"),
        (libc::SIGFPE, "SIGFPE"),
        (libc::SIGKILL, "SIGKILL"),
        (libc::SIGUSR1, "SIGUSR1"),
        (libc::SIGSEGV, "SIGSEGV"),
        (libc::SIGUSR2, "SIGUSR2"),
        (libc::SIGPIPE, "SIGPIPE"),
        (libc::SIGALRM, "SIGALRM"),
        (libc::SIGTERM, "SIGTERM"),
    ];
    NAMES.iter().find(|(n, _)| *n == sig).map(|(_, name)| *name)
}

struct NodeProc {
    child: Option<Child>,
    entry: NodeEntry,
    started: Instant,
}

/// Running nodes and the cluster file that describes them.
pub struct EmbeddedCluster {
    options: EmbeddedOptions,
    nodes: Vec<NodeProc>,
    cluster: Cluster,
    /// The file every node is given as `--cluster` (absolute: nodes may resolve it later).
    cluster_file: PathBuf,
    /// The private directory holding `cluster_file` when the caller gave none.
    temp_dir: Option<PathBuf>,
}

/// Makes a directory only this user can enter, with a name no other cluster uses.
pub(crate) fn private_temp_dir() -> Result<PathBuf, EmbeddedError> {
    let parent = std::env::temp_dir();
    let mut attempt = 0;
    loop {
        let dir = parent.join(format!(
            "hydramem-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 8 => attempt += 1,
            Err(source) => {
                return Err(EmbeddedError::TempDir {
                    dir: parent.display().to_string(),
                    source,
                })
            }
        }
    }
}

impl EmbeddedCluster {
    /// Starts the nodes, waits until each has announced its address, and writes the cluster
    /// file they were given.
    pub fn start(options: EmbeddedOptions) -> Result<EmbeddedCluster, EmbeddedError> {
        let (cluster_file, temp_dir) = match &options.cluster_file {
            // Absolute, so that it names the same file whatever directory reads it.
            Some(p) => (std::path::absolute(p).unwrap_or_else(|_| p.clone()), None),
            None => {
                let dir = private_temp_dir()?;
                (dir.join("cluster.toml"), Some(dir))
            }
        };
        // Absolute, like the cluster file, and loaded now: a key that cannot be read stops
        // the start before any node runs.
        let absolute = |p: &PathBuf| std::path::absolute(p).unwrap_or_else(|_| p.clone());
        let key_file = options.key_file.as_ref().map(absolute);
        let key = key_file
            .as_deref()
            .map(crate::auth::ClusterKey::load)
            .transpose()?;
        let tls_dir = options.tls_dir.as_ref().map(absolute);
        let tls = tls_dir.as_deref().map(crate::tls::Tls::load).transpose()?;
        // From here on, dropping `c` (an error below) stops the nodes started so far and
        // removes the private directory.
        let mut c = EmbeddedCluster {
            cluster: Cluster {
                etcd: None,
                slab_size: options.slab_size,
                placement: None,
                key_file,
                key,
                tls_dir,
                tls,
                nodes: Vec::new(),
            },
            options,
            nodes: Vec::new(),
            cluster_file,
            temp_dir,
        };
        // The nodes read the file at start for its [etcd] table: write it now with etcd, and
        // without, remove what an earlier run left there (it is rewritten once the nodes are
        // up), so that no node registers in an etcd of a run that is over.
        if let Some(e) = &c.options.etcd {
            c.cluster.etcd = Some(e.clone());
            c.cluster
                .save(&c.cluster_file)
                .map_err(EmbeddedError::ClusterFile)?;
        } else {
            let _ = std::fs::remove_file(&c.cluster_file);
        }
        for i in 0..c.options.nodes {
            let id = u32::try_from(i).map_err(|_| EmbeddedError::Start {
                node: i,
                binary: c.options.binary.display().to_string(),
                reason: "more nodes than there are node ids (2^32); start fewer".into(),
            })?;
            let (child, addr) = c.spawn(i, "127.0.0.1:0")?;
            let entry = NodeEntry {
                id,
                addr,
                domain: None,
            };
            c.cluster.nodes.push(entry.clone());
            c.nodes.push(NodeProc {
                child: Some(child),
                entry,
                started: Instant::now(),
            });
        }
        c.cluster
            .save(&c.cluster_file)
            .map_err(EmbeddedError::ClusterFile)?;
        Ok(c)
    }

    fn spawn(
        &self,
        i: usize,
        listen: &str,
    ) -> Result<(Child, std::net::SocketAddr), EmbeddedError> {
        let o = &self.options;
        let err = |reason: String| EmbeddedError::Start {
            node: i,
            binary: o.binary.display().to_string(),
            reason,
        };
        let mut cmd = Command::new(&o.binary);
        cmd.arg("node")
            .args(["--listen", listen])
            .args(["--id", &i.to_string()])
            .args(["--capacity", &o.capacity.to_string()])
            .args(["--slab-size", &o.slab_size.to_string()])
            .arg("--cluster")
            .arg(&self.cluster_file)
            .arg("--announce")
            .args(
                self.cluster
                    .key_file
                    .iter()
                    .flat_map(|k| [std::ffi::OsStr::new("--cluster-key"), k.as_os_str()]),
            )
            .args(
                self.cluster
                    .tls_dir
                    .iter()
                    .flat_map(|d| [std::ffi::OsStr::new("--tls"), d.as_os_str()]),
            )
            .args(&o.extra_args)
            // Every node would try to serve metrics on the same address.
            .env_remove("HYDRAMEM_METRICS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // SAFETY: the closure runs in the forked child before exec and only calls prctl and
        // getppid, which are async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                // Die with the parent, even if it is SIGKILLed.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent may have died before prctl took effect.
                if libc::getppid() == 1 {
                    libc::_exit(1);
                }
                Ok(())
            })
        };
        let mut child = cmd.spawn().map_err(|e| err(e.to_string()))?;
        let stdout = child.stdout.take().expect("piped");
        let announcement = read_announcement(stdout, ANNOUNCE_TIMEOUT);
        let Some((read, line)) = announcement else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(err(format!(
                "it did not announce its address within {} s, so it was killed; run it alone \
                 (`hydramem node --listen {listen}`) to see where it stops",
                ANNOUNCE_TIMEOUT.as_secs()
            )));
        };
        let announced = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|a| a.parse().ok());
        if let (Ok(_), Some(addr)) = (&read, announced) {
            return Ok((child, addr));
        }
        let _ = child.kill();
        let status = child.wait();
        Err(err(match (read, status) {
            (Err(e), _) => format!("cannot read its announcement: {e}"),
            (Ok(0), Ok(st)) => format!(
                "it {} before listening on {listen} (its log above says why)",
                describe_exit(st)
            ),
            _ => format!(
                "expected 'listening ADDR' on its stdout, got {:?}",
                line.trim()
            ),
        }))
    }

    /// The cluster description (addresses of the running nodes).
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// The cluster file the nodes were given as `--cluster` (written by [`Self::start`]).
    pub fn cluster_file(&self) -> &Path {
        &self.cluster_file
    }

    /// Writes a copy of the cluster file to `path`.
    pub fn write_cluster_file(&self, path: &Path) -> Result<(), ClusterError> {
        self.cluster.save(path)
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Process id of node `i`, if running.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].child.as_ref().map(|c| c.id())
    }

    /// Number of node processes running (not yet seen to exit).
    pub fn running(&self) -> usize {
        self.nodes.iter().filter(|n| n.child.is_some()).count()
    }

    fn signal(&self, i: usize, sig: i32) -> Result<(), EmbeddedError> {
        let Some(pid) = self.pid(i) else {
            return Ok(());
        };
        // SAFETY: kill(2) with a pid we spawned and have not reaped; no memory is involved.
        if unsafe { libc::kill(pid as i32, sig) } != 0 {
            return Err(EmbeddedError::Signal {
                node: i,
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// SIGKILLs node `i` and reaps it (its memory, and the slabs in it, are gone).
    pub fn kill(&mut self, i: usize) -> Result<(), EmbeddedError> {
        self.signal(i, libc::SIGKILL)?;
        if let Some(mut c) = self.nodes[i].child.take() {
            let _ = c.wait();
        }
        Ok(())
    }

    /// SIGSTOPs node `i`: it stops answering but keeps its connections and memory.
    pub fn pause(&self, i: usize) -> Result<(), EmbeddedError> {
        self.signal(i, libc::SIGSTOP)
    }

    /// SIGCONTs a paused node.
    pub fn resume(&self, i: usize) -> Result<(), EmbeddedError> {
        self.signal(i, libc::SIGCONT)
    }

    /// Starts node `i` again on its old address, empty (SIGKILLing it first if it runs);
    /// returns its new process id.
    pub fn restart(&mut self, i: usize) -> Result<u32, EmbeddedError> {
        self.kill(i)?;
        let listen = self.nodes[i].entry.addr.to_string();
        let (child, _) = self.spawn(i, &listen)?;
        let pid = child.id();
        self.nodes[i].child = Some(child);
        self.nodes[i].started = Instant::now();
        Ok(pid)
    }

    /// Injects a fault into node `i` (its nodes must run with `--allow-fault-injection`).
    pub fn inject(&self, i: usize, fault: crate::wire::Fault) -> Result<(), crate::rpc::RpcError> {
        crate::rpc::inject(
            self.nodes[i].entry.addr,
            fault,
            &crate::rpc::Access::of(&self.cluster),
            std::time::Duration::from_secs(5),
        )
    }

    /// Reaps one node that exited on its own (or was killed from outside), if any: which,
    /// how, and after how long. Does not block.
    pub fn try_wait_any(&mut self) -> Option<NodeExit> {
        for (i, n) in self.nodes.iter_mut().enumerate() {
            if let Some(c) = n.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    let exit = NodeExit {
                        node: i,
                        addr: n.entry.addr,
                        pid: c.id(),
                        status,
                        ran: n.started.elapsed(),
                    };
                    n.child = None;
                    return Some(exit);
                }
            }
        }
        None
    }

    /// Stops every node: SIGTERM, a short grace period, then SIGKILL.
    pub fn shutdown(&mut self) {
        for i in 0..self.nodes.len() {
            let _ = self.resume(i);
            let _ = self.signal(i, libc::SIGTERM);
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                loop {
                    match c.try_wait() {
                        Ok(Some(_)) => break,
                        Ok(None) if std::time::Instant::now() < deadline => {
                            std::thread::sleep(std::time::Duration::from_millis(10))
                        }
                        _ => {
                            let _ = c.kill();
                            let _ = c.wait();
                            break;
                        }
                    }
                }
            }
        }
    }
}

impl Drop for EmbeddedCluster {
    fn drop(&mut self) {
        self.shutdown();
        if let Some(dir) = &self.temp_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The first line `out` gives within `timeout` and how reading it ended, or `None` if none
/// came in time. It is read on a thread of its own, which then keeps draining `out` so the
/// writer never blocks on a full pipe; a node that hangs before listening thus fails its start
/// instead of hanging `up`.
fn read_announcement<R: std::io::Read + Send + 'static>(
    out: R,
    timeout: Duration,
) -> Option<(std::io::Result<usize>, String)> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(out);
        let mut line = String::new();
        let read = reader.read_line(&mut line);
        let _ = tx.send((read, line));
        let mut sink = String::new();
        while reader.read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
            sink.clear();
        }
    });
    rx.recv_timeout(timeout).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exits_are_described_by_status_and_signal() {
        use std::os::unix::process::ExitStatusExt;
        let st = |raw| std::process::ExitStatus::from_raw(raw);
        assert_eq!(describe_exit(st(3 << 8)), "exited with status 3");
        assert_eq!(describe_exit(st(9)), "killed by signal 9 (SIGKILL)");
        assert_eq!(
            describe_exit(st(11 | 0x80)),
            "killed by signal 11 (SIGSEGV), core dumped"
        );
        assert_eq!(describe_exit(st(64)), "killed by signal 64");
    }

    #[test]
    fn a_node_silent_before_listening_times_out_and_one_that_announces_is_read() {
        let (silent, _keep_open) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(read_announcement(silent, Duration::from_millis(50)).is_none());

        let (out, mut node) = std::os::unix::net::UnixStream::pair().unwrap();
        use std::io::Write;
        node.write_all(b"listening 127.0.0.1:7000\nmore output\n")
            .unwrap();
        let (read, line) = read_announcement(out, Duration::from_secs(60)).unwrap();
        assert_eq!(read.unwrap(), line.len());
        assert_eq!(line, "listening 127.0.0.1:7000\n");
        // The rest is drained: the writer can go on writing more than a pipe holds.
        node.write_all(&vec![b'x'; 1 << 20]).unwrap();
    }
}
