//! The wall clock in the units the tests and their child processes exchange.

/// Microseconds since the Unix epoch: the one clock that a test and the processes it starts share.
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}
