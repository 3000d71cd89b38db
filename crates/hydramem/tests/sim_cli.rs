//! `hydramem sim` as a user runs it: each subcommand prints its table, the quick sweep writes
//! its files, and bad input is a clear error (exit code 1, a message naming the parameter),
//! never a panic.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_hydramem");

fn sim(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN).arg("sim").args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn loss_prints_closed_form_and_monte_carlo_per_policy() {
    let (ok, out, err) = sim(&[
        "loss",
        "--n",
        "200",
        "--fail-fraction",
        "0.03",
        "--trials",
        "4000",
        "--placements",
        "2",
    ]);
    assert!(ok, "{err}");
    for policy in ["codingsets l=2", "ec-cache", "power-of-two"] {
        assert!(out.contains(policy), "{policy} missing:\n{out}");
    }
    assert!(
        out.contains("closed form") && out.contains("Monte Carlo"),
        "{out}"
    );
}

#[test]
fn span_is_compared_with_per_page_coding_and_replication() {
    let (ok, out, err) = sim(&["span", "--n", "200", "--fail-fraction", "0.05"]);
    assert!(ok, "{err}");
    for row in [
        "hydra 8+2",
        "span 8+2 compacted",
        "span 8+2 at threshold",
        "replication x2",
    ] {
        assert!(out.contains(row), "{row} missing:\n{out}");
    }
    // Same loss condition and the same CodingSets groups: the same probability.
    let cell = |row: &str| {
        let line = out.lines().find(|l| l.starts_with(row)).expect("the row");
        line.split_whitespace().rev().nth(2).map(str::to_string)
    };
    assert_eq!(cell("hydra 8+2"), cell("span 8+2 at threshold"), "{out}");
}

#[test]
fn balance_and_copysets_check_run() {
    let (ok, out, err) = sim(&["balance", "--n", "500", "--policy", "ec-cache"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("ec-cache") && out.contains("closed form"),
        "{out}"
    );
    let (ok, out, err) = sim(&[
        "copysets-check",
        "--chunks-per-node",
        "50",
        "--random-trials",
        "50",
        "--copyset-trials",
        "2000",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("random replication") && out.contains("copyset replication"),
        "{out}"
    );
}

#[test]
fn quick_sweep_writes_csv_png_and_markdown() {
    let dir = std::env::temp_dir().join(format!("hm-sim-sweep-{}", std::process::id()));
    let (ok, out, err) = sim(&["sweep", "--quick", "--out", dir.to_str().unwrap()]);
    assert!(ok, "{err}");
    for f in [
        "fig15.csv",
        "fig15_k.png",
        "fig16.csv",
        "fig16_uniform_exact.png",
        "tables.md",
    ] {
        let path = dir.join(f);
        assert!(path.exists(), "{f} not written; output:\n{out}");
        assert!(
            std::fs::metadata(&path).unwrap().len() > 100,
            "{f} is nearly empty"
        );
    }
    let md = std::fs::read_to_string(dir.join("tables.md")).unwrap();
    assert!(
        md.contains("Copysets check") && md.contains("Load balance"),
        "{md}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_input_is_a_clear_error() {
    for (args, needle) in [
        (vec!["loss", "--k", "0"], "k = 0"),
        (vec!["loss", "--fail-fraction", "1.5"], "between 0 and 1"),
        (vec!["loss", "--n", "5"], "fewer than k + r"),
        (vec!["balance", "--slabs-per-node=0"], "positive"),
        (vec!["loss", "--trials", "0"], "at least 1"),
        (
            vec!["balance", "--view", "waves", "--wave", "0"],
            "--wave 0",
        ),
    ] {
        let (ok, _, err) = sim(&args);
        assert!(!ok, "{args:?} succeeded");
        assert!(err.contains(needle), "{args:?}: {err:?} lacks {needle:?}");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    }
}
