//! Per-call options and their defaults.
//!
//! Explained in the guide: `docs/configuration.md`, `docs/freshness.md`.

use std::time::Duration;

use crate::time::{add, saturate};

/// The namespace of caches and locks built without one.
pub(crate) const DEFAULT_NAMESPACE: &str = "stampede";

/// Consuming setters of builders and option structs: each `name: Type` becomes
/// `pub fn name(mut self, name: Type) -> Self` storing its argument in the field `name`, as
/// given or as `= expression` says (a bound, a saturation: the one place a value from the user
/// is made representable); each `name: [impl Into<String>]` takes any list of strings and
/// stores them collected. A setter that writes another field is written out beside the block.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: [impl Into<String>];)+) => {$(
        $(#[$doc])*
        pub fn $name<I, S>(mut self, $name: I) -> Self
        where
            I: IntoIterator<Item = S>,
            S: Into<String>,
        {
            self.$name = $name.into_iter().map(Into::into).collect();
            self
        }
    )+};
    ($($(#[$doc:meta])* $name:ident: $ty:ty $(= $kept:expr)?;)+) => {$(
        $(#[$doc])*
        pub fn $name(mut self, $name: $ty) -> Self {
            self.$name = $crate::options::setters!(@kept $name $(, $kept)?);
            self
        }
    )+};
    (@kept $name:ident) => { $name };
    (@kept $name:ident, $kept:expr) => { $kept };
}
pub(crate) use setters;

/// How a call behaves: the lock's lease, how long to wait for another caller, how to back off, and
/// what to do when the backend is down.
///
/// Every [`Cache`](crate::Cache) carries a set (the builder's, or [`CallOptions::default`]);
/// [`Cache::with_options`](crate::Cache::with_options) gives a handle with another set for the
/// calls made through it.
///
/// Every duration may be anything up to [`Duration::MAX`]: it is cut down to [`FOREVER`](crate::FOREVER)
/// (100 years), which means "no expiry" for a lease or a TTL, and "no bound" for a wait.
///
/// | option | default | meaning |
/// |---|---|---|
/// | [`lease`](Self::lease) | 5 s | how long a lock lives without renewal; a dead holder blocks others this long at most |
/// | [`renew`](Self::renew) | on | extend the lease every `lease / 3` while the computation runs |
/// | [`wait_timeout`](Self::wait_timeout) | 30 s | how long a caller waits for another's computation before [`Error::WaitTimeout`](crate::Error::WaitTimeout) |
/// | [`backoff`](Self::backoff) | 10 ms doubling to 500 ms, jittered | re-check interval when no wake-up arrives |
/// | [`on_backend_error`](Self::on_backend_error) | [`OnBackendError::Fail`] | Redis down: fail, or compute without the cache |
/// | [`max_hold`](Self::max_hold) | none | the hard timeout: a computation still running this long after taking its lock is cancelled and its lock freed; a [`Lock`](crate::Lock) stops renewing |
/// | [`stale_for`](Self::stale_for) | 0 (off) | after the TTL, serve the old value this much longer while one caller refreshes it |
/// | [`early_refresh`](Self::early_refresh) | 0 (off) | XFetch: refresh before expiry with probability rising as it nears; 1.0 is the paper's default |
/// | [`serve_stale_on_error`](Self::serve_stale_on_error) | on | a failed background refresh keeps the old value until its hard expiry |
/// | [`negative_ttl`](Self::negative_ttl) | none (off) | remember a failed computation this long, so others get its error at once |
/// | [`fail_safe_for`](Self::fail_safe_for) | 0 (off) | keep a value this much longer after its stale window, as a fallback for when its computation fails or is slow |
/// | [`fail_safe_throttle`](Self::fail_safe_throttle) | 5 s | after a failure, serve the fallback this long before calling the source again |
/// | [`soft_timeout`](Self::soft_timeout) | none | with a fallback at hand, answer with it once a call has run this long; the computation goes on in the background |
/// | [`tags`](Self::tags) | none | tags every value written through the handle carries, for [`Cache::invalidate_tag`](crate::Cache::invalidate_tag) |
/// | [`skip_near_cache`](Self::skip_near_cache) | off | reads go to Redis even when this instance's near tier holds a copy: they see a write made on another instance as soon as it returned |
/// | [`span_keys`](Self::span_keys) | [`SpanKeys::Hashed`] | how a call's span shows its key: hashed, left out, or in clear |
/// | [`trace_near_hits`](Self::trace_near_hits) | off | a hit of the near tier (or of the embedded store's decoded values) opens a span too; it is always counted |
///
/// Which value a call gets in each case (fresh, stale window, fail-safe window, error) is
/// tabled in `docs/fail-safe.md` and under [`Source`](crate::Source).
///
/// ```
/// use stampede_guard::{CallOptions, OnBackendError};
/// use std::time::Duration;
///
/// let options = CallOptions::default()
///     .lease(Duration::from_secs(10))
///     .wait_timeout(Duration::from_secs(5))
///     .on_backend_error(OnBackendError::ComputeUncached);
/// assert_eq!(options.get_lease(), Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
#[must_use]
pub struct CallOptions {
    pub(crate) lease: Duration,
    pub(crate) renew: bool,
    pub(crate) wait_timeout: Duration,
    pub(crate) backoff: Backoff,
    pub(crate) on_backend_error: OnBackendError,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) stale_for: Duration,
    pub(crate) early_refresh_beta: f64,
    pub(crate) serve_stale_on_error: bool,
    pub(crate) negative_ttl: Option<Duration>,
    pub(crate) fail_safe_for: Duration,
    pub(crate) fail_safe_throttle: Duration,
    pub(crate) soft_timeout: Option<Duration>,
    pub(crate) tags: std::sync::Arc<[String]>,
    pub(crate) skip_near_cache: bool,
    pub(crate) span_keys: SpanKeys,
    pub(crate) trace_near_hits: bool,
}

// `f64` is not `Eq`; the beta is a finite number (the setter refuses NaN), so equality is total.
impl Eq for CallOptions {}

impl Default for CallOptions {
    fn default() -> Self {
        CallOptions {
            lease: Duration::from_secs(5),
            renew: true,
            wait_timeout: Duration::from_secs(30),
            backoff: Backoff::default(),
            on_backend_error: OnBackendError::Fail,
            max_hold: None,
            stale_for: Duration::ZERO,
            early_refresh_beta: 0.0,
            serve_stale_on_error: true,
            negative_ttl: None,
            fail_safe_for: Duration::ZERO,
            fail_safe_throttle: Duration::from_secs(5),
            soft_timeout: None,
            tags: std::sync::Arc::default(),
            skip_near_cache: false,
            span_keys: SpanKeys::Hashed,
            trace_near_hits: false,
        }
    }
}

impl CallOptions {
    crate::options::setters! {
        /// How long the lock lives unless renewed. A holder that dies keeps others waiting at most
        /// this long; a holder that pauses longer than this (without renewal) loses the lock.
        /// Values under 30 ms are raised to 30 ms.
        lease: Duration = saturate(lease).max(Duration::from_millis(30));

        /// Whether the holder extends its lease every `lease / 3` while it computes (default on).
        /// Turned off, a computation that outlasts the lease loses the lock, and its result is not
        /// written over a newer holder's.
        renew: bool;

        /// How long a caller waits for another caller's computation before giving up with
        /// [`Error::WaitTimeout`](crate::Error::WaitTimeout).
        wait_timeout: Duration = saturate(wait_timeout);

        /// The re-check schedule used while waiting, when no wake-up notification arrives.
        backoff: Backoff;

        /// What a cache call does when the backend cannot be reached: fail, or fail open (compute
        /// without the cache, read a miss, skip a write); `invalidate` and a [`Lock`](crate::Lock)
        /// always return the error. The table on [`OnBackendError`] gives each call.
        on_backend_error: OnBackendError;

        /// The longest a lock is held (default: no bound): the **hard timeout** of a computation.
        ///
        /// - A computation of the `get_or_compute` family (in the foreground, after a
        ///   [`soft_timeout`](Self::soft_timeout), or refreshing in the background) still running
        ///   this long after its lock was taken is cancelled (its future dropped) and its lock
        ///   freed at once, so a waiter takes over without waiting for the lease. Its callers get
        ///   the fail-safe fallback if there is one ([`fail_safe_for`](Self::fail_safe_for)), else
        ///   [`Error::ComputeTimeout`](crate::Error::ComputeTimeout). Its value never lands: the
        ///   future is gone, and a write under its fencing token would be refused anyway.
        /// - A [`Lock`](crate::Lock) (and a leader's term) cannot cancel the caller's code: it
        ///   stops renewing at this time, and the lease runs out at most one lease later.
        ///
        /// It bounds the holder; [`wait_timeout`](Self::wait_timeout) bounds the callers waiting
        /// for it. A waiter of a holder cut by its hard timeout is woken by the release and takes
        /// the lock itself.
        ///
        /// ```
        /// use stampede_guard::{Cache, CallOptions, Error};
        /// use std::time::Duration;
        ///
        /// # #[tokio::main(flavor = "current_thread")]
        /// # async fn main() {
        /// let cache = Cache::in_memory()
        ///     .with_options(CallOptions::default().max_hold(Some(Duration::from_millis(50))));
        /// let slow = cache
        ///     .get_or_compute("2019-05", Duration::from_secs(60), || async {
        ///         tokio::time::sleep(Duration::from_secs(10)).await;
        ///         Ok::<_, std::io::Error>(1u32)
        ///     })
        ///     .await;
        /// assert!(matches!(slow, Err(Error::ComputeTimeout { .. })));
        /// # }
        /// ```
        max_hold: Option<Duration> = max_hold.map(saturate);

        /// After the TTL, keep serving the old value for this much longer (stale-while-revalidate):
        /// a read of a stale value returns it at once, and one caller in the fleet refreshes it in
        /// a background task. Default zero: a value expires at its TTL and the next caller
        /// computes.
        stale_for: Duration = saturate(stale_for);
    }

    /// Probabilistic early refresh (XFetch, Vattani, Chierichetti and Lowenstein, VLDB 2015): a
    /// read of a fresh value refreshes it in the background when
    /// `now - delta * beta * ln(rand()) >= fresh_until`, `delta` being the last computation's
    /// duration. Larger `beta` refreshes earlier; 1.0 is the paper's choice; 0 (the default)
    /// turns it off. Negative or non-finite values are taken as 0.
    pub fn early_refresh(mut self, beta: f64) -> Self {
        self.early_refresh_beta = if beta.is_finite() && beta > 0.0 {
            beta
        } else {
            0.0
        };
        self
    }

    crate::options::setters! {
        /// Whether a failed background refresh keeps the stale value in place until its hard expiry
        /// (default on; the failure is logged). Off, the stale value is removed and the next caller
        /// computes in the foreground and sees the error. The removal is fenced, in one step with
        /// the release of the refresh's lock: a value that another caller wrote (or a `set`) while
        /// the refresh ran is kept.
        serve_stale_on_error: bool;

        /// Remember a failed computation for this long (negative caching, default off): callers in
        /// other processes then get [`Error::RecentFailure`](crate::Error::RecentFailure) with the
        /// error's message at once, instead of running a failing query one after another. The
        /// message is cut to 1 KiB. An error marked [`NotShared`](crate::NotShared) (the caller's
        /// own: a permission, a quota) is never remembered, nor handed to this process's waiting
        /// callers.
        negative_ttl: Option<Duration> = negative_ttl.map(saturate);

        /// Fail-safe (default off): keep a value this much longer after its TTL and stale window,
        /// as a fallback. It is **not** served as a normal hit: past its stale window the next
        /// caller computes, as after any expiry. But when that computation fails, is cut by the
        /// hard timeout ([`max_hold`](Self::max_hold)), or runs past the
        /// [`soft_timeout`](Self::soft_timeout), the callers get the kept value
        /// ([`Source::FailSafe`](crate::Source::FailSafe)) instead of the error or the wait; so do
        /// callers waiting on that computation, in this process or another, at their own soft
        /// timeout or [`wait_timeout`](Self::wait_timeout). After a failure the kept value is
        /// rewritten as a *throttled* copy, served as the fallback for
        /// [`fail_safe_throttle`](Self::fail_safe_throttle) without calling the source, and kept at
        /// least that long.
        ///
        /// Callers of one key should agree on [`stale_for`](Self::stale_for): each judges where the
        /// stale window ends by its own. The value's life in the store is TTL + stale window +
        /// fail-safe duration.
        ///
        /// ```
        /// use stampede_guard::{Cache, CallOptions, Computed, Source};
        /// use std::time::Duration;
        ///
        /// # #[tokio::main(flavor = "current_thread")]
        /// # async fn main() -> Result<(), stampede_guard::Error> {
        /// tokio::time::pause();
        /// let cache = Cache::in_memory()
        ///     .with_options(CallOptions::default().fail_safe_for(Duration::from_secs(3600)));
        /// let ttl = Duration::from_secs(60);
        /// cache.get_or_compute("2019-05", ttl, || async { Ok::<_, String>(1234u64) }).await?;
        /// tokio::time::advance(Duration::from_secs(120)).await; // expired; the database is down
        /// let report = cache
        ///     .fetch("2019-05", ttl, |_| async { Err::<Computed<u64>, _>("database down") })
        ///     .await?;
        /// assert_eq!((report.value, report.source), (1234, Source::FailSafe));
        /// # Ok(())
        /// # }
        /// ```
        fail_safe_for: Duration = saturate(fail_safe_for);

        /// After a failed or timed-out computation of a key with a fallback, how long every caller
        /// (in every process) is answered with the fallback before the source is called again
        /// (default 5 s): a source that is down is called at most once per throttle per key. Values
        /// under 1 ms are raised to 1 ms.
        fail_safe_throttle: Duration = saturate(fail_safe_throttle).max(Duration::from_millis(1));

        /// The latency budget of a call that has a fallback at hand (default none): once the call
        /// has run this long, computing or waiting for another caller's computation, it returns the
        /// fail-safe fallback ([`Source::FailSafe`](crate::Source::FailSafe)). A computation goes
        /// on in the background under its lock and heartbeat, and its value lands as usual (unless
        /// the hard timeout, [`max_hold`](Self::max_hold), cuts it). Without a fallback (fail-safe
        /// off, or no kept value) it does nothing.
        ///
        /// ```
        /// use stampede_guard::CallOptions;
        /// use std::time::Duration;
        ///
        /// let budget = CallOptions::default()
        ///     .fail_safe_for(Duration::from_secs(3600))
        ///     .soft_timeout(Some(Duration::from_millis(100)))
        ///     .max_hold(Some(Duration::from_secs(30)));
        /// # let _ = budget;
        /// ```
        soft_timeout: Option<Duration> = soft_timeout.map(saturate);
    }

    crate::options::setters! {
        /// Tags every value written through the handle carries (computed, or `set`), besides those
        /// of its [`Computed::tags`](crate::Computed::tags):
        /// [`Cache::invalidate_tag`](crate::Cache::invalidate_tag) of any of them invalidates the
        /// value. They replace the tags given before.
        ///
        /// Reads through the handle read these tags' epochs with the value, in the same round trip;
        /// a value's other tags too, once this instance has seen them (otherwise they cost one more
        /// round trip, once). At most [`MAX_TAGS`](crate::MAX_TAGS) per value; an empty tag, or one
        /// over [`MAX_KEY_BYTES`](crate::MAX_KEY_BYTES), makes every call of the handle fail with
        /// [`Error::InvalidKey`](crate::Error::InvalidKey). See `docs/tags.md`.
        ///
        /// ```
        /// use stampede_guard::{Cache, CallOptions};
        /// use std::time::Duration;
        ///
        /// # #[tokio::main(flavor = "current_thread")]
        /// # async fn main() -> Result<(), stampede_guard::Error> {
        /// let cache = Cache::in_memory();
        /// let tenant = cache.with_options(CallOptions::default().tags(["tenant:42"]));
        /// let _ = tenant.set("2019-05", &7u32, Duration::from_secs(60)).await?;
        /// let _ = cache.invalidate_tag("tenant:42").await?;
        /// assert_eq!(tenant.get::<u32>("2019-05").await?, None);
        /// # Ok(())
        /// # }
        /// ```
        tags: [impl Into<String>];
    }

    crate::options::setters! {
        /// Whether reads through the handle skip the near tier (default off): for a read that
        /// must see the latest write, wherever it was made.
        ///
        /// A near tier ([`CacheBuilder::near_cache`](crate::CacheBuilder::near_cache)) drops its
        /// copy of a key when the change reaches it from Redis: at once for a change made by
        /// this instance, about when it returns for a change made by another instance (the
        /// cross-instance window: on loopback p99 20 µs after an `invalidate`, the longest 4.2 ms
        /// over 1,000; `docs/after-commit.md`), within
        /// [`max_staleness`](crate::NearCacheOptions::max_staleness) whatever fails. A read
        /// through a handle with this option goes to Redis even when the tier holds a copy, so
        /// it sees another instance's `set` or `invalidate` as soon as that call has returned.
        /// Every read honours it: the `get_or_compute` family and [`fetch`](crate::Cache::fetch),
        /// [`get`](crate::Cache::get), the batches. What it reads still goes into the tier, for
        /// the other reads.
        ///
        /// While Redis is down it serves no copy held by the tier
        /// ([`serve_while_down`](crate::NearCacheOptions::serve_while_down)): a copy may be
        /// older than the write the read must see, so the call fails or falls back as on a
        /// cache without a near tier. Without a near tier (the embedded store, or Redis alone)
        /// it changes nothing a caller sees.
        ///
        /// ```
        /// use stampede_guard::{Cache, CallOptions};
        /// use std::time::Duration;
        ///
        /// # #[tokio::main(flavor = "current_thread")]
        /// # async fn main() -> Result<(), stampede_guard::Error> {
        /// let cache = Cache::in_memory(); // with Redis: `Cache::builder()...near_cache(..)`
        /// // The handle for the reads that follow a write: the same options, past the near tier.
        /// let latest = cache.with_options(cache.options().clone().skip_near_cache(true));
        /// let _ = cache.set("2019-05", &7u32, Duration::from_secs(60)).await?;
        /// assert_eq!(latest.get::<u32>("2019-05").await?, Some(7));
        /// assert!(latest.options().get_skip_near_cache());
        /// # Ok(())
        /// # }
        /// ```
        skip_near_cache: bool;

        /// How the span of a call (`stampede_guard::fetch`, see `docs/observability.md`) shows
        /// its key, which may carry user data: [`SpanKeys::Hashed`] by default.
        ///
        /// ```
        /// use stampede_guard::{CallOptions, SpanKeys};
        ///
        /// let options = CallOptions::default().span_keys(SpanKeys::Redacted);
        /// assert_eq!(options.get_span_keys(), SpanKeys::Redacted);
        /// ```
        span_keys: SpanKeys;

        /// Whether a hit of this process's tiers (the near tier, or the embedded store's
        /// decoded values) opens a span, as every other call does (default off: such a hit
        /// costs far less than a span, and is counted either way).
        ///
        /// ```
        /// use stampede_guard::CallOptions;
        ///
        /// let options = CallOptions::default().trace_near_hits(true);
        /// assert!(options.get_trace_near_hits());
        /// ```
        trace_near_hits: bool;
    }

    /// How spans show keys ([`span_keys`](Self::span_keys)).
    pub fn get_span_keys(&self) -> SpanKeys {
        self.span_keys
    }

    /// Whether near hits open a span ([`trace_near_hits`](Self::trace_near_hits)).
    pub fn get_trace_near_hits(&self) -> bool {
        self.trace_near_hits
    }

    /// The tags in force.
    pub fn get_tags(&self) -> &[String] {
        &self.tags
    }

    /// Whether the fail-safe is on.
    pub(crate) fn fail_safe(&self) -> bool {
        !self.fail_safe_for.is_zero()
    }

    /// How long a value fresh for `ttl` is kept in the store: its TTL, its stale window and its
    /// fail-safe window.
    pub(crate) fn stored_for(&self, ttl: Duration) -> Duration {
        add(add(ttl, self.stale_for), self.fail_safe_for)
    }

    /// Whether reads skip the near tier ([`skip_near_cache`](Self::skip_near_cache)).
    pub fn get_skip_near_cache(&self) -> bool {
        self.skip_near_cache
    }

    /// The lease in force.
    pub fn get_lease(&self) -> Duration {
        self.lease
    }

    /// The wait bound in force.
    pub fn get_wait_timeout(&self) -> Duration {
        self.wait_timeout
    }

    /// The backoff schedule in force.
    pub fn get_backoff(&self) -> Backoff {
        self.backoff
    }
}

/// How a call's span shows its key ([`CallOptions::span_keys`]): keys can carry user data (an
/// e-mail, an account number), and a tracing backend is read by more people than the cache.
///
/// ```
/// use stampede_guard::SpanKeys;
/// assert_eq!(SpanKeys::default(), SpanKeys::Hashed);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SpanKeys {
    /// The first 16 hex digits of the key's UUID v5, as
    /// [`Inspection::hash_of`](crate::Inspection::hash_of) gives it: the same on every instance, so the calls of one key can be found together, and
    /// matched with a key one suspects. A key that can be guessed (a small number, a known
    /// e-mail) can be confirmed by hashing the guess: choose [`Redacted`](Self::Redacted) then.
    #[default]
    Hashed,
    /// No key at all.
    Redacted,
    /// The key as given.
    Clear,
}

/// What a call does when the backend (Redis) fails.
///
/// | call | [`Fail`](Self::Fail) (default) | [`ComputeUncached`](Self::ComputeUncached) |
/// |---|---|---|
/// | [`get_or_compute`](crate::Cache::get_or_compute), [`fetch`](crate::Cache::fetch) | [`Error::Backend`](crate::Error::Backend) | the computation runs without the cache and its value is returned ([`Source::Uncached`](crate::Source::Uncached)), not stored; callers in one process still share one computation per key |
/// | [`get`](crate::Cache::get) | [`Error::Backend`](crate::Error::Backend) | `Ok(None)`: a miss |
/// | [`set`](crate::Cache::set) | [`Error::Backend`](crate::Error::Backend) | `Ok(())`: the write is skipped, as if the value had been evicted at once |
/// | [`invalidate`](crate::Cache::invalidate) | [`Error::Backend`](crate::Error::Backend) | [`Error::Backend`](crate::Error::Backend) too: a lost invalidation would serve the old value again once Redis is back, so the caller must know |
/// | [`Lock`](crate::Lock) (and [`Cache::lock`](crate::Cache::lock), [`Redlock`](crate::Redlock), [`leader::Leader`](crate::leader::Leader)) | the error | the error too: a lock must never be taken for held when it is not |
///
/// Every backend failure of `get`, `set` and `invalidate` is logged at `warn` when it is
/// answered by the fallback, and counted in [`Stats::backend_errors`](crate::Stats::backend_errors)
/// either way; a computation run without the cache is counted in
/// [`Stats::uncached`](crate::Stats::uncached). The connection reconnects by itself, and calls
/// use the cache again as soon as it answers.
///
/// ```
/// use stampede_guard::{CallOptions, OnBackendError};
/// let options = CallOptions::default().on_backend_error(OnBackendError::ComputeUncached);
/// # let _ = options;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnBackendError {
    /// Return [`Error::Backend`](crate::Error::Backend), naming the failed operation.
    #[default]
    Fail,
    /// Run the computation without the cache and return its value. Callers in one process still
    /// share one computation per key; across processes there is no coordination while Redis is
    /// down, so every process may compute once.
    ComputeUncached,
}

/// Jittered, capped exponential backoff: the n-th delay is drawn uniformly from
/// `[d/2, d]` where `d = min(initial * 2^n, max)`.
///
/// Waiters are normally woken by a notification the moment the value lands; the backoff only
/// bounds how long a missed notification (a dropped connection, a holder that died) can delay
/// them. The wait never sleeps past the lock's remaining lease.
///
/// ```
/// use stampede_guard::Backoff;
/// use std::time::Duration;
///
/// let backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(200));
/// assert_eq!(backoff.max(), Duration::from_millis(200));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(Duration::from_millis(10), Duration::from_millis(500))
    }
}

impl Backoff {
    /// A schedule starting at `initial` and doubling up to `max` (`max` is raised to `initial`
    /// if smaller; `initial` is at least 1 ms).
    pub fn new(initial: Duration, max: Duration) -> Self {
        let initial = saturate(initial).max(Duration::from_millis(1));
        Backoff {
            initial,
            max: saturate(max).max(initial),
        }
    }

    /// The first delay's upper bound.
    pub fn initial(&self) -> Duration {
        self.initial
    }

    /// The cap.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The upper bound of the `attempt`-th delay (0-based).
    pub(crate) fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// The `attempt`-th delay, jittered.
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        let floor = ceiling / 2;
        let span = (ceiling - floor).as_micros() as u64;
        floor + Duration::from_micros(crate::random::up_to(span))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_stay_in_the_jitter_band() {
        let b = Backoff::new(Duration::from_millis(10), Duration::from_millis(100));
        let ceilings: Vec<u128> = (0..6).map(|n| b.ceiling(n).as_millis()).collect();
        assert_eq!(ceilings, [10, 20, 40, 80, 100, 100]);
        for n in 0..50 {
            let d = b.delay(n);
            assert!(d >= b.ceiling(n) / 2 && d <= b.ceiling(n), "{d:?}");
        }
        assert_eq!(b.ceiling(u32::MAX), Duration::from_millis(100));
    }
}
