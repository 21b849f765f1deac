//! Tags and clear (`docs/tags.md`) against real redis-server processes (and the embedded store):
//! a tagged value, once its tag is invalidated or its namespace cleared, is served by no path
//! (a hit, `get`, a batch, a stale window, the fail-safe, a near tier), a computation that
//! started before the invalidation cannot make its value survive it, and a read costs the round
//! trips the guide says (counted in the server's `INFO commandstats`).

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod cache;
    pub mod cluster;
    pub mod cluster_cache;
    pub mod commandstats;
    pub mod monitor;
    pub mod poll;
    pub mod server;
    pub use {cache::*, cluster::*, cluster_cache::*, commandstats::*, monitor::*, server::*};
}

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::Commands;
use stampede_guard::{
    Cache, CallOptions, Computed, Error, NearCacheOptions, Source, Written, MAX_TAGS,
};
use support::{
    cache, cluster_cache, commands_since_reset, reset_command_stats, RedisCluster, RedisServer,
};
use tokio::sync::oneshot;

const TTL: Duration = Duration::from_secs(600);
const MAX_STALENESS: Duration = Duration::from_millis(200);

/// A reader that counts its computations; a computation answers `<key>#<n>`.
#[derive(Clone)]
struct Counted {
    computed: Arc<AtomicU64>,
}

impl Counted {
    fn new() -> Self {
        Counted {
            computed: Arc::default(),
        }
    }

    fn computed(&self) -> u64 {
        self.computed.load(Ordering::SeqCst)
    }

    /// `get_or_compute` of `key` through `cache`, the value tagged with `tags` by the
    /// computation ([`Computed::tags`]).
    async fn read(&self, cache: &Cache, key: &str, tags: &[&str]) -> (String, Source) {
        let computed = Arc::clone(&self.computed);
        let tags: Vec<String> = tags.iter().map(|t| (*t).to_owned()).collect();
        let owned = key.to_owned();
        let fetched = cache
            .fetch(key, TTL, move |_lease| async move {
                let n = computed.fetch_add(1, Ordering::SeqCst) + 1;
                Ok::<_, std::io::Error>(Computed::new(format!("{owned}#{n}")).tags(tags))
            })
            .await
            .expect("a read");
        (fetched.value, fetched.source)
    }
}

/// Every command the server ran since the reset (see `support::commandstats`), but the
/// `TIME`s a new instance calibrates its clock with (no part of a read).
fn commands_of_the_cache(server: &RedisServer) -> BTreeMap<String, u64> {
    let mut calls = commands_since_reset(server);
    calls.remove("time");
    calls
}

#[tokio::test]
async fn an_invalidated_tag_takes_every_value_that_carries_it_and_nothing_else() {
    let server = RedisServer::start();
    let cache = cache(&server, "tags", CallOptions::default()).await;
    let reader = Counted::new();
    // Tagged by the handle, by the computation, or both; and one untagged.
    let tenant = cache.with_options(CallOptions::default().tags(["tenant:7"]));
    reader.read(&tenant, "a", &[]).await;
    reader.read(&cache, "b", &["tenant:7", "year:2019"]).await;
    reader.read(&tenant, "c", &["year:2020"]).await;
    reader.read(&cache, "d", &["tenant:8"]).await;
    reader.read(&cache, "e", &[]).await;
    assert_eq!(reader.computed(), 5);
    for key in ["a", "b", "c", "d", "e"] {
        assert_eq!(reader.read(&cache, key, &[]).await.1, Source::Hit, "{key}");
    }

    let written = cache.invalidate_tag("tenant:7").await;
    assert_eq!(written.expect("invalidate_tag"), Written::Applied);

    for key in ["a", "b", "c"] {
        assert_eq!(
            cache.get::<String>(key).await.unwrap(),
            None,
            "{key} is gone"
        );
        assert_eq!(
            tenant.get::<String>(key).await.unwrap(),
            None,
            "{key} is gone"
        );
    }
    for key in ["d", "e"] {
        assert!(
            cache.get::<String>(key).await.unwrap().is_some(),
            "{key} stays"
        );
    }
    // Each gone key is computed again once; the new values are hits again.
    let (a, source) = reader.read(&tenant, "a", &[]).await;
    assert_eq!((a.as_str(), source), ("a#6", Source::Computed));
    assert_eq!(reader.read(&tenant, "a", &[]).await, (a, Source::Hit));
    assert_eq!(reader.read(&cache, "d", &[]).await.1, Source::Hit);
    assert_eq!(reader.computed(), 6);

    // Several tags at once; repeated tags are harmless.
    let written = cache.invalidate_tags(["year:2019", "year:2020", "year:2019"]);
    assert_eq!(written.await.expect("invalidate_tags"), Written::Applied);
    assert_eq!(cache.get::<String>("b").await.unwrap(), None);
    assert_eq!(cache.get::<String>("c").await.unwrap(), None);
    assert!(cache.get::<String>("a").await.unwrap().is_some());
}

/// `Cache::tagged` adds tags to the handle's own in one call: what it writes carries both,
/// either invalidates it, and the handle it came from is unchanged.
#[tokio::test]
async fn a_tagged_handle_adds_its_tags_to_the_handles_own() {
    let server = RedisServer::start();
    let options = CallOptions::default().tags(["region:eu"]);
    let region = cache(&server, "tagged", options).await;
    let reader = Counted::new();
    let tenant = region.tagged(["tenant:7"]);
    assert_eq!(tenant.options().get_tags(), ["region:eu", "tenant:7"]);
    assert_eq!(region.options().get_tags(), ["region:eu"]);
    reader.read(&tenant, "a", &[]).await;
    reader.read(&region.tagged(["tenant:8"]), "b", &[]).await;
    reader.read(&tenant, "c", &[]).await;

    assert_eq!(
        region.invalidate_tag("tenant:7").await.unwrap(),
        Written::Applied
    );
    assert_eq!(region.get::<String>("a").await.unwrap(), None);
    assert_eq!(region.get::<String>("c").await.unwrap(), None);
    assert!(region.get::<String>("b").await.unwrap().is_some());
    // The handle's own tag is still carried by what the tagged handle writes.
    assert_eq!(reader.read(&tenant, "a", &[]).await.1, Source::Computed);
    assert_eq!(
        region.invalidate_tag("region:eu").await.unwrap(),
        Written::Applied
    );
    assert_eq!(tenant.get::<String>("a").await.unwrap(), None);
    assert_eq!(region.get::<String>("b").await.unwrap(), None);

    // A bad tag fails every call of that handle, as in `CallOptions::tags`.
    let empty = region.tagged([""]);
    assert!(matches!(
        empty.get::<String>("a").await,
        Err(Error::InvalidKey { .. })
    ));
}

#[tokio::test]
async fn a_computation_that_started_before_the_invalidation_does_not_survive_it() {
    let server = RedisServer::start();
    let cache = cache(&server, "fence", CallOptions::default()).await;
    let (started_tx, started) = oneshot::channel::<()>();
    let (go, go_rx) = oneshot::channel::<()>();
    let slow = tokio::spawn({
        let cache = cache.clone();
        async move {
            cache
                .fetch("report", TTL, move |_lease| async move {
                    let _ = started_tx.send(());
                    let _ = go_rx.await;
                    Ok::<_, std::io::Error>(Computed::new("old".to_owned()).tags(["t"]))
                })
                .await
        }
    });
    started.await.expect("the computation started");
    assert_eq!(
        cache.invalidate_tag("t").await.expect("invalidate_tag"),
        Written::Applied
    );
    go.send(()).expect("the computation waits");
    let fetched = slow.await.unwrap().expect("its caller gets its value");
    assert_eq!(
        (fetched.value.as_str(), fetched.source),
        ("old", Source::Computed)
    );
    // Written, but born before the invalidation: read by no one.
    assert_eq!(cache.get::<String>("report").await.unwrap(), None);
    let again = cache
        .get_or_compute("report", TTL, || async {
            Ok::<_, std::io::Error>("new".to_owned())
        })
        .await
        .unwrap();
    assert_eq!(again, "new");
}

/// Starts a computation of `key` through `cache` that answers `old` (tagged `t` by the
/// computation) once `go` fires; returns when it has started.
async fn slow_old_value(
    cache: &Cache,
    key: &'static str,
) -> (tokio::task::JoinHandle<String>, oneshot::Sender<()>) {
    let (started_tx, started) = oneshot::channel::<()>();
    let (go, go_rx) = oneshot::channel::<()>();
    let leader = tokio::spawn({
        let cache = cache.clone();
        async move {
            cache
                .fetch(key, TTL, move |_lease| async move {
                    let _ = started_tx.send(());
                    let _ = go_rx.await;
                    Ok::<_, std::io::Error>(Computed::new("old".to_owned()).tags(["t"]))
                })
                .await
                .unwrap()
                .value
        }
    });
    started.await.expect("the computation started");
    (leader, go)
}

/// A call of `key` through `cache` whose own computation would answer `new`.
fn call(cache: &Cache, key: &'static str) -> tokio::task::JoinHandle<(String, Source)> {
    let cache = cache.clone();
    tokio::spawn(async move {
        let fetched = cache
            .fetch(key, TTL, |_lease| async {
                Ok::<_, std::io::Error>(Computed::new("new".to_owned()).tags(["t"]))
            })
            .await
            .unwrap();
        (fetched.value, fetched.source)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_starts_after_an_invalidation_does_not_share_an_older_computation() {
    let server = RedisServer::start();
    not_shared_after_an_invalidation(&server, "flight", CallOptions::default()).await;
    // With the fail-safe's soft timeout, a follower waits on its leader by another path.
    let soft = CallOptions::default()
        .fail_safe_for(Duration::from_secs(3600))
        .soft_timeout(Some(Duration::from_secs(30)));
    not_shared_after_an_invalidation(&server, "flight-soft", soft).await;
}

async fn not_shared_after_an_invalidation(server: &RedisServer, ns: &str, options: CallOptions) {
    // Invalidated by this process, then by another one (whose tag this process never read).
    let elsewhere = cache(server, ns, options.clone()).await;
    let cache = cache(server, ns, options).await;
    for (key, invalidator) in [("here", &cache), ("elsewhere", &elsewhere)] {
        let (leader, go) = slow_old_value(&cache, key).await;
        assert_eq!(
            invalidator.invalidate_tag("t").await.unwrap(),
            Written::Applied
        );
        let after = call(&cache, key);
        tokio::time::sleep(Duration::from_millis(100)).await;
        go.send(()).unwrap();
        assert_eq!(leader.await.unwrap(), "old", "its own caller gets it");
        let (value, source) = after.await.unwrap();
        assert_eq!(value, "new", "{key}: {source:?}");
    }
    // A clear, the same.
    let (leader, go) = slow_old_value(&cache, "cleared").await;
    assert_eq!(elsewhere.clear().await.unwrap(), Written::Applied);
    let after = call(&cache, "cleared");
    tokio::time::sleep(Duration::from_millis(100)).await;
    go.send(()).unwrap();
    leader.await.unwrap();
    assert_eq!(after.await.unwrap().0, "new");
    // Without an invalidation, a call shares the running computation (one computation).
    let (leader, go) = slow_old_value(&cache, "shared").await;
    let after = call(&cache, "shared");
    tokio::time::sleep(Duration::from_millis(100)).await;
    go.send(()).unwrap();
    leader.await.unwrap();
    assert_eq!(after.await.unwrap(), ("old".to_owned(), Source::Waited));
}

#[tokio::test]
async fn clear_takes_the_whole_namespace_and_no_other() {
    let server = RedisServer::start();
    let neighbour = cache(&server, "neighbour", CallOptions::default()).await;
    let cache = cache(&server, "cleared", CallOptions::default()).await;
    for key in ["a", "b", "c"] {
        let _ = cache.set(key, &1u32, TTL).await.unwrap();
        let _ = neighbour.set(key, &2u32, TTL).await.unwrap();
    }
    let keys_before: Vec<String> = server.conn().keys("*").unwrap();

    assert_eq!(cache.clear().await.expect("clear"), Written::Applied);

    for key in ["a", "b", "c"] {
        assert_eq!(cache.get::<u32>(key).await.unwrap(), None, "{key}");
        assert_eq!(neighbour.get::<u32>(key).await.unwrap(), Some(2), "{key}");
    }
    // Nothing was deleted or scanned: one more key, the namespace's epoch.
    let keys_after: Vec<String> = server.conn().keys("*").unwrap();
    assert_eq!(keys_after.len(), keys_before.len() + 1, "{keys_after:?}");
    assert!(keys_after.contains(&"cleared:{%c}".to_owned()));
    // A value written after the clear is a hit.
    let _ = cache.set("a", &3u32, TTL).await.unwrap();
    assert_eq!(cache.get::<u32>("a").await.unwrap(), Some(3));
}

#[tokio::test]
async fn invalidating_and_clearing_cost_two_commands_whatever_the_number_of_values() {
    let server = RedisServer::start();
    let cache = cache(&server, "cost", CallOptions::default()).await;
    let tagged = cache.with_options(CallOptions::default().tags(["big"]));
    let keys: Vec<String> = (0..500).map(|i| format!("k{i}")).collect();
    for key in &keys {
        let _ = tagged.set(key, &1u8, TTL).await.unwrap();
    }
    // The scripts are loaded once per server; counted from the second call on.
    assert_eq!(
        cache.invalidate_tag("warm-up").await.unwrap(),
        Written::Applied
    );
    reset_command_stats(&server);
    assert_eq!(cache.invalidate_tag("big").await.unwrap(), Written::Applied);
    // `commandstats` counts the commands a script runs too (its GET, SET, TIME, PUBLISH): the
    // client sent the two scripts, and nothing touched the values.
    let calls = commands_of_the_cache(&server);
    assert_eq!(calls.get("evalsha"), Some(&2), "{calls:?}");
    for per_value in ["scan", "keys", "del", "unlink", "mget", "expire", "pexpire"] {
        assert!(!calls.contains_key(per_value), "{calls:?}");
    }
    reset_command_stats(&server);
    assert_eq!(cache.clear().await.unwrap(), Written::Applied);
    let calls = commands_of_the_cache(&server);
    assert_eq!(calls.get("evalsha"), Some(&2), "{calls:?}");
    for key in keys.iter().step_by(50) {
        assert_eq!(cache.get::<u8>(key).await.unwrap(), None);
    }
}

#[tokio::test]
async fn a_tagged_hit_reads_its_value_alone_once_its_tags_epochs_are_held() {
    let server = RedisServer::start();
    let cache = cache(&server, "trips", CallOptions::default()).await;
    let tags = ["tenant:1", "year:2019", "region:eu"];
    let tagged = cache.with_options(CallOptions::default().tags(tags));
    let reader = Counted::new();
    reader.read(&tagged, "r", &[]).await;
    reader.read(&cache, "plain", &[]).await;
    reader.read(&cache, "computed-tags", &tags).await;
    // The store learns the namespace's epoch after its first answer: from then on a read
    // carries the other epochs only.
    let held = support::until_a_hit_reads_alone(&server, "trips:{plain}", || async {
        reader.read(&cache, "plain", &[]).await;
    })
    .await;
    // A read of one key: `GET` with the epoch held, else `MGET` of it and the value.
    let one = |n: u64| match held {
        true => ("get".to_owned(), n),
        false => ("mget".to_owned(), n),
    };

    // The handle names the value's tags: their epochs are learned under tracking too, after
    // a read that carried them beside the value; from then on a hit reads the value alone.
    let tags_held = support::until_a_hit_reads_alone(&server, "trips:{r}", || async {
        reader.read(&tagged, "r", &[]).await;
    })
    .await;
    assert_eq!(tags_held, held);
    reset_command_stats(&server);
    assert_eq!(reader.read(&tagged, "r", &[]).await.1, Source::Hit);
    assert_eq!(commands_of_the_cache(&server), BTreeMap::from([one(1)]));
    // Untagged: one read (a GET of the value with the namespace's epoch held).
    reset_command_stats(&server);
    assert_eq!(reader.read(&cache, "plain", &[]).await.1, Source::Hit);
    assert_eq!(commands_of_the_cache(&server), BTreeMap::from([one(1)]));
    // Tags only the computation gave: the instance that computed the value remembers them,
    // reads them with the value, and holds them too.
    support::until_a_hit_reads_alone(&server, "trips:{computed-tags}", || async {
        reader.read(&cache, "computed-tags", &[]).await;
    })
    .await;
    reset_command_stats(&server);
    assert_eq!(
        reader.read(&cache, "computed-tags", &[]).await.1,
        Source::Hit
    );
    assert_eq!(commands_of_the_cache(&server), BTreeMap::from([one(1)]));
    // Another instance learns them on its first read (one more round trip, once): its value
    // alone, then the tags' epochs it found; its next reads carry them beside the value until
    // its store holds them under tracking, and then read the value alone again.
    let other = support::cache(&server, "trips", CallOptions::default()).await;
    reader.read(&other, "plain", &[]).await;
    support::until_a_hit_reads_alone(&server, "trips:{plain}", || async {
        reader.read(&other, "plain", &[]).await;
    })
    .await;
    let mut first = BTreeMap::from([one(1)]);
    *first.entry("mget".to_owned()).or_default() += 1;
    reset_command_stats(&server);
    assert_eq!(
        reader.read(&other, "computed-tags", &[]).await.1,
        Source::Hit
    );
    assert_eq!(commands_of_the_cache(&server), first);
    // (The next read's count is left alone: the learning it starts runs beside it.)
    let other_held = support::until_a_hit_reads_alone(&server, "trips:{computed-tags}", || async {
        reader.read(&other, "computed-tags", &[]).await;
    })
    .await;
    assert_eq!(other_held, held);
}

#[tokio::test]
async fn a_batch_reads_its_keys_tags_in_the_same_round_trips_and_skips_invalidated_ones() {
    let server = RedisServer::start();
    let cache = cache(&server, "batch", CallOptions::default()).await;
    let computed = Arc::new(AtomicU64::new(0));
    let keys: Vec<String> = (1..=12).map(|m| format!("2019-{m:02}")).collect();
    let run = |cache: Cache, computed: Arc<AtomicU64>, keys: Vec<String>| async move {
        cache
            .fetch_many(keys, TTL, move |asked| {
                let computed = Arc::clone(&computed);
                async move {
                    computed.fetch_add(asked.len() as u64, Ordering::SeqCst);
                    let values = asked.into_iter().map(|(key, _lease)| {
                        // Odd months carry "odd" besides the year.
                        let month: u32 = key[5..].parse().unwrap();
                        let mut tags = vec!["year:2019".to_owned()];
                        if month % 2 == 1 {
                            tags.push("odd".to_owned());
                        }
                        let value = Computed::new(month).tags(tags);
                        (key, value)
                    });
                    Ok::<_, std::io::Error>(values.collect::<Vec<_>>())
                }
            })
            .await
    };
    let year = cache.with_options(CallOptions::default().tags(["year:2019"]));
    let first = run(year.clone(), Arc::clone(&computed), keys.clone()).await;
    assert!(first
        .iter()
        .all(|r| r.as_ref().unwrap().source == Source::Computed));
    assert_eq!(computed.load(Ordering::SeqCst), 12);

    // A warm batch: one MGET of the values and the epochs, the handle's tag ("year:2019") and
    // the one its computation added ("odd", remembered).
    reset_command_stats(&server);
    let warm = run(year.clone(), Arc::clone(&computed), keys.clone()).await;
    assert!(warm
        .iter()
        .all(|r| r.as_ref().unwrap().source == Source::Hit));
    let calls = commands_of_the_cache(&server);
    assert_eq!(calls, BTreeMap::from([("mget".to_owned(), 1)]), "{calls:?}");
    // An instance that never read them: one more MGET, for the whole batch.
    let other = support::cache(&server, "batch", CallOptions::default().tags(["year:2019"])).await;
    reset_command_stats(&server);
    let cold_instance = run(other, Arc::clone(&computed), keys.clone()).await;
    assert!(cold_instance
        .iter()
        .all(|r| r.as_ref().unwrap().source == Source::Hit));
    let calls = commands_of_the_cache(&server);
    assert_eq!(calls, BTreeMap::from([("mget".to_owned(), 2)]), "{calls:?}");

    assert_eq!(cache.invalidate_tag("odd").await.unwrap(), Written::Applied);
    let after = run(year.clone(), Arc::clone(&computed), keys.clone()).await;
    for (key, result) in keys.iter().zip(&after) {
        let month: u32 = key[5..].parse().unwrap();
        let expected = if month % 2 == 1 {
            Source::Computed
        } else {
            Source::Hit
        };
        assert_eq!(result.as_ref().unwrap().source, expected, "{key}");
    }
    assert_eq!(
        computed.load(Ordering::SeqCst),
        18,
        "the six odd months, once"
    );
}

#[tokio::test]
async fn an_invalidated_value_is_served_neither_stale_nor_as_the_fail_safe_fallback() {
    let server = RedisServer::start();
    let options = CallOptions::default()
        .stale_for(Duration::from_secs(600))
        .fail_safe_for(Duration::from_secs(3600));
    let cache = cache(&server, "stale", options).await;
    let _ = cache
        .fetch("k", Duration::from_millis(100), |_lease| async {
            Ok::<_, std::io::Error>(Computed::new(1u32).tags(["t"]))
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(cache.invalidate_tag("t").await.unwrap(), Written::Applied);
    // In its stale window: not served stale; a failing computation gets no fallback.
    let failed = cache
        .fetch("k", TTL, |_lease| async {
            Err::<Computed<u32>, _>(std::io::Error::other("the source is down"))
        })
        .await;
    assert!(matches!(failed, Err(Error::Compute(_))), "{failed:?}");
    let fresh = cache
        .get_or_compute("k", TTL, || async { Ok::<_, std::io::Error>(2u32) })
        .await
        .unwrap();
    assert_eq!(fresh, 2);
}

#[tokio::test]
async fn bad_tags_are_clear_errors_and_tags_stay_in_their_namespace() {
    let server = RedisServer::start();
    let other = cache(&server, "other", CallOptions::default()).await;
    let cache = cache(&server, "bad", CallOptions::default()).await;
    let empty = cache.with_options(CallOptions::default().tags([""]));
    let read = empty
        .get_or_compute("k", TTL, || async { Ok::<_, std::io::Error>(1u8) })
        .await;
    assert!(matches!(read, Err(Error::InvalidKey { .. })), "{read:?}");
    assert!(matches!(
        empty.get::<u8>("k").await,
        Err(Error::InvalidKey { .. })
    ));
    let batch = empty
        .get_or_compute_many(["a", "b"], TTL, |keys| async move {
            Ok::<_, std::io::Error>(keys.into_iter().map(|k| (k, 1u8)).collect::<Vec<_>>())
        })
        .await;
    assert!(
        batch
            .iter()
            .all(|r| matches!(r, Err(Error::InvalidKey { .. }))),
        "{batch:?}"
    );
    assert!(matches!(
        cache.invalidate_tag("").await,
        Err(Error::InvalidKey { .. })
    ));
    let long = "x".repeat(stampede_guard::MAX_KEY_BYTES + 1);
    assert!(matches!(
        cache.invalidate_tag(&long).await,
        Err(Error::InvalidKey { .. })
    ));

    // Too many tags: refused, nothing written.
    let many: Vec<String> = (0..=MAX_TAGS).map(|i| format!("t{i}")).collect();
    let refused = cache
        .fetch("k", TTL, move |_lease| async move {
            Ok::<_, std::io::Error>(Computed::new(1u8).tags(many))
        })
        .await;
    assert!(
        matches!(refused, Err(Error::TooManyTags { tags, limit, .. }) if tags == MAX_TAGS + 1 && limit == MAX_TAGS),
        "{refused:?}"
    );
    assert_eq!(cache.get::<u8>("k").await.unwrap(), None);
    let too_many =
        cache.with_options(CallOptions::default().tags((0..=MAX_TAGS).map(|i| i.to_string())));
    assert!(matches!(
        too_many.get::<u8>("k").await,
        Err(Error::TooManyTags { .. })
    ));

    // Tags that look like keys or other namespaces' names are escaped into this namespace's
    // own epochs: invalidating them touches nothing else.
    let _ = other
        .with_options(CallOptions::default().tags(["t"]))
        .set("k", &9u8, TTL)
        .await
        .unwrap();
    for sneaky in ["}", "t}", "x}:other:{%t:t", "other:{%t:t}", "%c"] {
        assert_eq!(
            cache.invalidate_tag(sneaky).await.unwrap(),
            Written::Applied
        );
    }
    assert_eq!(other.get::<u8>("k").await.unwrap(), Some(9));
    let names: Vec<String> = server.conn().keys("bad:{%*").unwrap();
    assert_eq!(names.len(), 5, "{names:?}");
    assert!(
        names
            .iter()
            .all(|name| name.starts_with("bad:{%t:") && name.ends_with('}')),
        "{names:?}"
    );
}

#[tokio::test]
async fn the_embedded_store_honours_tags_and_clear_on_its_decoded_hits() {
    let cache = Cache::in_memory();
    let reader = Counted::new();
    reader.read(&cache, "a", &["t"]).await;
    reader.read(&cache, "b", &[]).await;
    // Decoded hits now.
    assert_eq!(reader.read(&cache, "a", &[]).await.1, Source::Hit);
    assert_eq!(reader.read(&cache, "b", &[]).await.1, Source::Hit);
    assert_eq!(cache.invalidate_tag("t").await.unwrap(), Written::Applied);
    assert_eq!(reader.read(&cache, "a", &[]).await.1, Source::Computed);
    assert_eq!(reader.read(&cache, "b", &[]).await.1, Source::Hit);
    assert_eq!(cache.clear().await.unwrap(), Written::Applied);
    assert_eq!(reader.read(&cache, "a", &[]).await.1, Source::Computed);
    assert_eq!(reader.read(&cache, "b", &[]).await.1, Source::Computed);
    assert_eq!(reader.read(&cache, "b", &[]).await.1, Source::Hit);
    assert_eq!(reader.computed(), 5);
}

/// Reads `key` through `cache` until its near tier serves it.
async fn until_near_hit(cache: &Cache, reader: &Counted, key: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let before = cache.stats().near_hits;
        reader.read(cache, key, &[]).await;
        if cache.stats().near_hits > before {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no near hit: {:?}",
            cache.stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn near(url: String, near: NearCacheOptions) -> Cache {
    Cache::builder()
        .redis_url(url)
        .namespace("near")
        .near_cache(near.max_staleness(MAX_STALENESS))
        .build()
        .await
        .expect("a cache with a near tier")
}

#[tokio::test]
async fn near_tiers_of_other_instances_stop_serving_after_a_tag_or_a_clear() {
    let server = RedisServer::start();
    // One tier hears Redis's reports (tracking, the default), one the crate's announcements.
    let tracking = near(server.url(), NearCacheOptions::new(1_000)).await;
    let announced = near(
        server.url(),
        NearCacheOptions::new(1_000).track_outside_writes(false),
    )
    .await;
    let writer = cache(&server, "near", CallOptions::default()).await;
    let reader = Counted::new();
    reader.read(&writer, "tagged", &["t"]).await;
    reader.read(&writer, "plain", &[]).await;
    for tier in [&tracking, &announced] {
        until_near_hit(tier, &reader, "tagged").await;
        until_near_hit(tier, &reader, "plain").await;
    }
    assert_eq!(reader.computed(), 2);

    // The guarantee: a read that starts `max_staleness` after the call returned serves no
    // invalidated value, from any tier.
    assert_eq!(writer.invalidate_tag("t").await.unwrap(), Written::Applied);
    tokio::time::sleep(MAX_STALENESS).await;
    for tier in [&tracking, &announced] {
        let near_hits = tier.stats().near_hits;
        let (value, source) = reader.read(tier, "tagged", &[]).await;
        assert_ne!(value, "tagged#1", "{source:?}");
        assert_eq!(tier.stats().near_hits, near_hits);
        // The untagged value stays a near hit: only that tag's epoch was dropped.
        until_near_hit(tier, &reader, "plain").await;
    }
    let computed = reader.computed();
    assert!(
        computed <= 4,
        "each tier computed the tagged value at most once: {computed}"
    );

    assert_eq!(writer.clear().await.unwrap(), Written::Applied);
    tokio::time::sleep(MAX_STALENESS).await;
    for tier in [&tracking, &announced] {
        let (value, _) = reader.read(tier, "plain", &[]).await;
        assert_ne!(value, "plain#2", "not the value from before the clear");
    }
    // Refilled, both serve near hits again.
    for tier in [&tracking, &announced] {
        until_near_hit(tier, &reader, "plain").await;
    }
}

#[tokio::test]
async fn on_a_cluster_tags_spread_over_slots_and_clear_reaches_every_master() {
    let cluster = RedisCluster::start();
    let cache = cluster_cache(&cluster, "cl", CallOptions::default()).await;
    let reader = Counted::new();
    let keys: Vec<String> = (0..30).map(|i| format!("key-{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        let tag = format!("tag-{}", i % 3);
        reader.read(&cache, key, &[tag.as_str()]).await;
    }
    // Each tag's epoch has its own hash tag: they are spread over the masters.
    let masters: std::collections::HashSet<usize> = (0..3)
        .map(|i| cluster.master_of(&format!("cl:{{%t:tag-{i}}}")))
        .collect();
    assert!(masters.len() > 1, "{masters:?}");
    for key in &keys {
        assert_eq!(reader.read(&cache, key, &[]).await.1, Source::Hit);
    }
    assert_eq!(
        cache.invalidate_tag("tag-1").await.unwrap(),
        Written::Applied
    );
    for (i, key) in keys.iter().enumerate() {
        let gone = cache.get::<String>(key).await.unwrap().is_none();
        assert_eq!(gone, i % 3 == 1, "{key}");
    }
    assert_eq!(cache.clear().await.unwrap(), Written::Applied);
    for key in &keys {
        assert_eq!(cache.get::<String>(key).await.unwrap(), None, "{key}");
    }
    assert_eq!(reader.computed(), 30);
}
