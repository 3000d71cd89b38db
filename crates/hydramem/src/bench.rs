//! The data-path benchmark behind `hydramem bench` (and the figures of `hydramem demo`).
//!
//! For one resilience scheme against a running cluster it measures, in this order:
//! 1. populate: every page of the working set written by `depth` threads (write throughput);
//! 2. page write latency at queue depth 1 (one thread, random pages);
//! 3. page read latency at queue depth 1;
//! 4. read throughput with `depth` threads for a fixed time.
//!
//! Around 1 and 4 it takes the process CPU time (user + system, all threads) per page, and
//! after 1 the bytes the nodes hold for this client per byte of data, read from the nodes' per-slab
//! counters (`touched`), not computed from k and r. Every page read is checked against the
//! bytes written; mismatches are counted and reported (they must be 0).
//!
//! Latencies are recorded per operation in HDR histograms (1 ns resolution, 3 significant
//! digits). The caller runs schemes one after another against the same nodes; each scheme uses
//! a fresh client identity and frees its slabs at the end.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::client::{ClientConfig, IoError, Page, RemoteMemory, Resilience};
use crate::cluster::Cluster;
use crate::status;
use crate::PAGE_SIZE;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Pages in the working set.
    pub pages: u64,
    /// Operations in each queue-depth-1 latency phase.
    pub latency_ops: u64,
    /// Threads for the throughput phases.
    pub depth: usize,
    /// Duration of the read-throughput phase.
    pub duration: Duration,
    /// How long a waiting thread polls before sleeping.
    pub poll: Duration,
    /// Seed of the page contents and access order.
    pub seed: u64,
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Mean.
    pub mean_us: f64,
    /// Samples.
    pub samples: u64,
}

impl Latency {
    fn from(h: &Histogram<u64>) -> Latency {
        let us = |v: u64| v as f64 / 1000.0;
        Latency {
            p50_us: us(h.value_at_quantile(0.5)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            mean_us: h.mean() / 1000.0,
            samples: h.len(),
        }
    }
}

/// Throughput of one phase.
#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    /// Pages per second.
    pub pages_per_s: f64,
    /// Gigabytes (1e9 bytes) of page data per second.
    pub gb_per_s: f64,
    /// Process CPU time per page, microseconds.
    pub cpu_us_per_page: f64,
}

/// Everything measured for one scheme.
#[derive(Debug, Clone, Serialize)]
pub struct SchemeResult {
    /// Scheme label.
    pub scheme: String,
    /// QD1 page write latency.
    pub write_latency: Latency,
    /// QD1 page read latency.
    pub read_latency: Latency,
    /// Populate (write) throughput at the configured depth.
    pub write_throughput: Throughput,
    /// Read throughput at the configured depth.
    pub read_throughput: Throughput,
    /// Bytes held by the nodes for this client per byte of page data.
    pub remote_bytes_per_data_byte: f64,
    /// Reads that returned bytes other than those written (must be 0).
    pub verify_errors: u64,
    /// Reads that had to decode.
    pub decodes: u64,
}

/// A progress callback: phase name, done, total.
pub type Progress<'a> = &'a (dyn Fn(&str, u64, u64) + Sync);

/// Fills `page` with bytes determined by (seed, addr, version): cheap, and different for every
/// page and every overwrite, so a misplaced or stale split shows up as a mismatch.
pub fn fill_page(page: &mut Page, seed: u64, addr: u64, version: u64) {
    let mut x = seed
        ^ addr.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ version.wrapping_mul(0xD1B5_4A32_D192_ED03)
        | 1;
    for c in page.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes());
    }
}

fn cpu_time() -> Duration {
    // SAFETY: getrusage writes only into the struct we pass; zeroed is a valid initial value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
}

/// Errors of a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The client could not start.
    #[error("{scheme}: {source}")]
    Client {
        /// Scheme.
        scheme: String,
        /// Why.
        source: crate::client::ClientError,
    },
    /// A page operation failed.
    #[error("{scheme}: {source}")]
    Io {
        /// Scheme.
        scheme: String,
        /// Why.
        source: IoError,
    },
}

/// Runs all phases for one scheme.
pub fn run_scheme(
    cluster: &Cluster,
    resilience: Resilience,
    o: &BenchOptions,
    progress: Progress<'_>,
) -> Result<SchemeResult, BenchError> {
    let scheme = resilience.label();
    let mut cfg = ClientConfig::new(resilience, o.pages * PAGE_SIZE as u64);
    cfg.poll = o.poll;
    let client_id = cfg.client_id;
    let mem = RemoteMemory::connect(cluster, cfg).map_err(|source| BenchError::Client {
        scheme: scheme.clone(),
        source,
    })?;
    let io_err = |source| BenchError::Io {
        scheme: scheme.clone(),
        source,
    };
    let seed = o.seed;
    let verify_errors = AtomicU64::new(0);

    // 1. Populate with `depth` threads: write throughput.
    let done = AtomicU64::new(0);
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    let first_err = parking_lot::Mutex::new(None);
    std::thread::scope(|s| {
        for t in 0..o.depth as u64 {
            let (mem, done, first_err) = (&mem, &done, &first_err);
            s.spawn(move || {
                let mut page = [0u8; PAGE_SIZE];
                let mut p = t;
                while p < o.pages {
                    fill_page(&mut page, seed, p, 0);
                    if let Err(e) = mem.write_page(p * PAGE_SIZE as u64, &page) {
                        first_err.lock().get_or_insert(e);
                        return;
                    }
                    let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                    if d % 1024 == 0 {
                        progress("populate", d, o.pages);
                    }
                    p += o.depth as u64;
                }
            });
        }
    });
    if let Some(e) = first_err.into_inner() {
        return Err(io_err(e));
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = (cpu_time() - cpu0).as_secs_f64();
    let write_throughput = Throughput {
        pages_per_s: o.pages as f64 / wall,
        gb_per_s: o.pages as f64 * PAGE_SIZE as f64 / wall / 1e9,
        cpu_us_per_page: cpu * 1e6 / o.pages as f64,
    };

    // Remote bytes per data byte, from the nodes' own counters.
    let fp = client_id.fingerprint();
    let mut held = 0u64;
    for n in &cluster.nodes {
        if let Ok(st) = status::fetch(n.addr, Duration::from_secs(2)) {
            held += st
                .slabs
                .iter()
                .filter(|s| s.owner == fp)
                .map(|s| s.touched)
                .sum::<u64>();
        }
    }
    let remote_bytes_per_data_byte = held as f64 / (o.pages * PAGE_SIZE as u64) as f64;

    // 2 and 3. Queue-depth-1 latency.
    let mut rng = o.seed | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut page = [0u8; PAGE_SIZE];
    let mut wh = hist();
    for i in 0..o.latency_ops {
        let p = next() % o.pages;
        fill_page(&mut page, seed, p, 0);
        let t = Instant::now();
        mem.write_page(p * PAGE_SIZE as u64, &page)
            .map_err(io_err)?;
        wh.record(t.elapsed().as_nanos() as u64).ok();
        if i % 256 == 0 {
            progress("write latency", i, o.latency_ops);
        }
    }
    let mut rh = hist();
    let mut expect = [0u8; PAGE_SIZE];
    for i in 0..o.latency_ops {
        let p = next() % o.pages;
        let t = Instant::now();
        mem.read_page(p * PAGE_SIZE as u64, &mut page)
            .map_err(io_err)?;
        rh.record(t.elapsed().as_nanos() as u64).ok();
        fill_page(&mut expect, seed, p, 0);
        if page != expect {
            verify_errors.fetch_add(1, Ordering::Relaxed);
        }
        if i % 256 == 0 {
            progress("read latency", i, o.latency_ops);
        }
    }

    // 4. Read throughput at depth.
    let done = AtomicU64::new(0);
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    let first_err = parking_lot::Mutex::new(None);
    std::thread::scope(|s| {
        for t in 0..o.depth as u64 {
            let (mem, done, first_err, verify_errors) = (&mem, &done, &first_err, &verify_errors);
            s.spawn(move || {
                let mut page = [0u8; PAGE_SIZE];
                let mut expect = [0u8; PAGE_SIZE];
                let mut x = seed ^ (t + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                while t0.elapsed() < o.duration {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let p = x % o.pages;
                    if let Err(e) = mem.read_page(p * PAGE_SIZE as u64, &mut page) {
                        first_err.lock().get_or_insert(e);
                        return;
                    }
                    fill_page(&mut expect, seed, p, 0);
                    if page != expect {
                        verify_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                    if d % 1024 == 0 {
                        let ms = t0.elapsed().as_millis() as u64;
                        progress("read throughput", ms, o.duration.as_millis() as u64);
                    }
                }
            });
        }
    });
    if let Some(e) = first_err.into_inner() {
        return Err(io_err(e));
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = (cpu_time() - cpu0).as_secs_f64();
    let reads = done.load(Ordering::Relaxed);
    let read_throughput = Throughput {
        pages_per_s: reads as f64 / wall,
        gb_per_s: reads as f64 * PAGE_SIZE as f64 / wall / 1e9,
        cpu_us_per_page: cpu * 1e6 / reads.max(1) as f64,
    };
    let decodes = mem.stats().decodes.load(Ordering::Relaxed);
    mem.free_all().map_err(|source| BenchError::Client {
        scheme: scheme.clone(),
        source,
    })?;
    Ok(SchemeResult {
        scheme,
        write_latency: Latency::from(&wh),
        read_latency: Latency::from(&rh),
        write_throughput,
        read_throughput,
        remote_bytes_per_data_byte,
        verify_errors: verify_errors.load(Ordering::Relaxed),
        decodes,
    })
}
