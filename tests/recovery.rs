//! Auto-recovery on real redis-servers that are stopped, restarted (empty, or with their data)
//! and black-holed: writes that could not reach Redis are queued, replayed when it answers,
//! fenced (every replay is an invalidation: a queued `set` never brings back its value over a
//! newer write or a newer invalidation), and this instance never serves a key
//! from Redis before its queued write; a full queue refuses with a typed error; with recovery
//! off, a failed write is the caller's error as before. Tag invalidations and clears are queued
//! too, one entry per tag (a clear covering the tags), replayed as raises that only raise an
//! epoch, and until then no read of the namespace is answered from Redis.

/// The shared helpers this file uses, one module each (tests/support/).
mod support {
    pub mod near_ready;
    pub mod proxy;
    pub mod runtime;
    pub mod server;
    pub use server::*;
}

use std::time::{Duration, Instant};

use stampede_guard::{
    Cache, CacheBuilder, CallOptions, ConnectionOptions, Error, NearCacheOptions, OnBackendError,
    RecoveryLimit, RecoveryOptions, Written,
};
use support::proxy::{Mode, Proxy};
use support::RedisServer;

const TTL: Duration = Duration::from_secs(60);

/// How long a replay may take to show, at most, before a test fails: generous, since the tests
/// assert what happens, not how fast.
const REPLAYED_WITHIN: Duration = Duration::from_secs(15);

/// A cache on `url` with auto-recovery bounded by `recovery`, failing fast on a dead server.
async fn recovering(url: String, namespace: &str, recovery: RecoveryOptions) -> Cache {
    recovering_with(url, namespace, recovery, |builder| builder).await
}

/// [`recovering`], with more of the builder's settings.
async fn recovering_with(
    url: String,
    namespace: &str,
    recovery: RecoveryOptions,
    more: impl FnOnce(CacheBuilder) -> CacheBuilder,
) -> Cache {
    let builder = Cache::builder()
        .redis_url(url)
        .namespace(namespace)
        .connection(fast_failing())
        .auto_recovery(recovery);
    more(builder)
        .build()
        .await
        .expect("a cache on the test server")
}

/// Short time-outs: a black-holed request fails in half a second rather than five.
fn fast_failing() -> ConnectionOptions {
    ConnectionOptions::default()
        .connect_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_millis(500))
}

/// Waits, polling, until the cache's queue is empty; false if it is not within the bound.
async fn drained(cache: &Cache) -> bool {
    let deadline = Instant::now() + REPLAYED_WITHIN;
    while cache.stats().recovery_queued > 0 {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// A value key as the cache lays it out, to look at with a plain client.
fn value_key(namespace: &str, key: &str) -> String {
    format!("{namespace}:{{{key}}}")
}

fn exists(server: &RedisServer, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query::<bool>(&mut server.conn())
        .expect("EXISTS on the test server")
}

/// Invalidations made while the server is down are queued, and applied once it is back with
/// its old data (restarted from its RDB file); meanwhile and afterwards this instance never
/// serves the invalidated value from Redis, through the single-key path or a batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidation_made_while_redis_is_down_is_applied_when_it_returns() {
    let mut server = RedisServer::start();
    let cache = recovering(server.url(), "inv", RecoveryOptions::default()).await;
    for key in ["single", "batch"] {
        assert_eq!(cache.set(key, &1u32, TTL).await.unwrap(), Written::Applied);
    }
    // The old values go to disk, to come back with the server.
    redis::cmd("SAVE").exec(&mut server.conn()).unwrap();
    server.kill();

    assert_eq!(cache.invalidate("single").await.unwrap(), Written::Queued);
    assert_eq!(
        cache.invalidate_many(["batch"]).await.unwrap(),
        Written::Queued
    );
    assert_eq!(cache.stats().recovery_queued, 2);
    // Long enough for the replay's backoff to reach its cap: the reads below come before it.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    server.restart_loading();
    // Until the replay, a read fails (the server loads, or the replay fails first); it never
    // answers the invalidated 1 that the restarted server holds.
    let deadline = Instant::now() + REPLAYED_WITHIN;
    let (single, batch) = loop {
        let single = cache
            .get_or_compute("single", TTL, || async { Ok::<_, String>(2u32) })
            .await;
        let batch = cache
            .get_or_compute_many(["batch"], TTL, |keys: Vec<String>| async move {
                Ok::<_, String>(keys.into_iter().map(|k| (k, 2u32)).collect::<Vec<_>>())
            })
            .await
            .remove(0);
        assert!(!matches!(single, Ok(1)), "served the invalidated value");
        assert!(
            !matches!(batch, Ok(1)),
            "served the invalidated value in a batch"
        );
        if let (Ok(single), Ok(batch)) = (&single, &batch) {
            break (*single, *batch);
        }
        assert!(
            Instant::now() < deadline,
            "still failing: {single:?} {batch:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((single, batch), (2, 2), "computed afresh");
    assert!(drained(&cache).await, "the queue drained");
    let stats = cache.stats();
    assert_eq!((stats.recovery_replayed, stats.recovery_refused), (2, 0));
}

/// The background replay applies a queued invalidation by itself, without any read of the key:
/// a plain client sees the old value (restored from disk) go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_is_replayed_in_the_background_when_redis_returns() {
    let mut server = RedisServer::start();
    let cache = recovering(server.url(), "bg", RecoveryOptions::default()).await;
    let _ = cache.set("k", &1u32, TTL).await.unwrap();
    redis::cmd("SAVE").exec(&mut server.conn()).unwrap();
    server.kill();
    assert_eq!(cache.invalidate("k").await.unwrap(), Written::Queued);

    server.restart_loading();
    assert!(drained(&cache).await, "replayed within the bound");
    assert!(
        !exists(&server, &value_key("bg", "k")),
        "the invalidation was applied"
    );
}

/// A `set` queued while this instance could not reach Redis (black-holed), replayed after another
/// instance wrote a newer value, does not overwrite it: it deletes it instead (a miss), since the
/// queue cannot tell which is newer.
#[test]
fn a_replayed_set_never_overwrites_a_value_written_meanwhile() {
    let server = RedisServer::start();
    // Outside the test's runtime: the proxy runs its own.
    let proxy = Proxy::start(server.port());
    support::runtime::runtime().block_on(async {
        let (cache, other) = beside(&proxy, &server, "fence").await;
        let _ = cache.set("k", &"first".to_owned(), TTL).await.unwrap();

        proxy.set_mode(Mode::Blackhole);
        let queued = cache.set("k", &"queued".to_owned(), TTL).await.unwrap();
        assert_eq!(queued, Written::Queued);
        // Another instance writes a newer value while this one is cut off.
        let _ = other.set("k", &"newer".to_owned(), TTL).await.unwrap();
        // The held request is dropped with its connection, never delivered late.
        proxy.cut();
        proxy.set_mode(Mode::Pass);

        assert!(drained(&cache).await, "replayed within the bound");
        let now: Option<String> = other.get("k").await.unwrap();
        assert_eq!(
            now, None,
            "the newer value was deleted, not overwritten by the queued one"
        );
        assert_eq!(cache.stats().recovery_replayed, 1);
    });
}

/// A `set` queued while this instance was cut off, replayed after another instance committed a
/// change and invalidated the key (the slot is empty now), does not bring its value back: it
/// may be older than that commit.
#[test]
fn a_replayed_set_never_brings_back_a_value_over_a_newer_invalidation() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    support::runtime::runtime().block_on(async {
        let (cache, other) = beside(&proxy, &server, "commit").await;
        proxy.set_mode(Mode::Blackhole);
        let queued = cache.set("k", &"before".to_owned(), TTL).await.unwrap();
        assert_eq!(queued, Written::Queued);
        // The other instance's commit, then its invalidation, applied.
        assert!(other.invalidate("k").await.unwrap().is_applied());
        proxy.cut();
        proxy.set_mode(Mode::Pass);

        assert!(drained(&cache).await, "replayed within the bound");
        let now: Option<String> = other.get("k").await.unwrap();
        assert_eq!(now, None, "the queued value must not come back");
    });
}

/// Per key the newest write waits: two queued sets of a key, or an invalidation then a set, are
/// one intent each, replayed once (as an invalidation: the keys are empty afterwards).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_newest_write_of_a_key_wins() {
    let mut server = RedisServer::start();
    let cache = recovering(server.url(), "newest", RecoveryOptions::default()).await;
    let _ = cache.set("warm", &0u32, TTL).await.unwrap();
    server.kill();

    assert_eq!(cache.set("a", &1u32, TTL).await.unwrap(), Written::Queued);
    assert_eq!(cache.set("a", &2u32, TTL).await.unwrap(), Written::Queued);
    assert_eq!(cache.invalidate("b").await.unwrap(), Written::Queued);
    assert_eq!(cache.set("b", &5u32, TTL).await.unwrap(), Written::Queued);
    assert_eq!(cache.stats().recovery_queued, 2, "one intent per key");

    server.restart();
    assert!(drained(&cache).await, "replayed within the bound");
    assert_eq!(cache.get::<u32>("a").await.unwrap(), None);
    assert_eq!(cache.get::<u32>("b").await.unwrap(), None);
    assert_eq!(cache.stats().recovery_replayed, 2);
}

/// A full queue refuses with the typed error and its count, keeps every write it holds (they are
/// all replayed), and queues a many-key invalidation whole or not at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_refuses_with_a_typed_error_and_keeps_what_it_holds() {
    let mut server = RedisServer::start();
    let cache = recovering(
        server.url(),
        "full",
        RecoveryOptions::default().max_entries(2),
    )
    .await;
    for key in ["a", "b", "c"] {
        let _ = cache.set(key, &1u32, TTL).await.unwrap();
    }
    redis::cmd("SAVE").exec(&mut server.conn()).unwrap();
    server.kill();

    assert_eq!(cache.invalidate("a").await.unwrap(), Written::Queued);
    assert_eq!(cache.invalidate("b").await.unwrap(), Written::Queued);
    let refused = cache.invalidate("c").await.unwrap_err();
    assert!(
        matches!(
            refused,
            Error::RecoveryQueueFull {
                queued: 2,
                limit: RecoveryLimit::Entries(2)
            }
        ),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("retry it later"), "{refused}");
    // All or nothing: `a` is queued already, `c` does not fit, so neither is taken again.
    let refused = cache.invalidate_many(["a", "c"]).await.unwrap_err();
    assert!(
        matches!(refused, Error::RecoveryQueueFull { .. }),
        "{refused:?}"
    );
    // A key already queued still fits: its newer write replaces the older.
    assert_eq!(cache.invalidate("a").await.unwrap(), Written::Queued);
    let stats = cache.stats();
    assert_eq!((stats.recovery_queued, stats.recovery_refused), (2, 2));

    server.restart_loading();
    assert!(drained(&cache).await, "replayed within the bound");
    assert!(!exists(&server, &value_key("full", "a")));
    assert!(!exists(&server, &value_key("full", "b")));
    assert!(
        exists(&server, &value_key("full", "c")),
        "the refused invalidation was not made, as its error said"
    );
}

/// Two instances of `namespace`: one with auto-recovery through `proxy` (to be cut off), one
/// straight to `server` (the other instance, which reaches it meanwhile).
async fn beside(proxy: &Proxy, server: &RedisServer, namespace: &str) -> (Cache, Cache) {
    let cache = recovering(proxy.url(), namespace, RecoveryOptions::default()).await;
    let other = Cache::builder()
        .redis_url(server.url())
        .namespace(namespace)
        .build()
        .await
        .expect("a cache on the test server");
    (cache, other)
}

/// Reads `key` (through the single-key path and the batch) until both answer, asserting that
/// neither ever serves `old`, the value a queued invalidation kills; the answer, once both agree.
async fn read_past_the_replay(cache: &Cache, key: &str, old: u32) -> u32 {
    let deadline = Instant::now() + REPLAYED_WITHIN;
    loop {
        let single = cache
            .get_or_compute(key, TTL, || async { Ok::<_, String>(2u32) })
            .await;
        let batch = cache
            .get_or_compute_many([key], TTL, |keys: Vec<String>| async move {
                Ok::<_, String>(keys.into_iter().map(|k| (k, 2u32)).collect::<Vec<_>>())
            })
            .await
            .remove(0);
        assert!(
            single.as_ref().ok() != Some(&old),
            "served {key}'s killed value"
        );
        assert!(
            batch.as_ref().ok() != Some(&old),
            "served {key}'s killed value in a batch"
        );
        if let (Ok(single), Ok(batch)) = (&single, &batch) {
            assert_eq!(single, batch);
            return *single;
        }
        assert!(
            Instant::now() < deadline,
            "still failing: {single:?} {batch:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A tag's epoch as the cache lays it out (`ns:{%t:tag}`, for a tag with no character to
/// escape), read with a plain client: 0 if it was never raised.
fn tag_epoch(server: &RedisServer, namespace: &str, tag: &str) -> u64 {
    let held: Option<u64> = redis::cmd("GET")
        .arg(format!("{namespace}:{{%t:{tag}}}"))
        .query(&mut server.conn())
        .expect("GET on the test server");
    held.unwrap_or(0)
}

/// A server with a value tagged `t` and a `plain` one (both 1) in `namespace`, saved to disk to
/// come back with it, then killed; and a cache with auto-recovery on it.
async fn tagged_then_killed(namespace: &str) -> (RedisServer, Cache) {
    let mut server = RedisServer::start();
    let cache = recovering(server.url(), namespace, RecoveryOptions::default()).await;
    let tagged = cache.with_options(CallOptions::default().tags(["t"]));
    assert!(tagged.set("tagged", &1u32, TTL).await.unwrap().is_applied());
    assert!(cache.set("plain", &1u32, TTL).await.unwrap().is_applied());
    redis::cmd("SAVE").exec(&mut server.conn()).unwrap();
    server.kill();
    (server, cache)
}

/// A tag invalidated while the server is down is queued (the call says so), once however often
/// it is asked for, and raised when the server is back with its old data: the tagged value
/// never comes back, not before the replay either; an untagged value is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tag_invalidated_while_redis_is_down_is_raised_when_it_returns() {
    let (mut server, cache) = tagged_then_killed("tag").await;

    assert_eq!(cache.invalidate_tag("t").await.unwrap(), Written::Queued);
    assert_eq!(cache.invalidate_tag("t").await.unwrap(), Written::Queued);
    let both = cache.invalidate_tags(["t", "u", "t"]).await.unwrap();
    assert_eq!(both, Written::Queued);
    assert_eq!(cache.stats().recovery_queued, 2, "one entry per tag");
    // Long enough for the replay's backoff to reach its cap: the reads below come before it.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    server.restart_loading();
    assert_eq!(read_past_the_replay(&cache, "tagged", 1).await, 2);
    assert_eq!(cache.get::<u32>("plain").await.unwrap(), Some(1));
    assert!(drained(&cache).await, "the queue drained");
    assert!(
        tag_epoch(&server, "tag", "u") > 0,
        "every queued tag was raised"
    );
    assert_eq!(cache.stats().recovery_replayed, 2);
}

/// A clear while the server is down is queued, covers the tags invalidated while it waits (one
/// entry), and is raised in the background when the server returns: no value of the namespace
/// survives it, and one written after it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clear_made_while_redis_is_down_is_raised_when_it_returns() {
    let (mut server, cache) = tagged_then_killed("clr").await;

    assert_eq!(cache.invalidate_tag("t").await.unwrap(), Written::Queued);
    assert_eq!(cache.clear().await.unwrap(), Written::Queued);
    assert_eq!(cache.invalidate_tag("u").await.unwrap(), Written::Queued);
    assert_eq!(
        cache.stats().recovery_queued,
        1,
        "the clear covers the tags"
    );

    server.restart_loading();
    assert!(drained(&cache).await, "replayed in the background");
    assert_eq!(cache.get::<u32>("tagged").await.unwrap(), None);
    assert_eq!(cache.get::<u32>("plain").await.unwrap(), None);
    assert!(cache.set("after", &3u32, TTL).await.unwrap().is_applied());
    assert_eq!(cache.get::<u32>("after").await.unwrap(), Some(3));
}

/// Reads of a namespace whose clear waits in the queue are not answered from Redis before it is
/// replayed: the restarted server's old values are never served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_read_is_served_from_redis_before_a_queued_clear() {
    let mut server = RedisServer::start();
    let cache = recovering(server.url(), "clr-read", RecoveryOptions::default()).await;
    assert!(cache.set("k", &1u32, TTL).await.unwrap().is_applied());
    redis::cmd("SAVE").exec(&mut server.conn()).unwrap();
    server.kill();
    assert_eq!(cache.clear().await.unwrap(), Written::Queued);
    tokio::time::sleep(Duration::from_millis(1500)).await;

    server.restart_loading();
    assert_eq!(read_past_the_replay(&cache, "k", 1).await, 2);
    assert!(drained(&cache).await, "the queue drained");
}

/// A tag queued while the server is down stops this instance's near tier serving the values it
/// kills at once, before the replay: a near copy is no answer once its tag's epoch is unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_tag_stops_the_near_tier_serving_its_values() {
    let mut server = RedisServer::start();
    // Long: the copies would be served through the whole test if nothing stopped them.
    let near = NearCacheOptions::new(100).max_staleness(Duration::from_secs(60));
    let cache = recovering_with(server.url(), "near-tag", RecoveryOptions::default(), |b| {
        b.near_cache(near)
    })
    .await;
    support::near_ready::wait_for_near_feeds(std::slice::from_ref(&cache), false).await;
    let tagged = cache.with_options(CallOptions::default().tags(["t"]));
    for key in ["tagged", "other"] {
        let value = tagged.get_or_compute(key, TTL, || async { Ok::<_, String>(1u32) });
        assert_eq!(value.await.unwrap(), 1);
    }
    // A read from Redis puts a copy near; a later one is served from it.
    let deadline = Instant::now() + REPLAYED_WITHIN;
    while cache.stats().near_hits == 0 {
        for key in ["tagged", "other"] {
            let value = tagged.get_or_compute(key, TTL, || async { Ok::<_, String>(2u32) });
            assert_eq!(value.await.unwrap(), 1);
        }
        assert!(
            Instant::now() < deadline,
            "never held near: {:?}",
            cache.stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.kill();

    assert_eq!(cache.invalidate_tag("t").await.unwrap(), Written::Queued);
    for key in ["tagged", "other"] {
        let read = tagged.get_or_compute(key, TTL, || async { Ok::<_, String>(2u32) });
        let read = read.await;
        assert!(!matches!(read, Ok(1)), "{key}: served {read:?}");
    }
}

/// A call that starts after a tag was queued does not share the computation of one that started
/// before it (in this process, computing without the cache while Redis is down): that value may
/// predate the change the tag's invalidation stands for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_after_a_queued_tag_does_not_share_an_older_computation() {
    let mut server = RedisServer::start();
    let options = CallOptions::default().on_backend_error(OnBackendError::ComputeUncached);
    let cache = recovering_with(server.url(), "flight", RecoveryOptions::default(), |b| {
        b.options(options)
    })
    .await;
    server.kill();

    let (started, has_started) = tokio::sync::oneshot::channel();
    let (go_on, may_go_on) = tokio::sync::oneshot::channel::<()>();
    let before = tokio::spawn({
        let cache = cache.clone();
        async move {
            cache
                .get_or_compute("k", TTL, move || async move {
                    let _ = started.send(());
                    let _ = may_go_on.await;
                    Ok::<_, String>("before".to_owned())
                })
                .await
        }
    });
    has_started.await.expect("the first computation started");
    assert_eq!(cache.invalidate_tag("t").await.unwrap(), Written::Queued);
    let after = tokio::spawn({
        let cache = cache.clone();
        async move {
            let computed = || async { Ok::<_, String>("after".to_owned()) };
            cache.get_or_compute("k", TTL, computed).await
        }
    });
    // Let the second call join the first's flight, if it would.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = go_on.send(());
    assert_eq!(before.await.unwrap().unwrap(), "before");
    assert_eq!(after.await.unwrap().unwrap(), "after");
}

/// A replayed raise only raises: an epoch another instance raised meanwhile, past the floor the
/// replay reads (here far in the clock's future), is raised past that, never set back to it.
#[test]
fn a_replayed_tag_never_lowers_an_epoch_raised_meanwhile() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    support::runtime::runtime().block_on(async {
        let (cache, other) = beside(&proxy, &server, "raise").await;
        proxy.set_mode(Mode::Blackhole);
        assert_eq!(cache.invalidate_tag("t").await.unwrap(), Written::Queued);
        // Another instance raises the epoch meanwhile; then it is pushed a day past the clock
        // (an epoch never falls, so a later raise must land above it).
        assert!(other.invalidate_tag("t").await.unwrap().is_applied());
        let raised = tag_epoch(&server, "raise", "t");
        let ahead = raised + 86_400_000_000;
        redis::cmd("SET")
            .arg("raise:{%t:t}")
            .arg(ahead)
            .exec(&mut server.conn())
            .unwrap();
        proxy.cut();
        proxy.set_mode(Mode::Pass);

        assert!(drained(&cache).await, "replayed within the bound");
        assert_eq!(cache.stats().recovery_replayed, 1);
        assert!(
            tag_epoch(&server, "raise", "t") > ahead,
            "the replay raised the epoch past the one set meanwhile"
        );
    });
}

/// Without `auto_recovery`, a write to a stopped server is the caller's error, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_recovery_off_a_failed_write_is_an_error() {
    let mut server = RedisServer::start();
    let cache = Cache::builder()
        .redis_url(server.url())
        .connection(fast_failing())
        .options(CallOptions::default())
        .build()
        .await
        .unwrap();
    let _ = cache.set("k", &1u32, TTL).await.unwrap();
    server.kill();

    let failed = cache.invalidate("k").await.unwrap_err();
    assert!(failed.is_backend() && failed.is_unreachable(), "{failed:?}");
    let failed = cache.set("k", &2u32, TTL).await.unwrap_err();
    assert!(failed.is_unreachable(), "{failed:?}");
    let failed = cache.invalidate_many(["k"]).await.unwrap_err();
    assert!(failed.is_unreachable(), "{failed:?}");
    let failed = cache.invalidate_tag("t").await.unwrap_err();
    assert!(failed.is_unreachable(), "{failed:?}");
    let failed = cache.clear().await.unwrap_err();
    assert!(failed.is_unreachable(), "{failed:?}");
    assert_eq!(cache.stats().recovery_queued, 0);
}

/// A refusal (here, a read-only replica) is not queued, even with recovery on: replaying would
/// meet it again. The caller sees it, as without recovery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_write_is_not_queued() {
    let primary = RedisServer::start();
    let replica = RedisServer::start_with(
        &[
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            primary.port().to_string(),
        ],
        "",
    );
    let cache = recovering(replica.url(), "ro", RecoveryOptions::default()).await;
    let refused = cache.invalidate("k").await.unwrap_err();
    assert!(refused.is_refused(), "{refused:?}");
    assert_eq!(cache.stats().recovery_queued, 0);
}

/// A key whose write waits for Redis is computed once per process while Redis is down, under
/// the in-process flight, and that value is served (as `Held`) to every later call until the
/// replay, so the source sees one query per key per instance per outage, not one per request.
/// A newer write of the key drops what was held; once Redis is back, the key is read and
/// computed through it as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_with_a_queued_write_is_computed_once_while_redis_is_down() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use stampede_guard::{Computed, OnBackendError, Source};

    let mut server = RedisServer::start();
    let uncached = CallOptions::default().on_backend_error(OnBackendError::ComputeUncached);
    let cache = recovering(server.url(), "held", RecoveryOptions::default())
        .await
        .with_options(uncached);
    assert_eq!(cache.set("k", &1u32, TTL).await.unwrap(), Written::Applied);
    server.kill();
    assert_eq!(cache.set("k", &2u32, TTL).await.unwrap(), Written::Queued);

    let computed = Arc::new(AtomicU32::new(0));
    let fetch = |cache: Cache, computed: Arc<AtomicU32>| async move {
        cache
            .fetch("k", TTL, move |_| async move {
                let n = computed.fetch_add(1, Ordering::SeqCst) + 1;
                // Slow enough that the concurrent calls below join this one.
                tokio::time::sleep(Duration::from_millis(200)).await;
                Ok::<_, String>(Computed::new(10 * n))
            })
            .await
            .expect("a value while Redis is down")
    };
    // Ten calls at once: one computes, the others join it.
    let calls: Vec<_> = (0..10)
        .map(|_| tokio::spawn(fetch(cache.clone(), Arc::clone(&computed))))
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap().value, 10);
    }
    // Later calls: the value held for the key, not another query.
    for _ in 0..5 {
        let fetched = fetch(cache.clone(), Arc::clone(&computed)).await;
        assert_eq!((fetched.value, fetched.source), (10, Source::Held));
    }
    assert_eq!(computed.load(Ordering::SeqCst), 1, "one query while down");
    assert!(cache.stats().held_served >= 5);

    // A newer write of the key: what was held is older than it.
    assert_eq!(cache.invalidate("k").await.unwrap(), Written::Queued);
    let fetched = fetch(cache.clone(), Arc::clone(&computed)).await;
    assert_eq!((fetched.value, fetched.source), (20, Source::Uncached));
    let fetched = fetch(cache.clone(), Arc::clone(&computed)).await;
    assert_eq!((fetched.value, fetched.source), (20, Source::Held));

    // Redis back (empty): the write is replayed and the key goes through Redis again.
    server.restart();
    assert!(drained(&cache).await, "the queue drained");
    let fetched = fetch(cache.clone(), Arc::clone(&computed)).await;
    assert_eq!((fetched.value, fetched.source), (30, Source::Computed));
    let fetched = fetch(cache.clone(), Arc::clone(&computed)).await;
    assert_eq!((fetched.value, fetched.source), (30, Source::Hit));
    assert_eq!(computed.load(Ordering::SeqCst), 3);
}

/// A value held for a key while its write waits was computed before a tag or a clear queued
/// after it: the tag's raise may kill it, so it is held no more, and the key is computed again
/// (once), as after a newer write of the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_tag_or_clear_drops_the_values_held_while_redis_is_down() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use stampede_guard::{Computed, Source};

    let mut server = RedisServer::start();
    let options = CallOptions::default()
        .on_backend_error(OnBackendError::ComputeUncached)
        .tags(["t"]);
    let cache = recovering(server.url(), "held-tag", RecoveryOptions::default())
        .await
        .with_options(options);
    server.kill();
    assert_eq!(cache.invalidate("k").await.unwrap(), Written::Queued);

    let computed = Arc::new(AtomicU32::new(0));
    let fetch = || {
        let computed = Arc::clone(&computed);
        let compute = move || async move {
            Ok::<_, String>(Computed::new(computed.fetch_add(1, Ordering::SeqCst)))
        };
        let cache = cache.clone();
        async move {
            let fetched = cache.fetch("k", TTL, move |_| compute()).await;
            let fetched = fetched.expect("a value while Redis is down");
            (fetched.value, fetched.source)
        }
    };
    assert_eq!(fetch().await, (0, Source::Uncached));
    assert_eq!(fetch().await, (0, Source::Held));

    assert_eq!(cache.invalidate_tag("t").await.unwrap(), Written::Queued);
    assert_eq!(fetch().await, (1, Source::Uncached), "held before the tag");
    assert_eq!(fetch().await, (1, Source::Held));
    assert_eq!(cache.clear().await.unwrap(), Written::Queued);
    assert_eq!(
        fetch().await,
        (2, Source::Uncached),
        "held before the clear"
    );
}
