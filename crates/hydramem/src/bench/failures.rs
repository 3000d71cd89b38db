//! Paper Fig. 12's failure scenarios for `hydramem bench --failures`: queue-depth-1 latency of
//! hydra 8+2 Δ=1, span 8+2 and replication ×2 side by side on an embedded cluster of their own,
//! healthy, with one shared node slowed, and after that node is killed (a remap and a
//! background regeneration running). Every page read is checked against the bytes written.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use std::sync::Arc;

use super::{fill_page, hist, populate, xorshift, BenchError, BenchOptions, Latency, Progress};
use crate::client::{ClientConfig, RemoteMemory, Resilience};
use crate::nbd::PageStore;
use crate::span::SpanStore;
use crate::PAGE_SIZE;

/// Queue-depth-1 latency of one scheme in one failure scenario (paper Fig. 12).
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    /// Scheme label.
    pub scheme: String,
    /// "healthy", "one node slow (+1 ms per reply)" (or the delay given), or "one node
    /// killed" while a regeneration runs or not.
    pub scenario: String,
    /// Page write latency.
    pub write_latency: Latency,
    /// Page read latency.
    pub read_latency: Latency,
}

/// Runs the failure scenarios of paper Fig. 12 on an embedded cluster of its own (nodes with
/// fault injection enabled): hydra 8+2 Δ=1, span 8+2 and replication ×2 side by side, QD1
/// latency while all nodes are healthy, while one node that holds a split of every scheme's
/// first range answers every request `o.slow_reply` late, and after that node is killed
/// (which starts a remap and a background regeneration, whose cost the killed phase
/// includes).
pub fn failure_scenarios(
    binary: std::path::PathBuf,
    o: &BenchOptions,
    progress: Progress<'_>,
) -> Result<Vec<ScenarioResult>, BenchError> {
    use crate::embedded::{EmbeddedCluster, EmbeddedOptions};
    let client_err = |scheme: &str| {
        let scheme = scheme.to_string();
        move |source| BenchError::Client {
            scheme: scheme.clone(),
            source,
        }
    };
    // 11 nodes: hydra's group takes 10, and span's 10 of the 11, so replication's
    // least-loaded pair takes a node of both, which becomes the victim the schemes share. Slabs of 64 MiB keep
    // each scheme's working set in one address range (up to 16384 pages).
    let slab = 64u64 << 20;
    let nodes = 11u16;
    let mut cluster = EmbeddedCluster::start(EmbeddedOptions::fault_injecting(
        binary,
        nodes as usize,
        slab,
        64 * slab,
    ))
    .map_err(|e| BenchError::Client {
        scheme: "cluster".into(),
        source: crate::client::ClientError::Io(std::io::Error::other(e.to_string())),
    })?;
    let schemes = [
        Resilience::Hydra {
            k: 8,
            r: 2,
            delta: 1,
            mode: crate::client::Mode::FailureRecovery,
        },
        Resilience::Span { k: 8, r: 2 },
        Resilience::Replication { copies: 2 },
    ];
    let mut mems: Vec<(String, Arc<RemoteMemory>, Arc<dyn PageStore>)> = Vec::new();
    for s in schemes {
        let mut cfg = ClientConfig::new(s, o.pages * PAGE_SIZE as u64);
        cfg.poll = o.poll;
        let mem = RemoteMemory::connect(cluster.cluster(), cfg).map_err(client_err(&s.label()))?;
        let store: Arc<dyn PageStore> = if mem.layout().span() {
            SpanStore::new(mem.clone()).map_err(|source| BenchError::Io {
                scheme: s.label(),
                source,
            })?
        } else {
            mem.clone()
        };
        populate(&*store, o, &s.label(), progress).map_err(|source| BenchError::Io {
            scheme: s.label(),
            source,
        })?;
        mems.push((s.label(), mem, store));
    }
    let groups: Vec<_> = mems
        .iter()
        .map(|(_, m, _)| (m.group_of(0).expect("populated"), m.layout().width))
        .collect();
    // The node in the most of the schemes' first ranges (all three when one is; placement
    // may leave none common to hydra's ten, span's ten and replication's two of eleven).
    let holds = |n: u16| {
        groups
            .iter()
            .filter(|(g, w)| g.nodes[..*w].contains(&n))
            .count()
    };
    let victim = (0..nodes).max_by_key(|n| holds(*n)).unwrap_or(0) as usize;
    tracing::info!(victim, "failure scenarios: the slow and then killed node");
    let mut out = Vec::new();
    let mut x = o.seed | 1;
    let rounds = o.rounds.max(1);
    let per_round = o.latency_ops.div_ceil(rounds);
    let slow = format!(
        "one node slow (+{} ms per reply)",
        o.slow_reply.as_secs_f64() * 1000.0
    );
    let delay_us = u64::try_from(o.slow_reply.as_micros()).unwrap_or(u64::MAX);
    for (phase, scenario) in ["healthy", slow.as_str(), "one node killed"]
        .iter()
        .enumerate()
    {
        match phase {
            1 => {
                let _ = cluster.inject(victim, crate::wire::Fault::DelayReplies(delay_us));
            }
            2 => {
                let _ = cluster.inject(victim, crate::wire::Fault::Clear);
                let _ = cluster.kill(victim);
            }
            _ => {}
        }
        // Index 0: steady; index 1 (killed phase only): while a regeneration is running.
        let mut hists: Vec<[(Histogram<u64>, Histogram<u64>); 2]> = mems
            .iter()
            .map(|_| [(hist(), hist()), (hist(), hist())])
            .collect();
        let mut page = [0u8; PAGE_SIZE];
        let regenerating = |mem: &RemoteMemory| {
            let st = mem.regen_stats();
            st.started > st.done + st.failed
        };
        let phase_start = Instant::now();
        let mut round = 0;
        loop {
            // The killed phase goes on past its rounds while a regeneration has not started
            // or not finished (up to 20 s), so that both windows are measured.
            let extra = phase == 2
                && phase_start.elapsed() < Duration::from_secs(20)
                && mems.iter().any(|(_, m, _)| {
                    let st = m.regen_stats();
                    m.layout().coded() && (st.started == 0 || regenerating(m))
                });
            if round >= rounds && !extra {
                break;
            }
            progress(scenario, round.min(rounds), rounds);
            for (i, (label, mem, store)) in mems.iter().enumerate() {
                let err = |source| BenchError::Io {
                    scheme: label.clone(),
                    source,
                };
                for _ in 0..per_round {
                    let p = xorshift(&mut x) % o.pages;
                    fill_page(&mut page, o.seed, p, 0);
                    let w = (phase == 2 && regenerating(mem)) as usize;
                    let t = Instant::now();
                    store.write_page(p * PAGE_SIZE as u64, &page).map_err(err)?;
                    hists[i][w].0.record(t.elapsed().as_nanos() as u64).ok();
                }
                for _ in 0..per_round {
                    let p = xorshift(&mut x) % o.pages;
                    let w = (phase == 2 && regenerating(mem)) as usize;
                    let t = Instant::now();
                    store
                        .read_page(p * PAGE_SIZE as u64, &mut page)
                        .map_err(err)?;
                    hists[i][w].1.record(t.elapsed().as_nanos() as u64).ok();
                }
            }
            round += 1;
        }
        for ((label, _, _), h) in mems.iter().zip(&hists) {
            for (w, (wh, rh)) in h.iter().enumerate() {
                if wh.is_empty() || rh.is_empty() {
                    continue;
                }
                let name = match (phase, w) {
                    (2, 0) => format!("{scenario}, not regenerating"),
                    (2, _) => format!("{scenario}, while regenerating"),
                    _ => scenario.to_string(),
                };
                out.push(ScenarioResult {
                    scheme: label.clone(),
                    scenario: name,
                    write_latency: Latency::from(wh),
                    read_latency: Latency::from(rh),
                });
            }
        }
    }
    Ok(out)
}
