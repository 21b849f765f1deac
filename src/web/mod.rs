//! HTTP for axum services (feature `axum`; the response cache also needs feature `tower`).
//!
//! | item | what it does |
//! |---|---|
//! | [`IntoResponse`] for [`Error`], [`response`], [`status`], [`retry_after`] | the crate's errors as responses: 503 + `Retry-After` for what passes, 500, 400 (the table below), with a JSON body `{"error": "...", "status": 503}` |
//! | [`text_response`] | the same responses with a plain-text body |
//! | [`JsonError`], [`json_response`] | the JSON responses under their earlier names |
//! | [`IntoResponse`] for [`Fetched`](crate::Fetched), [`IntoResponseParts`](axum::response::IntoResponseParts) for [`Source`](crate::Source), [`SOURCE_HEADER`] | where a handler's value came from, as an `x-cache` header: `hit`, `stale`, `fallback`, `computed`, `waited`... |
//! | [`IntoResponse`] for [`Health`](crate::Health), [`probes`], [`liveness`] | a readiness handler: 200 while the instance serves ([`Health::is_ready`](crate::Health::is_ready): healthy, or degraded with Redis down), 503 when it cannot, the report as JSON; `/livez` and `/readyz` for Kubernetes |
//! | [`inspector`] | an admin route's JSON of [`Cache::inspect`](crate::Cache::inspect): what the cache holds for a key (value, windows, tags, lock holder, fence, near copy), the key redacted unless asked |
//! | [`Shutdown`], [`shutdown_signal`] | one Ctrl-C/SIGTERM signal that `axum::serve(..).with_graceful_shutdown` and [`Leader::run`](crate::leader::Leader::run) both await |
//! | `ResponseCacheLayer` (feature `tower`) | a `tower::Layer` that caches whole `GET`/`HEAD` responses through the crate: one handler execution per key across the fleet |
//!
//! # Errors as responses
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
//! | [`Error::Compute`] whose source is unavailable ([`Error::is_source_unavailable`]: a [`SourceUnavailable`](crate::SourceUnavailable), a lost connection, or with feature `sqlx` a down or busy database's sqlx error in its chain) | 503 Service Unavailable, `Retry-After` (1 s, or the wait the computation suggested) | your database or upstream is down or unreachable: an outage that passes, even for a key never cached |
//! | any other [`Error::Compute`], [`Error::RecentFailure`] | 500 Internal Server Error | the computation (your query) failed, now or a moment ago |
//! | [`Error::InvalidKey`] | 400 Bad Request | the key, usually built from the request, is empty or too long |
//! | [`Error::TooManyKeys`] | 400 Bad Request | a many-key call, usually over a range the request asked for, has more keys than one call takes |
//! | anything else ([`Error::Encode`], [`Error::ValueTooLarge`], [`Error::Config`], [`Error::NotHeld`], [`Error::MissingFromBatch`]) | 500 Internal Server Error | a bug or a misconfiguration on the server side |
//!
//! The body is JSON with a short sentence that reveals nothing of the server
//! (`{"error": "the cache is unavailable; try again shortly", "status": 503}`;
//! [`text_response`] gives it as plain text): the computation's error, Redis addresses and the
//! like go to the log instead (`tracing`, at `error` level for 500s and `warn` for 503s, with
//! the full error and its sources, one line per kind of error and minute with the count since
//! the last, in a field `kind`). Handlers with an error type of their own get the same whole
//! response (status, `Retry-After`, the log line) from [`response`]; those that need another
//! mapping can build it from [`status`] and [`retry_after`].
//!
//! A database outage is a 503 when the computation's error says so: with feature `sqlx`, a
//! down or busy database's sqlx error does by itself (a pool time-out, I/O, a terminated
//! connection...; the list is on [`Error::is_source_unavailable`]); otherwise return (or wrap
//! in a boxed error) a [`SourceUnavailable`](crate::SourceUnavailable), or let a lost
//! connection's [`std::io::Error`] reach the cache in a form it can see into.
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

mod error;
mod health;
mod inspect;
mod json;
#[cfg(feature = "tower")]
mod layer;
mod shutdown;
mod source;

pub use error::{retry_after, status, text_response};
pub use health::{liveness, probes};
pub use inspect::inspector;
pub use json::{json_response, response, JsonError};
#[cfg(feature = "tower")]
pub use layer::{ResponseCache, ResponseCacheLayer};
pub use shutdown::{shutdown_signal, Shutdown};
pub use source::{source_name, SOURCE_HEADER};

// The module docs' links.
#[allow(unused_imports)]
use {crate::Error, axum::response::IntoResponse};
