//! The availability and load-balancing simulator (Hydra §5 and §7.2, Figures 15 and 16).
//!
//! # What it answers
//!
//! * **Probability of data loss** when a fraction f of the N memory nodes fail at once (a
//!   power outage, a bad rollout): data is lost when some address range loses more than r of
//!   its k + r slabs. Computed two ways that must agree: in closed form ([`analysis`]), and by
//!   Monte Carlo ([`montecarlo`]) over placements produced by [`crate::placement::Placer`] — the
//!   very code the client runs — with F = round(f · N) nodes failed uniformly at random.
//! * **Load balance** ([`balance`]): slabs per node after N · S / (k + r) ranges are placed,
//!   as max / mean and coefficient of variation, from uniform or skewed initial loads.
//! * The paper's sweeps ([`sweep`]): CSV, PNG plots ([`plot`]) and markdown tables.
//!
//! # The workload model, shared by every part
//!
//! N nodes without failure domains, all available. S slabs per node on average, so
//! R = round(N · S / (k + r)) ranges. Ranges are placed by simulated clients of
//! [`Params::ranges_per_client`] ranges each (2 by default: a client with 16 GB of remote
//! memory in 1 GB slabs and k = 8 maps two ranges); every client starts with a fresh
//! placement history (what power of two's "prefer nodes without my slabs" sees). Loads seen by
//! the placer follow a [`View`]: exact (every placement sees the true loads) or a snapshot
//! (all clients connect at once and see the initial loads plus their own allocations), or
//! waves (clients connect in waves and see the loads of their wave's start plus their own).
//!
//! Invariants: every function checks its parameters and returns [`SimError`] instead of
//! panicking; everything random is seeded, and a seed gives the same result whatever the
//! number of threads (work is cut into seeded batches, not per-thread streams).

pub mod analysis;
pub mod balance;
pub mod montecarlo;
pub mod plot;
pub mod sweep;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::placement::{NodeView, PlacementError, Placer, Policy};

/// What went wrong in a simulation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// A parameter is out of range; the message names it, its value and the allowed range.
    #[error("invalid simulation parameter: {0}")]
    Invalid(String),
    /// The placement module refused to place (it cannot for valid parameters, so this is a
    /// bug or parameters the checks missed).
    #[error("placement failed while simulating {policy}: {source}")]
    Placement {
        /// The policy being simulated.
        policy: Policy,
        /// What the placer said.
        source: PlacementError,
    },
    /// Writing an output file failed.
    #[error("cannot write {path}: {reason}; check that the directory exists and is writable")]
    Output {
        /// The file.
        path: String,
        /// What failed.
        reason: String,
    },
}

/// How fresh the loads are that the placer sees (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum View {
    /// Every placement sees the true current loads (clients take turns and read the loads
    /// when they connect).
    Exact,
    /// All clients connect at once: each sees the initial loads plus its own allocations.
    Snapshot,
    /// Clients connect in waves of this many: each sees the loads as they were when its wave
    /// began plus its own allocations (between `Exact` and `Snapshot`).
    Waves(usize),
}

impl View {
    /// Name used in CSV files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            View::Exact => "exact",
            View::Snapshot => "snapshot",
            View::Waves(_) => "waves",
        }
    }
}

/// The parameters of one simulated cluster.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Memory nodes, N.
    pub n: usize,
    /// Data splits per range.
    pub k: usize,
    /// Parity splits per range (data survives the loss of any r).
    pub r: usize,
    /// CodingSets' load-balancing factor (ignored by the other policies).
    pub l: usize,
    /// Slabs per node on average, S.
    pub slabs_per_node: f64,
    /// Fraction of the nodes that fail at once, f.
    pub fail_fraction: f64,
    /// Ranges each simulated client maps.
    pub ranges_per_client: usize,
}

impl Params {
    /// The paper's Figure 15 base: k = 8, r = 2, l = 2, S = 16, f = 1 %, N = 1000.
    pub fn paper_base() -> Params {
        Params {
            n: 1000,
            k: 8,
            r: 2,
            l: 2,
            slabs_per_node: 16.0,
            fail_fraction: 0.01,
            ranges_per_client: 2,
        }
    }

    /// Slabs per range, k + r.
    pub fn width(&self) -> usize {
        self.k + self.r
    }

    /// Ranges placed: round(N · S / (k + r)), at least 1.
    pub fn ranges(&self) -> usize {
        ((self.n as f64 * self.slabs_per_node / self.width() as f64).round() as usize).max(1)
    }

    /// Nodes that fail: round(f · N).
    pub fn failed(&self) -> usize {
        (self.fail_fraction * self.n as f64).round() as usize
    }

    /// The policy of `kind` with this l.
    pub fn policy(&self, kind: crate::placement::PolicyKind) -> Policy {
        kind.with_l(self.l)
    }

    /// Checks every parameter; the error names the first bad one and what would do.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |m: String| Err(SimError::Invalid(m));
        if self.k == 0 {
            return bad("k = 0: a range needs at least one data split (k >= 1)".into());
        }
        if self.width() > 64 {
            return bad(format!(
                "k + r = {} is more than 64 splits per range, beyond what the simulator \
                 supports; use a smaller k or r",
                self.width()
            ));
        }
        if self.n < self.width() {
            return bad(format!(
                "N = {} nodes is fewer than k + r = {}: a range needs k + r distinct nodes; \
                 use N >= k + r",
                self.n,
                self.width()
            ));
        }
        if self.n > 100_000_000 {
            return bad(format!(
                "N = {} nodes is more than the simulator's limit of 100,000,000",
                self.n
            ));
        }
        if !(self.slabs_per_node.is_finite() && self.slabs_per_node > 0.0) {
            return bad(format!(
                "S = {} slabs per node must be a positive number",
                self.slabs_per_node
            ));
        }
        if self.ranges() as f64 * self.width() as f64 > 2e9 {
            return bad(format!(
                "N · S = {} slabs is more than the simulator's limit of 2e9; use a smaller N or S",
                self.n as f64 * self.slabs_per_node
            ));
        }
        if !(0.0..=1.0).contains(&self.fail_fraction) {
            return bad(format!(
                "f = {} must be a fraction between 0 and 1 (1 % is 0.01)",
                self.fail_fraction
            ));
        }
        if self.ranges_per_client == 0 {
            return bad("ranges per client = 0: each client maps at least one range".into());
        }
        Ok(())
    }
}

/// A seed for batch `index` of a run seeded with `seed` (SplitMix64 of both), so batches are
/// independent streams and a result does not depend on which thread ran which batch.
pub fn batch_seed(seed: u64, index: u64) -> u64 {
    let mut z = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Initial node loads before the simulated clients place anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Initial {
    /// Every node starts empty.
    Uniform,
    /// Every node already holds a uniformly random number of slabs of other tenants between
    /// 0 and 2·S (mean S): room a load-aware policy can use, a trap for a blind one.
    Skewed,
}

impl Initial {
    /// Name used in CSV files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Initial::Uniform => "uniform",
            Initial::Skewed => "skewed",
        }
    }

    /// The initial loads of `n` nodes for mean new load `s`, drawn from `seed`.
    pub fn loads(self, n: usize, s: f64, seed: u64) -> Vec<u64> {
        match self {
            Initial::Uniform => vec![0; n],
            Initial::Skewed => {
                let mut rng = SmallRng::seed_from_u64(seed);
                let top = (2.0 * s).round() as u64;
                (0..n).map(|_| rng.random_range(0..=top)).collect()
            }
        }
    }
}

/// The ranges produced by one run of the placer: `width` node indices per range, flattened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Slabs per range.
    pub width: usize,
    /// Range i is `sets[i·width .. (i+1)·width]`.
    pub sets: Vec<u32>,
    /// Each node's load at the end (initial + slabs placed).
    pub loads: Vec<u64>,
}

/// Places `p.ranges()` ranges with a real [`Placer`] of `policy` on `p.n` nodes starting from
/// `initial` loads, clients of `p.ranges_per_client` ranges each, loads seen as `view` says.
/// Collects the ranges only if `keep_sets` (a balance run at 1M nodes does not need them).
pub fn place_ranges(
    policy: Policy,
    p: &Params,
    initial: &[u64],
    view: View,
    keep_sets: bool,
    seed: u64,
) -> Result<Placement, SimError> {
    p.validate()?;
    if initial.len() != p.n {
        return Err(SimError::Invalid(format!(
            "{} initial loads for N = {} nodes",
            initial.len(),
            p.n
        )));
    }
    let width = p.width();
    let mut nodes: Vec<NodeView> = initial
        .iter()
        .map(|&load| NodeView {
            available: true,
            load,
            domain: None,
        })
        .collect();
    let mut truth = initial.to_vec();
    let err = |source| SimError::Placement { policy, source };
    let mut placer = Placer::new(policy, width, &nodes, seed).map_err(err)?;
    let ranges = p.ranges();
    let mut sets = Vec::with_capacity(if keep_sets { ranges * width } else { 0 });
    let mut own: Vec<usize> = Vec::with_capacity(p.ranges_per_client * width);
    let mut placed = 0;
    let mut in_wave = 0;
    while placed < ranges {
        placer.forget_history();
        own.clear();
        for _ in 0..p.ranges_per_client.min(ranges - placed) {
            let chosen = placer.place(&nodes).map_err(err)?;
            for &i in &chosen {
                truth[i] += 1;
                nodes[i].load += 1;
                own.push(i);
                if keep_sets {
                    sets.push(i as u32);
                }
            }
            placed += 1;
        }
        if view != View::Exact {
            // The next client has not seen this one's allocations...
            for &i in &own {
                nodes[i].load -= 1;
            }
            // ...unless it starts a new wave, which reads the current loads.
            in_wave += 1;
            if let View::Waves(w) = view {
                if in_wave >= w {
                    in_wave = 0;
                    for (v, &t) in nodes.iter_mut().zip(&truth) {
                        v.load = t;
                    }
                    placer.refresh(&nodes).map_err(err)?;
                }
            }
        }
    }
    Ok(Placement {
        width,
        sets,
        loads: truth,
    })
}

/// `f(index, item)` for every item, spread over `threads` scoped threads (items handed out
/// in order through an atomic counter); results in the items' order, the first error wins.
pub fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(usize, &T) -> Result<R, SimError> + Sync,
) -> Result<Vec<R>, SimError> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut done: Vec<(usize, Result<R, SimError>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.clamp(1, items.len().max(1)))
            .map(|_| {
                scope.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(i) else {
                            return out;
                        };
                        let r = f(i, item);
                        let failed = r.is_err();
                        out.push((i, r));
                        if failed {
                            return out;
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a simulation worker panicked"))
            .collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// A proportion's Wilson score interval at `z` standard deviations (1.96 for 95 %): sound
/// also for proportions near 0 or 1 and for zero successes, unlike the normal approximation.
pub fn wilson(successes: u64, trials: u64, z: f64) -> (f64, f64) {
    if trials == 0 {
        return (0.0, 1.0);
    }
    let n = trials as f64;
    let p = successes as f64 / n;
    let z2 = z * z;
    let denom = 1.0 + z2 / n;
    let center = (p + z2 / (2.0 * n)) / denom;
    let half = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denom;
    ((center - half).max(0.0), (center + half).min(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::PolicyKind;

    #[test]
    fn bad_parameters_are_errors_not_panics() {
        let base = Params::paper_base();
        let cases: [(Params, &str); 6] = [
            (Params { k: 0, ..base }, "k = 0"),
            (Params { n: 9, ..base }, "fewer than k + r"),
            (
                Params {
                    fail_fraction: 1.5,
                    ..base
                },
                "between 0 and 1",
            ),
            (
                Params {
                    slabs_per_node: 0.0,
                    ..base
                },
                "positive",
            ),
            (
                Params {
                    ranges_per_client: 0,
                    ..base
                },
                "ranges per client",
            ),
            (Params { r: 70, ..base }, "64"),
        ];
        for (p, needle) in cases {
            let e = p.validate().unwrap_err().to_string();
            assert!(e.contains(needle), "{e:?} lacks {needle:?}");
            let initial = vec![0; p.n];
            assert!(place_ranges(
                p.policy(PolicyKind::EcCache),
                &p,
                &initial,
                View::Exact,
                true,
                1
            )
            .is_err());
        }
        assert!(base.validate().is_ok());
        assert_eq!(base.ranges(), 1600);
        assert_eq!(base.failed(), 10);
    }

    #[test]
    fn placement_counts_and_views() {
        let p = Params {
            n: 60,
            slabs_per_node: 5.0,
            ..Params::paper_base()
        };
        for kind in PolicyKind::ALL {
            for view in [View::Exact, View::Snapshot, View::Waves(3)] {
                let initial = Initial::Skewed.loads(p.n, p.slabs_per_node, 3);
                let pl = place_ranges(p.policy(kind), &p, &initial, view, true, 7).unwrap();
                assert_eq!(pl.sets.len(), p.ranges() * 10);
                let added: u64 = pl.loads.iter().sum::<u64>() - initial.iter().sum::<u64>();
                assert_eq!(added, 300);
                for set in pl.sets.chunks(10) {
                    let mut s = set.to_vec();
                    s.sort_unstable();
                    s.dedup();
                    assert_eq!(s.len(), 10, "{kind} {view:?}: a node twice in one range");
                }
                let again = place_ranges(p.policy(kind), &p, &initial, view, true, 7).unwrap();
                assert_eq!(pl, again, "same seed, same placement");
            }
        }
    }

    #[test]
    fn wilson_interval() {
        let (lo, hi) = wilson(50, 100, 1.96);
        assert!(
            (lo - 0.404).abs() < 0.002 && (hi - 0.596).abs() < 0.002,
            "{lo} {hi}"
        );
        let (lo, hi) = wilson(0, 1000, 1.96);
        assert_eq!(lo, 0.0);
        assert!(hi > 0.003 && hi < 0.005, "{hi}");
        assert_eq!(wilson(0, 0, 1.96), (0.0, 1.0));
        assert_ne!(batch_seed(1, 0), batch_seed(1, 1));
        assert_ne!(batch_seed(1, 0), batch_seed(2, 0));
    }
}
