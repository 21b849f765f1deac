//! The crate's one error type.

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Everything that can go wrong in a call, with `E` the error of the user's computation.
///
/// `Error` is `Clone` so that one failure can be handed to every caller that was waiting on the
/// same computation: the computation's own error is shared as [`Arc<E>`](Arc). Operations that run
/// no computation (`get`, `set`, `invalidate`, building a cache) use the default `E = Infallible`.
///
/// ```
/// use stampede_guard::{Cache, Error};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let cache = Cache::in_memory();
/// let result: Result<u32, Error<String>> = cache
///     .get_or_compute("2019-05", Duration::from_secs(60), || async {
///         Err("the database is down".to_string())
///     })
///     .await;
/// match result {
///     Err(Error::Compute(e)) => assert_eq!(*e, "the database is down"),
///     other => panic!("unexpected {other:?}"),
/// }
/// # }
/// ```
#[non_exhaustive]
pub enum Error<E = Infallible> {
    /// The computation returned this error. Nothing was cached; every caller that waited on this
    /// computation in this process receives the same error.
    Compute(Arc<E>),
    /// The backend failed during `op` (connection refused or dropped, a time-out, an error reply).
    /// The connection reconnects by itself; a later call may succeed.
    Backend {
        /// The operation that failed, e.g. `"get"` or `"read-or-lock"`.
        op: &'static str,
        /// What the Redis client reported.
        source: redis::RedisError,
    },
    /// Another caller held the key's lock for longer than the call's wait bound
    /// ([`CallOptions::wait_timeout`](crate::CallOptions::wait_timeout)).
    WaitTimeout {
        /// The user's key.
        key: String,
        /// How long this call waited.
        waited: Duration,
    },
    /// The key (or namespace) cannot be used; `reason` says why.
    InvalidKey {
        /// The offending key, as given.
        key: String,
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
    /// The lock was no longer held when it was released: its lease ran out (and perhaps another
    /// holder took it). Work done under it may have overlapped with another holder's; the
    /// fencing token is what protects the systems written to.
    NotHeld {
        /// The lock's name.
        name: String,
    },
}

impl<E> Error<E> {
    /// Whether this is a failure of the backend (Redis unreachable, timed out, or refusing).
    pub fn is_backend(&self) -> bool {
        matches!(self, Error::Backend { .. })
    }

    /// Whether the call gave up waiting for another caller's computation.
    pub fn is_wait_timeout(&self) -> bool {
        matches!(self, Error::WaitTimeout { .. })
    }

    /// The computation's own error, if that is what this is.
    pub fn compute_error(&self) -> Option<&E> {
        match self {
            Error::Compute(e) => Some(e),
            _ => None,
        }
    }
}

// By hand: a derive would demand `E: Clone`, but the computation's error is shared through `Arc`.
impl<E> Clone for Error<E> {
    fn clone(&self) -> Self {
        match self {
            Error::Compute(e) => Error::Compute(Arc::clone(e)),
            Error::Backend { op, source } => Error::Backend {
                op,
                source: source.clone(),
            },
            Error::WaitTimeout { key, waited } => Error::WaitTimeout {
                key: key.clone(),
                waited: *waited,
            },
            Error::InvalidKey { key, reason } => Error::InvalidKey {
                key: key.clone(),
                reason,
            },
            Error::Encode(e) => Error::Encode(Arc::clone(e)),
            Error::ValueTooLarge { size, limit } => Error::ValueTooLarge {
                size: *size,
                limit: *limit,
            },
            Error::Config(msg) => Error::Config(msg.clone()),
            Error::NotHeld { name } => Error::NotHeld { name: name.clone() },
            Error::NoQuorum {
                op,
                reached,
                needed,
            } => Error::NoQuorum {
                op,
                reached: *reached,
                needed: *needed,
            },
            Error::RecentFailure { key, message } => Error::RecentFailure {
                key: key.clone(),
                message: message.clone(),
            },
        }
    }
}

impl Error<Infallible> {
    /// Re-types an error that cannot carry a computation error, so it fits any `Error<E>`.
    pub(crate) fn widen<E>(self) -> Error<E> {
        match self {
            Error::Compute(never) => match *never {},
            Error::Backend { op, source } => Error::Backend { op, source },
            Error::WaitTimeout { key, waited } => Error::WaitTimeout { key, waited },
            Error::InvalidKey { key, reason } => Error::InvalidKey { key, reason },
            Error::Encode(e) => Error::Encode(e),
            Error::ValueTooLarge { size, limit } => Error::ValueTooLarge { size, limit },
            Error::Config(msg) => Error::Config(msg),
            Error::NotHeld { name } => Error::NotHeld { name },
            Error::NoQuorum {
                op,
                reached,
                needed,
            } => Error::NoQuorum {
                op,
                reached,
                needed,
            },
            Error::RecentFailure { key, message } => Error::RecentFailure { key, message },
        }
    }
}

impl<E> Error<E> {
    pub(crate) fn backend(op: &'static str, source: crate::store::StoreError) -> Self {
        match source {
            crate::store::StoreError::Redis(source) => Error::Backend { op, source },
            crate::store::StoreError::NoQuorum { reached, needed } => Error::NoQuorum {
                op,
                reached,
                needed,
            },
        }
    }
}

impl<E: fmt::Display> fmt::Display for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Compute(e) => write!(f, "the computation failed: {e}"),
            Error::Backend { op, source } => write!(
                f,
                "the cache backend failed during {op}: {source} (is Redis reachable? the connection retries by itself)"
            ),
            Error::WaitTimeout { key, waited } => write!(
                f,
                "gave up on key {key:?} after waiting {waited:?} for another caller's computation \
                 (raise CallOptions::wait_timeout if computations take longer)"
            ),
            Error::InvalidKey { key, reason } => write!(f, "invalid key {key:?}: {reason}"),
            Error::Encode(e) => write!(f, "the value could not be encoded: {e}"),
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
            Error::NotHeld { name } => write!(
                f,
                "lock {name:?} was no longer held: its lease ran out or another holder took it"
            ),
        }
    }
}

impl<E: fmt::Debug> fmt::Debug for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Compute(e) => f.debug_tuple("Compute").field(e).finish(),
            Error::Backend { op, source } => f
                .debug_struct("Backend")
                .field("op", op)
                .field("source", source)
                .finish(),
            Error::WaitTimeout { key, waited } => f
                .debug_struct("WaitTimeout")
                .field("key", key)
                .field("waited", waited)
                .finish(),
            Error::InvalidKey { key, reason } => f
                .debug_struct("InvalidKey")
                .field("key", key)
                .field("reason", reason)
                .finish(),
            Error::Encode(e) => f.debug_tuple("Encode").field(e).finish(),
            Error::ValueTooLarge { size, limit } => f
                .debug_struct("ValueTooLarge")
                .field("size", size)
                .field("limit", limit)
                .finish(),
            Error::Config(msg) => f.debug_tuple("Config").field(msg).finish(),
            Error::NotHeld { name } => f.debug_struct("NotHeld").field("name", name).finish(),
            Error::NoQuorum {
                op,
                reached,
                needed,
            } => f
                .debug_struct("NoQuorum")
                .field("op", op)
                .field("reached", reached)
                .field("needed", needed)
                .finish(),
            Error::RecentFailure { key, message } => f
                .debug_struct("RecentFailure")
                .field("key", key)
                .field("message", message)
                .finish(),
        }
    }
}

// Bounded by `Display + Debug` rather than `std::error::Error` so that computations failing with
// `String` or `anyhow::Error` (which is not `std::error::Error`) still give an error usable with `?`.
// The computation's error is part of the message instead of the source chain.
impl<E> std::error::Error for Error<E>
where
    E: fmt::Display + fmt::Debug,
{
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Backend { source, .. } => Some(source),
            Error::Encode(e) => Some(&**e),
            _ => None,
        }
    }
}
