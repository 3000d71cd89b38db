//! `hydramem up` as an operator runs it: when node processes die the others keep serving and
//! `up` says which died and how; with `--restart always` a dead node comes back on its old
//! address, empty, with a growing backoff; a restart that cannot listen is retried. Every page
//! a client wrote reads back exactly through all of it. The test reads `up`'s own listing (the
//! pids it prints) and its stdout lines, as a person would.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hydramem::bench::fill_page;
use hydramem::client::{ClientConfig, RemoteMemory};
use hydramem::cluster::Cluster;
use hydramem::PAGE_SIZE;

const BIN: &str = env!("CARGO_BIN_EXE_hydramem");

/// How long any one event may take to show.
const PATIENCE: Duration = Duration::from_secs(30);

/// One line of `up`'s listing: `  node   3  127.0.0.1:40857  pid 12345`.
#[derive(Debug, Clone, Copy)]
struct Listed {
    id: u32,
    addr: SocketAddr,
    pid: i32,
}

/// A running `hydramem up` and every line it has printed.
struct Up {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
    dir: PathBuf,
    file: PathBuf,
    nodes: Vec<Listed>,
}

impl Up {
    /// Starts `up` with `nodes` port-0 nodes and waits for its listing.
    fn start(name: &str, nodes: usize, restart: &str) -> Up {
        let dir = std::env::temp_dir().join(format!("hm-up-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("cluster.toml");
        let mut child = Command::new(BIN)
            .args(["up", "--nodes", &nodes.to_string()])
            .args(["--slab-size", "1MiB", "--capacity", "64MiB"])
            .args(["--restart", restart, "--log", "error", "--cluster"])
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = channel();
        let out = BufReader::new(child.stdout.take().unwrap());
        std::thread::spawn(move || {
            for l in out.lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        let mut up = Up {
            child,
            lines,
            seen: Vec::new(),
            dir,
            file,
            nodes: Vec::new(),
        };
        up.wait_for("the end of the listing", |l| {
            l.contains("Ctrl-C stops them all")
        });
        up.nodes = up.seen.iter().filter_map(|l| parse_listed(l)).collect();
        assert_eq!(up.nodes.len(), nodes, "listing: {:#?}", up.seen);
        up
    }

    /// The first line printed so far or from now on that `matches`; fails after [`PATIENCE`]
    /// or if `up` ends first, showing everything it printed.
    fn wait_for(&mut self, what: &str, matches: impl Fn(&str) -> bool) -> String {
        if let Some(l) = self.seen.iter().find(|l| matches(l)) {
            return l.clone();
        }
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if matches(&l) {
                        return l;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!(
                        "no {what} within {PATIENCE:?}; up printed:\n{}",
                        self.printed()
                    )
                }
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "up ended ({:?}) before {what}; it printed:\n{}",
                    self.child.try_wait(),
                    self.printed()
                ),
            }
        }
    }

    fn printed(&self) -> String {
        self.seen.join("\n")
    }

    fn node(&self, id: u32) -> Listed {
        *self.nodes.iter().find(|n| n.id == id).unwrap()
    }

    fn assert_running(&mut self) {
        let st = self.child.try_wait().unwrap();
        assert!(
            st.is_none(),
            "up exited ({st:?}); it printed:\n{}",
            self.printed()
        );
    }

    /// SIGTERM: `up` stops every node, removes the cluster file and exits 0.
    fn stop(&mut self, running: usize) {
        signal(self.child.id() as i32, libc::SIGTERM);
        let total = self.nodes.len();
        let line = format!("stopped {running} memory nodes (of {total})");
        self.wait_for(&line, |l| l == line);
        let st = self.child.wait().unwrap();
        assert!(st.success(), "up exited with {st}");
        assert!(!self.file.exists(), "cluster file left behind");
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn parse_listed(line: &str) -> Option<Listed> {
    let w: Vec<&str> = line.split_whitespace().collect();
    match w[..] {
        ["node", id, addr, "pid", pid] => Some(Listed {
            id: id.parse().ok()?,
            addr: addr.parse().ok()?,
            pid: pid.parse().ok()?,
        }),
        _ => None,
    }
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a process this test started (up) or that up listed as its child.
    let r = unsafe { libc::kill(pid, sig) };
    assert_eq!(
        r,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

/// A death report of the node as listed: `node 3 at ADDR (pid N) died: HOW after ...`.
fn death_of(n: Listed) -> impl Fn(&str) -> bool {
    let head = format!("node {} at {} (pid {}) died: ", n.id, n.addr, n.pid);
    move |l: &str| l.starts_with(&head)
}

/// The pid in a "restarted" line (`... pid 12345, empty: ...`).
fn restarted_pid(line: &str) -> i32 {
    let rest = line
        .split(", pid ")
        .nth(1)
        .unwrap_or_else(|| panic!("{line}"));
    rest.split(',').next().unwrap().parse().unwrap()
}

const PAGES: u64 = 300;
const SEED: u64 = 12;

fn connect(up: &Up) -> Arc<RemoteMemory> {
    let cluster = Cluster::load(&up.file).unwrap();
    let listed: Vec<_> = up.nodes.iter().map(|n| (n.id, n.addr)).collect();
    let filed: Vec<_> = cluster.nodes.iter().map(|n| (n.id, n.addr)).collect();
    assert_eq!(listed, filed, "the listing and the cluster file disagree");
    let size = PAGES * PAGE_SIZE as u64;
    RemoteMemory::connect(&cluster, ClientConfig::new(common::HYDRA, size)).unwrap()
}

fn write_all(mem: &RemoteMemory) {
    let mut page = [0u8; PAGE_SIZE];
    for p in 0..PAGES {
        fill_page(&mut page, SEED, p, 1);
        mem.write_page(p * PAGE_SIZE as u64, &page)
            .unwrap_or_else(|e| panic!("write of page {p}: {e}"));
    }
}

fn check_all(mem: &RemoteMemory) {
    let (mut page, mut want) = ([0u8; PAGE_SIZE], [0u8; PAGE_SIZE]);
    for p in 0..PAGES {
        mem.read_page(p * PAGE_SIZE as u64, &mut page)
            .unwrap_or_else(|e| panic!("read of page {p}: {e}"));
        fill_page(&mut want, SEED, p, 1);
        assert!(page == want, "page {p} does not read back as written");
    }
}

fn answers(addr: SocketAddr) -> Result<u32, String> {
    hydramem::status::fetch(addr, &hydramem::rpc::Access::open(), Duration::from_secs(5))
        .map(|s| s.node_id)
        .map_err(|e| e.to_string())
}

#[test]
fn survivors_keep_serving_when_two_nodes_are_killed() {
    let mut up = Up::start("never", 12, "never");
    let mem = connect(&up);
    write_all(&mem);
    // Two members of the coding group of every page written: each page loses two splits.
    let g = mem.group_of(0).unwrap();
    let victims = [up.node(g.nodes[0].into()), up.node(g.nodes[9].into())];
    for v in victims {
        signal(v.pid, libc::SIGKILL);
    }
    let mut counts = Vec::new();
    for v in victims {
        let l = up.wait_for(&format!("the death of node {}", v.id), death_of(v));
        assert!(
            l.contains("died: killed by signal 9 (SIGKILL) after"),
            "{l}"
        );
        assert!(
            l.ends_with("; it stays down (restart policy: never)"),
            "{l}"
        );
        counts.push(if l.contains("; 11 of 12 nodes running;") {
            11
        } else {
            assert!(l.contains("; 10 of 12 nodes running;"), "{l}");
            10
        });
    }
    counts.sort();
    assert_eq!(counts, [10, 11], "{}", up.printed());
    up.assert_running();
    for n in &up.nodes {
        let dead = victims.iter().any(|v| v.id == n.id);
        assert_eq!(answers(n.addr).is_err(), dead, "node {}", n.id);
    }
    check_all(&mem);
    drop(mem);
    up.stop(10);
}

#[test]
fn restart_always_brings_a_killed_node_back_empty() {
    let mut up = Up::start("always", 11, "always");
    let mem = connect(&up);
    write_all(&mem);
    let v = up.node(mem.group_of(0).unwrap().nodes[2].into());
    signal(v.pid, libc::SIGKILL);
    let l = up.wait_for("the death report", death_of(v));
    assert!(
        l.contains("killed by signal 9 (SIGKILL)")
            && l.contains("; 10 of 11 nodes running; restarting it in 0.1 s"),
        "{l}"
    );
    let head = format!("node {} restarted on {} (restart 1), pid ", v.id, v.addr);
    let l = up.wait_for("the restart", |l| l.starts_with(&head));
    assert!(l.ends_with("; 11 of 11 nodes running"), "{l}");
    let pid = restarted_pid(&l);
    assert_ne!(pid, v.pid);
    assert_eq!(answers(v.addr), Ok(v.id));
    // Dying again at once doubles the delay before the next restart.
    let again = Listed { pid, ..v };
    signal(pid, libc::SIGKILL);
    let l = up.wait_for("the second death report", death_of(again));
    assert!(l.ends_with("; restarting it in 0.2 s"), "{l}");
    let head = format!("node {} restarted on {} (restart 2), pid ", v.id, v.addr);
    up.wait_for("the second restart", |l| l.starts_with(&head));
    assert_eq!(answers(v.addr), Ok(v.id));
    check_all(&mem);
    drop(mem);
    up.stop(11);
}

#[test]
fn a_restart_that_cannot_listen_is_tried_again() {
    let mut up = Up::start("busy", 2, "always");
    let v = up.node(1);
    let up_pid = up.child.id() as i32;
    // Hold `up` still while the node dies and its port is taken, so its restart must fail.
    signal(up_pid, libc::SIGSTOP);
    signal(v.pid, libc::SIGKILL);
    let deadline = Instant::now() + PATIENCE;
    let squatter = loop {
        match std::net::TcpListener::bind(v.addr) {
            Ok(l) => break l,
            Err(e) => assert!(Instant::now() < deadline, "{} stays taken: {e}", v.addr),
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    signal(up_pid, libc::SIGCONT);
    let l = up.wait_for("the failed restart", |l| {
        l.starts_with("node 1 not restarted (attempt 1): ")
    });
    assert!(
        l.contains(&format!("before listening on {}", v.addr))
            && l.ends_with("; trying again in 0.2 s"),
        "{l}"
    );
    drop(squatter);
    let head = format!("node 1 restarted on {} (restart 1), pid ", v.addr);
    up.wait_for("the restart once the port is free", |l| {
        l.starts_with(&head)
    });
    assert_eq!(answers(v.addr), Ok(1));
    up.stop(2);
}

#[test]
fn a_bad_restart_policy_is_refused_clearly() {
    let dir = std::env::temp_dir().join(format!("hm-up-{}-bad", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("cluster.toml");
    let out = Command::new(BIN)
        .args(["up", "--restart", "sometimes", "--cluster"])
        .arg(&file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("invalid value 'sometimes' for '--restart <RESTART>'")
            && err.contains("[possible values: never, always]"),
        "{err}"
    );
    assert!(!file.exists(), "up started nodes anyway");
    let _ = std::fs::remove_dir_all(&dir);
}
