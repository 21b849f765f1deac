//! The lock on its own: exclusivity, fencing tokens, renewal, maximum hold, release semantics.
//! Memory-store timing under paused tokio time; the same contract on a real redis-server.

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod server;
    pub use server::*;
}

use std::time::Duration;

use stampede_guard::{Backoff, Cache, CallOptions, Error, Lock};
use support::RedisServer;
use tokio::time::Instant;

const SECOND: Duration = Duration::from_secs(1);

fn memory_lock(options: CallOptions) -> Lock {
    Cache::in_memory()
        .with_options(options)
        .lock("sync")
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_held_lock_is_exclusive_and_tokens_rise() {
    let lock = memory_lock(CallOptions::default());
    let first = lock.try_acquire().await.unwrap().expect("free");
    assert!(lock.try_acquire().await.unwrap().is_none(), "exclusive");
    let token = first.fencing_token();
    first.release().await.unwrap();
    let second = lock.try_acquire().await.unwrap().expect("free again");
    assert!(second.fencing_token() > token);
}

#[tokio::test(start_paused = true)]
async fn release_after_expiry_is_a_typed_not_held_error() {
    let lock = memory_lock(CallOptions::default().lease(SECOND).renew(false));
    let guard = lock.acquire().await.unwrap();
    tokio::time::advance(2 * SECOND).await;
    assert!(!guard.is_held());
    let err = guard.release().await.unwrap_err();
    assert!(
        matches!(&err, Error::NotHeld { name } if name == "sync"),
        "{err:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn extend_after_the_lock_was_taken_over_reports_false() {
    let lock = memory_lock(CallOptions::default().lease(SECOND).renew(false));
    let old = lock.acquire().await.unwrap();
    tokio::time::advance(2 * SECOND).await;
    let new = lock.try_acquire().await.unwrap().expect("expired, so free");
    assert!(!old.extend().await.unwrap(), "no longer ours");
    assert!(!old.is_held());
    assert!(new.is_held());
    assert!(new.extend().await.unwrap());
    assert!(new.fencing_token() > old.fencing_token());
}

#[tokio::test(start_paused = true)]
async fn renewal_keeps_the_lock_and_max_hold_ends_it() {
    let lock = memory_lock(
        CallOptions::default()
            .lease(3 * SECOND)
            .max_hold(Some(10 * SECOND)),
    );
    let started = Instant::now();
    let guard = lock.acquire().await.unwrap();
    tokio::time::sleep(9 * SECOND).await;
    assert!(guard.is_held(), "renewed past three leases");
    assert!(lock.try_acquire().await.unwrap().is_none());
    guard.lost().await;
    let held_for = started.elapsed();
    assert!(
        held_for >= 10 * SECOND && held_for <= 13 * SECOND,
        "lost after {held_for:?}: renewal stops at the maximum hold, the lease ends one lease later at most"
    );
    // The holder gives up 500 ppm of its lease for its clock's drift: the store lets the lock
    // go that much later.
    tokio::time::sleep(3 * SECOND / 2000).await;
    assert!(
        lock.try_acquire().await.unwrap().is_some(),
        "free for others"
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_woken_by_the_release_not_the_backoff() {
    let lock = memory_lock(
        CallOptions::default()
            .lease(3600 * SECOND)
            .backoff(Backoff::new(600 * SECOND, 600 * SECOND))
            .wait_timeout(3600 * SECOND),
    );
    let guard = lock.acquire().await.unwrap();
    let releaser = tokio::spawn(async move {
        tokio::time::sleep(2 * SECOND).await;
        guard.release().await.unwrap();
    });
    let started = Instant::now();
    let second = lock.acquire().await.unwrap();
    assert_eq!(
        started.elapsed(),
        2 * SECOND,
        "woken the moment the lock was released"
    );
    assert!(second.is_held());
    releaser.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_dropped_guard_frees_the_lock() {
    let lock = memory_lock(CallOptions::default().lease(3600 * SECOND));
    let guard = lock.acquire().await.unwrap();
    drop(guard);
    tokio::task::yield_now().await;
    assert!(lock.try_acquire().await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn acquire_gives_up_at_the_wait_bound() {
    let lock = memory_lock(
        CallOptions::default()
            .lease(3600 * SECOND)
            .wait_timeout(5 * SECOND),
    );
    let _held = lock.acquire().await.unwrap();
    let started = Instant::now();
    let err = lock.acquire().await.unwrap_err();
    assert!(err.is_wait_timeout(), "{err:?}");
    assert_eq!(started.elapsed(), 5 * SECOND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_the_lock_renews_expires_and_reports_not_held() {
    let server = RedisServer::start();
    let build = |options: CallOptions| {
        Lock::builder("sync")
            .redis_url(server.url())
            .namespace("jobs")
            .options(options)
            .build()
    };
    let renewing = build(CallOptions::default().lease(Duration::from_millis(300)))
        .await
        .unwrap();
    let other = build(CallOptions::default()).await.unwrap();

    let guard = renewing.acquire().await.unwrap();
    // Four leases long: only the heartbeat keeps it.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(other.try_acquire().await.unwrap().is_none(), "still held");
    }
    assert!(guard.is_held());
    let token = guard.fencing_token();
    guard.release().await.unwrap();

    let taken = other.try_acquire().await.unwrap().expect("released");
    assert!(taken.fencing_token() > token);
    drop(taken);

    let short = build(
        CallOptions::default()
            .lease(Duration::from_millis(200))
            .renew(false),
    )
    .await
    .unwrap();
    let mut lapsing = None;
    for _ in 0..100 {
        // The dropped guard's release is asynchronous: wait until it has landed.
        if let Some(guard) = short.try_acquire().await.unwrap() {
            lapsing = Some(guard);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let lapsing = lapsing.expect("free after the drop");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let usurper = other
        .try_acquire()
        .await
        .unwrap()
        .expect("the lease ran out");
    assert!(
        !lapsing.extend().await.unwrap(),
        "extend after loss reports false"
    );
    assert!(matches!(
        lapsing.release().await,
        Err(Error::NotHeld { .. })
    ));
    assert!(
        usurper.is_held(),
        "the old holder's release did not free the new holder's lock"
    );
    assert!(other.try_acquire().await.unwrap().is_none());
}
