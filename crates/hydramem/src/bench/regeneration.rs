//! Paper 7.3's regeneration measurement for `hydramem bench --regeneration`: the time to
//! regenerate a slab onto a new node, as a fraction of the ideal its inbound bandwidth sets
//! (one loopback TCP stream, measured in the same run), and the regenerated split checked by
//! reading every page back after two more members die.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::{fill_page, populate, xorshift, BenchError, BenchOptions, Progress};
use crate::client::{ClientConfig, RemoteMemory, Resilience};
use crate::PAGE_SIZE;

/// One measured slab regeneration (paper 7.3: time to regenerate a slab, as a fraction of the
/// ideal set by the new node's inbound bandwidth).
#[derive(Debug, Clone, Serialize)]
pub struct RegenResult {
    /// Slab size.
    pub slab_size: u64,
    /// Split slots (pages) in the slab.
    pub pages: u64,
    /// Bytes the new node received: k splits of every page.
    pub bytes_received: u64,
    /// Wall time of the regeneration, from the REGEN request to its reply.
    pub seconds: f64,
    /// bytes_received / seconds.
    pub received_mb_s: f64,
    /// One loopback TCP stream's bandwidth measured in the same run (the ideal's denominator).
    pub loopback_mb_s: f64,
    /// Ideal time (bytes / loopback bandwidth) / measured time.
    pub fraction_of_ideal: f64,
    /// Pages read back and checked after two more members died (the regenerated split needed).
    pub verified_pages: u64,
}

/// Bandwidth of one TCP stream over loopback, bytes per second: `bytes` sent in 1 MiB writes
/// and received in 1 MiB reads, timed until the receiver has them all.
pub fn loopback_bandwidth(bytes: u64) -> std::io::Result<f64> {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let rx = std::thread::spawn(move || -> std::io::Result<u64> {
        let (mut s, _) = l.accept()?;
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0u64;
        loop {
            match s.read(&mut buf)? {
                0 => return Ok(got),
                n => got += n as u64,
            }
        }
    });
    let mut s = std::net::TcpStream::connect(addr)?;
    let buf = vec![7u8; 1 << 20];
    let t0 = Instant::now();
    let mut sent = 0u64;
    while sent < bytes {
        s.write_all(&buf)?;
        sent += buf.len() as u64;
    }
    s.shutdown(std::net::Shutdown::Write)?;
    let got = rx
        .join()
        .map_err(|_| std::io::Error::other("receiver panicked"))??;
    Ok(got as f64 / t0.elapsed().as_secs_f64())
}

/// Regenerates one slab of each size on a cluster of its own (11 nodes: a hydra 8+2 group
/// and a spare): fills one address range, kills the node holding its first split, times the
/// regeneration on the spare, then kills two more members and reads pages back (every read
/// then needs the regenerated split).
pub fn regeneration(
    binary: std::path::PathBuf,
    slab_sizes: &[u64],
    o: &BenchOptions,
    progress: Progress<'_>,
) -> Result<Vec<RegenResult>, BenchError> {
    use crate::embedded::{EmbeddedCluster, EmbeddedOptions};
    let io = |what: &str, e: String| BenchError::Client {
        scheme: what.to_string(),
        source: crate::client::ClientError::Io(std::io::Error::other(e)),
    };
    let hydra = Resilience::Hydra {
        k: 8,
        r: 2,
        delta: 1,
        mode: crate::client::Mode::FailureRecovery,
    };
    let label = hydra.label();
    let mut out = Vec::new();
    for &slab in slab_sizes {
        let loopback = loopback_bandwidth(4 << 30).map_err(|e| io("loopback", e.to_string()))?;
        let mut cluster = EmbeddedCluster::start(EmbeddedOptions {
            etcd: None,
            binary: binary.clone(),
            nodes: 11,
            slab_size: slab,
            capacity: 2 * slab,
            extra_args: vec![
                "--log".into(),
                "error".into(),
                "--prealloc".into(),
                "0".into(),
            ],
            cluster_file: None,
            key_file: None,
            tls_dir: None,
        })
        .map_err(|e| io("cluster", e.to_string()))?;
        let layout = crate::client::Layout::new(hydra, slab).map_err(|e| BenchError::Client {
            scheme: label.clone(),
            source: e.into(),
        })?;
        let pages = layout.pages_per_range;
        let mut cfg = ClientConfig::new(hydra, pages * PAGE_SIZE as u64);
        cfg.poll = o.poll;
        let mem =
            RemoteMemory::connect(cluster.cluster(), cfg).map_err(|source| BenchError::Client {
                scheme: label.clone(),
                source,
            })?;
        let fill = BenchOptions { pages, ..o.clone() };
        let phase = format!("fill a {} MiB-slab range", slab >> 20);
        populate(&*mem, &fill, &phase, progress).map_err(|source| BenchError::Io {
            scheme: label.clone(),
            source,
        })?;
        let g = mem.group_of(0).expect("populated");
        cluster
            .kill(g.nodes[0] as usize)
            .map_err(|e| io("kill", e.to_string()))?;
        let deadline = Instant::now() + Duration::from_secs(1800);
        let stats = loop {
            let s = mem.regen_stats();
            if s.failed > 0 {
                return Err(io("regeneration", "the regeneration failed".into()));
            }
            if s.done >= 1 {
                break s;
            }
            if Instant::now() > deadline {
                return Err(io(
                    "regeneration",
                    "no regeneration finished in 30 min".into(),
                ));
            }
            progress(&format!("regenerate {} MiB", slab >> 20), 0, 1);
            std::thread::sleep(Duration::from_millis(20));
        };
        for n in [g.nodes[1], g.nodes[2]] {
            cluster
                .kill(n as usize)
                .map_err(|e| io("kill", e.to_string()))?;
        }
        let (mut page, mut want) = ([0u8; PAGE_SIZE], [0u8; PAGE_SIZE]);
        let check = pages.min(4096);
        let mut x = o.seed | 1;
        for _ in 0..check {
            let p = xorshift(&mut x) % pages;
            mem.read_page(p * PAGE_SIZE as u64, &mut page)
                .map_err(|source| BenchError::Io {
                    scheme: label.clone(),
                    source,
                })?;
            fill_page(&mut want, o.seed, p, 0);
            if page != want {
                return Err(io("verify", format!("page {p} differs after regeneration")));
            }
        }
        let bytes = pages * layout.split_len as u64 * layout.k as u64;
        let secs = stats.busy.as_secs_f64();
        out.push(RegenResult {
            slab_size: slab,
            pages,
            bytes_received: bytes,
            seconds: secs,
            received_mb_s: bytes as f64 / secs / 1e6,
            loopback_mb_s: loopback / 1e6,
            fraction_of_ideal: (bytes as f64 / loopback) / secs,
            verified_pages: check,
        });
        drop(mem);
        cluster.shutdown();
    }
    Ok(out)
}
