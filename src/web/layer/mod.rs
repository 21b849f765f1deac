//! A `tower::Layer` that caches whole `GET`/`HEAD` responses through the crate (feature
//! `tower`): one handler execution per key across every instance sharing the cache.
//!
//! This file is the settings and the `Layer`; the request's path through the cache is
//! `service.rs`, and one file each holds the key (`key.rs`), `Cache-Control` (`directives.rs`),
//! the stored form (`stored.rs`) and reading a body up to the limit (`body.rs`).

mod body;
mod directives;
mod key;
mod service;
mod stored;
mod tags;

use std::sync::Arc;
use std::time::Duration;

use axum::http::{request, HeaderName, StatusCode};

pub use service::ResponseCache;

use crate::{Bincode, Cache, Codec};

/// A key function's type: a request's head in, the key's extra part out (`None`: do not cache).
type KeyFn = Arc<dyn Fn(&request::Parts) -> Option<String> + Send + Sync>;

/// A tag function's type: a request's head in, the tags of what is stored for it out (`None`:
/// do not cache).
type TagFn = Arc<dyn Fn(&request::Parts) -> Option<Vec<String>> + Send + Sync>;

/// Caches whole responses of the services it wraps, through a [`Cache`]: the first request for
/// a key runs the handler, and every other request for it, on this instance or another one
/// sharing the cache, waits for that response and gets it, then reads it until it expires.
///
/// # What is cached, under which key
/// - `GET` and `HEAD` requests (a `HEAD` reads and fills `GET`'s entry; its response has no
///   body). Other methods pass through untouched. So does a request with `Range` (a part is
///   not the whole response), or whose key is longer than
///   [`MAX_KEY_BYTES`](crate::MAX_KEY_BYTES).
/// - The key is the method, the path and the query as sent, then the [key
///   function](Self::key_fn)'s part (a tenant, the host), then the values of the request
///   headers that the response names in `Vary`. A `Vary` is learned from the first response:
///   the layer stores the header names under the key without them, and the response under the
///   key with this request's values; later requests read the names first, then the response
///   for their own values. `Vary: *` is never stored.
/// - A response is stored when its status is one of [`statuses`](Self::statuses) (200 by
///   default), its body is at most [`max_body_bytes`](Self::max_body_bytes) (a larger one is
///   streamed to the client, never held whole), it has no `Set-Cookie`, and its `Cache-Control`
///   has none of `no-store`, `private`, `no-cache` (each with or without a field list), nor a
///   `max-age`/`s-maxage` of 0. To a request with `Authorization` (which passes unless
///   [`cache_credentialed`](Self::cache_credentialed)), only a response that says `public`,
///   `s-maxage` or `must-revalidate` is stored (RFC 9111 §3.5).
/// - It is kept for its `s-maxage`, else its `max-age`, else the layer's [`ttl`](Self::ttl).
/// - It carries the tags the [tag function](Self::tag_fn) gives for the request (a tenant, a
///   report), besides the cache handle's own: [`Cache::invalidate_tag`](crate::Cache::invalidate_tag)
///   of one removes it, on every instance.
/// - A response that is not stored marks its key as passing for
///   [`pass_ttl`](Self::pass_ttl): requests for it go straight to the handler, concurrently,
///   instead of waiting in turn for a response that will not be shared.
/// - A 5xx response is a failed computation: with the fail-safe on
///   ([`CallOptions::fail_safe_for`](crate::CallOptions::fail_safe_for)) the last good
///   response is served instead (`x-cache: fallback`); without one, the requests waiting in
///   this process get the same 5xx (unless it is `private`, `no-store` or sets a cookie: then
///   each runs the handler itself), and nothing is stored.
///
/// # Requests that name a user, and the request's `Cache-Control`
/// A request with `Authorization` or `Cookie` passes (the handler answers it, nothing is looked
/// up or stored): its response may be that user's own, and a key that does not name the user
/// would serve it to everyone. [`cache_credentialed(true)`](Self::cache_credentialed) caches them
/// when the [key function](Self::key_fn) names the user (or the responses are the same for all).
///
/// The request's `Cache-Control` is ignored by default (as CDNs commonly do): honoured, any
/// client could skip the fleet's single flight with `no-cache`.
/// [`request_cache_control(true)`](Self::request_cache_control) honours it: `no-store`,
/// `no-cache` or `max-age=0` skip the cache (the handler answers, nothing is stored), and
/// `max-age=N` skips a stored response older than N seconds.
///
/// # What a response says
/// The [header](Self::header_name) (`x-cache` by default) is `hit`, `stale` (served while a
/// refresh runs in the background, [`stale_for`](crate::CallOptions::stale_for)), `fallback`
/// (the fail-safe's kept response), `held` (the near tier's copy while the backend is down),
/// `computed` (this request ran the handler), `waited` (another request ran it while this one
/// waited), `uncached` (the cache's backend failed: the handler answered, nothing was stored),
/// `pass` (the handler answered and the response was not stored), or `error` (the wait for
/// another request's handler timed out). A stored response carries an
/// `ETag` (its own, or one made from its body) and, when read from the cache, `Age`; a request
/// whose `If-None-Match` names it gets `304 Not Modified`. Conditional request headers are
/// removed from the request that computes a stored response, so the handler always produces
/// the whole response.
///
/// # Options, failures, panics
/// The cache handle's [`CallOptions`](crate::CallOptions) apply (the stale window, the
/// fail-safe, the wait bound...), except `negative_ttl`: a remembered failure has no response to
/// replay. When the cache's backend fails (Redis down or refusing), the handler answers without
/// the cache (`x-cache: uncached`), once per request; a wait that timed out is the response of
/// [`web::response`](crate::web::response) (503 with `Retry-After`). A handler that panics
/// frees the key's lock as any computation does: a waiting request, here or elsewhere, runs
/// the handler instead; the panic goes on to the server (axum logs it and closes the
/// connection).
///
/// A `GET`'s body has no meaning (RFC 9110 §9.3.1): the handler that computes a response for
/// the cache gets an empty one (the request's own goes with it when it passes through).
///
/// ```
/// use axum::{routing::get, Router};
/// use stampede_guard::{web::ResponseCacheLayer, Cache};
/// use std::time::Duration;
/// use tower::ServiceExt;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let cache = Cache::in_memory();
/// let app: Router = Router::new()
///     .route("/report/{month}", get(|| async { "the slow report" }))
///     .layer(ResponseCacheLayer::new(cache).ttl(Duration::from_secs(300)));
///
/// let get = || axum::http::Request::get("/report/2019-05").body(axum::body::Body::empty()).unwrap();
/// let first = app.clone().oneshot(get()).await.unwrap();
/// assert_eq!(first.headers()["x-cache"], "computed");
/// let again = app.oneshot(get()).await.unwrap();
/// assert_eq!(again.headers()["x-cache"], "hit");
/// assert!(again.headers().contains_key("etag"));
/// # }
/// ```
#[must_use]
pub struct ResponseCacheLayer<C = Bincode> {
    cache: Cache<C>,
    config: Arc<Config>,
}

/// The layer's settings, shared by every service it builds.
#[derive(Clone)]
pub(crate) struct Config {
    ttl: Duration,
    pass_ttl: Duration,
    statuses: Vec<StatusCode>,
    max_body_bytes: usize,
    header: HeaderName,
    prefix: String,
    key_fn: Option<KeyFn>,
    tag_fn: Option<TagFn>,
    request_cache_control: bool,
    /// Whether requests with `Authorization` or `Cookie` go through the cache (the key function
    /// names the user); by default they pass.
    credentialed: bool,
}

impl<C: Codec> ResponseCacheLayer<C> {
    /// A layer caching through `cache`, with its options (but `negative_ttl`), a TTL of 60 s
    /// for responses that give none, status 200 only, bodies up to 1 MiB, the `x-cache` header
    /// and keys prefixed `http:`.
    ///
    /// ```
    /// let layer = stampede_guard::web::ResponseCacheLayer::new(stampede_guard::Cache::in_memory());
    /// # let _ = layer;
    /// ```
    pub fn new(cache: Cache<C>) -> Self {
        // A remembered failure is an error without the response that caused it.
        let cache = cache.with_options(cache.options().clone().negative_ttl(None));
        ResponseCacheLayer {
            cache,
            config: Arc::new(Config {
                ttl: Duration::from_secs(60),
                pass_ttl: Duration::from_secs(10),
                statuses: vec![StatusCode::OK],
                max_body_bytes: 1 << 20,
                header: HeaderName::from_static(super::SOURCE_HEADER),
                prefix: "http:".to_owned(),
                key_fn: None,
                tag_fn: None,
                request_cache_control: false,
                credentialed: false,
            }),
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Config)) -> Self {
        change(Arc::make_mut(&mut self.config));
        self
    }

    /// How long a response is kept when its `Cache-Control` gives no `s-maxage` or `max-age`.
    /// Any duration is taken ([`FOREVER`](crate::FOREVER) or more: no expiry).
    ///
    /// ```
    /// # let cache = stampede_guard::Cache::in_memory();
    /// let layer = stampede_guard::web::ResponseCacheLayer::new(cache)
    ///     .ttl(std::time::Duration::from_secs(300));
    /// # let _ = layer;
    /// ```
    pub fn ttl(self, ttl: Duration) -> Self {
        self.with(|c| c.ttl = crate::time::saturate(ttl))
    }

    /// How long a key whose response was not stored goes straight to the handler (10 s by
    /// default). Zero asks the cache again on every request (requests for such a key then
    /// queue behind one another, across the fleet, one handler execution at a time).
    ///
    /// ```
    /// # let cache = stampede_guard::Cache::in_memory();
    /// let layer = stampede_guard::web::ResponseCacheLayer::new(cache)
    ///     .pass_ttl(std::time::Duration::from_secs(60));
    /// # let _ = layer;
    /// ```
    pub fn pass_ttl(self, pass_ttl: Duration) -> Self {
        self.with(|c| c.pass_ttl = crate::time::saturate(pass_ttl))
    }

    /// The statuses whose responses are stored (200 only by default; RFC 9111 allows 203, 204,
    /// 300, 301, 308, 404, 405, 410, 414 and 501 too).
    ///
    /// ```
    /// use axum::http::StatusCode;
    /// # let cache = stampede_guard::Cache::in_memory();
    /// let layer = stampede_guard::web::ResponseCacheLayer::new(cache)
    ///     .statuses([StatusCode::OK, StatusCode::NOT_FOUND]);
    /// # let _ = layer;
    /// ```
    pub fn statuses(self, statuses: impl IntoIterator<Item = StatusCode>) -> Self {
        let statuses = statuses.into_iter().collect();
        self.with(|c| c.statuses = statuses)
    }

    /// The largest body stored, in bytes (1 MiB by default). A larger body is streamed to the
    /// client as it comes and not stored; the key then passes for
    /// [`pass_ttl`](Self::pass_ttl). The crate's own bound on a value,
    /// [`MAX_VALUE_BYTES`](crate::MAX_VALUE_BYTES), applies too.
    ///
    /// ```
    /// # let cache = stampede_guard::Cache::in_memory();
    /// let layer = stampede_guard::web::ResponseCacheLayer::new(cache).max_body_bytes(64 << 10);
    /// # let _ = layer;
    /// ```
    pub fn max_body_bytes(self, max: usize) -> Self {
        self.with(|c| c.max_body_bytes = max)
    }

    /// The header that says where a response came from (`x-cache` by default).
    ///
    /// ```
    /// use axum::http::HeaderName;
    /// # let cache = stampede_guard::Cache::in_memory();
    /// let layer = stampede_guard::web::ResponseCacheLayer::new(cache)
    ///     .header_name(HeaderName::from_static("x-report-cache"));
    /// # let _ = layer;
    /// ```
    pub fn header_name(self, name: HeaderName) -> Self {
        self.with(|c| c.header = name)
    }

    /// The prefix of every key the layer writes (`http:` by default), so that responses and the
    /// application's own keys in the same namespace never meet.
    ///
    /// ```
    /// # let cache = stampede_guard::Cache::in_memory();
    /// let layer = stampede_guard::web::ResponseCacheLayer::new(cache).key_prefix("reports-api:");
    /// # let _ = layer;
    /// ```
    pub fn key_prefix(self, prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        self.with(|c| c.prefix = prefix)
    }

    /// A part of the key for what the path does not say: the tenant, the host, a role. It reads
    /// the request's head; `None` passes the request through uncached (no tenant: nothing
    /// shared).
    ///
    /// ```
    /// # let cache = stampede_guard::Cache::in_memory();
    /// let layer = stampede_guard::web::ResponseCacheLayer::new(cache).key_fn(|request| {
    ///     let tenant = request.headers.get("x-tenant")?.to_str().ok()?;
    ///     Some(format!("tenant={tenant}"))
    /// });
    /// # let _ = layer;
    /// ```
    pub fn key_fn(
        self,
        key: impl Fn(&request::Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        let key: KeyFn = Arc::new(key);
        self.with(|c| c.key_fn = Some(key))
    }

    /// Tags for what is stored for a request, read from its head (the tenant, the resource),
    /// so that [`Cache::invalidate_tag`](crate::Cache::invalidate_tag) after a change removes
    /// the responses that showed the old data, on every instance, whatever their paths and
    /// `Vary` values: no key to rebuild by hand. A hit checks the tags' epochs in the same
    /// round trip as the response (`docs/tags.md`); the function runs once per request that
    /// goes through the cache.
    ///
    /// `None`, an empty tag, one over [`MAX_KEY_BYTES`](crate::MAX_KEY_BYTES) or more than
    /// [`MAX_TAGS`](crate::MAX_TAGS) (with the cache handle's own) pass the request through
    /// uncached (`x-cache: pass`): a response stored without the tag it should carry would
    /// outlive the invalidation meant for it. That is logged at `warn` once a minute at most,
    /// with the count of such requests since the last line.
    ///
    /// ```
    /// use axum::{routing::get, Router};
    /// use stampede_guard::{web::ResponseCacheLayer, Cache};
    /// use tower::ServiceExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = Cache::in_memory();
    /// let tenant = |request: &axum::http::request::Parts| {
    ///     Some(request.headers.get("x-tenant")?.to_str().ok()?.to_owned())
    /// };
    /// let app: Router = Router::new()
    ///     .route("/summary", get(|| async { "the tenant's summary" }))
    ///     .layer(
    ///         ResponseCacheLayer::new(cache.clone())
    ///             .key_fn(move |request| tenant(request))
    ///             .tag_fn(move |request| Some([format!("tenant:{}", tenant(request)?)])),
    ///     );
    /// let get = || {
    ///     axum::http::Request::get("/summary")
    ///         .header("x-tenant", "7")
    ///         .body(axum::body::Body::empty())
    ///         .unwrap()
    /// };
    /// let first = app.clone().oneshot(get()).await.unwrap();
    /// assert_eq!(first.headers()["x-cache"], "computed");
    /// // Tenant 7's data changed: its cached responses go.
    /// let _ = cache.invalidate_tag("tenant:7").await?;
    /// let again = app.oneshot(get()).await.unwrap();
    /// assert_eq!(again.headers()["x-cache"], "computed");
    /// # Ok(())
    /// # }
    /// ```
    pub fn tag_fn<F, I>(self, tags: F) -> Self
    where
        F: Fn(&request::Parts) -> Option<I> + Send + Sync + 'static,
        I: IntoIterator,
        I::Item: Into<String>,
    {
        let tags: TagFn =
            Arc::new(move |parts| Some(tags(parts)?.into_iter().map(Into::into).collect()));
        self.with(|c| c.tag_fn = Some(tags))
    }

    /// Whether the request's `Cache-Control` (`no-store`, `no-cache`, `max-age`) is honoured
    /// (no by default: any client could otherwise skip the single flight).
    ///
    /// ```
    /// # let cache = stampede_guard::Cache::in_memory();
    /// let layer = stampede_guard::web::ResponseCacheLayer::new(cache).request_cache_control(true);
    /// # let _ = layer;
    /// ```
    pub fn request_cache_control(self, honour: bool) -> Self {
        self.with(|c| c.request_cache_control = honour)
    }

    /// Whether requests with `Authorization` or `Cookie` go through the cache (no by default:
    /// they pass). Turn it on only with a [key function](Self::key_fn) that names the user, or
    /// for responses that are the same for every user.
    ///
    /// ```
    /// # let cache = stampede_guard::Cache::in_memory();
    /// let layer = stampede_guard::web::ResponseCacheLayer::new(cache)
    ///     .key_fn(|request| Some(request.headers.get("x-user")?.to_str().ok()?.to_owned()))
    ///     .cache_credentialed(true);
    /// # let _ = layer;
    /// ```
    pub fn cache_credentialed(self, cache: bool) -> Self {
        self.with(|c| c.credentialed = cache)
    }
}

impl<C> ResponseCacheLayer<C> {
    /// The cache key of a `GET` (and `HEAD`) of `target`, the path and query as clients send
    /// them, for the layer's cache to [`invalidate`](crate::Cache::invalidate) after a change:
    /// the next request runs the handler again. For a layer with a
    /// [key function](Self::key_fn), `extra` is the part it gives for the requests concerned.
    ///
    /// A resource whose responses vary (`Vary`) keeps one entry per value of the named headers
    /// besides this one, and only this one is named here: give such resources a short TTL, a
    /// [tag function](Self::tag_fn) (then [`invalidate_tag`](crate::Cache::invalidate_tag)
    /// reaches every entry), or make the key function's part change with the data.
    ///
    /// ```
    /// use stampede_guard::{web::ResponseCacheLayer, Cache};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), stampede_guard::Error> {
    /// let cache = Cache::in_memory();
    /// let layer = ResponseCacheLayer::new(cache.clone());
    /// assert_eq!(layer.key("/report/2019-05", None), "http:GET /report/2019-05");
    /// let _ = cache.invalidate(&layer.key("/report/2019-05", None)).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn key(&self, target: &str, extra: Option<&str>) -> String {
        key::of(&self.config.prefix, &axum::http::Method::GET, target, extra)
    }
}

impl<C> Clone for ResponseCacheLayer<C> {
    fn clone(&self) -> Self {
        ResponseCacheLayer {
            cache: self.cache.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<C> std::fmt::Debug for ResponseCacheLayer<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseCacheLayer")
            .field("cache", &self.cache)
            .field("config", &self.config)
            .finish()
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("ttl", &self.ttl)
            .field("pass_ttl", &self.pass_ttl)
            .field("statuses", &self.statuses)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("header", &self.header)
            .field("prefix", &self.prefix)
            .field("key_fn", &self.key_fn.is_some())
            .field("tag_fn", &self.tag_fn.is_some())
            .field("request_cache_control", &self.request_cache_control)
            .field("credentialed", &self.credentialed)
            .finish()
    }
}

impl<S, C> tower::Layer<S> for ResponseCacheLayer<C> {
    type Service = ResponseCache<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        ResponseCache::new(inner, self.cache.clone(), Arc::clone(&self.config))
    }
}
