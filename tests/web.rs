//! `stampede_guard::web` (feature `axum`): a router served on a real loopback socket, handlers
//! that return the crate's errors, and real HTTP requests checking status, headers and body.

mod http_client;
/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod server;
    pub use server::*;
}

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use stampede_guard::{web, Cache, CallOptions, Error, OnBackendError, SourceUnavailable};
use tokio::sync::Notify;

const TTL: Duration = Duration::from_secs(60);
/// Must never reach the client: it stands for a database error with internals in it.
const SECRET: &str = "password=hunter2 host=db.internal";

type Result<T> = std::result::Result<T, Error>;

fn router(cache: Cache) -> Router {
    Router::new()
        .merge(web::probes(cache.clone()))
        .route("/ok/{key}", get(ok))
        .route("/fail/{key}", get(fail))
        .route("/impatient/{key}", get(impatient))
        .route("/own/{key}", get(own_error_type))
        .route("/down/{key}", get(source_down))
        .route("/refused/{key}", get(connection_refused))
        .with_state(cache)
}

/// A handler's own error type, as with anyhow: anything boxed, the crate's errors among them.
struct AppError(Box<dyn std::error::Error + Send + Sync>);

impl<E: Into<Box<dyn std::error::Error + Send + Sync>>> From<E> for AppError {
    fn from(e: E) -> Self {
        AppError(e.into())
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        match self.0.downcast_ref::<Error>() {
            // The crate's whole response: status, Retry-After, the log line.
            Some(e) => web::response(e),
            None => (axum::http::StatusCode::IM_A_TEAPOT, "not ours").into_response(),
        }
    }
}

async fn own_error_type(
    State(cache): State<Cache>,
    Path(key): Path<String>,
) -> std::result::Result<String, AppError> {
    if key == "teapot" {
        return Err("the handler's own error".into());
    }
    if let Some(value) = cache.get::<String>(&key).await? {
        return Ok(value);
    }
    Ok(cache
        .get_or_compute(&key, TTL, || async {
            Ok::<_, String>("computed".to_owned())
        })
        .await?)
}

async fn ok(State(cache): State<Cache>, Path(key): Path<String>) -> Result<String> {
    let value = key.to_uppercase();
    cache
        .get_or_compute(&key, TTL, move || async move { Ok::<_, String>(value) })
        .await
}

async fn fail(State(cache): State<Cache>, Path(key): Path<String>) -> Result<String> {
    cache
        .get_or_compute(&key, TTL, || async { Err(SECRET.to_owned()) })
        .await
}

/// The computation's source is down, and says so (as a pool's time-out would be marked).
async fn source_down(State(cache): State<Cache>, Path(key): Path<String>) -> Result<String> {
    cache
        .get_or_compute(&key, TTL, || async {
            Err::<String, _>(
                SourceUnavailable::new(SECRET).retry_after(Duration::from_millis(2_500)),
            )
        })
        .await
}

/// A database driver's error holding the socket's error, as sqlx's `Error::Io` does.
#[derive(Debug)]
struct DriverError(std::io::Error);

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "error communicating with database ({SECRET})")
    }
}

impl std::error::Error for DriverError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// The computation connects to a database port where nothing listens, and returns the driver's
/// error boxed, unmarked: the refused connection in its chain says the source is down.
async fn connection_refused(State(cache): State<Cache>, Path(key): Path<String>) -> Result<String> {
    cache
        .get_or_compute(&key, TTL, || async {
            let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = closed.local_addr().unwrap();
            drop(closed);
            match tokio::net::TcpStream::connect(addr).await {
                Ok(_) => Ok("connected".to_owned()),
                Err(e) => Err(Box::new(DriverError(e)) as Box<dyn std::error::Error + Send + Sync>),
            }
        })
        .await
}

/// Waits at most 100 ms for another caller's computation.
async fn impatient(State(cache): State<Cache>, Path(key): Path<String>) -> Result<String> {
    cache
        .with_options(CallOptions::default().wait_timeout(Duration::from_millis(100)))
        .get_or_compute(&key, TTL, || async { Ok::<_, String>("mine".to_owned()) })
        .await
}

/// Serves `router(cache)` on a free loopback port; returns `127.0.0.1:PORT`.
async fn serve(cache: Cache) -> String {
    let app = router(cache);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

#[tokio::test]
async fn a_value_is_a_200() {
    let addr = serve(Cache::in_memory()).await;
    let response = http_client::get(&addr, "/ok/may").await;
    assert_eq!((response.status, response.body.as_str()), (200, "MAY"));
}

#[tokio::test]
async fn a_failed_computation_is_a_500_that_does_not_leak_its_error() {
    let addr = serve(Cache::in_memory()).await;
    let response = http_client::get(&addr, "/fail/may").await;
    assert_eq!(response.status, 500, "{response:?}");
    assert_eq!(error_message(&response), "internal server error");
    assert!(!response.body.contains("hunter2"));
    assert_eq!(response.header("retry-after"), None);
}

#[tokio::test]
async fn a_computation_whose_source_is_unavailable_is_a_503_with_its_retry_after() {
    // Redis is up; the key was never cached; the computation's own source is down.
    let redis = support::RedisServer::start();
    let cache = Cache::builder()
        .redis_url(redis.url())
        .build()
        .await
        .unwrap();
    let addr = serve(cache).await;
    let response = http_client::get(&addr, "/down/may").await;
    assert_eq!(response.status, 503, "{response:?}");
    // 2.5 s suggested, rounded up to whole seconds.
    assert_eq!(response.header("retry-after"), Some("3"));
    assert_eq!(
        error_message(&response),
        "the data source is unavailable; try again shortly"
    );
    assert!(!response.body.contains("hunter2"));
    // The plain failure beside it is still a 500, without Retry-After.
    let response = http_client::get(&addr, "/fail/june").await;
    assert_eq!(response.status, 500, "{response:?}");
    assert_eq!(response.header("retry-after"), None);
}

#[tokio::test]
async fn a_refused_database_connection_is_a_503_without_marking() {
    let addr = serve(Cache::in_memory()).await;
    let response = http_client::get(&addr, "/refused/may").await;
    assert_eq!(response.status, 503, "{response:?}");
    assert_eq!(response.header("retry-after"), Some("1"));
    assert_eq!(
        error_message(&response),
        "the data source is unavailable; try again shortly"
    );
    assert!(!response.body.contains("hunter2"));
}

#[tokio::test]
async fn a_remembered_failure_is_a_500_too() {
    let cache = Cache::in_memory()
        .with_options(CallOptions::default().negative_ttl(Some(Duration::from_secs(60))));
    let addr = serve(cache.clone()).await;
    assert_eq!(http_client::get(&addr, "/fail/may").await.status, 500);
    // Served from the remembered failure, without running the computation again.
    let direct: Result<String> = cache
        .get_or_compute("may", TTL, || async {
            Ok::<_, String>("not run".to_owned())
        })
        .await;
    assert!(
        matches!(direct, Err(Error::RecentFailure { .. })),
        "{direct:?}"
    );
    let response = http_client::get(&addr, "/fail/may").await;
    assert_eq!(response.status, 500, "{response:?}");
    assert!(!response.body.contains("hunter2"));
}

#[tokio::test]
async fn a_wait_timeout_is_a_503_with_retry_after() {
    let cache = Cache::in_memory();
    let addr = serve(cache.clone()).await;
    // A caller in the same process computes "may" and holds it until released.
    let release = Arc::new(Notify::new());
    let holder = tokio::spawn({
        let (cache, release) = (cache.clone(), release.clone());
        async move {
            cache
                .get_or_compute("may", TTL, move || async move {
                    release.notified().await;
                    Ok::<_, String>("finally".to_owned())
                })
                .await
        }
    });
    while cache.in_flight() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The impatient request waits behind it for 100 ms, then gives up.
    let response = http_client::get(&addr, "/impatient/may").await;
    assert_eq!(response.status, 503, "{response:?}");
    assert_eq!(response.header("retry-after"), Some("1"));
    assert_eq!(
        error_message(&response),
        "the value is still being computed; try again shortly"
    );

    release.notify_one();
    assert_eq!(holder.await.unwrap().unwrap(), "finally");
    // Retrying after the value landed works, as Retry-After suggests.
    let response = http_client::get(&addr, "/impatient/may").await;
    assert_eq!((response.status, response.body.as_str()), (200, "finally"));
}

#[tokio::test]
async fn redis_unreachable_is_a_503_with_retry_after() {
    // A real server, stopped: its port now refuses connections.
    let mut redis = support::RedisServer::start();
    let url = redis.url();
    redis.kill();
    let cache = Cache::builder().redis_url(url).build().await.unwrap();
    let addr = serve(cache).await;
    let response = http_client::get(&addr, "/ok/may").await;
    assert_eq!(response.status, 503, "{response:?}");
    assert_eq!(response.header("retry-after"), Some("1"));
    assert_eq!(
        error_message(&response),
        "the cache is unavailable; try again shortly"
    );
    assert!(!response.body.contains(&redis.port().to_string()));
}

#[tokio::test]
async fn a_refusal_is_a_500_without_retry_after() {
    // A cache pointed at a replica: Redis answers, and refuses every write (READONLY).
    let primary = support::RedisServer::start();
    let replica = support::RedisServer::start_with(
        &["--replicaof", "127.0.0.1", &primary.port().to_string()].map(String::from),
        "",
    );
    let mut conn = replica.conn();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !redis::cmd("INFO")
        .arg("replication")
        .query::<String>(&mut conn)
        .unwrap()
        .lines()
        .any(|l| l == "master_link_status:up")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the replica never synced"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cache = Cache::builder()
        .redis_url(replica.url())
        .build()
        .await
        .unwrap();
    let addr = serve(cache).await;
    let response = http_client::get(&addr, "/ok/may").await;
    assert_eq!(response.status, 500, "{response:?}");
    assert_eq!(response.header("retry-after"), None, "retrying cannot help");
    assert_eq!(error_message(&response), "internal server error");
}

#[tokio::test]
async fn a_handler_with_its_own_error_type_gives_the_crates_whole_response() {
    let mut redis = support::RedisServer::start();
    let url = redis.url();
    redis.kill();
    let cache = Cache::builder().redis_url(url).build().await.unwrap();
    let addr = serve(cache).await;
    let response = http_client::get(&addr, "/own/may").await;
    assert_eq!(response.status, 503, "{response:?}");
    assert_eq!(response.header("retry-after"), Some("1"));
    assert_eq!(
        error_message(&response),
        "the cache is unavailable; try again shortly"
    );
    let response = http_client::get(&addr, "/own/teapot").await;
    assert_eq!((response.status, response.body.as_str()), (418, "not ours"));
    let addr = serve(Cache::in_memory()).await;
    let response = http_client::get(&addr, "/own/may").await;
    assert_eq!((response.status, response.body.as_str()), (200, "computed"));
}

#[tokio::test]
async fn a_key_over_the_limit_is_a_400() {
    let addr = serve(Cache::in_memory()).await;
    let long = "k".repeat(stampede_guard::MAX_KEY_BYTES + 1);
    let response = http_client::get(&addr, &format!("/ok/{long}")).await;
    assert_eq!(response.status, 400, "{response:?}");
    assert!(
        error_message(&response).starts_with("invalid key: "),
        "{response:?}"
    );
    assert!(!response.body.contains(&long), "the key is not echoed back");
}

/// The public sentence of an error response: its JSON body's `error`, the body asserted to be
/// the crate's JSON error (`{"error": "...", "status": <the response's status>}`).
fn error_message(response: &http_client::Response) -> String {
    assert_eq!(
        response.header("content-type"),
        Some("application/json"),
        "{response:?}"
    );
    let json: serde_json::Value = serde_json::from_str(&response.body).expect("a JSON body");
    assert_eq!(json["status"], response.status, "{response:?}");
    json["error"]
        .as_str()
        .expect("an error sentence")
        .to_owned()
}

/// The probes' JSON report at `path`: status and body.
async fn probe(addr: &str, path: &str) -> (u16, serde_json::Value) {
    let response = http_client::get(addr, path).await;
    assert_eq!(
        response.header("cache-control"),
        Some("no-store"),
        "{response:?}"
    );
    let json = serde_json::from_str(&response.body).expect("a JSON body");
    (response.status, json)
}

#[tokio::test]
async fn the_probes_of_a_healthy_instance_are_200() {
    let addr = serve(Cache::in_memory()).await;
    assert_eq!(probe(&addr, "/livez").await.0, 200);
    let (status, report) = probe(&addr, "/readyz").await;
    assert_eq!(status, 200);
    assert_eq!(report["state"], "healthy");
    assert_eq!(report["ready"], true);
}

/// Redis down, reads computed without it: the instance serves, so it stays in rotation
/// (degraded, 200), and its requests are answered; liveness never asks Redis.
#[tokio::test]
async fn redis_down_with_uncached_computation_is_degraded_and_ready() {
    let mut redis = support::RedisServer::start();
    let url = redis.url();
    redis.kill();
    let cache = Cache::builder()
        .redis_url(url)
        .options(CallOptions::default().on_backend_error(OnBackendError::ComputeUncached))
        .build()
        .await
        .unwrap();
    let addr = serve(cache).await;
    assert_eq!(probe(&addr, "/livez").await.0, 200);
    let (status, report) = probe(&addr, "/readyz").await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["state"], "degraded");
    assert_eq!(report["ready"], true);
    assert_eq!(report["reachable"], false);
    assert_eq!(
        report["reasons"],
        serde_json::json!(["backend_unreachable", "computing_uncached"])
    );
    let response = http_client::get(&addr, "/ok/may").await;
    assert_eq!((response.status, response.body.as_str()), (200, "MAY"));
}

/// Redis down and nothing in its place: every cached call fails, and readiness says so (503),
/// while liveness stays 200.
#[tokio::test]
async fn redis_down_without_a_fallback_is_unavailable() {
    let mut redis = support::RedisServer::start();
    let url = redis.url();
    redis.kill();
    let cache = Cache::builder().redis_url(url).build().await.unwrap();
    let addr = serve(cache).await;
    assert_eq!(probe(&addr, "/livez").await.0, 200);
    let (status, report) = probe(&addr, "/readyz").await;
    assert_eq!(status, 503, "{report}");
    assert_eq!(report["state"], "unavailable");
    assert_eq!(report["ready"], false);
    assert_eq!(
        report["reasons"],
        serde_json::json!(["backend_unreachable", "no_fallback"])
    );
    assert_eq!(http_client::get(&addr, "/ok/may").await.status, 503);
}
