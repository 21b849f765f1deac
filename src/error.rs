//! The crate's one error type, and the shared, typed error of a failed computation.
//!
//! Explained in the guide: `docs/guarantees.md` (what each failure returns).

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

mod backend;
mod not_shared;

pub use backend::BackendError;
pub(crate) use backend::BreakerOpen;
pub(crate) use not_shared::marked_not_shared;
pub use not_shared::NotShared;

/// Everything that can go wrong in a call of this crate.
///
/// One type for every call (`get`, `set`, `invalidate`, `lock`, the `get_or_compute` family,
/// building a cache), so a handler can `?` all of them into one error, or into `anyhow::Error`
/// or `Box<dyn std::error::Error + Send + Sync>`. The computation's own error is kept, typed, in
/// [`Error::Compute`]: get it back with [`Error::compute_error`].
///
/// `Error` is `Clone` so that one failure can be handed to every caller that was waiting on the
/// same computation (the computation's error is shared, not copied).
///
/// Its `Display` is one sentence about what this crate saw; the underlying cause (the
/// computation's error, the Redis client's error, the codec's error) is its
/// [`source`](std::error::Error::source) and is not repeated in the sentence, as is the Rust
/// convention. Print the whole chain with anyhow's `{:#}`, with `tracing`'s error recording
/// (`error = &e as &dyn std::error::Error`), or by walking `source()`; `{:?}` shows it too.
///
/// ```
/// use stampede_guard::{Cache, Error};
/// use std::error::Error as _;
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let cache = Cache::in_memory();
/// let result: Result<u32, Error> = cache
///     .get_or_compute("2019-05", Duration::from_secs(60), || async {
///         Err(std::io::Error::other("the database is down"))
///     })
///     .await;
/// let error = result.unwrap_err();
/// let io = error.compute_error::<std::io::Error>().expect("the computation's own error");
/// assert_eq!(io.to_string(), "the database is down");
/// assert_eq!(error.to_string(), "the computation failed");
/// assert_eq!(error.source().unwrap().to_string(), "the database is down");
/// # }
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Error {
    /// The computation returned this error. Nothing was cached; every caller that waited on this
    /// computation in this process receives the same error. If the error says its source is down
    /// ([`Error::is_source_unavailable`], [`SourceUnavailable`]), it is an outage, not a bug.
    Compute(ComputeError),
    /// The backend failed during `op`: unreachable (connection refused or dropped, a time-out),
    /// or it answered with an error (a refusal, a full memory, a busy server). `kind` says which,
    /// classified once where the store met it; the table of what each kind does is in
    /// [`BackendErrorKind`]. An unreachable server is reconnected by itself; a refusal needs an
    /// operator.
    Backend {
        /// The operation that failed, e.g. `"get"` or `"read-or-lock"`.
        op: &'static str,
        /// What kind of failure it was (see [`Error::backend_kind`]).
        kind: BackendErrorKind,
        /// The Redis key the refused or failed command was about, when one was (e.g.
        /// `reports:{2019-05}`): the message names it and the key pattern of its namespace.
        key: Option<String>,
        /// What the backend's client reported (a `redis::RedisError`, which
        /// [`source`](std::error::Error::source) gives back for a downcast), or why the request was
        /// not sent (the circuit breaker was open).
        source: BackendError,
    },
    /// Another caller held the key's lock for longer than the call's wait bound
    /// ([`CallOptions::wait_timeout`](crate::CallOptions::wait_timeout)).
    WaitTimeout {
        /// The user's key.
        key: String,
        /// How long this call waited.
        waited: Duration,
    },
    /// The computation of `key` was cancelled by its hard timeout
    /// ([`CallOptions::max_hold`](crate::CallOptions::max_hold)) and there was no fail-safe
    /// fallback to serve instead. Its lock was freed at once; its value will not land.
    ComputeTimeout {
        /// The user's key.
        key: String,
        /// How long the computation ran before it was cancelled.
        after: Duration,
    },
    /// The key (or namespace) cannot be used; `reason` says why. Only the key's first
    /// [`KEY_PREFIX_BYTES`](Self::KEY_PREFIX_BYTES) bytes are kept, so that an error about a huge
    /// key stays small.
    InvalidKey {
        /// The start of the offending key: at most 64 bytes, cut on a character boundary.
        key_prefix: String,
        /// The offending key's whole length in bytes.
        key_len: usize,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The value could not be encoded by the cache's codec.
    Encode(Arc<dyn std::error::Error + Send + Sync>),
    /// The encoded value is larger than the documented limit
    /// ([`MAX_VALUE_BYTES`](crate::MAX_VALUE_BYTES)).
    ValueTooLarge {
        /// Size of the encoded value in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// The configuration is unusable (for example a Redis URL that does not parse).
    Config(String),
    /// The computation of this key failed recently (in this or another process) and the failure
    /// is remembered for [`CallOptions::negative_ttl`](crate::CallOptions::negative_ttl).
    RecentFailure {
        /// The user's key.
        key: String,
        /// The failed computation's error message.
        message: String,
    },
    /// Redlock: fewer than a majority of the nodes answered during `op`, so nothing can be decided.
    NoQuorum {
        /// The operation, e.g. `"acquire"`.
        op: &'static str,
        /// How many nodes answered.
        reached: usize,
        /// How many a majority is.
        needed: usize,
    },
    /// A batch computation ([`Cache::get_or_compute_many`](crate::Cache::get_or_compute_many))
    /// returned no value for this key, which it was asked for. Nothing was cached for it and its
    /// lock was freed at once, so the next call computes it again (a missing row is not a value:
    /// return one, such as an empty report, if "nothing" is the answer to cache).
    MissingFromBatch {
        /// The user's key.
        key: String,
    },
    /// A many-key call ([`Cache::get_or_compute_many`](crate::Cache::get_or_compute_many),
    /// [`fetch_many`](crate::Cache::fetch_many), [`invalidate_many`](crate::Cache::invalidate_many))
    /// was given more keys than [`MAX_BATCH_KEYS`](crate::MAX_BATCH_KEYS). Nothing was read,
    /// locked or invalidated: split the keys over several calls.
    TooManyKeys {
        /// How many keys the call was given.
        keys: usize,
        /// The limit.
        limit: usize,
    },
    /// A value was given more tags than [`MAX_TAGS`](crate::MAX_TAGS) (those of the call's
    /// [`CallOptions::tags`](crate::CallOptions::tags) and of its
    /// [`Computed::tags`](crate::Computed::tags), each counted once). Nothing was written.
    TooManyTags {
        /// The key of the value.
        key: String,
        /// How many distinct tags it was given.
        tags: usize,
        /// The limit.
        limit: usize,
    },
    /// The write could not reach the backend (unreachable or busy) and the
    /// [auto-recovery](crate::CacheBuilder::auto_recovery) queue is full: the write was neither
    /// applied nor queued. Nothing queued before was dropped to make room. Redis has been out
    /// for a while: retry the write later (or answer 503 so the client does), and raise the
    /// bound ([`RecoveryOptions`](crate::RecoveryOptions)) if outages this long are expected.
    RecoveryQueueFull {
        /// How many keys wait in the queue.
        queued: usize,
        /// The bound the write would have passed.
        limit: RecoveryLimit,
    },
    /// The lock was no longer held when it was released: its lease ran out (and perhaps another
    /// holder took it). Work done under it may have overlapped with another holder's; the
    /// fencing token is what protects the systems written to.
    NotHeld {
        /// The lock's name.
        name: String,
    },
}

impl Error {
    /// How much of an invalid key [`Error::InvalidKey`] keeps (64 bytes).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use stampede_guard::{Cache, Error};
    /// let huge = "k".repeat(10 << 20);
    /// let error = Cache::in_memory().get::<u8>(&huge).await.unwrap_err();
    /// assert!(matches!(error, Error::InvalidKey { ref key_prefix, key_len, .. }
    ///     if key_prefix.len() == Error::KEY_PREFIX_BYTES && key_len == 10 << 20));
    /// # }
    /// ```
    pub const KEY_PREFIX_BYTES: usize = 64;

    /// Whether this is a failure of the backend: Redis unreachable, timed out or refusing
    /// ([`Error::Backend`]), or too few Redlock nodes answering ([`Error::NoQuorum`]). These are
    /// the errors counted as `backend_errors` in [`Stats`](crate::Stats) and answered with a 503
    /// by the `axum` integration.
    ///
    /// ```
    /// let lost = stampede_guard::Error::NoQuorum { op: "acquire", reached: 1, needed: 2 };
    /// assert!(lost.is_backend());
    /// ```
    pub fn is_backend(&self) -> bool {
        matches!(self, Error::Backend { .. } | Error::NoQuorum { .. })
    }

    /// What kind of backend failure this is, if it is one ([`is_backend`](Self::is_backend)):
    /// classified once, where the store met the Redis client's error. Too few Redlock nodes
    /// answering ([`Error::NoQuorum`]) is [`BackendErrorKind::Unreachable`].
    ///
    /// ```
    /// use stampede_guard::{BackendErrorKind, Error};
    /// let lost = Error::NoQuorum { op: "acquire", reached: 1, needed: 2 };
    /// assert_eq!(lost.backend_kind(), Some(BackendErrorKind::Unreachable));
    /// assert_eq!(Error::Config("x".into()).backend_kind(), None);
    /// ```
    pub fn backend_kind(&self) -> Option<BackendErrorKind> {
        match self {
            Error::Backend { kind, .. } => Some(*kind),
            Error::NoQuorum { .. } => Some(BackendErrorKind::Unreachable),
            _ => None,
        }
    }

    /// Whether the backend could not be reached: connection refused or dropped, a time-out
    /// (a black-holed connection ends as one), or too few Redlock nodes answering. The
    /// connection retries by itself; this is what an outage looks like.
    pub fn is_unreachable(&self) -> bool {
        self.backend_kind() == Some(BackendErrorKind::Unreachable)
    }

    /// Whether Redis refused the command: by permission (`NOPERM`, `NOAUTH`, `WRONGPASS`) or by
    /// role (`READONLY`, `MASTERDOWN`: the URL points at a replica). Retrying cannot help: the
    /// configuration (the ACL user, the URL, the namespace) must change.
    ///
    /// ```
    /// use stampede_guard::BackendErrorKind;
    /// assert!(BackendErrorKind::RefusedPermission.is_refused());
    /// assert!(BackendErrorKind::RefusedRole.is_refused());
    /// assert!(!BackendErrorKind::Unreachable.is_refused());
    /// ```
    pub fn is_refused(&self) -> bool {
        self.backend_kind()
            .is_some_and(BackendErrorKind::is_refused)
    }

    /// Whether Redis refused a write because its memory is full (`OOM`: `maxmemory` reached
    /// under the `noeviction` policy).
    pub fn is_out_of_memory(&self) -> bool {
        self.backend_kind() == Some(BackendErrorKind::OutOfMemory)
    }

    /// Whether Redis is up but cannot answer for now: a script running past its time limit
    /// (`BUSY`), a dataset still loading (`LOADING`), a cluster slot moving or down
    /// (`TRYAGAIN`, `CLUSTERDOWN`).
    pub fn is_busy(&self) -> bool {
        self.backend_kind() == Some(BackendErrorKind::Busy)
    }

    /// Whether the call gave up waiting for another caller's computation.
    ///
    /// ```
    /// use std::time::Duration;
    /// let waited = stampede_guard::Error::WaitTimeout { key: "k".into(), waited: Duration::from_secs(30) };
    /// assert!(waited.is_wait_timeout());
    /// ```
    pub fn is_wait_timeout(&self) -> bool {
        matches!(self, Error::WaitTimeout { .. })
    }

    /// Whether the computation failed ([`Error::Compute`]).
    ///
    /// ```
    /// use stampede_guard::{ComputeError, Error};
    /// assert!(Error::Compute(ComputeError::new("no rows".to_string())).is_compute());
    /// ```
    pub fn is_compute(&self) -> bool {
        matches!(self, Error::Compute(_))
    }

    /// The computation's own error, if this is [`Error::Compute`] and the computation's error
    /// type is `E` (the `E` of the `Result` its future returned).
    ///
    /// ```
    /// use stampede_guard::{ComputeError, Error};
    /// let error = Error::Compute(ComputeError::new(std::io::Error::other("disk full")));
    /// assert_eq!(error.compute_error::<std::io::Error>().unwrap().to_string(), "disk full");
    /// assert!(error.compute_error::<String>().is_none(), "another type");
    /// ```
    pub fn compute_error<E: 'static>(&self) -> Option<&E> {
        match self {
            Error::Compute(e) => e.downcast_ref(),
            _ => None,
        }
    }

    /// Whether the computation failed because its source (the database, the upstream service)
    /// is unavailable: its error is, or holds in its chain of
    /// [`source`](std::error::Error::source)s, a [`SourceUnavailable`], or a
    /// [`std::io::Error`] of a lost connection (refused, reset, aborted, not connected, timed
    /// out, broken pipe, host or network unreachable, network down). The `axum` integration
    /// answers these with a 503 and `Retry-After` instead of a 500.
    ///
    /// The crate sees into the computation's error only when it is a [`SourceUnavailable`], a
    /// [`std::io::Error`], a `Box<dyn std::error::Error + Send + Sync>` or an
    /// `Arc<dyn std::error::Error + Send + Sync>` (a computation's error needs only `Display +
    /// Debug`, so other types are opaque: see [`SourceUnavailable`] for wrapping your own), or
    /// this crate's [`Error`].
    ///
    /// With feature `sqlx`, a `sqlx::Error` (returned as is, or anywhere in the chain) counts
    /// when it says the database is down or busy: a pool time-out or closed pool, I/O, a
    /// crashed worker, or a database error with SQLSTATE `57P01` (admin_shutdown, also a
    /// terminated connection), `57P02`, `57P03` (cannot_connect_now), `53300`
    /// (too_many_connections), class `08` (connection exception), `40001` (serialization
    /// failure) or `40P01` (deadlock). A syntax, constraint or missing-relation error does not:
    /// it stays a 500. Without it, a pool's time-out (sqlx's `PoolTimedOut`, deadpool's and
    /// bb8's `TimedOut`) is no I/O error: wrap it in [`SourceUnavailable`] yourself.
    ///
    /// ```
    /// use stampede_guard::{Cache, Error, SourceUnavailable};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let cache = Cache::in_memory();
    /// let down: Result<u32, Error> = cache
    ///     .get_or_compute("2019-05", Duration::from_secs(60), || async {
    ///         Err(SourceUnavailable::new("the reports database is down"))
    ///     })
    ///     .await;
    /// assert!(down.unwrap_err().is_source_unavailable());
    ///
    /// let refused: Result<u32, Error> = cache
    ///     .get_or_compute("2019-06", Duration::from_secs(60), || async {
    ///         Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
    ///     })
    ///     .await;
    /// assert!(refused.unwrap_err().is_source_unavailable());
    ///
    /// let bug: Result<u32, Error> = cache
    ///     .get_or_compute("2019-07", Duration::from_secs(60), || async {
    ///         Err("no such column: month".to_string())
    ///     })
    ///     .await;
    /// assert!(!bug.unwrap_err().is_source_unavailable());
    /// # }
    /// ```
    pub fn is_source_unavailable(&self) -> bool {
        self.unavailable_source().is_some()
    }

    /// What the computation's error says of its unavailable source, if it says so (see
    /// [`is_source_unavailable`](Self::is_source_unavailable)).
    pub(crate) fn unavailable_source(&self) -> Option<Unavailable> {
        match self {
            Error::Compute(e) => e.unavailable_source(),
            _ => None,
        }
    }

    /// The computation failed with `error`.
    pub(crate) fn compute<E>(error: E) -> Self
    where
        E: fmt::Display + fmt::Debug + Send + Sync + 'static,
    {
        Error::Compute(ComputeError::new(error))
    }

    /// `key` was refused for `reason`; keeps only its start, so the error stays small.
    pub(crate) fn invalid_key(key: &str, reason: &'static str) -> Self {
        let mut end = key.len().min(Self::KEY_PREFIX_BYTES);
        while !key.is_char_boundary(end) {
            end -= 1;
        }
        Error::InvalidKey {
            key_prefix: key[..end].to_owned(),
            key_len: key.len(),
            reason,
        }
    }

    // `Error::backend(op, store_error)`, which makes `Backend` or `NoQuorum` of a store's failure,
    // is defined beside `StoreError` in `store/mod.rs`: the store layer converts its own error,
    // so this file imports no layer and every layer may import it.

    /// The error and its sources on one line (`outer: cause: cause`), for this crate's log lines.
    pub(crate) fn chain(&self) -> impl fmt::Display + '_ {
        Chain(self)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // The computation's, the client's and the codec's errors are the source: not repeated.
            Error::Compute(_) => write!(f, "the computation failed"),
            Error::Backend {
                op,
                kind,
                key,
                source,
            } => explain_backend(f, op, *kind, key.as_deref(), source),
            Error::WaitTimeout { key, waited } => write!(
                f,
                "gave up on key {key:?} after waiting {waited:?} for another caller's computation \
                 (raise CallOptions::wait_timeout if computations take longer)"
            ),
            Error::ComputeTimeout { key, after } => write!(
                f,
                "the computation of {key:?} was cancelled after {after:?} by its hard timeout \
                 (CallOptions::max_hold), with no fail-safe value to serve instead"
            ),
            Error::InvalidKey {
                key_prefix,
                key_len,
                reason,
            } => {
                if key_prefix.len() == *key_len {
                    write!(f, "invalid key {key_prefix:?}: {reason}")
                } else {
                    write!(f, "invalid key {key_prefix:?}... ({key_len} bytes): {reason}")
                }
            }
            Error::Encode(_) => write!(f, "the value could not be encoded"),
            Error::ValueTooLarge { size, limit } => write!(
                f,
                "the encoded value is {size} bytes, over the limit of {limit} bytes"
            ),
            Error::Config(msg) => write!(f, "invalid configuration: {msg}"),
            Error::RecentFailure { key, message } => write!(
                f,
                "the computation of {key:?} failed recently and is not retried yet: {message}"
            ),
            Error::NoQuorum {
                op,
                reached,
                needed,
            } => write!(
                f,
                "no quorum during {op}: {reached} Redlock nodes answered, {needed} needed (are the nodes up?)"
            ),
            Error::MissingFromBatch { key } => write!(
                f,
                "the batch computation returned no value for key {key:?}, which it was asked for"
            ),
            Error::TooManyKeys { keys, limit } => write!(
                f,
                "{keys} keys in one call, over the limit of {limit} (MAX_BATCH_KEYS); split them over several calls"
            ),
            Error::TooManyTags { key, tags, limit } => write!(
                f,
                "the value of key {key:?} was given {tags} tags, over the limit of {limit} (MAX_TAGS); nothing was written"
            ),
            Error::RecoveryQueueFull { queued, limit } => write!(
                f,
                "the backend is unavailable and the auto-recovery queue is full ({queued} keys \
                 queued, {limit}): this write was neither applied nor queued; retry it later, \
                 or raise RecoveryOptions if outages this long are expected"
            ),
            Error::NotHeld { name } => write!(
                f,
                "lock {name:?} was no longer held: its lease ran out or another holder took it"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Compute(e) => Some(e),
            // The client's own error, not its wrapper, so that it downcasts as it did.
            Error::Backend { source, .. } => Some(source.get_ref()),
            Error::Encode(e) => Some(&**e),
            _ => None,
        }
    }
}

/// A sqlx error as a failed computation (feature `sqlx`), so that `?` works in a computation
/// or a `#[cached]` function returning this crate's [`Error`]. A down or busy database counts as
/// an unavailable source ([`Error::is_source_unavailable`]: a 503 in `web`); any other sqlx
/// error stays a plain failure (a 500).
///
/// ```
/// use stampede_guard::Error;
///
/// assert!(Error::from(sqlx::Error::PoolTimedOut).is_source_unavailable());
/// assert!(!Error::from(sqlx::Error::RowNotFound).is_source_unavailable());
/// ```
#[cfg(feature = "sqlx")]
impl From<sqlx::Error> for Error {
    fn from(error: sqlx::Error) -> Self {
        Error::compute(error)
    }
}

/// The bound of the auto-recovery queue that a write would have passed
/// ([`Error::RecoveryQueueFull`]), as set by [`RecoveryOptions`](crate::RecoveryOptions).
///
/// ```
/// use stampede_guard::RecoveryLimit;
/// assert_eq!(RecoveryLimit::Entries(10_000).to_string(), "limit 10000 keys");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecoveryLimit {
    /// [`RecoveryOptions::max_entries`](crate::RecoveryOptions::max_entries): this many keys.
    Entries(usize),
    /// [`RecoveryOptions::max_bytes`](crate::RecoveryOptions::max_bytes): this many value bytes.
    Bytes(usize),
}

impl fmt::Display for RecoveryLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecoveryLimit::Entries(n) => write!(f, "limit {n} keys"),
            RecoveryLimit::Bytes(n) => write!(f, "limit {n} value bytes"),
        }
    }
}

/// The error of a failed computation: the `E` its future returned, shared (behind an `Arc`) by
/// every caller that waited on that computation.
///
/// Its `Display` and `Debug` are those of `E`; [`downcast_ref`](Self::downcast_ref) (or
/// [`Error::compute_error`]) gives `E` back. Within a process, callers of one key share a
/// computation only when they use the same value and error types, so a caller always finds its
/// own `E` here.
///
/// `E` needs only `Display + Debug` (so `String` and `anyhow::Error` work), which means the
/// crate cannot see the sources of every `E`. It sees them when `E` is a [`SourceUnavailable`],
/// a [`std::io::Error`], a `Box<dyn std::error::Error + Send + Sync>` or an
/// `Arc<dyn std::error::Error + Send + Sync>`: then the chain of
/// [`std::error::Error::source`] goes on with `E`'s sources (this error's `Display` is `E`'s,
/// so its sources are `E`'s too). For any other `E` the chain ends here; to walk further,
/// downcast to `E`.
///
/// ```
/// use stampede_guard::ComputeError;
///
/// let error = ComputeError::new(std::io::Error::other("disk full"));
/// assert_eq!(error.to_string(), "disk full");
/// assert!(error.is::<std::io::Error>());
/// let shared = error.clone();
/// assert!(ComputeError::ptr_eq(&error, &shared));
/// ```
#[derive(Clone)]
pub struct ComputeError(Arc<dyn Erased>);

/// What the shared error needs: print it, and give the original type back.
trait Erased: fmt::Display + fmt::Debug + Send + Sync + 'static {
    fn as_any(&self) -> &(dyn Any + Send + Sync);
}

impl<E: fmt::Display + fmt::Debug + Send + Sync + 'static> Erased for E {
    fn as_any(&self) -> &(dyn Any + Send + Sync) {
        self
    }
}

impl ComputeError {
    /// Wraps a computation's error (for tests of code that handles [`Error::Compute`]; the cache
    /// wraps the errors of computations itself).
    ///
    /// ```
    /// let error = stampede_guard::ComputeError::new("no rows".to_string());
    /// assert_eq!(error.downcast_ref::<String>().unwrap(), "no rows");
    /// ```
    pub fn new<E>(error: E) -> Self
    where
        E: fmt::Display + fmt::Debug + Send + Sync + 'static,
    {
        ComputeError(Arc::new(error))
    }

    /// The computation's error, if it is an `E`.
    ///
    /// ```
    /// let error = stampede_guard::ComputeError::new(std::io::Error::other("disk full"));
    /// assert!(error.downcast_ref::<std::io::Error>().is_some());
    /// assert!(error.downcast_ref::<String>().is_none());
    /// ```
    pub fn downcast_ref<E: 'static>(&self) -> Option<&E> {
        // Deref first: `Arc<dyn Erased>` is itself `Display + Debug + ...`, hence `Erased`.
        (*self.0).as_any().downcast_ref()
    }

    /// Whether the computation's error is an `E`.
    ///
    /// ```
    /// assert!(stampede_guard::ComputeError::new(7u8.to_string()).is::<String>());
    /// ```
    pub fn is<E: 'static>(&self) -> bool {
        (*self.0).as_any().is::<E>()
    }

    /// Whether the computation's error is marked [`NotShared`] (its caller's alone).
    pub(crate) fn is_not_shared(&self) -> bool {
        marked_not_shared((*self.0).as_any())
    }

    /// Whether `a` and `b` are the same failure (shared by callers that waited on one
    /// computation), not merely equal-looking ones.
    ///
    /// ```
    /// use stampede_guard::ComputeError;
    /// let a = ComputeError::new("x".to_string());
    /// assert!(ComputeError::ptr_eq(&a, &a.clone()));
    /// assert!(!ComputeError::ptr_eq(&a, &ComputeError::new("x".to_string())));
    /// ```
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }

    /// The computation's error as a standard error, when it is one of the types the crate can
    /// see into (the bound is only `Display + Debug`, so this is a fixed list of downcasts).
    fn as_std_error(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std_error_of((*self.0).as_any())
    }

    /// What the computation's error says of its unavailable source, if it says so.
    fn unavailable_source(&self) -> Option<Unavailable> {
        #[cfg(feature = "macros")]
        if let Some(failed) = self.downcast_ref::<BodyFailed>() {
            return failed.unavailable();
        }
        find_unavailable(self.as_std_error()?)
    }
}

impl fmt::Display for ComputeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl fmt::Debug for ComputeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// `E`'s sources, when the crate can see them (see [`ComputeError`]): the `Display` is `E`'s,
/// so the next link is `E`'s source, not `E` again.
impl std::error::Error for ComputeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.as_std_error()?.source()
    }
}

/// The cache's copy of a failed `#[cached]` body's error (`src/cached.rs`): its `Display` (what
/// waiting callers and a remembered failure read) and its `Debug`, taken when it failed, and
/// whether it said its source was unavailable. Here beside [`ComputeError`], which reads it.
#[cfg(feature = "macros")]
#[doc(hidden)]
pub struct BodyFailed {
    display: String,
    debug: String,
    /// What the body's error said of an unavailable source, when it is the crate's [`Error`]:
    /// the callers that waited on it get the same 503 as the caller whose body ran.
    unavailable: Option<Unavailable>,
    /// Whether the body's error was marked [`NotShared`]: then neither are its callers'.
    not_shared: bool,
}

#[cfg(feature = "macros")]
impl BodyFailed {
    /// The copy of `error`, written as `display` and `debug` (its `Display` and `Debug`, or
    /// what stands for them: `src/cached.rs`).
    pub(crate) fn of<E: 'static>(error: &E, display: String, debug: String) -> Self {
        let crate_error = (error as &dyn std::any::Any).downcast_ref::<Error>();
        BodyFailed {
            display,
            debug,
            unavailable: crate_error.and_then(Error::unavailable_source),
            not_shared: marked_not_shared(error),
        }
    }

    /// Whether the body's error was marked [`NotShared`].
    pub(crate) fn not_shared(&self) -> bool {
        self.not_shared
    }

    /// What the body's error said of an unavailable source, if it said so.
    pub(crate) fn unavailable(&self) -> Option<Unavailable> {
        self.unavailable
    }
}

#[cfg(feature = "macros")]
impl fmt::Display for BodyFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display)
    }
}

#[cfg(feature = "macros")]
impl fmt::Debug for BodyFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.debug)
    }
}

/// A computation's error that says its source (the database, the upstream service) is
/// unavailable: an outage that passes by itself, not a bug. The `axum` integration answers it
/// with 503 Service Unavailable and `Retry-After` (one second, or the
/// [`retry_after`](Self::retry_after) given) instead of 500, so a key never cached yet does not
/// turn a database outage into server errors. Test for it with
/// [`Error::is_source_unavailable`].
///
/// Return it from the computation, or put it anywhere in the chain of
/// [`source`](std::error::Error::source)s of a `Box<dyn std::error::Error + Send + Sync>` the
/// computation returns. It is transparent: its `Display` and its sources are those of the
/// error it wraps, so logs read the same.
///
/// A lost connection needs no wrapping: a [`std::io::Error`] of a lost connection in the chain
/// (refused, reset, aborted, not connected, timed out, ...; sqlx's `Error::Io` holds one) counts
/// as unavailable by itself, when the crate can see the chain (see [`ComputeError`]). A pool's
/// time-out is no I/O error (sqlx's `PoolTimedOut`): wrap it.
///
/// ```
/// use stampede_guard::{Cache, Error, SourceUnavailable};
/// use std::time::Duration;
///
/// /// What a database client reports (sqlx's `Error`, say).
/// #[derive(Debug)]
/// enum DbError {
///     PoolTimedOut,
///     NoSuchTable,
/// }
/// # impl std::fmt::Display for DbError {
/// #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "{self:?}") }
/// # }
/// # impl std::error::Error for DbError {}
///
/// async fn query(month: &str) -> Result<u64, DbError> {
///     # let _ = month;
///     Err(DbError::PoolTimedOut)
/// }
///
/// /// An outage is marked as one; anything else stays a failure (a 500 on the web).
/// fn mark(e: DbError) -> Box<dyn std::error::Error + Send + Sync> {
///     match e {
///         DbError::PoolTimedOut => SourceUnavailable::new(e)
///             .retry_after(Duration::from_secs(5))
///             .into(),
///         e => e.into(),
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let cache = Cache::in_memory();
/// let result: Result<u64, Error> = cache
///     .get_or_compute("2019-05", Duration::from_secs(60), || async {
///         query("2019-05").await.map_err(mark)
///     })
///     .await;
/// let error = result.unwrap_err();
/// assert!(error.is_source_unavailable());
/// assert_eq!(error.to_string(), "the computation failed");
/// assert_eq!(std::error::Error::source(&error).unwrap().to_string(), "PoolTimedOut");
/// # let _ = DbError::NoSuchTable;
/// # }
/// ```
#[derive(Debug)]
pub struct SourceUnavailable {
    /// The error that said so (the driver's, the pool's), kept whole for logs and downcasts.
    error: Box<dyn std::error::Error + Send + Sync>,
    /// When the caller may try again, if the computation knows better than the default second.
    retry_after: Option<Duration>,
}

impl SourceUnavailable {
    /// Marks `error` as an unavailable source. Anything that converts into a boxed error
    /// works: an error type, a `String`, a `&str`.
    ///
    /// ```
    /// let down = stampede_guard::SourceUnavailable::new("the reports database is down");
    /// assert_eq!(down.to_string(), "the reports database is down");
    /// ```
    pub fn new(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        SourceUnavailable {
            error: error.into(),
            retry_after: None,
        }
    }

    /// Suggests how long a client should wait before trying again: the `axum` integration
    /// sends it as `Retry-After` (in whole seconds, rounded up) instead of one second.
    ///
    /// ```
    /// use std::time::Duration;
    /// let down = stampede_guard::SourceUnavailable::new("failover in progress")
    ///     .retry_after(Duration::from_secs(30));
    /// assert_eq!(down.suggested_retry_after(), Some(Duration::from_secs(30)));
    /// ```
    #[must_use]
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// The wait suggested with [`retry_after`](Self::retry_after), if any.
    ///
    /// ```
    /// let down = stampede_guard::SourceUnavailable::new("down");
    /// assert_eq!(down.suggested_retry_after(), None);
    /// ```
    pub fn suggested_retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The error it wraps.
    ///
    /// ```
    /// use std::io;
    /// let down = stampede_guard::SourceUnavailable::new(io::Error::from(io::ErrorKind::TimedOut));
    /// let io = down.get_ref().downcast_ref::<io::Error>().unwrap();
    /// assert_eq!(io.kind(), io::ErrorKind::TimedOut);
    /// ```
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.error
    }
}

/// The wrapped error's text: marking an error as an outage does not change what it says.
impl fmt::Display for SourceUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

/// Transparent, like its `Display`: the next link is the wrapped error's source.
impl std::error::Error for SourceUnavailable {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

/// A computation's error (`any`) as a standard error, when it is one of the types the crate can
/// see into: the bound on it is only `Display + Debug`, so this is a fixed list of downcasts.
fn std_error_of(any: &dyn Any) -> Option<&(dyn std::error::Error + 'static)> {
    if let Some(e) = any.downcast_ref::<NotShared>() {
        return Some(e);
    }
    if let Some(e) = any.downcast_ref::<SourceUnavailable>() {
        return Some(e);
    }
    if let Some(e) = any.downcast_ref::<std::io::Error>() {
        return Some(e);
    }
    if let Some(e) = any.downcast_ref::<Box<dyn std::error::Error + Send + Sync>>() {
        return Some(&**e);
    }
    if let Some(e) = any.downcast_ref::<Arc<dyn std::error::Error + Send + Sync>>() {
        return Some(&**e);
    }
    // A computation that returns the crate's own error (a `#[cached]` function's, a nested
    // cache call's): its chain goes on into the computation's error it wraps.
    if let Some(e) = any.downcast_ref::<Error>() {
        return Some(e);
    }
    #[cfg(feature = "sqlx")]
    if let Some(e) = any.downcast_ref::<sqlx::Error>() {
        return Some(e);
    }
    None
}

/// What a computation's error said of its unavailable source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unavailable {
    /// The wait the computation suggested ([`SourceUnavailable::retry_after`]), if any.
    pub(crate) retry_after: Option<Duration>,
}

/// How many links of a chain of sources are looked at: chains are short, and a bound keeps a
/// (buggy) cyclic chain from looping forever.
pub(crate) const MAX_CHAIN: usize = 64;

/// The first sign in `error`'s chain that its source is unavailable: a [`SourceUnavailable`],
/// or an I/O error of a lost connection.
fn find_unavailable(error: &(dyn std::error::Error + 'static)) -> Option<Unavailable> {
    let mut link = Some(error);
    for _ in 0..MAX_CHAIN {
        let current = link?;
        if let Some(marked) = current.downcast_ref::<SourceUnavailable>() {
            return Some(Unavailable {
                retry_after: marked.retry_after,
            });
        }
        #[cfg(feature = "sqlx")]
        if current
            .downcast_ref::<sqlx::Error>()
            .is_some_and(crate::sqlx_source::is_unavailable)
        {
            return Some(Unavailable { retry_after: None });
        }
        // A computation's error passes its `source()` on from the error it wraps, skipping that
        // error itself: look at the wrapped one.
        if let Some(inner) = current
            .downcast_ref::<ComputeError>()
            .and_then(ComputeError::as_std_error)
        {
            link = Some(inner);
            continue;
        }
        if let Some(io) = current.downcast_ref::<std::io::Error>() {
            if is_connection_lost(io.kind()) {
                return Some(Unavailable { retry_after: None });
            }
            // An `io::Error`'s `source()` is its inner error's source, skipping the inner error
            // itself (which may be the mark): look at the inner one.
            if let Some(inner) = io.get_ref() {
                link = Some(inner);
                continue;
            }
        }
        link = current.source();
    }
    None
}

/// Whether an I/O error of `kind` means the other end could not be reached or went away.
fn is_connection_lost(kind: std::io::ErrorKind) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        kind,
        ConnectionRefused
            | ConnectionReset
            | ConnectionAborted
            | NotConnected
            | TimedOut
            | BrokenPipe
            | HostUnreachable
            | NetworkUnreachable
            | NetworkDown
    )
}

/// What a backend failure of `kind` during `op` means and what fixes it, naming the key and its
/// namespace's key pattern when the failure was about one. Nothing here comes from the URL, so
/// credentials never show.
fn explain_backend(
    f: &mut fmt::Formatter<'_>,
    op: &str,
    kind: BackendErrorKind,
    key: Option<&str>,
    source: &BackendError,
) -> fmt::Result {
    let code = source.code().unwrap_or("");
    let what = match key {
        Some(key) => format!("{op} on `{key}`"),
        None => op.to_owned(),
    };
    if kind.is_refused() || kind == BackendErrorKind::WrongType {
        return explain_refusal(f, op, kind, code, &what, key.and_then(namespace_of));
    }
    match kind {
        BackendErrorKind::Unreachable => write!(
            f,
            "Redis could not be reached during {op} (connection refused, dropped or timed out); \
             the connection retries by itself"
        ),
        BackendErrorKind::OutOfMemory => write!(
            f,
            "Redis refused {what}: its memory is full (OOM: `maxmemory` reached under \
             `noeviction`); raise `maxmemory` or free memory"
        ),
        BackendErrorKind::Busy => {
            let why = match code {
                "BUSY" => {
                    "a script runs past its time limit (BUSY); it answers again when the \
                           script ends or is killed (`SCRIPT KILL`)"
                }
                "LOADING" => "it is still loading its dataset (LOADING); it answers once loaded",
                _ => {
                    "the cluster cannot serve this slot now (TRYAGAIN, CLUSTERDOWN); it \
                      answers once the slot is served"
                }
            };
            write!(f, "Redis is busy during {op}: {why}")
        }
        BackendErrorKind::TooFewReplicas => write!(
            f,
            "too few replicas acknowledged {what} in time ({}), so a failover could lose it; it \
             does not count (a granted lock was released); check the replicas (`INFO \
             replication` on the master) or lower `ConnectionOptions::wait_for_replicas`",
            source.detail().unwrap_or("no detail")
        ),
        _ => {
            write!(f, "the cache backend failed during {op}")?;
            if !code.is_empty() {
                write!(f, " (Redis answered {code})")?;
            }
            Ok(())
        }
    }
}

/// The message of a refusal (by permission or role) or of a foreign key type: what Redis
/// refused and what the operator must change, since retrying cannot help.
fn explain_refusal(
    f: &mut fmt::Formatter<'_>,
    op: &str,
    kind: BackendErrorKind,
    code: &str,
    what: &str,
    namespace: Option<&str>,
) -> fmt::Result {
    match kind {
        BackendErrorKind::RefusedPermission if code == "NOPERM" => {
            write!(
                f,
                "Redis refused {what}: the ACL user has no access to this key, its channel or \
                 the command (NOPERM); "
            )?;
            match namespace {
                Some(ns) => write!(
                    f,
                    "grant the user `~{ns}:*` and `&{ns}:*`, or use a namespace whose keys it may access"
                ),
                None => write!(f, "grant the user the keys, channels and commands the cache uses"),
            }
        }
        BackendErrorKind::RefusedPermission => {
            write!(
            f,
            "Redis refused the login during {op}: the user name or password in the Redis URL is \
             wrong or missing ({}); fix the credentials",
            if code.is_empty() { "authentication failed" } else { code }
        )
        }
        BackendErrorKind::RefusedRole if code == "MASTERDOWN" => write!(
            f,
            "Redis refused {what}: the server is a replica that lost its primary (MASTERDOWN); \
             point the cache at the primary"
        ),
        BackendErrorKind::RefusedRole => write!(
            f,
            "Redis refused {what}: the server is a read-only replica (READONLY); point the cache \
             at the primary (after a failover, at the new one)"
        ),
        BackendErrorKind::WrongType => {
            write!(
                f,
                "Redis refused {what}: a key of the cache holds another Redis type (WRONGTYPE), \
                 so something else writes under "
            )?;
            match namespace {
                Some(ns) => write!(f, "namespace `{ns}`; give the cache a namespace of its own"),
                None => write!(f, "its keys; give the cache a namespace of its own"),
            }
        }
        _ => write!(f, "Redis refused {what} ({code})"),
    }
}

/// The opening brace of a value key's hash tag (`ns:{key}`).
const TAG_OPEN: char = '{';

/// The namespace of a value key `ns:{key}`: a namespace cannot hold a brace, so the first one
/// opens the key's hash tag.
fn namespace_of(key: &str) -> Option<&str> {
    let tag = key.find(TAG_OPEN)?;
    Some(key[..tag].strip_suffix(':').unwrap_or(&key[..tag]))
}

/// What kind of failure an [`Error::Backend`] is, and so what the crate does with it. Classified
/// once, where the store met the Redis client's error; read it with [`Error::backend_kind`] or
/// the predicates ([`Error::is_unreachable`], [`Error::is_refused`], ...).
///
/// | kind | Redis says | [`OnBackendError::ComputeUncached`](crate::OnBackendError::ComputeUncached) | HTTP (`axum`) |
/// |---|---|---|---|
/// | [`Unreachable`](Self::Unreachable) | (no answer: refused, dropped, timed out) | computes without the cache | 503, `Retry-After` |
/// | [`Busy`](Self::Busy) | `BUSY`, `LOADING`, `TRYAGAIN`, `CLUSTERDOWN` | computes without the cache | 503, `Retry-After` |
/// | [`OutOfMemory`](Self::OutOfMemory) | `OOM` | computes without the cache, counted in [`Stats::not_stored`](crate::Stats::not_stored) | 503, `Retry-After` |
/// | [`RefusedPermission`](Self::RefusedPermission) | `NOPERM`, `NOAUTH`, `WRONGPASS` | the error, at once | 500 |
/// | [`RefusedRole`](Self::RefusedRole) | `READONLY`, `MASTERDOWN` | the error, at once | 500 |
/// | [`WrongType`](Self::WrongType) | `WRONGTYPE` | the error, at once | 500 |
/// | [`TooFewReplicas`](Self::TooFewReplicas) | `WAIT` counted fewer replicas than [`ConnectionOptions::wait_for_replicas`](crate::ConnectionOptions::wait_for_replicas) asks | computes without the cache | 503, `Retry-After` |
/// | [`Other`](Self::Other) | anything else | computes without the cache | 503, `Retry-After` |
///
/// Why, in `docs/guarantees.md` (What a Redis error means).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackendErrorKind {
    /// Nothing answered: the connection was refused, dropped or timed out (a black-holed
    /// connection ends as a time-out). It reconnects by itself.
    Unreachable,
    /// The ACL user may not do this (`NOPERM`), or the login failed (`NOAUTH`, `WRONGPASS`).
    RefusedPermission,
    /// The server is a replica (`READONLY`), or a replica without its primary (`MASTERDOWN`).
    RefusedRole,
    /// The server's memory is full and it evicts nothing (`OOM`): reads work, writes are refused.
    OutOfMemory,
    /// The server is up but cannot answer now: `BUSY` (a long script), `LOADING`, `TRYAGAIN`,
    /// `CLUSTERDOWN`.
    Busy,
    /// One of the cache's keys holds another Redis type (`WRONGTYPE`): something else writes
    /// in the namespace.
    WrongType,
    /// A lock or fencing write was carried out, but fewer replicas than
    /// [`ConnectionOptions::wait_for_replicas`](crate::ConnectionOptions::wait_for_replicas)
    /// asks acknowledged it within its timeout, so a failover could lose it. A granted lock was
    /// released again; the message says how many replicas answered. A replica is down, cut
    /// off or lagging (`INFO replication` on the master).
    TooFewReplicas,
    /// Any other failure (an unexpected reply, an unknown error code).
    Other,
}

impl BackendErrorKind {
    /// Whether Redis refused by permission or by role: a configuration error that retrying
    /// cannot fix.
    pub fn is_refused(self) -> bool {
        matches!(
            self,
            BackendErrorKind::RefusedPermission | BackendErrorKind::RefusedRole
        )
    }

    /// Whether [`OnBackendError::ComputeUncached`](crate::OnBackendError::ComputeUncached)
    /// answers this kind by computing without the cache: the backend is down, busy or full,
    /// which passes. A refusal or foreign data under a key is a configuration error, surfaced
    /// at once instead, whatever the fallback.
    ///
    /// ```
    /// use stampede_guard::BackendErrorKind;
    /// assert!(BackendErrorKind::Unreachable.computes_uncached());
    /// assert!(!BackendErrorKind::RefusedPermission.computes_uncached());
    /// ```
    pub fn computes_uncached(self) -> bool {
        matches!(
            self,
            BackendErrorKind::Unreachable
                | BackendErrorKind::Busy
                | BackendErrorKind::OutOfMemory
                | BackendErrorKind::TooFewReplicas
                | BackendErrorKind::Other
        )
    }

    /// A short name for logs and metric labels: `unreachable`, `refused-permission`,
    /// `refused-role`, `out-of-memory`, `busy`, `wrong-type`, `too-few-replicas`, `other`.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendErrorKind::Unreachable => "unreachable",
            BackendErrorKind::RefusedPermission => "refused-permission",
            BackendErrorKind::RefusedRole => "refused-role",
            BackendErrorKind::OutOfMemory => "out-of-memory",
            BackendErrorKind::Busy => "busy",
            BackendErrorKind::WrongType => "wrong-type",
            BackendErrorKind::TooFewReplicas => "too-few-replicas",
            BackendErrorKind::Other => "other",
        }
    }
}

impl fmt::Display for BackendErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Displays an error followed by each of its sources.
struct Chain<'a>(&'a Error);

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = std::error::Error::source(self.0);
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    /// A library's error over another: its own message, and the error it wraps as its source.
    #[derive(Debug)]
    struct Wrapping<E>(&'static str, E);

    impl<E> fmt::Display for Wrapping<E> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl<E: std::error::Error + 'static> std::error::Error for Wrapping<E> {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.1)
        }
    }

    /// An error like sqlx's `Error::Io`: a driver's type whose source is the socket's error.
    fn driver(socket: io::Error) -> Wrapping<io::Error> {
        Wrapping("error communicating with database", socket)
    }

    fn failed<E>(e: E) -> Error
    where
        E: fmt::Display + fmt::Debug + Send + Sync + 'static,
    {
        Error::compute(e)
    }

    fn boxed(
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> Box<dyn std::error::Error + Send + Sync> {
        Box::new(e)
    }

    #[test]
    fn a_marked_error_is_an_unavailable_source_with_its_retry_hint() {
        let marked = failed(SourceUnavailable::new("down"));
        assert!(marked.is_source_unavailable());
        assert_eq!(
            marked.unavailable_source(),
            Some(Unavailable { retry_after: None })
        );
        let hinted = failed(SourceUnavailable::new("down").retry_after(Duration::from_secs(7)));
        assert_eq!(
            hinted.unavailable_source(),
            Some(Unavailable {
                retry_after: Some(Duration::from_secs(7))
            })
        );
    }

    #[test]
    fn a_lost_connection_in_the_chain_is_an_unavailable_source() {
        for kind in [
            io::ErrorKind::ConnectionRefused,
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::ConnectionAborted,
            io::ErrorKind::NotConnected,
            io::ErrorKind::TimedOut,
        ] {
            assert!(
                failed(io::Error::from(kind)).is_source_unavailable(),
                "{kind:?}"
            );
            // Behind a driver's error, boxed: what a sqlx computation returning a boxed error
            // gives during a database outage.
            let nested = failed(boxed(driver(io::Error::from(kind))));
            assert!(nested.is_source_unavailable(), "{kind:?}");
        }
        let denied = failed(boxed(driver(io::Error::from(
            io::ErrorKind::PermissionDenied,
        ))));
        assert!(!denied.is_source_unavailable());
    }

    #[test]
    fn a_mark_anywhere_in_the_chain_is_found() {
        // Behind a driver's error, boxed and shared.
        let loading = |marked: SourceUnavailable| Wrapping("loading the report", marked);
        let hint = Some(Duration::from_secs(3));
        let marked =
            || SourceUnavailable::new("pool timed out").retry_after(Duration::from_secs(3));
        let outer = failed(boxed(loading(marked())));
        assert_eq!(
            outer.unavailable_source().map(|u| u.retry_after),
            Some(hint)
        );
        let shared: Arc<dyn std::error::Error + Send + Sync> = Arc::new(loading(marked()));
        assert_eq!(
            failed(shared).unavailable_source().map(|u| u.retry_after),
            Some(hint)
        );
        // Inside an `io::Error`, whose own `source()` skips the error it wraps.
        let in_io = failed(io::Error::other(marked()));
        assert_eq!(
            in_io.unavailable_source().map(|u| u.retry_after),
            Some(hint)
        );
    }

    #[test]
    fn other_failures_are_not_an_unavailable_source() {
        assert!(!failed("no such column".to_owned()).is_source_unavailable());
        assert!(!failed(io::Error::other("disk full")).is_source_unavailable());
        assert!(!failed(boxed(io::Error::from(io::ErrorKind::InvalidData))).is_source_unavailable());
        // Opaque to the crate: a driver's error that is not boxed (the bound is Display + Debug).
        assert!(
            !failed(driver(io::Error::from(io::ErrorKind::ConnectionRefused)))
                .is_source_unavailable()
        );
        // The crate's own outages are backend errors, not the computation's source.
        let waited = Error::WaitTimeout {
            key: "k".into(),
            waited: Duration::from_secs(1),
        };
        assert!(!waited.is_source_unavailable());
    }

    #[test]
    fn the_chain_goes_on_through_errors_the_crate_can_see_into() {
        use io::ErrorKind::{ConnectionRefused, TimedOut};
        let down = failed(boxed(driver(io::Error::from(ConnectionRefused))));
        // Marking an outage changes nothing in what the logs say.
        let marked = failed(SourceUnavailable::new(driver(io::Error::from(TimedOut))));
        for (failure, kind) in [(down, ConnectionRefused), (marked, TimedOut)] {
            assert_eq!(
                failure.chain().to_string(),
                format!(
                    "the computation failed: error communicating with database: {}",
                    io::Error::from(kind)
                ),
                "{kind:?}"
            );
        }
        // An opaque error ends the chain, as before.
        assert_eq!(
            failed("x".to_owned()).chain().to_string(),
            "the computation failed: x"
        );
    }
}
