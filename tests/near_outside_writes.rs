//! The near tier sees every writer (`CLIENT TRACKING`), against real redis-server processes:
//! a copy stops being served within `max_staleness` after another program's `DEL`, `UNLINK`,
//! `SET`, `PEXPIRE`, a `RENAME` onto its key, an eviction, `FLUSHDB` or `FLUSHALL`; where the
//! server refuses tracking, the tier says so, still hears the crate's own writes, and reads a
//! copy again once it is `max_staleness` old, so that an outside `DEL` or `SET` stops being
//! served within `max_staleness` there too.
//!
//! On a managed-like server (`STAMPEDE_REDIS_MANAGED=1`, tests/support/server.rs) every tier's
//! tracking is refused: the tests expect that, and the outside changes are caught all the same.

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod commandstats;
    pub mod poll;
    pub mod server;
    pub use {commandstats::*, poll::*, server::*};
}

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::Commands;
use stampede_guard::{Cache, NearCacheOptions, TrackingState, Written};
use support::{commands_since_reset, eventually, managed, reset_command_stats, RedisServer};

const TTL: Duration = Duration::from_secs(600);
const MAX_STALENESS: Duration = Duration::from_millis(200);
/// How long a test waits for something that should happen at once (generous: a loaded machine).
const PATIENCE: Duration = Duration::from_secs(20);

async fn near_cache(url: String, near: NearCacheOptions) -> Cache {
    Cache::builder()
        .redis_url(url)
        .namespace("outside")
        .near_cache(near.max_staleness(MAX_STALENESS))
        .build()
        .await
        .expect("a cache with a near tier")
}

/// A reader with a near tier, and how many values it computed.
struct Reader {
    cache: Cache,
    computed: Arc<AtomicU64>,
}

impl Reader {
    async fn new(url: String, near: NearCacheOptions) -> Self {
        Reader {
            cache: near_cache(url, near).await,
            computed: Arc::default(),
        }
    }

    /// Reads `key`; a computation answers `v<n>`, n counting this reader's computations.
    async fn read(&self, key: &str) -> String {
        let computed = Arc::clone(&self.computed);
        self.cache
            .get_or_compute(key, TTL, || async move {
                let n = computed.fetch_add(1, Ordering::SeqCst) + 1;
                Ok::<_, std::io::Error>(format!("v{n}"))
            })
            .await
            .expect("a read")
    }

    /// Reads `key` until the near tier answers (its feed is up and proven current).
    async fn until_near_hit(&self, key: &str) -> String {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let before = self.cache.stats().near_hits;
            let value = self.read(key).await;
            if self.cache.stats().near_hits > before {
                return value;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no near hit within {PATIENCE:?}: {:?}",
                self.cache.stats()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A copy of `key` is held, `change` runs (another program's command), and once the change
    /// is `max_staleness` old, the copy is not served any more: the read reaches Redis.
    async fn drops_its_copy_after(&self, key: &str, change: impl FnOnce()) {
        let held = self.until_near_hit(key).await;
        change();
        tokio::time::sleep(MAX_STALENESS).await;
        let near_hits = self.cache.stats().near_hits;
        let now = self.read(key).await;
        assert_eq!(
            self.cache.stats().near_hits,
            near_hits,
            "{key}: the copy ({held:?}) was served after the change: {:?}",
            self.cache.stats()
        );
        assert_ne!(
            now, held,
            "{key}: the old value was served after the change"
        );
    }
}

/// The tracking state of a tier whose server and login allow it: on, except on a managed-like
/// server, which renames `CLIENT` away.
fn tracking_allowed() -> TrackingState {
    if managed() {
        TrackingState::Refused
    } else {
        TrackingState::On
    }
}

impl Reader {
    /// [`drops_its_copy_after`](Self::drops_its_copy_after) another program's `DEL` of a key,
    /// then its `SET` of another (bytes that are no envelope of the crate: a miss, logged,
    /// computed again).
    async fn drops_its_copy_after_a_del_and_a_set(&self, admin: &mut redis::Connection) {
        self.drops_its_copy_after("del", || {
            let _: i64 = admin.del(value_key("del")).unwrap();
        })
        .await;
        self.drops_its_copy_after("set", || {
            let _: () = admin
                .set(value_key("set"), "written by another program")
                .unwrap();
        })
        .await;
    }
}

/// The value key of `key` in the test's namespace (the documented layout, `ns:{key}`).
fn value_key(key: &str) -> String {
    format!("outside:{{{key}}}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_outside_change_of_a_key_drops_the_copies_within_max_staleness() {
    let server = RedisServer::start();
    let reader = Reader::new(server.url(), NearCacheOptions::new(1_000)).await;
    let mut admin = server.conn();

    reader
        .drops_its_copy_after_a_del_and_a_set(&mut admin)
        .await;
    reader
        .drops_its_copy_after("unlink", || {
            let _: i64 = admin.unlink(value_key("unlink")).unwrap();
        })
        .await;
    reader
        .drops_its_copy_after("pexpire", || {
            let _: bool = admin.pexpire(value_key("pexpire"), 1).unwrap();
        })
        .await;
    // A value the crate wrote under another key, renamed onto this one.
    let _ = reader.read("source").await;
    reader
        .drops_its_copy_after("rename", || {
            let _: () = admin
                .rename(value_key("source"), value_key("rename"))
                .unwrap();
        })
        .await;
    assert_eq!(reader.cache.stats().near_tracking, tracking_allowed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_or_a_flush_drops_the_copies_within_max_staleness() {
    let server = RedisServer::start();
    let reader = Reader::new(server.url(), NearCacheOptions::new(1_000)).await;
    let mut admin = server.conn();

    reader
        .drops_its_copy_after("evicted", || {
            // Every key goes: a limit below what the server holds makes the next command evict
            // until nothing evictable is left.
            let _: () = redis::cmd(&support::admin("CONFIG"))
                .arg("SET")
                .arg("maxmemory-policy")
                .arg("allkeys-random")
                .query(&mut admin)
                .unwrap();
            let _: () = redis::cmd(&support::admin("CONFIG"))
                .arg("SET")
                .arg("maxmemory")
                .arg("1")
                .query(&mut admin)
                .unwrap();
            let _: redis::RedisResult<()> = admin.set("outside-filler", "x");
            let exists: bool = admin.exists(value_key("evicted")).unwrap();
            let _: () = redis::cmd(&support::admin("CONFIG"))
                .arg("SET")
                .arg("maxmemory")
                .arg("0")
                .query(&mut admin)
                .unwrap();
            assert!(!exists, "the value was not evicted");
        })
        .await;
    reader
        .drops_its_copy_after("flushdb", || {
            let _: () = redis::cmd("FLUSHDB").query(&mut admin).unwrap();
        })
        .await;
    reader
        .drops_its_copy_after("flushall", || {
            let _: () = redis::cmd("FLUSHALL").query(&mut admin).unwrap();
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narrowed_tracking_sees_outside_writes_under_its_prefixes_only() {
    let server = RedisServer::start();
    let reader = Reader::new(
        server.url(),
        NearCacheOptions::new(1_000).track_only(["report:"]),
    )
    .await;
    let mut admin = server.conn();
    reader
        .drops_its_copy_after("report:2019-05", || {
            let _: i64 = admin.del(value_key("report:2019-05")).unwrap();
        })
        .await;

    // Outside the prefix the copy stays (documented: until its own fresh-until), where
    // tracking is on; where it is refused, every copy is read again after max_staleness.
    if managed() {
        return;
    }
    let held = reader.until_near_hit("rates:2019-05").await;
    let _: i64 = admin.del(value_key("rates:2019-05")).unwrap();
    tokio::time::sleep(MAX_STALENESS * 2).await;
    assert_eq!(reader.until_near_hit("rates:2019-05").await, held);
}

/// An ACL user that may not send `CLIENT`: the server refuses tracking.
fn user_without_client(server: &RedisServer) -> String {
    let mut admin = server.conn();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("reader")
        .arg("on")
        .arg(">secret")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-client")
        .query(&mut admin)
        .unwrap();
    format!("redis://reader:secret@127.0.0.1:{}", server.port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_tracking_is_reported_and_the_crates_own_writes_still_reach_the_tier() {
    let server = RedisServer::start();
    let reader = Reader::new(user_without_client(&server), NearCacheOptions::new(1_000)).await;
    let writer = near_cache(server.url(), NearCacheOptions::new(1_000)).await;

    let held = reader.until_near_hit("2019-05").await;
    assert_eq!(reader.cache.stats().near_tracking, TrackingState::Refused);
    assert_eq!(
        reader.cache.health().await.near_tracking,
        Some(TrackingState::Refused)
    );
    // The writer's own tier tracks: one refusal is the reader's ACL, not the server's.
    assert!(
        eventually(PATIENCE, || writer.stats().near_tracking
            == tracking_allowed()),
        "{:?}",
        writer.stats()
    );

    // A write through the crate is announced, and the reader hears it.
    let written = writer
        .set("2019-05", &"from the writer".to_owned(), TTL)
        .await
        .unwrap();
    assert_eq!(written, Written::Applied);
    tokio::time::sleep(MAX_STALENESS).await;
    let now = reader.read("2019-05").await;
    assert_ne!(now, held);
    assert_eq!(now, "from the writer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracking_turned_off_is_reported_and_every_change_still_reaches_the_tier() {
    let server = RedisServer::start();
    let reader = Reader::new(
        server.url(),
        NearCacheOptions::new(1_000).track_outside_writes(false),
    )
    .await;
    let writer = near_cache(server.url(), NearCacheOptions::new(1_000)).await;
    reader.until_near_hit("2019-05").await;
    assert_eq!(reader.cache.stats().near_tracking, TrackingState::Off);
    assert_eq!(
        writer.invalidate("2019-05").await.unwrap(),
        Written::Applied
    );
    tokio::time::sleep(MAX_STALENESS).await;
    assert_eq!(reader.read("2019-05").await, "v2");
    // Another program's changes are not announced: they stop being served all the same, each
    // copy being read again once it is max_staleness old.
    reader
        .drops_its_copy_after_a_del_and_a_set(&mut server.conn())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tracking_refused_an_outside_del_or_set_stops_being_served_within_max_staleness() {
    let server = RedisServer::start();
    let reader = Reader::new(user_without_client(&server), NearCacheOptions::new(1_000)).await;
    reader
        .drops_its_copy_after_a_del_and_a_set(&mut server.conn())
        .await;
    assert_eq!(reader.cache.stats().near_tracking, TrackingState::Refused);
}

/// The figures of `docs/near-cache.md` (Without tracking), printed, not checked (they are
/// times and rates of this machine): with tracking refused, how long after an outside `DEL` the
/// old copy is still served, and how many reads per second Redis serves to keep 1,000 hot keys'
/// copies within `max_staleness`. Run:
/// `cargo test --all-features --test near_outside_writes -- --ignored --nocapture revalidation`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn revalidation_without_tracking_measured() {
    for staleness in [Duration::from_millis(200), Duration::from_secs(1)] {
        let server = RedisServer::start();
        let cache = Cache::builder()
            .redis_url(user_without_client(&server))
            .namespace("outside")
            .near_cache(NearCacheOptions::new(10_000).max_staleness(staleness))
            .build()
            .await
            .expect("a cache with a near tier");
        let reader = Reader {
            cache,
            computed: Arc::default(),
        };
        let mut admin = server.conn();
        // Time until an outside DEL stops being served, for 20 keys.
        let mut served_for = Vec::new();
        for i in 0..20 {
            let key = format!("del-{i}");
            let held = reader.until_near_hit(&key).await;
            // The copy is 0 to 0.9 max_staleness old when the DEL comes.
            tokio::time::sleep(staleness * (i % 10) / 10).await;
            let _: i64 = admin.del(value_key(&key)).unwrap();
            let deleted = tokio::time::Instant::now();
            while reader.read(&key).await == held {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            served_for.push(deleted.elapsed());
        }
        served_for.sort();
        // The Redis reads 1,000 hot keys cost: every key read continually for 5 s.
        let keys: Vec<String> = (0..1_000).map(|i| format!("hot-{i}")).collect();
        for key in &keys {
            reader.read(key).await;
        }
        reset_command_stats(&server);
        let misses = reader.cache.stats().near_misses;
        let start = tokio::time::Instant::now();
        // 16 readers at once, each over its 1/16 of the keys, so that a read waiting on Redis
        // does not hold the others up.
        let mut readers = tokio::task::JoinSet::new();
        for shard in keys.chunks(keys.len() / 16) {
            let (cache, shard) = (reader.cache.clone(), shard.to_vec());
            readers.spawn(async move {
                let mut reads = 0u64;
                while start.elapsed() < Duration::from_secs(5) {
                    for key in &shard {
                        let compute = || async { Ok::<_, std::io::Error>(String::new()) };
                        cache.get_or_compute(key, TTL, compute).await.unwrap();
                        reads += 1;
                    }
                }
                reads
            });
        }
        let reads: u64 = readers.join_all().await.into_iter().sum();
        let seconds = start.elapsed().as_secs_f64();
        let commands = commands_since_reset(&server);
        let revalidations = reader.cache.stats().near_misses - misses;
        println!(
            "max_staleness {staleness:?}: outside DEL served for {:?} (median) {:?} (max) of 20; \
             1,000 hot keys read {:.0}/s: {:.0} revalidations/s, server commands/s {:?}",
            served_for[served_for.len() / 2],
            served_for[served_for.len() - 1],
            reads as f64 / seconds,
            revalidations as f64 / seconds,
            commands
                .iter()
                .map(|(name, n)| (name.as_str(), (*n as f64 / seconds).round()))
                .collect::<Vec<_>>()
        );
        assert_eq!(reader.cache.stats().near_tracking, TrackingState::Refused);
    }
}
