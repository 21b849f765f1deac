//! [`Cache::inspect`](crate::Cache::inspect) as JSON, for an admin route.

use axum::extract::Path;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};

use super::health::json;
use crate::wire::codec::Codec;
use crate::Cache;

/// A router that answers `GET /{*key}` with what the cache holds for the key
/// ([`Cache::inspect`](crate::Cache::inspect)) as JSON: 200 with the
/// [`Inspection`](crate::Inspection) (a key that holds nothing has `"value": null`), the
/// crate's error response otherwise (400 for an empty or over-long key, 503 when the backend
/// fails). Never stored by a cache in front (`Cache-Control: no-store`).
///
/// The key is shown as a hash (`key_hash`), and so are the value's tags, unless the request
/// asks for them with `?show_keys=true`: keys often hold users' or tenants' ids, and the
/// route's answers may end up in logs. Nest it under a route only operators reach (it tells
/// what is cached and being computed, never a value); the key in the path is percent-decoded
/// and may hold `/`.
///
/// ```
/// use axum::{body::Body, http::Request, Router};
/// use stampede_guard::{web, Cache};
/// use std::time::Duration;
/// use tower::ServiceExt;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), stampede_guard::Error> {
/// let cache = Cache::in_memory();
/// let _ = cache.set("user:42", &7u32, Duration::from_secs(60)).await?;
/// let app: Router = Router::new().nest("/admin/cache", web::inspector(cache));
///
/// let request = Request::get("/admin/cache/user:42").body(Body::empty()).unwrap();
/// let response = app.oneshot(request).await.unwrap();
/// assert_eq!(response.status(), 200);
/// let body = axum::body::to_bytes(response.into_body(), 4096).await.unwrap();
/// let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
/// assert_eq!(json["key"], serde_json::Value::Null, "redacted");
/// assert_eq!(json["key_hash"], stampede_guard::Inspection::hash_of("user:42"));
/// assert_eq!(json["value"]["state"], "fresh");
/// # Ok(())
/// # }
/// ```
pub fn inspector<C, S>(cache: Cache<C>) -> axum::Router<S>
where
    C: Codec,
    S: Clone + Send + Sync + 'static,
{
    axum::Router::new().route(
        "/{*key}",
        axum::routing::get(move |Path(key): Path<String>, uri: Uri| {
            let cache = cache.clone();
            async move { inspect(&cache, &key, shows_keys(&uri)).await }
        }),
    )
}

/// The inspection of `key` as a response.
async fn inspect<C: Codec>(cache: &Cache<C>, key: &str, show_keys: bool) -> Response {
    match cache.inspect(key).await {
        Ok(inspection) => match serde_json::to_string(&inspection.show_keys(show_keys)) {
            Ok(body) => json(StatusCode::OK, body),
            // Plain fields: this does not happen.
            Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        },
        Err(e) => e.into_response(),
    }
}

/// Whether the query asks for the keys in clear: `show_keys=true` (or `1`). Read by hand: the
/// crate's axum has no `query` feature, and one flag needs no parser.
fn shows_keys(uri: &Uri) -> bool {
    (uri.query().unwrap_or(""))
        .split('&')
        .any(|pair| matches!(pair, "show_keys=true" | "show_keys=1" | "show_keys"))
}
