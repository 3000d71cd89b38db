//! Latencies of one kind of access, in a histogram (nanosecond resolution, 3 significant
//! digits), and what the probe reports of them: percentiles and a CDF to plot.
//!
//! Invariant: a [`Summary`] is derived from every sample recorded, none dropped (samples past
//! the histogram's hour-long range are clamped to it, and counted).

use hdrhistogram::Histogram;
use serde::Serialize;
use std::time::Duration;

/// The longest latency recorded as itself: an hour, in ns.
const MAX_NS: u64 = 3_600_000_000_000;

/// Latencies of one kind of access.
pub struct Latencies {
    hist: Histogram<u64>,
    clamped: u64,
}

/// What is reported of a [`Latencies`]: counts, percentiles in µs, and the CDF.
#[derive(Debug, Serialize)]
pub struct Summary {
    /// Samples.
    pub count: u64,
    /// Percentiles in µs.
    pub p50_us: f64,
    /// 90th percentile, µs.
    pub p90_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// 99.9th percentile, µs.
    pub p999_us: f64,
    /// The largest, µs.
    pub max_us: f64,
    /// Mean, µs.
    pub mean_us: f64,
    /// (latency µs, fraction of samples at or below it) at 200 evenly spaced quantiles.
    pub cdf: Vec<(f64, f64)>,
    /// Samples longer than an hour, recorded as an hour.
    pub clamped: u64,
}

impl Default for Latencies {
    fn default() -> Latencies {
        Latencies {
            hist: Histogram::new_with_bounds(1, MAX_NS, 3).expect("constant, valid bounds"),
            clamped: 0,
        }
    }
}

impl Latencies {
    /// Records one latency.
    pub fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1);
        if ns > MAX_NS {
            self.clamped += 1;
        }
        self.hist.saturating_record(ns.min(MAX_NS));
    }

    /// Percentiles and the CDF (all zero when nothing was recorded).
    pub fn summary(&self) -> Summary {
        let us = |q: f64| self.hist.value_at_quantile(q) as f64 / 1000.0;
        let cdf = if self.hist.is_empty() {
            Vec::new()
        } else {
            (1..=200)
                .map(|i| f64::from(i) / 200.0)
                .map(|q| (us(q), q))
                .collect()
        };
        Summary {
            count: self.hist.len(),
            p50_us: us(0.5),
            p90_us: us(0.9),
            p99_us: us(0.99),
            p999_us: us(0.999),
            max_us: self.hist.max() as f64 / 1000.0,
            mean_us: self.hist.mean() / 1000.0,
            cdf,
            clamped: self.clamped,
        }
    }
}

impl Summary {
    /// "p50/p90/p99/p99.9 µs" for the text report.
    pub fn line(&self) -> String {
        format!(
            "{:.1}/{:.1}/{:.1}/{:.1}",
            self.p50_us, self.p90_us, self.p99_us, self.p999_us
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_follow_the_samples() {
        let mut l = Latencies::default();
        for us in 1..=1000u64 {
            l.record(Duration::from_micros(us));
        }
        let s = l.summary();
        assert_eq!(s.count, 1000);
        assert!((s.p50_us - 500.0).abs() < 1.0, "{}", s.p50_us);
        assert!((s.p99_us - 990.0).abs() < 1.5, "{}", s.p99_us);
        assert_eq!(s.cdf.len(), 200);
        assert!(s
            .cdf
            .windows(2)
            .all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
        assert_eq!(s.cdf.last().map(|c| c.1), Some(1.0));
    }

    #[test]
    fn nothing_recorded_is_all_zero_and_past_an_hour_is_clamped() {
        let s = Latencies::default().summary();
        assert_eq!((s.count, s.p50_us, s.cdf.len()), (0, 0.0, 0));
        let mut l = Latencies::default();
        l.record(Duration::from_secs(7200));
        let s = l.summary();
        assert_eq!((s.count, s.clamped), (1, 1));
        assert!(s.max_us >= 3.5e9);
    }
}
