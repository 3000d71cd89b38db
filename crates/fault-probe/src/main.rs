//! `hydramem-fault-probe`: what a swap device costs the program that swaps to it, seen from
//! inside that program (the paper's Fig. 9a). Run in a memory cgroup smaller than `--mib`, it
//! writes its pages one by one (the kernel pushes others out to swap to make room: the write
//! latencies show what a page-out costs the writer), then reads `--accesses` random pages,
//! timing each, and classifies each read by whether it was a major fault (the thread's
//! `ru_majflt` moved: the page came in from the swap device) or not (it was resident, or in the
//! swap cache after readahead), and apart by whether mincore(2) said the page was not resident
//! just before: that also tells the page-ins of a program run under `hydramem run`, which the
//! kernel does not count as major faults. Last, it reads every page in order and checks every
//! byte.
//!
//! Invariants: every page read is checked against what was written (a wrong page makes the
//! probe fail, whatever the timings); the timed section of a read is the access alone, the
//! classification and the check come after it.

mod latency;
mod pages;

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use serde::Serialize;

use latency::{Latencies, Summary};
use pages::{Region, PAGE};

/// Measures 4 KiB major-fault (swap-in) latency and page writes under memory pressure, and
/// checks that every page reads back exactly. Run it in a memory cgroup smaller than --mib
/// with the swap device to measure as the only one active.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// MiB of anonymous memory the probe writes (more than its cgroup's limit, so that part
    /// of it is swapped out).
    #[arg(long, default_value_t = 256)]
    mib: u64,
    /// Random page reads in the timed phase.
    #[arg(long, default_value_t = 20_000)]
    accesses: u64,
    /// Seed of the page contents and of the access order.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also write the report, with each CDF, as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Everything the probe measured.
#[derive(Debug, Serialize)]
struct Report {
    pages: usize,
    /// /proc/sys/vm/page-cluster: the kernel reads 2^this pages per swap-in.
    page_cluster: Option<u32>,
    populate_seconds: f64,
    /// Latency of writing each page for the first time (with a page-out when memory is full).
    page_writes: Summary,
    /// Random reads that were major faults: the swap-in latency.
    major_faults: Summary,
    /// Random reads that were not (resident, or in the swap cache).
    other_reads: Summary,
    /// Random reads of pages that mincore(2) said were not resident just before: the page came
    /// in from the swap device or, under `hydramem run`, from the pager, whose page-ins the
    /// kernel does not count as major faults. Fault to resume, as the program sees it, for
    /// both. (Under `run` this includes the pages the pager still held in its standby pool,
    /// which a swap device's swap cache would count as resident.)
    absent_reads: Summary,
    /// The in-order read of every page at the end, MiB/s.
    sweep_mib_per_s: f64,
    /// Pages that read back with bytes other than those written.
    wrong_pages: u64,
    /// The first few of them.
    first_wrong: Vec<usize>,
}

/// Major faults this thread has taken so far.
fn major_faults() -> u64 {
    // SAFETY: `getrusage` writes one `rusage` to the pointer, which points to a zeroed value
    // of that type owned by this frame.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_THREAD is valid on Linux, the only system this runs on.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    if rc != 0 {
        return 0;
    }
    u64::try_from(ru.ru_majflt).unwrap_or(0)
}

fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} pages ({eta} left)")
            .expect("constant template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// Runs the three phases on a region of `pages` pages.
fn probe(pages: usize, accesses: u64, seed: u64) -> Report {
    let mut region = Region::with_capacity(pages, seed);
    let mut writes = Latencies::default();
    let bar = progress(pages as u64, "writing");
    let t0 = Instant::now();
    while region.len() < pages {
        let t = Instant::now();
        region.push();
        writes.record(t.elapsed());
        if region.len().is_multiple_of(4096) {
            bar.set_position(region.len() as u64);
        }
    }
    let populate_seconds = t0.elapsed().as_secs_f64();
    bar.finish_and_clear();

    let (mut major, mut other) = (Latencies::default(), Latencies::default());
    let mut absent = Latencies::default();
    let mut wrong = Vec::new();
    let mut rng = SmallRng::seed_from_u64(seed);
    let bar = progress(accesses, "random reads");
    for n in 0..accesses {
        let i = rng.random_range(0..pages);
        let out = region.resident(i) == Some(false);
        let before = major_faults();
        let t = Instant::now();
        region.touch(i);
        let took = t.elapsed();
        if major_faults() > before {
            major.record(took);
        } else {
            other.record(took);
        }
        if out {
            absent.record(took);
        }
        if !region.holds(i) {
            wrong.push(i);
        }
        if n.is_multiple_of(1024) {
            bar.set_position(n);
        }
    }
    bar.finish_and_clear();

    let t = Instant::now();
    wrong.extend((0..pages).filter(|&i| !region.holds(i)));
    let sweep = t.elapsed().as_secs_f64();
    Report {
        pages,
        page_cluster: std::fs::read_to_string("/proc/sys/vm/page-cluster")
            .ok()
            .and_then(|s| s.trim().parse().ok()),
        populate_seconds,
        page_writes: writes.summary(),
        major_faults: major.summary(),
        other_reads: other.summary(),
        absent_reads: absent.summary(),
        sweep_mib_per_s: (pages * PAGE) as f64 / (1 << 20) as f64 / sweep.max(1e-9),
        wrong_pages: wrong.len() as u64,
        first_wrong: wrong.into_iter().take(8).collect(),
    }
}

/// The report as text, one line per phase.
fn text(r: &Report) -> String {
    let cluster = r.page_cluster.map_or("unknown".into(), |c| {
        format!("{c} ({} pages per swap-in)", 1u32 << c.min(31))
    });
    let mib = (r.pages * PAGE) >> 20;
    let share = 100.0 * r.major_faults.count as f64
        / (r.major_faults.count + r.other_reads.count).max(1) as f64;
    format!(
        "fault-probe: {} pages ({mib} MiB), page-cluster {cluster}\n\
         page writes: {mib} MiB in {:.1} s ({:.0} MiB/s); µs p50/p90/p99/p99.9 {}\n\
         random reads: {} major faults ({share:.0}%), µs p50/p90/p99/p99.9 {}; other reads {} µs p50 {:.2}\n\
         random reads of pages not resident before: {}, µs p50/p90/p99/p99.9 {}\n\
         every page read in order at {:.0} MiB/s; wrong pages: {}\n",
        r.pages,
        r.populate_seconds,
        mib as f64 / r.populate_seconds.max(1e-9),
        r.page_writes.line(),
        r.major_faults.count,
        r.major_faults.line(),
        r.other_reads.count,
        r.other_reads.p50_us,
        r.absent_reads.count,
        r.absent_reads.line(),
        r.sweep_mib_per_s,
        r.wrong_pages,
    )
}

fn main() -> Result<()> {
    let a = Args::parse();
    let bytes = a
        .mib
        .checked_mul(1 << 20)
        .and_then(|b| usize::try_from(b).ok())
        .with_context(|| format!("--mib {} does not fit this machine's address space", a.mib))?;
    if a.mib == 0 {
        bail!("--mib 0: the probe needs at least one MiB of pages to write");
    }
    let r = probe(bytes / PAGE, a.accesses, a.seed);
    print!("{}", text(&r));
    std::io::stdout().flush()?;
    if let Some(path) = &a.json {
        let json = serde_json::to_string_pretty(&r)?;
        std::fs::write(path, json)
            .with_context(|| format!("cannot write the report to {}", path.display()))?;
    }
    if r.wrong_pages > 0 {
        bail!(
            "{} pages read back with bytes that were not written to them (first: {:?}): the swap \
             path returned wrong data",
            r.wrong_pages,
            r.first_wrong
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_without_pressure_reads_everything_back() {
        let r = probe(512, 2000, 3);
        assert_eq!(r.wrong_pages, 0);
        assert_eq!(r.page_writes.count, 512);
        assert_eq!(r.major_faults.count + r.other_reads.count, 2000);
        // Nothing was pushed out: every page was resident when read.
        assert_eq!(r.absent_reads.count, 0);
        let t = text(&r);
        assert!(
            t.contains("512 pages") && t.contains("wrong pages: 0"),
            "{t}"
        );
    }
}
