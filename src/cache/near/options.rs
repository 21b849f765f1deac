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
/// | [`serve_while_down`](Self::serve_while_down) | off |
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
    pub(crate) serve_while_down: Duration,
    /// The user-key prefixes whose changes Redis reports, whoever makes them; `None`: only the
    /// crate's own announcements (see [`track_outside_writes`](Self::track_outside_writes)).
    pub(crate) tracked: Option<Vec<String>>,
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
            serve_while_down: Duration::ZERO,
            tracked: Some(Vec::new()),
        }
    }

    /// Whether copies are dropped when anyone changes their Redis key, not only this crate
    /// (default on): another program's `SET`, `DEL`, `UNLINK`, `EXPIRE`, a `RENAME` onto the
    /// key, Redis expiring or evicting it, `FLUSHDB` and `FLUSHALL`; within `max_staleness`,
    /// like the crate's own writes. The feed's connection asks Redis for it with
    /// `CLIENT TRACKING on BCAST PREFIX <namespace>:{` (Redis 6 or later, Valkey).
    ///
    /// The cost: Redis then sends every instance a message for every change of a key of the
    /// namespace, locks and fencing counters included, about three per computed value (the guide,
    /// `docs/near-cache.md`, has the figures per fleet size). Narrow it with
    /// [`track_only`](Self::track_only), or turn it off where nothing but the crate writes the
    /// namespace's keys: the crate's own writes are announced either way. Where the server
    /// refuses tracking (an ACL without `client`, a managed service that disables the command),
    /// the tier works as with `false` and says so once in the log, in
    /// [`Stats::near_tracking`](crate::Stats::near_tracking) and in the health report. Either
    /// way (refused or `false`), each copy is read again from Redis once it is `max_staleness`
    /// old, so that a change made outside the crate is not served past that bound either: one
    /// read per hot key per `max_staleness`.
    ///
    /// ```
    /// let near = stampede_guard::NearCacheOptions::new(10_000).track_outside_writes(false);
    /// assert!(!near.get_track_outside_writes());
    /// ```
    pub fn track_outside_writes(mut self, on: bool) -> Self {
        self.tracked = on.then(Vec::new);
        self
    }

    /// Tracks changes made outside the crate ([`track_outside_writes`](Self::track_outside_writes))
    /// only for keys that start with one of `prefixes` (the user's keys, as given to `fetch`),
    /// so that Redis sends nothing for the others. An empty list, or an empty prefix, tracks
    /// the whole namespace.
    ///
    /// ```
    /// let near = stampede_guard::NearCacheOptions::new(10_000).track_only(["report:", "rates:"]);
    /// assert!(near.get_track_outside_writes());
    /// ```
    pub fn track_only<I, S>(mut self, prefixes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let prefixes: Vec<String> = prefixes.into_iter().map(Into::into).collect();
        self.tracked = Some(if prefixes.iter().any(String::is_empty) {
            Vec::new()
        } else {
            prefixes
        });
        self
    }

    /// Whether changes made outside the crate are tracked.
    ///
    /// ```
    /// assert!(stampede_guard::NearCacheOptions::new(10).get_track_outside_writes());
    /// ```
    pub fn get_track_outside_writes(&self) -> bool {
        self.tracked.is_some()
    }

    /// While Redis is unreachable, serve this instance's copies for at most `bound` after its
    /// invalidation feed stopped being proven (default off: [`Duration::ZERO`];
    /// [`Duration::MAX`]: until Redis answers again). Relaxed bound, in one sentence: **while
    /// Redis is unreachable, a value served may miss changes that completed up to
    /// `bound + max_staleness` before the call, instead of `max_staleness`.**
    ///
    /// Such a call is answered with [`Source::Held`](crate::Source::Held) (counted in
    /// [`Stats::held_served`](crate::Stats::held_served)). With the option on, a copy is kept
    /// when the feed's proof lapses instead of being dropped (it is not served while Redis
    /// answers), and kept past its fresh-until for the call's
    /// [`fail_safe_for`](crate::CallOptions::fail_safe_for): with the fail-safe on, a copy past
    /// its fresh-until is served too while Redis is unreachable, as Redis itself would serve it
    /// as a fallback. A held copy is never served as a hit again (it may have missed a change):
    /// once Redis answers, this instance reads it anew; the crate's announcement of a change of
    /// its key drops it (a tracking report does not: it may be another instance refilling the
    /// key while this one cannot reach Redis, and serving the copy stays within the bound). "Unreachable"
    /// means the call's request failed as unreachable or busy, or the circuit breaker failed it
    /// fast ([`BreakerOptions`](crate::BreakerOptions)), or Redis left the call's read
    /// unanswered for 2 ms while the feed is silent past its proof (the server stopped
    /// answering: the call does not wait for the breaker's stall bound); a refusal is not an
    /// outage.
    ///
    /// ```
    /// use stampede_guard::NearCacheOptions;
    /// use std::time::Duration;
    ///
    /// let near = NearCacheOptions::new(10_000).serve_while_down(Duration::from_secs(60));
    /// assert_eq!(near.get_serve_while_down(), Duration::from_secs(60));
    /// ```
    pub fn serve_while_down(mut self, bound: Duration) -> Self {
        self.serve_while_down = bound;
        self
    }

    /// The serve-while-down bound in force ([`Duration::ZERO`]: off).
    ///
    /// ```
    /// use std::time::Duration;
    /// assert_eq!(stampede_guard::NearCacheOptions::new(10).get_serve_while_down(), Duration::ZERO);
    /// ```
    pub fn get_serve_while_down(&self) -> Duration {
        self.serve_while_down
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
