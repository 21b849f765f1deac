//! The protocol at its edges, on both stores: durations up to `Duration::MAX` ("forever"), the
//! fencing counter's lifetime, a failed refresh's fenced delete, and wake-ups scoped by database.

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod cache;
    pub mod server;
    pub use {cache::*, server::*};
}

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::Commands;
use stampede_guard::{Backoff, Cache, CallOptions, Computed, Source};
use support::cache;
use support::RedisServer;

const SECOND: Duration = Duration::from_secs(1);
const NS: &str = "edges";

/// Lets spawned tasks run and paused time move on.
async fn settle(d: Duration) {
    tokio::time::sleep(d).await;
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// Counts the runs of a computation that returns its run number.
#[derive(Clone, Default)]
struct Runs(Arc<AtomicUsize>);

impl Runs {
    async fn fetch(&self, cache: &Cache, key: &str, ttl: Duration) -> (usize, Source) {
        let runs = self.0.clone();
        let fetched = cache
            .fetch(key, ttl, move |_| async move {
                Ok::<_, String>(Computed::new(runs.fetch_add(1, Ordering::SeqCst)))
            })
            .await
            .expect("the computation succeeds");
        (fetched.value, fetched.source)
    }

    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Every `CallOptions` duration at `Duration::MAX`, one at a time, named for the message.
fn options_at_max() -> Vec<(&'static str, CallOptions)> {
    let d = CallOptions::default();
    vec![
        ("lease", d.clone().lease(Duration::MAX)),
        ("stale_for", d.clone().stale_for(Duration::MAX)),
        ("negative_ttl", d.clone().negative_ttl(Some(Duration::MAX))),
        ("max_hold", d.clone().max_hold(Some(Duration::MAX))),
        ("wait_timeout", d.clone().wait_timeout(Duration::MAX)),
        (
            "backoff",
            d.clone()
                .backoff(Backoff::new(Duration::MAX, Duration::MAX)),
        ),
        (
            "all",
            d.lease(Duration::MAX)
                .stale_for(Duration::MAX)
                .negative_ttl(Some(Duration::MAX))
                .max_hold(Some(Duration::MAX))
                .wait_timeout(Duration::MAX),
        ),
    ]
}

// ---- Item 1: every duration a user can pass, on memory (paused time) ----

#[tokio::test(start_paused = true)]
async fn a_ttl_of_duration_max_caches_forever_in_memory() {
    let cache = Cache::in_memory();
    let runs = Runs::default();
    assert_eq!(
        runs.fetch(&cache, "k", Duration::MAX).await,
        (0, Source::Computed)
    );
    settle(Duration::from_secs(200 * 365 * 24 * 3600)).await;
    assert_eq!(
        runs.fetch(&cache, "k", Duration::MAX).await,
        (0, Source::Hit)
    );
    // The value's own TTL, and `set`, take any duration too.
    let own = cache
        .fetch("own", SECOND, |_| async {
            Ok::<_, String>(Computed::new(7u8).ttl(Duration::MAX))
        })
        .await
        .unwrap();
    assert_eq!(own.value, 7);
    let _ = cache.set("set", &8u8, Duration::MAX).await.unwrap();
    settle(Duration::from_secs(200 * 365 * 24 * 3600)).await;
    assert_eq!(cache.get::<u8>("own").await.unwrap(), Some(7));
    assert_eq!(cache.get::<u8>("set").await.unwrap(), Some(8));
}

#[tokio::test(start_paused = true)]
async fn every_call_option_accepts_duration_max_in_memory() {
    for (name, options) in options_at_max() {
        let cache = Cache::in_memory().with_options(options);
        let runs = Runs::default();
        for ttl in [SECOND, Duration::MAX] {
            let key = format!("{name}-{}", ttl.as_secs());
            assert_eq!(
                runs.fetch(&cache, &key, ttl).await.1,
                Source::Computed,
                "{name}"
            );
            assert_eq!(runs.fetch(&cache, &key, ttl).await.1, Source::Hit, "{name}");
        }
        // A failure (remembered for `negative_ttl`), a wait behind a holder, a lock and a set.
        let failed = cache
            .get_or_compute("fails", SECOND, || async { Err::<u8, _>("no") })
            .await;
        assert!(failed.is_err(), "{name}");
        let guard = cache.lock("held").unwrap().acquire().await.unwrap();
        let waiter = {
            let cache = cache.clone();
            tokio::spawn(async move {
                cache
                    .get_or_compute("held", SECOND, || async { Ok::<_, String>(1u8) })
                    .await
            })
        };
        settle(Duration::from_millis(50)).await;
        guard.release().await.unwrap();
        assert_eq!(waiter.await.unwrap().unwrap(), 1, "{name}");
        let _ = cache.set("set", &2u8, SECOND).await.unwrap();
        assert_eq!(cache.get::<u8>("set").await.unwrap(), Some(2), "{name}");
        assert_eq!(runs.count(), 2, "{name}: each key computed once");
    }
}

// ---- Item 1 on a real Redis ----

#[tokio::test]
async fn a_ttl_of_duration_max_caches_forever_on_redis() {
    let server = RedisServer::start();
    let cache = cache(&server, NS, CallOptions::default()).await;
    let runs = Runs::default();
    assert_eq!(
        runs.fetch(&cache, "k", Duration::MAX).await,
        (0, Source::Computed)
    );
    assert_eq!(
        runs.fetch(&cache, "k", Duration::MAX).await,
        (0, Source::Hit)
    );
    let mut conn = server.conn();
    let pttl: i64 = conn.pttl(format!("{NS}:{{k}}")).unwrap();
    assert_eq!(pttl, -1, "a forever value has no expiry");
    let fence: i64 = conn.pttl(format!("{NS}:{{k}}_fence")).unwrap();
    assert_eq!(fence, -1, "nor has the fencing counter that guards it");
    let _ = cache.set("set", &8u8, Duration::MAX).await.unwrap();
    let pttl: i64 = conn.pttl(format!("{NS}:{{set}}")).unwrap();
    assert_eq!(pttl, -1);
    assert_eq!(cache.get::<u8>("set").await.unwrap(), Some(8));
}

#[tokio::test]
async fn every_call_option_accepts_duration_max_on_redis() {
    let server = RedisServer::start();
    for (name, options) in options_at_max() {
        let cache = cache(&server, NS, options).await;
        let runs = Runs::default();
        for ttl in [SECOND * 60, Duration::MAX] {
            let key = format!("{name}-{}", ttl.as_secs());
            assert_eq!(
                runs.fetch(&cache, &key, ttl).await.1,
                Source::Computed,
                "{name}"
            );
            assert_eq!(runs.fetch(&cache, &key, ttl).await.1, Source::Hit, "{name}");
        }
        let failed = cache
            .get_or_compute(&format!("{name}-fails"), SECOND, || async {
                Err::<u8, _>("no")
            })
            .await;
        assert!(failed.is_err(), "{name}");
        let lock = cache.lock(&format!("{name}-held")).unwrap();
        let guard = lock.acquire().await.unwrap();
        let pttl: i64 = server
            .conn()
            .pttl(format!("{NS}:{{{name}-held}}_lock"))
            .unwrap();
        if name == "lease" || name == "all" {
            assert_eq!(pttl, -1, "a lease of Duration::MAX does not expire");
        } else {
            assert!(pttl > 0, "{name}: {pttl}");
        }
        guard.release().await.unwrap();
        let _ = cache
            .set(&format!("{name}-set"), &2u8, SECOND * 60)
            .await
            .unwrap();
        assert_eq!(
            cache.get::<u8>(&format!("{name}-set")).await.unwrap(),
            Some(2),
            "{name}"
        );
        assert_eq!(runs.count(), 2, "{name}: each key computed once");
    }
}

// ---- Item 4: the fencing counter lives as long as what it guards ----

#[tokio::test]
async fn the_fencing_counter_outlives_many_leases_while_its_value_lives_on_redis() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(50);
    let options = CallOptions::default().lease(lease).renew(false);
    let cache = cache(&server, NS, options.clone()).await;
    // Another process: a cache of its own, so not a follower of this one's computation.
    let other = support::cache(&server, NS, options).await;
    // A computation that outlives its lease: its token is old by the time it writes.
    let late = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_compute_with_lease("k", Duration::from_secs(3600), |lease| async move {
                    tokio::time::sleep(Duration::from_millis(900)).await;
                    Ok::<_, String>(format!("late {:?}", lease.fencing_token()))
                })
                .await
        })
    };
    tokio::time::sleep(lease * 2).await;
    // The lock ran out; a newer holder computes and writes a value that lives an hour.
    let fetched = other
        .fetch("k", Duration::from_secs(3600), |lease| async move {
            Ok::<_, String>(Computed::new(format!("new {:?}", lease.fencing_token())))
        })
        .await
        .unwrap();
    assert_eq!(fetched.source, Source::Computed);
    let mut conn = server.conn();
    tokio::time::sleep(lease * 10).await; // many leases: the counter's old retention is long gone
                                          // Both read at one server instant (MULTI), or the later read sees a millisecond less.
    let (value_pttl, fence_pttl): (i64, i64) = redis::pipe()
        .atomic()
        .pttl(format!("{NS}:{{k}}"))
        .pttl(format!("{NS}:{{k}}_fence"))
        .query(&mut conn)
        .unwrap();
    assert!(value_pttl > 0, "{value_pttl}");
    assert!(
        fence_pttl >= value_pttl,
        "the counter ({fence_pttl} ms) lives at least as long as the value ({value_pttl} ms)"
    );
    let stored_before: Vec<u8> = conn.get(format!("{NS}:{{k}}")).unwrap();
    let _ = late.await.unwrap();
    let stored_after: Vec<u8> = conn.get(format!("{NS}:{{k}}")).unwrap();
    assert_eq!(
        stored_before, stored_after,
        "the late writer with an old token is refused"
    );
}

// ---- Item 8: a failed background refresh deletes only what it would have replaced ----

/// A stale value whose refresh fails after another writer's `set` landed: the set survives.
async fn a_failed_refresh_keeps_a_newer_value(cache: Cache, writer: Cache) {
    let ttl = SECOND;
    let _ = cache.set("k", &1u32, ttl).await.unwrap();
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    let gate = Arc::new(tokio::sync::Notify::new());
    let ran = Arc::new(AtomicUsize::new(0));
    let (g, r) = (gate.clone(), ran.clone());
    let stale = cache
        .fetch("k", ttl, move |_| async move {
            r.fetch_add(1, Ordering::SeqCst);
            g.notified().await;
            r.fetch_add(1, Ordering::SeqCst);
            Err::<Computed<u32>, _>("the refresh fails")
        })
        .await
        .unwrap();
    assert_eq!((stale.value, stale.source), (1, Source::Stale));
    while ran.load(Ordering::SeqCst) < 1 {
        settle(Duration::from_millis(10)).await;
    }
    let _ = writer
        .set("k", &2u32, Duration::from_secs(60))
        .await
        .unwrap();
    gate.notify_one();
    while ran.load(Ordering::SeqCst) < 2 {
        settle(Duration::from_millis(10)).await;
    }
    settle(Duration::from_millis(200)).await;
    assert_eq!(
        writer.get::<u32>("k").await.unwrap(),
        Some(2),
        "the newer value survives the failed refresh"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_refresh_keeps_a_newer_value_in_memory() {
    let cache = Cache::in_memory().with_options(
        CallOptions::default()
            .stale_for(Duration::from_secs(600))
            .serve_stale_on_error(false),
    );
    let writer = cache.with_options(CallOptions::default());
    a_failed_refresh_keeps_a_newer_value(cache, writer).await;
}

#[tokio::test]
async fn a_failed_refresh_keeps_a_newer_value_on_redis() {
    let server = RedisServer::start();
    let options = CallOptions::default()
        .stale_for(Duration::from_secs(600))
        .serve_stale_on_error(false);
    let cache = cache(&server, NS, options).await;
    let writer = support::cache(&server, NS, CallOptions::default()).await;
    a_failed_refresh_keeps_a_newer_value(cache, writer).await;
}

// ---- Item 9: wake-ups stay in their database ----

#[tokio::test]
async fn wake_ups_do_not_cross_databases() {
    let server = RedisServer::start();
    let url = |db: u8| server.url().replace("/0", &format!("/{db}"));
    // Waits only for wake-ups: the backoff alone would take a minute.
    let options = CallOptions::default()
        .backoff(Backoff::new(SECOND * 60, SECOND * 60))
        .lease(SECOND * 60);
    let zero = cache(&url(0), NS, options.clone()).await;
    let one = cache(&url(1), NS, options).await;

    // Every channel that is published on, seen by a raw pattern subscriber.
    let client = redis::Client::open(server.url()).unwrap();
    let mut sub = client.get_connection().unwrap();
    let mut pubsub = sub.as_pubsub();
    pubsub.psubscribe("*").unwrap();
    pubsub.set_read_timeout(Some(SECOND * 5)).unwrap();
    // The wake-up channel of a `set`, past its announcement to near tiers (on its own channel).
    let mut wake_up_channel = || loop {
        let channel = pubsub.get_message().unwrap().get_channel_name().to_owned();
        if !channel.contains(":near-tier") {
            return channel;
        }
    };
    let _ = zero.set("k", &1u8, SECOND * 60).await.unwrap();
    let on_zero = wake_up_channel();
    let _ = one.set("k", &1u8, SECOND * 60).await.unwrap();
    let on_one = wake_up_channel();
    assert_ne!(on_zero, on_one, "one channel per database");
    for channel in [&on_zero, &on_one] {
        assert!(channel.contains("{k}"), "{channel} keeps the hash tag");
    }
    drop(pubsub);

    // A waiter on /1 behind a held lock listens on /1's channel only.
    let _ = one.invalidate("k").await.unwrap();
    let guard = one.lock("k").unwrap().acquire().await.unwrap();
    let waiter = {
        let one = one.clone();
        tokio::spawn(async move {
            one.get_or_compute("k", SECOND * 60, || async { Ok::<_, String>(9u8) })
                .await
        })
    };
    let mut conn = server.conn();
    let subscribed = |conn: &mut redis::Connection, channel: &str| -> i64 {
        let counts: Vec<(String, i64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query(conn)
            .unwrap();
        counts[0].1
    };
    let mut waited = 0;
    while subscribed(&mut conn, &on_one) == 0 && waited < 100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += 1;
    }
    assert_eq!(
        subscribed(&mut conn, &on_one),
        1,
        "the waiter listens on /1"
    );
    assert_eq!(
        subscribed(&mut conn, &on_zero),
        0,
        "nobody on /1 listens to /0"
    );
    guard.release().await.unwrap();
    assert_eq!(waiter.await.unwrap().unwrap(), 9);
}

#[tokio::test(start_paused = true)]
async fn a_leader_period_of_duration_max_runs_the_job_once() {
    use stampede_guard::leader::Leader;
    let lock = stampede_guard::Lock::builder("daily")
        .build()
        .await
        .unwrap();
    let leader = Leader::new(lock, Duration::MAX);
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    leader
        .run(
            move |_| {
                let counted = counted.clone();
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    Ok::<(), String>(())
                }
            },
            tokio::time::sleep(Duration::from_secs(3600)),
        )
        .await
        .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Through Redlock the lock lives on the quorum and the value on its own server, whose fencing
/// counter refuses writes older than an invalidation. A holder that renews its lease past that
/// counter's retention must still find it there, or its stale write goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_redlock_an_invalidation_outlives_a_long_renewed_computation() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let values = RedisServer::start();
    let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
    // Each Redlock node gets a twentieth of the lease to answer: 100 ms left it 10 ms, which a
    // loaded machine missed (NoQuorum).
    let options = CallOptions::default().lease(Duration::from_millis(300));
    let split = || async {
        Cache::builder()
            .redis_url(values.url())
            .redlock(urls.clone())
            .namespace(NS)
            .options(options.clone())
            .build()
            .await
            .unwrap()
    };
    let (computing, other) = (split().await, split().await);
    let started = Arc::new(tokio::sync::Notify::new());
    let mut computation = {
        let started = started.clone();
        tokio::spawn(async move {
            computing
                .get_or_compute("k", Duration::from_secs(3600), move || async move {
                    started.notify_one();
                    // Six leases and more (the counter keeps two), renewed all along.
                    tokio::time::sleep(Duration::from_millis(2000)).await;
                    Ok::<_, String>("computed before the invalidation".to_owned())
                })
                .await
        })
    };
    tokio::select! {
        _ = started.notified() => {}
        // A call that ends without computing would leave this test waiting for ever.
        ended = &mut computation => panic!("the call ended before it computed: {ended:?}"),
    }
    let _ = other.invalidate("k").await.unwrap();
    let value = computation.await.unwrap().unwrap();
    assert_eq!(
        value, "computed before the invalidation",
        "its caller gets it"
    );
    assert_eq!(
        other.get::<String>("k").await.unwrap(),
        None,
        "but it is not written after the invalidation"
    );
}
