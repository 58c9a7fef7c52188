//! Percentiles of measured durations, the way every table in `BENCHMARKS.md` takes them.

use std::time::Duration;

/// The `p`th percentile (0–100) of `sorted` by the nearest-rank method; zero when empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Milliseconds, for printing.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The median of `values` with a distribution-free confidence interval: the order statistics
/// `x(k)` and `x(n+1-k)` for the largest `k` whose interval covers the median with at least
/// `confidence` (binomial with p = 1/2). Returns (low, median, high, the confidence reached);
/// with too few values for `confidence`, the widest interval (all values) and its confidence.
/// `None` for no values.
pub fn median_interval(values: &[f64], confidence: f64) -> Option<(f64, f64, f64, f64)> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return None;
    }
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    // P(B < k) for B ~ Binomial(n, 1/2): the chance that fewer than k values fall below the
    // median, i.e. that x(k) lies above it.
    let below = |k: usize| -> f64 {
        let mut coefficient = 1.0_f64;
        let mut sum = 0.0;
        for i in 0..k {
            if i > 0 {
                coefficient *= (n + 1 - i) as f64 / i as f64;
            }
            sum += coefficient;
        }
        sum / 2f64.powi(n as i32)
    };
    let covered = |k: usize| 1.0 - 2.0 * below(k);
    let mut k = 1;
    while k < n.div_ceil(2) && covered(k + 1) >= confidence {
        k += 1;
    }
    Some((v[k - 1], median, v[n - k], covered(k)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_intervals_from_order_statistics() {
        // 20 values: x(6) and x(15) cover the median with 95.86 %.
        let twenty: Vec<f64> = (1..=20).map(f64::from).collect();
        let (low, median, high, reached) = median_interval(&twenty, 0.95).unwrap();
        assert_eq!((low, median, high), (6.0, 10.5, 15.0));
        assert!((reached - 0.9586).abs() < 1e-4, "{reached}");
        // 5 values cannot reach 95 %: the widest interval, 93.75 %.
        let (low, median, high, reached) =
            median_interval(&[5.0, 1.0, 3.0, 2.0, 4.0], 0.95).unwrap();
        assert_eq!((low, median, high), (1.0, 3.0, 5.0));
        assert!((reached - 0.9375).abs() < 1e-9);
        assert_eq!(median_interval(&[], 0.95), None);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let sorted: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&sorted, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&sorted, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&sorted[..1], 99.0), Duration::from_millis(1));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
    }
}
