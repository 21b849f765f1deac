//! The health report as a readiness response, and the liveness/readiness pair of probes.

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::{Cache, Health};

/// The liveness probe's answer: 200 with `{"alive":true}`, always. It asks nothing of Redis:
/// a liveness probe that fails restarts the process, and a restart cannot fix a shared
/// dependency's outage; it only adds cold starts to it. Wire readiness to
/// [`Cache::health`](crate::Cache::health) instead (or use [`probes`]).
///
/// ```
/// use axum::{routing::get, Router};
/// use stampede_guard::web;
///
/// let app: Router = Router::new().route("/livez", get(web::liveness));
/// # let _ = app;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let response = web::liveness().await;
/// assert_eq!(response.status(), 200);
/// assert_eq!(response.headers()["cache-control"], "no-store");
/// # }
/// ```
pub async fn liveness() -> Response {
    json(StatusCode::OK, r#"{"alive":true}"#.to_owned())
}

/// The probes under the paths Kubernetes uses by convention: `GET /livez` ([`liveness`]: 200
/// while the process runs) and `GET /readyz` ([`Cache::health`](crate::Cache::health) as a
/// response: 200 while the instance serves, [`Healthy`](crate::HealthState::Healthy) or
/// [`Degraded`](crate::HealthState::Degraded), 503 when it is
/// [`Unavailable`](crate::HealthState::Unavailable); the report as JSON). Merge it into the
/// application's router, whatever its state. Guide: `docs/health-and-probes.md`.
///
/// ```
/// use axum::{routing::get, Router};
/// use stampede_guard::{web, Cache};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let cache = Cache::in_memory();
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .merge(web::probes(cache));
/// # let _ = app;
/// # }
/// ```
pub fn probes<S: Clone + Send + Sync + 'static>(cache: Cache) -> axum::Router<S> {
    axum::Router::new()
        .route("/livez", axum::routing::get(liveness))
        .route(
            "/readyz",
            axum::routing::get(move || {
                let cache = cache.clone();
                async move { cache.health().await }
            }),
        )
}

/// A probe's JSON answer, never stored by a cache in front (the response cache, a CDN): a
/// probe wants now.
pub(super) fn json(status: StatusCode, body: String) -> Response {
    (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        Body::from(body),
    )
        .into_response()
}

/// 200 when [`Health::is_ready`] (the instance serves: `Healthy` or `Degraded`), 503 when it is
/// `Unavailable`, with the report as JSON (its serialized fields: `state`, `ready`, `reasons`,
/// `reachable`, `breaker`, `failing_for_seconds`, ...). A readiness handler is one line (or
/// take both probes from [`probes`]):
///
/// ```
/// use axum::{extract::State, routing::get, Router};
/// use stampede_guard::Cache;
///
/// let app: Router = Router::new()
///     .route("/health", get(|State(cache): State<Cache>| async move { cache.health().await }))
///     .with_state(Cache::in_memory());
/// # let _ = app;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use axum::response::IntoResponse;
/// let response = Cache::in_memory().health().await.into_response();
/// assert_eq!(response.status(), 200);
/// assert_eq!(response.headers()["content-type"], "application/json");
/// assert_eq!(response.headers()["cache-control"], "no-store");
/// # }
/// ```
impl IntoResponse for Health {
    fn into_response(self) -> Response {
        let status = if self.is_ready() {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        match serde_json::to_string(&self) {
            Ok(body) => json(status, body),
            // The report is plain fields: this does not happen, and the status still says it.
            Err(_) => (
                status,
                [(header::CACHE_CONTROL, HeaderValue::from_static("no-store"))],
            )
                .into_response(),
        }
    }
}
