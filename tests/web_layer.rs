//! `web::ResponseCacheLayer` (feature `tower`): axum routers behind the layer, served on real
//! loopback sockets, caching through a real redis-server; real HTTP requests check what a
//! client sees (status, headers, body) and counters check how often each handler ran.

mod http_client;
/// The shared helpers this file uses, one module each (tests/support/).
mod support {
    pub mod logged;
    pub mod logs;
    pub mod server;
    pub use server::*;
}

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use stampede_guard::web::ResponseCacheLayer;
use stampede_guard::{Cache, CallOptions, OnBackendError};
use support::RedisServer;

/// How many times each handler ran, by request path, over every server of a test.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<HashMap<String, usize>>>);

impl Runs {
    /// Counts a run of `path`; returns which run it is (1 for the first).
    fn count(&self, path: &str) -> usize {
        let mut runs = self.0.lock().unwrap();
        let n = runs.entry(path.to_owned()).or_default();
        *n += 1;
        *n
    }

    fn of(&self, path: &str) -> usize {
        self.0.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

fn router(runs: Runs) -> Router {
    Router::new()
        .route("/slow/{id}", get(slow))
        .route("/vary", get(vary))
        .route("/no-store", get(no_store))
        .route("/big", get(big))
        .route("/panics-once", get(panics_once))
        .route("/short", get(short))
        .route("/fails-after-first", get(fails_after_first))
        .route("/sets-cookie", get(sets_cookie))
        .with_state(runs)
}

/// The slow query: 200 ms, long enough for every concurrent request to arrive meanwhile.
async fn slow(State(runs): State<Runs>, Path(id): Path<String>) -> String {
    runs.count(&format!("/slow/{id}"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    format!("report {id}")
}

/// Answers in the request's language, and says so with `Vary`.
async fn vary(State(runs): State<Runs>, headers: HeaderMap) -> impl IntoResponse {
    runs.count("/vary");
    let language = headers
        .get(header::ACCEPT_LANGUAGE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none")
        .to_owned();
    (
        [(header::VARY, "Accept-Language")],
        format!("in {language}"),
    )
}

async fn no_store(State(runs): State<Runs>) -> impl IntoResponse {
    let n = runs.count("/no-store");
    ([(header::CACHE_CONTROL, "no-store")], format!("run {n}"))
}

/// 4 KiB, over the 1 KiB limit these tests give the layer.
async fn big(State(runs): State<Runs>) -> String {
    runs.count("/big");
    "x".repeat(4096)
}

/// The first run takes 300 ms and panics; every later one answers.
async fn panics_once(State(runs): State<Runs>) -> &'static str {
    if runs.count("/panics-once") == 1 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        panic!("the handler's first run fails");
    }
    "recovered"
}

/// Fresh for one second.
async fn short(State(runs): State<Runs>) -> impl IntoResponse {
    let n = runs.count("/short");
    (
        [(header::CACHE_CONTROL, "max-age=1")],
        format!("version {n}"),
    )
}

/// Good once (fresh for one second), then a 500 every time.
async fn fails_after_first(State(runs): State<Runs>) -> axum::response::Response {
    if runs.count("/fails-after-first") == 1 {
        return ([(header::CACHE_CONTROL, "max-age=1")], "good").into_response();
    }
    (StatusCode::INTERNAL_SERVER_ERROR, "database down").into_response()
}

/// Starts a session: a response for this client only.
async fn sets_cookie(State(runs): State<Runs>) -> impl IntoResponse {
    let n = runs.count("/sets-cookie");
    (
        [(header::SET_COOKIE, format!("session={n}"))],
        format!("hello {n}"),
    )
}

/// Serves `router(runs)` behind the layer on a free loopback port; returns `127.0.0.1:PORT`.
async fn serve(layer: ResponseCacheLayer, runs: &Runs) -> String {
    let app = router(runs.clone()).layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// A cache of its own (its own connections) on `redis`, as a second instance would have.
async fn cache(redis: &RedisServer, options: CallOptions) -> Cache {
    Cache::builder()
        .redis_url(redis.url())
        .options(options)
        .build()
        .await
        .expect("the cache connects to the test's redis-server")
}

/// One instance: the layer with a 1 KiB body limit over a cache on `redis`.
async fn instance(redis: &RedisServer, runs: &Runs, options: CallOptions) -> String {
    let layer = ResponseCacheLayer::new(cache(redis, options).await).max_body_bytes(1024);
    serve(layer, runs).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_concurrent_requests_over_two_instances_run_the_handler_once() {
    let redis = RedisServer::start();
    let runs = Runs::default();
    let a = instance(&redis, &runs, CallOptions::default()).await;
    let b = instance(&redis, &runs, CallOptions::default()).await;
    let mut requests = tokio::task::JoinSet::new();
    for i in 0..60 {
        let addr = if i % 2 == 0 { a.clone() } else { b.clone() };
        requests.spawn(async move { http_client::get(&addr, "/slow/7").await });
    }
    let mut words = HashMap::<String, usize>::new();
    for response in requests.join_all().await {
        assert_eq!((response.status, response.body.as_str()), (200, "report 7"));
        *words
            .entry(response.header("x-cache").unwrap().to_owned())
            .or_default() += 1;
    }
    assert_eq!(runs.of("/slow/7"), 1, "{words:?}");
    assert_eq!(words.get("computed"), Some(&1), "{words:?}");
    // Warm now, on either instance.
    let response = http_client::get(&b, "/slow/7").await;
    assert_eq!(response.header("x-cache"), Some("hit"));
    assert!(response.header("age").is_some(), "{response:?}");
    assert_eq!(runs.of("/slow/7"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_matching_if_none_match_is_a_304_and_head_shares_gets_entry() {
    let redis = RedisServer::start();
    let runs = Runs::default();
    let addr = instance(&redis, &runs, CallOptions::default()).await;
    // HEAD first: it computes GET's entry, and gets no body.
    let head = http_client::send("HEAD", &addr, "/slow/1", &[]).await;
    assert_eq!((head.status, head.body.as_str()), (200, ""), "{head:?}");
    assert_eq!(head.header("content-length"), Some("8"), "{head:?}");
    let first = http_client::get(&addr, "/slow/1").await;
    assert_eq!((first.status, first.body.as_str()), (200, "report 1"));
    assert_eq!(
        first.header("x-cache"),
        Some("hit"),
        "HEAD filled GET's entry"
    );
    let etag = first.header("etag").expect("an ETag").to_owned();

    let again = http_client::send("GET", &addr, "/slow/1", &[("If-None-Match", &etag)]).await;
    assert_eq!((again.status, again.body.as_str()), (304, ""), "{again:?}");
    assert_eq!(again.header("etag"), Some(etag.as_str()));
    assert_eq!(again.header("x-cache"), Some("hit"));
    // Another tag is no match: the whole response.
    let other = http_client::send("GET", &addr, "/slow/1", &[("If-None-Match", "\"other\"")]).await;
    assert_eq!((other.status, other.body.as_str()), (200, "report 1"));
    assert_eq!(runs.of("/slow/1"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_that_varies_is_kept_once_per_value_of_the_named_header() {
    let redis = RedisServer::start();
    let runs = Runs::default();
    let a = instance(&redis, &runs, CallOptions::default()).await;
    let b = instance(&redis, &runs, CallOptions::default()).await;
    let ask = |addr: String, language: &'static str| async move {
        http_client::send("GET", &addr, "/vary", &[("Accept-Language", language)]).await
    };
    let fr = ask(a.clone(), "fr").await;
    assert_eq!(
        (fr.body.as_str(), fr.header("x-cache")),
        ("in fr", Some("computed"))
    );
    let de = ask(b.clone(), "de").await;
    assert_eq!(
        (de.body.as_str(), de.header("x-cache")),
        ("in de", Some("computed"))
    );
    assert_eq!(runs.of("/vary"), 2);
    // Each language from its own entry, on either instance; no language is one more.
    for (addr, language) in [(&b, "fr"), (&a, "de"), (&a, "fr")] {
        let response = ask(addr.clone(), language).await;
        assert_eq!(response.body, format!("in {language}"), "{response:?}");
        assert_eq!(response.header("x-cache"), Some("hit"), "{response:?}");
    }
    assert_eq!(runs.of("/vary"), 2);
    let none = http_client::get(&a, "/vary").await;
    assert_eq!(
        (none.body.as_str(), none.header("x-cache")),
        ("in none", Some("computed"))
    );
    assert_eq!(runs.of("/vary"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_store_either_way_runs_the_handler_every_time() {
    let redis = RedisServer::start();
    let runs = Runs::default();
    let addr = instance(&redis, &runs, CallOptions::default()).await;
    for n in 1..=3 {
        let response = http_client::get(&addr, "/no-store").await;
        assert_eq!(response.body, format!("run {n}"));
        assert_eq!(response.header("x-cache"), Some("pass"));
        assert_eq!(response.header("cache-control"), Some("no-store"));
    }
    // By default the request's own directives are ignored: a client cannot skip the single
    // flight. With `request_cache_control(true)`, its no-store (or no-cache) skips a stored
    // response.
    assert_eq!(
        http_client::get(&addr, "/slow/2").await.header("x-cache"),
        Some("computed")
    );
    let ignored =
        http_client::send("GET", &addr, "/slow/2", &[("Cache-Control", "no-cache")]).await;
    assert_eq!(ignored.header("x-cache"), Some("hit"));
    let honouring = ResponseCacheLayer::new(cache(&redis, CallOptions::default()).await)
        .request_cache_control(true);
    let addr = serve(honouring, &runs).await;
    for directive in ["no-store", "no-cache"] {
        let response =
            http_client::send("GET", &addr, "/slow/2", &[("Cache-Control", directive)]).await;
        assert_eq!(
            (response.status, response.header("x-cache")),
            (200, Some("pass"))
        );
    }
    assert_eq!(runs.of("/slow/2"), 3);
    // Without a directive it reads the stored response.
    assert_eq!(
        http_client::get(&addr, "/slow/2").await.header("x-cache"),
        Some("hit")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_passed_through_whole_and_not_stored() {
    let redis = RedisServer::start();
    let runs = Runs::default();
    let addr = instance(&redis, &runs, CallOptions::default()).await;
    for n in 1..=2 {
        let response = http_client::get(&addr, "/big").await;
        assert_eq!(response.status, 200);
        assert_eq!(response.body.len(), 4096, "the client gets all of it");
        assert_eq!(response.header("x-cache"), Some("pass"));
        assert_eq!(runs.of("/big"), n, "not stored: the handler runs again");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_panics_frees_the_key_and_a_waiter_runs_it() {
    let redis = RedisServer::start();
    let runs = Runs::default();
    let a = instance(&redis, &runs, CallOptions::default()).await;
    let b = instance(&redis, &runs, CallOptions::default()).await;
    // The first request runs the handler on `a`, which panics after 300 ms.
    let first = tokio::spawn({
        let a = a.clone();
        async move { http_client::try_send("GET", &a, "/panics-once", &[]).await }
    });
    while runs.of("/panics-once") == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Meanwhile requests on both instances wait for it.
    let waiters: Vec<_> = [&a, &b, &b]
        .into_iter()
        .map(|addr| {
            let addr = addr.clone();
            tokio::spawn(async move { http_client::get(&addr, "/panics-once").await })
        })
        .collect();
    let first = first.await.unwrap();
    assert!(
        first.is_err(),
        "the panicking request gets no response: {first:?}"
    );
    for waiter in waiters {
        let response = waiter.await.unwrap();
        assert_eq!(
            (response.status, response.body.as_str()),
            (200, "recovered"),
            "{response:?}"
        );
    }
    // One waiter took over, once: the lock was freed at the panic, not at the lease's end.
    assert_eq!(runs.of("/panics-once"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_header_says_stale_and_fallback() {
    let redis = RedisServer::start();
    let runs = Runs::default();
    let stale = instance(
        &redis,
        &runs,
        CallOptions::default().stale_for(Duration::from_secs(60)),
    )
    .await;
    let first = http_client::get(&stale, "/short").await;
    assert_eq!(
        (first.body.as_str(), first.header("x-cache")),
        ("version 1", Some("computed"))
    );
    tokio::time::sleep(Duration::from_millis(1_100)).await; // past max-age=1
    let old = http_client::get(&stale, "/short").await;
    assert_eq!(
        (old.body.as_str(), old.header("x-cache")),
        ("version 1", Some("stale"))
    );
    // The refresh ran in the background.
    let mut newer = http_client::get(&stale, "/short").await;
    for _ in 0..100 {
        if newer.body == "version 2" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        newer = http_client::get(&stale, "/short").await;
    }
    assert_eq!(
        (newer.body.as_str(), newer.header("x-cache")),
        ("version 2", Some("hit"))
    );

    let safe = instance(
        &redis,
        &runs,
        CallOptions::default().fail_safe_for(Duration::from_secs(60)),
    )
    .await;
    let good = http_client::get(&safe, "/fails-after-first").await;
    assert_eq!(
        (good.status, good.header("x-cache")),
        (200, Some("computed"))
    );
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    // The handler now answers 500: the kept response is served instead.
    let kept = http_client::get(&safe, "/fails-after-first").await;
    assert_eq!((kept.status, kept.body.as_str()), (200, "good"), "{kept:?}");
    assert_eq!(kept.header("x-cache"), Some("fallback"));
    assert_eq!(runs.of("/fails-after-first"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_error_without_a_kept_response_is_passed_on_and_not_stored() {
    let redis = RedisServer::start();
    let runs = Runs::default();
    let addr = instance(&redis, &runs, CallOptions::default()).await;
    assert_eq!(
        http_client::get(&addr, "/fails-after-first").await.status,
        200
    );
    // Expired, and no fail-safe: the 500 reaches the client; the next request runs again.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    for n in 2..=3 {
        let response = http_client::get(&addr, "/fails-after-first").await;
        assert_eq!(
            (response.status, response.body.as_str()),
            (500, "database down")
        );
        assert_eq!(response.header("x-cache"), Some("pass"));
        // Not stored: no tag a client could send back for a 304.
        assert_eq!(response.header("etag"), None, "{response:?}");
        assert_eq!(runs.of("/fails-after-first"), n);
    }
}

/// A request with a cookie or credentials may get that user's own page: it passes (looked up
/// nowhere, stored nowhere), unless the layer's key names the user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_name_a_user_pass_unless_the_key_names_the_user() {
    let redis = RedisServer::start();
    let runs = Runs::default();
    let addr = instance(&redis, &runs, CallOptions::default()).await;
    for credentials in [
        ("Cookie", "session=alice"),
        ("Authorization", "Bearer alice"),
    ] {
        for _ in 0..2 {
            let response = http_client::send("GET", &addr, "/slow/9", &[credentials]).await;
            assert_eq!(response.header("x-cache"), Some("pass"), "{credentials:?}");
        }
    }
    assert_eq!(runs.of("/slow/9"), 4);
    // An anonymous request is cached as before, and a cookie still does not read that entry.
    assert_eq!(
        http_client::get(&addr, "/slow/9").await.header("x-cache"),
        Some("computed")
    );
    let with_cookie =
        http_client::send("GET", &addr, "/slow/9", &[("Cookie", "session=bob")]).await;
    assert_eq!(with_cookie.header("x-cache"), Some("pass"));
    assert_eq!(runs.of("/slow/9"), 6);

    // With a key that names the user, their requests are cached per user.
    let per_user = ResponseCacheLayer::new(cache(&redis, CallOptions::default()).await)
        .key_fn(|request| Some(request.headers.get("x-user")?.to_str().ok()?.to_owned()))
        .cache_credentialed(true);
    let addr = serve(per_user, &runs).await;
    let alice = [("Cookie", "session=alice"), ("x-user", "alice")];
    let first = http_client::send("GET", &addr, "/slow/10", &alice).await;
    let second = http_client::send("GET", &addr, "/slow/10", &alice).await;
    assert_eq!(
        (first.header("x-cache"), second.header("x-cache")),
        (Some("computed"), Some("hit"))
    );
    let bob = [("Cookie", "session=bob"), ("x-user", "bob")];
    let bobs = http_client::send("GET", &addr, "/slow/10", &bob).await;
    assert_eq!(bobs.header("x-cache"), Some("computed"));
    assert_eq!(runs.of("/slow/10"), 2);
}

/// A response that sets a cookie belongs to the client that asked: never served to another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_that_sets_a_cookie_is_not_served_to_another_request() {
    let redis = RedisServer::start();
    let runs = Runs::default();
    let addr = instance(&redis, &runs, CallOptions::default()).await;
    for n in 1..=2 {
        let response = http_client::get(&addr, "/sets-cookie").await;
        assert_eq!(response.body, format!("hello {n}"));
        assert_eq!(
            response.header("set-cookie"),
            Some(format!("session={n}").as_str())
        );
        assert_eq!(response.header("x-cache"), Some("pass"));
    }
}

/// The cache's backend down is no outage of the API: the handler answers, uncached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_the_handler_answers_uncached() {
    let mut redis = RedisServer::start();
    let runs = Runs::default();
    let addr = instance(&redis, &runs, CallOptions::default()).await;
    assert_eq!(
        http_client::get(&addr, "/slow/11").await.header("x-cache"),
        Some("computed")
    );
    redis.kill();
    for _ in 0..2 {
        let response = http_client::get(&addr, "/slow/11").await;
        assert_eq!(
            (response.status, response.body.as_str()),
            (200, "report 11")
        );
        assert_eq!(response.header("x-cache"), Some("uncached"));
    }
    assert_eq!(runs.of("/slow/11"), 3);
}

/// Computed while Redis is down (`ComputeUncached`): served, but stored nowhere, so no `ETag`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_computed_without_the_cache_has_no_etag() {
    let mut redis = RedisServer::start();
    let runs = Runs::default();
    let options = CallOptions::default().on_backend_error(OnBackendError::ComputeUncached);
    let addr = instance(&redis, &runs, options).await;
    let stored = http_client::get(&addr, "/slow/12").await;
    assert_eq!(stored.header("x-cache"), Some("computed"));
    assert!(stored.header("etag").is_some(), "{stored:?}");
    redis.kill();
    let uncached = http_client::get(&addr, "/slow/12").await;
    assert_eq!(
        (uncached.status, uncached.body.as_str()),
        (200, "report 12")
    );
    assert_eq!(uncached.header("x-cache"), Some("uncached"), "{uncached:?}");
    assert_eq!(uncached.header("etag"), None, "{uncached:?}");
}

/// Computed under the lock but not written (an invalidation of the key while the handler ran
/// moved its fence on): served, but stored nowhere, so no `ETag`; the next request computes
/// and stores it, with one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_whose_write_was_refused_has_no_etag() {
    let redis = RedisServer::start();
    let runs = Runs::default();
    let addr = instance(&redis, &runs, CallOptions::default()).await;
    let writer = cache(&redis, CallOptions::default()).await;
    let request = {
        let addr = addr.clone();
        tokio::spawn(async move { http_client::get(&addr, "/slow/9").await })
    };
    // The handler runs for 200 ms: the invalidation lands meanwhile.
    while runs.of("/slow/9") == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let written = writer.invalidate("http:GET /slow/9").await.unwrap();
    assert!(written.is_applied());
    let refused = request.await.unwrap();
    assert_eq!((refused.status, refused.body.as_str()), (200, "report 9"));
    assert_eq!(refused.header("x-cache"), Some("computed"), "{refused:?}");
    assert_eq!(refused.header("etag"), None, "{refused:?}");
    let stored = http_client::get(&addr, "/slow/9").await;
    assert_eq!(stored.header("x-cache"), Some("computed"), "{stored:?}");
    assert!(stored.header("etag").is_some(), "{stored:?}");
    assert_eq!(runs.of("/slow/9"), 2);
}

/// The layer over a cache on `redis`, its key and tags naming the request's `x-tenant`.
async fn per_tenant(redis: &RedisServer, runs: &Runs) -> String {
    let tenant = |request: &axum::http::request::Parts| {
        Some(request.headers.get("x-tenant")?.to_str().ok()?.to_owned())
    };
    let layer = ResponseCacheLayer::new(cache(redis, CallOptions::default()).await)
        .key_fn(tenant)
        .tag_fn(move |request| Some([format!("tenant:{}", tenant(request)?)]));
    serve(layer, runs).await
}

/// `invalidate_tag` of a tenant reaches the responses the layer stored for that tenant, on
/// every instance, and no other tenant's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidating_a_tag_from_the_tag_function_removes_the_tenants_responses() {
    let redis = RedisServer::start();
    let runs = Runs::default();
    let a = per_tenant(&redis, &runs).await;
    let b = per_tenant(&redis, &runs).await;
    let ask = |addr: &str, tenant: &'static str| {
        let addr = addr.to_owned();
        async move { http_client::send("GET", &addr, "/slow/20", &[("x-tenant", tenant)]).await }
    };
    for tenant in ["7", "8"] {
        assert_eq!(ask(&a, tenant).await.header("x-cache"), Some("computed"));
        assert_eq!(ask(&b, tenant).await.header("x-cache"), Some("hit"));
    }
    assert_eq!(runs.of("/slow/20"), 2);
    // A resource that varies is reached too (its marker and its entries carry the tag).
    let varying = |addr: &str| {
        let addr = addr.to_owned();
        let headers = [("x-tenant", "7"), ("Accept-Language", "fr")];
        async move { http_client::send("GET", &addr, "/vary", &headers).await }
    };
    assert_eq!(varying(&a).await.header("x-cache"), Some("computed"));
    assert_eq!(varying(&b).await.header("x-cache"), Some("hit"));

    let writer = cache(&redis, CallOptions::default()).await;
    assert_eq!(
        writer.invalidate_tag("tenant:7").await.unwrap(),
        stampede_guard::Written::Applied
    );
    let seven = ask(&b, "7").await;
    assert_eq!(
        (seven.body.as_str(), seven.header("x-cache")),
        ("report 20", Some("computed")),
        "the other instance computes tenant 7's response again"
    );
    assert_eq!(ask(&a, "7").await.header("x-cache"), Some("hit"));
    assert_eq!(ask(&a, "8").await.header("x-cache"), Some("hit"));
    assert_eq!(runs.of("/slow/20"), 3);
    let again = varying(&a).await;
    assert_eq!(
        (again.body.as_str(), again.header("x-cache")),
        ("in fr", Some("computed"))
    );
    assert_eq!(runs.of("/vary"), 2);
}

/// A tag function that gives no tags, or a tag the cache refuses, passes the request through
/// uncached, and that is logged once (then once a minute). The only test of this binary that
/// makes a tag function fail: the log throttle is the process's.
#[test]
fn a_failing_tag_function_passes_the_request_and_logs_once() {
    use tower::ServiceExt;

    let runs = Runs::default();
    let layer = ResponseCacheLayer::new(Cache::in_memory()).tag_fn(|request| {
        let tenant = request.headers.get("x-tenant")?.to_str().ok()?;
        // "bad" stands for a tag built from nothing: empty.
        let tag = if tenant == "bad" {
            String::new()
        } else {
            format!("tenant:{tenant}")
        };
        Some([tag])
    });
    let app = router(runs.clone()).layer(layer);
    let ask = |tenant: Option<&str>| {
        let mut request = axum::http::Request::get("/slow/30");
        if let Some(tenant) = tenant {
            request = request.header("x-tenant", tenant);
        }
        let request = request.body(axum::body::Body::empty()).unwrap();
        let app = app.clone();
        async move {
            let response = app.oneshot(request).await.unwrap();
            let header = |name| response.headers().get(name).cloned();
            (header("x-cache").unwrap(), header("etag"))
        }
    };
    // A current-thread runtime: the layer runs on this thread, where the logs are read.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ((), text) = support::logged::logged(|| {
        runtime.block_on(async {
            for tenant in [None, Some("bad"), None, Some("bad")] {
                assert_eq!(
                    ask(tenant).await,
                    ("pass".parse().unwrap(), None),
                    "{tenant:?}"
                );
            }
            assert_eq!(
                runs.of("/slow/30"),
                4,
                "every passing request ran the handler"
            );
            // A good tag is cached as usual.
            assert_eq!(ask(Some("7")).await.0, "computed");
            assert_eq!(ask(Some("7")).await.0, "hit");
        })
    });
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("tag function"))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "one line for four refusals within the minute: {text}"
    );
    assert!(
        lines[0].contains("WARN") && lines[0].contains("count=1"),
        "{text}"
    );
    assert!(lines[0].contains("passed uncached"), "{text}");
}
