//! The work of BENCH.md: the month keys, their values, the counters' names, and the clock that
//! parent and workers share.

use std::time::{SystemTime, UNIX_EPOCH};

/// The i-th key: months from 2019-01.
pub(crate) fn month(i: usize) -> String {
    format!("{}-{:02}", 2019 + i / 12, i % 12 + 1)
}

/// The counter that the computation of `month` increments, on db 0.
pub(crate) fn counter_key(month: &str) -> String {
    format!("bench:computes:{month}")
}

/// The counter that each call of the batch computation increments (`--batch`), on db 0.
pub(crate) const BATCH_CALLS_KEY: &str = "bench:batch_calls";

/// The value of `month`: `(month + "|")` repeated and truncated to `size` bytes.
pub(crate) fn expected_value(month: &str, size: usize) -> String {
    let unit = format!("{month}|");
    unit.repeat(size / unit.len() + 1)[..size].to_owned()
}

/// Microseconds since the Unix epoch: the one clock that parent and workers share.
pub(crate) fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// The same server as `url`, on db 0, where the compute counters live.
pub(crate) fn db0_client(url: &str) -> Result<redis::Client, redis::RedisError> {
    let info = redis::Client::open(url)?.get_connection_info().clone();
    let settings = info.redis_settings().clone().set_db(0);
    redis::Client::open(info.set_redis_settings(settings))
}
