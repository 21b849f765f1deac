//! The near tier against real redis-server processes: hits without a round trip, coherence
//! across instances, no announcement on a fill, and the staleness bound under faults (a
//! black-holed or cut connection, a restarted server).

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod cache;
    pub mod monitor;
    pub mod proxy;
    pub mod runtime;
    pub mod server;
    pub use {cache::*, monitor::*, runtime::*, server::*};
}

use std::time::Duration;

use redis::Commands;
use stampede_guard::{BreakerOptions, Cache, CallOptions, ConnectionOptions, NearCacheOptions};
use support::proxy::{Mode, Proxy};
use support::{cache, runtime};
use support::{Monitor, RedisServer};

const TTL: Duration = Duration::from_secs(300);
const MAX_STALENESS: Duration = Duration::from_millis(300);
/// How long a test waits for something that should happen at once (generous: a loaded machine).
const PATIENCE: Duration = Duration::from_secs(20);

async fn near_cache(url: String) -> Cache {
    Cache::builder()
        .redis_url(url)
        .namespace("near")
        .near_cache(NearCacheOptions::new(1_000).max_staleness(MAX_STALENESS))
        .connection(
            ConnectionOptions::default()
                .response_timeout(Duration::from_secs(1))
                .reconnect_retries(0),
        )
        .options(CallOptions::default().wait_timeout(Duration::from_secs(2)))
        .build()
        .await
        .expect("a cache with a near tier")
}

async fn read(cache: &Cache, key: &str) -> Result<String, stampede_guard::Error> {
    cache
        .get_or_compute(key, TTL, || async {
            Ok::<_, std::io::Error>("computed".to_owned())
        })
        .await
}

/// Reads until a read is answered by the near tier (the feed is up and proven current).
async fn until_near_hit(cache: &Cache, key: &str) -> String {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let before = cache.stats().near_hits;
        let value = read(cache, key).await;
        if cache.stats().near_hits > before {
            return value.expect("a near hit is a value");
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no near hit within {PATIENCE:?}: {:?}",
            cache.stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads until `new` is served, failing if `old` is ever served: called once the change is
/// more than `max_staleness` old, when no read may return what it replaced.
async fn never_old_until_new(cache: &Cache, key: &str, old: &str, new: &str) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match read(cache, key).await {
            Ok(v) if v == new => return,
            Ok(v) => assert_ne!(
                v, old,
                "served a value replaced more than max_staleness ago"
            ),
            Err(e) => assert!(e.is_backend(), "{e}"),
        }
        assert!(tokio::time::Instant::now() < deadline, "{new} never served");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_near_hit_costs_no_command_and_changes_reach_every_instance() {
    let server = RedisServer::start();
    let a = near_cache(server.url()).await;
    let b = near_cache(server.url()).await;
    let _ = a.set("k", &"v1".to_owned(), TTL).await.unwrap();
    assert_eq!(until_near_hit(&b, "k").await, "v1");

    // Hits on the near tier read nothing from Redis (the monitor sees heartbeats, and the
    // clock's calibration, but no read).
    let monitor = Monitor::start(&server);
    let before = b.stats();
    for _ in 0..50 {
        assert_eq!(read(&b, "k").await.unwrap(), "v1");
    }
    let commands = monitor.commands_until_now(&server);
    assert!(
        commands.iter().all(|c| c != "GET" && c != "EVALSHA"),
        "near hits sent {commands:?}"
    );
    // Each is a near hit and a hit of the call.
    let after = b.stats();
    assert_eq!(
        (after.near_hits, after.hits),
        (before.near_hits + 50, before.hits + 50)
    );

    // `set` on A reaches B's near tier (whose stream stays live all along: only the
    // announcement can make it drop its copy).
    let _ = a.set("k", &"v2".to_owned(), TTL).await.unwrap();
    tokio::time::sleep(MAX_STALENESS).await;
    never_old_until_new(&b, "k", "v1", "v2").await;
    assert_eq!(until_near_hit(&b, "k").await, "v2");
    // So does `invalidate`: B computes afresh.
    let _ = a.invalidate("k").await.unwrap();
    tokio::time::sleep(MAX_STALENESS).await;
    never_old_until_new(&b, "k", "v2", "computed").await;
    assert_eq!(b.stats().near_switched_off, 0, "{:?}", b.stats());
    // And the instance that changed the entry never serves its own old copy.
    assert_eq!(until_near_hit(&a, "k").await, "computed");
    let _ = a.set("k", &"v3".to_owned(), TTL).await.unwrap();
    assert_eq!(read(&a, "k").await.unwrap(), "v3");
    let stats = b.stats();
    assert!(stats.near_invalidations >= 2, "{stats:?}");

    // With XFetch on, near hits go through the same judgement as Redis hits (a value 300 s
    // from expiry computed in no time is never refreshed early: served as it is).
    let xfetch = b.with_options(CallOptions::default().early_refresh(1.0));
    let hits = b.stats().near_hits;
    assert_eq!(read(&xfetch, "k").await.unwrap(), "v3");
    assert_eq!(until_near_hit(&xfetch, "k").await, "v3");
    assert!(b.stats().near_hits > hits);
    assert_eq!(
        b.stats().computes,
        1,
        "only the read after the invalidation computed"
    );
}

/// `get` reads the near tier as every other read does: once a copy is there, a `get` sends
/// nothing to Redis, and it still sees another instance's changes within `max_staleness`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_is_answered_by_the_near_tier_and_sees_invalidations() {
    let server = RedisServer::start();
    let a = near_cache(server.url()).await;
    let b = near_cache(server.url()).await;
    let _ = a.set("g", &"v1".to_owned(), TTL).await.unwrap();
    assert_eq!(until_near_hit(&b, "g").await, "v1");

    let monitor = Monitor::start(&server);
    let before = b.stats();
    for _ in 0..50 {
        assert_eq!(b.get::<String>("g").await.unwrap().as_deref(), Some("v1"));
    }
    let commands = monitor.commands_until_now(&server);
    assert!(
        commands
            .iter()
            .all(|c| c != "GET" && c != "MGET" && c != "EVALSHA"),
        "near reads by get sent {commands:?}"
    );
    // Near hits; not hits of the `get_or_compute` family, which `get` never counted.
    let after = b.stats();
    assert_eq!(
        (after.near_hits, after.hits),
        (before.near_hits + 50, before.hits)
    );

    // An invalidation by A: once it is `max_staleness` old, B's `get` never answers the old
    // value again.
    let _ = a.invalidate("g").await.unwrap();
    tokio::time::sleep(MAX_STALENESS).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match b.get::<String>("g").await {
            Ok(None) => break,
            Ok(Some(v)) => assert_ne!(v, "v1", "get served an invalidated value"),
            Err(_) => {}
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "get never saw the invalidation"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // And a new value by A reaches it too, then is served from the tier again.
    let _ = a.set("g", &"v2".to_owned(), TTL).await.unwrap();
    tokio::time::sleep(MAX_STALENESS).await;
    assert_eq!(b.get::<String>("g").await.unwrap().as_deref(), Some("v2"));
    assert_eq!(until_near_hit(&b, "g").await, "v2");
    let hits = b.stats().near_hits;
    assert_eq!(b.get::<String>("g").await.unwrap().as_deref(), Some("v2"));
    assert_eq!(b.stats().near_hits, hits + 1);
}

/// Subscribes to the namespace's near channel and returns the announcements' payloads.
fn announcements(server: &RedisServer) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let mut conn = server.conn();
    std::thread::spawn(move || {
        let mut pubsub = conn.as_pubsub();
        pubsub.subscribe("near:near-tier").unwrap();
        ready_tx.send(()).unwrap();
        while let Ok(msg) = pubsub.get_message() {
            let Ok(payload) = msg.get_payload::<String>() else {
                continue;
            };
            if tx.send(payload).is_err() {
                return;
            }
        }
    });
    ready.recv().unwrap();
    rx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fill_of_an_empty_key_is_not_announced_a_replacing_write_is() {
    let server = RedisServer::start();
    let a = near_cache(server.url()).await;
    announced_writes(&server, &a).await;
    // An instance without a near tier announces the same writes.
    let server = RedisServer::start();
    let plain = cache(&server, "near", CallOptions::default()).await;
    announced_writes(&server, &plain).await;
}

/// A cold fill, a replacing write, an invalidation and a `set` through `a`: the last three are
/// announced, in order, with their fences.
async fn announced_writes(server: &RedisServer, a: &Cache) {
    let heard = announcements(server);
    // A cold fill: computed into an empty key.
    assert_eq!(read(a, "cold").await.unwrap(), "computed");
    // Bytes that do not decode are replaced by a computed value: that replaces a value.
    let _: () = server
        .conn()
        .set("near:{garbled}", b"not an envelope")
        .unwrap();
    assert_eq!(read(a, "garbled").await.unwrap(), "computed");
    let _ = a.invalidate("gone").await.unwrap();
    let _ = a.set("set", &1u8, TTL).await.unwrap();
    // Announcements arrive in the order of the writes: the cold fill, first, made none.
    let next = || heard.recv_timeout(PATIENCE).expect("an announcement");
    let keys: Vec<String> = (0..3)
        .map(|_| {
            let payload = next();
            let (fence, key) = payload.split_once(' ').expect("fence and key");
            assert!(fence.parse::<u64>().is_ok_and(|f| f > 0), "{payload}");
            key.to_owned()
        })
        .collect();
    assert_eq!(keys, ["near:{garbled}", "near:{gone}", "near:{set}"]);
}

/// `set` and `invalidate` on an instance without a near tier reach the near tier of another:
/// the bound holds whichever instances write, not only those that read through a near tier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_by_an_instance_without_a_near_tier_reach_the_near_tiers() {
    let server = RedisServer::start();
    let plain = cache(&server, "near", CallOptions::default()).await;
    let b = near_cache(server.url()).await;
    changes_reach(&plain, &b).await;
}

/// The same over a Redlock: values, and so announcements, stay on the one backend server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_near_tier_over_redlock_locks_hears_every_change() {
    let server = RedisServer::start();
    let nodes = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
    let writer = Cache::builder()
        .redis_url(server.url())
        .namespace("near")
        .redlock(urls.clone())
        .build()
        .await
        .unwrap();
    let b = Cache::builder()
        .redis_url(server.url())
        .namespace("near")
        .redlock(urls)
        .near_cache(NearCacheOptions::new(1_000).max_staleness(MAX_STALENESS))
        .build()
        .await
        .expect("a near tier with Redlock locks");
    changes_reach(&writer, &b).await;
    // B's own computations go through the quorum and land in its near tier.
    assert_eq!(until_near_hit(&b, "fresh").await, "computed");
}

/// A `set` and an `invalidate` on `a` stop `b` serving the old value once they are
/// `max_staleness` old (b's stream stays live all along: only announcements can do it).
async fn changes_reach(a: &Cache, b: &Cache) {
    let _ = a.set("k", &"v1".to_owned(), TTL).await.unwrap();
    assert_eq!(until_near_hit(b, "k").await, "v1");
    let _ = a.set("k", &"v2".to_owned(), TTL).await.unwrap();
    tokio::time::sleep(MAX_STALENESS).await;
    never_old_until_new(b, "k", "v1", "v2").await;
    assert_eq!(until_near_hit(b, "k").await, "v2");
    let _ = a.invalidate("k").await.unwrap();
    tokio::time::sleep(MAX_STALENESS).await;
    never_old_until_new(b, "k", "v2", "computed").await;
    let stats = b.stats();
    assert_eq!(stats.near_switched_off, 0, "{stats:?}");
    assert!(stats.near_invalidations >= 2, "{stats:?}");
}

/// The proxy runs its own runtime, so it is started (and dropped) outside the test's.
fn with_proxy(test: impl AsyncFnOnce(&mut RedisServer, &Proxy)) {
    let mut server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    runtime().block_on(test(&mut server, &proxy));
}

#[test]
fn a_black_holed_stream_stops_near_hits_within_max_staleness() {
    with_proxy(black_holed)
}

async fn black_holed(server: &mut RedisServer, proxy: &Proxy) {
    let a = near_cache(server.url()).await;
    let b = near_cache(proxy.url()).await;
    let _ = a.set("k", &"v1".to_owned(), TTL).await.unwrap();
    assert_eq!(until_near_hit(&b, "k").await, "v1");

    // B hears nothing from now on, and no error tells it so.
    proxy.set_mode(Mode::Blackhole);
    let _ = a.set("k", &"v2".to_owned(), TTL).await.unwrap();
    tokio::time::sleep(MAX_STALENESS).await;
    // Once max_staleness has passed since the change, B must not serve v1: it has no proof of a
    // current stream, so it goes to Redis (black-holed: an error) instead of its copy.
    for _ in 0..3 {
        match read(&b, "k").await {
            Ok(v) => assert_ne!(v, "v1", "served from the near tier past max_staleness"),
            Err(e) => assert!(e.is_backend(), "{e}"),
        }
    }
    assert!(b.stats().near_switched_off >= 1, "{:?}", b.stats());

    // The stream comes back: B reads Redis, then serves from its near tier again.
    proxy.set_mode(Mode::Pass);
    never_old_until_new(&b, "k", "v1", "v2").await;
    assert_eq!(until_near_hit(&b, "k").await, "v2");
}

#[test]
fn a_cut_connection_or_a_restarted_server_loses_no_change() {
    with_proxy(cut_and_restarted)
}

async fn cut_and_restarted(server: &mut RedisServer, proxy: &Proxy) {
    let a = near_cache(server.url()).await;
    let b = near_cache(proxy.url()).await;
    let _ = a.set("k", &"v1".to_owned(), TTL).await.unwrap();
    assert_eq!(until_near_hit(&b, "k").await, "v1");

    // A cut: the announcement of v2 may be sent while B has no connection to hear it.
    proxy.cut();
    let _ = a.set("k", &"v2".to_owned(), TTL).await.unwrap();
    tokio::time::sleep(MAX_STALENESS).await;
    never_old_until_new(&b, "k", "v1", "v2").await;
    assert_eq!(until_near_hit(&b, "k").await, "v2");

    // A restart: an empty server, written again after it is back.
    server.restart();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while a.set("k", &"v3".to_owned(), TTL).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(MAX_STALENESS).await;
    never_old_until_new(&b, "k", "v2", "v3").await;
    assert_eq!(until_near_hit(&b, "k").await, "v3");
}

#[tokio::test]
async fn the_near_cache_is_refused_on_the_embedded_store() {
    let memory = Cache::builder()
        .near_cache(NearCacheOptions::new(10))
        .build()
        .await;
    assert!(
        matches!(memory, Err(stampede_guard::Error::Config(_))),
        "{memory:?}"
    );
}

/// Connected near-tier feeds: clients that track keys (flag `t`) and hear their own heartbeat
/// channel, or (without tracking) are subscribed to two channels, the near channel and their
/// heartbeat channel.
fn feeds(server: &RedisServer) -> usize {
    let list: String = redis::cmd(&support::admin("CLIENT"))
        .arg("LIST")
        .query(&mut server.conn())
        .unwrap();
    list.lines()
        .filter(|c| {
            let tracks = c
                .split(' ')
                .find_map(|field| field.strip_prefix("flags="))
                .is_some_and(|flags| flags.contains('t'));
            c.contains(" sub=2 ") || (tracks && c.contains(" sub=1 "))
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_cache_stops_its_feed() {
    let server = RedisServer::start();
    let cache = near_cache(server.url()).await;
    let _ = cache.set("k", &"v".to_owned(), TTL).await.unwrap();
    until_near_hit(&cache, "k").await;
    assert_eq!(feeds(&server), 1);
    drop(cache);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while feeds(&server) > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the feed's connection outlived the cache"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How long the proxy holds each chunk between A and Redis in the read-your-write test: the
/// change's report reaches A's near tier this long after it was sent, so a read that starts as
/// the write returns comes well before it.
const FEED_DELAY: Duration = Duration::from_millis(300);

/// A read through a handle with `skip_near_cache` sees another instance's write as soon as the
/// write has returned, on every read path (`get_or_compute`, `get`, a batch), for a `set` and an
/// `invalidate` alike; a plain read meanwhile may still be answered by the old copy.
#[test]
fn a_read_that_skips_the_near_tier_sees_another_instances_write_at_once() {
    with_proxy(read_past_the_near_tier)
}

async fn read_past_the_near_tier(server: &mut RedisServer, proxy: &Proxy) {
    // A reaches Redis through the proxy, its feed included; its copies stay servable for the
    // whole test (a long max_staleness), and its requests outlast the delays.
    let a = Cache::builder()
        .redis_url(proxy.url())
        .namespace("near")
        .near_cache(NearCacheOptions::new(1_000).max_staleness(Duration::from_secs(30)))
        .connection(ConnectionOptions::default().response_timeout(Duration::from_secs(10)))
        // Answers slowed down by the proxy are no outage.
        .breaker(BreakerOptions::disabled())
        .build()
        .await
        .expect("a cache with a near tier");
    let b = near_cache(server.url()).await;
    let keys = ["fetched", "got", "batch-set", "batch-invalidated"];
    for key in keys {
        let _ = b.set(key, &"v1".to_owned(), TTL).await.unwrap();
        assert_eq!(until_near_hit(&a, key).await, "v1");
    }
    let latest = a.with_options(a.options().clone().skip_near_cache(true));

    // From now on what Redis tells A, the reports of B's changes included, arrives late.
    proxy.set_mode(Mode::Delay(FEED_DELAY));
    let _ = b.set("fetched", &"v2".to_owned(), TTL).await.unwrap();
    let _ = b.invalidate("got").await.unwrap();
    let _ = b.set("batch-set", &"v2".to_owned(), TTL).await.unwrap();
    let _ = b.invalidate("batch-invalidated").await.unwrap();

    // The cross-instance window: until the report reaches A, a plain read may be answered by
    // A's old copy (not asserted either way: it depends on timing).
    let plain = read(&a, "fetched").await.unwrap();
    assert!(plain == "v1" || plain == "v2", "{plain}");
    // The reads that skip the near tier start before the reports can arrive, and see the writes.
    let (fetched, got, batch) = tokio::join!(
        read(&latest, "fetched"),
        latest.get::<String>("got"),
        latest.get_or_compute_many(["batch-set", "batch-invalidated"], TTL, |keys| async move {
            let computed = keys.into_iter().map(|key| (key, "computed".to_owned()));
            Ok::<_, std::io::Error>(computed.collect::<Vec<_>>())
        }),
    );
    assert_eq!(fetched.unwrap(), "v2");
    assert_eq!(got.unwrap(), None);
    let batch: Vec<String> = batch.into_iter().map(Result::unwrap).collect();
    assert_eq!(batch, ["v2", "computed"]);

    // Once the reports are in, A's plain reads agree, from the tier again.
    proxy.set_mode(Mode::Pass);
    tokio::time::sleep(FEED_DELAY * 2).await;
    never_old_until_new(&a, "fetched", "v1", "v2").await;
    assert_eq!(until_near_hit(&a, "fetched").await, "v2");
}
