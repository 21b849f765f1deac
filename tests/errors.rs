//! The crate's one error type as handlers meet it: every call `?`-able into `stampede_guard::Error`
//! (and into `Box<dyn Error>`), the computation's error kept typed and exposed as the source, and
//! errors that stay small whatever the user passed in.

use std::error::Error as _;
use std::time::Duration;

use stampede_guard::{BackendError, BackendErrorKind, Cache, ComputeError, Error};

const TTL: Duration = Duration::from_secs(60);

/// A handler-like function: every call of the crate, each with `?`, into the crate's one error
/// type. That this compiles is the test (it did not while `get` and `get_or_compute` returned
/// different error types).
async fn handler(cache: &Cache, month: &str) -> Result<u64, Error> {
    if let Some(total) = cache.get::<u64>(month).await? {
        return Ok(total);
    }
    let lock = cache.lock("nightly-sync")?;
    let guard = lock.acquire().await?;
    let total = cache
        .get_or_compute(month, TTL, || async { Ok::<_, std::io::Error>(42u64) })
        .await?;
    let _ = cache.set("last-month", &total, TTL).await?;
    let _ = cache.invalidate("last-month").await?;
    guard.release().await?;
    Ok(total)
}

/// The same calls in a handler whose error type is a boxed error, as with anyhow.
async fn boxed_handler(
    cache: &Cache,
    month: &str,
) -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
    let lock = cache.lock("nightly-sync")?;
    let guard = lock.acquire().await?;
    let total = cache
        .get_or_compute(month, TTL, || async { Ok::<_, String>(7u64) })
        .await?;
    let _ = cache.set("last-month", &total, TTL).await?;
    let _ = cache.invalidate("last-month").await?;
    guard.release().await?;
    Ok(cache.get::<u64>(month).await?.unwrap_or(0))
}

#[tokio::test]
async fn every_call_is_question_markable_into_one_error_type() {
    let cache = Cache::in_memory();
    assert_eq!(handler(&cache, "2019-05").await.unwrap(), 42);
    assert_eq!(handler(&cache, "2019-05").await.unwrap(), 42, "a hit");
    assert_eq!(boxed_handler(&cache, "2019-06").await.unwrap(), 7);
}

#[tokio::test]
async fn the_computations_error_stays_typed_and_is_the_source() {
    let cache = Cache::in_memory();
    let failed = cache
        .get_or_compute("2019-05", TTL, || async {
            Err::<u8, _>(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "the database is down",
            ))
        })
        .await
        .unwrap_err();
    // Typed: the caller gets its own error back.
    let io = failed.compute_error::<std::io::Error>().expect("typed");
    assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
    assert!(failed.compute_error::<String>().is_none());
    // The source chain carries it; the outer message does not repeat it.
    let source = failed
        .source()
        .expect("the computation's error is the source");
    assert_eq!(source.to_string(), "the database is down");
    assert!(source.downcast_ref::<ComputeError>().is_some());
    assert!(
        !failed.to_string().contains("the database is down"),
        "{failed}"
    );
    assert!(failed.is_compute());
    // Debug shows it (what `{:?}` and `unwrap` print).
    assert!(format!("{failed:?}").contains("the database is down"));

    // Errors that are not `std::error::Error` (a `String`, an `anyhow::Error`) work the same.
    let failed = cache
        .get_or_compute("2019-06", TTL, || async {
            Err::<u8, _>("no rows".to_owned())
        })
        .await
        .unwrap_err();
    assert_eq!(failed.compute_error::<String>().unwrap(), "no rows");
    assert_eq!(failed.source().unwrap().to_string(), "no rows");
}

#[tokio::test]
async fn a_computations_error_is_shared_by_every_waiting_caller() {
    let cache = Cache::in_memory();
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let leader = tokio::spawn({
        let (cache, release) = (cache.clone(), release.clone());
        async move {
            cache
                .get_or_compute("2019-05", TTL, move || async move {
                    release.notified().await;
                    Err::<u8, _>("the database is down".to_owned())
                })
                .await
        }
    });
    while cache.in_flight() == 0 {
        tokio::task::yield_now().await;
    }
    let follower = tokio::spawn({
        let cache = cache.clone();
        async move {
            cache
                .get_or_compute("2019-05", TTL, || async { Ok::<u8, String>(1) })
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    release.notify_one();
    let (a, b) = (leader.await.unwrap(), follower.await.unwrap());
    let (a, b) = (a.unwrap_err(), b.unwrap_err());
    let (Error::Compute(a), Error::Compute(b)) = (&a, &b) else {
        panic!("{a:?} {b:?}");
    };
    assert!(ComputeError::ptr_eq(a, b), "one error, shared");
    assert_eq!(b.downcast_ref::<String>().unwrap(), "the database is down");
}

#[tokio::test]
async fn a_ten_mebibyte_key_gives_a_small_error() {
    let cache = Cache::in_memory();
    for huge in ["k".repeat(10 << 20), "é".repeat(5 << 20)] {
        let error = cache.get::<u8>(&huge).await.unwrap_err();
        let Error::InvalidKey {
            ref key_prefix,
            key_len,
            ..
        } = error
        else {
            panic!("{error:?}");
        };
        assert_eq!(key_len, huge.len());
        assert!(key_prefix.len() <= 64 && huge.starts_with(key_prefix.as_str()));
        assert!(!key_prefix.is_empty());
        assert!(error.to_string().len() < 512, "{error}");
        assert!(format!("{error:?}").len() < 512, "{error:?}");
    }
}

#[test]
fn a_lost_quorum_is_a_backend_failure() {
    let error = Error::NoQuorum {
        op: "acquire",
        reached: 1,
        needed: 2,
    };
    assert!(error.is_backend());
}

#[test]
fn the_error_is_send_sync_static_and_clone() {
    fn check<T: std::error::Error + Send + Sync + Clone + 'static>() {}
    check::<Error>();
    check::<ComputeError>();
    check::<BackendError>();
}

/// A backend failure names no type of the Redis client, yet a caller that wants the client's
/// error downcasts the source to it, as before.
#[test]
fn a_backend_failures_source_is_the_clients_own_error() {
    let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    let error = Error::Backend {
        op: "get",
        kind: BackendErrorKind::Unreachable,
        key: None,
        source: BackendError::new(redis::RedisError::from(refused)),
    };
    let client = error
        .source()
        .and_then(|s| s.downcast_ref::<redis::RedisError>())
        .expect("the client's error");
    assert!(client.is_connection_refusal());
    assert!(error.is_unreachable() && error.is_backend());
    let shared = error.clone();
    assert_eq!(shared.to_string(), error.to_string());
}
