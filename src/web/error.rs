//! The crate's errors as HTTP responses: the status of each, `Retry-After`, the body that
//! reveals nothing of the server (JSON by default, plain text on request), and the log line
//! that has the rest, one per kind of error and minute.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::log::LogThrottle;
use crate::Error;

/// The HTTP status for `error`, as the [`IntoResponse`] implementation uses it (the table in the
/// [module docs](crate::web)).
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
        | Error::MissingFromBatch { .. }
        | Error::TooManyTags { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The client's view: what happened, in words that reveal nothing of the server.
pub(super) fn public_message(error: &Error) -> String {
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
/// [`response`](crate::web::response) sends it as `Retry-After`, in whole seconds rounded up.
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
pub(super) fn retry_after_header(after: Duration) -> HeaderValue {
    let secs = after
        .as_secs()
        .saturating_add(u64::from(after.subsec_nanos() > 0));
    HeaderValue::from(secs)
}

/// How often at most each kind of failed call is logged, with the count since its last line.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// What a failed call is, for its log line and its throttle: `source_unavailable`,
/// `compute_failed`, `backend_<kind>` (`backend_unreachable`, `backend_refused-permission`...),
/// `wait_timeout`... Never empty.
pub(super) fn error_kind(error: &Error) -> String {
    let name = match error {
        Error::Compute(_) if error.is_source_unavailable() => "source_unavailable",
        Error::Compute(_) => "compute_failed",
        Error::Backend { kind, .. } => return format!("backend_{}", kind.as_str()),
        Error::NoQuorum { .. } => "no_quorum",
        Error::WaitTimeout { .. } => "wait_timeout",
        Error::ComputeTimeout { .. } => "compute_timeout",
        Error::RecoveryQueueFull { .. } => "recovery_queue_full",
        Error::RecentFailure { .. } => "recent_failure",
        Error::InvalidKey { .. } => "invalid_key",
        Error::TooManyKeys { .. } => "too_many_keys",
        Error::Encode(_) => "encode",
        Error::ValueTooLarge { .. } => "value_too_large",
        Error::Config(_) => "config",
        Error::NotHeld { .. } => "not_held",
        Error::MissingFromBatch { .. } => "missing_from_batch",
        Error::TooManyTags { .. } => "too_many_tags",
    };
    name.to_owned()
}

/// The count of failed calls of `kind` since its last line, when a line is due (the first, then
/// at most one a minute per kind); `None` otherwise. An outage answers every request with the
/// same error: one line a minute says it, not one per request.
fn log_due(kind: &str) -> Option<u64> {
    static BY_KIND: LazyLock<Mutex<HashMap<String, LogThrottle>>> = LazyLock::new(Default::default);
    let mut by_kind = crate::sync::lock(&BY_KIND);
    if let Some(throttle) = by_kind.get(kind) {
        return throttle.due(LOG_EVERY);
    }
    let throttle = LogThrottle::new();
    let due = throttle.due(LOG_EVERY);
    by_kind.insert(kind.to_owned(), throttle);
    due
}

/// Logs a failed call: 500s at `error`, 503s at `warn` (an outage that passes), each kind at
/// most once a minute with the count since its last line; 400s (the client's) at `debug`.
fn log(error: &Error, status: StatusCode) {
    if status != StatusCode::INTERNAL_SERVER_ERROR && status != StatusCode::SERVICE_UNAVAILABLE {
        tracing::debug!(%status, error = %error.chain(), "stampede-guard call refused");
        return;
    }
    let kind = error_kind(error);
    let Some(count) = log_due(&kind) else {
        tracing::debug!(%status, kind, error = %error.chain(), "stampede-guard call failed");
        return;
    };
    if status == StatusCode::INTERNAL_SERVER_ERROR {
        tracing::error!(%status, kind, count, error = %error.chain(),
            "stampede-guard calls failed (count since the last line of this kind)");
    } else {
        tracing::warn!(%status, kind, count, error = %error.chain(),
            "stampede-guard calls failed (count since the last line of this kind)");
    }
}

/// [`response`](crate::web::response) with a short plain-text body instead of JSON (`text/plain`): the same status,
/// `Retry-After` and log line.
///
/// ```
/// use stampede_guard::{web, Error};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let waited = Error::WaitTimeout { key: "2019-05".into(), waited: Duration::from_secs(30) };
/// let response = web::text_response(&waited);
/// assert_eq!(response.status(), 503);
/// assert_eq!(response.headers()["retry-after"], "1");
/// let body = axum::body::to_bytes(response.into_body(), 1024).await.unwrap();
/// assert_eq!(&body[..], b"the value is still being computed; try again shortly");
/// # }
/// ```
pub fn text_response(error: &Error) -> Response {
    let status = status(error);
    log(error, status);
    let mut response = (status, public_message(error)).into_response();
    if let Some(after) = retry_after(error) {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, retry_after_header(after));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Retry-After` is whole seconds: a suggested wait is rounded up, never shortened, and any
    /// `Duration` (up to `Duration::MAX`) gives a valid header.
    /// Every log line names its kind: no empty field.
    #[test]
    fn every_error_has_a_kind() {
        let errors = [
            Error::WaitTimeout {
                key: "k".into(),
                waited: Duration::from_secs(1),
            },
            Error::Compute(crate::ComputeError::new("no such table".to_owned())),
            Error::Compute(crate::ComputeError::new(crate::SourceUnavailable::new(
                "down",
            ))),
        ];
        let kinds: Vec<String> = errors.iter().map(error_kind).collect();
        assert_eq!(
            kinds,
            ["wait_timeout", "compute_failed", "source_unavailable"]
        );
    }

    /// One line per kind and minute: the first of a kind is due at once, the next of the same
    /// kind is not, another kind is.
    #[test]
    fn each_kind_is_throttled_on_its_own() {
        assert_eq!(log_due("test_kind_a"), Some(1));
        assert_eq!(log_due("test_kind_a"), None);
        assert_eq!(log_due("test_kind_b"), Some(1));
    }

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
