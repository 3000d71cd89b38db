//! `hydramem bench`: every resilience scheme (and the `ssd-backup` baseline) side by side
//! against the same nodes, in one run.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use hydramem::bench::{self, BenchOptions, BenchScheme, SchemeResult};
use hydramem::cluster::Cluster;
use hydramem::embedded::{EmbeddedCluster, EmbeddedOptions};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Cluster file of running nodes. Without it, bench starts its own embedded cluster.
    #[arg(long, env = "HYDRAMEM_CLUSTER")]
    cluster: Option<PathBuf>,
    /// Nodes of the embedded cluster (when no --cluster is given).
    #[arg(long, env = "HYDRAMEM_NODES", default_value_t = 12)]
    nodes: usize,
    /// Pages in the working set of each scheme.
    #[arg(long, env = "HYDRAMEM_PAGES", default_value_t = 16384)]
    pages: u64,
    /// Operations per queue-depth-1 latency phase.
    #[arg(long, env = "HYDRAMEM_LATENCY_OPS", default_value_t = 5000)]
    latency_ops: u64,
    /// Threads (pages in flight) for the throughput phases.
    #[arg(long, env = "HYDRAMEM_DEPTH", default_value_t = 16)]
    depth: usize,
    /// Bytes per request in the throughput phases (a multiple of 4KiB): each of the --depth
    /// threads reads and writes this many consecutive pages in one batched call
    /// (`read_pages`/`write_pages`); 4KiB uses the single-page calls.
    #[arg(long, env = "HYDRAMEM_REQUEST_SIZE", default_value = "4KiB", value_parser = hydramem::units::parse_size)]
    request_size: hydramem::units::Size,
    /// Seconds of the read-throughput phase.
    #[arg(long, env = "HYDRAMEM_SECONDS", default_value_t = 3.0)]
    seconds: f64,
    /// Rounds the measurements are cut into (schemes interleaved within each round).
    #[arg(long, env = "HYDRAMEM_ROUNDS", default_value_t = 10)]
    rounds: u64,
    /// Also measure under corruption (paper Fig. 11): each latency round runs clean and then
    /// with every node flipping a bit in this many read replies per million (0: clean only).
    /// The embedded nodes then allow fault injection; with --cluster they must have been
    /// started with --allow-fault-injection. Wrong pages and failed reads in corrupted rounds
    /// are counted and printed instead of ending the run.
    #[arg(long, env = "HYDRAMEM_CORRUPT_PPM", default_value_t = 0)]
    corrupt_ppm: u32,
    /// Microseconds a waiting thread polls before it sleeps.
    #[arg(long, env = "HYDRAMEM_POLL_US", default_value_t = 50)]
    poll_us: u64,
    /// Span schemes: remote bytes held per byte of data above which compaction starts while
    /// writes flow [default: 1.16 × the code's cost, 1.45 for span-8+2]. Higher holds more
    /// garbage and moves fewer pages
    #[arg(long, env = "HYDRAMEM_SPAN_MAX_COST")]
    span_max_cost: Option<f64>,
    /// Schemes to run (comma separated): hydra-K+R-dD (suffix -ec for EC-only, -det for
    /// corruption detection, -cor for correction), span-K+R (span coding: whole pages, parity
    /// across the pages of a row), repN, single, ssd-backup (one remote copy
    /// plus a local backup file in --backup-dir: the paper's Infiniswap baseline, e.g.
    /// hydra-8+2-d1,rep2,single,ssd-backup side by side); each may end in +crc for
    /// per-split checksums, then in /encode-first, /bounce or /unbatched to turn off one of
    /// the data path's design choices (asynchronously encoded write, in-place coding,
    /// batching: paper Fig. 10), e.g. hydra-8+2-d1,hydra-8+2-d1/unbatched.
    #[arg(
        long,
        env = "HYDRAMEM_SCHEMES",
        value_delimiter = ',',
        default_value = "hydra-8+2-d1,hydra-8+2-d0,rep2,rep3,single"
    )]
    schemes: Vec<BenchScheme>,
    /// Where to write the JSON results.
    #[arg(
        long,
        env = "HYDRAMEM_JSON",
        default_value = "bench-results/bench.json"
    )]
    json: PathBuf,
    /// Instead of the scheme comparison, run paper Fig. 12's failure scenarios (healthy, one
    /// node slow, one node killed) for hydra 8+2 Δ=1, span 8+2 and replication ×2 on a
    /// cluster of its own (11 nodes, 64 MiB slabs, --pages at most 16384).
    #[arg(long)]
    failures: bool,
    /// Milliseconds the slowed node of --failures adds to every reply.
    #[arg(long, default_value_t = 1.0)]
    slow_reply_ms: f64,
    /// Instead of the scheme comparison, time the regeneration of one slab of each of these
    /// sizes (comma separated, e.g. 64MiB,1GiB) on a cluster of its own, against the loopback
    /// bandwidth measured in the same run (paper 7.3).
    #[arg(long, value_delimiter = ',', value_parser = hydramem::units::parse_size)]
    regeneration: Vec<hydramem::units::Size>,
    /// Seed of page contents and access order.
    #[arg(long, env = "HYDRAMEM_SEED", default_value_t = 42)]
    seed: u64,
    #[command(flatten)]
    backup: crate::client_cli::BackupArgs,
}

impl BenchArgs {
    fn options(&self) -> Result<BenchOptions> {
        let bytes = self.request_size.bytes();
        if bytes == 0 || !bytes.is_multiple_of(4096) || bytes > 64 << 20 {
            anyhow::bail!(
                "--request-size {} is not a positive multiple of 4KiB up to 64MiB: use 4KiB, 32KiB, 128KiB, ...",
                bytes
            );
        }
        if let Some(cost) = self.span_max_cost {
            for s in &self.schemes {
                hydramem::span::compact::Thresholds::of_scheme(s.store.resilience(), Some(cost))
                    .with_context(|| format!("--span-max-cost {cost} with {}", s.label()))?;
            }
        }
        Ok(BenchOptions {
            pages: self.pages,
            request_pages: (bytes / 4096) as usize,
            latency_ops: self.latency_ops,
            depth: self.depth,
            duration: Duration::from_secs_f64(self.seconds),
            rounds: self.rounds,
            poll: Duration::from_micros(self.poll_us),
            span_max_cost: self.span_max_cost,
            seed: self.seed,
            corrupt_ppm: self.corrupt_ppm,
            backup: self.backup.config()?,
            slow_reply: {
                if !(self.slow_reply_ms.is_finite()
                    && (0.0..=10_000.0).contains(&self.slow_reply_ms))
                {
                    anyhow::bail!(
                        "--slow-reply-ms {} is not 0 to 10000 milliseconds",
                        self.slow_reply_ms
                    );
                }
                Duration::from_secs_f64(self.slow_reply_ms / 1000.0)
            },
        })
    }
}

pub fn run(a: BenchArgs) -> Result<()> {
    if a.failures {
        return run_failures(&a);
    }
    if !a.regeneration.is_empty() {
        return run_regeneration(&a);
    }
    let mut _embedded = None;
    let cluster = match &a.cluster {
        Some(p) => Cluster::load(p)?,
        None => {
            let c = EmbeddedCluster::start(EmbeddedOptions {
                etcd: None,
                binary: hydramem::embedded::self_exe()?,
                nodes: a.nodes,
                slab_size: 16 << 20,
                capacity: 4 << 30,
                extra_args: if a.corrupt_ppm > 0 {
                    vec![
                        "--log".into(),
                        "error".into(),
                        "--allow-fault-injection".into(),
                    ]
                } else {
                    vec!["--log".into(), "warn".into()]
                },
                cluster_file: None,
                key_file: None,
                tls_dir: None,
            })?;
            let cl = c.cluster().clone();
            _embedded = Some(c);
            cl
        }
    };
    let o = a.options()?;
    println!(
        "hydramem bench: {} nodes, {} pages ({} MiB) per scheme, {} QD1 ops, depth {} × {} KiB requests, {:.1} s read throughput, {} interleaved rounds",
        cluster.nodes.len(),
        o.pages,
        (o.pages * 4096) >> 20,
        o.latency_ops,
        o.depth,
        o.request_pages * 4,
        a.seconds,
        o.rounds
    );
    let pb = ProgressBar::new(100);
    pb.set_style(
        ProgressStyle::with_template("[{bar:30}] {pos:>3}% {msg}")
            .expect("template")
            .progress_chars("=> "),
    );
    let progress = |phase: &str, done: u64, total: u64| {
        pb.set_message(phase.to_string());
        pb.set_position(done * 100 / total.max(1));
    };
    let results: Vec<SchemeResult> = bench::run(&cluster, &a.schemes, &o, &progress)?;
    pb.finish_and_clear();
    print!("{}", table(&results));
    if let Some(dir) = a.json.parent() {
        std::fs::create_dir_all(dir).ok();
    }
    let doc = serde_json::json!({
        "nodes": cluster.nodes.len(),
        "pages": o.pages,
        "latency_ops": o.latency_ops,
        "depth": o.depth,
        "request_pages": o.request_pages,
        "seconds": a.seconds,
        "rounds": a.rounds,
        "poll_us": a.poll_us,
        "span_max_cost": a.span_max_cost,
        "results": results,
    });
    std::fs::write(&a.json, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", a.json.display()))?;
    println!("JSON written to {}", a.json.display());
    if a.corrupt_ppm > 0 {
        print!("{}", corrupted_table(&results, a.corrupt_ppm));
    } else if results.iter().any(|r| r.verify_errors > 0) {
        anyhow::bail!("some reads returned wrong bytes (see verify_errors)");
    }
    Ok(())
}

fn run_regeneration(a: &BenchArgs) -> Result<()> {
    let o = a.options()?;
    let sizes: Vec<u64> = a.regeneration.iter().map(|s| s.bytes()).collect();
    println!(
        "hydramem bench --regeneration: 11 nodes, hydra 8+2, one range per slab size, fill depth {}",
        o.depth
    );
    let pb = ProgressBar::new(100);
    pb.set_style(
        ProgressStyle::with_template("[{bar:30}] {pos:>3}% {msg} {elapsed}")
            .expect("template")
            .progress_chars("=> "),
    );
    let progress = |phase: &str, done: u64, total: u64| {
        pb.set_message(phase.to_string());
        pb.set_position(done * 100 / total.max(1));
    };
    let results = bench::regeneration(hydramem::embedded::self_exe()?, &sizes, &o, &progress)?;
    pb.finish_and_clear();
    println!(
        "\n{:>10} | {:>9} | {:>12} | {:>9} | {:>12} | {:>12} | {:>9} | {:>8}",
        "slab", "pages", "received", "time s", "recv MB/s", "loopback MB/s", "of ideal", "verified"
    );
    println!("{}", "-".repeat(103));
    for r in &results {
        println!(
            "{:>10} | {:>9} | {:>12} | {:>9.3} | {:>12.0} | {:>12.0} | {:>8.1}% | {:>8}",
            hydramem::units::human(r.slab_size),
            r.pages,
            hydramem::units::human(r.bytes_received),
            r.seconds,
            r.received_mb_s,
            r.loopback_mb_s,
            100.0 * r.fraction_of_ideal,
            r.verified_pages
        );
    }
    if let Some(dir) = a.json.parent() {
        std::fs::create_dir_all(dir).ok();
    }
    std::fs::write(&a.json, serde_json::to_string_pretty(&results)?)
        .with_context(|| format!("writing {}", a.json.display()))?;
    println!("JSON written to {}", a.json.display());
    Ok(())
}

fn run_failures(a: &BenchArgs) -> Result<()> {
    let o = a.options()?;
    println!(
        "hydramem bench --failures: 11 nodes, {} pages per scheme, {} QD1 ops per scenario, {} interleaved rounds",
        o.pages, o.latency_ops, o.rounds
    );
    let pb = ProgressBar::new(100);
    let progress = |phase: &str, done: u64, total: u64| {
        pb.set_message(phase.to_string());
        pb.set_position(done * 100 / total.max(1));
    };
    let results = bench::failure_scenarios(hydramem::embedded::self_exe()?, &o, &progress)?;
    pb.finish_and_clear();
    println!(
        "\n{:<16} | {:<50} | {:>17} | {:>17}",
        "scheme", "scenario", "write µs p50/p99", "read µs p50/p99"
    );
    println!("{}", "-".repeat(111));
    for r in &results {
        println!(
            "{:<16} | {:<50} | {:>17} | {:>17}",
            r.scheme,
            r.scenario,
            format!(
                "{:.1}/{:.1}",
                r.write_latency.p50_us, r.write_latency.p99_us
            ),
            format!("{:.1}/{:.1}", r.read_latency.p50_us, r.read_latency.p99_us)
        );
    }
    if let Some(dir) = a.json.parent() {
        std::fs::create_dir_all(dir).ok();
    }
    let doc =
        serde_json::json!({ "pages": o.pages, "latency_ops": o.latency_ops, "results": results });
    std::fs::write(&a.json, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", a.json.display()))?;
    println!("JSON written to {}", a.json.display());
    Ok(())
}

/// QD1 latency of the corrupted rounds beside the clean ones, and what corruption did.
pub fn corrupted_table(results: &[SchemeResult], ppm: u32) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "\nunder corruption ({ppm} per million read replies flipped on every node), QD1:\n{:<26} | {:>15} | {:>15} | {:>13} | {:>13} | {:>6} | {:>6} | {:>8} | {:>9} | {:>8}",
        "scheme",
        "write µs p50/p99",
        "read µs p50/p99",
        "p99 × clean w",
        "p99 × clean r",
        "wrong",
        "failed",
        "corrupt",
        "corrected",
        "wide"
    );
    let _ = writeln!(o, "{}", "-".repeat(137));
    for r in results {
        let Some(c) = &r.corrupted else { continue };
        let l = |x: &bench::Latency| format!("{:.1}/{:.1}", x.p50_us, x.p99_us);
        let _ = writeln!(
            o,
            "{:<26} | {:>15} | {:>15} | {:>13.2} | {:>13.2} | {:>6} | {:>6} | {:>8} | {:>9} | {:>8}",
            r.scheme,
            l(&c.write_latency),
            l(&c.read_latency),
            c.write_latency.p99_us / r.write_latency.p99_us,
            c.read_latency.p99_us / r.read_latency.p99_us,
            r.verify_errors,
            r.read_errors,
            r.corrupt_splits,
            r.corrected,
            r.wide_reads
        );
    }
    let _ = writeln!(
        o,
        "(wrong: pages returned with wrong bytes; failed: reads answered with an error; corrupt: \
         splits found corrupted; corrected: reads correction mode put right; wide: reads that \
         started with extra splits because a node was above the error-correction limit)"
    );
    o
}

/// The results as a fixed-width table, with ratios against replication ×2 where present.
pub fn table(results: &[SchemeResult]) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "\n{:<26} | {:>23} | {:>23} | {:>15} | {:>15} | {:>11} | {:>6}",
        "scheme",
        "write µs p50/p99/p99.9",
        "read µs p50/p99/p99.9",
        "write kpg/s GB/s",
        "read kpg/s GB/s",
        "cpu µs/page",
        "bytes"
    );
    let _ = writeln!(o, "{}", "-".repeat(144));
    for r in results {
        let l = |x: &bench::Latency| format!("{:.1}/{:.1}/{:.1}", x.p50_us, x.p99_us, x.p999_us);
        let t = |x: &bench::Throughput| format!("{:.1} {:.2}", x.pages_per_s / 1e3, x.gb_per_s);
        let _ = writeln!(
            o,
            "{:<26} | {:>23} | {:>23} | {:>15} | {:>15} | {:>5.1} {:>5.1} | {:>6.3} {:>5.3}",
            r.scheme,
            l(&r.write_latency),
            l(&r.read_latency),
            t(&r.write_throughput),
            t(&r.read_throughput),
            r.write_throughput.cpu_us_per_page,
            r.read_throughput.cpu_us_per_page,
            r.remote_bytes_per_data_byte,
            r.remote_bytes_per_data_byte_end
        );
    }
    let _ = writeln!(
        o,
        "(cpu µs/page: write, read; bytes: remote bytes held per byte of data, after populating \
         and at the end, after the latency rounds' random overwrites)"
    );
    if let Some(worst) = results.iter().map(|r| r.node_overhead_max).max() {
        let rss = results.iter().map(|r| r.node_rss_max).max().unwrap_or(0);
        let _ = writeln!(
            o,
            "node memory: largest resident set {:.1} MiB, at most {:.1} MiB above the data its slabs hold",
            rss as f64 / 1048576.0,
            worst as f64 / 1048576.0
        );
    }
    if let Some(rep2) = results.iter().find(|r| r.scheme == "replication ×2") {
        for r in results.iter().filter(|r| r.scheme.starts_with("hydra")) {
            let _ = writeln!(
                o,
                "{} vs replication ×2: read p50 {:.2}×, write p50 {:.2}×, read p99 {:.2}×, write p99 {:.2}×",
                r.scheme,
                r.read_latency.p50_us / rep2.read_latency.p50_us,
                r.write_latency.p50_us / rep2.write_latency.p50_us,
                r.read_latency.p99_us / rep2.read_latency.p99_us,
                r.write_latency.p99_us / rep2.write_latency.p99_us,
            );
        }
    }
    o
}
