//! Closed forms for the probability of data loss and for EC-Cache's load balance.
//!
//! # Failure model
//!
//! F = round(f · N) of the N nodes fail at once, every F-subset equally likely. A range of
//! width w = k + r is lost when at least t = r + 1 of its nodes fail. The number of failed
//! members of a fixed w-set is then hypergeometric: P(X = j) = C(w, j) C(N − w, F − j) / C(N, F).
//!
//! # CodingSets ([`codingsets_loss`])
//!
//! The extended groups are disjoint. Inside a group of s nodes the ranges take w-subsets (the
//! w least loaded at each placement). We assume **full coverage**: every t-subset of a group's
//! nodes lies inside some range of that group, so a group loses data exactly when ≥ t of its
//! s nodes fail. Then
//!
//! P(no loss) = #{F-subsets with ≤ r failures in every group} / C(N, F),
//!
//! computed exactly — not assuming groups independent — by walking the groups in turn and
//! tracking the distribution of failures still to place (a sequential hypergeometric: a group
//! of s among M remaining nodes, m failures remaining, gets j with probability
//! C(s, j) C(M − s, m − j) / C(M, m)). Cost O(G · F · t).
//!
//! Full coverage holds once a group has placed a full round of ranges (least-loaded choice
//! rotates the l nodes left out, and a t-set cannot meet every left-out set of a round when
//! s > l·t); with very few ranges per group (small S) some t-subsets are in no range and the
//! closed form is an **upper bound**. The Monte Carlo, which looks at the real ranges, shows
//! the gap (docs/availability.md, Figure 15 over S).
//!
//! # EC-Cache and power of two ([`random_loss`])
//!
//! R ranges, each an independent uniform w-subset: given the failed set, each range is lost
//! independently with p = P(X ≥ t), so P(loss) = 1 − (1 − p)^R. This is exact for EC-Cache
//! without failure domains (its ranges are exactly that). For power of two it is the
//! **independence approximation** the paper makes ("EC-Cache and power of two choices select
//! random servers, and are therefore equivalent"): its ranges are load-correlated, not
//! independent; the Monte Carlo measures how much that matters.
//!
//! # The paper's formula ([`paper_loss`])
//!
//! Hydra §5 writes P(loss) = 1 − (1 − G · C(s, t) / C(N, t))^C(F, t): every t-subset of the
//! failed nodes is treated as an independent trial that hits one of the G groups' C(s, t)
//! copysets (G = N / s for CodingSets; G = N·S / w groups of size w for EC-Cache). It counts
//! copysets, not groups, so it undercounts when F is much larger than t; we print it beside
//! ours for comparison.
//!
//! # Load balance ([`ec_cache_expected_max`])
//!
//! With uniform random placement each node's load is Binomial(R·w, 1/N) (each slab lands on
//! a given node with probability 1/N, treated as independent across slabs of a range, which
//! only ignores that one range never puts two slabs on one node), and the expected maximum of
//! N such loads is Σ_t (1 − P(X ≤ t)^N), treating nodes as independent.

use super::SimError;

/// ln(n!) — exact sums below 256, Stirling's series (error below 1e-15 relative) above.
pub fn ln_factorial(n: u64) -> f64 {
    const TABLE: usize = 256;
    thread_local! {
        static SMALL: [f64; TABLE] = {
            let mut t = [0.0; TABLE];
            for i in 1..TABLE {
                t[i] = t[i - 1] + (i as f64).ln();
            }
            t
        };
    }
    if (n as usize) < TABLE {
        return SMALL.with(|t| t[n as usize]);
    }
    let x = n as f64;
    let inv = 1.0 / x;
    let inv2 = inv * inv;
    x * x.ln() - x
        + 0.5 * (2.0 * std::f64::consts::PI * x).ln()
        + inv * (1.0 / 12.0 - inv2 * (1.0 / 360.0 - inv2 / 1260.0))
}

/// ln C(n, k); −∞ when k > n.
pub fn ln_choose(n: u64, k: u64) -> f64 {
    if k > n {
        return f64::NEG_INFINITY;
    }
    ln_factorial(n) - ln_factorial(k) - ln_factorial(n - k)
}

/// P(X = j) for X hypergeometric: `draws` taken from `pop` items of which `marked` are marked.
pub fn hypergeometric_pmf(pop: u64, marked: u64, draws: u64, j: u64) -> f64 {
    if j > marked || j > draws || draws - j > pop - marked {
        return 0.0;
    }
    (ln_choose(marked, j) + ln_choose(pop - marked, draws - j) - ln_choose(pop, draws)).exp()
}

/// P(X ≥ t) for the same hypergeometric X (summed from the tail up, so tiny values keep
/// their precision).
pub fn hypergeometric_tail(pop: u64, marked: u64, draws: u64, t: u64) -> f64 {
    let top = marked.min(draws);
    if t > top {
        return 0.0;
    }
    (t..=top)
        .rev()
        .map(|j| hypergeometric_pmf(pop, marked, draws, j))
        .sum::<f64>()
        .min(1.0)
}

fn check(n: usize, failed: usize, width: usize, r: usize) -> Result<(), SimError> {
    if width == 0 || r >= width {
        return Err(SimError::Invalid(format!(
            "a range of width {width} with r = {r} parity splits: need 0 <= r < width"
        )));
    }
    if failed > n {
        return Err(SimError::Invalid(format!(
            "{failed} failed nodes out of only {n}"
        )));
    }
    Ok(())
}

/// P(loss) for CodingSets with extended groups of the given sizes (which must add up to `n`),
/// `failed` nodes failing, ranges surviving up to `r` failures; exact under full coverage (see
/// the module documentation), an upper bound otherwise.
pub fn codingsets_loss(group_sizes: &[usize], failed: usize, r: usize) -> Result<f64, SimError> {
    let n: usize = group_sizes.iter().sum();
    check(n, failed, r + 1, r)?;
    if failed <= r {
        // No group can see more than r failures (and the sum below would leave rounding dust).
        return Ok(0.0);
    }
    // alive[m] = P(no group so far has lost data, and m failures are still to place), non-zero
    // only in lo..=hi. Entries below TINY are dropped (counted as loss, so the result can only
    // err upwards, by less than G · F · TINY): that keeps the window to the few thousand
    // likely values of m even at N = 1,000,000.
    const TINY: f64 = 1e-30;
    let mut alive = vec![0.0f64; failed + 1];
    let mut next = vec![0.0f64; failed + 1];
    alive[failed] = 1.0;
    let (mut lo, mut hi) = (failed, failed);
    let mut remaining = n as u64;
    for &s in group_sizes {
        let s = s as u64;
        let new_lo = lo.saturating_sub(r.min(s as usize));
        next[new_lo..=hi].fill(0.0);
        for m in lo..=hi {
            let p = alive[m];
            if p == 0.0 {
                continue;
            }
            for j in 0..=(r as u64).min(m as u64).min(s) {
                let q = hypergeometric_pmf(remaining, m as u64, s, j);
                next[m - j as usize] += p * q;
            }
        }
        std::mem::swap(&mut alive, &mut next);
        lo = new_lo;
        while lo < hi && alive[lo] < TINY {
            alive[lo] = 0.0;
            lo += 1;
        }
        while hi > lo && alive[hi] < TINY {
            alive[hi] = 0.0;
            hi -= 1;
        }
        remaining -= s;
    }
    let survive = if lo == 0 { alive[0] } else { 0.0 };
    Ok((1.0 - survive).clamp(0.0, 1.0))
}

/// The sizes of CodingSets' extended groups without failure domains: G = max(1, ⌊N / (w+l)⌋)
/// groups whose sizes differ by at most one (the placer deals nodes round-robin).
pub fn codingsets_group_sizes(n: usize, width: usize, l: usize) -> Vec<usize> {
    let g = (n / (width + l)).max(1);
    (0..g).map(|i| n / g + usize::from(i < n % g)).collect()
}

/// P(loss) for `ranges` independent uniformly random ranges of `width` nodes among `n`, with
/// `failed` nodes failing and ranges surviving up to `r` failures.
pub fn random_loss(
    n: usize,
    failed: usize,
    width: usize,
    r: usize,
    ranges: usize,
) -> Result<f64, SimError> {
    check(n, failed, width, r)?;
    let p = hypergeometric_tail(n as u64, failed as u64, width as u64, r as u64 + 1);
    Ok(-(ranges as f64 * (-p).ln_1p()).exp_m1())
}

/// The paper's §5 formula: 1 − (1 − G · C(s, r+1) / C(N, r+1))^C(F, r+1) for G groups of `s`
/// nodes among `n`.
pub fn paper_loss(n: usize, failed: usize, groups: f64, s: usize, r: usize) -> f64 {
    let t = r as u64 + 1;
    let per = groups * (ln_choose(s as u64, t) - ln_choose(n as u64, t)).exp();
    if per >= 1.0 {
        return 1.0;
    }
    let trials = ln_choose(failed as u64, t).exp();
    if trials == 0.0 {
        return 0.0;
    }
    -(trials * (-per).ln_1p()).exp_m1()
}

/// The expected max / mean load when `ranges` ranges of `width` slabs are spread uniformly at
/// random over `n` empty nodes (EC-Cache), with nodes treated as independent.
pub fn ec_cache_expected_max(n: usize, width: usize, ranges: usize) -> f64 {
    let trials = (ranges * width) as u64;
    let p = 1.0 / n as f64;
    let mean = trials as f64 * p;
    // Binomial pmf by recurrence from the mode's neighbourhood would be faster; the direct
    // log form is simple and cheap enough for the loads that occur (a few hundred).
    let pmf = |x: u64| {
        if x > trials {
            return 0.0;
        }
        (ln_choose(trials, x) + x as f64 * p.ln() + (trials - x) as f64 * (-p).ln_1p()).exp()
    };
    let mut cdf = 0.0;
    let mut expected_max = 0.0;
    let mut x = 0u64;
    loop {
        cdf += pmf(x);
        // P(max > x) = 1 − cdf^N.
        let above = -(n as f64 * cdf.min(1.0).ln()).exp_m1();
        expected_max += above;
        x += 1;
        if (above < 1e-12 && x as f64 > mean) || x > trials {
            break;
        }
    }
    expected_max / mean
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choose(n: u64, k: u64) -> f64 {
        (1..=k).map(|i| (n - k + i) as f64 / i as f64).product()
    }

    #[test]
    fn ln_choose_matches_direct_products() {
        for (n, k) in [
            (10, 3),
            (255, 7),
            (256, 3),
            (1000, 10),
            (5000, 3),
            (1_000_000, 2),
        ] {
            let rel = (ln_choose(n, k).exp() / choose(n, k) - 1.0).abs();
            assert!(rel < 1e-8, "C({n},{k}) off by {rel}");
        }
        assert_eq!(ln_choose(3, 4), f64::NEG_INFINITY);
    }

    #[test]
    fn hypergeometric_sums_to_one_and_matches_a_hand_count() {
        let total: f64 = (0..=10).map(|j| hypergeometric_pmf(1000, 10, 10, j)).sum();
        assert!((total - 1.0).abs() < 1e-12);
        // 2 failed of 5 nodes, a set of 3: P(both failed in the set) = C(3,2)/C(5,2) = 0.3.
        assert!((hypergeometric_tail(5, 2, 3, 2) - 0.3).abs() < 1e-12);
        assert_eq!(hypergeometric_tail(5, 2, 3, 3), 0.0);
    }

    #[test]
    fn codingsets_by_brute_force_on_a_tiny_cluster() {
        // Groups {0,1,2}, {3,4,5}, {6,7}: enumerate every 3-subset of 8 nodes, r = 1 (a group
        // is lost with 2 or more failed members).
        let sizes = [3, 3, 2];
        let group = |i: usize| {
            if i < 3 {
                0
            } else if i < 6 {
                1
            } else {
                2
            }
        };
        let mut lost = 0;
        let mut all = 0;
        for a in 0..8 {
            for b in a + 1..8 {
                for c in b + 1..8 {
                    all += 1;
                    let g = [group(a), group(b), group(c)];
                    if g[0] == g[1] || g[1] == g[2] || g[0] == g[2] {
                        lost += 1;
                    }
                }
            }
        }
        let p = codingsets_loss(&sizes, 3, 1).unwrap();
        assert!(
            (p - lost as f64 / all as f64).abs() < 1e-12,
            "{p} vs {lost}/{all}"
        );
        assert_eq!(codingsets_loss(&sizes, 0, 1).unwrap(), 0.0);
        assert!((codingsets_loss(&sizes, 7, 1).unwrap() - 1.0).abs() < 1e-12);
        assert!(codingsets_loss(&sizes, 9, 1).is_err());
    }

    #[test]
    fn group_sizes_match_the_placer() {
        use crate::placement::{NodeView, Placer, Policy};
        for (n, w, l) in [
            (1000, 10, 2),
            (27, 10, 2),
            (11, 10, 2),
            (5000, 3, 0),
            (97, 4, 3),
        ] {
            let nodes = vec![
                NodeView {
                    available: true,
                    load: 0,
                    domain: None
                };
                n
            ];
            let p = Placer::new(Policy::CodingSets { l }, w, &nodes, 1).unwrap();
            let mut real: Vec<usize> = p.groups().iter().map(Vec::len).collect();
            let mut ours = codingsets_group_sizes(n, w, l);
            real.sort_unstable();
            ours.sort_unstable();
            assert_eq!(real, ours, "N={n} w={w} l={l}");
        }
    }

    #[test]
    fn random_loss_is_one_minus_survival_of_every_range() {
        // 1000 nodes, 10 failed, ranges of 10 surviving 2: p per range ≈ 8.7e-5.
        let p = hypergeometric_tail(1000, 10, 10, 3);
        assert!(p > 8e-5 && p < 1e-4, "{p}");
        let one = random_loss(1000, 10, 10, 2, 1).unwrap();
        assert!((one - p).abs() < 1e-15);
        let many = random_loss(1000, 10, 10, 2, 1600).unwrap();
        assert!((many - (1.0 - (1.0 - p).powi(1600))).abs() < 1e-12);
        assert!(random_loss(10, 11, 10, 2, 1).is_err());
        assert!(random_loss(10, 1, 10, 10, 1).is_err());
    }

    #[test]
    fn ec_cache_max_grows_with_n() {
        let small = ec_cache_expected_max(100, 10, 160);
        let large = ec_cache_expected_max(1_000_000, 10, 1_600_000);
        assert!(
            small > 1.2 && small < large && large < 3.0,
            "{small} {large}"
        );
    }
}
