//! The crate's errors as JSON responses (the default): the same status, `Retry-After` and log
//! line as the plain-text ones, with `{"error": "...", "status": 503}` as the body.

use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

use super::error::{public_message, text_response};
use crate::Error;

/// A handler's error as a JSON response: what [`response`](crate::web::response) and the
/// crate's [`Error`] as a response give (the status, `Retry-After` on a 503, the log line with
/// the whole error, the body `{"error": "<the public sentence>", "status": <code>}`). `?` turns
/// the crate's [`Error`] into one; kept for handlers written before JSON became the default.
///
/// ```
/// use axum::response::IntoResponse;
/// use stampede_guard::{web::JsonError, Cache, SourceUnavailable};
/// use std::time::Duration;
///
/// async fn report(cache: Cache, month: String) -> Result<String, JsonError> {
///     let value = cache
///         .get_or_compute(&month, Duration::from_secs(300), || async {
///             Err::<String, _>(SourceUnavailable::new("the pool timed out"))
///         })
///         .await?;
///     Ok(value)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let response = report(Cache::in_memory(), "2019-05".into()).await.into_response();
/// assert_eq!(response.status(), 503);
/// assert_eq!(response.headers()["content-type"], "application/json");
/// assert_eq!(response.headers()["retry-after"], "1");
/// let body = axum::body::to_bytes(response.into_body(), 1024).await.unwrap();
/// assert_eq!(
///     std::str::from_utf8(&body).unwrap(),
///     r#"{"error":"the data source is unavailable; try again shortly","status":503}"#
/// );
/// # }
/// ```
#[derive(Debug)]
pub struct JsonError(pub Error);

impl From<Error> for JsonError {
    fn from(error: Error) -> Self {
        JsonError(error)
    }
}

impl IntoResponse for JsonError {
    fn into_response(self) -> Response {
        json_response(&self.0)
    }
}

/// The response of [`JsonError`] and of [`response`](crate::web::response), for handlers with
/// an error type of their own ([`text_response`](crate::web::text_response) is the plain-text
/// one).
///
/// ```
/// use stampede_guard::{web, Error};
/// use std::time::Duration;
///
/// let waited = Error::WaitTimeout { key: "2019-05".into(), waited: Duration::from_secs(30) };
/// let response = web::json_response(&waited);
/// assert_eq!(response.status(), 503);
/// assert_eq!(response.headers()["content-type"], "application/json");
/// ```
pub fn json_response(error: &Error) -> Response {
    let (mut parts, _text) = text_response(error).into_parts();
    let body = serde_json::json!({
        "error": public_message(error),
        "status": parts.status.as_u16(),
    })
    .to_string();
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    // The plain-text body's length, if one was set, is not this body's.
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body))
}

/// The whole response for a failed call, as the [`IntoResponse`] implementation of [`Error`]
/// gives it: the status of [`status`](crate::web::status), a short JSON body that reveals nothing of the server
/// (`{"error": "...", "status": 503}`, as [`json_response`](crate::web::json_response)), and on
/// a 503 `Retry-After` ([`retry_after`](crate::web::retry_after): one second unless the computation suggested another
/// wait). The full error, with its sources, is logged with `tracing` (500: `error`, 503:
/// `warn`, each kind of error at most once a minute with a count; 400: `debug`), since the body
/// leaves it out. [`text_response`](crate::web::text_response) gives the same with a plain-text body.
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
/// assert_eq!(response.headers()["content-type"], "application/json");
/// # }
/// ```
pub fn response(error: &Error) -> Response {
    json_response(error)
}

/// The response of [`response`].
impl IntoResponse for Error {
    fn into_response(self) -> Response {
        response(&self)
    }
}
