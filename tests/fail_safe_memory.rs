//! The fail-safe and the soft and hard timeouts on the memory store, under paused tokio time:
//! one test per row of the table in `docs/fail-safe.md`, to the millisecond of virtual time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stampede_guard::{Cache, CallOptions, Computed, Error, Fetched, Source};
use tokio::time::Instant;

const SECOND: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);
const TTL: Duration = Duration::from_secs(10);
const KEY: &str = "2019-05";

fn fail_safe() -> CallOptions {
    CallOptions::default().fail_safe_for(3600 * SECOND)
}

/// A call whose computation counts itself, takes `takes`, and returns `value` (or fails when
/// `value` is `None`).
async fn call(
    cache: &Cache,
    computes: &Arc<AtomicUsize>,
    takes: Duration,
    value: Option<u32>,
) -> Result<Fetched<u32>, Error> {
    let computes = Arc::clone(computes);
    cache
        .fetch(KEY, TTL, move |_| async move {
            computes.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(takes).await;
            value.map(Computed::new).ok_or("the database is down")
        })
        .await
}

/// Writes `1` for `KEY`, then lets it expire past its stale window: it is in its fail-safe
/// window from then on.
async fn expired_value(cache: &Cache) {
    let computes = Arc::new(AtomicUsize::new(0));
    let first = call(cache, &computes, MS, Some(1)).await.unwrap();
    assert_eq!(first.source, Source::Computed);
    tokio::time::advance(TTL).await;
}

#[tokio::test(start_paused = true)]
async fn a_kept_value_is_not_a_hit_the_next_caller_computes() {
    let cache = Cache::in_memory().with_options(fail_safe());
    expired_value(&cache).await;
    let computes = Arc::new(AtomicUsize::new(0));
    let fetched = call(&cache, &computes, SECOND, Some(2)).await.unwrap();
    assert_eq!((fetched.value, fetched.source), (2, Source::Computed));
    assert_eq!(computes.load(Ordering::SeqCst), 1);
    assert_eq!(cache.get::<u32>(KEY).await.unwrap(), Some(2));
}

#[tokio::test(start_paused = true)]
async fn a_failed_computation_is_answered_with_the_kept_value() {
    let cache = Cache::in_memory().with_options(fail_safe());
    expired_value(&cache).await;
    assert_eq!(
        cache.get::<u32>(KEY).await.unwrap(),
        None,
        "a plain read does not serve a kept value"
    );
    let computes = Arc::new(AtomicUsize::new(0));
    let fetched = call(&cache, &computes, MS, None).await.unwrap();
    assert_eq!((fetched.value, fetched.source), (1, Source::FailSafe));
    assert_eq!(cache.stats().fallback_served, 1);
}

#[tokio::test(start_paused = true)]
async fn without_the_fail_safe_the_error_reaches_the_caller() {
    let cache = Cache::in_memory();
    expired_value(&cache).await;
    let computes = Arc::new(AtomicUsize::new(0));
    let failed = call(&cache, &computes, MS, None).await;
    assert!(matches!(failed, Err(Error::Compute(_))), "{failed:?}");
}

#[tokio::test(start_paused = true)]
async fn the_computing_caller_gets_the_fallback_at_its_soft_timeout_and_the_value_lands_later() {
    let cache = Cache::in_memory().with_options(fail_safe().soft_timeout(Some(100 * MS)));
    expired_value(&cache).await;
    let computes = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let fetched = call(&cache, &computes, 2 * SECOND, Some(2)).await.unwrap();
    assert_eq!((fetched.value, fetched.source), (1, Source::FailSafe));
    assert_eq!(start.elapsed(), 100 * MS, "answered at the soft timeout");
    assert_eq!(cache.stats().soft_timeouts, 1);

    // The computation goes on, under its lock: another caller waits (and falls back in turn)
    // rather than computing again, and the value lands when the computation ends.
    let again = call(&cache, &computes, MS, Some(3)).await.unwrap();
    assert_eq!((again.value, again.source), (1, Source::FailSafe));
    tokio::time::advance(2 * SECOND).await;
    let landed = call(&cache, &computes, MS, Some(3)).await.unwrap();
    // Read as it lands, or just after (paused time wakes the computation and this call in
    // either order): the background computation's value either way, never this call's.
    assert_eq!(landed.value, 2);
    assert!(matches!(landed.source, Source::Hit | Source::Waited));
    assert_eq!(computes.load(Ordering::SeqCst), 1, "computed once");
    assert_eq!(cache.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_gets_the_fallback_at_its_soft_timeout() {
    let cache = Cache::in_memory().with_options(fail_safe().soft_timeout(Some(100 * MS)));
    expired_value(&cache).await;
    // The key's lock, held elsewhere (`cache.lock(k)` is the lock `get_or_compute(k)` takes).
    let held = cache.lock(KEY).unwrap().acquire().await.unwrap();
    let computes = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let fetched = call(&cache, &computes, MS, Some(2)).await.unwrap();
    assert_eq!((fetched.value, fetched.source), (1, Source::FailSafe));
    assert_eq!(start.elapsed(), 100 * MS);
    assert_eq!(
        computes.load(Ordering::SeqCst),
        0,
        "it waited, never computed"
    );
    held.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn without_a_fallback_the_soft_timeout_does_nothing() {
    let cache = Cache::in_memory().with_options(fail_safe().soft_timeout(Some(100 * MS)));
    let computes = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let fetched = call(&cache, &computes, SECOND, Some(2)).await.unwrap();
    assert_eq!((fetched.value, fetched.source), (2, Source::Computed));
    assert_eq!(start.elapsed(), SECOND);
    assert_eq!(cache.stats().soft_timeouts, 0);
}

#[tokio::test(start_paused = true)]
async fn the_hard_timeout_frees_the_lock_at_once_and_the_late_value_never_lands() {
    let cache = Cache::in_memory().with_options(
        CallOptions::default()
            .lease(60 * SECOND)
            .max_hold(Some(200 * MS)),
    );
    let computes = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let cut = call(&cache, &computes, 5 * SECOND, Some(2)).await;
    assert_eq!(start.elapsed(), 200 * MS);
    match cut {
        Err(Error::ComputeTimeout { key, after }) => {
            assert_eq!((key.as_str(), after), (KEY, 200 * MS));
        }
        other => panic!("expected a hard timeout, got {other:?}"),
    }
    let lock = cache.lock(KEY).unwrap();
    let free = lock.try_acquire().await.unwrap();
    assert!(
        free.is_some(),
        "the lock is free at once, not after its 60 s lease"
    );
    free.unwrap().release().await.unwrap();
    tokio::time::advance(10 * SECOND).await;
    assert_eq!(cache.get::<u32>(KEY).await.unwrap(), None, "no late value");
    assert_eq!(cache.stats().hard_timeouts, 1);
}

#[tokio::test(start_paused = true)]
async fn the_hard_timeout_with_a_kept_value_serves_it() {
    let cache = Cache::in_memory().with_options(fail_safe().max_hold(Some(200 * MS)));
    expired_value(&cache).await;
    let computes = Arc::new(AtomicUsize::new(0));
    let fetched = call(&cache, &computes, 5 * SECOND, Some(2)).await.unwrap();
    assert_eq!((fetched.value, fetched.source), (1, Source::FailSafe));
}

#[tokio::test(start_paused = true)]
async fn a_failing_source_is_called_once_per_throttle() {
    let throttle = 2 * SECOND;
    let cache = Cache::in_memory().with_options(fail_safe().fail_safe_throttle(throttle));
    expired_value(&cache).await;
    let computes = Arc::new(AtomicUsize::new(0));
    // Ten calls a second for ten seconds, all while the source is down.
    for _ in 0..100 {
        let fetched = call(&cache, &computes, 10 * MS, None).await.unwrap();
        assert_eq!((fetched.value, fetched.source), (1, Source::FailSafe));
        tokio::time::advance(100 * MS).await;
    }
    let calls = computes.load(Ordering::SeqCst);
    assert!(
        (5..=6).contains(&calls),
        "{calls} calls of the source in 10 s"
    );
    // The source is back: once the throttle ends, the next caller computes.
    tokio::time::advance(throttle).await;
    let fetched = call(&cache, &computes, MS, Some(2)).await.unwrap();
    assert_eq!((fetched.value, fetched.source), (2, Source::Computed));
}

#[tokio::test(start_paused = true)]
async fn the_stale_window_comes_first_and_the_fail_safe_window_after_it() {
    let cache = Cache::in_memory().with_options(fail_safe().stale_for(TTL));
    let computes = Arc::new(AtomicUsize::new(0));
    call(&cache, &computes, MS, Some(1)).await.unwrap();
    tokio::time::advance(TTL).await;
    // In the stale window: served at once, refreshed in the background (which fails here).
    let stale = call(&cache, &computes, MS, None).await.unwrap();
    assert_eq!((stale.value, stale.source), (1, Source::Stale));
    tokio::time::advance(TTL).await;
    // Past it: the caller computes; it fails, and the kept value answers.
    let fallback = call(&cache, &computes, MS, None).await.unwrap();
    assert_eq!((fallback.value, fallback.source), (1, Source::FailSafe));
}

#[tokio::test(start_paused = true)]
async fn past_the_fail_safe_window_nothing_is_kept() {
    let cache = Cache::in_memory().with_options(CallOptions::default().fail_safe_for(TTL));
    let computes = Arc::new(AtomicUsize::new(0));
    call(&cache, &computes, MS, Some(1)).await.unwrap();
    tokio::time::advance(2 * TTL).await;
    let failed = call(&cache, &computes, MS, None).await;
    assert!(matches!(failed, Err(Error::Compute(_))), "{failed:?}");
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_call_before_its_soft_timeout_frees_the_lock() {
    let cache =
        Cache::in_memory().with_options(fail_safe().soft_timeout(Some(SECOND)).lease(60 * SECOND));
    expired_value(&cache).await;
    let computes = Arc::new(AtomicUsize::new(0));
    let cancelled = tokio::time::timeout(100 * MS, call(&cache, &computes, 5 * SECOND, Some(2)));
    assert!(cancelled.await.is_err());
    // The computation was aborted with its caller, and its lock freed in the background.
    tokio::task::yield_now().await;
    tokio::time::advance(MS).await;
    let lock = cache.lock(KEY).unwrap();
    assert!(
        lock.try_acquire().await.unwrap().is_some(),
        "the lock is free"
    );
    assert_eq!(cache.in_flight(), 0);
}
