//! A hit on one server reads its value alone: the namespace's epoch and its tags' are held in
//! process under Redis's tracking (`src/store/redis/held_epoch.rs`), and whatever changes one
//! (a `clear` or an `invalidate_tag` by another instance, an outside `SET`, a lost tracked
//! connection) is seen by the very next hit.

#[path = "support"]
/// The shared helpers this file uses, one module each (tests/support/).
mod support {
    pub mod cache;
    pub mod monitor;
    pub mod server;
    pub mod signal;
    pub use {cache::*, monitor::*, server::*, signal::*};
}

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stampede_guard::{Cache, CallOptions, ConnectionOptions};
use support::{cache, reads, signal, Monitor, RedisServer};

const TTL: Duration = Duration::from_secs(3600);
const NAMESPACE: &str = "reports";

/// The value `key` holds, computed as the next count of `computed` on a miss.
async fn read(cache: &Cache, key: &str, computed: &Arc<AtomicU32>) -> u32 {
    let computed = Arc::clone(computed);
    cache
        .get_or_compute(key, TTL, move || async move {
            Ok::<_, String>(computed.fetch_add(1, Ordering::SeqCst) + 1)
        })
        .await
        .expect("a value")
}

/// Hits `key` until a hit reads the value alone (the epoch learned in the background), counting
/// in `computed` any read that computed instead.
async fn until_hits_read_alone(
    server: &RedisServer,
    cache: &Cache,
    key: &str,
    computed: &Arc<AtomicU32>,
) {
    let value_key = format!("{NAMESPACE}:{{{key}}}");
    let held = support::until_a_hit_reads_alone(server, &value_key, || async {
        read(cache, key, computed).await;
    })
    .await;
    assert!(
        held,
        "a managed-like server refuses tracking: these tests need one that allows it"
    );
}

/// An instance on `server` that computed `key` once and whose hits of it now read the value
/// alone; and the count of its computations.
async fn warm_and_held(server: &RedisServer, key: &str) -> (Cache, Arc<AtomicU32>) {
    held(
        cache(server, NAMESPACE, CallOptions::default()).await,
        server,
        key,
    )
    .await
}

/// `cache` once it computed `key` and its hits of it read the value alone; and the count of
/// its computations.
async fn held(cache: Cache, server: &RedisServer, key: &str) -> (Cache, Arc<AtomicU32>) {
    let computed = Arc::new(AtomicU32::new(0));
    assert_eq!(
        read(&cache, key, &computed).await,
        1,
        "the first read computes"
    );
    until_hits_read_alone(server, &cache, key, &computed).await;
    (cache, computed)
}

/// Two instances of one namespace on `server`: one that reads `2019-05` (its hits already
/// reading the value alone) and one that clears; and the count of the reader's computations.
async fn reader_and_clearer(server: &RedisServer) -> (Cache, Cache, Arc<AtomicU32>) {
    let (reader, computed) = warm_and_held(server, "2019-05").await;
    let clearer = cache(server, NAMESPACE, CallOptions::default()).await;
    (reader, clearer, computed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_hit_reads_one_key() {
    let server = RedisServer::start();
    let (_cache, computed) = warm_and_held(&server, "2019-05").await;
    assert_eq!(
        computed.load(Ordering::SeqCst),
        1,
        "every later read was a hit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clear_by_another_instance_is_seen_by_the_next_hit() {
    let server = RedisServer::start();
    let (reader, clearer, computed) = reader_and_clearer(&server).await;
    for round in 0..50 {
        let before = read(&reader, "2019-05", &computed).await;
        assert!(clearer.clear().await.expect("cleared").is_applied());
        // The clear has returned: no hit may serve a value born before it, held epoch or not.
        let after = read(&reader, "2019-05", &computed).await;
        assert_eq!(
            after,
            before + 1,
            "round {round}: a read after another instance's clear served the value from before it"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tag_invalidated_by_another_instance_is_seen_by_the_next_hit() {
    let server = RedisServer::start();
    // A handle whose values carry its tag: its hits hold the tag's epoch too, and read the
    // value alone.
    let tagged = CallOptions::default().tags(["year:2019"]);
    let reader = cache(&server, NAMESPACE, tagged).await;
    let (reader, computed) = held(reader, &server, "2019-05").await;
    let invalidator = cache(&server, NAMESPACE, CallOptions::default()).await;
    for round in 0..50 {
        let before = read(&reader, "2019-05", &computed).await;
        let written = invalidator.invalidate_tag("year:2019").await;
        assert!(written.expect("invalidated").is_applied());
        // The invalidation has returned: no hit may serve a value born before it.
        let after = read(&reader, "2019-05", &computed).await;
        assert_eq!(
            after,
            before + 1,
            "round {round}: a read after another instance's invalidation of its tag served the value from before it"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outside_write_of_the_epoch_is_seen_by_the_next_hit() {
    let server = RedisServer::start();
    let (cache, computed) = warm_and_held(&server, "2019-05").await;
    let before = read(&cache, "2019-05", &computed).await;
    // Another program raises the epoch to the server's clock now (microseconds, as `clear`
    // does): every value born before is gone.
    let mut conn = server.conn();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut conn).expect("TIME");
    let _: () = redis::cmd("SET")
        .arg(format!("{NAMESPACE}:{{%c}}"))
        .arg(secs * 1_000_000 + micros + 1)
        .query(&mut conn)
        .expect("SET the epoch");
    assert_eq!(read(&cache, "2019-05", &computed).await, before + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_tracked_connection_is_learned_again() {
    let server = RedisServer::start();
    let (reader, clearer, computed) = reader_and_clearer(&server).await;

    // The tracked connection is the one with tracking on (flag `t`): killed, its invalidations
    // can no longer come, so what it held must not be trusted.
    let mut conn = server.conn();
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut conn)
        .expect("CLIENT LIST");
    let tracked: Vec<&str> = clients
        .lines()
        .filter(|line| {
            line.split(' ')
                .any(|f| f.starts_with("flags=") && f.contains('t'))
        })
        .filter_map(|line| line.split(' ').find_map(|f| f.strip_prefix("id=")))
        .collect();
    assert_eq!(tracked.len(), 1, "one tracked connection: {clients}");
    let _: u32 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(tracked[0])
        .query(&mut conn)
        .expect("CLIENT KILL");
    // A hit sent before the client saw the connection go fails, as on any lost connection;
    // the ones after it go the old way.
    let mut before = None;
    for _ in 0..100 {
        let computed = Arc::clone(&computed);
        let hit = reader.get_or_compute("2019-05", TTL, move || async move {
            Ok::<_, String>(computed.fetch_add(1, Ordering::SeqCst) + 1)
        });
        match hit.await {
            Ok(value) => {
                before = Some(value);
                break;
            }
            Err(e) => assert!(e.is_unreachable(), "only the lost connection fails: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = before.expect("hits are answered again after the tracked connection is lost");
    assert!(clearer.clear().await.expect("cleared").is_applied());
    assert_eq!(read(&reader, "2019-05", &computed).await, before + 1);
    // And the epoch is held again on a new connection.
    until_hits_read_alone(&server, &reader, "2019-05", &computed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_is_a_miss_on_a_read_alone() {
    let server = RedisServer::start();
    let (cache, computed) = warm_and_held(&server, "warm").await;
    // Another program's list under the value key: a `GET` of it is refused (`WRONGTYPE`).
    let _: () = redis::cmd("RPUSH")
        .arg(format!("{NAMESPACE}:{{foreign}}"))
        .arg("not ours")
        .query(&mut server.conn())
        .expect("RPUSH");
    let before = computed.load(Ordering::SeqCst);
    assert_eq!(read(&cache, "foreign", &computed).await, before + 1);
    assert_eq!(
        read(&cache, "foreign", &computed).await,
        before + 1,
        "replaced, then a hit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_on_a_frozen_server_waits_one_time_out_not_two() {
    let server = RedisServer::start();
    let connection = ConnectionOptions::default().response_timeout(Duration::from_millis(500));
    let cache = Cache::builder()
        .redis_url(server.url())
        .namespace(NAMESPACE)
        .connection(connection)
        .build()
        .await
        .expect("a cache on the test server");
    let (cache, _) = held(cache, &server, "2019-05").await;
    let monitor = Monitor::start(&server);
    // Frozen, the server takes the requests into its socket's buffer and answers none; they run
    // once it goes on, so the monitor sees every read this hit sent.
    let pid = server.pid().expect("the test's own server");
    signal(pid, "STOP");
    let frozen = cache
        .get_or_compute("2019-05", TTL, || async { Ok::<_, String>(0u32) })
        .await;
    signal(pid, "CONT");
    assert!(
        frozen.as_ref().is_err_and(|e| e.is_unreachable()),
        "a frozen server's read is an error: {frozen:?}"
    );
    let value_key = format!("{NAMESPACE}:{{2019-05}}");
    let sent = reads(&monitor.lines_until_now(&server));
    assert_eq!(
        sent,
        [vec!["GET".to_owned(), value_key]],
        "the timed-out read on the tracked connection is the hit's one read: asked again the \
         old way, every read would wait out a second time-out"
    );
}

/// A cache kept across runtimes (a `static` shared by tests, a blocking wrapper that makes a
/// runtime per call): the tracked connection's driver goes with the runtime that ran it, and
/// says nothing. On the next runtime the hits answer (at most one fails, as on any lost
/// connection), and the epoch is held again on a new connection.
#[test]
fn a_cache_that_outlives_its_runtime_answers_and_holds_the_epoch_again() {
    let server = RedisServer::start();
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    };
    let first = runtime();
    let (cache, computed) = first.block_on(warm_and_held(&server, "2019-05"));
    drop(first);
    runtime().block_on(async {
        let mut failed = 0;
        for _ in 0..100 {
            let hit = cache.get_or_compute("2019-05", TTL, || async { Ok::<_, String>(0u32) });
            match hit.await {
                Ok(value) => {
                    assert_eq!(value, 1, "the value computed on the first runtime");
                    break;
                }
                Err(e) => {
                    assert!(e.is_unreachable(), "only a lost connection fails: {e}");
                    failed += 1;
                }
            }
        }
        assert!(failed <= 2, "{failed} hits failed on the new runtime");
        until_hits_read_alone(&server, &cache, "2019-05", &computed).await;
    });
}

/// With `hold_epoch(false)` (behind a sharding proxy) no connection tracks the epoch: every
/// hit reads it beside the value, however long the cache has been answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_hold_epoch_off_every_hit_reads_the_epoch_beside_the_value() {
    let server = RedisServer::start();
    let cache = Cache::builder()
        .redis_url(server.url())
        .namespace(NAMESPACE)
        .connection(ConnectionOptions::default().hold_epoch(false))
        .build()
        .await
        .expect("a cache on the test server");
    let computed = Arc::new(AtomicU32::new(0));
    for _ in 0..10 {
        read(&cache, "2019-05", &computed).await;
    }
    // Time enough for the epoch to be learned in the background, were it held.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let monitor = Monitor::start(&server);
    assert_eq!(read(&cache, "2019-05", &computed).await, 1, "a hit");
    let sent = reads(&monitor.lines_until_now(&server));
    assert_eq!(
        sent,
        [vec![
            "MGET".to_owned(),
            format!("{NAMESPACE}:{{2019-05}}"),
            format!("{NAMESPACE}:{{%c}}")
        ]],
        "the hit read the epoch beside the value"
    );
}
