//! The cause of an [`Error::Backend`](super::Error::Backend), opaque so that the crate's public
//! API does not name the Redis client's types (and does not change with its major version).

use std::fmt;
use std::sync::Arc;

/// What the backend's client reported when a call failed: the `source` of an
/// [`Error::Backend`](crate::Error::Backend).
///
/// Opaque, so that the crate's public API does not depend on the Redis client's version. It is
/// the client's own error (a `redis::RedisError`), shared (so that [`Error`](crate::Error) stays
/// `Clone`), or the crate's own reason for not sending the request (the circuit breaker was
/// open). Its `Display` and `Debug` are those of the error it wraps, and so is its
/// [`source`](std::error::Error::source). The [`Error`](crate::Error)'s own
/// [`source`](std::error::Error::source) is the wrapped error itself, so a caller that wants
/// the client's error downcasts it from there, as from [`get_ref`](Self::get_ref).
///
/// ```
/// use stampede_guard::BackendError;
///
/// // A server's error reply, as the Redis client parses it off the wire.
/// let reply = redis::parse_redis_value(b"-NOPERM this user has no permissions\r\n").unwrap();
/// let redis::Value::ServerError(refused) = reply else { unreachable!() };
/// let error = BackendError::new(redis::RedisError::from(refused));
/// assert_eq!(error.code(), Some("NOPERM"));
/// assert!(error.get_ref().downcast_ref::<redis::RedisError>().is_some());
/// assert_eq!(error.to_string(), error.get_ref().to_string());
/// ```
#[derive(Clone)]
pub struct BackendError(Arc<dyn std::error::Error + Send + Sync>);

impl BackendError {
    /// Wraps the client's error (the store does this for every failure; `new` is there for tests
    /// of code that handles [`Error::Backend`](crate::Error::Backend)).
    ///
    /// ```
    /// use stampede_guard::{BackendError, BackendErrorKind, Error};
    /// use std::io;
    ///
    /// let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
    /// let error = Error::Backend {
    ///     op: "get",
    ///     kind: BackendErrorKind::Unreachable,
    ///     key: None,
    ///     source: BackendError::new(redis::RedisError::from(refused)),
    /// };
    /// assert!(error.is_unreachable());
    /// ```
    pub fn new<E>(error: E) -> Self
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        BackendError(Arc::new(error))
    }

    /// The error code of the Redis server's error reply (`NOPERM`, `READONLY`, `OOM`, ...), if
    /// the server answered with one; `None` when nothing answered (the connection was refused,
    /// dropped or timed out, or the circuit breaker was open).
    ///
    /// ```
    /// use stampede_guard::BackendError;
    /// let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    /// assert_eq!(BackendError::new(redis::RedisError::from(refused)).code(), None);
    /// ```
    pub fn code(&self) -> Option<&str> {
        self.redis()?.code()
    }

    /// The error it wraps: downcast it to `redis::RedisError` to read what the client reported.
    ///
    /// ```
    /// use stampede_guard::BackendError;
    /// let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    /// let error = BackendError::new(redis::RedisError::from(refused));
    /// let redis = error.get_ref().downcast_ref::<redis::RedisError>().unwrap();
    /// assert!(redis.is_connection_refusal());
    /// ```
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }

    /// The detail of the server's error reply (what follows its code), if it answered with one.
    pub(crate) fn detail(&self) -> Option<&str> {
        self.redis()?.detail()
    }

    /// The Redis client's error, if this is one (not the breaker's).
    fn redis(&self) -> Option<&redis::RedisError> {
        self.0.downcast_ref()
    }
}

/// The wrapped error's text: the wrapper adds nothing to what the client said.
impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// The wrapped error's, so that `{:?}` of an [`Error`](crate::Error) shows the client's error.
impl fmt::Debug for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// Transparent, like its `Display`: the next link is the wrapped error's source.
impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Why a request was not sent: the circuit breaker was open (see `store/breaker.rs`). The source
/// of the [`Error::Backend`](crate::Error::Backend) it becomes, whose kind is
/// [`Unreachable`](crate::BackendErrorKind::Unreachable); its message says how long the backend
/// has been failing.
#[derive(Debug, Clone)]
pub(crate) struct BreakerOpen {
    /// The breaker's own account of why it is open.
    message: String,
}

impl BreakerOpen {
    /// The breaker is open, for the reason `message` gives.
    pub(crate) fn new(message: String) -> Self {
        BreakerOpen { message }
    }
}

impl fmt::Display for BreakerOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for BreakerOpen {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BackendErrorKind, Error};
    use std::error::Error as _;

    fn backend(source: BackendError) -> Error {
        Error::Backend {
            op: "get",
            kind: BackendErrorKind::Unreachable,
            key: None,
            source,
        }
    }

    #[test]
    fn the_source_is_the_clients_error_itself() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let error = backend(BackendError::new(redis::RedisError::from(refused)));
        let client = error
            .source()
            .and_then(|s| s.downcast_ref::<redis::RedisError>())
            .expect("the client's error");
        assert!(client.is_connection_refusal());
        // The client's error goes on with the socket's.
        let socket = client.source().expect("the socket's error");
        assert_eq!(
            error.chain().to_string(),
            format!("{error}: {client}: {socket}"),
            "the wrapper adds no link"
        );
    }

    #[test]
    fn an_open_breaker_is_its_own_source_with_its_own_message() {
        let message = "circuit breaker open: the backend failed 5 times in a row";
        let error = backend(BackendError::new(BreakerOpen::new(message.to_owned())));
        let source = error.source().expect("a source");
        assert!(source.downcast_ref::<BreakerOpen>().is_some(), "{source:?}");
        assert!(source.downcast_ref::<redis::RedisError>().is_none());
        assert_eq!(source.to_string(), message);
        let Error::Backend { source, .. } = &error else {
            unreachable!()
        };
        assert_eq!(source.code(), None);
        assert!(error
            .to_string()
            .starts_with("Redis could not be reached during get"));
    }
}
