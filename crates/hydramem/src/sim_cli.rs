//! `hydramem sim`: the availability and load-balancing simulator on the command line.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use hydramem::placement::{Policy, PolicyKind};
use hydramem::sim::montecarlo::{estimate_loss, McOptions};
use hydramem::sim::sweep::{self, mc_text, pct};
use hydramem::sim::{analysis, balance, plot, Initial, Params, View};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(clap::Args)]
pub struct SimArgs {
    #[command(subcommand)]
    cmd: SimCmd,
}

#[derive(clap::Subcommand)]
enum SimCmd {
    /// Probability of data loss when a fraction of the nodes fail at once: closed form and
    /// Monte Carlo over the real placer, per policy.
    Loss(LossArgs),
    /// Load balance (max / mean and coefficient of variation of slabs per node), per policy.
    Balance(BalanceArgs),
    /// The paper's Figures 15 and 16: CSV, PNG plots and markdown tables into a directory.
    Sweep(SweepArgs),
    /// Replication as k = 1 against the copysets paper: 5000 nodes, 3 replicas, 1 % failed.
    CopysetsCheck(CopysetsArgs),
    /// Span coding beside per-page coding (and replication ×2) for the same data: closed-form
    /// probability of data loss per policy when a fraction of the nodes fail at once.
    Span(SpanArgs),
}

#[derive(clap::Args)]
struct SpanArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Fraction of the nodes that fail at once (0.01 = 1 %).
    #[arg(long, default_value_t = 0.01)]
    fail_fraction: f64,
}

/// `all` or one policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Which {
    All,
    Codingsets,
    EcCache,
    PowerOfTwo,
}

impl Which {
    fn kinds(self) -> Vec<PolicyKind> {
        match self {
            Which::All => PolicyKind::ALL.to_vec(),
            Which::Codingsets => vec![PolicyKind::Codingsets],
            Which::EcCache => vec![PolicyKind::EcCache],
            Which::PowerOfTwo => vec![PolicyKind::PowerOfTwo],
        }
    }
}

#[derive(clap::Args)]
struct ClusterArgs {
    /// Memory nodes, N.
    #[arg(long, default_value_t = 1000)]
    n: usize,
    /// Data splits per range.
    #[arg(long, default_value_t = 8)]
    k: usize,
    /// Parity splits per range.
    #[arg(long, default_value_t = 2)]
    r: usize,
    /// CodingSets' load-balancing factor.
    #[arg(long, default_value_t = 2)]
    l: usize,
    /// Slabs per node on average, S.
    #[arg(long, default_value_t = 16.0)]
    slabs_per_node: f64,
    /// Ranges each simulated client maps (power of two prefers nodes new to its client).
    #[arg(long, default_value_t = 2)]
    ranges_per_client: usize,
    /// Worker threads (default: the machine's cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Seed: the same seed gives the same result, whatever the threads.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

impl ClusterArgs {
    fn params(&self, fail_fraction: f64) -> Result<Params> {
        let p = Params {
            n: self.n,
            k: self.k,
            r: self.r,
            l: self.l,
            slabs_per_node: self.slabs_per_node,
            fail_fraction,
            ranges_per_client: self.ranges_per_client,
        };
        p.validate()?;
        Ok(p)
    }
}

#[derive(clap::Args)]
struct LossArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Policy to simulate.
    #[arg(long, value_enum, default_value = "all")]
    policy: Which,
    /// Fraction of the nodes that fail at once (0.01 = 1 %).
    #[arg(long, default_value_t = 0.01)]
    fail_fraction: f64,
    /// Monte Carlo failure trials per policy.
    #[arg(long, default_value_t = 1_000_000)]
    trials: u64,
    /// Independent placements the trials are spread over.
    #[arg(long, default_value_t = 16)]
    placements: u64,
}

#[derive(clap::Args)]
struct BalanceArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Policy to simulate (`all` also runs CodingSets with l = 0..4).
    #[arg(long, value_enum, default_value = "all")]
    policy: Which,
    /// Initial node loads: uniform (all empty) or skewed (0..2S slabs of other tenants each).
    #[arg(long, value_parser = ["uniform", "skewed"], default_value = "uniform")]
    initial: String,
    /// Loads the placer sees: exact (current), snapshot (initial + the client's own), or
    /// waves (loads at the start of the client's wave of --wave clients + its own).
    #[arg(long, value_parser = ["exact", "snapshot", "waves"], default_value = "exact")]
    view: String,
    /// Clients per wave for --view waves.
    #[arg(long, default_value_t = 1000)]
    wave: usize,
    /// Placements averaged (each with its own seed).
    #[arg(long, default_value_t = 1)]
    repeats: u64,
}

#[derive(clap::Args)]
struct SweepArgs {
    /// Directory for the CSV, PNG and markdown files (created if missing).
    #[arg(long, default_value = "sim-results")]
    out: PathBuf,
    /// Fewer points and trials: a smoke run of a few seconds.
    #[arg(long)]
    quick: bool,
    /// Which figures.
    #[arg(long, value_parser = ["all", "fig15", "fig16", "copysets"], default_value = "all")]
    only: String,
    /// Monte Carlo trials per policy and point of Figure 15.
    #[arg(long, default_value_t = 1_000_000)]
    trials: u64,
    /// Placements per Monte Carlo run.
    #[arg(long, default_value_t = 8)]
    placements: u64,
    /// Largest N of Figure 16.
    #[arg(long, default_value_t = 1_000_000)]
    max_n: usize,
    /// Worker threads (default: the machine's cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(clap::Args)]
struct CopysetsArgs {
    /// Chunks per node for random replication (RAMCloud: 64 GB in 8 MB segments = 8192).
    #[arg(long, default_value_t = 8192.0)]
    chunks_per_node: f64,
    /// Monte Carlo trials for random replication (each scans millions of chunks' sets).
    #[arg(long, default_value_t = 1000)]
    random_trials: u64,
    /// Monte Carlo trials for copyset replication.
    #[arg(long, default_value_t = 2_000_000)]
    copyset_trials: u64,
    /// Worker threads (default: the machine's cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

pub fn run(a: SimArgs) -> Result<()> {
    match a.cmd {
        SimCmd::Loss(a) => loss(a),
        SimCmd::Balance(a) => balance(a),
        SimCmd::Sweep(a) => sweep(a),
        SimCmd::CopysetsCheck(a) => copysets(a),
        SimCmd::Span(a) => span(a),
    }
}

/// Span coding loses data under exactly the condition per-page coding does — more than r of
/// one coding group's nodes fail — and is placed by the same policies; what differs is the
/// memory it holds for the same data: (k + r)/k right after compaction (up to
/// [`hydramem::span::compact::LOW`] × that), and up to [`hydramem::span::compact::HIGH`] × in
/// steady state before compaction starts. More slabs means more ranges, which matters to
/// policies that place ranges independently (EC-Cache, power of two), not to CodingSets, whose
/// groups are covered whatever the count. Replication ×2 of the same data is k = 1, r = 1 with
/// 2 / ((k + r)/k) times the slabs.
fn span(a: SpanArgs) -> Result<()> {
    use hydramem::span::compact::{HIGH, LOW};
    let p = a.cluster.params(a.fail_fraction)?;
    let base = (p.k + p.r) as f64 / p.k as f64;
    println!(
        "P(data loss) for the same data: N={} k={} r={} l={} S={} slabs per node for per-page \
         coding, f={}% ({} nodes fail at once); closed forms",
        p.n,
        p.k,
        p.r,
        p.l,
        p.slabs_per_node,
        p.fail_fraction * 100.0,
        p.failed()
    );
    let rows: [(String, Params); 4] = [
        (format!("hydra {}+{}", p.k, p.r), p),
        (
            format!("span {}+{} compacted ({:.2}x)", p.k, p.r, base * LOW),
            Params {
                slabs_per_node: p.slabs_per_node * LOW,
                ..p
            },
        ),
        (
            format!("span {}+{} at threshold ({:.2}x)", p.k, p.r, base * HIGH),
            Params {
                slabs_per_node: p.slabs_per_node * HIGH,
                ..p
            },
        ),
        (
            "replication x2 (2.00x)".to_string(),
            Params {
                k: 1,
                r: 1,
                slabs_per_node: p.slabs_per_node * 2.0 / base,
                ..p
            },
        ),
    ];
    print!("{:<34}", "scheme (memory per data byte)");
    for kind in PolicyKind::ALL {
        print!(" {:>14}", p.policy(kind).to_string());
    }
    println!();
    for (label, q) in &rows {
        print!("{label:<34}");
        for kind in PolicyKind::ALL {
            let (closed, _) = sweep::closed_forms(kind, q)?;
            print!(" {:>14}", pct(closed));
        }
        println!();
    }
    Ok(())
}

fn threads(t: Option<usize>) -> usize {
    t.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1)
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{msg:>24} [{bar:30}] {human_pos}/{human_len} ({eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

fn loss(a: LossArgs) -> Result<()> {
    let p = a.cluster.params(a.fail_fraction)?;
    let opts = McOptions {
        trials: a.trials,
        placements: a.placements,
        threads: threads(a.cluster.threads),
        seed: a.cluster.seed,
    };
    println!(
        "P(data loss): N={} k={} r={} l={} S={} f={}% ({} nodes fail at once), {} ranges",
        p.n,
        p.k,
        p.r,
        p.l,
        p.slabs_per_node,
        p.fail_fraction * 100.0,
        p.failed(),
        p.ranges()
    );
    println!(
        "Monte Carlo: {} trials over {} placements by the real placer, {} threads, seed {}",
        opts.trials, opts.placements, opts.threads, opts.seed
    );
    let mut lines = Vec::new();
    for kind in a.policy.kinds() {
        let (closed, paper) = sweep::closed_forms(kind, &p)?;
        let policy = p.policy(kind);
        let pb = bar(opts.trials, &policy.to_string());
        let started = Instant::now();
        let e = estimate_loss(policy, &p, &opts, &|t| pb.inc(t))?;
        pb.finish_and_clear();
        let agree = if e.agrees(closed, 1.96) {
            "yes"
        } else if kind == PolicyKind::PowerOfTwo {
            "no (approximation)"
        } else {
            "NO"
        };
        lines.push(format!(
            "{:<16} {:>12} {:>16}   {:<34} {:>10.0} {:>6}  {:.1}s",
            policy.to_string(),
            pct(closed),
            pct(paper),
            mc_text(&e),
            e.distinct_sets,
            agree,
            started.elapsed().as_secs_f64()
        ));
    }
    println!(
        "{:<16} {:>12} {:>16}   {:<34} {:>10} {:>6}",
        "policy", "closed form", "paper's formula", "Monte Carlo [95% CI]", "copysets", "agree"
    );
    for l in lines {
        println!("{l}");
    }
    println!(
        "closed form: CodingSets exact under full coverage of each group, EC-Cache exact for \
         independent uniform ranges; power of two uses EC-Cache's (the paper's assumption)."
    );
    Ok(())
}

fn balance(a: BalanceArgs) -> Result<()> {
    let p = a.cluster.params(0.0)?;
    let initial = if a.initial == "skewed" {
        Initial::Skewed
    } else {
        Initial::Uniform
    };
    let view = match a.view.as_str() {
        "snapshot" => View::Snapshot,
        "waves" if a.wave == 0 => anyhow::bail!("--wave 0: a wave has at least one client"),
        "waves" => View::Waves(a.wave),
        _ => View::Exact,
    };
    let policies: Vec<Policy> = match a.policy {
        Which::All => sweep::fig16_policies(),
        w => w.kinds().into_iter().map(|k| p.policy(k)).collect(),
    };
    println!(
        "load balance: N={} k={} r={} S={} ({} ranges), {} initial loads, {} view{}, {} \
         repeat(s); simulated with the real placer (no sampling)",
        p.n,
        p.k,
        p.r,
        p.slabs_per_node,
        p.ranges(),
        initial.name(),
        view.name(),
        match view {
            View::Waves(w) => format!(" of {w} clients"),
            _ => String::new(),
        },
        a.repeats
    );
    println!(
        "{:<16} {:>10} {:>8} {:>6} {:>8} {:>8}",
        "policy", "max/mean", "CV", "max", "mean", "time"
    );
    let t = threads(a.cluster.threads);
    for policy in policies {
        let started = Instant::now();
        let b = balance::measure(policy, &p, initial, view, a.repeats, t, a.cluster.seed)?;
        println!(
            "{:<16} {:>10.3} {:>8.3} {:>6} {:>8.2} {:>7.1}s",
            policy.to_string(),
            b.max_over_mean,
            b.cv,
            b.max,
            b.mean,
            started.elapsed().as_secs_f64()
        );
    }
    if initial == Initial::Uniform {
        println!(
            "ec-cache closed form (independent Binomial loads): max/mean {:.3}",
            analysis::ec_cache_expected_max(p.n, p.width(), p.ranges())
        );
    }
    Ok(())
}

fn sweep(a: SweepArgs) -> Result<()> {
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("cannot create the output directory {}", a.out.display()))?;
    let t = threads(a.threads);
    let base = Params::paper_base();
    let (trials, max_n) = if a.quick {
        (a.trials.min(5_000), a.max_n.min(1_000))
    } else {
        (a.trials, a.max_n)
    };
    let opts = McOptions {
        trials,
        placements: a.placements,
        threads: t,
        seed: a.seed,
    };
    let started = Instant::now();
    let mut written = Vec::new();
    let (mut loss_rows, mut bal_rows) = (Vec::new(), Vec::new());
    let mut md = String::from("# hydramem sim sweep\n");
    if a.only == "all" || a.only == "fig15" {
        let points = sweep::fig15_points(a.quick);
        let pb = bar(points.len() as u64, "Figure 15 points");
        loss_rows = sweep::fig15(
            base,
            a.quick,
            &opts,
            &|what| {
                pb.set_message(what.to_string());
                pb.inc(1);
            },
            &|_| {},
        )?;
        pb.finish_and_clear();
        let csv = sweep::loss_csv(&loss_rows);
        let charts = sweep::loss_charts(&loss_rows);
        written.extend(write_figure(&a.out, "fig15", &csv, &charts)?);
    }
    if a.only == "all" || a.only == "fig16" {
        let settings = sweep::fig16_settings(max_n);
        let pb = bar(settings.len() as u64, "Figure 16 settings");
        let budget = if a.quick { 20_000 } else { 200_000 };
        bal_rows = sweep::fig16(base, max_n, budget, t, a.seed, &|_| pb.inc(1))?;
        pb.finish_and_clear();
        let csv = sweep::balance_csv(&bal_rows);
        let charts = sweep::balance_charts(&bal_rows);
        written.extend(write_figure(&a.out, "fig16", &csv, &charts)?);
    }
    md.push_str(&sweep::markdown(&loss_rows, &bal_rows));
    if a.only == "all" || a.only == "copysets" {
        let (chunks, rt, ct) = if a.quick {
            (100.0, 200, 20_000)
        } else {
            (8192.0, 300, 1_000_000)
        };
        let pb = bar(rt + ct, "copysets check");
        let c = sweep::copysets_check(chunks, rt, ct, t, a.seed, &|n| pb.inc(n))?;
        pb.finish_and_clear();
        md.push_str(&copysets_markdown(&c));
    }
    let path = a.out.join("tables.md");
    sweep::write_file(&path, &md)?;
    written.push(path);
    println!(
        "sweep done in {:.0} s ({} threads, seed {}); wrote:",
        started.elapsed().as_secs_f64(),
        t,
        a.seed
    );
    for p in written {
        println!("  {}", p.display());
    }
    Ok(())
}

/// Writes `{name}.csv` and one PNG per chart into `out`; returns the paths written.
fn write_figure(
    out: &std::path::Path,
    name: &str,
    csv: &str,
    charts: &[(String, plot::Chart)],
) -> Result<Vec<PathBuf>> {
    let mut written = vec![out.join(format!("{name}.csv"))];
    sweep::write_file(&written[0], csv)?;
    for (stem, chart) in charts {
        let path = out.join(format!("{stem}.png"));
        plot::render(chart, &path, 1000, 640)?;
        written.push(path);
    }
    Ok(written)
}

fn copysets_markdown(c: &sweep::CopysetsCheck) -> String {
    let mc = |e: &Option<hydramem::sim::montecarlo::LossEstimate>| {
        e.as_ref().map_or("not run".into(), |e| {
            format!("{} ({} trials)", mc_text(e), e.trials)
        })
    };
    format!(
        "\n**Copysets check** (5000 nodes, 3 replicas, 1 % = 50 nodes failed)\n\n\
         | scheme | closed form | Monte Carlo [95% CI] | copysets paper |\n|---|---|---|---|\n\
         | random replication, {} chunks per node | {} | {} | ≈ 99.99% |\n\
         | copyset replication, scatter width 2 (CodingSets k=1 r=2 l=0) | {} | {} | ≈ 0.15% |\n\
         \nRandom replication reaches 99.99 % from {:.0} chunks per node on.\n",
        c.chunks_per_node,
        pct(c.random_closed),
        mc(&c.random_mc),
        pct(c.copyset_closed),
        mc(&c.copyset_mc),
        c.chunks_for_9999
    )
}

fn copysets(a: CopysetsArgs) -> Result<()> {
    let t = threads(a.threads);
    println!(
        "copysets check: 5000 nodes, 3 replicas (k=1, r=2), 1% = 50 nodes fail at once; \
         random replication with {} chunks per node ({:.0} chunks), copyset replication with \
         scatter width 2 = CodingSets l=0 (disjoint groups of 3)",
        a.chunks_per_node,
        5000.0 * a.chunks_per_node / 3.0
    );
    let pb = bar(a.random_trials + a.copyset_trials, "copysets check");
    let started = Instant::now();
    let c = sweep::copysets_check(
        a.chunks_per_node,
        a.random_trials,
        a.copyset_trials,
        t,
        a.seed,
        &|n| pb.inc(n),
    )?;
    pb.finish_and_clear();
    print!("{}", copysets_markdown(&c));
    println!(
        "({:.1} s, {} threads, seed {})",
        started.elapsed().as_secs_f64(),
        t,
        a.seed
    );
    Ok(())
}
