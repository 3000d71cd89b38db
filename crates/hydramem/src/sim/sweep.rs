//! The paper's sweeps: Figure 15 (probability of data loss, one parameter varied at a time
//! around k = 8, r = 2, l = 2, S = 16, f = 1 %, N = 1000) and Figure 16 (load balance against
//! N for CodingSets with l = 0..4, EC-Cache and power of two), plus the copysets check.
//! Each produces rows that [`loss_csv`], [`balance_csv`], [`markdown`] and [`super::plot`]
//! turn into files.
//!
//! Invariant: every row carries all its parameters, so a CSV line can be reproduced alone
//! with `hydramem sim loss` or `hydramem sim balance`.

use std::fmt::Write as _;
use std::path::Path;

use super::analysis;
use super::balance::{self, Balance};
use super::montecarlo::{estimate_loss, LossEstimate, McOptions};
use super::plot::{Chart, Series};
use super::{Initial, Params, SimError, View};
use crate::placement::{Policy, PolicyKind};

/// The parameter a Figure 15 panel varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Vary {
    /// Data splits.
    K,
    /// Parity splits.
    R,
    /// Load-balancing factor.
    L,
    /// Slabs per node.
    S,
    /// Failed fraction.
    F,
    /// Cluster size.
    N,
}

impl Vary {
    /// All panels in the paper's order.
    pub const ALL: [Vary; 6] = [Vary::K, Vary::R, Vary::L, Vary::S, Vary::F, Vary::N];

    /// Short name (CSV, file names).
    pub fn name(self) -> &'static str {
        match self {
            Vary::K => "k",
            Vary::R => "r",
            Vary::L => "l",
            Vary::S => "S",
            Vary::F => "f",
            Vary::N => "N",
        }
    }

    /// Axis label.
    fn label(self) -> &'static str {
        match self {
            Vary::K => "k (data splits)",
            Vary::R => "r (parity splits)",
            Vary::L => "l (load-balancing factor)",
            Vary::S => "S (slabs per node)",
            Vary::F => "f (fraction of nodes failed, %)",
            Vary::N => "N (nodes)",
        }
    }

    /// The values swept (fewer in `quick` mode).
    pub fn values(self, quick: bool) -> Vec<f64> {
        let v: &[f64] = match (self, quick) {
            (Vary::K, false) => &[2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0],
            (Vary::K, true) => &[4.0, 8.0],
            (Vary::R, false) => &[1.0, 2.0, 3.0, 4.0],
            (Vary::R, true) => &[1.0, 2.0],
            (Vary::L, false) => &[0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0],
            (Vary::L, true) => &[0.0, 2.0],
            (Vary::S, false) => &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 100.0],
            (Vary::S, true) => &[4.0, 16.0],
            (Vary::F, false) => &[0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05],
            (Vary::F, true) => &[0.01, 0.02],
            (Vary::N, false) => &[500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0],
            (Vary::N, true) => &[500.0, 1000.0],
        };
        v.to_vec()
    }

    /// `base` with this parameter set to `x`.
    pub fn apply(self, base: Params, x: f64) -> Params {
        let mut p = base;
        match self {
            Vary::K => p.k = x as usize,
            Vary::R => p.r = x as usize,
            Vary::L => p.l = x as usize,
            Vary::S => p.slabs_per_node = x,
            Vary::F => p.fail_fraction = x,
            Vary::N => p.n = x as usize,
        }
        p
    }
}

/// One point of Figure 15 for one policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossRow {
    /// The panel.
    pub vary: Vary,
    /// The varied parameter's value.
    pub x: f64,
    /// All parameters of the point.
    pub params: Params,
    /// The policy.
    pub policy: PolicyKind,
    /// Our closed form (see [`analysis`]).
    pub closed: f64,
    /// The paper's §5 formula.
    pub paper: f64,
    /// The Monte Carlo estimate over the real placer.
    pub mc: LossEstimate,
}

/// Both closed forms for `kind` at `p`: (ours, the paper's).
pub fn closed_forms(kind: PolicyKind, p: &Params) -> Result<(f64, f64), SimError> {
    p.validate()?;
    let (n, w, f) = (p.n, p.width(), p.failed());
    Ok(match kind {
        PolicyKind::Codingsets => {
            let sizes = analysis::codingsets_group_sizes(n, w, p.l);
            (
                analysis::codingsets_loss(&sizes, f, p.r)?,
                analysis::paper_loss(n, f, sizes.len() as f64, w + p.l, p.r),
            )
        }
        PolicyKind::EcCache | PolicyKind::PowerOfTwo => (
            analysis::random_loss(n, f, w, p.r, p.ranges())?,
            analysis::paper_loss(n, f, n as f64 * p.slabs_per_node / w as f64, w, p.r),
        ),
    })
}

/// Every (panel, value) of Figure 15.
pub fn fig15_points(quick: bool) -> Vec<(Vary, f64)> {
    Vary::ALL
        .into_iter()
        .flat_map(|v| v.values(quick).into_iter().map(move |x| (v, x)))
        .collect()
}

/// Figure 15: closed forms and Monte Carlo for every policy at every point. `on_point` is
/// called after each (panel, value) with a description; `progress` gets trial counts.
pub fn fig15(
    base: Params,
    quick: bool,
    opts: &McOptions,
    on_point: &dyn Fn(&str),
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Vec<LossRow>, SimError> {
    let mut rows = Vec::new();
    for (i, (vary, x)) in fig15_points(quick).into_iter().enumerate() {
        let p = vary.apply(base, x);
        for kind in PolicyKind::ALL {
            let (closed, paper) = closed_forms(kind, &p)?;
            let o = McOptions {
                seed: super::batch_seed(opts.seed, i as u64),
                ..*opts
            };
            let mc = estimate_loss(p.policy(kind), &p, &o, progress)?;
            rows.push(LossRow {
                vary,
                x,
                params: p,
                policy: kind,
                closed,
                paper,
                mc,
            });
        }
        on_point(&format!("{} = {x}", vary.name()));
    }
    Ok(rows)
}

/// One point of Figure 16.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BalanceRow {
    /// Nodes.
    pub n: usize,
    /// The policy, with l for CodingSets.
    pub policy: Policy,
    /// Initial loads.
    pub initial: Initial,
    /// Load view.
    pub view: View,
    /// The measurement.
    pub balance: Balance,
    /// EC-Cache's closed-form max / mean at this N (uniform initial loads only).
    pub ec_closed: Option<f64>,
}

/// The policies of Figure 16: CodingSets l = 0..4, EC-Cache, power of two.
pub fn fig16_policies() -> Vec<Policy> {
    let mut v: Vec<Policy> = (0..=4).map(|l| Policy::CodingSets { l }).collect();
    v.push(Policy::EcCache);
    v.push(Policy::PowerOfTwo);
    v
}

/// The cluster sizes of Figure 16 (up to `max_n`).
pub fn fig16_sizes(max_n: usize) -> Vec<usize> {
    [100, 1_000, 10_000, 100_000, 1_000_000]
        .into_iter()
        .filter(|&n| n <= max_n)
        .collect()
}

/// The load views of Figure 16: exact, snapshot, and waves of 1000 clients.
pub fn fig16_views() -> [View; 3] {
    [View::Exact, View::Snapshot, View::Waves(1000)]
}

/// Every setting of Figure 16: (N, policy, initial, view).
pub fn fig16_settings(max_n: usize) -> Vec<(usize, Policy, Initial, View)> {
    let mut v = Vec::new();
    for initial in [Initial::Uniform, Initial::Skewed] {
        for view in fig16_views() {
            for &n in &fig16_sizes(max_n) {
                for &policy in &fig16_policies() {
                    v.push((n, policy, initial, view));
                }
            }
        }
    }
    v
}

/// Figure 16: load balance of every setting, settings spread over `threads` threads (small
/// clusters repeated so that each setting covers about `node_budget` nodes, at most 20 times:
/// max / mean of a small cluster is noisy).
pub fn fig16(
    base: Params,
    max_n: usize,
    node_budget: usize,
    threads: usize,
    seed: u64,
    on_setting: &(dyn Fn(&str) + Sync),
) -> Result<Vec<BalanceRow>, SimError> {
    let settings = fig16_settings(max_n);
    super::parallel_map(&settings, threads, |i, &(n, policy, initial, view)| {
        let p = Params { n, ..base };
        let repeats = (node_budget / n).clamp(1, 20) as u64;
        let b = balance::measure(
            policy,
            &p,
            initial,
            view,
            repeats,
            1,
            super::batch_seed(seed, i as u64),
        )?;
        on_setting(&format!(
            "N={n} {policy} {} {}",
            initial.name(),
            view.name()
        ));
        Ok(BalanceRow {
            n,
            policy,
            initial,
            view,
            balance: b,
            ec_closed: (initial == Initial::Uniform)
                .then(|| analysis::ec_cache_expected_max(n, p.width(), p.ranges())),
        })
    })
}

/// The copysets paper's check (replication is erasure coding with k = 1): 5000 nodes, 3
/// replicas, 1 % failed. Random replication is EC-Cache with width 3; copyset replication
/// with scatter width 2 is CodingSets with l = 0 (N/3 disjoint copysets).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CopysetsCheck {
    /// Chunks per node assumed for random replication.
    pub chunks_per_node: f64,
    /// Random replication, closed form.
    pub random_closed: f64,
    /// Random replication, Monte Carlo (none when asked for no trials).
    pub random_mc: Option<LossEstimate>,
    /// Copyset replication, closed form.
    pub copyset_closed: f64,
    /// Copyset replication, Monte Carlo (none when asked for no trials).
    pub copyset_mc: Option<LossEstimate>,
    /// Chunks per node at which random replication reaches 99.99 % (closed form).
    pub chunks_for_9999: f64,
}

/// Runs the copysets check with `chunks_per_node` chunks per node for random replication
/// (RAMCloud's 64 GB per server in 8 MB segments is 8192). Copyset replication's loss does
/// not depend on the chunk count once every copyset holds a chunk, so its Monte Carlo uses
/// 16 chunks per node (about 27 chunks per copyset). Random replication's Monte Carlo places N · chunks / 3 chunks once
/// (41 million slabs at 8192), so `random_trials` is kept small by the caller. A Monte Carlo
/// with 0 trials is skipped.
pub fn copysets_check(
    chunks_per_node: f64,
    random_trials: u64,
    copyset_trials: u64,
    threads: usize,
    seed: u64,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<CopysetsCheck, SimError> {
    let p = Params {
        n: 5000,
        k: 1,
        r: 2,
        l: 0,
        slabs_per_node: chunks_per_node,
        fail_fraction: 0.01,
        ranges_per_client: 2,
    };
    let random_closed = closed_forms(PolicyKind::EcCache, &p)?.0;
    let copyset_closed = closed_forms(PolicyKind::Codingsets, &p)?.0;
    let random_mc = (random_trials > 0)
        .then(|| {
            let o = McOptions {
                trials: random_trials,
                placements: 1,
                threads,
                seed,
            };
            estimate_loss(Policy::EcCache, &p, &o, progress)
        })
        .transpose()?;
    let cp = Params {
        slabs_per_node: 16.0,
        ..p
    };
    let copyset_mc = (copyset_trials > 0)
        .then(|| {
            let o = McOptions {
                trials: copyset_trials,
                placements: 4,
                threads,
                seed: seed ^ 1,
            };
            estimate_loss(Policy::CodingSets { l: 0 }, &cp, &o, progress)
        })
        .transpose()?;
    // 1 − (1 − q)^R = 0.9999 ⇔ R = ln(1e-4) / ln(1 − q), R = N · chunks / 3.
    let q = analysis::hypergeometric_tail(5000, 50, 3, 3);
    let chunks_for_9999 = (1e-4f64).ln() / (-q).ln_1p() * 3.0 / 5000.0;
    Ok(CopysetsCheck {
        chunks_per_node,
        random_closed,
        random_mc,
        copyset_closed,
        copyset_mc,
        chunks_for_9999,
    })
}

/// Writes `text` to `path`, naming the file on failure.
pub fn write_file(path: &Path, text: &str) -> Result<(), SimError> {
    std::fs::write(path, text).map_err(|e| SimError::Output {
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

/// Figure 15 rows as CSV.
pub fn loss_csv(rows: &[LossRow]) -> String {
    let mut s = String::from(
        "vary,x,n,k,r,l,slabs_per_node,fail_fraction,policy,closed_form,paper_formula,\
         mc_p,mc_low95,mc_high95,mc_trials,mc_losses,distinct_sets,closed_in_ci95\n",
    );
    for r in rows {
        let p = &r.params;
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{},{:.6e},{:.6e},{:.6e},{:.6e},{:.6e},{},{},{:.1},{}",
            r.vary.name(),
            r.x,
            p.n,
            p.k,
            p.r,
            p.l,
            p.slabs_per_node,
            p.fail_fraction,
            r.policy,
            r.closed,
            r.paper,
            r.mc.p,
            r.mc.ci.0,
            r.mc.ci.1,
            r.mc.trials,
            r.mc.losses,
            r.mc.distinct_sets,
            r.mc.agrees(r.closed, 1.96)
        );
    }
    s
}

/// Figure 16 rows as CSV.
pub fn balance_csv(rows: &[BalanceRow]) -> String {
    let mut s = String::from(
        "n,policy,l,initial,view,max_over_mean,cv,max,mean,repeats,ec_cache_closed_form\n",
    );
    for r in rows {
        let l = match r.policy {
            Policy::CodingSets { l } => l.to_string(),
            _ => String::new(),
        };
        let _ = writeln!(
            s,
            "{},{},{},{},{},{:.4},{:.4},{},{:.3},{},{}",
            r.n,
            r.policy.kind(),
            l,
            r.initial.name(),
            view_text(r.view),
            r.balance.max_over_mean,
            r.balance.cv,
            r.balance.max,
            r.balance.mean,
            r.balance.repeats,
            r.ec_closed.map(|c| format!("{c:.4}")).unwrap_or_default()
        );
    }
    s
}

/// A probability as text: a percentage, more digits close to 100 %, scientific below 0.1 %.
pub fn pct(p: f64) -> String {
    if p == 0.0 {
        "0".into()
    } else if (0.999..1.0).contains(&p) {
        format!("{:.5}%", p * 100.0)
    } else if p >= 1e-3 {
        format!("{:.3}%", p * 100.0)
    } else {
        format!("{:.2e}", p)
    }
}

/// A Monte Carlo estimate as "p [lo, hi]".
pub fn mc_text(e: &LossEstimate) -> String {
    format!("{} [{}, {}]", pct(e.p), pct(e.ci.0), pct(e.ci.1))
}

/// Markdown tables of both figures (either may be empty).
pub fn markdown(loss: &[LossRow], bal: &[BalanceRow]) -> String {
    let mut s = String::new();
    for vary in Vary::ALL {
        let xs: Vec<f64> = loss
            .iter()
            .filter(|r| r.vary == vary)
            .map(|r| r.x)
            .collect();
        if xs.is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            "\n**P(data loss) vs {}** (others at the base; Monte Carlo with 95 % interval)\n",
            vary.name()
        );
        s.push_str(
            "| x | CodingSets closed | CodingSets MC | paper formula (CS) | EC-Cache closed \
             | EC-Cache MC | power of two MC | EC-Cache / CodingSets |\n\
             |---|---|---|---|---|---|---|---|\n",
        );
        let mut seen = Vec::new();
        for &x in &xs {
            if seen.contains(&x) {
                continue;
            }
            seen.push(x);
            let get = |k: PolicyKind| {
                loss.iter()
                    .find(|r| r.vary == vary && r.x == x && r.policy == k)
            };
            let (Some(cs), Some(ec), Some(p2)) = (
                get(PolicyKind::Codingsets),
                get(PolicyKind::EcCache),
                get(PolicyKind::PowerOfTwo),
            ) else {
                continue;
            };
            let ratio = if cs.closed > 0.0 {
                format!("{:.1}×", ec.closed / cs.closed)
            } else {
                "—".into()
            };
            let xs = if vary == Vary::F {
                format!("{}%", x * 100.0)
            } else {
                format!("{x}")
            };
            let _ = writeln!(
                s,
                "| {xs} | {} | {} | {} | {} | {} | {} | {ratio} |",
                pct(cs.closed),
                mc_text(&cs.mc),
                pct(cs.paper),
                pct(ec.closed),
                mc_text(&ec.mc),
                mc_text(&p2.mc),
            );
        }
    }
    let combos = [Initial::Uniform, Initial::Skewed]
        .into_iter()
        .flat_map(|i| fig16_views().into_iter().map(move |v| (i, v)));
    for (initial, view) in combos {
        let rows: Vec<&BalanceRow> = bal
            .iter()
            .filter(|r| r.initial == initial && r.view == view)
            .collect();
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            "\n**Load balance (max / mean slabs per node), {} initial loads, {} view**\n",
            initial.name(),
            view_text(view)
        );
        let policies = fig16_policies();
        s.push_str("| N |");
        for p in &policies {
            let _ = write!(s, " {p} |");
        }
        s.push_str(" EC-Cache closed form |\n|---|");
        s.push_str(&"---|".repeat(policies.len() + 1));
        s.push('\n');
        let mut ns: Vec<usize> = rows.iter().map(|r| r.n).collect();
        ns.dedup();
        for n in ns {
            let _ = write!(s, "| {n} |");
            for p in &policies {
                match rows.iter().find(|r| r.n == n && r.policy == *p) {
                    Some(r) => {
                        let _ = write!(s, " {:.3} |", r.balance.max_over_mean);
                    }
                    None => s.push_str(" |"),
                }
            }
            let closed = rows
                .iter()
                .find_map(|r| (r.n == n).then_some(r.ec_closed).flatten());
            let _ = writeln!(
                s,
                " {} |",
                closed.map(|c| format!("{c:.3}")).unwrap_or_default()
            );
        }
    }
    s
}

/// A view as text: its name, with the wave size for waves.
pub fn view_text(view: View) -> String {
    match view {
        View::Waves(w) => format!("waves-of-{w}"),
        v => v.name().into(),
    }
}

/// Figure 15 charts, one per panel: (file stem, chart).
pub fn loss_charts(rows: &[LossRow]) -> Vec<(String, Chart)> {
    let mut out = Vec::new();
    for vary in Vary::ALL {
        let sel: Vec<&LossRow> = rows.iter().filter(|r| r.vary == vary).collect();
        if sel.is_empty() {
            continue;
        }
        let scale = if vary == Vary::F { 100.0 } else { 1.0 };
        let pts = |k: PolicyKind, f: &dyn Fn(&LossRow) -> f64| -> Vec<(f64, f64)> {
            sel.iter()
                .filter(|r| r.policy == k)
                .map(|r| (r.x * scale, f(r)))
                .collect()
        };
        let ci = |k: PolicyKind| -> Vec<(f64, f64)> {
            sel.iter()
                .filter(|r| r.policy == k)
                .map(|r| r.mc.ci)
                .collect()
        };
        let line = |label: &str, points, color| Series {
            label: label.into(),
            points,
            intervals: vec![],
            markers: false,
            color,
        };
        let dots = |label: &str, k: PolicyKind, color| Series {
            label: label.into(),
            points: pts(k, &|r| r.mc.p),
            intervals: ci(k),
            markers: true,
            color,
        };
        let series = vec![
            line(
                "CodingSets, closed form",
                pts(PolicyKind::Codingsets, &|r| r.closed),
                0,
            ),
            dots(
                "CodingSets, Monte Carlo (95% CI)",
                PolicyKind::Codingsets,
                0,
            ),
            line(
                "CodingSets, paper's formula",
                pts(PolicyKind::Codingsets, &|r| r.paper),
                2,
            ),
            line(
                "EC-Cache, closed form",
                pts(PolicyKind::EcCache, &|r| r.closed),
                1,
            ),
            dots("EC-Cache, Monte Carlo (95% CI)", PolicyKind::EcCache, 1),
            line(
                "EC-Cache, paper's formula",
                pts(PolicyKind::EcCache, &|r| r.paper),
                3,
            ),
            dots(
                "power of two, Monte Carlo (95% CI)",
                PolicyKind::PowerOfTwo,
                4,
            ),
        ];
        out.push((
            format!("fig15_{}", vary.name()),
            Chart {
                title: format!(
                    "P(data loss) vs {} (base k=8 r=2 l=2 S=16 f=1% N=1000)",
                    vary.name()
                ),
                x_label: vary.label().into(),
                y_label: "probability of data loss".into(),
                log_x: matches!(vary, Vary::S | Vary::N),
                log_y: true,
                series,
            },
        ));
    }
    out
}

/// Figure 16 charts, one per (initial loads, view): (file stem, chart).
pub fn balance_charts(rows: &[BalanceRow]) -> Vec<(String, Chart)> {
    let mut out = Vec::new();
    for initial in [Initial::Uniform, Initial::Skewed] {
        for view in fig16_views() {
            let sel: Vec<&BalanceRow> = rows
                .iter()
                .filter(|r| r.initial == initial && r.view == view)
                .collect();
            if sel.is_empty() {
                continue;
            }
            let mut series: Vec<Series> = fig16_policies()
                .into_iter()
                .enumerate()
                .map(|(c, p)| Series {
                    label: p.to_string(),
                    points: sel
                        .iter()
                        .filter(|r| r.policy == p)
                        .map(|r| (r.n as f64, r.balance.max_over_mean))
                        .collect(),
                    intervals: vec![],
                    markers: false,
                    color: c,
                })
                .collect();
            let closed: Vec<(f64, f64)> = sel
                .iter()
                .filter(|r| r.policy == Policy::EcCache)
                .filter_map(|r| r.ec_closed.map(|c| (r.n as f64, c)))
                .collect();
            if !closed.is_empty() {
                series.push(Series {
                    label: "ec-cache, closed form".into(),
                    points: closed,
                    intervals: vec![],
                    markers: true,
                    color: 7,
                });
            }
            out.push((
                format!("fig16_{}_{}", initial.name(), view.name()),
                Chart {
                    title: format!(
                        "Load balance, k=8 r=2 S=16, {} initial loads, {} view",
                        initial.name(),
                        view_text(view)
                    ),
                    x_label: "N (nodes)".into(),
                    y_label: "max / mean slabs per node".into(),
                    log_x: true,
                    // Herding (stale views) reaches thousands of times the mean: a log axis
                    // then keeps the other policies readable.
                    log_y: sel.iter().any(|r| r.balance.max_over_mean > 5.0),
                    series,
                },
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_fig15_writes_consistent_rows() {
        let opts = McOptions {
            trials: 3000,
            placements: 2,
            threads: 2,
            seed: 1,
        };
        let points = std::sync::atomic::AtomicUsize::new(0);
        let base = Params {
            n: 300,
            fail_fraction: 0.03,
            ..Params::paper_base()
        };
        // Only two panels, to keep the test short.
        let rows: Vec<LossRow> = fig15(
            base,
            true,
            &opts,
            &|_| {
                points.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            },
            &|_| {},
        )
        .unwrap();
        assert_eq!(points.into_inner(), fig15_points(true).len());
        assert_eq!(rows.len(), 3 * fig15_points(true).len());
        let csv = loss_csv(&rows);
        assert_eq!(csv.lines().count(), rows.len() + 1);
        let md = markdown(&rows, &[]);
        assert!(
            md.contains("P(data loss) vs k") && md.contains("| 8 |"),
            "{md}"
        );
        assert_eq!(loss_charts(&rows).len(), 6);
        for r in &rows {
            assert!(r.mc.trials == 3000 && (0.0..=1.0).contains(&r.closed));
        }
    }

    #[test]
    fn fig16_small_sizes() {
        let rows = fig16(Params::paper_base(), 1000, 2000, 2, 3, &|_| {}).unwrap();
        assert_eq!(rows.len(), fig16_settings(1000).len());
        assert_eq!(rows.len(), 2 * 3 * 2 * 7);
        let csv = balance_csv(&rows);
        assert!(csv.contains("codingsets,4,uniform,exact"));
        let md = markdown(&[], &rows);
        assert!(md.contains("| 1000 |"), "{md}");
        assert_eq!(balance_charts(&rows).len(), 6);
        for r in &rows {
            assert!(r.balance.max_over_mean >= 1.0);
        }
    }

    #[test]
    fn copysets_paper_numbers() {
        // Cheap version: the closed forms at the paper's setting, Monte Carlo with fewer chunks
        // (random replication) and trials; the full check is `hydramem sim copysets-check`.
        let c = copysets_check(8192.0, 0, 0, 2, 1, &|_| {}).unwrap();
        assert_eq!((c.random_mc, c.copyset_mc), (None, None));
        assert!(
            c.random_closed > 0.9999,
            "random replication {}",
            c.random_closed
        );
        assert!(
            (0.0013..0.0018).contains(&c.copyset_closed),
            "copyset replication {}",
            c.copyset_closed
        );
        assert!(
            (5000.0..7000.0).contains(&c.chunks_for_9999),
            "{}",
            c.chunks_for_9999
        );
        // Monte Carlo agrees where it can resolve the probability.
        let c = copysets_check(100.0, 400, 40_000, 2, 2, &|_| {}).unwrap();
        assert!(c.random_mc.unwrap().agrees(c.random_closed, 3.29), "{c:?}");
        assert!(
            c.copyset_mc.unwrap().agrees(c.copyset_closed, 3.29),
            "{c:?}"
        );
        assert!(
            c.random_closed > 0.05 && c.random_closed < 0.95,
            "{}",
            c.random_closed
        );
    }
}
