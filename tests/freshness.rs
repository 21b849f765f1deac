//! Freshness: stale-while-revalidate, early refresh, stale-if-error, negative caching and
//! value-chosen TTLs. Exact sequences on the memory store under paused time; the fleet-wide
//! behaviour on a real redis-server.

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod cache;
    pub mod poll;
    pub mod server;
    pub use {cache::*, poll::*, server::*};
}

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stampede_guard::{Cache, CallOptions, Computed, Error, Fetched, Source};
use support::cache;
use support::RedisServer;

const SECOND: Duration = Duration::from_secs(1);

/// A computation that counts its runs, takes `work`, and returns the run's number (or fails).
#[derive(Clone, Default)]
struct Counter(Arc<AtomicUsize>);

impl Counter {
    fn runs(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    async fn fetch(&self, cache: &Cache, ttl: Duration, work: Duration) -> Fetched<usize> {
        self.try_fetch(cache, ttl, work, false).await.unwrap()
    }

    async fn try_fetch(
        &self,
        cache: &Cache,
        ttl: Duration,
        work: Duration,
        fail: bool,
    ) -> Result<Fetched<usize>, Error> {
        let runs = self.0.clone();
        cache
            .fetch("2019-05", ttl, move |_| async move {
                let run = runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(work).await;
                if fail {
                    Err(format!("run {run} failed"))
                } else {
                    Ok(Computed::new(run))
                }
            })
            .await
    }
}

fn stale_window() -> Cache {
    Cache::in_memory().with_options(CallOptions::default().stale_for(60 * SECOND))
}

/// Lets spawned background work run to completion under paused time.
async fn settle(for_: Duration) {
    tokio::time::sleep(for_).await;
}

#[tokio::test(start_paused = true)]
async fn fresh_then_stale_with_one_background_refresh_then_fresh_again() {
    let cache = stale_window();
    let counter = Counter::default();
    let first = counter.fetch(&cache, 10 * SECOND, SECOND).await;
    assert_eq!((first.value, first.source), (0, Source::Computed));
    settle(5 * SECOND).await;
    let hit = counter.fetch(&cache, 10 * SECOND, SECOND).await;
    assert_eq!((hit.value, hit.source), (0, Source::Hit));

    settle(5 * SECOND).await; // 11 s after the write: past the TTL, inside the stale window
    for _ in 0..10 {
        let stale = counter.fetch(&cache, 10 * SECOND, SECOND).await;
        assert_eq!(
            (stale.value, stale.source),
            (0, Source::Stale),
            "served at once"
        );
    }
    settle(2 * SECOND).await; // the refresh (1 s of work) lands
    assert_eq!(counter.runs(), 2, "one refresh for ten stale reads");
    let fresh = counter.fetch(&cache, 10 * SECOND, SECOND).await;
    assert_eq!((fresh.value, fresh.source), (1, Source::Hit));
}

#[tokio::test(start_paused = true)]
async fn past_the_hard_expiry_the_call_computes_in_the_foreground() {
    let cache = Cache::in_memory().with_options(CallOptions::default().stale_for(5 * SECOND));
    let counter = Counter::default();
    counter.fetch(&cache, 10 * SECOND, SECOND).await;
    settle(16 * SECOND).await;
    let again = counter.fetch(&cache, 10 * SECOND, SECOND).await;
    assert_eq!((again.value, again.source), (1, Source::Computed));
}

#[tokio::test(start_paused = true)]
async fn a_failed_refresh_keeps_serving_the_stale_value() {
    let cache = stale_window();
    let counter = Counter::default();
    counter.fetch(&cache, 10 * SECOND, SECOND).await;
    settle(11 * SECOND).await;
    let stale = counter
        .try_fetch(&cache, 10 * SECOND, SECOND, true)
        .await
        .unwrap();
    assert_eq!((stale.value, stale.source), (0, Source::Stale));
    settle(2 * SECOND).await; // the refresh fails
    assert_eq!(counter.runs(), 2);
    let still = counter
        .try_fetch(&cache, 10 * SECOND, SECOND, true)
        .await
        .unwrap();
    assert_eq!(
        (still.value, still.source),
        (0, Source::Stale),
        "the error is not the reader's"
    );
}

#[tokio::test(start_paused = true)]
async fn without_stale_if_error_a_failed_refresh_drops_the_stale_value() {
    let cache = Cache::in_memory().with_options(
        CallOptions::default()
            .stale_for(60 * SECOND)
            .serve_stale_on_error(false),
    );
    let counter = Counter::default();
    counter.fetch(&cache, 10 * SECOND, SECOND).await;
    settle(11 * SECOND).await;
    counter
        .try_fetch(&cache, 10 * SECOND, SECOND, true)
        .await
        .unwrap();
    settle(2 * SECOND).await;
    let err = counter
        .try_fetch(&cache, 10 * SECOND, SECOND, true)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Compute(_)),
        "computed in the foreground: {err:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_value_may_choose_its_own_ttl() {
    let cache = Cache::in_memory();
    let runs = Counter::default();
    let fetch = |cache: Cache, runs: Counter| async move {
        let r = runs.0.clone();
        cache
            .fetch("2026-11", 3600 * SECOND, move |_| async move {
                let run = r.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(Computed::new(run).ttl(2 * SECOND))
            })
            .await
            .unwrap()
    };
    assert_eq!(
        fetch(cache.clone(), runs.clone()).await.source,
        Source::Computed
    );
    settle(SECOND).await;
    assert_eq!(fetch(cache.clone(), runs.clone()).await.source, Source::Hit);
    settle(SECOND).await;
    let later = fetch(cache.clone(), runs.clone()).await;
    assert_eq!(
        (later.value, later.source),
        (1, Source::Computed),
        "expired after its own 2 s"
    );
}

#[tokio::test(start_paused = true)]
async fn a_remembered_failure_is_served_until_its_negative_ttl() {
    let cache =
        Cache::in_memory().with_options(CallOptions::default().negative_ttl(Some(5 * SECOND)));
    let counter = Counter::default();
    let first = counter
        .try_fetch(&cache, 60 * SECOND, SECOND, true)
        .await
        .unwrap_err();
    assert!(matches!(first, Error::Compute(_)), "{first:?}");
    let remembered = counter
        .try_fetch(&cache, 60 * SECOND, SECOND, false)
        .await
        .unwrap_err();
    assert!(
        matches!(&remembered, Error::RecentFailure { message, .. } if message == "run 0 failed"),
        "{remembered:?}"
    );
    assert_eq!(counter.runs(), 1, "not computed again");
    settle(5 * SECOND).await;
    let recovered = counter.fetch(&cache, 60 * SECOND, SECOND).await;
    assert_eq!((recovered.value, recovered.source), (1, Source::Computed));
}

#[tokio::test(start_paused = true)]
async fn an_invalidation_during_a_background_refresh_refuses_its_write() {
    let cache = stale_window();
    let counter = Counter::default();
    counter.fetch(&cache, 10 * SECOND, SECOND).await;
    settle(11 * SECOND).await;
    assert_eq!(
        counter.fetch(&cache, 10 * SECOND, SECOND).await.source,
        Source::Stale
    );
    settle(SECOND / 2).await; // the refresh is half-way
    let _ = cache.invalidate("2019-05").await.unwrap();
    settle(SECOND).await; // the refresh finishes; its write is refused
    assert_eq!(counter.runs(), 2);
    assert_eq!(cache.get::<usize>("2019-05").await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn early_refresh_renews_a_fresh_value_while_readers_get_it() {
    // A huge beta makes XFetch choose to refresh on every read of a fresh value.
    let cache = Cache::in_memory().with_options(CallOptions::default().early_refresh(1e12));
    let counter = Counter::default();
    counter.fetch(&cache, 60 * SECOND, SECOND).await;
    let hit = counter.fetch(&cache, 60 * SECOND, SECOND).await;
    assert_eq!(
        (hit.value, hit.source),
        (0, Source::Hit),
        "the current value, at once"
    );
    settle(2 * SECOND).await;
    assert_eq!(counter.runs(), 2, "refreshed in the background");
    assert_eq!(cache.get::<usize>("2019-05").await.unwrap(), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_two_hundred_stale_reads_return_at_once_and_one_refresh_runs() {
    let server = RedisServer::start();
    let options = CallOptions::default().stale_for(600 * SECOND);
    let mut caches = Vec::new();
    for _ in 0..8 {
        caches.push(cache(&server, "reports", options.clone()).await);
    }
    let ttl = Duration::from_millis(300);
    let first = caches[0]
        .fetch("2019-05", ttl, |_| async {
            Ok::<_, String>(Computed::new("old".to_string()))
        })
        .await
        .unwrap();
    assert_eq!(first.source, Source::Computed);
    tokio::time::sleep(ttl + Duration::from_millis(50)).await;

    let refreshes = Arc::new(AtomicUsize::new(0));
    let landed = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for i in 0..200 {
        let (cache, refreshes, landed) = (caches[i % 8].clone(), refreshes.clone(), landed.clone());
        readers.push(tokio::spawn(async move {
            let done = landed.clone();
            let got = cache
                .fetch("2019-05", ttl * 100, move |_| async move {
                    refreshes.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(2 * SECOND).await;
                    done.store(true, Ordering::SeqCst);
                    Ok::<_, String>(Computed::new("new".to_string()))
                })
                .await
                .unwrap();
            (got, landed.load(Ordering::SeqCst))
        }));
    }
    for reader in readers {
        let (got, refresh_had_landed) = reader.await.unwrap();
        assert_eq!((got.value.as_str(), got.source), ("old", Source::Stale));
        assert!(!refresh_had_landed, "a reader waited for the refresh");
    }
    assert!(
        support::eventually(Duration::from_secs(10), || landed.load(Ordering::SeqCst)),
        "the refresh never landed"
    );
    for cache in &caches {
        let mut seen = None;
        for _ in 0..100 {
            seen = cache.get::<String>("2019-05").await.unwrap();
            if seen.as_deref() == Some("new") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            seen.as_deref(),
            Some("new"),
            "the refreshed value is visible to all"
        );
    }
    assert_eq!(
        refreshes.load(Ordering::SeqCst),
        1,
        "exactly one refresh in the fleet"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_remembered_failure_reaches_other_instances_without_a_second_compute() {
    let server = RedisServer::start();
    let options = CallOptions::default().negative_ttl(Some(60 * SECOND));
    let (a, b) = (
        cache(&server, "reports", options.clone()).await,
        cache(&server, "reports", options).await,
    );
    let computes = Arc::new(AtomicUsize::new(0));
    let failing = |computes: Arc<AtomicUsize>| {
        move || async move {
            computes.fetch_add(1, Ordering::SeqCst);
            Err::<u32, _>("the report query timed out".to_string())
        }
    };
    let first = a
        .get_or_compute("2019-05", 60 * SECOND, failing(computes.clone()))
        .await;
    assert!(matches!(first, Err(Error::Compute(_))), "{first:?}");
    let second = b
        .get_or_compute("2019-05", 60 * SECOND, failing(computes.clone()))
        .await;
    assert!(
        matches!(&second, Err(Error::RecentFailure { message, .. }) if message == "the report query timed out"),
        "{second:?}"
    );
    assert_eq!(computes.load(Ordering::SeqCst), 1);
}

/// A failure marked `NotShared` (the caller's own: a permission, a quota) is neither remembered
/// for another instance nor handed to this process's waiting callers: each computes for itself.
/// A remembered failure's message is bounded, whatever the error printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_failure_marked_not_shared_stays_with_its_caller() {
    use stampede_guard::NotShared;

    let server = RedisServer::start();
    let options = CallOptions::default().negative_ttl(Some(60 * SECOND));
    let (a, b) = (
        cache(&server, "markers", options.clone()).await,
        cache(&server, "markers", options).await,
    );
    let computes = Arc::new(AtomicUsize::new(0));
    let denied = |computes: Arc<AtomicUsize>| {
        move || async move {
            computes.fetch_add(1, Ordering::SeqCst);
            // Slow enough that the concurrent calls below join this one's flight.
            tokio::time::sleep(Duration::from_millis(200)).await;
            Err::<u32, _>(NotShared::new("user 7 may not see this report"))
        }
    };
    // Three calls at once in one instance: each gets its own computation's error.
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let (a, computes) = (a.clone(), computes.clone());
            tokio::spawn(async move {
                a.get_or_compute("2019-05", 60 * SECOND, denied(computes))
                    .await
            })
        })
        .collect();
    for call in calls {
        let outcome = call.await.unwrap();
        assert!(matches!(outcome, Err(Error::Compute(_))), "{outcome:?}");
    }
    assert_eq!(
        computes.load(Ordering::SeqCst),
        3,
        "not shared in the process"
    );
    // Another instance: nothing remembered, it computes for itself.
    let other = b
        .get_or_compute("2019-05", 60 * SECOND, || async { Ok::<_, String>(42u32) })
        .await;
    assert_eq!(other.unwrap(), 42);

    // A shared failure with a huge message: remembered, cut to a bounded size.
    let huge = "x".repeat(100_000);
    let first = a
        .get_or_compute("2019-06", 60 * SECOND, move || async move {
            Err::<u32, _>(huge)
        })
        .await;
    assert!(matches!(first, Err(Error::Compute(_))), "{first:?}");
    let remembered = b
        .get_or_compute("2019-06", 60 * SECOND, || async { Ok::<_, String>(1u32) })
        .await;
    match remembered {
        Err(Error::RecentFailure { message, .. }) => {
            assert!(message.len() <= 1024, "{} bytes", message.len());
            assert!(message.starts_with("xxx") && message.ends_with('…'));
        }
        other => panic!("expected the remembered failure, got {other:?}"),
    }
}
