//! The near tier's settings, given by the user to the builder; the tier itself is `near.rs`.

use std::time::Duration;

/// The near tier's settings: how many entries and bytes it may hold, and how stale a copy may
/// be served when the invalidation stream breaks. Given to
/// [`CacheBuilder::near_cache`](crate::CacheBuilder::near_cache).
///
/// The near tier answers the `get_or_compute` family ([`Cache::fetch`](crate::Cache::fetch) and
/// the calls built on it) with fresh values only; [`Cache::get`](crate::Cache::get) always reads
/// Redis. A copy is filled by this instance's reads from Redis (a computed value goes in at its
/// next read), and is dropped when another instance announces a change of its key, when
/// `set` or `invalidate` is called here, at its fresh-until, or when the stream is not proven
/// live. How hits, misses, announcements and switch-offs went is in
/// [`Stats`](crate::Stats) (`near_*`).
///
/// | setting | default |
/// |---|---|
/// | [`max_entries`](Self::new) | (required) |
/// | [`max_bytes`](Self::max_bytes) | 64 MiB |
/// | [`max_staleness`](Self::max_staleness) | 1 s |
///
/// ```
/// use stampede_guard::NearCacheOptions;
/// use std::time::Duration;
///
/// let near = NearCacheOptions::new(10_000)
///     .max_bytes(32 << 20)
///     .max_staleness(Duration::from_millis(500));
/// assert_eq!(near.get_max_entries(), 10_000);
/// assert_eq!(near.get_max_bytes(), 32 << 20);
/// assert_eq!(near.get_max_staleness(), Duration::from_millis(500));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[must_use]
pub struct NearCacheOptions {
    pub(crate) max_entries: u64,
    pub(crate) max_bytes: u64,
    pub(crate) max_staleness: Duration,
}

impl NearCacheOptions {
    /// A near tier of at most `max_entries` values (at least 1), with the other settings at
    /// their defaults.
    ///
    /// ```
    /// let near = stampede_guard::NearCacheOptions::new(1_000);
    /// assert_eq!(near.get_max_bytes(), 64 << 20);
    /// ```
    pub fn new(max_entries: u64) -> Self {
        NearCacheOptions {
            max_entries: max_entries.max(1),
            max_bytes: 64 << 20,
            max_staleness: Duration::from_secs(1),
        }
    }

    /// At most this many bytes of values (default 64 MiB, at least 1), counted as their encoded
    /// size plus the key: an estimate of the decoded size that needs no help from `T`.
    ///
    /// ```
    /// let near = stampede_guard::NearCacheOptions::new(100).max_bytes(1 << 20);
    /// assert_eq!(near.get_max_bytes(), 1 << 20);
    /// ```
    pub fn max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes.max(1);
        self
    }

    /// The staleness bound (default 1 s): a copy is served only while the invalidation stream
    /// was proven current less than this long ago, so a copy served is never older than a
    /// change made through the crate that completed more than `max_staleness` before the read.
    /// A heartbeat goes around every quarter of it (one `PUBLISH` that only this instance
    /// receives). At least 4 ms; longer values than a year count as a year.
    ///
    /// ```
    /// use std::time::Duration;
    /// let near = stampede_guard::NearCacheOptions::new(100).max_staleness(Duration::from_millis(200));
    /// assert_eq!(near.get_max_staleness(), Duration::from_millis(200));
    /// ```
    pub fn max_staleness(mut self, max_staleness: Duration) -> Self {
        const YEAR: Duration = Duration::from_secs(365 * 24 * 60 * 60);
        self.max_staleness = max_staleness.clamp(Duration::from_millis(4), YEAR);
        self
    }

    /// The entry bound in force.
    ///
    /// ```
    /// assert_eq!(stampede_guard::NearCacheOptions::new(0).get_max_entries(), 1);
    /// ```
    pub fn get_max_entries(&self) -> u64 {
        self.max_entries
    }

    /// The byte bound in force.
    ///
    /// ```
    /// assert_eq!(stampede_guard::NearCacheOptions::new(10).get_max_bytes(), 64 << 20);
    /// ```
    pub fn get_max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The staleness bound in force.
    ///
    /// ```
    /// use std::time::Duration;
    /// assert_eq!(stampede_guard::NearCacheOptions::new(10).get_max_staleness(), Duration::from_secs(1));
    /// ```
    pub fn get_max_staleness(&self) -> Duration {
        self.max_staleness
    }

    /// How often the feed proves itself current.
    pub(crate) fn heartbeat_period(&self) -> Duration {
        self.max_staleness / 4
    }
}
