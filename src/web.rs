//! HTTP responses for the crate's errors, for axum handlers (feature `axum`).
//!
//! With the feature on, [`Error`] implements axum's [`IntoResponse`], so a handler can return
//! `Result<_, stampede_guard::Error>` and let `?` pick the status:
//!
//! | error | status | why |
//! |---|---|---|
//! | [`Error::Backend`] unreachable, busy, out of memory or other ([`BackendErrorKind`](crate::BackendErrorKind)), [`Error::NoQuorum`] | 503 Service Unavailable, `Retry-After: 1` | Redis is down, unreachable, loading, busy or full: it passes by itself (the connection retries, the load or script ends, keys expire) |
//! | [`Error::Backend`] refused ([`Error::is_refused`]: `NOPERM`, `WRONGPASS`, `READONLY`...) or a foreign key type (`WRONGTYPE`) | 500 Internal Server Error | a misconfiguration (the ACL user, the URL, the namespace) that retrying cannot fix; the log line says what to change |
//! | [`Error::RecoveryQueueFull`] | 503 Service Unavailable, `Retry-After: 1` | Redis is down and the auto-recovery queue is full: the write was not made; a retry later succeeds |
//! | [`Error::WaitTimeout`] | 503 Service Unavailable, `Retry-After: 1` | another caller's computation is taking longer than the wait bound; the value may be there soon |
//! | [`Error::ComputeTimeout`] | 503 Service Unavailable, `Retry-After: 1` | the computation hit its hard timeout ([`CallOptions::max_hold`](crate::CallOptions::max_hold)) and no fail-safe value was kept; the source is slow now |
//! | [`Error::Compute`] whose source is unavailable ([`Error::is_source_unavailable`]: a [`SourceUnavailable`](crate::SourceUnavailable) or a lost connection in its chain) | 503 Service Unavailable, `Retry-After` (1 s, or the wait the computation suggested) | your database or upstream is down or unreachable: an outage that passes, even for a key never cached |
//! | any other [`Error::Compute`], [`Error::RecentFailure`] | 500 Internal Server Error | the computation (your query) failed, now or a moment ago |
//! | [`Error::InvalidKey`] | 400 Bad Request | the key, usually built from the request, is empty or too long |
//! | [`Error::TooManyKeys`] | 400 Bad Request | a many-key call, usually over a range the request asked for, has more keys than one call takes |
//! | anything else ([`Error::Encode`], [`Error::ValueTooLarge`], [`Error::Config`], [`Error::NotHeld`], [`Error::MissingFromBatch`]) | 500 Internal Server Error | a bug or a misconfiguration on the server side |
//!
//! The body is a short plain-text sentence that reveals nothing of the server: the computation's
//! error, Redis addresses and the like go to the log instead (`tracing`, at `error` level for
//! 500s and `warn` for 503s, with the full error and its sources). Handlers with an error type of
//! their own get the same whole response (status, `Retry-After`, the log line) from
//! [`response`]; those that need another mapping or a JSON body can build it from [`status`]
//! and [`retry_after`].
//!
//! A database outage is a 503 only if the computation says so: return (or wrap in a boxed
//! error) a [`SourceUnavailable`](crate::SourceUnavailable), or let a lost connection's
//! [`std::io::Error`] reach the cache in a form it can see into (the list is on
//! [`Error::is_source_unavailable`]). A pool's time-out (sqlx's `PoolTimedOut`) is no I/O
//! error: wrap it.
//!
//! ```
//! use axum::response::IntoResponse;
//! use stampede_guard::{Cache, Error, SourceUnavailable};
//! use std::time::Duration;
//!
//! async fn report(cache: Cache, month: String) -> Result<String, Error> {
//!     let key = month.clone();
//!     cache
//!         .get_or_compute(&key, Duration::from_secs(300), move || async move {
//!             // The pool gave up waiting for a connection: the database is down, not wrong.
//!             Err(SourceUnavailable::new(format!("no connection for {month}"))
//!                 .retry_after(Duration::from_secs(5)))
//!         })
//!         .await
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let response = report(Cache::in_memory(), "2019-05".into()).await.into_response();
//! assert_eq!(response.status(), 503);
//! assert_eq!(response.headers()["retry-after"], "5");
//! # }
//! ```
//!
//! ```
//! use axum::{extract::Path, response::IntoResponse, routing::get, Router};
//! use stampede_guard::{Cache, Error};
//! use std::time::Duration;
//!
//! async fn report(
//!     cache: Cache,
//!     month: String,
//! ) -> Result<String, Error> {
//!     let key = month.clone();
//!     cache
//!         .get_or_compute(&key, Duration::from_secs(300), move || async move {
//!             // The slow query; its error becomes a 500 (logged, not shown to the client).
//!             // A lost connection (an `io::Error` of kind ConnectionRefused, say) would be a 503.
//!             Err(std::io::Error::other(format!("no connection to the database for {month}")))
//!         })
//!         .await
//! }
//!
//! let cache = Cache::in_memory();
//! let app: Router = Router::new().route(
//!     "/report/{month}",
//!     get(move |Path(month): Path<String>| report(cache.clone(), month)),
//! );
//! # let _ = app;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let response = report(Cache::in_memory(), "2019-05".into()).await.into_response();
//! assert_eq!(response.status(), 500);
//! # }
//! ```
//!
//! Guide: [A complete service](https://github.com/stampede-guard/stampede-guard/blob/main/docs/service-example.md).

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::stats::LogThrottle;
use crate::Error;

/// The HTTP status for `error`, as the [`IntoResponse`] implementation uses it (the table in the
/// [module docs](self)).
///
/// For handlers with an error type of their own that wraps this crate's errors:
///
/// ```
/// use axum::http::StatusCode;
/// use stampede_guard::{web, ComputeError, Error};
/// use std::time::Duration;
///
/// let waited = Error::WaitTimeout {
///     key: "2019-05".into(),
///     waited: Duration::from_secs(30),
/// };
/// assert_eq!(web::status(&waited), StatusCode::SERVICE_UNAVAILABLE);
///
/// let failed = Error::Compute(ComputeError::new("the query failed".to_string()));
/// assert_eq!(web::status(&failed), StatusCode::INTERNAL_SERVER_ERROR);
/// ```
pub fn status(error: &Error) -> StatusCode {
    match error {
        // An outage of the computation's source passes like one of Redis.
        Error::Compute(_) if error.is_source_unavailable() => StatusCode::SERVICE_UNAVAILABLE,
        // The table in `docs/guarantees.md`: what passes by itself is a 503, a refusal a 500.
        Error::Backend { kind, .. } if !kind.computes_uncached() => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
        Error::Backend { .. }
        | Error::NoQuorum { .. }
        | Error::WaitTimeout { .. }
        | Error::ComputeTimeout { .. }
        | Error::RecoveryQueueFull { .. } => StatusCode::SERVICE_UNAVAILABLE,
        Error::InvalidKey { .. } | Error::TooManyKeys { .. } => StatusCode::BAD_REQUEST,
        Error::Compute(_)
        | Error::RecentFailure { .. }
        | Error::Encode(_)
        | Error::ValueTooLarge { .. }
        | Error::Config(_)
        | Error::NotHeld { .. }
        | Error::MissingFromBatch { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The client's view: what happened, in words that reveal nothing of the server.
fn public_message(error: &Error) -> String {
    match error {
        Error::Backend { kind, .. } if !kind.computes_uncached() => {
            "internal server error".to_owned()
        }
        Error::Backend { .. } | Error::NoQuorum { .. } | Error::RecoveryQueueFull { .. } => {
            "the cache is unavailable; try again shortly".to_owned()
        }
        Error::Compute(_) if error.is_source_unavailable() => {
            "the data source is unavailable; try again shortly".to_owned()
        }
        Error::WaitTimeout { .. } => {
            "the value is still being computed; try again shortly".to_owned()
        }
        Error::ComputeTimeout { .. } => {
            "the value took too long to compute; try again shortly".to_owned()
        }
        // The reason is one of the crate's fixed sentences; the key itself is not echoed back.
        Error::InvalidKey { reason, .. } => format!("invalid key: {reason}"),
        Error::TooManyKeys { limit, .. } => {
            format!("too many keys in one request (at most {limit})")
        }
        _ => "internal server error".to_owned(),
    }
}

/// How long a client should wait before trying again after `error`, for the errors that pass by
/// themselves (those [`status`] answers with 503): the wait the computation suggested with
/// [`SourceUnavailable::retry_after`](crate::SourceUnavailable::retry_after), else one second.
/// `None` for every other error, where retrying cannot help or is not the server's to suggest.
/// [`response`] sends it as `Retry-After`, in whole seconds rounded up.
///
/// ```
/// use stampede_guard::{web, ComputeError, Error, SourceUnavailable};
/// use std::time::Duration;
///
/// let down = Error::Compute(ComputeError::new(
///     SourceUnavailable::new("failover").retry_after(Duration::from_secs(30)),
/// ));
/// assert_eq!(web::retry_after(&down), Some(Duration::from_secs(30)));
///
/// let waited = Error::WaitTimeout { key: "2019-05".into(), waited: Duration::from_secs(30) };
/// assert_eq!(web::retry_after(&waited), Some(Duration::from_secs(1)));
///
/// let failed = Error::Compute(ComputeError::new("the query failed".to_string()));
/// assert_eq!(web::retry_after(&failed), None);
/// ```
pub fn retry_after(error: &Error) -> Option<Duration> {
    if status(error) != StatusCode::SERVICE_UNAVAILABLE {
        return None;
    }
    // The other causes are short-lived: the connection reconnects by itself, and a computation
    // being waited for lands or its lease runs out.
    let suggested = error.unavailable_source().and_then(|u| u.retry_after);
    Some(suggested.unwrap_or(DEFAULT_RETRY_AFTER))
}

/// The wait suggested for a 503 when nothing better is known.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// `after` as `Retry-After`'s delta-seconds: whole seconds, rounded up (so a wait is never
/// shortened), saturating at `u64::MAX` for `Duration::MAX`.
fn retry_after_header(after: Duration) -> HeaderValue {
    let secs = after
        .as_secs()
        .saturating_add(u64::from(after.subsec_nanos() > 0));
    HeaderValue::from(secs)
}

/// How often at most the 503s of [`response`] are logged at `warn`, with their count.
const UNAVAILABLE_LOG_EVERY: Duration = Duration::from_secs(60);

/// The whole response for a failed call, as the [`IntoResponse`] implementation of [`Error`]
/// gives it: the status of [`status`], a short plain-text body that reveals nothing of the
/// server, and on a 503 `Retry-After` ([`retry_after`]: one second unless the computation
/// suggested another wait). The full error, with its sources, is logged with
/// `tracing` (500: `error`, 503: `warn`, 400: `debug`), since the body leaves it out.
///
/// For handlers with an error type of their own, which hold this crate's error among others
/// (an enum, or a boxed error as with anyhow):
///
/// ```
/// use axum::http::StatusCode;
/// use axum::response::{IntoResponse, Response};
/// use stampede_guard::{web, Cache};
/// use std::time::Duration;
///
/// /// Anything boxed, as with anyhow; the cache's errors among them.
/// struct AppError(Box<dyn std::error::Error + Send + Sync>);
///
/// impl<E: Into<Box<dyn std::error::Error + Send + Sync>>> From<E> for AppError {
///     fn from(e: E) -> Self {
///         AppError(e.into())
///     }
/// }
///
/// impl IntoResponse for AppError {
///     fn into_response(self) -> Response {
///         match self.0.downcast_ref::<stampede_guard::Error>() {
///             Some(e) => web::response(e), // 503 + Retry-After, 500, 400; logged
///             None => {
///                 tracing::error!(error = %self.0, "request failed");
///                 StatusCode::INTERNAL_SERVER_ERROR.into_response()
///             }
///         }
///     }
/// }
///
/// async fn report(cache: Cache, month: String) -> Result<String, AppError> {
///     if let Some(report) = cache.get::<String>(&month).await? {
///         return Ok(report);
///     }
///     let key = month.clone();
///     let report = cache
///         .get_or_compute(&key, Duration::from_secs(300), move || async move {
///             Err::<String, _>(std::io::Error::other(format!("no database for {month}")))
///         })
///         .await?;
///     Ok(report)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let response = report(Cache::in_memory(), "2019-05".into()).await.into_response();
/// assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
/// # }
/// ```
pub fn response(error: &Error) -> Response {
    let status = status(error);
    match status {
        StatusCode::INTERNAL_SERVER_ERROR => {
            // A refusal says what to change in its message; `kind` lets alerts tell it apart.
            let kind = error.backend_kind().map_or("", |kind| kind.as_str());
            tracing::error!(%status, kind, error = %error.chain(), "stampede-guard call failed");
        }
        StatusCode::SERVICE_UNAVAILABLE => {
            // An outage answers every request with a 503: one line a minute with the count,
            // not one per request (the circuit breaker logs when Redis goes and comes back).
            static UNAVAILABLE: LogThrottle = LogThrottle::new();
            match UNAVAILABLE.due(UNAVAILABLE_LOG_EVERY) {
                Some(count) => tracing::warn!(%status, count, error = %error.chain(),
                    "stampede-guard calls failed (count since the last such line)"),
                None => {
                    tracing::debug!(%status, error = %error.chain(), "stampede-guard call failed")
                }
            }
        }
        _ => tracing::debug!(%status, error = %error.chain(), "stampede-guard call refused"),
    }
    let mut response = (status, public_message(error)).into_response();
    if let Some(after) = retry_after(error) {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, retry_after_header(after));
    }
    response
}

/// The response of [`response`].
impl IntoResponse for Error {
    fn into_response(self) -> Response {
        response(&self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Retry-After` is whole seconds: a suggested wait is rounded up, never shortened, and any
    /// `Duration` (up to `Duration::MAX`) gives a valid header.
    #[test]
    fn retry_after_is_whole_seconds_rounded_up() {
        for (after, header) in [
            (Duration::ZERO, "0"),
            (Duration::from_millis(1), "1"),
            (Duration::from_secs(1), "1"),
            (Duration::from_millis(2_500), "3"),
            (Duration::MAX, "18446744073709551615"),
        ] {
            assert_eq!(retry_after_header(after), header, "{after:?}");
        }
    }
}
