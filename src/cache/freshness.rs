//! How fresh a stored value is, what a call reports about where its value came from, and the
//! value a computation hands back (with its own TTL if it chooses one).
//!
//! Explained in the guide: `docs/freshness.md`.

use std::time::Duration;

/// What a stored entry is worth to this call, by the store's clock: the one answer every path
/// (the single-key path, the batch, `get`, the fail-safe) takes from a stored entry.
///
/// It is asked twice of a value: when it is read ([`worth`]: is it served at all, or is it
/// replaced under the lock), and when it is served ([`judge`]: with XFetch's draw, is it
/// refreshed in the background).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Worth {
    /// Fresh: serve it.
    Fresh,
    /// Fresh, but XFetch chose to refresh it early: serve it, and refresh it in the background.
    RefreshEarly,
    /// Past its freshness, inside the reader's stale window: serve it and refresh it in the
    /// background.
    Stale,
    /// A fail-safe copy inside its throttle, read with the fail-safe on: serve it as the
    /// fallback, and do not call the source.
    Kept,
    /// Past the stale window (in the fail-safe window, if the writer kept it), a throttled copy
    /// past its throttle, or a throttled copy read without the fail-safe: compute, as after an
    /// expiry; the value is only a fallback.
    Dead,
}

impl Worth {
    /// Whether a read serves the entry (live, stale, or kept by the fail-safe) rather than
    /// computing over it.
    pub(crate) fn served(self) -> bool {
        self != Worth::Dead
    }

    /// Whether it is a value a plain read answers with: fresh or stale, not a fallback.
    pub(crate) fn live(self) -> bool {
        matches!(self, Worth::Fresh | Worth::RefreshEarly | Worth::Stale)
    }
}

/// What a value fresh until `fresh_until_ms` is worth at `now_ms` to a reader whose stale
/// window is `stale_ms` long and whose fail-safe is on or off, before XFetch is drawn.
/// `throttled` marks a fail-safe copy, whose `fresh_until_ms` is the end of its throttle and
/// which has no stale window.
pub(crate) fn worth(
    now_ms: u64,
    fresh_until_ms: u64,
    throttled: bool,
    stale_ms: u64,
    fail_safe: bool,
) -> Worth {
    if throttled {
        return if fail_safe && now_ms < fresh_until_ms {
            Worth::Kept
        } else {
            Worth::Dead
        };
    }
    if now_ms < fresh_until_ms {
        Worth::Fresh
    } else if now_ms < fresh_until_ms.saturating_add(stale_ms) {
        Worth::Stale
    } else {
        Worth::Dead
    }
}

/// What a value served now is worth (fresh, refreshed early, or stale: a served value is not
/// judged dead here), fresh until `fresh_until_ms` and last computed in `compute_ms`. `r` is a
/// uniform draw from (0, 1]; `beta` is XFetch's parameter (0 disables early refresh).
pub(crate) fn judge(now_ms: u64, fresh_until_ms: u64, compute_ms: u32, beta: f64, r: f64) -> Worth {
    if now_ms >= fresh_until_ms {
        return Worth::Stale;
    }
    if beta > 0.0 && refresh_early(now_ms, fresh_until_ms, compute_ms, beta, r) {
        return Worth::RefreshEarly;
    }
    Worth::Fresh
}

/// XFetch: refresh when `now - delta * beta * ln(r) >= fresh_until`. Since `ln(r) <= 0`, the
/// probability is `exp(-(fresh_until - now) / (delta * beta))`: it rises to 1 as expiry nears,
/// faster for slower computations.
pub(crate) fn refresh_early(
    now_ms: u64,
    fresh_until_ms: u64,
    compute_ms: u32,
    beta: f64,
    r: f64,
) -> bool {
    let gap = (fresh_until_ms - now_ms.min(fresh_until_ms)) as f64;
    f64::from(compute_ms) * beta * -r.ln() >= gap
}

/// A uniform draw from (0, 1], as XFetch wants (`ln(0)` would be infinite).
pub(crate) fn unit_draw() -> f64 {
    1.0 - crate::random::unit()
}

/// Where a call's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// Read fresh from the cache by this call (from Redis, the embedded store or the near tier).
    Hit,
    /// Read from the cache past its freshness, inside the stale window
    /// ([`CallOptions::stale_for`](crate::CallOptions::stale_for)); a refresh runs in the
    /// background.
    Stale,
    /// Computed by this call.
    Computed,
    /// Computed by another caller while this one waited, or got by another call of this process
    /// that this one joined (the in-process single flight): this call neither read the cache
    /// nor computed, and the value may have been read before it began.
    Waited,
    /// Computed without the cache because the backend was down
    /// ([`OnBackendError::ComputeUncached`](crate::OnBackendError::ComputeUncached)).
    Uncached,
    /// The fail-safe fallback ([`CallOptions::fail_safe_for`](crate::CallOptions::fail_safe_for)):
    /// the last good value, kept past its stale window, served because the computation failed,
    /// hit its hard timeout, ran past the call's soft timeout (it goes on in the background), or
    /// failed within the last [throttle](crate::CallOptions::fail_safe_throttle).
    ///
    /// | the stored value is | a call gets |
    /// |---|---|
    /// | fresh (within its TTL) | the value, [`Hit`](Self::Hit) |
    /// | in its stale window ([`stale_for`](crate::CallOptions::stale_for)) | the value, [`Stale`](Self::Stale); one refresh in the background |
    /// | in its fail-safe window, the computation succeeds in time | the new value, [`Computed`](Self::Computed) or [`Waited`](Self::Waited) |
    /// | in its fail-safe window, the computation fails, hits the hard timeout or passes the soft timeout | the kept value, `FailSafe` |
    /// | a throttled copy (a computation failed less than a throttle ago) | the kept value, `FailSafe`, without computing |
    /// | gone (never written, invalidated, or past the fail-safe window), the computation fails | the error |
    FailSafe,
    /// A copy this process held, served because the backend was unreachable: a near copy
    /// ([`NearCacheOptions::serve_while_down`](crate::NearCacheOptions::serve_while_down)),
    /// which may miss changes made up to that bound plus `max_staleness` before the call; or,
    /// for a key whose write waits in the [auto-recovery](crate::CacheBuilder::auto_recovery)
    /// queue, the value this process computed without the cache after that write, held until
    /// the write is replayed. Nothing was computed by this call.
    Held,
}

/// A value and where it came from: what [`Cache::fetch`](crate::Cache::fetch) returns.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Fetched<T> {
    /// The value.
    pub value: T,
    /// Where it came from.
    pub source: Source,
    /// Whether the cache holds this value now: false for a value computed without the cache,
    /// or computed under the lock but not written (the fence lost, the write refused or
    /// failed). The response-caching layer gives no `ETag` to a response it did not store.
    pub(crate) stored: bool,
    /// Who found it, for the count of how the call was answered (`stats.rs`, `Answer`).
    pub(crate) via: Via,
    /// The computation the value came from, as far as this call knows (for the span link of a
    /// waiter: `cache/trace.rs`); nothing without the `opentelemetry` feature.
    pub(crate) origin: crate::cache::origin::Origin,
}

/// Who found a [`Fetched`] value for the call, beside its [`Source`]: what tells a near hit from
/// a Redis hit, and a call that joined this process's flight from one that waited on the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Via {
    /// The call itself: its read, its wait on the lock, its computation or fallback.
    #[default]
    Itself,
    /// A copy in this instance's near tier.
    Near,
    /// Another call of this process that it joined (the in-process single flight).
    Flight,
}

impl<T> Fetched<T> {
    /// `value` from `source`: held by the cache unless it was computed without it.
    pub(crate) fn new(value: T, source: Source) -> Self {
        let stored = source != Source::Uncached;
        Fetched {
            value,
            source,
            stored,
            via: Via::Itself,
            origin: Default::default(),
        }
    }

    /// The same value, found as `via` says.
    pub(crate) fn via(self, via: Via) -> Self {
        Fetched { via, ..self }
    }

    /// The same fetch with its value turned into another, the source kept: `fetched.map(Json)`
    /// for a handler's response (with the `axum` feature, a `Fetched` response carries its
    /// source as an `x-cache` header).
    ///
    /// ```
    /// use stampede_guard::{Cache, Computed, Source};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let fetched = Cache::in_memory()
    ///     .fetch("2019-05", Duration::from_secs(60), |_| async {
    ///         Ok::<_, std::io::Error>(Computed::new(7u32))
    ///     })
    ///     .await?
    ///     .map(|orders| format!("{orders} orders"));
    /// assert_eq!((fetched.value.as_str(), fetched.source), ("7 orders", Source::Computed));
    /// # Ok(())
    /// # }
    /// ```
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Fetched<U> {
        Fetched {
            value: f(self.value),
            source: self.source,
            stored: self.stored,
            via: self.via,
            origin: self.origin,
        }
    }
}

/// What a computation passed to [`Cache::fetch`](crate::Cache::fetch) returns: the value, and
/// optionally its own TTL (the current month's report expires sooner than 2019's).
///
/// ```
/// use stampede_guard::Computed;
/// use std::time::Duration;
///
/// let this_month = Computed::new(vec![1u32, 2]).ttl(Duration::from_secs(60));
/// let old_month = Computed::new(vec![3u32]); // keeps the TTL given to the call
/// # let _ = (this_month, old_month);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct Computed<T> {
    pub(crate) value: T,
    pub(crate) ttl: Option<Duration>,
    pub(crate) tags: Vec<String>,
}

impl<T> Computed<T> {
    /// A value that keeps the call's TTL.
    pub fn new(value: T) -> Self {
        Computed {
            value,
            ttl: None,
            tags: Vec::new(),
        }
    }

    /// Tags this value carries besides the handle's [`CallOptions::tags`](crate::CallOptions::tags):
    /// for example what the computation read (a tenant, a year), so that
    /// [`Cache::invalidate_tag`](crate::Cache::invalidate_tag) of any of them invalidates it.
    /// At most [`MAX_TAGS`](crate::MAX_TAGS) in all ([`Error::TooManyTags`](crate::Error::TooManyTags));
    /// an empty or over-long tag is [`Error::InvalidKey`](crate::Error::InvalidKey). Either
    /// way the value is returned to no one and not written: the call fails.
    ///
    /// ```
    /// use stampede_guard::{Cache, Computed};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = Cache::in_memory();
    /// let ttl = Duration::from_secs(60);
    /// let report = cache
    ///     .fetch("dashboard:7", ttl, |_lease| async {
    ///         Ok::<_, std::io::Error>(Computed::new(42u32).tags(["tenant:7", "year:2019"]))
    ///     })
    ///     .await?;
    /// assert_eq!(report.value, 42);
    /// let _ = cache.invalidate_tag("year:2019").await?;
    /// assert_eq!(cache.get::<u32>("dashboard:7").await?, None);
    /// # Ok(())
    /// # }
    /// ```
    pub fn tags<I, S>(mut self, tags: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.tags = tags.into_iter().map(Into::into).collect();
        self
    }

    /// Cache this value for `ttl` instead of the call's TTL. Any duration is taken: one of
    /// [`FOREVER`](crate::FOREVER) or more (`Duration::MAX`) means no expiry.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(crate::time::saturate(ttl));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};

    #[test]
    fn the_stale_window_ends_where_the_fail_safe_window_begins() {
        assert_eq!(worth(99, 100, false, 0, true), Worth::Fresh);
        assert_eq!(worth(100, 100, false, 0, true), Worth::Dead);
        assert_eq!(worth(149, 100, false, 50, false), Worth::Stale);
        assert_eq!(worth(150, 100, false, 50, true), Worth::Dead);
        assert_eq!(worth(100, 100, false, u64::MAX, false), Worth::Stale);
        // A throttled copy is a fallback only, and only to a reader with the fail-safe on.
        assert_eq!(worth(99, 100, true, 50, true), Worth::Kept);
        assert_eq!(worth(99, 100, true, 50, false), Worth::Dead);
        assert_eq!(worth(100, 100, true, 50, true), Worth::Dead);
        // Served, or computed over; and what a plain read answers with.
        assert!(Worth::Kept.served() && !Worth::Kept.live());
        assert!(Worth::Stale.served() && Worth::Stale.live());
        assert!(!Worth::Dead.served() && !Worth::Dead.live());
    }

    #[test]
    fn past_fresh_until_is_stale_and_xfetch_off_means_fresh() {
        assert_eq!(judge(100, 100, 50, 1.0, 0.5), Worth::Stale);
        assert_eq!(judge(99, 100, 50, 0.0, 1e-300), Worth::Fresh);
    }

    /// With a fixed seed the counts are exact; the bounds are those of the binomial law around
    /// `n * exp(-gap / (delta * beta))` (six standard deviations), so they also hold for any seed.
    #[test]
    fn xfetch_refreshes_more_often_as_expiry_nears() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2015);
        let (n, delta, beta, fresh_until) = (10_000u32, 200u32, 1.0, 1_000_000u64);
        let mut last = 0;
        for gap in [2_000u64, 1_000, 400, 200, 50, 10] {
            let now = fresh_until - gap;
            let refreshed = (0..n)
                .filter(|_| {
                    let r = 1.0 - rng.random::<f64>();
                    judge(now, fresh_until, delta, beta, r) == Worth::RefreshEarly
                })
                .count() as f64;
            let p = (-(gap as f64) / (f64::from(delta) * beta)).exp();
            let (mean, sd) = (f64::from(n) * p, (f64::from(n) * p * (1.0 - p)).sqrt());
            assert!(
                (refreshed - mean).abs() <= 6.0 * sd + 1.0,
                "gap {gap} ms: {refreshed} refreshes, expected about {mean:.0}"
            );
            assert!(
                refreshed as u32 >= last,
                "the probability rises as expiry nears"
            );
            last = refreshed as u32;
        }
        assert!(
            last > n * 9 / 10,
            "10 ms before expiry nearly every read refreshes"
        );
    }
}
