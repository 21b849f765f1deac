//! The backends behind a cache: a handful of atomic operations that the cache and the lock are
//! built from. Every operation that compares and sets is atomic in the backend (a Lua script in
//! Redis, one critical section in memory), keyed by the owner's token.
//!
//! Explained in the guide: `docs/how-it-works.md`.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use self::wakeup::Listener;
use crate::error::{BackendErrorKind, Error};
use crate::wire::key::EntryKeys;

mod backend;
pub(crate) mod breaker;
mod calls;
pub(crate) mod guarded;
mod memory;
mod op;
pub(crate) mod quorum;
#[cfg(test)]
pub(crate) mod recording;
pub(crate) mod redis;
#[cfg(feature = "simulation")]
pub(crate) mod simulated;
mod split;
pub(crate) mod wakeup;

pub(crate) use backend::Backend;
pub use breaker::BreakerOptions;
pub(crate) use calls::{LockStoreExt, StoreExt};
pub use memory::MemoryLimits;
pub(crate) use memory::MemoryStore;
pub(crate) use op::{Class, LockOp, Op, Reply};
pub use redis::{Capabilities, ConnectionOptions, LockWrite, ServerKind};
pub(crate) use redis::{ProbeError, Probed};
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
    /// A store answered an operation with a reply of another kind: a bug of this crate (see
    /// `op.rs`), reported instead of a wrong answer.
    WrongReply {
        /// The operation.
        op: &'static str,
        /// The reply's variant.
        reply: &'static str,
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
            // Carried out, whatever it was answered.
            StoreError::WrongReply { .. } => true,
        }
    }

    /// Whether the connection was lost (dropped or reset, not refused or timed out): the client
    /// reconnects after such a failure, so a retry soon after may succeed.
    pub(crate) fn connection_lost(&self) -> bool {
        match self {
            StoreError::Redis { source: e, .. } => {
                e.is_connection_dropped() && !e.is_connection_refusal()
            }
            StoreError::NoQuorum { .. }
            | StoreError::BreakerOpen { .. }
            | StoreError::WrongReply { .. } => false,
        }
    }

    /// What kind of failure it is; too few Redlock nodes is unreachability.
    pub(crate) fn kind(&self) -> BackendErrorKind {
        match self {
            StoreError::Redis { kind, .. } => *kind,
            StoreError::NoQuorum { .. } | StoreError::BreakerOpen { .. } => {
                BackendErrorKind::Unreachable
            }
            StoreError::WrongReply { .. } => BackendErrorKind::Other,
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
            StoreError::WrongReply { op, reply } => write!(
                f,
                "the store answered {op} with a {reply} reply (a bug of stampede-guard: please \
                 report it)"
            ),
        }
    }
}

/// Only [`StoreError::WrongReply`] reaches a caller as itself (the source of its
/// [`Error::Backend`]); the others are unpacked in [`Error::backend`].
impl std::error::Error for StoreError {}

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
            wrong @ StoreError::WrongReply { .. } => Error::Backend {
                op,
                kind: BackendErrorKind::Other,
                key: None,
                // A bug of this crate, not the client's: the store's own error is the source.
                source: crate::error::BackendError::new(wrong),
            },
        }
    }
}

/// Value bytes as a store hands them out: owned (read off the network) or shared with the store
/// (the memory store, so a hit does not copy the value).
#[derive(Clone)]
pub(crate) enum Blob {
    Owned(Vec<u8>),
    Shared(std::sync::Arc<[u8]>),
}

/// The bytes, whoever holds them: two stores' answers read alike (see `recording.rs`).
impl std::fmt::Debug for Blob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Blob").field(&&**self).finish()
    }
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

/// The answer of [`StoreExt::get_many_with_epochs`]: the values, then the epochs.
pub(crate) type ManyWithEpochs = (Vec<Option<Blob>>, Vec<u64>);

/// What a lock's holder stored beside its lock (with the `opentelemetry` feature): its fencing
/// token and its W3C `traceparent`, bytes as read back, for the cache to check
/// ([`StoreExt::read_or_lock_traced`]). Bounded by the script that reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HolderTrace {
    /// The holder's fencing token: the fence the trace was stored under, which is still the
    /// counter's (no acquisition or invalidation since).
    pub(crate) fence: u64,
    /// The holder's `traceparent`, unchecked.
    pub(crate) traceparent: Vec<u8>,
}

/// The most bytes of a [`HolderTrace`] as stored (`"<fence> <traceparent>"`): a longer one is
/// not read back (another program's, or a corrupted key), so a read of it stays bounded.
pub(crate) const MAX_HOLDER_TRACE: usize = 160;

/// The answer of [`StoreExt::read_or_lock`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadOrLock {
    /// The value was there.
    Value(Vec<u8>),
    /// No value; the caller now holds the lock with this fencing token. `born`: the namespace's
    /// clock ([`Op::Born`]) read in the same atomic step, where the store can read
    /// that clock there (one Redis server, the memory store), so that the computation needs no
    /// request of its own for its value's birth; `None` elsewhere (a cluster, where the clock is
    /// on the node of the clear key, not the entry's; a lock in another store).
    Acquired { fence: u64, born: Option<u64> },
    /// Someone else holds the lock; it expires in `expires_in` unless renewed
    /// (`None` if the lock has no expiry, which this crate never sets).
    Held { expires_in: Option<Duration> },
}

impl ReadOrLock {
    /// The answer without the birth read with a grant: a store whose clock is not where the
    /// script ran (a cluster's entry slot) reads births apart.
    pub(crate) fn without_birth(self) -> Self {
        match self {
            ReadOrLock::Acquired { fence, .. } => ReadOrLock::Acquired { fence, born: None },
            other => other,
        }
    }
}

/// The answer of [`StoreExt::store_and_unlock`].
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

/// The answer of [`LockStoreExt::try_lock`].
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
            ReadOrLock::Acquired { fence, .. } => Acquire::Acquired { fence },
            ReadOrLock::Held { expires_in } => Acquire::Held { expires_in },
            // Not answered when the value is not read; "held" is the safe reading.
            ReadOrLock::Value(_) => Acquire::Held { expires_in: None },
        }
    }
}

impl From<Acquire> for ReadOrLock {
    fn from(answer: Acquire) -> Self {
        match answer {
            Acquire::Acquired { fence } => ReadOrLock::Acquired { fence, born: None },
            Acquire::Held { expires_in } => ReadOrLock::Held { expires_in },
        }
    }
}

/// What a look at an entry's lock found ([`LockOp::Peek`]), without changing it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct LockPeek {
    /// The holder's owner token and its lease left (`None`: no expiry, which this crate never
    /// sets), if the lock is held.
    pub holder: Option<(String, Option<Duration>)>,
    /// The fencing counter, if it exists: the last token handed out (by an acquisition, a
    /// `set` or an invalidation).
    pub fence: Option<u64>,
}

/// What a lock needs of a backend: the lock operations, as values, and the wake-up feed.
/// Implementations: every [`Store`], and the Redlock quorum over several stores. The typed
/// calls (`try_lock`, `extend`, ...) are [`LockStoreExt`]'s.
pub(crate) trait LockStore: Send + Sync + 'static {
    /// Carries out `op` (atomically, on one store) and answers with the reply `op` names.
    fn lock<'a>(&'a self, op: LockOp<'a>) -> BoxFuture<'a, StoreResult<Reply>>;

    /// Registers for wake-ups on `keys.channel`. Every wake-up published after this returns
    /// reaches the listener.
    fn listen<'a>(&'a self, keys: &'a EntryKeys) -> BoxFuture<'a, StoreResult<Listener>>;

    /// How much of a lease the holder must give up for clock drift. One server counts the
    /// lease from the request's arrival on its clock, the holder from before sending it on its
    /// own, which may run slow by up to [`MAX_DRIFT_PPM`](crate::time::MAX_DRIFT_PPM): a
    /// request that travels faster than that drift would otherwise leave the holder trusting
    /// a lock the server has let go. A Redlock quorum gives up more, for its nodes' drift.
    fn clock_drift(&self, lease: Duration) -> Duration {
        crate::time::drift_allowance(lease)
    }

    /// What the server allows, shared with the store's own probes; `None` for a store that
    /// is not one Redis server (the embedded store, a cluster, a quorum, a wrapper: the
    /// builder asks before it wraps).
    fn capabilities(&self) -> Option<std::sync::Arc<Probed>> {
        None
    }

    /// Probes the server now, within `timeout` (see [`capabilities`](Self::capabilities));
    /// `Ok` at once for a store without capabilities.
    fn probe_now(&self, _timeout: Duration) -> BoxFuture<'_, Result<(), ProbeError>> {
        Box::pin(async { Ok(()) })
    }
}

/// A backend: the value operations, as values, and the clock freshness is judged by.
/// Implementations: [`MemoryStore`] and [`redis::RedisStore`], and the wrappers over them
/// ([`SplitStore`], `GuardedStore`, `Recording`). The typed calls (`get`, `read_or_lock`, ...)
/// are [`StoreExt`]'s.
pub(crate) trait Store: LockStore {
    /// Carries out `op` and answers with the reply `op` names.
    fn run<'a>(&'a self, op: Op<'a>) -> BoxFuture<'a, StoreResult<Reply>>;

    /// The clock values' freshness is stamped and judged by.
    fn clock(&self) -> &dyn Clock;
}

/// A store's clock: wall-clock milliseconds since the Unix epoch, by which values' freshness
/// is stamped and judged. Redis: the server's clock, as estimated from this process (see
/// `redis/clock.rs`), so machines whose clocks disagree still agree on freshness. Memory: the
/// clock at creation plus `tokio::time` since, so paused-time tests move it.
pub(crate) trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch, now.
    fn now_ms(&self) -> u64;

    /// Whether [`now_ms`](Self::now_ms) is calibrated (or needs no calibration).
    fn is_synced(&self) -> bool {
        true
    }

    /// Calibrates [`now_ms`](Self::now_ms) once, before the first call that stamps or judges
    /// freshness; afterwards a background task keeps it calibrated.
    fn sync(&self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }

    /// Whether the store's births ([`Op::Born`]) are a time, in microseconds since the Unix
    /// epoch (Redis: the server's `TIME`), so that a value's age can be told from its birth;
    /// the embedded store counts births instead.
    fn births_are_micros(&self) -> bool {
        false
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
