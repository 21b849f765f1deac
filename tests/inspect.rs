//! `Cache::inspect` against real redis-servers: a held lock (its holder's fencing token and
//! lease left, on one server and over Redlock), a stale value (its age and windows), a value a tag invalidated (seen from an
//! instance that never saw the tag), a near copy (held, since when), a missing key and bytes
//! that are not ours; and `web::inspector`'s JSON over a real socket, the key redacted unless
//! asked.

#[cfg(feature = "axum")]
mod http_client;
/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod cache;
    pub mod server;
    pub use {cache::*, server::*};
}

use std::time::Duration;

use redis::Commands;
use stampede_guard::{Cache, CallOptions, Computed, NearCacheOptions, Standing};
use support::{cache, RedisServer};
use tokio::sync::{oneshot, Notify};

const TTL: Duration = Duration::from_secs(300);
/// How long a test waits for something that should happen at once (generous: a loaded machine).
const PATIENCE: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_computation_shows_its_lock_holder_token_and_lease_left() {
    let server = RedisServer::start();
    let lease = Duration::from_secs(10);
    let computing = cache(&server, "inspect", CallOptions::default().lease(lease)).await;
    let on_call = cache(&server, "inspect", CallOptions::default()).await;
    shows_the_running_computation(computing, &on_call, lease).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_redlock_the_holder_is_the_one_a_majority_of_the_lock_nodes_holds() {
    let values = RedisServer::start();
    let lock_nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = lock_nodes.iter().map(RedisServer::url).collect();
    let lease = Duration::from_secs(10);
    let redlocked = |options: CallOptions| {
        Cache::builder()
            .redis_url(values.url())
            .redlock(urls.clone())
            .namespace("inspect")
            .options(options)
            .build()
    };
    let computing = redlocked(CallOptions::default().lease(lease))
        .await
        .unwrap();
    let on_call = redlocked(CallOptions::default()).await.unwrap();
    shows_the_running_computation(computing, &on_call, lease).await;
}

/// Starts a computation of `report` on `computing` (under `lease`) and holds it: `on_call`
/// sees its lock's holder with its token and lease left, then, once it ends, the lock free
/// and the value it wrote under that token.
async fn shows_the_running_computation(computing: Cache, on_call: &Cache, lease: Duration) {
    let (token_tx, token_rx) = oneshot::channel();
    let done = std::sync::Arc::new(Notify::new());
    let finish = done.clone();
    let call = tokio::spawn(async move {
        computing
            .fetch("report", TTL, move |lease| async move {
                let _ = token_tx.send(lease.fencing_token());
                finish.notified().await;
                Ok::<_, std::io::Error>(Computed::new(7u32))
            })
            .await
    });
    let token = token_rx.await.unwrap().expect("computed under the lock");

    let seen = on_call.inspect("report").await.unwrap();
    let holder = seen.lock.expect("the computation holds the lock");
    assert_eq!(holder.fencing_token, Some(token));
    assert_eq!(seen.fence, Some(token));
    let left = holder.lease_left.expect("a lease expires");
    assert!(left > Duration::ZERO && left <= lease, "{left:?}");
    assert_eq!(seen.value, None, "nothing stored yet");

    done.notify_one();
    assert_eq!(call.await.unwrap().unwrap().value, 7);
    let seen = on_call.inspect("report").await.unwrap();
    assert_eq!(seen.lock, None, "released with the write");
    let value = seen.value.expect("written");
    assert_eq!((value.state, value.fence), (Standing::Fresh, token));
    assert!(!value.remembered_failure && !value.invalidated);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_value_shows_its_age_and_what_is_left_of_each_window() {
    let server = RedisServer::start();
    let stale_for = Duration::from_secs(60);
    let fail_safe_for = Duration::from_secs(600);
    let options = CallOptions::default()
        .stale_for(stale_for)
        .fail_safe_for(fail_safe_for);
    let c = cache(&server, "inspect", options).await;
    let ttl = Duration::from_millis(200);
    let _ = c.set("report", &7u32, ttl).await.unwrap();
    let fresh = c.inspect("report").await.unwrap().value.expect("stored");
    assert_eq!(fresh.state, Standing::Fresh);
    assert!(fresh.fresh_left > Duration::ZERO && fresh.fresh_left <= ttl);

    let waited = Duration::from_millis(500);
    tokio::time::sleep(waited).await;
    let stale = c.inspect("report").await.unwrap().value.expect("stored");
    assert_eq!(stale.state, Standing::Stale);
    assert_eq!(stale.fresh_left, Duration::ZERO);
    // Within a second of the expected: the server's clock and ours agree that closely.
    let stale_left = stale_for + ttl - waited;
    assert!(
        stale.stale_left <= stale_left && stale.stale_left + Duration::from_secs(1) > stale_left,
        "{stale:?}"
    );
    assert_eq!(stale.fail_safe_left, stale.stale_left + fail_safe_for);
    let age = stale.age.expect("births are the server's clock on Redis");
    assert!(
        age >= waited - Duration::from_millis(50) && age < Duration::from_secs(10),
        "{age:?}"
    );

    // A handle with a shorter stale window judges the same value past it: kept for the
    // fail-safe only.
    let short = c.with_options(
        CallOptions::default()
            .stale_for(Duration::from_millis(100))
            .fail_safe_for(fail_safe_for),
    );
    let kept = short
        .inspect("report")
        .await
        .unwrap()
        .value
        .expect("stored");
    assert_eq!(
        (kept.state, kept.stale_left),
        (Standing::FailSafe, Duration::ZERO)
    );
    assert!(kept.fail_safe_left > Duration::ZERO);
}

/// Writes 7 under `key`, tagged `tag`.
async fn set_tagged(cache: &Cache, key: &str, tag: &str) {
    let _ = cache.tagged([tag]).set(key, &7u32, TTL).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_a_tag_invalidated_is_shown_invalidated_on_an_instance_that_never_saw_the_tag() {
    let server = RedisServer::start();
    let writer = cache(&server, "inspect", CallOptions::default()).await;
    set_tagged(&writer, "summary:42", "tenant:42").await;
    let on_call = cache(&server, "inspect", CallOptions::default()).await;
    let before = on_call.inspect("summary:42").await.unwrap();
    let value = before.value.expect("stored");
    assert_eq!(value.tags, ["tenant:42"]);
    assert!(!value.invalidated);
    assert_eq!(value.state, Standing::Fresh);

    assert!(writer
        .invalidate_tag("tenant:42")
        .await
        .unwrap()
        .is_applied());
    let after = on_call.inspect("summary:42").await.unwrap();
    let value = after.value.expect("still stored: invalidation is by epoch");
    assert!(value.invalidated);
    assert_eq!(value.state, Standing::Invalidated);
    // And the inspection told the truth: a read computes over it.
    assert_eq!(on_call.get::<u32>("summary:42").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_near_tier_copy_is_shown_with_how_long_it_has_been_held() {
    let server = RedisServer::start();
    let near = Cache::builder()
        .redis_url(server.url())
        .namespace("inspect")
        .near_cache(NearCacheOptions::new(1_000).max_staleness(Duration::from_millis(300)))
        .build()
        .await
        .unwrap();
    let plain = cache(&server, "inspect", CallOptions::default()).await;
    let _ = plain.set("report", &7u32, TTL).await.unwrap();

    // Read until a read is answered by the near tier: the copy is in and servable.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while near.stats().near_hits == 0 {
        let _: u32 = near
            .get_or_compute("report", TTL, || async { Ok::<_, std::io::Error>(0) })
            .await
            .unwrap();
        assert!(tokio::time::Instant::now() < deadline, "no near hit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held = Duration::from_millis(200);
    tokio::time::sleep(held).await;
    let seen = near.inspect("report").await.unwrap();
    let copy = seen.near.expect("the near tier holds a copy");
    assert!(copy.servable);
    assert_eq!(copy.fence, seen.value.expect("stored").fence);
    assert!(
        copy.held_for >= held && copy.held_for < PATIENCE,
        "{copy:?}"
    );
    assert_eq!(
        plain.inspect("report").await.unwrap().near,
        None,
        "no near tier"
    );

    // This instance's own write drops its copy at once.
    let _ = near.set("report", &8u32, TTL).await.unwrap();
    assert_eq!(near.inspect("report").await.unwrap().near, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_key_shows_nothing_and_foreign_bytes_say_why() {
    let server = RedisServer::start();
    let c = cache(&server, "inspect", CallOptions::default()).await;
    let seen = c.inspect("never-written").await.unwrap();
    assert_eq!(
        (
            seen.value,
            seen.unreadable,
            seen.lock,
            seen.fence,
            seen.near
        ),
        (None, None, None, None, None)
    );

    let mut conn = server.conn();
    let _: () = conn.set("inspect:{other}", "not an envelope").unwrap();
    let seen = c.inspect("other").await.unwrap();
    assert_eq!(seen.value, None);
    assert!(seen.unreadable.is_some(), "{seen:?}");

    let refused = c.inspect("").await.unwrap_err();
    assert!(
        matches!(refused, stampede_guard::Error::InvalidKey { .. }),
        "{refused}"
    );
}

#[cfg(feature = "axum")]
mod route {
    use super::*;
    use stampede_guard::{web, Inspection};

    /// Serves the inspector under `/admin/cache` on a free loopback port.
    async fn serve(cache: Cache) -> String {
        let app: axum::Router = axum::Router::new().nest("/admin/cache", web::inspector(cache));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_route_answers_json_with_the_key_and_tags_redacted_unless_asked() {
        let server = RedisServer::start();
        let c = cache(&server, "inspect", CallOptions::default()).await;
        set_tagged(&c, "user:42", "tenant:42").await;
        let addr = serve(c).await;

        let response = http_client::get(&addr, "/admin/cache/user:42").await;
        assert_eq!(response.status, 200, "{response:?}");
        assert_eq!(response.header("content-type"), Some("application/json"));
        assert_eq!(response.header("cache-control"), Some("no-store"));
        let body = &response.body;
        assert!(
            !body.contains("user:") && !body.contains("tenant:"),
            "{body}"
        );
        let json = response.json();
        assert_eq!(json["key"], serde_json::Value::Null);
        assert_eq!(json["key_hash"], Inspection::hash_of("user:42"));
        assert_eq!(json["value"]["state"], "fresh");
        assert_eq!(json["value"]["tags"][0], Inspection::hash_of("tenant:42"));
        assert_eq!(json["lock"], serde_json::Value::Null);

        let shown = http_client::get(&addr, "/admin/cache/user:42?show_keys=true").await;
        let json = shown.json();
        assert_eq!(json["key"], "user:42");
        assert_eq!(json["value"]["tags"][0], "tenant:42");

        let too_long = format!(
            "/admin/cache/{}",
            "k".repeat(stampede_guard::MAX_KEY_BYTES + 1)
        );
        assert_eq!(http_client::get(&addr, &too_long).await.status, 400);
    }
}
