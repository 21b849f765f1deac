//! A value written for one shape of a type and read as another (a rolling deploy that changed
//! the type) is a miss: logged, recomputed and overwritten, never decoded as garbage. On the
//! memory store and on a real redis-server.

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod server;
    pub use server::*;
}

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::Commands;
use stampede_guard::{Cache, Computed, Source};
use support::RedisServer;

const TTL: Duration = Duration::from_secs(300);

/// What deploy 1 caches.
mod deploy1 {
    #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
    pub struct Report {
        pub orders: u32,
        pub revenue_cents: u64,
    }
}

/// Deploy 2: the same fields, reordered. bincode is positional, so without the shape in the
/// envelope deploy 2 read `{ revenue_cents: 5, orders: 1000 }` from deploy 1's value.
mod deploy2 {
    #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
    pub struct Report {
        pub revenue_cents: u64,
        pub orders: u32,
    }
}

/// Deploy 1 and deploy 2 share `key` (on one cache, or on two caches of one server).
async fn reordered_fields_are_a_miss_then_overwritten(deploy_1: &Cache, deploy_2: &Cache) {
    let key = "2019-05";
    let computes = Arc::new(AtomicUsize::new(0));
    let written = deploy_1
        .get_or_compute(key, TTL, || async {
            Ok::<_, String>(deploy1::Report {
                orders: 5,
                revenue_cents: 1000,
            })
        })
        .await
        .unwrap();
    assert_eq!(written.orders, 5);

    // A plain `get` of deploy 2 finds nothing it can read.
    assert_eq!(deploy_2.get::<deploy2::Report>(key).await.unwrap(), None);

    // `get_or_compute` of deploy 2: a miss, computed once, written over deploy 1's value.
    let expected = deploy2::Report {
        revenue_cents: 1000,
        orders: 5,
    };
    for source in [Source::Computed, Source::Hit] {
        let counter = Arc::clone(&computes);
        let value = expected.clone();
        let fetched = deploy_2
            .fetch(key, TTL, move |_| async move {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(Computed::new(value))
            })
            .await
            .unwrap();
        assert_eq!((fetched.value, fetched.source), (expected.clone(), source));
    }
    assert_eq!(computes.load(Ordering::SeqCst), 1);

    // Now deploy 1 (still running during the roll-out) sees deploy 2's value as a miss in turn.
    assert_eq!(deploy_1.get::<deploy1::Report>(key).await.unwrap(), None);
    assert_eq!(
        deploy_2.get::<deploy2::Report>(key).await.unwrap(),
        Some(expected)
    );
}

#[tokio::test(start_paused = true)]
async fn a_reordered_struct_is_a_miss_on_the_memory_store() {
    let cache = Cache::in_memory();
    reordered_fields_are_a_miss_then_overwritten(&cache, &cache).await;
}

async fn redis_cache(server: &RedisServer) -> Cache {
    Cache::builder()
        .redis_url(server.url())
        .namespace("reports")
        .build()
        .await
        .expect("a cache on the test server")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reordered_struct_is_a_miss_on_redis() {
    let server = RedisServer::start();
    // Two caches, as the two deploys' processes would have.
    let (deploy_1, deploy_2) = (redis_cache(&server).await, redis_cache(&server).await);
    reordered_fields_are_a_miss_then_overwritten(&deploy_1, &deploy_2).await;
    // The value the server holds is deploy 2's.
    let stored: Vec<u8> = server.conn().get("reports:{2019-05}").unwrap();
    assert!(!stored.is_empty());
}

/// Values written before the shape was recorded (envelope format 1, the same bytes the previous
/// release wrote) are read as a miss once after the upgrade, recomputed and overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envelopes_of_the_previous_format_are_a_miss_once() {
    let server = RedisServer::start();
    let cache = redis_cache(&server).await;
    let mut admin = server.conn();
    // Format 1: magic, version 1, codec 1 (bincode), flags, fresh until, compute ms, fence,
    // then the bincode payload of the string "old".
    let mut old = b"SG\x01\x01\x00".to_vec();
    old.extend_from_slice(&u64::MAX.to_be_bytes());
    old.extend_from_slice(&7u32.to_be_bytes());
    old.extend_from_slice(&0u64.to_be_bytes());
    old.extend_from_slice(b"\x03old");
    let _: () = admin.set("reports:{2019-05}", &old).unwrap();

    assert_eq!(cache.get::<String>("2019-05").await.unwrap(), None);
    let computes = Arc::new(AtomicUsize::new(0));
    for _ in 0..2 {
        let counter = Arc::clone(&computes);
        let v = cache
            .get_or_compute("2019-05", TTL, move || async move {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>("new".to_string())
            })
            .await
            .unwrap();
        assert_eq!(v, "new");
    }
    assert_eq!(computes.load(Ordering::SeqCst), 1);
}

/// Accepts only values of 1000 and more: every placeholder the shape tracer tries is refused.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
struct AtLeast1000(u32);

impl<'de> serde::Deserialize<'de> for AtLeast1000 {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match u32::deserialize(d)? {
            n if n >= 1000 => Ok(AtLeast1000(n)),
            n => Err(serde::de::Error::custom(format!("{n} is below 1000"))),
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Tree {
    label: String,
    children: Vec<Tree>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
enum Event {
    Started,
    Moved(i32, i32),
    Renamed { from: String, to: String },
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Guarded {
    floor: AtLeast1000,
    tree: Tree,
    events: std::collections::BTreeMap<String, Vec<Event>>,
}

/// Computes `value` under `key` on `cache`, then reads it again: one computation, then a hit.
async fn computed_once_then_hit<T>(cache: &Cache, key: &str, value: T)
where
    T: serde::Serialize
        + serde::de::DeserializeOwned
        + Clone
        + PartialEq
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    for source in [Source::Computed, Source::Hit] {
        let v = value.clone();
        let fetched = cache
            .fetch(key, TTL, move |_| async move {
                Ok::<_, String>(Computed::new(v))
            })
            .await
            .unwrap();
        assert_eq!((&fetched.value, fetched.source), (&value, source), "{key}");
    }
    assert_eq!(cache.get::<T>(key).await.unwrap(), Some(value));
}

#[tokio::test(start_paused = true)]
async fn every_type_that_worked_keeps_working() {
    let cache = Cache::in_memory();
    computed_once_then_hit(&cache, "string", "text".to_string()).await;
    computed_once_then_hit(&cache, "bytes", vec![0u8, 1, 2]).await;
    computed_once_then_hit(&cache, "number", -7i64).await;
    computed_once_then_hit(&cache, "tuple", (1u8, "a".to_string(), Some(2.5f64))).await;
    let map: std::collections::HashMap<String, u32> = [("a".to_string(), 1)].into();
    computed_once_then_hit(&cache, "map", map).await;
    computed_once_then_hit(&cache, "enum", Event::Moved(1, -1)).await;
    let tree = Tree {
        label: "root".into(),
        children: vec![Tree {
            label: "leaf".into(),
            children: vec![],
        }],
    };
    let guarded = Guarded {
        floor: AtLeast1000(1234),
        tree,
        events: [("k".to_string(), vec![Event::Started])].into(),
    };
    computed_once_then_hit(&cache, "guarded", guarded).await;
    // Two types of one shape read each other's values (a `String` and a `Box<str>`).
    let _ = cache.set("same", &"one".to_string(), TTL).await.unwrap();
    assert_eq!(
        cache.get::<Box<str>>("same").await.unwrap().as_deref(),
        Some("one")
    );
}

/// A codec of JSON, which (unlike bincode) reads types that need `deserialize_any`.
#[derive(Debug, Clone, Copy)]
struct Json;

impl stampede_guard::Codec for Json {
    fn id(&self) -> u8 {
        201
    }
    fn encode<T: serde::Serialize>(
        &self,
        value: &T,
    ) -> Result<Vec<u8>, stampede_guard::CodecError> {
        Ok(serde_json::to_vec(value)?)
    }
    fn decode<T: serde::de::DeserializeOwned>(
        &self,
        bytes: &[u8],
    ) -> Result<T, stampede_guard::CodecError> {
        Ok(serde_json::from_slice(bytes)?)
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
enum Loose {
    Number(u64),
    Text(String),
}

#[tokio::test(start_paused = true)]
async fn types_that_need_deserialize_any_keep_working() {
    let cache = Cache::builder().codec(Json).build().await.unwrap();
    for (key, value) in [
        (
            "value",
            serde_json::json!({"orders": 5, "tags": ["a", null]}),
        ),
        ("null", serde_json::Value::Null),
    ] {
        for source in [Source::Computed, Source::Hit] {
            let v = value.clone();
            let fetched = cache
                .fetch(key, TTL, move |_| async move {
                    Ok::<_, String>(Computed::new(v))
                })
                .await
                .unwrap();
            assert_eq!((&fetched.value, fetched.source), (&value, source));
        }
    }
    for source in [Source::Computed, Source::Hit] {
        let fetched = cache
            .fetch("loose", TTL, |_| async {
                Ok::<_, String>(Computed::new(Loose::Text("t".into())))
            })
            .await
            .unwrap();
        assert_eq!(
            (fetched.value, fetched.source),
            (Loose::Text("t".into()), source)
        );
    }
}

/// A remembered failure is marked with the shape too: another type's caller computes its own
/// value rather than take the other's failure (whose computation may be the one that changed).
#[tokio::test(start_paused = true)]
async fn a_failure_remembered_for_another_shape_is_a_miss() {
    let cache = Cache::in_memory().with_options(
        stampede_guard::CallOptions::default().negative_ttl(Some(Duration::from_secs(60))),
    );
    let failed = cache
        .get_or_compute("2019-05", TTL, || async {
            Err::<deploy1::Report, _>("db down".to_string())
        })
        .await;
    assert!(
        matches!(failed, Err(stampede_guard::Error::Compute(_))),
        "{failed:?}"
    );
    // The same type: the remembered failure.
    let again = cache
        .get_or_compute("2019-05", TTL, || async {
            Ok::<_, String>(deploy1::Report {
                orders: 1,
                revenue_cents: 1,
            })
        })
        .await;
    assert!(
        matches!(&again, Err(stampede_guard::Error::RecentFailure { message, .. }) if message == "db down"),
        "{again:?}"
    );
    // Another shape: computed.
    let other = cache
        .get_or_compute("2019-05", TTL, || async {
            Ok::<_, String>(deploy2::Report {
                revenue_cents: 1000,
                orders: 5,
            })
        })
        .await
        .unwrap();
    assert_eq!(other.orders, 5);
}
