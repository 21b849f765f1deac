//! Where a handler's value came from, as a response header: the word for each [`Source`], the
//! header as response parts, and a [`Fetched`] value as a whole response.

use axum::http::{HeaderName, HeaderValue};
use axum::response::{IntoResponse, IntoResponseParts, Response, ResponseParts};

use crate::{Fetched, Source};

/// The header that says where a response came from: `x-cache`, as CDNs and reverse proxies name
/// it. The response cache's header name is configurable
/// (`ResponseCacheLayer::header_name`, feature `tower`); the handler-level impls use this one.
pub const SOURCE_HEADER: &str = "x-cache";

/// The header's word for `source`: `hit`, `stale`, `fallback` (the fail-safe's kept value),
/// `computed` (this request ran the computation), `waited` (another caller ran it while this one
/// waited), `held` (a copy this process held while the backend was unreachable) or `uncached`
/// (computed without the cache, the backend being down).
///
/// ```
/// use stampede_guard::{web, Source};
///
/// assert_eq!(web::source_name(Source::FailSafe), "fallback");
/// assert_eq!(web::source_name(Source::Waited), "waited");
/// ```
pub fn source_name(source: Source) -> &'static str {
    match source {
        Source::Hit => "hit",
        Source::Stale => "stale",
        Source::Computed => "computed",
        Source::Waited => "waited",
        Source::FailSafe => "fallback",
        Source::Held => "held",
        Source::Uncached => "uncached",
        // A source added later gets its word here; until then it is named for what it is not.
        #[allow(unreachable_patterns)]
        _ => "other",
    }
}

/// `x-cache: <source>` as response parts, beside any body:
/// `(fetched.source, Json(fetched.value))`.
///
/// ```
/// use axum::response::IntoResponse;
/// use stampede_guard::Source;
///
/// let response = (Source::Stale, "the report").into_response();
/// assert_eq!(response.headers()["x-cache"], "stale");
/// ```
impl IntoResponseParts for Source {
    type Error = std::convert::Infallible;

    fn into_response_parts(self, mut res: ResponseParts) -> Result<ResponseParts, Self::Error> {
        res.headers_mut().insert(
            HeaderName::from_static(SOURCE_HEADER),
            HeaderValue::from_static(source_name(self)),
        );
        Ok(res)
    }
}

/// The value's response with `x-cache: <source>`: a handler returns what
/// [`Cache::fetch`](crate::Cache::fetch) gave it, the value wrapped as it likes
/// ([`Fetched::map`]).
///
/// ```
/// use axum::response::IntoResponse;
/// use axum::Json;
/// use stampede_guard::{Cache, Computed, Error, Fetched};
/// use std::time::Duration;
///
/// async fn report(cache: Cache, month: String) -> Result<Fetched<Json<Vec<u32>>>, Error> {
///     let fetched = cache
///         .fetch(&month, Duration::from_secs(300), |_lease| async {
///             Ok::<_, std::io::Error>(Computed::new(vec![1, 2, 3]))
///         })
///         .await?;
///     Ok(fetched.map(Json))
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let cache = Cache::in_memory();
/// let first = report(cache.clone(), "2019-05".into()).await.into_response();
/// assert_eq!(first.headers()["x-cache"], "computed");
/// let again = report(cache, "2019-05".into()).await.into_response();
/// assert_eq!(again.headers()["x-cache"], "hit");
/// # }
/// ```
impl<T: IntoResponse> IntoResponse for Fetched<T> {
    fn into_response(self) -> Response {
        (self.source, self.value).into_response()
    }
}
