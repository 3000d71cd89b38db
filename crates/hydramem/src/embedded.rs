//! The embedded cluster: N memory nodes on loopback as child processes.
//!
//! Used by `hydramem up`, `hydramem demo` and the integration tests. Each node is a real
//! `hydramem node` process listening on port 0; it announces its address on its first stdout
//! line, which is how the parent learns it. Children get `PR_SET_PDEATHSIG`, so they die with
//! the parent even when it is SIGKILLed; dropping an [`EmbeddedCluster`] kills and reaps them.
//! Nodes can be killed, paused, resumed and restarted individually (fault injection).

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::cluster::{Cluster, NodeEntry};

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
}

struct NodeProc {
    child: Option<Child>,
    entry: NodeEntry,
}

/// Running nodes and the cluster file that describes them.
pub struct EmbeddedCluster {
    options: EmbeddedOptions,
    nodes: Vec<NodeProc>,
    cluster: Cluster,
}

impl EmbeddedCluster {
    /// Starts the nodes and waits until each has announced its address.
    pub fn start(options: EmbeddedOptions) -> Result<EmbeddedCluster, EmbeddedError> {
        let mut c = EmbeddedCluster {
            cluster: Cluster {
                slab_size: options.slab_size,
                placement: None,
                nodes: Vec::new(),
            },
            options,
            nodes: Vec::new(),
        };
        for i in 0..c.options.nodes {
            let (child, addr) = c.spawn(i, "127.0.0.1:0")?;
            let entry = NodeEntry {
                id: i as u32,
                addr,
                domain: None,
            };
            c.cluster.nodes.push(entry.clone());
            c.nodes.push(NodeProc {
                child: Some(child),
                entry,
            });
        }
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
            .arg("--announce")
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
        let mut line = String::new();
        let mut reader = BufReader::new(stdout);
        reader
            .read_line(&mut line)
            .map_err(|e| err(e.to_string()))?;
        // Keep draining stdout so the node never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut sink = String::new();
            while reader.read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
                sink.clear();
            }
        });
        let addr = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| {
                let _ = child.kill();
                err(format!(
                    "expected 'listening ADDR' on stdout, got {:?}",
                    line.trim()
                ))
            })?;
        Ok((child, addr))
    }

    /// The cluster description (addresses of the running nodes).
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// Writes the cluster file.
    pub fn write_cluster_file(&self, path: &Path) -> Result<(), crate::cluster::ClusterError> {
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

    /// Starts a killed node again on its old address, empty.
    pub fn restart(&mut self, i: usize) -> Result<(), EmbeddedError> {
        self.kill(i)?;
        let listen = self.nodes[i].entry.addr.to_string();
        let (child, _) = self.spawn(i, &listen)?;
        self.nodes[i].child = Some(child);
        Ok(())
    }

    /// Injects a fault into node `i` (its nodes must run with `--allow-fault-injection`).
    pub fn inject(&self, i: usize, fault: crate::wire::Fault) -> Result<(), String> {
        crate::status::inject(
            self.nodes[i].entry.addr,
            fault,
            std::time::Duration::from_secs(5),
        )
    }

    /// Waits for any node to exit on its own; returns its index and status.
    pub fn try_wait_any(&mut self) -> Option<(usize, std::process::ExitStatus)> {
        for (i, n) in self.nodes.iter_mut().enumerate() {
            if let Some(c) = n.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    n.child = None;
                    return Some((i, st));
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
    }
}
