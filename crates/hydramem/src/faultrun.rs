//! The fault-run harness: a seeded, write-heavy random workload over many threads while memory
//! nodes are killed (SIGKILL), paused (SIGSTOP/SIGCONT), restarted empty, slowed down, and
//! squeezed (their machine's memory simulated as exhausted, so they reclaim every slab and the
//! client must move them) at random times, never more than `max_faults` at once, with a checker that every acknowledged
//! write reads back exactly — during the run and at the end.
//!
//! Each worker thread owns the pages `p ≡ t (mod threads)`, so the last acknowledged value of
//! a page is well defined. A write that fails leaves its page *uncertain* between the old and
//! the new value until a later operation settles it; a read must return the last acknowledged
//! value (or one of the two uncertain ones), and anything else is counted as a wrong read. A
//! fault counts against `max_faults` from its injection until it is healed *and* the client
//! has repaired and regenerated every range it touched, so at no moment are more than
//! `max_faults` splits of a page missing. Used by `hydramem soak` and `tests/faultrun.rs`.
//!
//! With `corruption`, the client keeps per-split checksums and the chaos also makes nodes
//! corrupt their replies: bit flips on the wire and misdirected reads (another page's split
//! under the right version), each on a fifth of the replies of the impaired node, counted
//! against `max_faults` like a lost node. The client's error limits move its slabs off such a
//! node while it corrupts, and healing it means replacing it (a restart, empty). The same
//! checker then proves that no corrupted byte reaches a reader.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::bench::fill_page;
use crate::client::{ClientConfig, Mode, RemoteMemory, Resilience};
use crate::embedded::{EmbeddedCluster, EmbeddedOptions};
use crate::nbd::PageStore;
use crate::span::SpanStore;
use crate::wire::Fault;
use crate::PAGE_SIZE;

/// What to run.
#[derive(Debug, Clone)]
pub struct FaultRunOptions {
    /// The `hydramem` binary for the node processes.
    pub binary: std::path::PathBuf,
    /// Seed of the workload and of the faults.
    pub seed: u64,
    /// Memory nodes.
    pub nodes: usize,
    /// Worker threads.
    pub threads: usize,
    /// Pages in the working set.
    pub pages: u64,
    /// Slab size.
    pub slab_size: u64,
    /// Length of the faulty phase.
    pub duration: Duration,
    /// Most faults at once (r for the 8+2 code used).
    pub max_faults: usize,
    /// Checksums on, and corrupting nodes among the faults (see the module doc).
    pub corruption: bool,
    /// The scheme: hydra 8+2 Δ=1 ([`HYDRA_8_2`]) or span 8+2, whose pages go through its
    /// span store (so compaction runs under the faults too). A code of r = 2 either way.
    pub scheme: Resilience,
    /// A cluster key file for the nodes and the client (`None`: no key).
    pub key_file: Option<std::path::PathBuf>,
    /// A TLS member directory for the nodes and the client (`None`: plain TCP).
    pub tls_dir: Option<std::path::PathBuf>,
    /// Membership in etcd: the nodes register there and the client follows it, so killed,
    /// paused and restarted nodes also leave and rejoin the membership (`None`: the static
    /// cluster file only).
    pub etcd: Option<crate::membership::EtcdConfig>,
}

/// The scheme fault runs use by default.
pub const HYDRA_8_2: Resilience = Resilience::Hydra {
    k: 8,
    r: 2,
    delta: 1,
    mode: Mode::FailureRecovery,
};

/// What happened.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FaultRunReport {
    /// The seed.
    pub seed: u64,
    /// Writes acknowledged.
    pub acked_writes: u64,
    /// Writes that returned an error.
    pub failed_writes: u64,
    /// Reads checked during the run.
    pub reads_checked: u64,
    /// Reads that returned an error during the run.
    pub read_errors: u64,
    /// Reads that returned bytes other than an acknowledged value (must be 0).
    pub wrong_reads: u64,
    /// Pages whose last acknowledged write did not read back at the end (must be 0).
    pub lost_writes: u64,
    /// Faults injected, in order.
    pub faults: Vec<String>,
    /// Regenerations the client ran.
    pub regenerations: u64,
    /// Read splits that failed their checksum and were read around.
    pub corrupt_splits: u64,
    /// Splits the client moved off nodes above its slab-regeneration limit.
    pub evacuated: u64,
    /// Span coding: pages compaction moved into full rows during the run (0 for hydra).
    pub compacted_pages: u64,
}

#[derive(Clone, Copy)]
enum Known {
    Exactly(u64),
    Either(u64, u64),
}

fn matches(page: &[u8; PAGE_SIZE], seed: u64, p: u64, v: u64) -> bool {
    if v == 0 {
        return page.iter().all(|b| *b == 0);
    }
    let mut want = [0u8; PAGE_SIZE];
    fill_page(&mut want, seed, p, v);
    *page == want
}

/// Checks a read against what is known of the page; settles an uncertain page.
fn check(known: &mut Known, page: &[u8; PAGE_SIZE], seed: u64, p: u64) -> bool {
    match *known {
        Known::Exactly(v) => matches(page, seed, p, v),
        Known::Either(a, b) => {
            for v in [a, b] {
                if matches(page, seed, p, v) {
                    *known = Known::Exactly(v);
                    return true;
                }
            }
            false
        }
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Impairment {
    Killed,
    Paused,
    Slow,
    /// Bit flips in a fifth of the node's READV replies.
    CorruptReplies,
    /// A fifth of the node's READV entries answered with the neighbouring slot's split.
    Misdirected,
    Squeezed,
}

/// Heals one impairment.
fn heal(cluster: &mut EmbeddedCluster, n: usize, kind: Impairment) -> Result<(), String> {
    match kind {
        // A corrupting node is healed as an operator would: replaced (restarted empty). The
        // client has usually moved its slabs off it (its error rate is far above the
        // slab-regeneration limit) and avoids it until it restarts.
        Impairment::Killed | Impairment::CorruptReplies | Impairment::Misdirected => {
            cluster.restart(n).map(drop).map_err(|e| e.to_string())
        }
        Impairment::Paused => cluster.resume(n).map_err(|e| e.to_string()),
        Impairment::Slow | Impairment::Squeezed => {
            cluster.inject(n, Fault::Clear).map_err(|e| e.to_string())
        }
    }
}

/// The share of an impaired node's replies that a corruption impairment hits.
const CORRUPT_SHARE: crate::wire::Corruption = crate::wire::Corruption {
    ppm: 200_000,
    slab: None,
};

/// Runs one seeded fault run.
pub fn run(o: &FaultRunOptions) -> Result<FaultRunReport, String> {
    let mut cluster = EmbeddedCluster::start(EmbeddedOptions {
        etcd: o.etcd.clone(),
        binary: o.binary.clone(),
        nodes: o.nodes,
        slab_size: o.slab_size,
        capacity: o.slab_size * 64,
        extra_args: vec![
            "--log".into(),
            "error".into(),
            "--allow-fault-injection".into(),
            "--control-period".into(),
            "100ms".into(),
        ],
        cluster_file: None,
        key_file: o.key_file.clone(),
        tls_dir: o.tls_dir.clone(),
    })
    .map_err(|e| e.to_string())?;
    let mut cfg = ClientConfig::new(o.scheme, o.pages * PAGE_SIZE as u64);
    cfg.seed = Some(o.seed);
    cfg.straggler_after = Duration::from_millis(2);
    // Checksums are on by default; corrupting nodes need them. Error rates are judged every
    // 50 splits per node so that the limits act within a run of a few seconds.
    cfg.checksums |= o.corruption;
    if o.corruption {
        cfg.error_window = 50;
    }
    let mem = RemoteMemory::connect(cluster.cluster(), cfg).map_err(|e| e.to_string())?;
    let span = match mem.layout().span() {
        true => Some(SpanStore::new(mem.clone()).map_err(|e| e.to_string())?),
        false => None,
    };
    let store: &dyn PageStore = match &span {
        Some(s) => &**s,
        None => &*mem,
    };
    let seed = o.seed;
    let stop = AtomicBool::new(false);
    let acked = AtomicU64::new(0);
    let failed = AtomicU64::new(0);
    let reads = AtomicU64::new(0);
    let read_errors = AtomicU64::new(0);
    let wrong = AtomicU64::new(0);
    let known: Mutex<HashMap<u64, Known>> = Mutex::new(HashMap::new());
    let mut faults = Vec::new();

    std::thread::scope(|s| {
        for t in 0..o.threads as u64 {
            let (store, stop, acked, failed, reads, read_errors, wrong, known) = (
                store,
                &stop,
                &acked,
                &failed,
                &reads,
                &read_errors,
                &wrong,
                &known,
            );
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ ((t + 1) * 0x9E37));
                let mut mine: HashMap<u64, Known> = HashMap::new();
                let mut page = [0u8; PAGE_SIZE];
                let mut version = t << 40;
                let owned = o.pages / o.threads as u64;
                while !stop.load(Ordering::Relaxed) {
                    let p = rng.random_range(0..owned) * o.threads as u64 + t;
                    let addr = p * PAGE_SIZE as u64;
                    let k = *mine.get(&p).unwrap_or(&Known::Exactly(0));
                    if rng.random_bool(0.7) {
                        version += 1;
                        fill_page(&mut page, seed, p, version);
                        match store.write_page(addr, &page) {
                            Ok(()) => {
                                acked.fetch_add(1, Ordering::Relaxed);
                                mine.insert(p, Known::Exactly(version));
                            }
                            Err(e) => {
                                failed.fetch_add(1, Ordering::Relaxed);
                                tracing::warn!(page = p, error = %e, "write failed during the fault run");
                                let old = match k {
                                    Known::Exactly(v) | Known::Either(v, _) => v,
                                };
                                mine.insert(p, Known::Either(old, version));
                            }
                        }
                    } else {
                        match store.read_page(addr, &mut page) {
                            Ok(()) => {
                                reads.fetch_add(1, Ordering::Relaxed);
                                let mut k = k;
                                if !check(&mut k, &page, seed, p) {
                                    wrong.fetch_add(1, Ordering::Relaxed);
                                    tracing::error!(page = p, "read returned bytes no acknowledged write wrote");
                                }
                                mine.insert(p, k);
                            }
                            Err(e) => {
                                read_errors.fetch_add(1, Ordering::Relaxed);
                                tracing::warn!(page = p, error = %e, "read failed during the fault run");
                            }
                        }
                    }
                }
                known.lock().expect("no panics hold it").extend(mine);
            });
        }

        // Chaos: inject and heal faults at random times, at most `max_faults` at once.
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut impaired: Vec<(usize, Impairment)> = Vec::new();
        let t0 = Instant::now();
        let settle = |mem: &RemoteMemory, impaired: &[(usize, Impairment)]| {
            // A healed fault stops counting only once the client sees the node again and
            // every range is whole again.
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                let st = mem.regen_stats();
                let all_back = (0..o.nodes as u16).all(|n| {
                    mem.transport().is_up(n) || impaired.iter().any(|(m, _)| *m == n as usize)
                });
                if all_back && mem.degraded_ranges() == 0 && st.done + st.failed == st.started {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        while t0.elapsed() < o.duration {
            std::thread::sleep(Duration::from_millis(rng.random_range(100..400)));
            if impaired.len() < o.max_faults && rng.random_bool(0.6) {
                let healthy: Vec<usize> = (0..o.nodes)
                    .filter(|n| !impaired.iter().any(|(m, _)| m == n))
                    .collect();
                let n = healthy[rng.random_range(0..healthy.len())];
                let kinds = if o.corruption { 6 } else { 4 };
                let kind = match rng.random_range(0..kinds) {
                    0 => Impairment::Killed,
                    1 => Impairment::Paused,
                    2 => Impairment::Slow,
                    3 => Impairment::Squeezed,
                    4 => Impairment::CorruptReplies,
                    _ => Impairment::Misdirected,
                };
                let ok = match kind {
                    Impairment::Killed => cluster.kill(n).is_ok(),
                    Impairment::Paused => cluster.pause(n).is_ok(),
                    Impairment::Slow => cluster.inject(n, Fault::DelayReplies(5_000)).is_ok(),
                    Impairment::CorruptReplies => cluster
                        .inject(n, Fault::CorruptReplies(CORRUPT_SHARE))
                        .is_ok(),
                    Impairment::Misdirected => cluster
                        .inject(n, Fault::MisdirectReads(CORRUPT_SHARE))
                        .is_ok(),
                    // A machine of 1 GiB with nothing available: the budget drops to 0.
                    Impairment::Squeezed => {
                        cluster.inject(n, Fault::MemoryTotal(1 << 30)).is_ok()
                            && cluster.inject(n, Fault::MemoryAvailable(0)).is_ok()
                    }
                };
                if ok {
                    faults.push(format!(
                        "{:.2}s {kind:?} node {n}",
                        t0.elapsed().as_secs_f64()
                    ));
                    impaired.push((n, kind));
                }
            } else if !impaired.is_empty() {
                let (n, kind) = impaired.remove(rng.random_range(0..impaired.len()));
                let _ = heal(&mut cluster, n, kind);
                faults.push(format!(
                    "{:.2}s healed node {n}",
                    t0.elapsed().as_secs_f64()
                ));
                settle(&mem, &impaired);
            }
        }
        for (n, kind) in impaired.drain(..) {
            let _ = heal(&mut cluster, n, kind);
        }
        settle(&mem, &[]);
        stop.store(true, Ordering::Relaxed);
    });

    // The end: every page must read back its last acknowledged value.
    let known = known.into_inner().expect("no panics hold it");
    let mut lost = 0;
    let mut page = [0u8; PAGE_SIZE];
    for (&p, k) in &known {
        let mut k = *k;
        let ok = store.read_page(p * PAGE_SIZE as u64, &mut page).is_ok()
            && check(&mut k, &page, seed, p);
        if !ok {
            lost += 1;
            tracing::error!(page = p, "acknowledged write lost");
        }
    }
    Ok(FaultRunReport {
        seed,
        acked_writes: acked.load(Ordering::Relaxed),
        failed_writes: failed.load(Ordering::Relaxed),
        reads_checked: reads.load(Ordering::Relaxed),
        read_errors: read_errors.load(Ordering::Relaxed),
        wrong_reads: wrong.load(Ordering::Relaxed),
        lost_writes: lost,
        faults,
        regenerations: mem.regen_stats().done,
        corrupt_splits: mem.corrupt_splits().iter().sum(),
        evacuated: mem.stats().evacuated.load(Ordering::Relaxed),
        compacted_pages: span.as_ref().map_or(0, |s| s.stats().compacted_pages),
    })
}
