//! [`CacheBuilder`]: backend, namespace, default call options and codec.
//!
//! Explained in the guide: `docs/configuration.md` (every setting, its default and bounds).

use crate::cache::engine::{Engine, Parts};
use crate::cache::near::{NearCacheOptions, NearTier};
use crate::cache::recovery::{Recovery, RecoveryOptions};
use crate::cache::tiers::Tiers;
use crate::cache::Cache;
use crate::store::breaker::Breaker;
use crate::store::guarded::GuardedStore;
use crate::store::redis::refusal;
use crate::store::{Backend, BreakerOptions, ConnectionOptions, MemoryStore, ProbeError, Store};
use crate::wire::codec::{Bincode, Codec};
use std::sync::Arc;

use crate::store::quorum::QuorumStore;
use crate::store::SplitStore;
use crate::wire::key::{validate_namespace, value_key_prefixes};
use crate::{CallOptions, Error, MemoryLimits};

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
    /// Redlock node URLs for the per-key locks, if they are not taken in the backend itself.
    redlock: Vec<String>,
    options: CallOptions,
    connection: ConnectionOptions,
    codec: C,
    near: Option<NearCacheOptions>,
    /// Off (`None`) by default: a write that fails is the caller's to see.
    recovery: Option<RecoveryOptions>,
    breaker: BreakerOptions,
}

impl<C> std::fmt::Debug for CacheBuilder<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheBuilder")
            .field("namespace", &self.namespace)
            .field("backend", &self.backend.kind())
            .field("redlock_nodes", &self.redlock.len())
            .field("options", &self.options)
            .field("connection", &self.connection)
            .field("near", &self.near)
            .field("recovery", &self.recovery)
            .field("breaker", &self.breaker)
            .finish_non_exhaustive()
    }
}

impl CacheBuilder {
    pub(crate) fn new(namespace: &str) -> Self {
        CacheBuilder {
            namespace: namespace.to_owned(),
            backend: Backend::Memory(MemoryLimits::default()),
            redlock: Vec::new(),
            options: CallOptions::default(),
            connection: ConnectionOptions::default(),
            codec: Bincode,
            near: None,
            recovery: None,
            breaker: BreakerOptions::default(),
        }
    }
}

impl<C: Codec> CacheBuilder<C> {
    crate::options::setters! {
        /// The prefix of every key (default `"stampede"`): caches with different namespaces never
        /// see each other's values or locks. Printable ASCII without `{`, `}`, `%` or spaces.
        namespace: impl Into<String> = namespace.into();
    }

    crate::lock::redis_backend_setters!();

    /// The embedded in-memory store (the default), with the default [`MemoryLimits`].
    pub fn in_memory(self) -> Self {
        self.in_memory_with(MemoryLimits::default())
    }

    /// The embedded in-memory store, keeping at most as many values and bytes as `limits` say.
    ///
    /// ```
    /// use stampede_guard::{Cache, MemoryLimits};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = Cache::builder()
    ///     .in_memory_with(MemoryLimits::default().max_entries(50_000))
    ///     .build()
    ///     .await?;
    /// # let _ = cache;
    /// # Ok(())
    /// # }
    /// ```
    pub fn in_memory_with(mut self, limits: MemoryLimits) -> Self {
        self.backend = Backend::Memory(limits);
        self
    }

    /// The deterministic simulation's backend: a connection to its simulated server
    /// (`__private::sim`).
    #[cfg(feature = "simulation")]
    pub(crate) fn simulated(mut self, store: Arc<crate::store::simulated::Connection>) -> Self {
        self.backend = Backend::Simulated(store);
        self
    }

    crate::options::setters! {
        /// The options of every call made through the built cache (see [`CallOptions`]).
        options: CallOptions;

        /// How to reach Redis: time-outs and reconnection attempts (see [`ConnectionOptions`] for
        /// the defaults). Applies to the backend and to every [`redlock`](Self::redlock) node.
        ///
        /// ```
        /// use stampede_guard::{Cache, ConnectionOptions};
        /// use std::time::Duration;
        ///
        /// let builder = Cache::builder().connection(
        ///     ConnectionOptions::default().connect_timeout(Duration::from_millis(500)),
        /// );
        /// # let _ = builder;
        /// ```
        connection: ConnectionOptions;
    }

    crate::options::setters! {
        /// Take the per-key locks through a Redlock over these independent Redis masters (an odd
        /// number, at least 3), while values stay on the backend. The fencing rule holds across the
        /// two: the backend refuses a value whose token is lower than one it has accepted, and
        /// `set` and `invalidate` draw their fencing numbers from the quorum. Worth it only when
        /// the lock must survive the loss of the value store's server, which is rare for a cache
        /// (see the guide's
        /// [Redlock](https://github.com/stampede-guard/stampede-guard/blob/main/docs/cluster-and-redlock.md#redlock)
        /// section).
        redlock: [impl Into<String>];
    }

    /// Another payload codec (see [`Codec`]).
    pub fn codec<C2: Codec>(self, codec: C2) -> CacheBuilder<C2> {
        CacheBuilder {
            namespace: self.namespace,
            backend: self.backend,
            redlock: self.redlock,
            options: self.options,
            connection: self.connection,
            codec,
            near: self.near,
            recovery: self.recovery,
            breaker: self.breaker,
        }
    }

    /// Keep decoded values of this instance in a near tier in front of Redis (see
    /// [`NearCacheOptions`] for its bounds and defaults): a hit on a fresh copy costs no round trip.
    /// Redis reports every change of a value key to the tier, whoever makes it (another
    /// program's `SET` or `DEL`, an expiry, an eviction, a flush: `CLIENT TRACKING`, see
    /// [`track_outside_writes`](NearCacheOptions::track_outside_writes)), and the tier drops
    /// its copy; a copy is served only while this instance has proof, less than
    /// [`max_staleness`](NearCacheOptions::max_staleness) old, that those reports reach it. So a
    /// value served from the near tier is never older than a change of its key that completed
    /// more than `max_staleness` before the call began, whatever fails (a dropped or
    /// black-holed connection, a restarted server, a paused process).
    ///
    /// Works over Redis: a single server ([`redis_url`](Self::redis_url) or
    /// [`redis_client`](Self::redis_client)), whose locks may be taken through a
    /// [`redlock`](Self::redlock), or a [cluster](Self::redis_cluster). It costs one more
    /// connection per cache (per master on a cluster, each proven current on its own). Every
    /// instance of this version also announces its own changes, with or without a near tier,
    /// for the tiers whose tracking is off or refused by the server: those hear changes made
    /// through the crate at once, and read each copy again once it is `max_staleness` old, so
    /// that another program's change is not served past the same bound.
    ///
    /// ```no_run
    /// use stampede_guard::{Cache, NearCacheOptions};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = Cache::builder()
    ///     .redis_url("redis://127.0.0.1:6379/0")
    ///     .near_cache(NearCacheOptions::new(10_000).max_staleness(Duration::from_millis(500)))
    ///     .build()
    ///     .await?;
    /// let report: String = cache
    ///     .get_or_compute("2019-05", Duration::from_secs(300), || async {
    ///         Ok::<_, std::io::Error>("report".to_owned())
    ///     })
    ///     .await?;
    /// # let _ = report;
    /// # Ok(())
    /// # }
    /// ```
    pub fn near_cache(mut self, near: NearCacheOptions) -> Self {
        self.near = Some(near);
        self
    }

    /// Queue the writes that cannot reach the backend, and replay them when it answers
    /// (off by default). A [`set`](Cache::set), [`invalidate`](Cache::invalidate) or
    /// [`invalidate_many`](Cache::invalidate_many) that fails because Redis is unreachable or
    /// busy then returns `Ok(`[`Written::Queued`](crate::Written::Queued)`)` instead of an
    /// error; a refusal (permission, a replica, a full memory) is still the caller's error.
    ///
    /// - Per key one write waits, the newest (an invalidation replaces an older `set`, a `set`
    ///   an older invalidation); the queue is bounded by `options` and, when full, refuses with
    ///   [`Error::RecoveryQueueFull`], never dropping what it holds.
    /// - A background task replays the writes oldest first as soon as the backend answers,
    ///   retrying every 100 ms to 1 s meanwhile: an invalidation made during an outage is
    ///   applied within about a second of the server's return. It logs once when replays start
    ///   failing and once when the queue has drained. It stops when the last handle of the
    ///   cache is dropped; what is still queued then is lost (the queue lives in this process:
    ///   see the guide's [after a commit](https://github.com/stampede-guard/stampede-guard/blob/main/docs/after-commit.md)).
    /// - A replayed invalidation is the normal fenced one, and a queued `set` is replayed as an
    ///   invalidation too: the queue cannot tell its value from a newer one, nor an empty slot
    ///   from another instance's newer invalidation, so writing it could bring back an older
    ///   value; the next call computes afresh.
    /// - Until a key's write is replayed, this instance does not read that key from Redis: a
    ///   read replays it first, and if that fails the read fails as the backend does
    ///   ([`OnBackendError`](crate::OnBackendError) applies).
    /// - The fail-safe's throttled copies are not queued: replayed after an outage, a copy
    ///   meant to hold off recomputation for a few seconds would be stale advice.
    ///
    /// ```no_run
    /// use stampede_guard::{Cache, RecoveryOptions, Written};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = Cache::builder()
    ///     .redis_url("redis://127.0.0.1:6379/0")
    ///     .auto_recovery(RecoveryOptions::default().max_entries(50_000))
    ///     .build()
    ///     .await?;
    /// // After the row is committed:
    /// match cache.invalidate("2019-05").await? {
    ///     Written::Applied => {}
    ///     Written::Queued => tracing::info!("invalidation queued until Redis answers"),
    ///     _ => {}
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn auto_recovery(mut self, options: RecoveryOptions) -> Self {
        self.recovery = Some(options);
        self
    }

    crate::options::setters! {
        /// The circuit breaker in front of Redis (on by default: see [`BreakerOptions`] for its
        /// settings, [`BreakerOptions::disabled`] to turn it off). After a run of unreachable or
        /// busy answers it opens, and every call fails fast with [`Error::Backend`] (unreachable),
        /// or takes its fallback
        /// ([`OnBackendError::ComputeUncached`](crate::OnBackendError::ComputeUncached),
        /// [`serve_while_down`](NearCacheOptions::serve_while_down)), instead of paying a time-out
        /// each; a probe in the background closes it when Redis answers again. The embedded store
        /// has none (it cannot fail).
        ///
        /// ```
        /// use stampede_guard::{BreakerOptions, Cache};
        /// use std::time::Duration;
        ///
        /// # #[tokio::main(flavor = "current_thread")]
        /// # async fn main() -> Result<(), stampede_guard::Error> {
        /// let cache = Cache::builder()
        ///     .breaker(BreakerOptions::default().cool_down(Duration::from_millis(500)))
        ///     .build() // .redis_url(..) for Redis
        ///     .await?;
        /// # let _ = cache;
        /// # Ok(())
        /// # }
        /// ```
        breaker: BreakerOptions;
    }

    /// Builds the cache. For Redis (one server or a cluster) this does not wait for the server:
    /// a cache built while Redis is down works as soon as it is up. One server is asked what it
    /// allows ([`Cache::capabilities`]) over a connection of its own, one attempt bounded by
    /// the connect time-out; a server that does not answer is asked at its first answer.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for a bad namespace, [`Error::Config`] for a Redis URL that does not
    /// parse, or a [`near_cache`](Self::near_cache) on the embedded store; [`Error::Config`]
    /// naming the fix for a server that runs no Lua (Garnet without `--lua`, an ACL user
    /// without `+@scripting`), for [`wait_for_replicas`](ConnectionOptions::wait_for_replicas)
    /// on a server without `WAIT`, and for a URL that answers but not as Redis does (an HTTP
    /// server): see the guide's
    /// [servers](https://github.com/stampede-guard/stampede-guard/blob/main/docs/servers.md)
    /// page.
    pub async fn build(self) -> Result<Cache<C>, Error> {
        validate_namespace(&self.namespace)?;
        let (mut store, mut memory, tier, counters) = match self.near {
            Some(near) => {
                let tracked = near
                    .tracked
                    .as_deref()
                    .map(|prefixes| value_key_prefixes(&self.namespace, prefixes));
                let (store, feed) = self.backend.open_announcing(
                    &self.connection,
                    &self.namespace,
                    near.heartbeat_period(),
                    tracked,
                    // Held copies go on the crate's own changes (see `NearTier::changed`).
                    !near.serve_while_down.is_zero(),
                )?;
                check_server(store.as_ref(), &self.connection).await?;
                let counters = Arc::default();
                let tier = Arc::new(NearTier::new(&near, &self.namespace, Arc::clone(&counters)));
                let sink: Arc<dyn crate::store::redis::FeedSink> = tier.clone();
                feed.start(Arc::downgrade(&sink));
                (store, None, Some(tier), counters)
            }
            // The embedded store is kept by its type too: its hit path reads decoded values.
            None => match self.backend {
                Backend::Memory(limits) => {
                    let memory = Arc::new(MemoryStore::new(limits));
                    let store: Arc<dyn Store> = memory.clone();
                    (store, Some(memory), None, Arc::default())
                }
                backend => {
                    let store = backend.open(&self.connection, Some(&self.namespace))?;
                    check_server(store.as_ref(), &self.connection).await?;
                    (store, None, None, Arc::default())
                }
            },
        };
        let capabilities = store.capabilities();
        // With a Redlock, values (and so every announcement to near tiers) stay on the one
        // backend server; only the locks move to the quorum.
        if !self.redlock.is_empty() {
            // The locks are no longer the embedded store's: no quick hit from it either.
            memory = None;
            let locks =
                QuorumStore::connect(self.redlock, self.options.lease, None, &self.connection)
                    .await?;
            store = Arc::new(SplitStore {
                values: store,
                locks: Arc::new(locks),
            });
        }
        // Not the embedded store: it cannot fail, and its hit path should not pay for a check.
        let mut guard = None;
        if self.breaker.enabled() && memory.is_none() {
            let breaker = Arc::new(Breaker::new(self.breaker, Arc::clone(&counters)));
            if let Some(tier) = &tier {
                tier.nudges(Arc::clone(&breaker));
            }
            let slow_locks = self.connection.get_wait_for_replicas().is_some();
            store = Arc::new(GuardedStore::new(store, Arc::clone(&breaker), slow_locks));
            guard = Some(breaker);
        }
        // Spawned here, on the caller's runtime; stopped by the cache's drop guard.
        let recovery = self.recovery.map(|options| {
            let clock = crate::wire::key::clear_key(&self.namespace);
            Recovery::start(options, Arc::clone(&store), Arc::clone(&counters), clock)
        });
        Ok(Cache::from_engine(Engine::new(Parts {
            store,
            codec: self.codec,
            namespace: self.namespace,
            options: self.options,
            tiers: Tiers::new(tier, memory),
            breaker: guard,
            counters,
            recovery,
            capabilities,
        })))
    }
}

/// Probes a single Redis server within the connect time-out (see
/// `store::redis::capabilities`), and refuses one the crate cannot keep its guarantees on: an
/// answer that is not Redis, no Lua, no `WAIT` while lock writes wait for replicas. A server
/// that does not answer in time is probed at its first answer instead.
async fn check_server(store: &dyn Store, connection: &ConnectionOptions) -> Result<(), Error> {
    let probed = store.probe_now(connection.connect_timeout).await;
    if let Err(ProbeError::Unreached(e)) = &probed {
        tracing::debug!(error = %e, "Redis did not answer the capability probe at build(); probed at its first answer");
    }
    let known = store.capabilities().and_then(|p| p.get());
    let waits = connection.wait_for_replicas.is_some();
    match refusal(&probed, known.as_ref(), waits) {
        Some(message) => Err(Error::Config(message)),
        None => Ok(()),
    }
}
