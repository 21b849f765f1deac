//! Criterion: a warm response served by `web::ResponseCacheLayer` vs the same handler returning
//! its cached value itself (`get_or_compute` on a warm key), both through an axum `Router` with
//! `tower::ServiceExt::oneshot` (no socket: the difference is the layer's own work). Target:
//! the layer within 1.3× the handler's time. Once on Redis (a redis-server this bench starts on
//! a free loopback port), once on the embedded store, where the cache's own time is smallest
//! and the layer's share largest.
//!
//! The value is a 1024-byte `String`, as in `cache_ops`. Needs the `tower` feature:
//! `cargo bench --features tower --bench web_layer`.

#[path = "../tests/support"]
/// The shared helpers this file uses, one module each (tests/support/).
mod support {
    pub mod load;
    pub mod server;
    pub use {load::*, server::*};
}

use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::Request;
use axum::routing::get;
use axum::Router;
use criterion::{criterion_group, criterion_main, Criterion};
use stampede_guard::web::ResponseCacheLayer;
use stampede_guard::Cache;
use support::{runtime, value, RedisServer, VALUE_BYTES};
use tower::ServiceExt;

const TTL: Duration = Duration::from_secs(3600);
/// The handler the layer caches: it would compute the report; here it is only run once.
async fn computed() -> String {
    value()
}

/// The same handler caching its value itself.
async fn cached_value(State(cache): State<Cache>) -> Result<String, stampede_guard::Error> {
    cache
        .get_or_compute("report-2019-05", TTL, || async {
            Ok::<_, std::io::Error>(value())
        })
        .await
}

fn routers(cache: &Cache) -> (Router, Router) {
    let layered = Router::new()
        .route("/report/2019-05", get(computed))
        .layer(ResponseCacheLayer::new(cache.clone()).ttl(TTL));
    let direct = Router::new()
        .route("/report/2019-05", get(cached_value))
        .with_state(cache.clone());
    (layered, direct)
}

/// One request through `router`; the body read to the end, as a server would send it.
async fn request(router: &Router) -> usize {
    let request = Request::get("/report/2019-05")
        .body(Body::empty())
        .expect("a request");
    let response = router.clone().oneshot(request).await.expect("infallible");
    assert_eq!(response.status(), 200);
    axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("the body")
        .len()
}

fn compare(c: &mut Criterion, name: &str, cache: Cache, rt: &tokio::runtime::Runtime) {
    let (layered, direct) = routers(&cache);
    // Warm both: the first request of each computes.
    rt.block_on(async {
        assert_eq!(request(&layered).await, VALUE_BYTES);
        assert_eq!(request(&direct).await, VALUE_BYTES);
    });
    let mut group = c.benchmark_group(name);
    group.bench_function("layer_warm_response", |b| {
        b.to_async(rt).iter(|| request(&layered))
    });
    group.bench_function("handler_cached_value", |b| {
        b.to_async(rt).iter(|| request(&direct))
    });
    group.finish();
}

fn web_layer(c: &mut Criterion) {
    let rt = runtime();
    compare(c, "web_layer/memory", Cache::in_memory(), &rt);
    let redis = RedisServer::start();
    let cache = rt.block_on(async {
        Cache::builder()
            .redis_url(redis.url())
            .build()
            .await
            .expect("the bench's redis-server")
    });
    compare(c, "web_layer/redis", cache, &rt);
}

criterion_group!(benches, web_layer);
criterion_main!(benches);
