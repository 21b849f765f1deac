//! A refusal is not an outage (issue 26): each kind of error a real redis-server gives is
//! classified (`Error::backend_kind`), named with its fix in the message, and handled by the
//! table in `docs/guarantees.md`: refusals surface at once, even with `ComputeUncached`; an
//! unreachable, busy, loading or full server falls back; a value computed but not stored is
//! counted in `Stats::not_stored`. The tests check kinds and counts, never speed.

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod cache;
    pub mod server;
    pub use {cache::*, server::*};
}

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stampede_guard::{BackendErrorKind, CallOptions, Computed, Error, OnBackendError, Source};
use support::RedisServer;

const TTL: Duration = Duration::from_secs(60);
const PASSWORD: &str = "pw-26-never-printed";

fn quick() -> CallOptions {
    CallOptions::default()
        .lease(Duration::from_millis(500))
        .wait_timeout(Duration::from_secs(5))
}

fn uncached() -> CallOptions {
    quick().on_backend_error(OnBackendError::ComputeUncached)
}

/// Computes `value` and counts how often it ran.
async fn computed(runs: &Arc<AtomicUsize>, value: u32) -> Result<u32, String> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(value)
}

/// Everything a user can see of an error: its message, its debug form and its sources.
fn everything_about(e: &Error) -> String {
    let mut all = format!("{e} {e:?}");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        all.push_str(&format!(" | {s} {s:?}"));
        source = s.source();
    }
    all
}

/// The public error names no type of the Redis client, yet its source is the client's own error,
/// for a caller that wants it, and the server's error code is read without it.
fn the_clients_error_is_the_source(e: &Error, code: &str) {
    let client = std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<redis::RedisError>())
        .unwrap_or_else(|| panic!("the source is not the client's error: {e:?}"));
    assert_eq!(client.code(), Some(code), "{e:?}");
    let Error::Backend { source, .. } = e else {
        panic!("not a backend error: {e:?}");
    };
    assert_eq!(source.code(), Some(code), "{e:?}");
    assert_eq!(source.to_string(), client.to_string());
}

/// Waits until `server` answers `INFO <section>` with `line` as one of its lines.
fn wait_for_info(server: &RedisServer, section: &str, line: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut conn = server.conn();
    loop {
        let info: String = redis::cmd("INFO").arg(section).query(&mut conn).unwrap();
        if info.lines().any(|l| l == line) {
            return;
        }
        assert!(Instant::now() < deadline, "never saw {line:?} in: {info}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A server whose clients log in as the ACL user `reporter`, allowed `patterns` (keys `~…`,
/// channels `&…`) and every command but the dangerous ones.
fn server_with_user(patterns: &[&str]) -> RedisServer {
    let password = format!(">{PASSWORD}");
    let mut args = vec!["--user", "reporter", "on", password.as_str()];
    args.extend_from_slice(patterns);
    args.extend(["+@all", "-@dangerous"]);
    let args: Vec<String> = args.into_iter().map(String::from).collect();
    RedisServer::start_with(&args, &format!("reporter:{PASSWORD}@"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_outside_its_namespace_is_refused_by_permission_and_told_the_fix() {
    // The kind of user managed services hand out.
    let server = server_with_user(&["~reports:*", "&reports:*"]);
    let runs = Arc::new(AtomicUsize::new(0));
    let inside = support::cache(&server, "reports", uncached()).await;
    let r = runs.clone();
    let value = inside
        .get_or_compute("2019-05", TTL, move || async move { computed(&r, 1).await })
        .await
        .unwrap();
    assert_eq!(value, 1, "the user's own namespace works");

    for options in [quick(), uncached()] {
        let outside = support::cache(&server, "other", options).await;
        let r = runs.clone();
        let e = outside
            .get_or_compute("2019-05", TTL, move || async move { computed(&r, 2).await })
            .await
            .unwrap_err();
        assert_eq!(
            e.backend_kind(),
            Some(BackendErrorKind::RefusedPermission),
            "{e:?}"
        );
        assert!(
            e.is_refused() && e.is_backend() && !e.is_unreachable(),
            "{e:?}"
        );
        let message = e.to_string();
        for part in ["NOPERM", "other:{2019-05}", "`~other:*`", "`&other:*`"] {
            assert!(message.contains(part), "{part:?} missing from: {message}");
        }
        assert!(!everything_about(&e).contains(PASSWORD), "{e:?}");
        the_clients_error_is_the_source(&e, "NOPERM");
        // `get` is not answered as a miss either: a refusal is not an outage.
        let e = outside.get::<u32>("2019-05").await.unwrap_err();
        assert!(e.is_refused(), "{e:?}");
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "a refusal never computes without the cache, whatever the fallback"
    );
}

/// A user with the namespace's keys but not its channels: Redis 7 refuses the `PUBLISH` inside
/// the invalidation script with `ERR The user executing the script can't publish ...`, not
/// `NOPERM`. It is a refusal all the same, never taken for an outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_the_namespaces_channels_is_refused_inside_the_script() {
    let server = server_with_user(&["~reports:*"]);
    let cache = support::cache(&server, "reports", uncached()).await;
    let e = cache.invalidate("2019-05").await.unwrap_err();
    assert_eq!(
        e.backend_kind(),
        Some(BackendErrorKind::RefusedPermission),
        "{e:?}"
    );
    assert!(e.is_refused() && !e.is_unreachable(), "{e:?}");
    assert!(!everything_about(&e).contains(PASSWORD), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_refuses_by_role_and_the_message_says_to_point_at_the_primary() {
    let primary = RedisServer::start();
    let replica = RedisServer::start_with(
        &["--replicaof", "127.0.0.1", &primary.port().to_string()].map(String::from),
        "",
    );
    wait_for_info(&replica, "replication", "master_link_status:up");
    let runs = Arc::new(AtomicUsize::new(0));
    for options in [quick(), uncached()] {
        let cache = support::cache(&replica, "reports", options).await;
        let r = runs.clone();
        let e = cache
            .get_or_compute("2019-05", TTL, move || async move { computed(&r, 1).await })
            .await
            .unwrap_err();
        assert_eq!(
            e.backend_kind(),
            Some(BackendErrorKind::RefusedRole),
            "{e:?}"
        );
        assert!(e.is_refused() && !e.is_unreachable(), "{e:?}");
        let message = e.to_string();
        assert!(
            message.contains("READONLY") && message.contains("primary"),
            "{message}"
        );
        let e = cache.set("2019-05", &1u32, TTL).await.unwrap_err();
        assert!(e.is_refused(), "a refused set is not skipped: {e:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_under_noeviction_returns_the_value_and_counts_it_as_not_stored() {
    let server = RedisServer::start_with(
        &[
            "--maxmemory",
            "4mb",
            "--maxmemory-policy",
            "noeviction",
            "--enable-debug-command",
            "local",
        ]
        .map(String::from),
        "",
    );
    // 1. The lock is taken, then the memory fills while the value is computed: the write is
    //    refused, the value returned (with the default fallback), and counted.
    let cache = support::cache(&server, "reports", quick()).await;
    let filled = server.url();
    let value = cache
        .get_or_compute("2019-05", TTL, move || async move {
            let server_url = filled;
            tokio::task::spawn_blocking(move || {
                let client = redis::Client::open(server_url).unwrap();
                let _: () = redis::cmd("DEBUG")
                    .arg("POPULATE")
                    .arg(100_000)
                    .arg("filler")
                    .arg(100)
                    .query(&mut client.get_connection().unwrap())
                    .unwrap();
            })
            .await
            .unwrap();
            Ok::<_, String>(7u32)
        })
        .await
        .unwrap();
    assert_eq!(value, 7);
    let stats = cache.stats();
    assert_eq!(stats.not_stored.out_of_memory, 1, "{stats:?}");
    assert_eq!(stats.not_stored.total(), 1, "{stats:?}");

    // 2. Full from the start, default fallback: the lock cannot be taken; the error says so.
    let e = cache
        .get_or_compute("2019-06", TTL, || async { Ok::<_, String>(8u32) })
        .await
        .unwrap_err();
    assert_eq!(
        e.backend_kind(),
        Some(BackendErrorKind::OutOfMemory),
        "{e:?}"
    );
    assert!(e.is_out_of_memory() && !e.is_refused(), "{e:?}");
    assert!(e.to_string().contains("maxmemory"), "{e}");

    // 3. Full, with `ComputeUncached`: computed without the cache, returned, and counted.
    let fallback = support::cache(&server, "reports", uncached()).await;
    for month in ["2019-07", "2019-08", "2019-09"] {
        let fetched = fallback
            .fetch(month, TTL, |_| async {
                Ok::<_, String>(Computed::new(9u32))
            })
            .await
            .unwrap();
        assert_eq!((fetched.value, fetched.source), (9, Source::Uncached));
    }
    let stats = fallback.stats();
    assert_eq!(stats.not_stored.out_of_memory, 3, "{stats:?}");
    assert_eq!(stats.uncached, 3, "{stats:?}");

    // 4. The same in one batch: each key computed without the cache is counted too.
    let batch = support::cache(&server, "reports", uncached()).await;
    let months = ["2019-10", "2019-11", "2019-12"];
    let values = batch
        .get_or_compute_many(months, TTL, |keys: Vec<String>| async move {
            Ok::<_, String>(keys.into_iter().map(|k| (k, 10u32)).collect::<Vec<_>>())
        })
        .await;
    assert!(values.iter().all(|v| matches!(v, Ok(10))), "{values:?}");
    let stats = batch.stats();
    assert_eq!(stats.not_stored.out_of_memory, 3, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_script_is_busy_not_refused_and_the_cache_works_after_script_kill() {
    let server = RedisServer::start_with(&["--busy-reply-threshold", "50"].map(String::from), "");
    let cache = support::cache(&server, "reports", quick()).await;
    let fallback = support::cache(&server, "reports", uncached()).await;
    // Connected (and the clocks calibrated) before the server turns busy.
    assert_eq!(cache.get::<u32>("warm-up").await.unwrap(), None);
    assert_eq!(fallback.get::<u32>("warm-up").await.unwrap(), None);

    let url = server.url();
    let looping = std::thread::spawn(move || {
        let client = redis::Client::open(url).unwrap();
        let mut conn = client.get_connection().unwrap();
        // Runs until killed; its own answer is then an error.
        redis::cmd("EVAL")
            .arg("while true do end")
            .arg(0)
            .query::<()>(&mut conn)
            .unwrap_err()
    });
    // Busy once the script has run past the threshold: wait for the server to say so. A call
    // before the script began stores nothing (its computation fails), so the value computed
    // after SCRIPT KILL below is the key's first.
    let deadline = Instant::now() + Duration::from_secs(10);
    let e = loop {
        match cache
            .get_or_compute("2019-05", TTL, || async {
                Err::<u32, _>("not busy yet".to_owned())
            })
            .await
        {
            Err(e) if e.is_busy() => break e,
            other => assert!(Instant::now() < deadline, "never busy: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(e.backend_kind(), Some(BackendErrorKind::Busy));
    assert!(!e.is_refused() && !e.is_unreachable(), "{e:?}");
    assert!(e.to_string().contains("SCRIPT KILL"), "{e}");
    // Busy passes by itself: the fallback computes without the cache.
    let fetched = fallback
        .fetch("2019-05", TTL, |_| async {
            Ok::<_, String>(Computed::new(2u32))
        })
        .await
        .unwrap();
    assert_eq!((fetched.value, fetched.source), (2, Source::Uncached));
    assert_eq!(fallback.stats().not_stored.backend_failed, 1);

    let _: () = redis::cmd("SCRIPT")
        .arg("KILL")
        .query(&mut server.conn())
        .unwrap();
    let killed = looping.join().unwrap();
    assert!(killed.to_string().contains("killed"), "{killed}");
    // Busy answers count against the circuit breaker, which may have opened on them: the cache
    // works again once its probe finds the server answering, a cool-down (1 s) later at most.
    let deadline = Instant::now() + Duration::from_secs(10);
    let value = loop {
        match cache
            .get_or_compute("2019-05", TTL, || async { Ok::<_, String>(3u32) })
            .await
        {
            Ok(value) => break value,
            Err(e) if e.is_unreachable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("the cache did not work again after SCRIPT KILL: {e:?}"),
        }
    };
    assert_eq!(value, 3);
    assert_eq!(
        cache.get::<u32>("2019-05").await.unwrap(),
        Some(3),
        "cached again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_still_loading_its_dataset_is_busy_then_works() {
    // A slow load, made slow on purpose rather than large: each key waits 50 µs
    // (`key-load-delay`), and the server answers clients every KiB of the file, so there is a
    // window of seconds in which it answers LOADING.
    let mut server = RedisServer::start_with(
        &[
            "--key-load-delay",
            "50",
            "--loading-process-events-interval-bytes",
            "1024",
            "--enable-debug-command",
            "local",
        ]
        .map(String::from),
        "",
    );
    let mut conn = server.conn();
    let _: () = redis::cmd("DEBUG")
        .arg("POPULATE")
        .arg(40_000)
        .arg("filler")
        .arg(10)
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("SAVE").query(&mut conn).unwrap();
    drop(conn);
    server.restart_loading();
    let runs = Arc::new(AtomicUsize::new(0));
    let cache = support::cache(&server, "reports", quick()).await;
    let r = runs.clone();
    let e = cache
        .get_or_compute("2019-05", TTL, move || async move { computed(&r, 1).await })
        .await
        .unwrap_err();
    assert_eq!(e.backend_kind(), Some(BackendErrorKind::Busy), "{e:?}");
    assert!(e.is_busy() && !e.is_refused(), "{e:?}");
    assert!(e.to_string().contains("LOADING"), "{e}");
    let fallback = support::cache(&server, "reports", uncached()).await;
    let r = runs.clone();
    let fetched = fallback
        .fetch("2019-05", TTL, move |_| async move {
            computed(&r, 2).await.map(Computed::new)
        })
        .await;
    // Loading lasts seconds, but a call is not timed: if the load ended first, say so.
    match fetched {
        Ok(fetched) => assert_eq!(fetched.source, Source::Uncached, "loaded already?"),
        Err(e) => panic!("the fallback applies to LOADING: {e:?}"),
    }

    wait_for_info(&server, "persistence", "loading:0");
    let value = cache
        .get_or_compute("2019-05", TTL, || async { Ok::<_, String>(3u32) })
        .await
        .unwrap();
    assert_eq!(value, 3, "works once loaded");
}
