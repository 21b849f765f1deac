//! The health report as a readiness response.

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::Health;

/// 200 when [`Health::is_ready`], 503 otherwise, with the report as JSON (its serialized
/// fields: `reachable`, `breaker`, `failing_for_seconds`, ...). A readiness handler is one line:
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
        // Never stored by a cache in front (the response cache, a CDN): a probe wants now.
        let no_store = (header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        match serde_json::to_string(&self) {
            Ok(json) => (
                status,
                [
                    (
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    ),
                    no_store,
                ],
                Body::from(json),
            )
                .into_response(),
            // The report is plain fields: this does not happen, and the status still says it.
            Err(_) => (status, [no_store]).into_response(),
        }
    }
}
