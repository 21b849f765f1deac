//! The distributed lock: a named lease with a fencing token, automatic renewal, and the guarantee
//! that it is let go on every exit path. The cache takes its per-key locks through the same
//! [`HeldLock`] code.
//!
//! The submodules: `lease.rs` (the heartbeat and the internal held lock that the cache shares),
//! `leader.rs` (one job on one instance) and `redlock.rs` (the lock over a quorum of masters).
//!
//! Cancellation contract: if the holder's future is dropped or panics, `Drop` stops the heartbeat
//! at once and starts a best-effort unlock on the current runtime (which wakes the waiters). `Drop`
//! cannot wait for the backend, so if that unlock fails too, the lease running out is the backstop.
//!
//! Explained in the guide: `docs/lock-and-leader.md`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

pub mod leader;
pub(crate) mod lease;
pub(crate) mod redlock;

use crate::lock::lease::{Acquiring, HeldLock, Lease, Renewal};
use crate::store::{Backend, ConnectionOptions};
use crate::wire::key::{validate_namespace, EntryKeys};

use crate::store::LockStoreExt;
use crate::store::{Acquire, LockStore};
use crate::wait::waiting::Waiter;
use crate::{CallOptions, Error};

/// A named distributed lock: at most one holder at a time across every process that uses the
/// same backend and namespace, for as long as its lease holds.
///
/// Each acquisition gets a [fencing token](LockGuard::fencing_token) that is strictly greater
/// than every token handed out before for this name; while held, the lease is renewed
/// automatically (every `lease / 3`). Get a lock from [`Lock::builder`], or from
/// [`Cache::lock`](crate::Cache::lock) to share a cache's connections.
///
/// A lease is not a guarantee under long pauses: a holder stopped for longer than its lease
/// loses the lock while it still believes it holds it. The fencing token is what protects the
/// systems you write to: pass it along and have them refuse lower tokens.
///
/// # The fencing guarantee, exactly
/// Tokens come from a counter stored next to the lock (`ns:{name}_fence`). The crate keeps it
/// at least as long as anything it guards: the lock (two leases past the last acquisition or
/// renewal) and, for a cache key, the value (its TTL plus the stale window; for ever if the
/// value has no expiry). While the counter lives, each acquisition's token is strictly greater
/// than every token handed out before for this name. If the counter is lost anyway (evicted
/// under `maxmemory`, `FLUSHDB`, a failover to a replica that missed the last increment), or
/// lapses once nothing it guards remains, the next acquisition re-seeds it from the Redis
/// server's clock in microseconds: still greater than every earlier token, unless that clock
/// was stepped back (or the new primary's runs behind) by more than the time since the lost
/// token was handed out. The cache itself only writes when the counter still equals the
/// writer's token, so a lost counter can make it refuse a write, never accept a stale one.
/// A lease of [`FOREVER`](crate::FOREVER) or more (`Duration::MAX`) never expires by itself.
///
/// ```
/// use stampede_guard::Lock;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), stampede_guard::Error> {
/// let lock = Lock::builder("nightly-sync").build().await?; // in memory; .redis_url(..) for Redis
/// let first = lock.acquire().await?;
/// let token = first.fencing_token();
/// first.release().await?;
/// let second = lock.acquire().await?;
/// assert!(second.fencing_token() > token);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Lock {
    store: Arc<dyn LockStore>,
    keys: Arc<EntryKeys>,
    options: CallOptions,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.keys.user())
            .field("key", &self.keys.lock())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Lock {
    /// A builder for the lock `name`: backend, namespace and options.
    ///
    /// ```no_run
    /// use stampede_guard::{CallOptions, Lock};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let lock = Lock::builder("copy-counters")
    ///     .redis_url("redis://127.0.0.1:6379/0")
    ///     .namespace("jobs")
    ///     .options(CallOptions::default().lease(Duration::from_secs(10)))
    ///     .build()
    ///     .await?;
    /// # let _ = lock;
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder(name: impl Into<String>) -> LockBuilder {
        LockBuilder {
            name: name.into(),
            namespace: crate::options::DEFAULT_NAMESPACE.to_owned(),
            backend: Backend::Memory(crate::MemoryLimits::default()),
            options: CallOptions::default(),
            connection: ConnectionOptions::default(),
        }
    }

    pub(crate) fn from_parts(
        store: Arc<dyn LockStore>,
        keys: EntryKeys,
        options: CallOptions,
    ) -> Self {
        Lock {
            store,
            keys: Arc::new(keys),
            options,
        }
    }

    /// The lock's name.
    ///
    /// ```
    /// # let cache = stampede_guard::Cache::in_memory();
    /// assert_eq!(cache.lock("sync").unwrap().name(), "sync");
    /// ```
    pub fn name(&self) -> &str {
        self.keys.user()
    }

    /// The options in force (lease, renewal, maximum hold, wait bound, backoff).
    ///
    /// ```
    /// # let cache = stampede_guard::Cache::in_memory();
    /// let lock = cache.lock("sync").unwrap();
    /// assert_eq!(lock.options(), cache.options());
    /// ```
    pub fn options(&self) -> &CallOptions {
        &self.options
    }

    /// One attempt: the guard if the lock was free, `None` if someone holds it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let lock = stampede_guard::Lock::builder("sync").build().await?;
    /// let held = lock.try_acquire().await?.expect("free");
    /// assert!(lock.try_acquire().await?.is_none());
    /// drop(held);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::Backend`] when the backend fails.
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>, Error> {
        let mut acquiring = self.acquiring();
        match self.attempt(&mut acquiring).await? {
            Ok(fence_and_asked) => Ok(Some(self.guard(acquiring, fence_and_asked))),
            Err(_) => Ok(None),
        }
    }

    /// Waits until the lock is free and takes it: woken at once when the holder releases, or
    /// after a jittered backoff that never sleeps past the holder's lease.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let lock = stampede_guard::Lock::builder("sync").build().await?;
    /// let guard = lock.acquire().await?;
    /// assert!(guard.is_held());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::WaitTimeout`] after [`CallOptions::wait_timeout`]; [`Error::Backend`] when the
    /// backend fails.
    pub async fn acquire(&self) -> Result<LockGuard, Error> {
        let mut acquiring = self.acquiring();
        let mut waiter = Waiter::new(
            self.store.as_ref(),
            &self.keys,
            &self.options,
            crate::time::now(),
        );
        loop {
            match self.attempt(&mut acquiring).await? {
                Ok(fence_and_asked) => return Ok(self.guard(acquiring, fence_and_asked)),
                Err(expires_in) => {
                    waiter.wait(expires_in).await?;
                }
            }
        }
    }

    /// Records that a run of a leader's term `fence` starts now, kept for `keep` (see
    /// [`leader`]); false if a newer term has recorded one.
    pub(crate) async fn record_run(&self, fence: u64, keep: Duration) -> Result<bool, Error> {
        self.store
            .record_run(&self.keys, fence, keep)
            .await
            .map_err(|e| Error::backend("record-run", e))
    }

    /// How long ago the last recorded run started, if one is recorded.
    pub(crate) async fn since_last_run(&self) -> Result<Option<Duration>, Error> {
        self.store
            .since_last_run(&self.keys)
            .await
            .map_err(|e| Error::backend("last-run", e))
    }

    fn acquiring(&self) -> Acquiring {
        Acquiring::new(
            Arc::clone(&self.store),
            Arc::clone(&self.keys),
            Renewal::from(&self.options),
        )
    }

    fn guard(&self, acquiring: Acquiring, (fence, asked): (u64, Instant)) -> LockGuard {
        LockGuard {
            held: acquiring.granted(fence, asked),
        }
    }

    /// Tries once: the fencing token and when the granted request was sent, or `Err(expires_in)`
    /// when someone else holds the lock.
    async fn attempt(
        &self,
        acquiring: &mut Acquiring,
    ) -> Result<Result<(u64, Instant), Option<Duration>>, Error> {
        let token = acquiring.token();
        let asked = acquiring.sending();
        let answer = match self
            .store
            .try_lock(&self.keys, &token, self.options.lease)
            .await
        {
            Ok(answer) => answer,
            Err(e) => {
                acquiring.failed(&e);
                return Err(Error::backend("acquire", e));
            }
        };
        Ok(match answer {
            Acquire::Acquired { fence } => Ok((fence, asked)),
            Acquire::Held { expires_in } => {
                acquiring.refused();
                Err(expires_in)
            }
        })
    }
}

/// Proof of holding a [`Lock`]: its fencing token, the state of its lease, and the way to let
/// it go. Dropping the guard releases the lock (best effort; the lease running out is the
/// backstop); [`release`](Self::release) does it now and reports whether it was still held.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), stampede_guard::Error> {
/// let lock = stampede_guard::Lock::builder("sync").build().await?;
/// let guard = lock.acquire().await?;
/// let token = guard.fencing_token(); // hand this to the systems you write to
/// assert!(token > 0);
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct LockGuard {
    held: HeldLock,
}

impl LockGuard {
    /// The fencing token of this acquisition: strictly greater than every token handed out
    /// before for this lock name.
    pub fn fencing_token(&self) -> u64 {
        self.held.fence()
    }

    /// Whether the lease still holds, as far as this process can tell (renewals succeed and the
    /// deadline has not passed). Check it before each step of work done under the lock.
    pub fn is_held(&self) -> bool {
        !self.held.lease().is_lost()
    }

    /// Completes when the lease is lost.
    pub async fn lost(&self) {
        self.held.lease().lost().await
    }

    /// A handle on the lease (fencing token and loss signal) to hand to work done under the lock.
    pub fn lease(&self) -> Lease {
        self.held.lease()
    }

    /// Extends the lease now, on top of the automatic renewal; false if the lock is no longer
    /// ours (the guard then reports it lost).
    ///
    /// # Errors
    /// [`Error::Backend`] when the backend fails.
    pub async fn extend(&self) -> Result<bool, Error> {
        self.held
            .extend()
            .await
            .map_err(|e| Error::backend("extend", e))
    }

    /// Releases the lock now and wakes the waiters.
    ///
    /// # Errors
    /// [`Error::NotHeld`] if the lock was no longer ours (its lease ran out, perhaps another
    /// holder took it); [`Error::Backend`] when the backend fails (the lease then runs out by
    /// itself).
    pub async fn release(self) -> Result<(), Error> {
        let name = self.held.name().to_owned();
        match self.held.release().await {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::NotHeld { name }),
            Err(e) => Err(Error::backend("release", e)),
        }
    }
}

/// Builds a [`Lock`]: backend, namespace and options.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), stampede_guard::Error> {
/// let lock = stampede_guard::Lock::builder("sync").namespace("jobs").build().await?;
/// assert_eq!(lock.name(), "sync");
/// # Ok(())
/// # }
/// ```
#[must_use]
pub struct LockBuilder {
    name: String,
    namespace: String,
    backend: Backend,
    options: CallOptions,
    connection: ConnectionOptions,
}

impl std::fmt::Debug for LockBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockBuilder")
            .field("name", &self.name)
            .field("namespace", &self.namespace)
            .field("backend", &self.backend.kind())
            .field("options", &self.options)
            .field("connection", &self.connection)
            .finish()
    }
}

/// The setters that choose a Redis backend, on each builder with a `backend: Backend` field
/// (a cache's, a lock's): written once, so that the two builders reach Redis the same way.
macro_rules! redis_backend_setters {
    () => {
        /// Use the Redis server at `url` (`redis://[user:password@]host:port/db`). The connection
        /// is made on first use and re-made automatically after it drops.
        pub fn redis_url(mut self, url: impl Into<String>) -> Self {
            self.backend = $crate::store::Backend::RedisUrl(url.into());
            self
        }

        /// Use a Redis Cluster reached through these seed nodes (`redis://host:port` each; the
        /// other nodes are discovered). Every key of an entry shares one hash tag, so each script
        /// runs on one slot; wake-ups use sharded pub/sub (Redis 7). Like a single server, the
        /// cluster is connected on first use: what is built while it is down works as soon as it
        /// answers.
        pub fn redis_cluster<I, S>(mut self, seeds: I) -> Self
        where
            I: IntoIterator<Item = S>,
            S: Into<String>,
        {
            self.backend =
                $crate::store::Backend::RedisCluster(seeds.into_iter().map(Into::into).collect());
            self
        }

        /// Use the Redis server of an existing client.
        pub fn redis_client(mut self, client: redis::Client) -> Self {
            self.backend = $crate::store::Backend::RedisClient(client);
            self
        }
    };
}
pub(crate) use redis_backend_setters;

impl LockBuilder {
    crate::options::setters! {
        /// The key prefix (default `"stampede"`), as for
        /// [`CacheBuilder::namespace`](crate::CacheBuilder::namespace).
        namespace: impl Into<String> = namespace.into();
    }

    redis_backend_setters!();

    crate::options::setters! {
        /// The lease, renewal, maximum hold, wait bound and backoff (see [`CallOptions`]).
        options: CallOptions;

        /// How to reach Redis: time-outs and reconnection attempts (see [`ConnectionOptions`] for
        /// the defaults).
        ///
        /// ```
        /// use stampede_guard::{ConnectionOptions, Lock};
        ///
        /// let builder =
        ///     Lock::builder("sync").connection(ConnectionOptions::default().reconnect_retries(0));
        /// # let _ = builder;
        /// ```
        connection: ConnectionOptions;
    }

    /// Builds the lock. An in-memory lock (the default backend) is shared by its clones only;
    /// use [`Cache::lock`](crate::Cache::lock) for several locks on one memory store.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for a bad name or namespace; [`Error::Config`] for a bad URL.
    pub async fn build(self) -> Result<Lock, Error> {
        validate_namespace(&self.namespace)?;
        let keys = EntryKeys::new(&self.namespace, &self.name)?;
        Ok(Lock::from_parts(
            self.backend.open(&self.connection, None)?,
            keys,
            self.options,
        ))
    }
}
