//! What [`OnBackendError`] means for each call of a cache, on a real Redis that is stopped: with
//! `ComputeUncached`, `get` is a miss and `set` a skipped write, while `invalidate` and locks
//! still fail; with `Fail` (the default) every call fails. And once Redis is back, every call
//! works again.

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod server;
    pub use server::*;
}

use std::time::{Duration, Instant};

use stampede_guard::{Cache, CallOptions, Error, OnBackendError};
use support::RedisServer;

const TTL: Duration = Duration::from_secs(60);

/// A cache on a real server that has just been killed (its port refuses connections).
async fn cache_on_a_stopped_server(fallback: OnBackendError) -> (RedisServer, Cache) {
    let mut redis = RedisServer::start();
    let cache = Cache::builder()
        .redis_url(redis.url())
        .options(CallOptions::default().on_backend_error(fallback))
        .build()
        .await
        .unwrap();
    // Connected and working first, so the failures below are the server going away.
    let _ = cache.set("2019-05", &1u32, TTL).await.unwrap();
    redis.kill();
    (redis, cache)
}

/// A backend error, and of the unreachable kind: a stopped server is an outage, not a refusal.
fn backend(result: Result<impl std::fmt::Debug, Error>) -> bool {
    matches!(&result, Err(e) if e.is_backend() && e.is_unreachable() && !e.is_refused())
}

/// A handler that looks first with `get`, then computes: the pattern that returned 503s.
async fn look_then_compute(cache: &Cache) -> Result<u32, Error> {
    if let Some(value) = cache.get::<u32>("2019-06").await? {
        return Ok(value);
    }
    cache
        .get_or_compute("2019-06", TTL, || async { Ok::<_, String>(6u32) })
        .await
}

#[tokio::test]
async fn without_the_fallback_every_call_fails_with_a_backend_error() {
    let (_redis, cache) = cache_on_a_stopped_server(OnBackendError::Fail).await;
    assert!(backend(cache.get::<u32>("2019-05").await));
    assert!(backend(cache.set("2019-05", &2u32, TTL).await));
    assert!(backend(cache.invalidate("2019-05").await));
    assert!(backend(cache.lock("nightly").unwrap().try_acquire().await));
    assert!(backend(look_then_compute(&cache).await));
    let stats = cache.stats();
    // get, set, invalidate, and the handler's get (it stops there).
    assert_eq!((stats.backend_errors, stats.uncached), (4, 0), "{stats:?}");
}

#[tokio::test]
async fn with_the_fallback_get_is_a_miss_set_is_skipped_and_invalidate_and_locks_fail() {
    let (mut redis, cache) = cache_on_a_stopped_server(OnBackendError::ComputeUncached).await;
    assert_eq!(cache.get::<u32>("2019-05").await.unwrap(), None, "a miss");
    let _ = cache.set("2019-05", &2u32, TTL).await.unwrap();
    // A lost invalidation would serve stale data once Redis is back: the caller must know.
    assert!(backend(cache.invalidate("2019-05").await));
    assert!(backend(cache.lock("nightly").unwrap().try_acquire().await));
    assert_eq!(
        look_then_compute(&cache).await.unwrap(),
        6,
        "answered uncached"
    );
    let stats = cache.stats();
    // get, set, invalidate, the handler's get; its get_or_compute is counted as uncached.
    assert_eq!((stats.backend_errors, stats.uncached), (4, 1), "{stats:?}");

    // Back (empty, as after a failover): every call reaches it again; the skipped write is lost
    // like an evicted value, and the fallback no longer hides anything.
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    while cache.invalidate("2019-05").await.is_err() {
        assert!(Instant::now() < deadline, "the cache did not reconnect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(cache.get::<u32>("2019-05").await.unwrap(), None);
    let _ = cache.set("2019-05", &3u32, TTL).await.unwrap();
    assert_eq!(cache.get::<u32>("2019-05").await.unwrap(), Some(3));
    let guard = cache.lock("nightly").unwrap().try_acquire().await.unwrap();
    guard.expect("free").release().await.unwrap();
}
