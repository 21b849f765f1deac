//! The backends behind a cache: a handful of atomic operations that the cache and the lock are
//! built from. Every operation that compares and sets is atomic in the backend (a Lua script in
//! Redis, one critical section in memory), keyed by the owner's token.
//!
//! Explained in the guide: `docs/how-it-works.md`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use self::wakeup::Listener;
use crate::error::{BackendErrorKind, Error};
use crate::options::OnBackendError;
use crate::wire::key::EntryKeys;

mod backend;
pub(crate) mod breaker;
pub(crate) mod guarded;
mod memory;
pub(crate) mod quorum;
pub(crate) mod redis;
mod split;
pub(crate) mod wakeup;

pub(crate) use backend::Backend;
pub use breaker::BreakerOptions;
pub use memory::MemoryLimits;
pub(crate) use memory::MemoryStore;
pub use redis::ConnectionOptions;
pub(crate) use split::SplitStore;

/// A boxed future: keeps [`Store`] object-safe so one `Cache` type serves every backend.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a backend reports when it fails; the memory store never does.
pub(crate) type StoreResult<T> = Result<T, StoreError>;

/// A backend failure.
#[derive(Debug, Clone)]
pub(crate) enum StoreError {
    /// Redis failed (unreachable, timed out, an error reply), classified where it was met.
    Redis {
        /// What the Redis client reported.
        source: ::redis::RedisError,
        /// What kind of failure it is, by the table in `docs/guarantees.md`.
        kind: BackendErrorKind,
        /// The key the command was about, when the store knows it.
        key: Option<String>,
    },
    /// Redlock: fewer than a majority of the nodes answered.
    NoQuorum { reached: usize, needed: usize },
    /// The circuit breaker is open: the request was not sent (see `breaker.rs`).
    BreakerOpen {
        /// Unreachable or busy answers in a row that open it.
        failures: u32,
        /// How long the backend has been failing.
        failing_for: std::time::Duration,
    },
}

impl From<::redis::RedisError> for StoreError {
    /// Classifies the client's error once, here at the store's edge.
    fn from(e: ::redis::RedisError) -> Self {
        StoreError::Redis {
            kind: redis::classify(&e),
            source: e,
            key: None,
        }
    }
}

impl StoreError {
    /// Whether the request may have been carried out although it failed: it may have reached the
    /// server (a time-out, a connection dropped while waiting for the answer). Not when it was
    /// never sent (the connection refused or not up) or the server refused it with an error.
    pub(crate) fn may_have_been_applied(&self) -> bool {
        match self {
            // The client counts a refused connection as dropped; a request over it was never
            // sent.
            StoreError::Redis { source: e, .. } => {
                e.is_timeout() || (e.is_connection_dropped() && !e.is_connection_refusal())
            }
            // The quorum store undoes what it took before it reports no quorum.
            StoreError::NoQuorum { .. } => false,
            // Never sent.
            StoreError::BreakerOpen { .. } => false,
        }
    }

    /// Whether the connection was lost (dropped or reset, not refused or timed out): the client
    /// reconnects after such a failure, so a retry soon after may succeed.
    pub(crate) fn connection_lost(&self) -> bool {
        match self {
            StoreError::Redis { source: e, .. } => {
                e.is_connection_dropped() && !e.is_connection_refusal()
            }
            StoreError::NoQuorum { .. } | StoreError::BreakerOpen { .. } => false,
        }
    }

    /// What kind of failure it is; too few Redlock nodes is unreachability.
    pub(crate) fn kind(&self) -> BackendErrorKind {
        match self {
            StoreError::Redis { kind, .. } => *kind,
            StoreError::NoQuorum { .. } | StoreError::BreakerOpen { .. } => {
                BackendErrorKind::Unreachable
            }
        }
    }

    /// The same failure, about `key` (a Redis key) unless it already names one.
    pub(crate) fn about(mut self, key: &str) -> Self {
        if let StoreError::Redis {
            key: about @ None, ..
        } = &mut self
        {
            *about = Some(key.to_owned());
        }
        self
    }

    /// Whether `fallback` answers this failure by computing without the cache (or a `get` as a
    /// miss, a `set` as skipped): only [`OnBackendError::ComputeUncached`] does, and only for
    /// the kinds that pass by themselves (the table in [`BackendErrorKind`]).
    pub(crate) fn falls_back(&self, fallback: OnBackendError) -> bool {
        fallback == OnBackendError::ComputeUncached && self.kind().computes_uncached()
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Redis { source, .. } => source.fmt(f),
            StoreError::NoQuorum { reached, needed } => {
                write!(f, "{reached} nodes answered, {needed} needed")
            }
            StoreError::BreakerOpen {
                failures,
                failing_for,
            } => write!(
                f,
                "circuit breaker open: the backend failed {failures} times in a row (or stalled) \
                 and has been failing for {} ms; calls skip it until a probe finds it answering",
                failing_for.as_millis()
            ),
        }
    }
}

/// A store's failure becomes the caller's error here, in the store layer, so that `error.rs`
/// need not know the stores (it is a leaf every layer imports).
impl Error {
    /// The backend failed during `op`: [`Error::Backend`], or [`Error::NoQuorum`] for Redlock.
    pub(crate) fn backend(op: &'static str, source: StoreError) -> Self {
        match source {
            StoreError::Redis { source, kind, key } => Error::Backend {
                op,
                kind,
                key,
                source: crate::error::BackendError::new(source),
            },
            StoreError::NoQuorum { reached, needed } => Error::NoQuorum {
                op,
                reached,
                needed,
            },
            // Unreachable, and said so in the source's message: the breaker's own error, since
            // the client never saw the request.
            breaker @ StoreError::BreakerOpen { .. } => Error::Backend {
                op,
                kind: BackendErrorKind::Unreachable,
                key: None,
                source: crate::error::BackendError::new(crate::error::BreakerOpen::new(
                    breaker.to_string(),
                )),
            },
        }
    }
}

/// Value bytes as a store hands them out: owned (read off the network) or shared with the store
/// (the memory store, so a hit does not copy the value).
#[derive(Debug, Clone)]
pub(crate) enum Blob {
    Owned(Vec<u8>),
    Shared(std::sync::Arc<[u8]>),
}

impl std::ops::Deref for Blob {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Blob::Owned(v) => v,
            Blob::Shared(v) => v,
        }
    }
}

/// The answer of [`Store::get_many_with_epochs`]: the values, then the epochs.
pub(crate) type ManyWithEpochs = (Vec<Option<Blob>>, Vec<u64>);

/// The answer of [`Store::read_or_lock`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadOrLock {
    /// The value was there.
    Value(Vec<u8>),
    /// No value; the caller now holds the lock with this fencing token.
    Acquired { fence: u64 },
    /// Someone else holds the lock; it expires in `expires_in` unless renewed
    /// (`None` if the lock has no expiry, which this crate never sets).
    Held { expires_in: Option<Duration> },
}

/// The answer of [`Store::store_and_unlock`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stored {
    /// The value was written: no acquisition, `set` or invalidation happened since ours.
    pub written: bool,
    /// The lock was still ours and is now free.
    pub released: bool,
}

/// The fencing counter outlives the lock by this factor of the lease, so that a holder that
/// renews keeps it alive.
///
/// # The fencing guarantee
/// The counter of a key is kept at least as long as anything it guards: every bump and every
/// renewal keeps it `FENCE_RETENTION_LEASES` leases longer, and every write of a value keeps it
/// at least as long as that value (its TTL including the stale window; for ever if the value has
/// no expiry). No operation shortens it. So, per key and per store:
/// - while a lock or a value of the key exists, or within two leases of the last acquisition or
///   invalidation, tokens strictly increase: each acquisition, `set` and invalidation gets one
///   above every token handed out before (on Redis the higher of counter + 1 and the server
///   clock in microseconds);
/// - the residual case: when the counter is lost although the crate kept it (evicted under
///   `maxmemory`, `FLUSHDB`), goes back (a failover to a replica that missed its last bumps) or
///   lapsed after everything it guarded was gone, the next bump is the server clock in
///   microseconds. That is above every earlier token unless the server clock was stepped back
///   (or a replica's runs behind) by more than the time since the lost token was handed out.
///   Within the cache this can only refuse a write (a write needs the counter to equal its
///   token); a system that compares [`Lease::fencing_token`](crate::Lease::fencing_token)s may
///   see a lower one.
pub(crate) const FENCE_RETENTION_LEASES: u32 = 2;

/// How long the fencing counter is kept after a bump or a renewal under `lease`.
pub(crate) fn retention(lease: Duration) -> Duration {
    crate::time::saturate(lease.saturating_mul(FENCE_RETENTION_LEASES))
}

/// What a fenced write does once the fence allows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Write {
    /// Store these bytes for `ttl` ([`FOREVER`](crate::FOREVER): no expiry).
    Value { bytes: Vec<u8>, ttl: Duration },
    /// Delete the value: a failed refresh removing the stale value it was meant to replace.
    Delete,
    /// Replace the value's bytes and keep it alive at least `at_least` from now, never shorter
    /// than it already lives ([`FOREVER`](crate::FOREVER): no expiry): the fail-safe's
    /// throttled copy of a kept value, written after a failed computation.
    Keep { bytes: Vec<u8>, at_least: Duration },
}

/// The answer of [`LockStore::try_lock`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquire {
    /// The caller now holds the lock with this fencing token.
    Acquired { fence: u64 },
    /// Someone else holds it; it expires in `expires_in` unless renewed.
    Held { expires_in: Option<Duration> },
}

impl From<ReadOrLock> for Acquire {
    /// A read-or-lock that did not read the value answers like a plain lock attempt.
    fn from(answer: ReadOrLock) -> Self {
        match answer {
            ReadOrLock::Acquired { fence } => Acquire::Acquired { fence },
            ReadOrLock::Held { expires_in } => Acquire::Held { expires_in },
            // Not answered when the value is not read; "held" is the safe reading.
            ReadOrLock::Value(_) => Acquire::Held { expires_in: None },
        }
    }
}

impl From<Acquire> for ReadOrLock {
    fn from(answer: Acquire) -> Self {
        match answer {
            Acquire::Acquired { fence } => ReadOrLock::Acquired { fence },
            Acquire::Held { expires_in } => ReadOrLock::Held { expires_in },
        }
    }
}

/// What a lock needs of a backend. Implementations: every [`Store`], and the Redlock quorum
/// over several stores.
pub(crate) trait LockStore: Send + Sync + 'static {
    /// Takes the lock for `token` if it is free (bumping the fencing counter), or reports who
    /// holds it for how long.
    fn try_lock<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<Acquire>>;

    /// Extends the lock to `lease` from now if it is still `token`'s; false if it is not.
    fn extend<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<bool>>;

    /// Frees the lock if it is still `token`'s and wakes the waiters; false if it was not.
    fn unlock<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
    ) -> BoxFuture<'a, StoreResult<bool>>;

    /// Bumps the fencing counter without taking the lock and returns the new value: a number
    /// above every token handed out so far (used to fence values written through another store).
    fn next_fence<'a>(
        &'a self,
        keys: &'a EntryKeys,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<u64>>;

    /// Raises the fencing counter to at least `floor` (Redlock: the token chosen over a quorum
    /// must be remembered by that quorum, so any later quorum sees it), and keeps it at least
    /// `retention(lease)` longer. A `floor` of 0 only keeps a counter that exists.
    fn raise_fence<'a>(
        &'a self,
        keys: &'a EntryKeys,
        floor: u64,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<()>>;

    /// Records that a leader's run under `fence` starts now (by the store's clock), for `keep`;
    /// false, recording nothing, if a run of a newer term (a higher fence) is recorded.
    fn record_run<'a>(
        &'a self,
        keys: &'a EntryKeys,
        fence: u64,
        keep: Duration,
    ) -> BoxFuture<'a, StoreResult<bool>>;

    /// How long ago the last recorded run started, by the store's clock; `None` if none is.
    fn since_last_run<'a>(
        &'a self,
        keys: &'a EntryKeys,
    ) -> BoxFuture<'a, StoreResult<Option<Duration>>>;

    /// Registers for wake-ups on `keys.channel`. Every wake-up published after this returns
    /// reaches the listener.
    fn listen<'a>(&'a self, keys: &'a EntryKeys) -> BoxFuture<'a, StoreResult<Listener>>;

    /// How much of a lease the holder must give up for clock drift between the nodes that hold
    /// it (Redlock); nothing for a single store.
    fn clock_drift(&self, _lease: Duration) -> Duration {
        Duration::ZERO
    }
}

/// A backend. Implementations: [`MemoryStore`] and [`redis::RedisStore`].
pub(crate) trait Store: LockStore {
    /// Reads the value bytes, if any.
    fn get<'a>(&'a self, keys: &'a EntryKeys) -> BoxFuture<'a, StoreResult<Option<Blob>>>;

    /// If `read_value` and a value exists, returns it. Otherwise takes the lock for `token` if it
    /// is free (bumping the fencing counter), or reports who holds it for how long.
    /// `read_value = false` takes the lock even over a value, to replace bytes that do not decode.
    fn read_or_lock<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
        lease: Duration,
        read_value: bool,
    ) -> BoxFuture<'a, StoreResult<ReadOrLock>>;

    /// Carries out `write` (a value, or a delete) if the fencing counter still equals `fence`
    /// (nobody acquired, set or invalidated since); frees the lock if it is still `token`'s;
    /// wakes the waiters.
    fn store_and_unlock<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
        fence: u64,
        write: Write,
    ) -> BoxFuture<'a, StoreResult<Stored>>;

    /// Carries out `write` unless the fencing counter is already above `fence`, then records
    /// `fence` as the counter; wakes the waiters; true if written. The write rule when the tokens
    /// come from another lock store (a Redlock quorum): newer tokens win.
    fn write_fenced<'a>(
        &'a self,
        keys: &'a EntryKeys,
        fence: u64,
        write: Write,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<bool>>;

    /// Writes `value` unconditionally for `ttl` ([`FOREVER`](crate::FOREVER): no expiry), bumps the fencing counter (so in-flight computations do
    /// not overwrite it) and wakes the waiters.
    fn set<'a>(
        &'a self,
        keys: &'a EntryKeys,
        value: Vec<u8>,
        ttl: Duration,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<()>>;

    /// Deletes the value, bumps the fencing counter (refusing in-flight computations' writes) and
    /// wakes the waiters.
    fn invalidate<'a>(
        &'a self,
        keys: &'a EntryKeys,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<()>>;

    /// [`get`](Self::get) for many entries: on Redis, one `MGET` per chunk of at most
    /// `CHUNK_KEYS` entries, all sent at once (on a cluster, split per slot by the client). The
    /// answers are in the order of `entries`. The default asks one entry after another.
    fn get_many<'a>(
        &'a self,
        entries: &'a [&'a EntryKeys],
    ) -> BoxFuture<'a, StoreResult<Vec<Option<Blob>>>> {
        Box::pin(async move {
            let mut values = Vec::with_capacity(entries.len());
            for keys in entries {
                values.push(self.get(keys).await?);
            }
            Ok(values)
        })
    }

    /// [`read_or_lock`](Self::read_or_lock) for many entries, each with its own token, by the
    /// very same rule per entry: on Redis, one script call per chunk of at most `CHUNK_KEYS`
    /// entries (on a cluster, chunks of one slot's entries), all sent at once, so the rule is
    /// atomic per entry, not across a batch. One answer per entry, in order; a failed request fails every
    /// entry it carried (each may still have been granted: see
    /// [`StoreError::may_have_been_applied`]). The default asks one entry after another (the
    /// memory store, whose every step is atomic anyway, and a split store, whose Redlock quorum
    /// is taken per key).
    fn read_or_lock_many<'a>(
        &'a self,
        entries: &'a [(&'a EntryKeys, &'a str, bool)],
        lease: Duration,
    ) -> BoxFuture<'a, Vec<StoreResult<ReadOrLock>>> {
        Box::pin(async move {
            let mut answers = Vec::with_capacity(entries.len());
            for (keys, token, read_value) in entries {
                answers.push(self.read_or_lock(keys, token, lease, *read_value).await);
            }
            answers
        })
    }

    /// [`invalidate`](Self::invalidate) for many entries: on Redis, one script call per chunk of
    /// at most `CHUNK_KEYS` entries (per slot on a cluster), all sent at once. Every entry is tried; the first
    /// failure is reported. The default invalidates one entry after another.
    fn invalidate_many<'a>(
        &'a self,
        entries: &'a [&'a EntryKeys],
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<()>> {
        Box::pin(async move {
            let mut first_error = None;
            for keys in entries {
                if let Err(e) = self.invalidate(keys, lease).await {
                    first_error.get_or_insert(e);
                }
            }
            first_error.map_or(Ok(()), Err)
        })
    }

    /// The namespace's clock now: microseconds on Redis (the server's `TIME`, on the node that
    /// holds `clock`, the namespace's clear key, so that every epoch and every birth of a
    /// namespace is read from one clock even on a cluster); a counter in memory. A value records
    /// it as its birth when its computation starts (see `cache/tags.rs`).
    fn born<'a>(&'a self, clock: &'a str) -> BoxFuture<'a, StoreResult<u64>>;

    /// The epochs under `names` (clear and tag keys), in order: 0 for one never raised.
    fn epochs<'a>(&'a self, names: &'a [String]) -> BoxFuture<'a, StoreResult<Vec<u64>>>;

    /// Raises each epoch to at least `floor` and above what it was, for ever (no expiry), and
    /// tells the near tiers (announced like an entry's change). One request per name, all sent
    /// at once; the first failure is reported, after every name was tried.
    fn raise_epochs<'a>(
        &'a self,
        names: &'a [String],
        floor: u64,
    ) -> BoxFuture<'a, StoreResult<()>>;

    /// [`get`](Self::get) and [`epochs`](Self::epochs) of `names` together: on Redis one `MGET`
    /// (on a cluster, split per slot by the client and sent at once).
    fn get_with_epochs<'a>(
        &'a self,
        keys: &'a EntryKeys,
        names: &'a Arc<[String]>,
    ) -> BoxFuture<'a, StoreResult<(Option<Blob>, Vec<u64>)>> {
        Box::pin(async move {
            let value = self.get(keys).await?;
            Ok((value, self.epochs(names).await?))
        })
    }

    /// [`get_many`](Self::get_many) and [`epochs`](Self::epochs) of `names`, sent at once.
    fn get_many_with_epochs<'a>(
        &'a self,
        entries: &'a [&'a EntryKeys],
        names: &'a [String],
    ) -> BoxFuture<'a, StoreResult<ManyWithEpochs>> {
        Box::pin(async move {
            let (values, epochs) = tokio::join!(self.get_many(entries), self.epochs(names));
            Ok((values?, epochs?))
        })
    }

    /// Wakes the waiters of `keys` without changing anything (a split store's value side, when
    /// the lock side freed a lock without a value landing).
    fn wake<'a>(&'a self, keys: &'a EntryKeys) -> BoxFuture<'a, StoreResult<()>>;

    /// Asks the backend whether it answers (`PING` on Redis): the circuit breaker's probe and
    /// the health report's check. The embedded store always answers.
    fn ping(&self) -> BoxFuture<'_, StoreResult<()>> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// Wall-clock milliseconds since the Unix epoch, by which values' freshness is stamped and
    /// judged. Redis: the server's clock, as estimated from this process (see `clock.rs`), so
    /// machines whose clocks disagree still agree on freshness. Memory: the clock at creation
    /// plus `tokio::time` since, so paused-time tests move it.
    fn now_ms(&self) -> u64;

    /// Whether [`now_ms`](Self::now_ms) is calibrated (or needs no calibration).
    fn clock_synced(&self) -> bool {
        true
    }

    /// The circuit breaker in front of this store, if it has one (Redis does, by default).
    fn breaker(&self) -> Option<&breaker::Breaker> {
        None
    }

    /// The embedded store itself, whose hit path skips decoding ([`MemoryStore::fresh`]).
    fn as_memory(&self) -> Option<&MemoryStore> {
        None
    }

    /// Calibrates [`now_ms`](Self::now_ms) once, before the first call that stamps or judges
    /// freshness; afterwards a background task keeps it calibrated.
    fn sync_clock(&self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }
}

/// The system clock in milliseconds since the Unix epoch (0 if the clock is before 1970).
pub(crate) fn system_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Milliseconds for an expiry argument of a script: at least 1, since Redis refuses `PX 0`, and
/// 0 for [`FOREVER`](crate::FOREVER), which the scripts read as "no expiry".
pub(crate) fn expiry_ms(d: Duration) -> u64 {
    if d >= crate::time::FOREVER {
        return 0;
    }
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}
