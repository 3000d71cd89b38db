//! Load balance of a policy: how evenly N · S slabs land on N nodes.
//!
//! Everything here is simulated, not sampled: all R = N·S/(k+r) ranges are placed by the real
//! [`crate::placement::Placer`] (1.6 million ranges at N = 1,000,000 and S = 16 take seconds),
//! from uniform or skewed initial loads, with an exact or snapshot load view (see
//! [`super::View`]). The metrics are over each node's final load (initial + placed): max /
//! mean — the paper's Figure 16 measure, where 1.0 is perfect — and the coefficient of
//! variation (standard deviation / mean). Small clusters are noisy, so a run repeats the
//! placement `repeats` times with independent seeds and averages both metrics.
//!
//! Invariant: the loads measured always add up to the initial loads plus R · (k + r).

use super::{batch_seed, place_ranges, Initial, Params, SimError, View};
use crate::placement::Policy;

/// Load-balance metrics of one setting.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Balance {
    /// Max load / mean load, averaged over the repeats.
    pub max_over_mean: f64,
    /// Standard deviation / mean of the loads, averaged over the repeats.
    pub cv: f64,
    /// Largest load seen in any repeat.
    pub max: u64,
    /// Mean load.
    pub mean: f64,
    /// Repeats averaged.
    pub repeats: u64,
}

/// max / mean and coefficient of variation of `loads`.
pub fn metrics(loads: &[u64]) -> (f64, f64) {
    let n = loads.len() as f64;
    let mean = loads.iter().sum::<u64>() as f64 / n;
    if mean == 0.0 {
        return (1.0, 0.0);
    }
    let max = *loads.iter().max().unwrap_or(&0) as f64;
    let var = loads
        .iter()
        .map(|&x| (x as f64 - mean).powi(2))
        .sum::<f64>()
        / n;
    (max / mean, var.sqrt() / mean)
}

/// Places the ranges of `p` with `policy` `repeats` times (seeds derived from `seed`, spread
/// over `threads` threads) and averages the metrics.
pub fn measure(
    policy: Policy,
    p: &Params,
    initial: Initial,
    view: View,
    repeats: u64,
    threads: usize,
    seed: u64,
) -> Result<Balance, SimError> {
    p.validate()?;
    if repeats == 0 || threads == 0 {
        return Err(SimError::Invalid(format!(
            "repeats ({repeats}) and threads ({threads}) must be at least 1"
        )));
    }
    let seeds: Vec<u64> = (0..repeats).map(|i| batch_seed(seed, i)).collect();
    let all = super::parallel_map(&seeds, threads, |_, &s| {
        let start = initial.loads(p.n, p.slabs_per_node, batch_seed(s, 1));
        let placed = place_ranges(policy, p, &start, view, false, s)?;
        let (mm, cv) = metrics(&placed.loads);
        let max = placed.loads.iter().copied().max().unwrap_or(0);
        let mean = placed.loads.iter().sum::<u64>() as f64 / p.n as f64;
        Ok((mm, cv, max, mean))
    })?;
    let k = all.len() as f64;
    Ok(Balance {
        max_over_mean: all.iter().map(|x| x.0).sum::<f64>() / k,
        cv: all.iter().map(|x| x.1).sum::<f64>() / k,
        max: all.iter().map(|x| x.2).max().unwrap_or(0),
        mean: all.iter().map(|x| x.3).sum::<f64>() / k,
        repeats: all.len() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::PolicyKind;
    use crate::sim::analysis;

    #[test]
    fn metrics_of_known_loads() {
        assert_eq!(metrics(&[2, 2, 2, 2]), (1.0, 0.0));
        let (mm, cv) = metrics(&[0, 4]);
        assert_eq!(mm, 2.0);
        assert!((cv - 1.0).abs() < 1e-12);
        assert_eq!(metrics(&[0, 0]), (1.0, 0.0));
    }

    #[test]
    fn policies_rank_as_expected_on_a_small_cluster() {
        let p = Params {
            n: 2000,
            ..Params::paper_base()
        };
        let run = |kind: PolicyKind, l: usize, initial: Initial| {
            measure(kind.with_l(l), &p, initial, View::Exact, 2, 2, 11).unwrap()
        };
        let ec = run(PolicyKind::EcCache, 0, Initial::Uniform);
        let two = run(PolicyKind::PowerOfTwo, 0, Initial::Uniform);
        let cs = run(PolicyKind::Codingsets, 2, Initial::Uniform);
        assert!((ec.mean - 16.0).abs() < 1e-9);
        // EC-Cache matches its closed form within sampling noise.
        let closed = analysis::ec_cache_expected_max(p.n, 10, p.ranges());
        assert!(
            (ec.max_over_mean - closed).abs() < 0.15,
            "EC-Cache {} vs closed form {closed}",
            ec.max_over_mean
        );
        // With exact loads the load-aware policies beat the blind one, and CodingSets'
        // emptiest-group rule is the most even.
        assert!(two.max_over_mean < ec.max_over_mean, "{two:?} vs {ec:?}");
        assert!(cs.max_over_mean <= two.max_over_mean, "{cs:?} vs {two:?}");
        assert!(cs.cv < two.cv && two.cv < ec.cv);
        // Skewed start: the load-aware policies fill the gaps, EC-Cache cannot.
        let ec = run(PolicyKind::EcCache, 0, Initial::Skewed);
        let cs = run(PolicyKind::Codingsets, 2, Initial::Skewed);
        assert!(cs.cv < 0.7 * ec.cv, "{cs:?} vs {ec:?}");
    }
}
