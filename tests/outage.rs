//! A Redis outage is not a service outage (issue 21), on real servers: the circuit breaker opens
//! on refused and on black-holed connections and then fails calls fast without reaching Redis;
//! a near tier with `serve_while_down` answers from the copies it holds, within its bound; with
//! `ComputeUncached` one computation per key runs in the process; the health report says all
//! of it; and once Redis answers again the breaker closes by itself.

mod support {
    pub mod poll;
    pub mod proxy;
    pub mod server;
    pub use poll::*;
    pub use proxy::*;
    pub use server::*;
}

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stampede_guard::{
    BreakerOptions, BreakerState, Cache, CallOptions, Computed, ConnectionOptions, Error,
    HealthReason, HealthState, NearCacheOptions, OnBackendError, Source,
};
use support::{eventually, Mode, Proxy, RedisServer};

const TTL: Duration = Duration::from_secs(60);

/// A cache on `url` whose connection fails fast (one attempt, short time-outs), so that the
/// breaker, not the client's own retries, is what the test sees.
async fn cache_on(url: &str, options: CallOptions, near: Option<NearCacheOptions>) -> Cache {
    let mut builder = Cache::builder()
        .redis_url(url)
        .namespace("outage")
        .options(options)
        .connection(
            ConnectionOptions::default()
                .connect_timeout(Duration::from_millis(300))
                .response_timeout(Duration::from_millis(300))
                .reconnect_retries(0),
        )
        .breaker(
            BreakerOptions::default()
                .failures(3)
                .cool_down(Duration::from_millis(200)),
        );
    if let Some(near) = near {
        builder = builder.near_cache(near);
    }
    builder.build().await.expect("a cache")
}

/// A computation that must not run (the value is held, or the breaker is open and the call
/// has no fallback).
async fn never() -> Result<u32, String> {
    Err("the computation ran".to_owned())
}

/// A proxy in front of `redis`, to black-hole its path. It runs its own runtime, which cannot
/// start inside a test's.
fn proxy_to(redis: &RedisServer) -> Proxy {
    let port = redis.port();
    std::thread::spawn(move || Proxy::start(port))
        .join()
        .expect("the proxy starts")
}

fn unreachable<T: std::fmt::Debug>(result: &Result<T, Error>) -> bool {
    matches!(result, Err(e) if e.is_backend() && e.is_unreachable())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_open_the_breaker_then_calls_fail_fast_and_it_closes_when_redis_returns(
) {
    let mut redis = RedisServer::start();
    let cache = cache_on(&redis.url(), CallOptions::default(), None).await;
    assert!(cache.set("2019-05", &1u32, TTL).await.unwrap().is_applied());
    redis.kill();

    for _ in 0..3 {
        assert!(unreachable(&cache.get::<u32>("2019-05").await));
    }
    let stats = cache.stats();
    assert_eq!(stats.breaker, BreakerState::Open, "{stats:?}");
    assert_eq!(stats.breaker_opened, 1);
    let before = stats.fast_failures;
    let failed = cache.get::<u32>("2019-05").await;
    assert!(unreachable(&failed), "{failed:?}");
    let error = failed.unwrap_err();
    let cause = std::error::Error::source(&error).map(ToString::to_string);
    assert!(
        cause
            .as_deref()
            .is_some_and(|c| c.starts_with("circuit breaker open: ")),
        "{error}: {cause:?}"
    );
    // The breaker's own error, not the client's: the request was never sent.
    let source = std::error::Error::source(&error).expect("a source");
    assert!(
        source.downcast_ref::<redis::RedisError>().is_none(),
        "{source:?}"
    );
    assert!(
        source.downcast_ref::<std::io::Error>().is_none(),
        "{source:?}"
    );
    assert!(
        format!("{source:?}").starts_with("BreakerOpen"),
        "{source:?}"
    );
    let Error::Backend { source, .. } = &error else {
        panic!("not a backend error: {error:?}");
    };
    assert_eq!(source.code(), None);
    assert!(
        cache.stats().fast_failures > before,
        "failed without trying"
    );

    let health = cache.health().await;
    assert!(!health.reachable && !health.is_ready(), "{health:?}");
    // No fallback configured: every call fails, and the report says so.
    assert_eq!(health.state, HealthState::Unavailable);
    assert_eq!(health.reasons.last(), Some(&HealthReason::NoFallback));
    assert_ne!(health.breaker, BreakerState::Closed);
    assert!(health.failing_for.is_some());

    redis.restart();
    cache_answers_again(&cache).await;
    let health = cache.health().await;
    assert!(health.is_ready(), "{health:?}");
    assert_eq!(health.failing_for, None);
    assert_eq!(
        cache.stats().breaker_opened,
        1,
        "opened once for one outage"
    );
}

/// Polls until a call goes through again (the probe closed the breaker).
async fn cache_answers_again(cache: &Cache) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if cache.get::<u32>("2019-05").await.is_ok() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the breaker never closed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(cache.stats().breaker, BreakerState::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_hole_opens_the_breaker_as_surely_and_then_no_call_waits_on_it() {
    let redis = RedisServer::start();
    let proxy = proxy_to(&redis);
    let cache = cache_on(&proxy.url(), CallOptions::default(), None).await;
    assert!(cache.set("2019-05", &1u32, TTL).await.unwrap().is_applied());
    proxy.set_mode(Mode::Blackhole);

    // Three calls at once: each waits for its response time-out, and together they open it.
    let calls = (0..3).map(|_| {
        let cache = cache.clone();
        tokio::spawn(async move { cache.get::<u32>("2019-05").await })
    });
    for call in calls {
        assert!(unreachable(&call.await.unwrap()));
    }
    assert_eq!(cache.stats().breaker, BreakerState::Open);

    // From now on no call reaches the hole: each fails fast, counted as such (a call that went
    // to the connection would not be counted there, and would wait for its time-out).
    let fast = cache.stats().fast_failures;
    for _ in 0..20 {
        assert!(unreachable(&cache.get::<u32>("2019-05").await));
    }
    assert!(cache.stats().fast_failures >= fast + 20);

    proxy.set_mode(Mode::Pass);
    cache_answers_again(&cache).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_hole_fails_the_waiting_calls_at_the_stall_not_at_the_response_timeout() {
    let redis = RedisServer::start();
    let proxy = proxy_to(&redis);
    // A response time-out far beyond the test's patience: only the stall watchdog can end the
    // calls below in time.
    let cache = Cache::builder()
        .redis_url(proxy.url())
        .namespace("outage")
        .connection(ConnectionOptions::default().response_timeout(Duration::from_secs(60)))
        .build()
        .await
        .unwrap();
    assert!(cache.set("2019-05", &1u32, TTL).await.unwrap().is_applied());
    proxy.set_mode(Mode::Blackhole);

    let calls: Vec<_> = (0..10)
        .map(|_| {
            let cache = cache.clone();
            tokio::spawn(async move { cache.get::<u32>("2019-05").await })
        })
        .collect();
    for call in calls {
        let failed = tokio::time::timeout(Duration::from_secs(20), call)
            .await
            .expect("ended by the stall watchdog, long before the response time-out")
            .unwrap();
        assert!(unreachable(&failed), "{failed:?}");
    }
    let stats = cache.stats();
    assert_eq!(stats.breaker, BreakerState::Open, "{stats:?}");
    assert_eq!(stats.breaker_opened, 1);
    proxy.set_mode(Mode::Pass);
    cache_answers_again(&cache).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_serve_while_down_the_near_tier_answers_from_what_it_holds() {
    let mut redis = RedisServer::start();
    let near = NearCacheOptions::new(100)
        .max_staleness(Duration::from_millis(200))
        .serve_while_down(Duration::from_secs(60));
    let cache = cache_on(&redis.url(), CallOptions::default(), Some(near)).await;
    let first = cache
        .fetch("2019-05", TTL, |_| async {
            Ok::<_, String>(Computed::new(7u32))
        })
        .await
        .unwrap();
    assert_eq!(first.source, Source::Computed);
    // Read again, until the near tier holds a copy and serves it.
    until_near_hit(&cache, "2019-05").await;
    redis.kill();
    // Past the feed's proof, the copy is no longer served as a hit: it is held.
    tokio::time::sleep(Duration::from_millis(400)).await;

    for _ in 0..10 {
        let served = cache
            .fetch("2019-05", TTL, |_| async {
                never().await.map(Computed::new)
            })
            .await
            .expect("served from what the process holds");
        assert_eq!((served.value, served.source), (7, Source::Held));
    }
    // A read that must see the latest write takes no held copy (it may predate the write):
    // it fails as without the option.
    let latest = cache.with_options(cache.options().clone().skip_near_cache(true));
    let skipped = latest
        .fetch("2019-05", TTL, |_| async {
            never().await.map(Computed::new)
        })
        .await;
    assert!(unreachable(&skipped), "{skipped:?}");
    // A key it does not hold still fails, as without the option.
    let other = cache
        .fetch("2019-06", TTL, |_| async {
            never().await.map(Computed::new)
        })
        .await;
    assert!(unreachable(&other), "{other:?}");
    let stats = cache.stats();
    assert_eq!(stats.held_served, 10);
    assert_eq!(stats.computes, 1);

    let health = cache.health().await;
    assert_eq!(health.near_feed_proven, Some(false));
    // It serves what it holds: degraded, and still ready (it stays in rotation).
    assert_eq!(health.state, HealthState::Degraded, "{health:?}");
    assert!(health.is_ready() && !health.reachable, "{health:?}");
    assert!(health.reasons.contains(&HealthReason::ServingHeldCopies));
}

/// A cache through `proxy` with a near tier serving while down, whose breaker's stall watchdog
/// waits `stall`, and a copy of `2019-05` (7) its near tier serves.
async fn holding_through(proxy: &Proxy, stall: Duration) -> Cache {
    let cache = Cache::builder()
        .redis_url(proxy.url())
        .namespace("outage")
        .connection(ConnectionOptions::default().response_timeout(Duration::from_secs(120)))
        .breaker(BreakerOptions::default().stall(stall))
        .near_cache(
            NearCacheOptions::new(100)
                .max_staleness(Duration::from_millis(200))
                .serve_while_down(Duration::from_secs(60)),
        )
        .build()
        .await
        .unwrap();
    cache
        .fetch("2019-05", TTL, |_| async {
            Ok::<_, String>(Computed::new(7u32))
        })
        .await
        .unwrap();
    until_near_hit(&cache, "2019-05").await;
    cache
}

/// A server behind a proxy, a cache holding `2019-05` through it (see [`holding_through`]),
/// then the path black-holed and the feed's proof past: the copy is held, and reads go to the
/// silent server.
async fn gone_silent(stall: Duration) -> (RedisServer, Proxy, Cache) {
    let redis = RedisServer::start();
    let proxy = proxy_to(&redis);
    let cache = holding_through(&proxy, stall).await;
    proxy.set_mode(Mode::Blackhole);
    tokio::time::sleep(Duration::from_millis(400)).await;
    (redis, proxy, cache)
}

/// Reads the held `2019-05`, which must answer `Held` (7) even though the server is silent.
async fn read_held(cache: &Cache) {
    let read = cache.fetch("2019-05", TTL, |_| async {
        never().await.map(Computed::new)
    });
    let served = tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("answered by the held copy, not left to wait for the server")
        .expect("served from what the process holds");
    assert_eq!((served.value, served.source), (7, Source::Held));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_copy_answers_a_read_the_silent_server_leaves_unanswered_before_the_breaker_opens() {
    // Neither the stall watchdog nor a time-out can end a read within the test: only the held
    // copy can answer one.
    let (_redis, proxy, cache) = gone_silent(Duration::from_secs(120)).await;
    for _ in 0..10 {
        read_held(&cache).await;
    }
    let stats = cache.stats();
    // Answered while the breaker was still closed: by the held copy, not by a failure.
    assert_eq!(stats.breaker, BreakerState::Closed, "{stats:?}");
    assert_eq!((stats.held_served, stats.computes), (10, 1), "{stats:?}");
    // A key it holds no copy of still waits for the server.
    let other = cache.fetch("2019-06", TTL, |_| async {
        never().await.map(Computed::new)
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(500), other)
            .await
            .is_err(),
        "a key never held is not answered while the server is silent"
    );
    proxy.set_mode(Mode::Pass);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_answered_by_held_copies_still_open_the_breaker_on_a_silent_server() {
    let (_redis, proxy, cache) = gone_silent(Duration::from_millis(300)).await;
    // Only held reads, each answered at once: the reads they sent stay out, so the watchdog
    // sees requests waiting with no answer and opens the breaker; from then on no read is sent.
    let mut reads = 0;
    while cache.stats().breaker != BreakerState::Open {
        assert!(reads < 400, "the breaker never opened: {:?}", cache.stats());
        read_held(&cache).await;
        reads += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let sent = cache.stats();
    read_held(&cache).await;
    assert_eq!(cache.stats().fast_failures, sent.fast_failures + 1);
    proxy.set_mode(Mode::Pass);
}

/// Reads `key` until the near tier answers it (its feed is proven and it holds a copy).
async fn until_near_hit(cache: &Cache, key: &str) {
    for _ in 0..100 {
        let hits = cache.stats().near_hits;
        cache
            .fetch(key, TTL, |_| async { never().await.map(Computed::new) })
            .await
            .expect("a hit");
        if cache.stats().near_hits > hits {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the near tier never served {key}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_serve_while_down_nothing_held_is_served() {
    let mut redis = RedisServer::start();
    let near = NearCacheOptions::new(100).max_staleness(Duration::from_millis(200));
    let cache = cache_on(&redis.url(), CallOptions::default(), Some(near)).await;
    cache
        .fetch("2019-05", TTL, |_| async {
            Ok::<_, String>(Computed::new(7u32))
        })
        .await
        .unwrap();
    until_near_hit(&cache, "2019-05").await;
    redis.kill();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let served = cache
        .fetch("2019-05", TTL, |_| async {
            never().await.map(Computed::new)
        })
        .await;
    assert!(unreachable(&served), "{served:?}");
    assert_eq!(cache.stats().held_served, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serve_while_down_bound_ends_serving() {
    let mut redis = RedisServer::start();
    let near = NearCacheOptions::new(100)
        .max_staleness(Duration::from_millis(200))
        .serve_while_down(Duration::from_millis(500));
    let cache = cache_on(&redis.url(), CallOptions::default(), Some(near)).await;
    cache
        .fetch("2019-05", TTL, |_| async {
            Ok::<_, String>(Computed::new(7u32))
        })
        .await
        .unwrap();
    until_near_hit(&cache, "2019-05").await;
    redis.kill();
    // The proof lapses within 200 ms, the bound 500 ms after that: after 1.5 s it is over.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let served = cache
        .fetch("2019-05", TTL, |_| async {
            never().await.map(Computed::new)
        })
        .await;
    assert!(unreachable(&served), "{served:?}");
    // Past the bound nothing answers in Redis's place: the report says so.
    let health = cache.health().await;
    assert_eq!(health.state, HealthState::Unavailable, "{health:?}");
    assert!(!health.reasons.contains(&HealthReason::ServingHeldCopies));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_compute_uncached_and_the_breaker_open_one_computation_per_key_runs_here() {
    let mut redis = RedisServer::start();
    let options = CallOptions::default().on_backend_error(OnBackendError::ComputeUncached);
    let cache = cache_on(&redis.url(), options, None).await;
    assert!(cache.set("warm", &1u32, TTL).await.unwrap().is_applied());
    redis.kill();
    for _ in 0..3 {
        let _ = cache.get::<u32>("warm").await;
    }
    assert_eq!(cache.stats().breaker, BreakerState::Open);

    let runs = Arc::new(AtomicUsize::new(0));
    let (release, gate) = tokio::sync::watch::channel(false);
    let calls: Vec<_> = (0..10)
        .map(|_| {
            let cache = cache.clone();
            let runs = Arc::clone(&runs);
            let mut gate = gate.clone();
            tokio::spawn(async move {
                cache
                    .fetch("2019-05", TTL, move |_| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        // Held until every caller has joined the flight.
                        let _ = gate.wait_for(|open| *open).await;
                        Ok::<_, String>(Computed::new(5u32))
                    })
                    .await
            })
        })
        .collect();
    assert!(eventually(Duration::from_secs(5), || cache.in_flight() == 1));
    tokio::time::sleep(Duration::from_millis(100)).await;
    release.send_replace(true);
    let mut sources = Vec::new();
    for call in calls {
        let fetched = call.await.unwrap().expect("computed without the cache");
        assert_eq!(fetched.value, 5);
        sources.push(fetched.source);
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "one computation in the process"
    );
    assert!(sources.contains(&Source::Uncached), "{sources:?}");
    let stats = cache.stats();
    assert_eq!(stats.breaker, BreakerState::Open, "{stats:?}");
    // It serves every read by computing: degraded, ready, and it says why.
    let health = cache.health().await;
    assert_eq!(health.state, HealthState::Degraded, "{health:?}");
    assert!(health.is_ready(), "{health:?}");
    assert_eq!(
        health.reasons,
        [
            HealthReason::BackendUnreachable,
            HealthReason::BreakerOpen,
            HealthReason::ComputingUncached
        ]
    );
}
