//! The command line as a user runs it: `up` starts nodes and writes the cluster file, `status`
//! reads it, `up` cleans up on SIGTERM and its nodes die with it on SIGKILL, `demo` finishes on
//! its own, and bad input gets a clear error.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hydramem::cluster::Cluster;

const BIN: &str = env!("CARGO_BIN_EXE_hydramem");

fn start_up(nodes: usize, file: &Path) -> Child {
    let mut child = Command::new(BIN)
        .args([
            "up",
            "--nodes",
            &nodes.to_string(),
            "--slab-size",
            "1MiB",
            "--capacity",
            "8MiB",
        ])
        .arg("--cluster")
        .arg(file)
        .args(["--log", "warn"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the "Ctrl-C stops them all." line: the cluster file is written by then.
    let out = child.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    for l in lines.by_ref() {
        if l.unwrap().contains("Ctrl-C") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    child
}

/// Runs `hydramem status --cluster FILE`: its result and its standard output.
fn status(file: &Path) -> (std::process::Output, String) {
    let out = Command::new(BIN)
        .arg("status")
        .arg("--cluster")
        .arg(file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out, text)
}

fn wait_gone(addrs: &[std::net::SocketAddr]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for a in addrs {
        while TcpStream::connect_timeout(a, Duration::from_millis(200)).is_ok() {
            assert!(Instant::now() < deadline, "node {a} still serving");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A directory of its own, removed when the test ends, and the cluster file's path in it.
fn tmp() -> (tempfile::TempDir, std::path::PathBuf) {
    let d = tempfile::Builder::new()
        .prefix("hm-cli-")
        .tempdir()
        .unwrap();
    let file = d.path().join("cluster.toml");
    (d, file)
}

#[test]
fn up_status_and_clean_sigterm() {
    let (_dir, file) = tmp();
    let mut up = start_up(3, &file);
    let cluster = Cluster::load(&file).unwrap();
    assert_eq!(cluster.nodes.len(), 3);
    let (out, text) = status(&file);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("3 nodes (3 up)"), "{text}");
    let json = Command::new(BIN)
        .args(["status", "--json", "--cluster"])
        .arg(&file)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 3);
    assert_eq!(v[0]["health"], "up");
    assert_eq!(v[0]["corrupt_reported"], 0);
    assert!(
        text.contains("corrupted splits reported by clients"),
        "{text}"
    );
    // --watch refreshes the table; --count ends it.
    let watch = Command::new(BIN)
        .args(["status", "--watch", "100ms", "--count", "2", "--cluster"])
        .arg(&file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&watch.stdout);
    assert!(watch.status.success(), "{text}");
    assert_eq!(text.matches("3 nodes (3 up)").count(), 2, "{text}");

    // SIGTERM: the nodes stop and the cluster file is removed.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(up.id() as i32, libc::SIGTERM) };
    let st = up.wait().unwrap();
    assert!(st.success(), "up exited with {st}");
    let addrs: Vec<_> = cluster.nodes.iter().map(|n| n.addr).collect();
    wait_gone(&addrs);
    assert!(!file.exists(), "cluster file left behind");

    // status on a dead cluster names the nodes that are down and does not hang.
    cluster.save(&file).unwrap();
    let (_, text) = status(&file);
    assert!(text.contains("DOWN") && text.contains("(0 up)"), "{text}");
}

#[test]
fn nodes_die_with_a_killed_up() {
    let (_dir, file) = tmp();
    let mut up = start_up(2, &file);
    let cluster = Cluster::load(&file).unwrap();
    up.kill().unwrap();
    up.wait().unwrap();
    wait_gone(&cluster.nodes.iter().map(|n| n.addr).collect::<Vec<_>>());
}

#[test]
fn demo_finishes_with_a_summary() {
    let out = Command::new(BIN)
        .args(["demo", "--size", "4MiB", "--log", "error"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("summary"), "{text}");
    assert!(
        text.contains("read, 2 nodes killed") && text.contains("wrong pages: 0"),
        "{text}"
    );
    assert!(text.contains("rebuilt the missing splits of"), "{text}");
    assert!(text.contains("every page read back exactly"), "{text}");
}

#[test]
fn bad_input_gets_clear_errors() {
    let out = Command::new(BIN)
        .args([
            "node",
            "--listen",
            "127.0.0.1:0",
            "--capacity",
            "1MiB",
            "--slab-size",
            "4MiB",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("capacity") && err.contains("smaller than one slab"),
        "{err}"
    );
    let out = Command::new(BIN)
        .args(["node", "--capacity", "12X"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad size unit"));
    let out = Command::new(BIN)
        .args(["status", "--cluster", "/nonexistent/c.toml"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot read cluster file /nonexistent/c.toml"),
        "{err}"
    );
}

#[test]
fn nbd_bad_input_gets_clear_errors() {
    let run = |args: &[&str]| {
        let out = Command::new(BIN).arg("nbd").args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let err = run(&["--size", "1GiB"]);
    assert!(
        err.contains("--listen") && err.contains("--socket"),
        "{err}"
    );
    let err = run(&["--size", "1GiB", "--listen", "127.0.0.1:0", "--socket", "s"]);
    assert!(err.contains("cannot be used with"), "{err}");
    let err = run(&["--size", "50%", "--listen", "127.0.0.1:0"]);
    assert!(err.contains("not a percentage"), "{err}");
    let err = run(&["--size", "0", "--listen", "127.0.0.1:0"]);
    assert!(err.contains("at least 1 byte"), "{err}");
    let err = run(&[
        "--size",
        "1MiB",
        "--listen",
        "127.0.0.1:0",
        "--cluster",
        "/nonexistent/c.toml",
    ]);
    assert!(err.contains("cannot read cluster file"), "{err}");
}

#[test]
fn run_refuses_bad_sizes_before_anything_starts() {
    // Neither the pager library nor the cluster file exists: a size is refused before either
    // is looked at.
    let run = |sizes: &[&str]| {
        let out = Command::new(BIN)
            .args(["run", "--cluster", "/nonexistent/c.toml"])
            .args(["--pager", "/nonexistent/libhydramem_pager.so"])
            .args(sizes)
            .args(["--", "true"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{sizes:?}: succeeded");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let err = run(&["--local-memory", "8MiB"]);
    assert!(err.contains("at least 16MiB"), "{err}");
    let err = run(&["--local-memory", "64MiB", "--standby", "40MiB"]);
    assert!(
        err.contains("--standby (40.0 MiB) must be at most half of --local-memory"),
        "{err}"
    );
    let err = run(&["--local-memory", "64MiB", "--standby", "60%"]);
    assert!(err.contains("must be at most half"), "{err}");
    let err = run(&["--local-memory", "64MiB", "--remote-size", "50%"]);
    assert!(err.contains("--remote-size takes a byte count"), "{err}");
    // Sizes within bounds: the run goes on to the pager library.
    let err = run(&["--local-memory", "64MiB", "--standby", "50%"]);
    assert!(err.contains("pager library /nonexistent/"), "{err}");
}

#[test]
fn a_span_max_cost_without_room_is_refused_before_anything_starts() {
    let run = |scheme: &str| {
        let out = Command::new(BIN)
            .args(["run", "--scheme", scheme, "--span-max-cost", "1.2"])
            .args([
                "--cluster",
                "/nonexistent/c.toml",
                "--local-memory",
                "64MiB",
                "--pager",
                "/nonexistent/libhydramem_pager.so",
            ])
            .args(["--", "true"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{scheme}: succeeded");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let err = run("span-8+2");
    assert!(
        err.contains("--span-max-cost 1.2 with --scheme span-8+2")
            && err.contains("give at least 1.375"),
        "{err}"
    );
    // Other schemes have no compaction and ignore it: the run goes on to the next check, the
    // pager library's (named here, so that it is missing whatever this checkout has built).
    let err = run("rep2");
    assert!(err.contains("pager library /nonexistent/"), "{err}");
    // A config file's [run] section sets it too; a flag beats the file, and the program's
    // own arguments after `--` are never taken for ours.
    let (d, _) = tmp();
    let config = d.path().join("hydramem.toml");
    std::fs::write(&config, "[run]\nspan-max-cost = 1.2\n").unwrap();
    let with_config = |extra: &[&str], program: &[&str]| {
        let out = Command::new(BIN)
            .args(["run", "--config", config.to_str().unwrap()])
            .args(["--scheme", "span-8+2", "--cluster", "/nonexistent/c.toml"])
            .args(["--local-memory", "64MiB"])
            .args(["--pager", "/nonexistent/libhydramem_pager.so"])
            .args(extra)
            .arg("--")
            .args(program)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let err = with_config(&[], &["true"]);
    assert!(err.contains("give at least 1.375"), "{err}");
    let err = with_config(&[], &["echo", "--span-max-cost", "2"]);
    assert!(err.contains("give at least 1.375"), "{err}");
    let err = with_config(&["--span-max-cost", "1.5"], &["true"]);
    assert!(err.contains("pager library /nonexistent/"), "{err}");
    // bench refuses it for the span schemes of its list before it starts its cluster.
    let out = Command::new(BIN)
        .args([
            "bench",
            "--schemes",
            "rep2,span-8+2",
            "--span-max-cost",
            "1.2",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--span-max-cost 1.2 with span 8+2") && err.contains("give at least 1.375"),
        "{err}"
    );
}
