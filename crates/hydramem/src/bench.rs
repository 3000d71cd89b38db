//! The data-path benchmark behind `hydramem bench` (and the figures of `hydramem demo`).
//!
//! Every scheme gets its own client (fresh identity) against the same nodes — `ssd-backup`
//! a `single` one behind its backup file, which every page operation goes through — and the phases are
//! interleaved across schemes so that the machine's noise falls on all of them alike:
//! 1. populate: each scheme writes its whole working set with `depth` threads (write
//!    throughput), then the nodes' per-slab counters (`held`: slots written and not
//!    discarded) give the bytes they hold for it per byte of data — measured, not computed
//!    from k and r — and their resident memory;
//! 2. `rounds` rounds, each running every scheme in turn for `latency_ops / rounds` page writes
//!    then as many page reads at queue depth 1 (one thread, random pages);
//! 3. `rounds` rounds of read throughput with `depth` threads, `duration / rounds` per scheme.
//!
//! Throughput phases also take the process CPU time (user + system, all threads) per page.
//! Every page read is checked against the bytes written; mismatches are counted and reported
//! (they must be 0). Latencies go to HDR histograms (1 ns resolution, 3 significant digits).
//! Each client frees its slabs at the end.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::backup::{BackupConfig, BackupError, FrontStore};
use crate::client::{ClientConfig, IoError, Page, RemoteMemory};
use crate::cluster::Cluster;
use crate::nbd::PageStore;
use crate::PAGE_SIZE;
use crate::{rpc, status};

mod failures;
mod regeneration;
mod scheme;
pub use failures::{failure_scenarios, ScenarioResult};
pub use regeneration::{loopback_bandwidth, regeneration, RegenResult};
pub use scheme::{BenchScheme, BenchSchemeError};

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Pages in the working set.
    pub pages: u64,
    /// Operations in each queue-depth-1 latency phase.
    pub latency_ops: u64,
    /// Threads for the throughput phases.
    pub depth: usize,
    /// Consecutive pages per request in the throughput phases: one batched call
    /// (`read_pages`/`write_pages`) per request; 1 uses the single-page calls.
    pub request_pages: usize,
    /// Duration of the read-throughput phase per scheme.
    pub duration: Duration,
    /// Rounds the latency and throughput phases are cut into, schemes interleaved per round.
    pub rounds: u64,
    /// How long a waiting thread polls before sleeping.
    pub poll: Duration,
    /// Span schemes' compaction ceiling ([`ClientConfig::span_max_cost`]).
    pub span_max_cost: Option<f64>,
    /// Seed of the page contents and access order.
    pub seed: u64,
    /// Corruption injected while measuring (paper Fig. 11): every latency round runs twice,
    /// clean and then with every node flipping a bit in this many READV reply entries per
    /// million (0: no corrupted rounds; the nodes must allow fault injection). Reads that
    /// fail or return wrong bytes in corrupted rounds are counted, not fatal; the throughput
    /// phase stays clean.
    pub corrupt_ppm: u32,
    /// The backup file of the `ssd-backup` scheme.
    pub backup: BackupConfig,
    /// How late the slowed node answers every request in `--failures`' slow scenario.
    pub slow_reply: Duration,
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
    /// Bytes held by the nodes for this client per byte of page data, after populating.
    pub remote_bytes_per_data_byte: f64,
    /// The same at the end of the run, after the random single-page overwrites of the
    /// latency rounds (what garbage costs span coding, net of its compaction).
    pub remote_bytes_per_data_byte_end: f64,
    /// Span coding: what its store held and did by the end of the run.
    pub span: Option<crate::span::SpanStats>,
    /// Largest resident set of a node after populating, bytes.
    pub node_rss_max: u64,
    /// Largest (resident set − bytes of slab memory written) over the nodes: the node's own
    /// overhead beyond the data it holds (stricter than the target "resident ≤ allocated slabs
    /// + 64 MiB", since slabs are mapped lazily and only written bytes are resident).
    pub node_overhead_max: i64,
    /// Reads that returned bytes other than those written (must be 0 without injected
    /// corruption).
    pub verify_errors: u64,
    /// Reads that failed (only counted under injected corruption; otherwise fatal).
    pub read_errors: u64,
    /// Read splits found corrupted (failed checksum, or outvoted by correction).
    pub corrupt_splits: u64,
    /// Reads that had to decode.
    pub decodes: u64,
    /// QD1 latency in the corrupted rounds (when corruption was injected).
    pub corrupted: Option<CorruptedLatency>,
    /// Reads that correction mode put right.
    pub corrected: u64,
    /// Reads that started with extra splits because a node was above the error-correction
    /// limit.
    pub wide_reads: u64,
}

/// QD1 latency while every node corrupts replies.
#[derive(Debug, Clone, Serialize)]
pub struct CorruptedLatency {
    /// Write latency.
    pub write_latency: Latency,
    /// Read latency.
    pub read_latency: Latency,
}

/// A progress callback: phase name, done, total.
pub type Progress<'a> = &'a (dyn Fn(&str, u64, u64) + Sync);

/// One step of xorshift64: a fast, seedable sequence for page contents and access order
/// (statistical quality is irrelevant here; reproducibility from a seed is what matters).
fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Fills `page` with bytes determined by (seed, addr, version): cheap, and different for every
/// page and every overwrite, so a misplaced or stale split shows up as a mismatch.
pub fn fill_page(page: &mut Page, seed: u64, addr: u64, version: u64) {
    let mut x = seed
        ^ addr.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ version.wrapping_mul(0xD1B5_4A32_D192_ED03)
        | 1;
    for c in page.chunks_exact_mut(8) {
        c.copy_from_slice(&xorshift(&mut x).to_le_bytes());
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
    #[error("{scheme}")]
    Client {
        /// Scheme.
        scheme: String,
        /// Why.
        source: crate::client::ClientError,
    },
    /// A page operation failed.
    #[error("{scheme}")]
    Io {
        /// Scheme.
        scheme: String,
        /// Why.
        source: IoError,
    },
    /// The backup file of `ssd-backup` could not be created or closed.
    #[error("{scheme}")]
    Backup {
        /// Scheme.
        scheme: String,
        /// Why.
        source: BackupError,
    },
    /// Corruption could not be injected.
    #[error("injecting corruption: {0}")]
    Inject(crate::rpc::RpcError),
}

/// Sets (or, with `None`, clears) injected reply corruption on every node of `cluster`.
fn corrupt_all(cluster: &Cluster, c: Option<crate::wire::Corruption>) -> Result<(), BenchError> {
    use crate::wire::Fault;
    for n in &cluster.nodes {
        let f = c.map_or(Fault::Clear, Fault::CorruptReplies);
        rpc::inject(n.addr, f, &rpc::Access::of(cluster), Duration::from_secs(2))
            .map_err(BenchError::Inject)?;
    }
    Ok(())
}

/// Populates the working set of one scheme with `depth` threads; returns the throughput.
fn populate(
    mem: &dyn PageStore,
    o: &BenchOptions,
    label: &str,
    progress: Progress<'_>,
) -> Result<Throughput, IoError> {
    let done = AtomicU64::new(0);
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    let first_err = parking_lot::Mutex::new(None);
    std::thread::scope(|s| {
        for t in 0..o.depth as u64 {
            let (done, first_err) = (&done, &first_err);
            s.spawn(move || {
                let per = o.request_pages.max(1) as u64;
                let mut buf = vec![[0u8; PAGE_SIZE]; per as usize];
                // Thread t writes requests t, t + depth, ...: `per` consecutive pages each.
                let mut first = t * per;
                while first < o.pages {
                    let n = per.min(o.pages - first) as usize;
                    for (i, page) in buf[..n].iter_mut().enumerate() {
                        fill_page(page, o.seed, first + i as u64, 0);
                    }
                    let addr = first * PAGE_SIZE as u64;
                    let r = if per == 1 {
                        mem.write_page(addr, &buf[0])
                    } else {
                        mem.write_pages(addr, &buf[..n])
                    };
                    if let Err(e) = r {
                        first_err.lock().get_or_insert(e);
                        return;
                    }
                    let d = done.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
                    if d / 1024 != (d - n as u64) / 1024 {
                        progress(&format!("populate {label}"), d, o.pages);
                    }
                    first += o.depth as u64 * per;
                }
            });
        }
    });
    if let Some(e) = first_err.into_inner() {
        return Err(e);
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = (cpu_time() - cpu0).as_secs_f64();
    Ok(Throughput {
        pages_per_s: o.pages as f64 / wall,
        gb_per_s: o.pages as f64 * PAGE_SIZE as f64 / wall / 1e9,
        cpu_us_per_page: cpu * 1e6 / o.pages as f64,
    })
}

/// Reads random pages with `depth` threads for `duration`; returns (pages, wall s, cpu s).
fn read_load(
    mem: &dyn PageStore,
    o: &BenchOptions,
    duration: Duration,
    salt: u64,
    verify_errors: &AtomicU64,
    read_errors: &AtomicU64,
) -> Result<(u64, f64, f64), IoError> {
    let done = AtomicU64::new(0);
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    let first_err = parking_lot::Mutex::new(None);
    std::thread::scope(|s| {
        for t in 0..o.depth as u64 {
            let (done, first_err) = (&done, &first_err);
            s.spawn(move || {
                let per = (o.request_pages.max(1) as u64).min(o.pages);
                let mut buf = vec![[0u8; PAGE_SIZE]; per as usize];
                let mut expect = [0u8; PAGE_SIZE];
                let mut x = o.seed ^ (salt * 64 + t + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                while t0.elapsed() < duration {
                    // A random request-aligned span of `per` pages.
                    let first = xorshift(&mut x) % (o.pages / per) * per;
                    let addr = first * PAGE_SIZE as u64;
                    let r = if per == 1 {
                        mem.read_page(addr, &mut buf[0])
                    } else {
                        mem.read_pages(addr, &mut buf)
                    };
                    if let Err(e) = r {
                        if o.corrupt_ppm > 0 {
                            read_errors.fetch_add(1, Ordering::Relaxed);
                            done.fetch_add(per, Ordering::Relaxed);
                            continue;
                        }
                        first_err.lock().get_or_insert(e);
                        return;
                    }
                    for (i, page) in buf.iter().enumerate() {
                        fill_page(&mut expect, o.seed, first + i as u64, 0);
                        if *page != expect {
                            verify_errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    done.fetch_add(per, Ordering::Relaxed);
                }
            });
        }
    });
    if let Some(e) = first_err.into_inner() {
        return Err(e);
    }
    Ok((
        done.load(Ordering::Relaxed),
        t0.elapsed().as_secs_f64(),
        (cpu_time() - cpu0).as_secs_f64(),
    ))
}

/// The bytes the nodes hold for the client with identity fingerprint `fp` (the slots its
/// slabs ever had written, from the nodes' own counters), and the largest resident set of a
/// node with the largest node memory beyond the data it holds.
fn held_by(cluster: &Cluster, fp: u32) -> (u64, u64, i64) {
    let mut held = 0u64;
    let (mut node_rss_max, mut node_overhead_max) = (0u64, i64::MIN);
    for n in &cluster.nodes {
        if let Ok(st) = status::fetch(n.addr, &rpc::Access::of(cluster), Duration::from_secs(2)) {
            held += st
                .slabs
                .iter()
                .filter(|s| s.owner == fp)
                .map(|s| s.held)
                .sum::<u64>();
            // Data held, plus the pre-allocated (backed, still empty) slabs.
            let data: u64 =
                st.slabs.iter().map(|s| s.held).sum::<u64>() + st.pool_slabs as u64 * st.slab_size;
            node_rss_max = node_rss_max.max(st.rss);
            node_overhead_max = node_overhead_max.max(st.rss as i64 - data as i64);
        }
    }
    (held, node_rss_max, node_overhead_max)
}

/// Per-scheme state while the interleaved phases run.
struct Run {
    scheme: String,
    front: FrontStore,
    /// The client's identity fingerprint, as the nodes' statistics name its slabs.
    fp: u32,
    /// What the scheme's page operations go through.
    store: std::sync::Arc<dyn PageStore>,
    write_throughput: Throughput,
    remote_bytes_per_data_byte: f64,
    node_rss_max: u64,
    node_overhead_max: i64,
    wh: Histogram<u64>,
    rh: Histogram<u64>,
    /// Histograms of the corrupted rounds.
    cwh: Histogram<u64>,
    crh: Histogram<u64>,
    reads: (u64, f64, f64),
    verify_errors: AtomicU64,
    read_errors: AtomicU64,
}

/// Runs every scheme (with per-split checksums or not) against `cluster`, interleaving the
/// measurements (see the module doc).
pub fn run(
    cluster: &Cluster,
    schemes: &[BenchScheme],
    o: &BenchOptions,
    progress: Progress<'_>,
) -> Result<Vec<SchemeResult>, BenchError> {
    let mut runs = Vec::new();
    for s in schemes {
        let scheme = s.label();
        let mut cfg = ClientConfig::new(s.store.resilience(), o.pages * PAGE_SIZE as u64);
        cfg.poll = o.poll;
        cfg.span_max_cost = o.span_max_cost;
        cfg.checksums = s.checksums;
        cfg.ablation = s.ablation;
        if o.corrupt_ppm > 0 {
            // Every node corrupts alike: moving slabs cannot escape it, so measure the reads'
            // answer to it (wide reads above the error-correction limit, judged often enough
            // to follow the rounds) and not a stampede of evacuations.
            cfg.slab_regeneration_limit = 1.0;
            cfg.error_window = 100;
        }
        let mem = RemoteMemory::connect(cluster, cfg).map_err(|source| BenchError::Client {
            scheme: scheme.clone(),
            source,
        })?;
        let fp = mem.owner().fingerprint();
        let front =
            FrontStore::new(mem, s.store, &o.backup).map_err(|source| BenchError::Backup {
                scheme: scheme.clone(),
                source,
            })?;
        let store = front.store();
        let write_throughput =
            populate(&*store, o, &scheme, progress).map_err(|source| BenchError::Io {
                scheme: scheme.clone(),
                source,
            })?;
        let (held, node_rss_max, node_overhead_max) = held_by(cluster, fp);
        runs.push(Run {
            scheme,
            front,
            fp,
            store,
            write_throughput,
            remote_bytes_per_data_byte: held as f64 / (o.pages * PAGE_SIZE as u64) as f64,
            node_rss_max,
            node_overhead_max,
            wh: hist(),
            rh: hist(),
            cwh: hist(),
            crh: hist(),
            reads: (0, 0.0, 0.0),
            verify_errors: AtomicU64::new(0),
            read_errors: AtomicU64::new(0),
        });
    }
    let rounds = o.rounds.max(1);
    let per_round = o.latency_ops.div_ceil(rounds);
    let mut x = o.seed | 1;
    let mut next = move || xorshift(&mut x);
    let mut page = [0u8; PAGE_SIZE];
    let mut expect = [0u8; PAGE_SIZE];
    let nruns = runs.len() as u64;
    let total = rounds * nruns;
    // Clean rounds, and (with corruption) each followed by a corrupted one.
    let phases: &[bool] = if o.corrupt_ppm > 0 {
        &[false, true]
    } else {
        &[false]
    };
    for round in 0..rounds {
        for &corrupted in phases {
            if o.corrupt_ppm > 0 {
                let c = corrupted.then_some(crate::wire::Corruption {
                    ppm: o.corrupt_ppm,
                    slab: None,
                });
                corrupt_all(cluster, c)?;
            }
            for (i, r) in runs.iter_mut().enumerate() {
                progress(
                    "QD1 latency, all schemes interleaved",
                    round * nruns + i as u64,
                    total,
                );
                let err = |source| BenchError::Io {
                    scheme: r.scheme.clone(),
                    source,
                };
                let (wh, rh) = match corrupted {
                    false => (&mut r.wh, &mut r.rh),
                    true => (&mut r.cwh, &mut r.crh),
                };
                for _ in 0..per_round {
                    let p = next() % o.pages;
                    fill_page(&mut page, o.seed, p, 0);
                    let t = Instant::now();
                    r.store
                        .write_page(p * PAGE_SIZE as u64, &page)
                        .map_err(err)?;
                    wh.record(t.elapsed().as_nanos() as u64).ok();
                }
                for _ in 0..per_round {
                    let p = next() % o.pages;
                    let t = Instant::now();
                    let res = r.store.read_page(p * PAGE_SIZE as u64, &mut page);
                    rh.record(t.elapsed().as_nanos() as u64).ok();
                    match res {
                        Err(_) if corrupted => {
                            r.read_errors.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        res => res.map_err(err)?,
                    }
                    fill_page(&mut expect, o.seed, p, 0);
                    if page != expect {
                        r.verify_errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }
    if o.corrupt_ppm > 0 {
        corrupt_all(cluster, None)?;
    }
    let slice = o.duration / rounds as u32;
    for round in 0..rounds {
        for (i, r) in runs.iter_mut().enumerate() {
            progress(
                "read throughput, all schemes interleaved",
                round * nruns + i as u64,
                total,
            );
            let (n, wall, cpu) =
                read_load(&*r.store, o, slice, round, &r.verify_errors, &r.read_errors).map_err(
                    |source| BenchError::Io {
                        scheme: r.scheme.clone(),
                        source,
                    },
                )?;
            r.reads = (r.reads.0 + n, r.reads.1 + wall, r.reads.2 + cpu);
        }
    }
    progress("done", total, total);
    let mut out = Vec::new();
    for r in runs {
        let (n, wall, cpu) = r.reads;
        let mem = r.front.mem();
        let decodes = mem.stats().decodes.load(Ordering::Relaxed);
        let held_end = held_by(cluster, r.fp).0;
        let span = r.front.span().map(|s| s.stats());
        r.front.close().map_err(|source| BenchError::Backup {
            scheme: r.scheme.clone(),
            source,
        })?;
        mem.free_all().map_err(|source| BenchError::Client {
            scheme: r.scheme.clone(),
            source,
        })?;
        out.push(SchemeResult {
            scheme: r.scheme,
            write_latency: Latency::from(&r.wh),
            read_latency: Latency::from(&r.rh),
            write_throughput: r.write_throughput,
            read_throughput: Throughput {
                pages_per_s: n as f64 / wall,
                gb_per_s: n as f64 * PAGE_SIZE as f64 / wall / 1e9,
                cpu_us_per_page: cpu * 1e6 / n.max(1) as f64,
            },
            remote_bytes_per_data_byte: r.remote_bytes_per_data_byte,
            remote_bytes_per_data_byte_end: held_end as f64 / (o.pages * PAGE_SIZE as u64) as f64,
            span,
            node_rss_max: r.node_rss_max,
            node_overhead_max: r.node_overhead_max,
            verify_errors: r.verify_errors.load(Ordering::Relaxed),
            read_errors: r.read_errors.load(Ordering::Relaxed),
            corrupt_splits: mem.corrupt_splits().iter().sum(),
            decodes,
            corrupted: (o.corrupt_ppm > 0).then(|| CorruptedLatency {
                write_latency: Latency::from(&r.cwh),
                read_latency: Latency::from(&r.crh),
            }),
            corrected: mem.stats().corrected.load(Ordering::Relaxed),
            wide_reads: mem.stats().wide_reads.load(Ordering::Relaxed),
        });
    }
    Ok(out)
}
