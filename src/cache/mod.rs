//! The user's handle: [`Cache`], every public call with its documentation, each handing the
//! work to the engine in a few lines. The handle holds an `Engine` and nothing else.
//!
//! The machinery, one job per file:
//! - `engine.rs`: the engine (`Engine`: the shared `Core` and a handle's options and tags);
//! - `fetch.rs`: the single-key path as a per-call object (`KeyCall`) and a hit's steps in the
//!   order they run (quick hits, the read with its epochs, the entry judged, the tiers fed,
//!   served); `miss.rs`: a miss (the in-process flight, the distributed part); `compute.rs`
//!   computes under the lock (`Computation`), `uncached.rs` computes without the cache when the
//!   backend fails;
//! - `claim.rs`: the wait-or-lock loop (`WaitOrLock`); `failsafe.rs`: the fail-safe's steps;
//!   `fallback.rs`: what a call does on each failure; `freshness.rs`: how fresh a stored value is;
//! - `refresh.rs`: background refreshes, `refreshes.rs`: those running in this process;
//! - `tiers.rs`: the near tier (`near.rs`) and the embedded store's decoded values, as one type;
//! - `tags.rs`: the rule of tags and clear and its data; `epochs.rs`: epoch names, births and raises;
//! - `entry.rs`: the stored entry; `encoding.rs`: values and failures encoded for the store;
//! - `plain.rs`: `get`, `set` and the invalidations; `batch/`: many keys in one call;
//! - `recovery.rs` (and `recovery/gate.rs`): writes queued while the backend is unreachable;
//! - `health.rs`: the health report; `inspect.rs`: what the cache holds for a key (`inspect`);
//!   `builder.rs` builds the handle; `bounds.rs` names the bounds.
//!
//! Explained in the guide: `docs/how-it-works.md` (the protocol), `docs/guarantees.md` (what each
//! call promises) and `docs/batch.md` (many keys at once).

pub(crate) mod batch;
pub(crate) mod bounds;
pub(crate) mod builder;
pub(crate) mod claim;
pub(crate) mod compute;
pub(crate) mod encoding;
pub(crate) mod engine;
pub(crate) mod entry;
pub(crate) mod epochs;
pub(crate) mod failsafe;
pub(crate) mod fallback;
pub(crate) mod fetch;
pub(crate) mod freshness;
pub(crate) mod health;
pub(crate) mod inspect;
mod miss;
pub(crate) mod near;
pub(crate) mod origin;
mod plain;
pub(crate) mod recovery;
mod refresh;
pub(crate) mod refreshes;
pub(crate) mod tags;
mod tiers;
pub(crate) mod trace;
mod uncached;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::{de::DeserializeOwned, Serialize};
use tracing::Instrument;

use crate::cache::bounds::{CacheValue, ComputeFailure};
use crate::cache::engine::{Engine, Parts};
use crate::cache::tiers::Tiers;
use crate::lock::Lock;
use crate::options::DEFAULT_NAMESPACE;
use crate::store::MemoryStore;
use crate::time::saturate;
use crate::wire::codec::{Bincode, Codec};
use crate::{CacheBuilder, CallOptions, Computed, Error, Fetched, Lease, Source, Stats, Written};

/// A cache that computes each missing value once, however many tasks, processes and machines ask
/// for it at the same time.
///
/// `Cache` is a cheap handle (an `Arc` inside): clone it into every task. Values are any
/// `T: Serialize + DeserializeOwned + Clone` ([`CacheValue`](crate::CacheValue)), encoded by the
/// codec `C` ([`Bincode`] by default).
///
/// Two backends:
/// - [`Cache::in_memory`]: the embedded store, for one process. No server, same semantics.
/// - Redis, via [`Cache::builder`] and [`CacheBuilder::redis_url`]: shared by every process and
///   machine that uses the same server and namespace.
///
/// ```
/// use stampede_guard::Cache;
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), stampede_guard::Error> {
/// let cache = Cache::in_memory();
/// let total: u64 = cache
///     .get_or_compute("2019-05", Duration::from_secs(300), || async {
///         // The slow query runs once, however many callers ask at the same time.
///         Ok::<_, std::io::Error>(1234)
///     })
///     .await?;
/// assert_eq!(total, 1234);
/// # Ok(())
/// # }
/// ```
///
/// # Changing a cached type
///
/// A value written for another shape of `T` (fields renamed, reordered, added, removed or
/// retyped by another deploy) is a miss: logged, recomputed and overwritten, never decoded as
/// garbage. What is and is not detected is listed under [`Codec`'s type changes](Codec#type-changes).
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use std::time::Duration;
///
/// #[derive(Serialize, Deserialize)]
/// struct Report { orders: u32, revenue_cents: u64 }
///
/// mod next_deploy {
///     #[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
///     pub struct Report { pub revenue_cents: u64, pub orders: u32 }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), stampede_guard::Error> {
/// let cache = stampede_guard::Cache::in_memory();
/// let ttl = Duration::from_secs(300);
/// let _ = cache.set("2019-05", &Report { orders: 5, revenue_cents: 1000 }, ttl).await?;
/// // The reordered type does not read the old value (it would be `{ revenue_cents: 5, orders: 1000 }`)...
/// assert_eq!(cache.get::<next_deploy::Report>("2019-05").await?, None);
/// // ...but computes its own, which replaces it.
/// let report = cache
///     .get_or_compute("2019-05", ttl, || async {
///         Ok::<_, std::io::Error>(next_deploy::Report { revenue_cents: 1000, orders: 5 })
///     })
///     .await?;
/// assert_eq!(report.orders, 5);
/// # Ok(())
/// # }
/// ```
pub struct Cache<C = Bincode> {
    pub(crate) engine: Engine<C>,
}

impl<C> Clone for Cache<C> {
    fn clone(&self) -> Self {
        Cache {
            engine: self.engine.clone(),
        }
    }
}

impl<C> std::fmt::Debug for Cache<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("namespace", &self.engine.core.namespace)
            .field("options", &self.engine.options)
            .finish_non_exhaustive()
    }
}

impl Cache {
    /// A cache on the embedded in-memory store, with default options, namespace and
    /// [`MemoryLimits`](crate::MemoryLimits) (other limits:
    /// [`CacheBuilder::in_memory_with`]).
    ///
    /// The memory store is a real store for one process: TTLs, leases, fencing and wake-ups
    /// behave as on Redis, but nothing is shared with other processes. It keeps at most the
    /// limits' values and bytes, evicting values read once before values read again.
    ///
    /// ```
    /// let cache = stampede_guard::Cache::in_memory();
    /// assert_eq!(cache.namespace(), "stampede");
    /// ```
    pub fn in_memory() -> Self {
        let memory = Arc::new(MemoryStore::default());
        Cache::from_engine(Engine::new(Parts {
            store: memory.clone(),
            codec: Bincode,
            namespace: DEFAULT_NAMESPACE.to_owned(),
            options: CallOptions::default(),
            tiers: Tiers::new(None, Some(memory)),
            breaker: None,
            counters: Arc::default(),
            recovery: None,
            capabilities: None,
        }))
    }

    /// A builder, to choose the backend, namespace, options and codec.
    ///
    /// ```no_run
    /// use stampede_guard::Cache;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = Cache::builder()
    ///     .redis_url("redis://127.0.0.1:6379/0")
    ///     .namespace("reports")
    ///     .build()
    ///     .await?;
    /// # let _ = cache;
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder() -> CacheBuilder {
        CacheBuilder::new(DEFAULT_NAMESPACE)
    }
}

impl<C: Codec> Cache<C> {
    pub(crate) fn from_engine(engine: Engine<C>) -> Self {
        Cache { engine }
    }

    /// A handle on the same cache whose calls use `options`.
    ///
    /// ```
    /// use stampede_guard::{Cache, CallOptions};
    /// use std::time::Duration;
    ///
    /// let cache = Cache::in_memory();
    /// let patient = cache.with_options(CallOptions::default().wait_timeout(Duration::from_secs(120)));
    /// assert_eq!(patient.options().get_wait_timeout(), Duration::from_secs(120));
    /// ```
    #[must_use]
    pub fn with_options(&self, options: CallOptions) -> Self {
        Cache::from_engine(self.engine.with_options(options))
    }

    /// The options this handle's calls use.
    ///
    /// ```
    /// let cache = stampede_guard::Cache::in_memory();
    /// assert_eq!(cache.options(), &stampede_guard::CallOptions::default());
    /// ```
    pub fn options(&self) -> &CallOptions {
        &self.engine.options
    }

    /// A handle on the same cache whose calls add `tags` to this handle's own
    /// ([`CallOptions::tags`]): what a handler writes for a tenant carries the tenant's tag in
    /// one call, without spelling out the options. Reads through it check these tags' epochs
    /// with the value, in the same round trip, as for any handle's tags.
    ///
    /// Cheap (no request; the tags' key names are built once, here), so one per request is
    /// fine. An empty tag, one over [`MAX_KEY_BYTES`](crate::MAX_KEY_BYTES), or more than
    /// [`MAX_TAGS`](crate::MAX_TAGS) in all make every call of the new handle fail with
    /// [`Error::InvalidKey`] or [`Error::TooManyTags`], as [`CallOptions::tags`] does.
    ///
    /// ```
    /// use stampede_guard::Cache;
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = Cache::in_memory();
    /// let tenant = 42;
    /// let ttl = Duration::from_secs(300);
    /// let summary = cache
    ///     .tagged([format!("tenant:{tenant}")])
    ///     .get_or_compute("summary:42", ttl, || async { Ok::<_, std::io::Error>(7u32) })
    ///     .await?;
    /// assert_eq!(summary, 7);
    /// // The tenant's data changed: every value written for it goes, on every instance.
    /// let _ = cache.invalidate_tag("tenant:42").await?;
    /// assert_eq!(cache.get::<u32>("summary:42").await?, None);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn tagged<I, S>(&self, tags: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let options = self.engine.options.clone();
        let all: Vec<String> = options
            .get_tags()
            .iter()
            .cloned()
            .chain(tags.into_iter().map(Into::into))
            .collect();
        self.with_options(options.tags(all))
    }

    /// The namespace that prefixes every key of this cache.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let cache = stampede_guard::Cache::builder().namespace("reports").build().await.unwrap();
    /// assert_eq!(cache.namespace(), "reports");
    /// # }
    /// ```
    pub fn namespace(&self) -> &str {
        &self.engine.core.namespace
    }

    /// The health of the cache's backend, for a readiness probe or a status page: whether it
    /// answers a `PING` now (waiting at most a second; not asked while the circuit breaker is
    /// open), the breaker's state, how long the backend has been failing, whether the near
    /// tier's feed is proven, and how many writes wait in the auto-recovery queue. See
    /// [`Health`](crate::Health).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let cache = stampede_guard::Cache::in_memory();
    /// let health = cache.health().await;
    /// assert!(health.is_ready());
    /// assert_eq!(health.near_feed_proven, None); // no near tier
    /// # }
    /// ```
    pub async fn health(&self) -> crate::Health {
        self.engine.health_report().await
    }

    /// What the Redis server behind this cache allows, and which fallbacks the cache chose
    /// (see [`Capabilities`](crate::Capabilities)), as probed at `build()` or, for a cache
    /// built while Redis was down, at its first answer; probed again after a call finds the
    /// connection lost (a failover may land on another server). `None` for the embedded
    /// store, for a Redis Cluster (not probed: it keeps the scripts) and until the first probe
    /// answered. Also in [`Health::capabilities`](crate::Health::capabilities).
    ///
    /// ```
    /// let cache = stampede_guard::Cache::in_memory();
    /// assert!(cache.capabilities().is_none()); // the embedded store needs none
    /// ```
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = stampede_guard::Cache::builder()
    ///     .redis_url("redis://127.0.0.1:6379/0")
    ///     .build()
    ///     .await?;
    /// if let Some(caps) = cache.capabilities() {
    ///     tracing::info!(%caps, fallbacks = ?caps.fallbacks(), "server");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn capabilities(&self) -> Option<crate::Capabilities> {
        self.engine.core.capabilities.as_ref()?.get()
    }

    /// What the cache holds for `key`, for on-call, without computing, refreshing, waiting or
    /// changing anything: the stored value's age, what is left of its TTL, stale and fail-safe
    /// windows (by this handle's options), its tags and whether a tag or a clear has
    /// invalidated it since; the lock's holder (its fencing token and lease left) if the key
    /// is being computed; the fencing counter; and whether this instance's near tier holds a
    /// copy, since when. See [`Inspection`](crate::Inspection); served as JSON (the key
    /// redacted unless asked) by [`web::inspector`](crate::web::inspector) with feature `axum`.
    ///
    /// One round trip on Redis (the value with its epochs and the lock, sent at once), plus one
    /// for the epochs of tags this instance has not seen before. Nothing is counted in
    /// [`stats`](Self::stats), and the value is never decoded: any key of the namespace can be
    /// inspected, whatever its type.
    ///
    /// ```
    /// use stampede_guard::Standing;
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = stampede_guard::Cache::in_memory();
    /// assert_eq!(cache.inspect("2019-05").await?.value, None);
    /// let tenant = cache.tagged(["tenant:42"]);
    /// let _ = tenant.set("2019-05", &1234u64, Duration::from_secs(60)).await?;
    /// let _ = cache.invalidate_tag("tenant:42").await?;
    /// let value = cache.inspect("2019-05").await?.value.expect("still stored");
    /// assert!(value.invalidated);
    /// assert_eq!(value.state, Standing::Invalidated);
    /// assert_eq!(value.tags, ["tenant:42"]);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for an empty or over-long key; [`Error::Backend`] (or
    /// [`Error::NoQuorum`]) when the backend fails, whatever the handle's
    /// [`OnBackendError`](crate::OnBackendError): an inspection has no fallback.
    pub async fn inspect(&self, key: &str) -> Result<crate::Inspection, Error> {
        self.engine.inspect(key).await
    }

    /// How many keys this process is computing or waiting for right now, through this cache.
    /// Zero whenever no call is running: a cancelled or panicking call leaves nothing behind.
    ///
    /// ```
    /// let cache = stampede_guard::Cache::in_memory();
    /// assert_eq!(cache.in_flight(), 0);
    /// ```
    pub fn in_flight(&self) -> usize {
        self.engine.core.flights.len()
    }

    /// What this cache has done since it was built: hits, misses, computations, waits, stale
    /// values served, fallbacks, time-outs, backend errors, lease renewals and losses. Shared by
    /// every handle of the cache. With the `metrics` feature the same events also go to the
    /// `metrics` facade.
    ///
    /// ```
    /// let cache = stampede_guard::Cache::in_memory();
    /// assert_eq!(cache.stats().hits, 0);
    /// ```
    pub fn stats(&self) -> Stats {
        self.engine.stats()
    }

    /// The distributed lock named `name` in this cache's namespace and backend, with this
    /// handle's options (lease, renewal, wait bound, backoff, maximum hold). It shares the cache's
    /// connections. `cache.lock(k)` is the very lock that `get_or_compute(k, ..)` takes.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = stampede_guard::Cache::in_memory();
    /// let lock = cache.lock("nightly-sync")?;
    /// let guard = lock.acquire().await?;
    /// assert!(lock.try_acquire().await?.is_none(), "held");
    /// guard.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for an empty or over-long name.
    pub fn lock(&self, name: &str) -> Result<Lock, Error> {
        self.engine.lock(name)
    }

    /// Reads a value, fresh or stale, without computing or refreshing anything. Bytes that are not
    /// a value of this cache (corrupt, another codec, another type) are logged and read as `None`,
    /// and so is a remembered failure.
    ///
    /// With a [near tier](CacheBuilder::near_cache), a fresh copy held there answers without a
    /// request, as for [`get_or_compute`](Self::get_or_compute) (counted in
    /// [`Stats::near_hits`](crate::Stats::near_hits)); copies go in when the `get_or_compute`
    /// family reads or computes a value.
    ///
    /// When the backend fails: [`Error::Backend`], or with
    /// [`OnBackendError::ComputeUncached`](crate::OnBackendError::ComputeUncached) a miss (`None`), logged and
    /// counted in [`Stats::backend_errors`](crate::Stats::backend_errors).
    ///
    /// ```
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = stampede_guard::Cache::in_memory();
    /// assert_eq!(cache.get::<String>("greeting").await?, None);
    /// let _ = cache.set("greeting", &"hello".to_string(), Duration::from_secs(60)).await?;
    /// assert_eq!(cache.get::<String>("greeting").await?.as_deref(), Some("hello"));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn get<T: DeserializeOwned + 'static>(&self, key: &str) -> Result<Option<T>, Error> {
        self.engine.get(key).await
    }

    /// Writes a value, fresh for `ttl` (then stale for the handle's
    /// [`stale_for`](CallOptions::stale_for)), replacing any other. A `ttl` of
    /// [`FOREVER`](crate::FOREVER) or more (`Duration::MAX`) means no expiry. A computation of this key that is running
    /// now will not overwrite it: its write is refused by the fencing check.
    ///
    /// Returns [`Written::Applied`] when the backend took it. When the backend fails:
    /// - unreachable or busy, with [auto-recovery](CacheBuilder::auto_recovery) on:
    ///   [`Written::Queued`], replayed when it answers as an invalidation (the queue cannot tell
    ///   its value from a newer one), so the next read computes afresh,
    ///   or [`Error::RecoveryQueueFull`] if the queue is full;
    /// - otherwise [`Error::Backend`], or with
    ///   [`OnBackendError::ComputeUncached`](crate::OnBackendError::ComputeUncached)
    ///   [`Written::Skipped`] (as if the value had been evicted at once), logged and counted in
    ///   [`Stats::backend_errors`](crate::Stats::backend_errors).
    ///
    /// `T` must also be `DeserializeOwned`: the value records the shape of the type it is to be
    /// read as (see [Changing a cached type](Cache#changing-a-cached-type)).
    ///
    /// ```
    /// use stampede_guard::Written;
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = stampede_guard::Cache::in_memory();
    /// let written = cache.set("2019-05", &vec![1u32, 2, 3], Duration::from_secs(60)).await?;
    /// assert_eq!(written, Written::Applied);
    /// assert_eq!(cache.get::<Vec<u32>>("2019-05").await?, Some(vec![1, 2, 3]));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn set<T: Serialize + DeserializeOwned + 'static>(
        &self,
        key: &str,
        value: &T,
        ttl: Duration,
    ) -> Result<Written, Error> {
        self.engine.set(key, value, ttl).await
    }

    /// Deletes a value. A computation of this key that is running now will not write its result
    /// (it started before the invalidation, so its result may be stale); the next call computes
    /// afresh.
    ///
    /// Returns [`Written::Applied`] when the backend took it. When the backend is unreachable or
    /// busy and [auto-recovery](CacheBuilder::auto_recovery) is on, [`Written::Queued`]: replayed
    /// when it answers, and until then this instance does not serve the key from Redis (or
    /// [`Error::RecoveryQueueFull`] if the queue is full). Otherwise a failure is
    /// [`Error::Backend`], whatever the [`OnBackendError`](crate::OnBackendError), since a lost
    /// invalidation would serve the old value again once the backend is back.
    ///
    /// After a database commit, a failed invalidation must not turn the request into a failure
    /// that a client retries (inserting twice): the guide's
    /// [I committed a row and the invalidation failed: what now?](https://github.com/stampede-guard/stampede-guard/blob/main/docs/after-commit.md)
    /// compares the options (this queue, a bounded retry, an outbox).
    ///
    /// ```
    /// use stampede_guard::Written;
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = stampede_guard::Cache::in_memory();
    /// let _ = cache.set("2019-05", &1u8, Duration::from_secs(60)).await?;
    /// assert_eq!(cache.invalidate("2019-05").await?, Written::Applied);
    /// assert_eq!(cache.get::<u8>("2019-05").await?, None);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn invalidate(&self, key: &str) -> Result<Written, Error> {
        self.engine.invalidate(key).await
    }

    /// Deletes many values in one round trip: what [`invalidate`](Self::invalidate) does, for
    /// each key. Keys may repeat. On Redis the keys go in chunks of a bounded size, all sent at
    /// once (pipelined; on Redis Cluster, per slot), so a long list does not hold the server
    /// for other clients.
    ///
    /// Returns [`Written::Applied`], or with [auto-recovery](CacheBuilder::auto_recovery) on and
    /// the backend unreachable or busy, [`Written::Queued`]: every key queued, or none
    /// ([`Error::RecoveryQueueFull`]).
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for the first empty or over-long key, [`Error::TooManyKeys`] for
    /// more than [`MAX_BATCH_KEYS`](crate::MAX_BATCH_KEYS) keys (then nothing is invalidated);
    /// [`Error::Backend`] when the backend fails, whatever the [`OnBackendError`](crate::OnBackendError)
    /// (some keys may have been invalidated: retry the call, which is harmless);
    /// [`Error::RecoveryQueueFull`].
    ///
    /// ```
    /// use stampede_guard::Written;
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = stampede_guard::Cache::in_memory();
    /// let _ = cache.set("2019-05", &1u8, Duration::from_secs(60)).await?;
    /// let _ = cache.set("2019-06", &2u8, Duration::from_secs(60)).await?;
    /// let written = cache.invalidate_many(["2019-05", "2019-06"]).await?;
    /// assert_eq!(written, Written::Applied);
    /// assert_eq!(cache.get::<u8>("2019-06").await?, None);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn invalidate_many<K>(&self, keys: K) -> Result<Written, Error>
    where
        K: IntoIterator,
        K::Item: AsRef<str>,
    {
        self.engine.invalidate_many(keys).await
    }

    /// Invalidates every value that carries `tag` (from [`CallOptions::tags`] or
    /// [`Computed::tags`]), on every instance, in two requests whatever the number of values:
    /// from the moment this returns no call serves one of them (a near tier of another instance
    /// within its [`max_staleness`](crate::NearCacheOptions::max_staleness)), not even as a stale
    /// value or a fail-safe fallback; the next call computes afresh. A computation that started
    /// before this returned may still write its value, but it counts as invalidated too (the
    /// fence rule of [`invalidate`](Self::invalidate), per tag).
    ///
    /// Nothing is deleted: the values are left to their TTL (or eviction) and read as misses
    /// until replaced. How it works, and what it costs a read: `docs/tags.md`.
    ///
    /// Returns [`Written::Applied`] when the backend took it. When the backend is unreachable or
    /// busy and [auto-recovery](CacheBuilder::auto_recovery) is on, [`Written::Queued`]: the
    /// raise is replayed when it answers (an epoch only rises: never below one raised meanwhile
    /// by another instance), and until then every read of this instance replays it before it
    /// reads Redis, so none serves a value it kills (`docs/after-commit.md`).
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for an empty tag or one over [`MAX_KEY_BYTES`](crate::MAX_KEY_BYTES);
    /// [`Error::RecoveryQueueFull`] when it should be queued and the queue is full;
    /// [`Error::Backend`] when the backend fails otherwise, whatever the
    /// [`OnBackendError`](crate::OnBackendError) (it may have been applied: retrying is
    /// harmless).
    ///
    /// ```
    /// use stampede_guard::{Cache, CallOptions, Written};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = Cache::in_memory();
    /// let ttl = Duration::from_secs(300);
    /// for month in ["2019-05", "2019-06"] {
    ///     let year = cache.with_options(CallOptions::default().tags(["year:2019"]));
    ///     year.get_or_compute(month, ttl, || async { Ok::<_, std::io::Error>(1u32) }).await?;
    /// }
    /// // A backfill rewrote 2019: both months go, in one call.
    /// assert_eq!(cache.invalidate_tag("year:2019").await?, Written::Applied);
    /// assert_eq!(cache.get::<u32>("2019-05").await?, None);
    /// assert_eq!(cache.get::<u32>("2019-06").await?, None);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn invalidate_tag(&self, tag: &str) -> Result<Written, Error> {
        self.invalidate_tags([tag]).await
    }

    /// [`invalidate_tag`](Self::invalidate_tag) for several tags at once: the requests of
    /// every tag are sent together. Tags may repeat. [`Written::Queued`] as for one tag: every
    /// tag queued (a tag queued before is one entry still), or none
    /// ([`Error::RecoveryQueueFull`]).
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for the first invalid tag (then nothing is invalidated),
    /// [`Error::TooManyKeys`] for more than [`MAX_BATCH_KEYS`](crate::MAX_BATCH_KEYS) tags,
    /// [`Error::RecoveryQueueFull`], [`Error::Backend`] as for one tag (some tags may have been
    /// invalidated: retry the call).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = stampede_guard::Cache::in_memory();
    /// let written = cache.invalidate_tags(["tenant:7", "tenant:8"]).await?;
    /// assert!(written.is_applied());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn invalidate_tags<I>(&self, tags: I) -> Result<Written, Error>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        self.engine.invalidate_tags(tags).await
    }

    /// Invalidates every value of the namespace, on every instance, in two requests whatever
    /// the number of values: what [`invalidate_tag`](Self::invalidate_tag) does, for a tag every
    /// value carries. The near tiers of other instances stop serving within their
    /// [`max_staleness`](crate::NearCacheOptions::max_staleness). Other namespaces on the same
    /// Redis are untouched.
    ///
    /// Nothing is deleted: Redis reclaims the space as the values' TTLs run out (or by eviction).
    /// To free it at once, `FLUSHDB` a database the cache has to itself.
    ///
    /// Returns [`Written::Applied`], or with [auto-recovery](CacheBuilder::auto_recovery) on and
    /// the backend unreachable or busy, [`Written::Queued`], as for a tag. A queued clear
    /// covers the tags' raises: those queued leave the queue, and a tag invalidated while it
    /// waits is the same one entry.
    ///
    /// # Errors
    /// [`Error::RecoveryQueueFull`] when it should be queued and the queue is full;
    /// [`Error::Backend`] when the backend fails otherwise (it may have been applied: retrying
    /// is harmless).
    ///
    /// ```
    /// use stampede_guard::Written;
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = stampede_guard::Cache::in_memory();
    /// let _ = cache.set("2019-05", &1u8, Duration::from_secs(60)).await?;
    /// // A deploy changed how every report is computed.
    /// assert_eq!(cache.clear().await?, Written::Applied);
    /// assert_eq!(cache.get::<u8>("2019-05").await?, None);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn clear(&self) -> Result<Written, Error> {
        self.engine.clear().await
    }

    /// Returns the value under `key`, or computes it with `f`, caches it for `ttl` and returns it.
    ///
    /// # Concurrent calls on the same key
    /// Exactly one caller in the fleet (every process on the same backend and namespace) runs its
    /// `f`; within a process the other callers share that caller's outcome, and other processes
    /// wait for the value to land (woken by a notification, with a jittered backoff as the
    /// backstop) and then read it. If `f` fails, its error goes to this process's waiting callers
    /// as the same [`Error::Compute`]; nothing is cached (unless
    /// [`CallOptions::negative_ttl`] is set), and the next caller tries again.
    ///
    /// `f` and its future must be `Send + 'static` because a refresh in the background (stale
    /// window, early refresh) runs them in a spawned task: move what they need into them.
    ///
    /// # Durations
    /// `ttl` may be any duration: one of [`FOREVER`](crate::FOREVER) (100 years) or more, such
    /// as `Duration::MAX`, means no expiry (on Redis the value is written without a TTL; in
    /// memory it never expires); it stays until replaced, invalidated or evicted. The same holds
    /// for every duration of [`CallOptions`].
    ///
    /// # Cancellation and panics
    /// If the computing caller's future is dropped or `f` panics, its lock is released (best effort
    /// at once, the lease running out as the backstop) and one of the waiting callers takes over.
    /// The panic itself propagates to the computing caller.
    ///
    /// # Errors
    /// [`Error::Compute`] from `f`; [`Error::WaitTimeout`] after waiting
    /// [`CallOptions::wait_timeout`] for another caller; [`Error::Backend`] when Redis fails
    /// (unless the fallback is [`OnBackendError::ComputeUncached`](crate::OnBackendError::ComputeUncached)); [`Error::RecentFailure`] when a
    /// remembered failure is served; [`Error::InvalidKey`], [`Error::Encode`],
    /// [`Error::ValueTooLarge`].
    ///
    /// ```
    /// use stampede_guard::Cache;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// # #[tokio::main]
    /// # async fn main() {
    /// let cache = Cache::in_memory();
    /// let queries = Arc::new(AtomicUsize::new(0));
    /// let mut callers = Vec::new();
    /// for _ in 0..10 {
    ///     let (cache, queries) = (cache.clone(), queries.clone());
    ///     callers.push(tokio::spawn(async move {
    ///         cache
    ///             .get_or_compute("2019-05", Duration::from_secs(300), move || async move {
    ///                 queries.fetch_add(1, Ordering::SeqCst);
    ///                 tokio::time::sleep(Duration::from_millis(50)).await; // the slow query
    ///                 Ok::<_, std::io::Error>(format!("report for 2019-05"))
    ///             })
    ///             .await
    ///     }));
    /// }
    /// for caller in callers {
    ///     assert_eq!(caller.await.unwrap().unwrap(), "report for 2019-05");
    /// }
    /// assert_eq!(queries.load(Ordering::SeqCst), 1);
    /// # }
    /// ```
    pub async fn get_or_compute<T, E, F, Fut>(
        &self,
        key: &str,
        ttl: Duration,
        f: F,
    ) -> Result<T, Error>
    where
        T: CacheValue,
        E: ComputeFailure,
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        // Here rather than in `fetch`: a hit then builds none of fetch's future.
        if let Some(value) = self.engine.quick_hit::<T>(key) {
            return Ok(value);
        }
        let fetched = self
            .engine
            .fetch_beyond_quick_hit(
                key,
                ttl,
                move |_| async move { f().await.map(Computed::new) },
            )
            .await?;
        Ok(fetched.value)
    }

    /// Like [`get_or_compute`](Self::get_or_compute), but `f` receives the [`Lease`] it computes
    /// under: the fencing token of this acquisition, and a signal that fires if the lease is lost
    /// (so a long computation can stop early, or pass the token to the systems it writes to).
    ///
    /// ```
    /// use stampede_guard::Cache;
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let cache = Cache::in_memory();
    /// let token = cache
    ///     .get_or_compute_with_lease("job", Duration::from_secs(60), |lease| async move {
    ///         Ok::<_, std::io::Error>(lease.fencing_token().unwrap_or(0))
    ///     })
    ///     .await
    ///     .unwrap();
    /// assert!(token > 0);
    /// # }
    /// ```
    pub async fn get_or_compute_with_lease<T, E, F, Fut>(
        &self,
        key: &str,
        ttl: Duration,
        f: F,
    ) -> Result<T, Error>
    where
        T: CacheValue,
        E: ComputeFailure,
        F: FnOnce(Lease) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        if let Some(value) = self.engine.quick_hit::<T>(key) {
            return Ok(value);
        }
        let fetched = self
            .engine
            .fetch_beyond_quick_hit(key, ttl, move |lease| async move {
                f(lease).await.map(Computed::new)
            })
            .await?;
        Ok(fetched.value)
    }

    /// The general form of [`get_or_compute`](Self::get_or_compute): `f` receives the
    /// [`Lease`] and returns a [`Computed`] value, which may carry its own TTL; the result says
    /// where the value came from ([`Source`](crate::Source): a fresh hit, a stale value being refreshed, computed
    /// by this call, computed by another while this one waited, or computed without the cache).
    ///
    /// ```
    /// use stampede_guard::{Cache, CallOptions, Computed, Source};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = Cache::in_memory()
    ///     .with_options(CallOptions::default().stale_for(Duration::from_secs(600)));
    /// let first = cache
    ///     .fetch("2026-11", Duration::from_secs(3600), |_lease| async {
    ///         // The current month changes: keep it one minute, not the call's hour.
    ///         Ok::<_, std::io::Error>(Computed::new(vec![1u32, 2, 3]).ttl(Duration::from_secs(60)))
    ///     })
    ///     .await?;
    /// assert_eq!(first.source, Source::Computed);
    /// let again = cache
    ///     .fetch("2026-11", Duration::from_secs(3600), |_| async {
    ///         Ok::<_, std::io::Error>(Computed::new(Vec::<u32>::new()))
    ///     })
    ///     .await?;
    /// assert_eq!((again.value, again.source), (vec![1, 2, 3], Source::Hit));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn fetch<T, E, F, Fut>(
        &self,
        key: &str,
        ttl: Duration,
        f: F,
    ) -> Result<Fetched<T>, Error>
    where
        T: CacheValue,
        E: ComputeFailure,
        F: FnOnce(Lease) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Computed<T>, E>> + Send + 'static,
    {
        self.engine.check_tags()?;
        if let Some(value) = self.engine.quick_hit::<T>(key) {
            return Ok(Fetched::new(value, Source::Hit));
        }
        self.engine.fetch_beyond_quick_hit(key, ttl, f).await
    }

    /// Returns the values of many keys at once, computing the missing ones with **one** call of
    /// `f`: the batch form of [`get_or_compute`](Self::get_or_compute), for a chart of twelve
    /// months on a cold cache answered by one query (`WHERE month = ANY($1)`).
    ///
    /// `f` receives the keys this caller must compute (distinct, in the order asked) and returns
    /// their values as `(key, value)` pairs: a `HashMap`, a `BTreeMap`, a `Vec` of pairs.
    ///
    /// The result has one entry per key of `keys`, in the same order (a key asked twice gets its
    /// value twice, computed once): each key's value or its own error, so one failing key does
    /// not hide the others. A handler that needs all of them collects it:
    /// `results.into_iter().collect::<Result<Vec<_>, _>>()?`.
    ///
    /// # Round trips
    /// Keys held in the [near tier](crate::NearCacheOptions) cost none. The others are read with one
    /// `MGET` (on Redis Cluster, one per slot, sent concurrently: Redis refuses a multi-key
    /// command across slots, even on one node). On a miss, one script call (per slot on a
    /// cluster) takes the lock of every missing key that is free; the values are then written
    /// one fenced write per key, sent concurrently. A big batch's `MGET` and script are cut into
    /// chunks of a bounded number of keys, all sent at once (pipelined), so that a cold batch
    /// of thousands of keys still costs about one round trip and never holds Redis for long
    /// while other clients wait ([batch guide](https://github.com/stampede-guard/stampede-guard/blob/main/docs/batch.md)).
    /// A call of more than [`MAX_BATCH_KEYS`](crate::MAX_BATCH_KEYS) keys is refused: every
    /// key gets [`Error::TooManyKeys`] and nothing is sent.
    ///
    /// # Concurrent calls on the same keys
    /// Every key keeps the rules of [`get_or_compute`](Self::get_or_compute), by itself:
    /// - a key that a call in this process (single-key or batch) is computing is not computed
    ///   again: this call waits for that outcome. Two overlapping batches (`01..06` and
    ///   `04..12`) compute each month once between them;
    /// - a key whose lock another process holds is waited for (woken when its value lands); if
    ///   that holder gives up without a value, this call takes the lock and computes the key,
    ///   with a call of `f` for it alone. So `f` runs once per call in the common case, and once
    ///   more per key taken over;
    /// - each key has its own lock, lease (renewed while `f` runs), fencing token and stored
    ///   value: an invalidation of one key during `f` refuses that key's write only (the
    ///   caller still gets the value computed).
    ///
    /// # Partial results
    /// A key that `f` leaves out gets [`Error::MissingFromBatch`]: nothing is cached for it, its
    /// lock is freed at once and its waiters are woken (to try again). An error from `f` fails
    /// all and only the keys it was computing, as [`Error::Compute`] (the same shared error for
    /// each), and is remembered per key when [`CallOptions::negative_ttl`] is set. Keys
    /// returned by `f` that it was not asked for are ignored.
    ///
    /// # Cancellation and panics
    /// If the call is dropped or `f` panics, every lock it holds (or has a request in flight
    /// for) is released at once, best effort (the lease running out is the backstop), and
    /// waiting callers, in this process and others, take over. The panic propagates.
    ///
    /// # Stale values
    /// A value served stale (inside [`CallOptions::stale_for`]) or drawn for an early refresh is
    /// refreshed in the background by a call of `f` for that key alone, as a single key is.
    ///
    /// `f` is `Fn` (not `FnOnce`) because of the last three cases; it and its future must be
    /// `Send + 'static`, as for the background refreshes of [`get_or_compute`](Self::get_or_compute).
    ///
    /// ```
    /// use stampede_guard::Cache;
    /// use std::collections::HashMap;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = Cache::in_memory();
    /// let queries = Arc::new(AtomicUsize::new(0));
    /// let months: Vec<String> = (1..=12).map(|m| format!("2019-{m:02}")).collect();
    /// let count = queries.clone();
    /// let totals: Vec<u64> = cache
    ///     .get_or_compute_many(&months, Duration::from_secs(300), move |missing: Vec<String>| {
    ///         count.fetch_add(1, Ordering::SeqCst);
    ///         async move {
    ///             // One query for every missing month: `WHERE month = ANY($1)`.
    ///             let rows: HashMap<String, u64> =
    ///                 missing.into_iter().map(|month| (month, 100)).collect();
    ///             Ok::<_, std::io::Error>(rows)
    ///         }
    ///     })
    ///     .await
    ///     .into_iter()
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(totals, vec![100; 12]);
    /// assert_eq!(queries.load(Ordering::SeqCst), 1, "one query for the twelve months");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn get_or_compute_many<K, T, E, F, Fut, I>(
        &self,
        keys: K,
        ttl: Duration,
        f: F,
    ) -> Vec<Result<T, Error>>
    where
        K: IntoIterator,
        K::Item: AsRef<str>,
        T: CacheValue,
        E: ComputeFailure,
        F: Fn(Vec<String>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<I, E>> + Send + 'static,
        I: IntoIterator<Item = (String, T)>,
    {
        let computed = move |keys: Vec<(String, Lease)>| {
            let values = f(keys.into_iter().map(|(key, _lease)| key).collect());
            async move {
                values.await.map(|values| {
                    values
                        .into_iter()
                        .map(|(key, value)| (key, Computed::new(value)))
                        .collect::<Vec<_>>()
                })
            }
        };
        self.fetch_many(keys, ttl, computed)
            .await
            .into_iter()
            .map(|fetched| fetched.map(|fetched| fetched.value))
            .collect()
    }

    /// The general form of [`get_or_compute_many`](Self::get_or_compute_many), as
    /// [`fetch`](Self::fetch) is of [`get_or_compute`](Self::get_or_compute): `f` receives each
    /// key with the [`Lease`] it is computed under (its own fencing token and lost-lease signal,
    /// as a single key's), returns a [`Computed`] per key (which may carry its own TTL), and
    /// each result says where its value came from ([`Source`]).
    ///
    /// ```
    /// use stampede_guard::{Cache, Computed, Source};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = Cache::in_memory();
    /// let _ = cache.set("2026-10", &10u32, Duration::from_secs(3600)).await?;
    /// let results = cache
    ///     .fetch_many(["2026-10", "2026-11"], Duration::from_secs(3600), |missing| async move {
    ///         // Each key comes with its lease: pass its fencing token to what you write to.
    ///         // The current month changes: keep it one minute, not the call's hour.
    ///         let values = missing.into_iter().map(|(month, _lease)| {
    ///             (month, Computed::new(11u32).ttl(Duration::from_secs(60)))
    ///         });
    ///         Ok::<_, std::io::Error>(values.collect::<Vec<_>>())
    ///     })
    ///     .await;
    /// let sources: Vec<Source> = results.iter().map(|r| r.as_ref().unwrap().source).collect();
    /// assert_eq!(sources, vec![Source::Hit, Source::Computed]);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn fetch_many<K, T, E, F, Fut, I>(
        &self,
        keys: K,
        ttl: Duration,
        f: F,
    ) -> Vec<Result<Fetched<T>, Error>>
    where
        K: IntoIterator,
        K::Item: AsRef<str>,
        T: CacheValue,
        E: ComputeFailure,
        F: Fn(Vec<(String, Lease)>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<I, E>> + Send + 'static,
        I: IntoIterator<Item = (String, Computed<T>)>,
    {
        let asked: Vec<String> = keys.into_iter().map(|k| k.as_ref().to_owned()).collect();
        let span = tracing::debug_span!("stampede_guard::fetch_many", keys = asked.len());
        // Erased once here: the batch machinery is not generic over `F`.
        let f: batch::BatchFn<T, E> = Arc::new(move |keys: Vec<(String, Lease)>| {
            let values = f(keys);
            Box::pin(async move {
                values
                    .await
                    .map(|values| values.into_iter().collect::<HashMap<_, _>>())
            })
        });
        self.engine
            .fetch_many_entries(asked, saturate(ttl), f)
            .instrument(span)
            .await
    }

    /// [`get_or_compute`](Self::get_or_compute), with `f` given the key (owned) and a clone of
    /// `ctx`. What the computation uses comes in as arguments, so nothing is cloned by hand:
    ///
    /// ```
    /// use stampede_guard::Cache;
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// struct Db;
    /// impl Db {
    ///     async fn monthly_report(&self, month: &str) -> Result<String, std::io::Error> {
    ///         Ok(format!("report for {month}"))
    ///     }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let (cache, db) = (Cache::in_memory(), Arc::new(Db));
    /// let month = "2019-05";
    /// // Instead of `let db = db.clone(); let key = month.to_owned();` and `move || async move`:
    /// let report = cache
    ///     .get_or_compute_with(month, Duration::from_secs(300), &db, |month, db| async move {
    ///         db.monthly_report(&month).await
    ///     })
    ///     .await?;
    /// assert_eq!(report, "report for 2019-05");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// Those of [`get_or_compute`](Self::get_or_compute).
    pub async fn get_or_compute_with<D, T, E, F, Fut>(
        &self,
        key: &str,
        ttl: Duration,
        ctx: &D,
        f: F,
    ) -> Result<T, Error>
    where
        D: Clone + Send + 'static,
        T: CacheValue,
        E: ComputeFailure,
        F: FnOnce(String, D) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        let (owned, ctx) = (key.to_owned(), ctx.clone());
        self.get_or_compute(key, ttl, move || f(owned, ctx)).await
    }

    /// [`get_or_compute_many`](Self::get_or_compute_many), with `f` given the missing keys and
    /// its own clone of `ctx`, taken by reference here.
    ///
    /// `f` is `FnOnce`: it may move what it captures (a tenant, a map from each key back to
    /// what it stands for) into its future, with no clone written by hand. A batch may call it
    /// more than once (the keys another process was computing when that process went away,
    /// a background refresh of one key; see [`get_or_compute_many`](Self::get_or_compute_many)),
    /// so each call runs a clone of `f` with a clone of `ctx`; hence `Clone` on both, which a
    /// closure is when what it captures is (wrap the rest in an `Arc`).
    ///
    /// ```
    /// use stampede_guard::Cache;
    /// use std::collections::HashMap;
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let (cache, prices) = (Cache::in_memory(), Arc::new(vec![10u64, 20, 30]));
    /// let tenant = String::from("acme");
    /// // Each key, and the month it stands for: no parsing the month back out of the key.
    /// let months: HashMap<String, u32> =
    ///     (1..=2).map(|m| (format!("{tenant}:2019-{m:02}"), m)).collect();
    /// let keys: Vec<String> = months.keys().cloned().collect();
    /// let totals: Vec<u64> = cache
    ///     .get_or_compute_many_with(&keys, Duration::from_secs(300), &prices, move |missing, prices| async move {
    ///         // `tenant` and `months` moved in: the closure is `FnOnce`.
    ///         assert!(missing.iter().all(|key| key.starts_with(tenant.as_str())));
    ///         let priced = missing.into_iter().map(|key| {
    ///             let month = months[&key] as usize;
    ///             (key, prices[month - 1])
    ///         });
    ///         Ok::<_, std::io::Error>(priced.collect::<Vec<_>>())
    ///     })
    ///     .await
    ///     .into_iter()
    ///     .collect::<Result<_, _>>()?;
    /// let mut sorted = totals.clone();
    /// sorted.sort();
    /// assert_eq!(sorted, [10, 20]);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn get_or_compute_many_with<K, D, T, E, F, Fut, I>(
        &self,
        keys: K,
        ttl: Duration,
        ctx: &D,
        f: F,
    ) -> Vec<Result<T, Error>>
    where
        K: IntoIterator,
        K::Item: AsRef<str>,
        D: Clone + Send + Sync + 'static,
        T: CacheValue,
        E: ComputeFailure,
        F: FnOnce(Vec<String>, D) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<I, E>> + Send + 'static,
        I: IntoIterator<Item = (String, T)>,
    {
        let ctx = ctx.clone();
        self.get_or_compute_many(keys, ttl, move |missing| (f.clone())(missing, ctx.clone()))
            .await
    }
}
