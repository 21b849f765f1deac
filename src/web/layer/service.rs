//! A request's path through the response cache: pass it through, or fetch its key (one hop, or
//! two when the resource varies), computing the response with the handler on a miss, and
//! answering from what the cache gives back.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, request, HeaderMap, HeaderValue, Method, Request, Response};
use http_body::Body as HttpBody;
use tower::{Service, ServiceExt};

use super::body::{self, Read};
use super::directives::Directives;
use super::key::{self, Vary};
use super::stored::{Entry, StoredResponse};
use super::Config;
use crate::sync::lock;
use crate::web::source_name;
use crate::{Bincode, Cache, Codec, Computed, Error, Fetched, Lease, Source};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The service that [`ResponseCacheLayer`](super::ResponseCacheLayer) wraps around another:
/// see the layer for what it does.
pub struct ResponseCache<S, C = Bincode> {
    inner: S,
    cache: Cache<C>,
    config: Arc<Config>,
}

impl<S, C> ResponseCache<S, C> {
    pub(super) fn new(inner: S, cache: Cache<C>, config: Arc<Config>) -> Self {
        ResponseCache {
            inner,
            cache,
            config,
        }
    }
}

impl<S: Clone, C> Clone for ResponseCache<S, C> {
    fn clone(&self) -> Self {
        ResponseCache::new(
            self.inner.clone(),
            self.cache.clone(),
            Arc::clone(&self.config),
        )
    }
}

impl<S, C> std::fmt::Debug for ResponseCache<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseCache")
            .field("cache", &self.cache)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S, C, ReqBody, ResBody> Service<Request<ReqBody>> for ResponseCache<S, C>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Default + Send + 'static,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
    C: Codec,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The service polled ready serves this request; its clone waits for the next poll.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let flow = Flow {
            inner,
            cache: self.cache.clone(),
            config: Arc::clone(&self.config),
            request: PhantomData,
        };
        Box::pin(flow.serve(request))
    }
}

/// One request's trip.
struct Flow<S, C, ReqBody> {
    inner: S,
    cache: Cache<C>,
    config: Arc<Config>,
    request: PhantomData<fn(ReqBody)>,
}

/// The request's head, shared with the computation: cloned only when the handler runs for the
/// cache (not on a hit), and never taken from the request, which keeps it for a pass after the
/// fetch even while a background refresh computes with it.
type Head = Arc<request::Parts>;

/// What this request's own handler execution answered, when the client gets that rather than
/// the entry (a response not stored, a response stored under another key, a service error),
/// with the word for the header.
type Own<E> = Arc<Mutex<Option<(Result<Response<Body>, E>, &'static str)>>>;

/// What the computation of one hop returns: the entry to store, or the handler's failure.
type ComputeFuture = Pin<Box<dyn Future<Output = Result<Computed<Entry>, HandlerFailed>> + Send>>;

/// A 5xx from the handler: the computation failed (so the fail-safe applies). The response,
/// when its body was within the limit, goes to the requests of this process that waited.
#[derive(Debug)]
struct HandlerFailed(Option<StoredResponse>);

impl std::fmt::Display for HandlerFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the handler answered with a server error (not stored)")
    }
}

/// What the request asked of the cache, read before the request moves.
struct Asked {
    head: bool,
    /// Its `If-None-Match` fields (usually none: an empty map does not allocate).
    conditional: HeaderMap,
    /// Its `Cache-Control: max-age`, if honoured.
    max_age: Option<u64>,
}

impl<S, C, ReqBody, ResBody> Flow<S, C, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Default + Send + 'static,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
    C: Codec,
{
    async fn serve(mut self, request: Request<ReqBody>) -> Result<Response<Body>, S::Error> {
        let method = request.method();
        if method != Method::GET && method != Method::HEAD {
            let response = self.inner.oneshot(request).await?;
            return Ok(response.map(Body::new));
        }
        let (parts, body) = request.into_parts();
        let Some((primary, asked)) = self.admit(&parts) else {
            return self.pass(Request::from_parts(parts, body), "pass").await;
        };
        let parts: Head = Arc::new(parts);
        let mut key = primary.clone();
        let mut names: Vec<String> = Vec::new();
        // How the handler's own answer is labelled when the cache does not give one.
        let mut word = "pass";
        // Two hops at most: the primary key, then (if the resource varies) the secondary.
        for _hop in 0..2 {
            let own: Own<S::Error> = Arc::default();
            let compute = self.computation(&parts, &primary, &names, &own, asked.head);
            let fetched = self.cache.fetch(&key, self.config.ttl, compute).await;
            if let Some((response, word)) = lock(&own).take() {
                let ran_here = match &fetched {
                    Ok(fetched) => matches!(fetched.source, Source::Computed | Source::Uncached),
                    Err(_) => true,
                };
                if ran_here {
                    return response.map(|r| self.label(r, word, asked.head));
                }
            }
            match fetched {
                Ok(Fetched {
                    value: Entry::Response(stored),
                    source,
                    stored: in_cache,
                    ..
                }) => {
                    if asked.max_age.is_some_and(|max| stored.age() > max) {
                        break; // older than the client accepts
                    }
                    return Ok(self.reply(stored, source, in_cache, &asked));
                }
                Ok(Fetched {
                    value: Entry::Vary(vary),
                    ..
                }) if names.is_empty() => {
                    let Some(secondary) = key::secondary(&primary, &vary, &parts.headers) else {
                        break;
                    };
                    (key, names) = (secondary, vary);
                }
                Ok(_) => break, // a passing key (or a marker where none belongs)
                Err(error) => {
                    if let Some(HandlerFailed(Some(stored))) = error.compute_error() {
                        // Another request here ran the handler: its 5xx, not another run.
                        let response = stored.clone().into_response(asked.head);
                        return Ok(self.label(response, "waited", asked.head));
                    }
                    if error.is_backend() {
                        // The cache is down, not the handler: answer without the cache, as
                        // `OnBackendError::ComputeUncached` would (one run per request).
                        word = "uncached";
                        break;
                    }
                    if !passes(&error) {
                        let response = crate::web::response(&error);
                        return Ok(self.label(response, "error", asked.head));
                    }
                    break;
                }
            }
        }
        // The head is shared only while a background refresh still holds it.
        let parts = Arc::try_unwrap(parts).unwrap_or_else(|shared| (*shared).clone());
        self.pass(Request::from_parts(parts, body), word).await
    }

    /// The primary key and what the request asks, or `None` for a request that passes. With a
    /// tag function, the flow's cache becomes a handle carrying the request's tags.
    fn admit(&mut self, parts: &request::Parts) -> Option<(String, Asked)> {
        if parts.headers.contains_key(header::RANGE) {
            return None;
        }
        // A request that says who asks (a session cookie, credentials) is answered for that
        // user: looked up or stored under a key that does not name the user, it would be served
        // to everyone (Varnish passes such requests too). Unless the key function names the user.
        let credentialed = parts.headers.contains_key(header::AUTHORIZATION)
            || parts.headers.contains_key(header::COOKIE);
        if credentialed && !self.config.credentialed {
            return None;
        }
        let mut max_age = None;
        if self.config.request_cache_control {
            let asked = Directives::of(&parts.headers);
            if asked.no_store || asked.no_cache || asked.max_age == Some(0) {
                return None;
            }
            max_age = asked.max_age;
        }
        let extra = match &self.config.key_fn {
            Some(key_fn) => Some(key_fn(parts)?),
            None => None,
        };
        let primary = key::primary(&self.config.prefix, parts, extra.as_deref());
        if primary.len() > crate::MAX_KEY_BYTES {
            return None;
        }
        if let Some(tag_fn) = &self.config.tag_fn {
            self.cache = super::tags::tagged(&self.cache, tag_fn, parts)?;
        }
        let mut conditional = HeaderMap::new();
        for value in parts.headers.get_all(header::IF_NONE_MATCH) {
            conditional.append(header::IF_NONE_MATCH, value.clone());
        }
        Some((
            primary,
            Asked {
                head: parts.method == Method::HEAD,
                conditional,
                max_age,
            },
        ))
    }

    /// The computation for one hop: runs the handler on the request (as a `GET`, without its
    /// conditional headers and body), and sorts the response into what is stored.
    fn computation(
        &self,
        parts: &Head,
        primary: &str,
        names: &[String],
        own: &Own<S::Error>,
        head: bool,
    ) -> impl FnOnce(Lease) -> ComputeFuture + Send + 'static {
        let computing = Computing {
            inner: self.inner.clone(),
            cache: self.cache.clone(),
            config: Arc::clone(&self.config),
            parts: Arc::clone(parts),
            body: PhantomData,
            primary: primary.to_owned(),
            names: names.to_vec(),
            own: Arc::clone(own),
            head,
        };
        move |_lease| Box::pin(computing.run())
    }

    /// The handler's answer, uncached.
    async fn pass(
        self,
        request: Request<ReqBody>,
        word: &'static str,
    ) -> Result<Response<Body>, S::Error> {
        let head = request.method() == Method::HEAD;
        let response = self.inner.clone().oneshot(request).await?;
        Ok(self.label(response.map(Body::new), word, head))
    }

    /// A stored response as this request gets it: whole, without its body, or 304. `in_cache`:
    /// whether the cache holds it (not when computed while the backend was down, nor when its
    /// write was refused or failed: then no `ETag` names it).
    fn reply(
        &self,
        stored: StoredResponse,
        source: Source,
        in_cache: bool,
        asked: &Asked,
    ) -> Response<Body> {
        let stored = if in_cache {
            stored
        } else {
            stored.into_unstored()
        };
        let age = stored.age();
        let mut response = if stored.matches(&asked.conditional) {
            stored.not_modified()
        } else {
            stored.into_response(asked.head)
        };
        if matches!(
            source,
            Source::Hit | Source::Stale | Source::FailSafe | Source::Held
        ) {
            response
                .headers_mut()
                .insert(header::AGE, HeaderValue::from(age));
        }
        self.label(response, source_name(source), false)
    }

    /// The source header; for `HEAD`, no body (the length kept when the response had one).
    fn label(
        &self,
        mut response: Response<Body>,
        word: &'static str,
        head: bool,
    ) -> Response<Body> {
        response
            .headers_mut()
            .insert(self.config.header.clone(), HeaderValue::from_static(word));
        if head {
            *response.body_mut() = Body::empty();
        }
        response
    }
}

/// Whether a failed fetch leaves the request to the handler rather than to an error response:
/// a key the cache refuses (too long), or a handler failure without a response to share.
fn passes(error: &Error) -> bool {
    matches!(
        error,
        Error::InvalidKey { .. } | Error::Compute(_) | Error::RecentFailure { .. }
    )
}

/// What a computation needs, owned (it may run in a background refresh, after the request).
struct Computing<S, C, B, E> {
    inner: S,
    cache: Cache<C>,
    config: Arc<Config>,
    parts: Head,
    body: PhantomData<fn() -> B>,
    primary: String,
    /// The `Vary` names this hop's key was built with (none on the primary hop).
    names: Vec<String>,
    own: Own<E>,
    head: bool,
}

impl<S, C, ReqBody, ResBody> Computing<S, C, ReqBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Default + Send + 'static,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
    C: Codec,
{
    async fn run(self) -> Result<Computed<Entry>, HandlerFailed> {
        let response = match self.inner.clone().oneshot(self.request()).await {
            Ok(response) => response,
            Err(e) => {
                self.keep(Err(e), "pass");
                return Err(HandlerFailed(None));
            }
        };
        let (parts, body) = response.into_parts();
        if parts.status.is_server_error() {
            // Handed to the requests of this process waiting on the key, so only what a shared
            // cache could have stored: never a private answer, never a cookie.
            let said = Directives::of(&parts.headers);
            let shareable =
                !said.private && !said.no_store && !parts.headers.contains_key(header::SET_COOKIE);
            let failed = match body::read(body, self.config.max_body_bytes).await {
                Read::Whole(bytes) => {
                    let stored = StoredResponse::unstored(&parts, bytes, &self.config.header);
                    self.keep(Ok(stored.clone().into_response(self.head)), "pass");
                    shareable.then_some(stored)
                }
                Read::PassThrough(replay) => {
                    self.keep(Ok(Response::from_parts(parts, Body::new(replay))), "pass");
                    None
                }
            };
            return Err(HandlerFailed(failed));
        }
        let said = Directives::of(&parts.headers);
        let vary = Vary::of(&parts.headers);
        let headers = &self.parts.headers;
        if !self.storable(&parts, &said, &vary) {
            self.keep(Ok(Response::from_parts(parts, Body::new(body))), "pass");
            return Ok(self.passing());
        }
        let bytes = match body::read(body, self.config.max_body_bytes).await {
            Read::Whole(bytes) => bytes,
            Read::PassThrough(replay) => {
                self.keep(Ok(Response::from_parts(parts, Body::new(replay))), "pass");
                return Ok(self.passing());
            }
        };
        let ttl = said
            .shared_max_age()
            .map_or(self.config.ttl, Duration::from_secs);
        let stored = StoredResponse::new(&parts, bytes, &self.config.header);
        match vary {
            Vary::On(vary) if vary != self.names => {
                if self.names.is_empty() {
                    // Learned here: the names under the primary key, this response under its
                    // own values' key, where the requests waiting with the same values read it.
                    let written = match key::secondary(&self.primary, &vary, headers) {
                        Some(secondary) => {
                            let entry = Entry::Response(stored.clone());
                            store(&self.cache, &secondary, &entry, ttl).await
                        }
                        None => false,
                    };
                    let stored = if written {
                        stored
                    } else {
                        stored.into_unstored()
                    };
                    self.keep(Ok(stored.into_response(self.head)), "computed");
                    Ok(Computed::new(Entry::Vary(vary)).ttl(ttl))
                } else {
                    // The resource now varies on other headers: later requests build their
                    // keys from the new names; this key holds nothing it could mislead with.
                    store(&self.cache, &self.primary, &Entry::Vary(vary), ttl).await;
                    let unstored = stored.into_unstored();
                    self.keep(Ok(unstored.into_response(self.head)), "pass");
                    Ok(self.passing())
                }
            }
            // No `Vary` (after a varying one, the response suits every request, this one's
            // values included), or the names this key was built with.
            _ => Ok(Computed::new(Entry::Response(stored)).ttl(ttl)),
        }
    }

    /// The request the handler answers for the cache: GET's whole response, whatever this
    /// request's method and conditions. A GET's body has no meaning (RFC 9110 §9.3.1): the
    /// handler computing for the cache gets none, so that the request keeps its own for a pass.
    fn request(&self) -> Request<ReqBody> {
        let mut request = Request::from_parts((*self.parts).clone(), ReqBody::default());
        *request.method_mut() = Method::GET;
        for conditional in [
            header::IF_NONE_MATCH,
            header::IF_MODIFIED_SINCE,
            header::IF_MATCH,
            header::IF_UNMODIFIED_SINCE,
        ] {
            request.headers_mut().remove(conditional);
        }
        request
    }

    /// Whether a shared cache may store this response (RFC 9111 §3): a configured status, no
    /// `no-store`, `private` or `no-cache`, a lifetime above zero, a `Vary` it can key on, no
    /// `Set-Cookie`, and for a request with `Authorization` an explicit permission (§3.5).
    fn storable(
        &self,
        parts: &axum::http::response::Parts,
        said: &Directives,
        vary: &Vary,
    ) -> bool {
        let authorized = self.parts.headers.contains_key(header::AUTHORIZATION);
        self.config.statuses.contains(&parts.status)
            && !said.no_store
            && !said.private
            && !said.no_cache
            && said.shared_max_age() != Some(0)
            && *vary != Vary::Never
            && !parts.headers.contains_key(header::SET_COOKIE)
            && (!authorized || said.public || said.s_maxage.is_some() || said.must_revalidate)
    }

    /// The entry of a key whose response was not stored.
    fn passing(&self) -> Computed<Entry> {
        Computed::new(Entry::Pass).ttl(self.config.pass_ttl)
    }

    fn keep(&self, response: Result<Response<Body>, S::Error>, word: &'static str) {
        *lock(&self.own) = Some((response, word));
    }
}

/// A write beside the one the fetch makes, and whether it was made. Best effort: if it fails,
/// the next request for the key computes it.
async fn store<C: Codec>(cache: &Cache<C>, key: &str, entry: &Entry, ttl: Duration) -> bool {
    match cache.set(key, entry, ttl).await {
        Ok(written) => written.is_applied(),
        Err(e) => {
            tracing::debug!(key, error = %e, "response cache: a write beside the fetch failed");
            false
        }
    }
}
