//! The user's handle: [`Cache`], its builder, and the `get_or_compute` family.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::{de::DeserializeOwned, Serialize};
use tokio::time::Instant;

use crate::codec::{Bincode, Codec};
use crate::connect::Backend;
use crate::envelope::Envelope;
use crate::flight::{Flights, Role};
use crate::key::{validate_namespace, EntryKeys};
use crate::lease::Lease;
use crate::lock::Lock;
use crate::lock::{new_token, HeldLock};
use crate::store::{MemoryStore, ReadOrLock, Store, Stored};
use crate::waiting::Waiter;
use crate::{CallOptions, Error, Fallback, MAX_VALUE_BYTES};

/// The namespace used when the builder is given none.
pub(crate) const DEFAULT_NAMESPACE: &str = "stampede";

/// A cache that computes each missing value once, however many tasks, processes and machines ask
/// for it at the same time.
///
/// `Cache` is a cheap handle (an `Arc` inside): clone it into every task. Values are any
/// `T: Serialize + DeserializeOwned + Clone`, encoded by the codec `C` ([`Bincode`] by default).
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
/// # async fn main() -> Result<(), stampede_guard::Error<std::io::Error>> {
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
pub struct Cache<C = Bincode> {
    inner: Arc<Inner<C>>,
    /// Per handle, so that [`Cache::with_options`] is free and does not touch other handles.
    options: CallOptions,
}

struct Inner<C> {
    store: Arc<dyn Store>,
    codec: C,
    namespace: String,
    flights: Flights,
}

impl<C> Clone for Cache<C> {
    fn clone(&self) -> Self {
        Cache {
            inner: Arc::clone(&self.inner),
            options: self.options.clone(),
        }
    }
}

impl<C> std::fmt::Debug for Cache<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("namespace", &self.inner.namespace)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Cache {
    /// A cache on the embedded in-memory store, with default options and namespace.
    ///
    /// The memory store is a real store for one process: TTLs, leases, fencing and wake-ups
    /// behave as on Redis, but nothing is shared with other processes.
    ///
    /// ```
    /// let cache = stampede_guard::Cache::in_memory();
    /// assert_eq!(cache.namespace(), "stampede");
    /// ```
    pub fn in_memory() -> Self {
        Cache::from_parts(
            Arc::new(MemoryStore::default()),
            Bincode,
            DEFAULT_NAMESPACE.to_owned(),
            CallOptions::default(),
        )
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
        CacheBuilder {
            namespace: DEFAULT_NAMESPACE.to_owned(),
            backend: Backend::Memory,
            options: CallOptions::default(),
            codec: Bincode,
        }
    }
}

impl<C: Codec> Cache<C> {
    fn from_parts(
        store: Arc<dyn Store>,
        codec: C,
        namespace: String,
        options: CallOptions,
    ) -> Self {
        Cache {
            inner: Arc::new(Inner {
                store,
                codec,
                namespace,
                flights: Flights::default(),
            }),
            options,
        }
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
    pub fn with_options(&self, options: CallOptions) -> Self {
        Cache {
            inner: Arc::clone(&self.inner),
            options,
        }
    }

    /// The options this handle's calls use.
    ///
    /// ```
    /// let cache = stampede_guard::Cache::in_memory();
    /// assert_eq!(cache.options(), &stampede_guard::CallOptions::default());
    /// ```
    pub fn options(&self) -> &CallOptions {
        &self.options
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
        &self.inner.namespace
    }

    /// How many keys this process is computing or waiting for right now, through this cache.
    /// Zero whenever no call is running: a cancelled or panicking call leaves nothing behind.
    ///
    /// ```
    /// let cache = stampede_guard::Cache::in_memory();
    /// assert_eq!(cache.in_flight(), 0);
    /// ```
    pub fn in_flight(&self) -> usize {
        self.inner.flights.len()
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
        let keys = EntryKeys::new(&self.inner.namespace, name)?;
        Ok(Lock::from_parts(
            Arc::clone(&self.inner.store),
            keys,
            self.options.clone(),
        ))
    }

    /// Reads a value. Bytes that are not a value of this cache (corrupt, another codec, another
    /// type) are logged and read as `None`.
    ///
    /// ```
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = stampede_guard::Cache::in_memory();
    /// assert_eq!(cache.get::<String>("greeting").await?, None);
    /// cache.set("greeting", &"hello".to_string(), Duration::from_secs(60)).await?;
    /// assert_eq!(cache.get::<String>("greeting").await?.as_deref(), Some("hello"));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, Error> {
        let keys = EntryKeys::new(&self.inner.namespace, key)?;
        let bytes = self
            .inner
            .store
            .get(&keys)
            .await
            .map_err(|e| Error::backend("get", e))?;
        Ok(bytes.and_then(|b| self.decode(&keys, &b)))
    }

    /// Writes a value for `ttl`, replacing any other. A computation of this key that is running
    /// now will not overwrite it: its write is refused by the fencing check.
    ///
    /// ```
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = stampede_guard::Cache::in_memory();
    /// cache.set("2019-05", &vec![1u32, 2, 3], Duration::from_secs(60)).await?;
    /// assert_eq!(cache.get::<Vec<u32>>("2019-05").await?, Some(vec![1, 2, 3]));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn set<T: Serialize>(
        &self,
        key: &str,
        value: &T,
        ttl: Duration,
    ) -> Result<(), Error> {
        let keys = EntryKeys::new(&self.inner.namespace, key)?;
        let bytes = self.encode(value, ttl, Duration::ZERO, 0)?;
        self.inner
            .store
            .set(&keys, bytes, ttl, self.options.lease)
            .await
            .map_err(|e| Error::backend("set", e))
    }

    /// Deletes a value. A computation of this key that is running now will not write its result
    /// (it started before the invalidation, so its result may be stale); the next call computes
    /// afresh.
    ///
    /// ```
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = stampede_guard::Cache::in_memory();
    /// cache.set("2019-05", &1u8, Duration::from_secs(60)).await?;
    /// cache.invalidate("2019-05").await?;
    /// assert_eq!(cache.get::<u8>("2019-05").await?, None);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn invalidate(&self, key: &str) -> Result<(), Error> {
        let keys = EntryKeys::new(&self.inner.namespace, key)?;
        self.inner
            .store
            .invalidate(&keys, self.options.lease)
            .await
            .map_err(|e| Error::backend("invalidate", e))
    }

    /// Returns the value under `key`, or computes it with `f`, caches it for `ttl` and returns it.
    ///
    /// # Concurrent calls on the same key
    /// Exactly one caller in the fleet (every process on the same backend and namespace) runs its
    /// `f`; within a process the other callers share that caller's outcome, and other processes
    /// wait for the value to land (woken by a notification, with a jittered backoff as the
    /// backstop) and then read it. If `f` fails, its error goes to this process's waiting callers
    /// as the same [`Error::Compute`]; nothing is cached, and the next caller tries again.
    ///
    /// # Cancellation and panics
    /// If the computing caller's future is dropped or `f` panics, its lock is released (best effort
    /// at once, the lease running out as the backstop) and one of the waiting callers takes over.
    /// The panic itself propagates to the computing caller.
    ///
    /// # Errors
    /// [`Error::Compute`] from `f`; [`Error::WaitTimeout`] after waiting
    /// [`CallOptions::wait_timeout`] for another caller; [`Error::Backend`] when Redis fails
    /// (unless the fallback is [`Fallback::ComputeUncached`]); [`Error::InvalidKey`],
    /// [`Error::Encode`], [`Error::ValueTooLarge`].
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
    ///             .get_or_compute("2019-05", Duration::from_secs(300), || async {
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
    ) -> Result<T, Error<E>>
    where
        T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
        E: Send + Sync + 'static,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.get_or_compute_with_lease(key, ttl, |_| f()).await
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
    ) -> Result<T, Error<E>>
    where
        T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
        E: Send + Sync + 'static,
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let started = Instant::now();
        let keys = EntryKeys::new(&self.inner.namespace, key).map_err(Error::widen)?;

        // The hit path: one GET, no script, no in-process bookkeeping.
        match self.inner.store.get(&keys).await {
            Ok(Some(bytes)) => {
                if let Some(value) = self.decode(&keys, &bytes) {
                    return Ok(value);
                }
            }
            Ok(None) => {}
            Err(e) if self.options.on_backend_error == Fallback::Fail => {
                return Err(Error::backend("get", e));
            }
            // The fallback applies in `load`, under the single flight.
            Err(_) => {}
        }

        let keys = Arc::new(keys);
        let leader = loop {
            match self.inner.flights.join::<T, E>(&keys.value) {
                Role::Lead(leader) => break Some(leader),
                Role::Alone => break None,
                Role::Follow(follower) => {
                    let remaining = self.options.wait_timeout.saturating_sub(started.elapsed());
                    match tokio::time::timeout(remaining, follower.outcome()).await {
                        Ok(Some(outcome)) => return outcome,
                        // The leader was cancelled or panicked: try to lead.
                        Ok(None) => continue,
                        Err(_) => {
                            return Err(Error::WaitTimeout {
                                key: keys.user.clone(),
                                waited: started.elapsed(),
                            })
                        }
                    }
                }
            }
        };
        let outcome = self.load(&keys, ttl, started, f).await;
        if let Some(leader) = leader {
            leader.finish(&outcome);
        }
        outcome
    }

    /// The distributed part: read the value or take the lock; compute under it, or wait for the
    /// holder and read again.
    async fn load<T, E, F, Fut>(
        &self,
        keys: &Arc<EntryKeys>,
        ttl: Duration,
        started: Instant,
        f: F,
    ) -> Result<T, Error<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let store = &self.inner.store;
        let options = &self.options;
        let token: Arc<str> = new_token();
        let mut waiter = Waiter::new(store.as_ref(), keys, options, started);
        // Cleared after bytes that do not decode: then the lock is taken over them, to replace them.
        let mut read_value = true;
        loop {
            let asked = Instant::now();
            let answer = match store
                .read_or_lock(keys, &token, options.lease, read_value)
                .await
            {
                Ok(answer) => answer,
                Err(e) => return self.without_cache("read-or-lock", e, keys, f).await,
            };
            match answer {
                ReadOrLock::Value(bytes) => match self.decode(keys, &bytes) {
                    Some(value) => return Ok(value),
                    None => read_value = false,
                },
                ReadOrLock::Acquired { fence } => {
                    let held = HeldLock::new(
                        Arc::clone(store),
                        Arc::clone(keys),
                        token,
                        fence,
                        asked,
                        options.renewal(),
                    );
                    return self.compute_and_store(held, keys, ttl, f).await;
                }
                ReadOrLock::Held { expires_in } => {
                    read_value = true;
                    waiter.wait(expires_in).await.map_err(Error::widen)?;
                }
            }
        }
    }

    async fn compute_and_store<T, E, F, Fut>(
        &self,
        held: HeldLock,
        keys: &EntryKeys,
        ttl: Duration,
        f: F,
    ) -> Result<T, Error<E>>
    where
        T: Serialize,
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let computing = Instant::now();
        let value = match f(held.lease()).await {
            Ok(value) => value,
            Err(e) => {
                if let Err(err) = held.release().await {
                    tracing::warn!(key = %keys.user, error = %err,
                        "could not free the lock after a failed computation; it frees itself when its lease runs out");
                }
                return Err(Error::Compute(Arc::new(e)));
            }
        };
        let bytes = match self.encode(&value, ttl, computing.elapsed(), held.fence()) {
            Ok(bytes) => bytes,
            Err(e) => {
                let _ = held.release().await;
                return Err(e.widen());
            }
        };
        match held.store_and_unlock(bytes, ttl).await {
            Ok(Stored { written: true, .. }) => {}
            Ok(Stored { written: false, .. }) => tracing::info!(key = %keys.user,
                "computed value not written: the key was invalidated, set, or taken over since the lock was acquired"),
            Err(e) => tracing::warn!(key = %keys.user, error = %e,
                "computed value not written: the backend failed; returning it uncached"),
        }
        Ok(value)
    }

    /// The backend failed during `op`: fail, or compute without the cache, as configured.
    async fn without_cache<T, E, F, Fut>(
        &self,
        op: &'static str,
        error: redis::RedisError,
        keys: &EntryKeys,
        f: F,
    ) -> Result<T, Error<E>>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        match self.options.on_backend_error {
            Fallback::Fail => Err(Error::backend(op, error)),
            Fallback::ComputeUncached => {
                tracing::warn!(key = %keys.user, op, error = %error,
                    "backend unavailable; computing without the cache");
                f(Lease::unlocked())
                    .await
                    .map_err(|e| Error::Compute(Arc::new(e)))
            }
        }
    }

    fn encode<T: Serialize>(
        &self,
        value: &T,
        ttl: Duration,
        compute: Duration,
        fence: u64,
    ) -> Result<Vec<u8>, Error> {
        let codec = &self.inner.codec;
        let payload = codec
            .encode(value)
            .map_err(|e| Error::Encode(Arc::from(e)))?;
        if payload.len() > MAX_VALUE_BYTES {
            return Err(Error::ValueTooLarge {
                size: payload.len(),
                limit: MAX_VALUE_BYTES,
            });
        }
        Ok(Envelope::encode(codec.id(), ttl, compute, fence, &payload))
    }

    /// Bytes that are not ours are a miss: logged, then recomputed and overwritten.
    fn decode<T: DeserializeOwned>(&self, keys: &EntryKeys, bytes: &[u8]) -> Option<T> {
        let codec = &self.inner.codec;
        let envelope = match Envelope::decode(bytes, codec.id()) {
            Ok(envelope) => envelope,
            Err(foreign) => {
                tracing::warn!(key = %keys.user, reason = %foreign, "unreadable bytes under the key; treating as a miss");
                return None;
            }
        };
        match codec.decode(envelope.payload) {
            Ok(value) => Some(value),
            Err(e) => {
                tracing::warn!(key = %keys.user, error = %e, "value does not decode as the requested type; treating as a miss");
                None
            }
        }
    }
}

/// Builds a [`Cache`]: backend, namespace, default call options and codec.
///
/// ```
/// use stampede_guard::{Cache, CallOptions};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), stampede_guard::Error> {
/// let cache = Cache::builder()
///     .namespace("reports")
///     .options(CallOptions::default().lease(Duration::from_secs(10)))
///     .build()
///     .await?;
/// assert_eq!(cache.options().get_lease(), Duration::from_secs(10));
/// # Ok(())
/// # }
/// ```
#[must_use]
pub struct CacheBuilder<C = Bincode> {
    namespace: String,
    backend: Backend,
    options: CallOptions,
    codec: C,
}

impl<C> std::fmt::Debug for CacheBuilder<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheBuilder")
            .field("namespace", &self.namespace)
            .field("backend", &self.backend.kind())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl<C: Codec> CacheBuilder<C> {
    /// The prefix of every key (default `"stampede"`): caches with different namespaces never
    /// see each other's values or locks. Printable ASCII without `{`, `}`, `%` or spaces.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Use the Redis server at `url` (`redis://[user:password@]host:port/db`). The connection is
    /// made on first use and re-made automatically after it drops.
    pub fn redis_url(mut self, url: impl Into<String>) -> Self {
        self.backend = Backend::RedisUrl(url.into());
        self
    }

    /// Use the Redis server of an existing client.
    pub fn redis_client(mut self, client: redis::Client) -> Self {
        self.backend = Backend::RedisClient(client);
        self
    }

    /// The embedded in-memory store (the default).
    pub fn in_memory(mut self) -> Self {
        self.backend = Backend::Memory;
        self
    }

    /// The options of every call made through the built cache (see [`CallOptions`]).
    pub fn options(mut self, options: CallOptions) -> Self {
        self.options = options;
        self
    }

    /// Another payload codec (see [`Codec`]).
    pub fn codec<C2: Codec>(self, codec: C2) -> CacheBuilder<C2> {
        CacheBuilder {
            namespace: self.namespace,
            backend: self.backend,
            options: self.options,
            codec,
        }
    }

    /// Builds the cache. For Redis this does not wait for the server: a cache built while Redis
    /// is down works as soon as it is up.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for a bad namespace, [`Error::Config`] for a Redis URL that does not
    /// parse.
    pub async fn build(self) -> Result<Cache<C>, Error> {
        validate_namespace(&self.namespace)?;
        let store = self.backend.open()?;
        Ok(Cache::from_parts(
            store,
            self.codec,
            self.namespace,
            self.options,
        ))
    }
}
