//! An etcd server as a child process, for `hydramem up --etcd` and the tests: the local
//! default of membership on etcd, one member on loopback, its data in a private directory.
//!
//! The binary is `etcd` on the PATH (Debian's etcd-server; `scripts/setup` installs it) or
//! the one `HYDRAMEM_ETCD` names. Its client and peer ports are picked free on loopback.
//! [`EtcdServer::start`] returns once etcd answers a request; the child dies with its parent
//! (`PR_SET_PDEATHSIG`), and dropping the server kills it and removes its data. It can be
//! killed and started again on the same ports and data (the tests' etcd outage).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::etcd::EtcdRegistry;
use super::{EtcdConfig, Registry};

/// How long etcd may take to answer its first request.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Errors starting etcd.
#[derive(Debug, thiserror::Error)]
pub enum EtcdServerError {
    /// It could not be started or did not become ready.
    #[error(
        "cannot start etcd ({binary}): {reason}; install etcd (Debian: etcd-server, which \
         scripts/setup installs) or name its binary in HYDRAMEM_ETCD"
    )]
    Start {
        /// The binary tried.
        binary: String,
        /// What went wrong.
        reason: String,
    },
}

/// A running etcd (see the module doc).
pub struct EtcdServer {
    child: Option<Child>,
    binary: PathBuf,
    dir: PathBuf,
    client_port: u16,
    peer_port: u16,
}

impl EtcdServer {
    /// Starts etcd on free loopback ports with its data in a new private directory.
    pub fn start() -> Result<EtcdServer, EtcdServerError> {
        let binary = std::env::var_os("HYDRAMEM_ETCD")
            .filter(|v| !v.is_empty())
            .map_or_else(|| PathBuf::from("etcd"), PathBuf::from);
        let err = |reason: String| EtcdServerError::Start {
            binary: binary.display().to_string(),
            reason,
        };
        let dir = crate::embedded::private_temp_dir().map_err(|e| err(e.to_string()))?;
        let free = || -> std::io::Result<u16> {
            Ok(std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port())
        };
        let client_port = free().map_err(|e| err(format!("no free port: {e}")))?;
        let peer_port = free().map_err(|e| err(format!("no free port: {e}")))?;
        let mut s = EtcdServer {
            child: None,
            binary,
            dir,
            client_port,
            peer_port,
        };
        s.restart()?;
        Ok(s)
    }

    /// The client URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// A membership configuration on this etcd with lease `ttl` seconds.
    pub fn config(&self, lease_ttl: u64) -> EtcdConfig {
        EtcdConfig {
            lease_ttl,
            ..EtcdConfig::new(vec![self.endpoint()])
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills etcd (SIGKILL), as a crash would; its data stays for [`EtcdServer::restart`].
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts etcd (again) on its ports and data, and waits until it answers.
    pub fn restart(&mut self) -> Result<(), EtcdServerError> {
        self.kill();
        let err = |reason: String| EtcdServerError::Start {
            binary: self.binary.display().to_string(),
            reason,
        };
        let (client, peer) = (
            self.endpoint(),
            format!("http://127.0.0.1:{}", self.peer_port),
        );
        let log = std::fs::File::create(self.dir.join("etcd.log"))
            .map_err(|e| err(format!("cannot create its log: {e}")))?;
        let log2 = log
            .try_clone()
            .map_err(|e| err(format!("cannot share its log: {e}")))?;
        let mut cmd = Command::new(&self.binary);
        cmd.args(["--name", "hydramem"])
            .arg("--data-dir")
            .arg(self.dir.join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("hydramem={peer}")])
            .args(["--logger", "zap", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        // SAFETY: the closure runs in the forked child before exec and only calls prctl,
        // which is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        };
        self.child = Some(cmd.spawn().map_err(|e| err(e.to_string()))?);
        let cfg = self.config(10);
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last = String::new();
        while Instant::now() < deadline {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(Child::try_wait) {
                let log = std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                return Err(err(format!("it exited ({st}): {}", tail.join(" | "))));
            }
            match EtcdRegistry::connect(&cfg).and_then(|r| r.list("/").map(drop)) {
                Ok(()) => return Ok(()),
                Err(e) => last = e.to_string(),
            }
        }
        Err(err(format!(
            "it did not answer within {} s: {last}",
            READY_TIMEOUT.as_secs()
        )))
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
