//! Latency percentiles of the benches that print their own.

use std::time::Duration;

/// The nearest-rank `p`-th percentile (0 < p ≤ 100) of `sorted` samples, in milliseconds.
pub fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1].as_secs_f64() * 1000.0
}
