//! Security properties against real redis-server processes: password and ACL logins, ACL key
//! patterns that confine a cache to its namespace, passwords kept out of every `Debug`, `Display`,
//! error and log line, scripts that touch only the keys they are given, and the size limits.
//! (TLS is in `tests/tls.rs`, built with `--features tls`.)

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod cache;
    pub mod logs;
    pub mod server;
    pub use {cache::*, server::*};
}

use std::sync::OnceLock;
use std::time::Duration;

use support::logs::Captured;

use stampede_guard::leader::Leader;
use stampede_guard::{
    BreakerOptions, Cache, CallOptions, Error, Lock, OnBackendError, MAX_KEY_BYTES, MAX_VALUE_BYTES,
};
use support::{free_port, RedisServer};

const PASSWORD: &str = "pw-9f3b7c1e-never-printed";
const WRONG_PASSWORD: &str = "wrong-4d2a8e-never-printed";
const TTL: Duration = Duration::from_secs(60);

fn requirepass_server() -> RedisServer {
    RedisServer::start_with(
        &["--requirepass".into(), PASSWORD.into()],
        &format!(":{PASSWORD}@"),
    )
}

fn quick() -> CallOptions {
    CallOptions::default()
        .lease(Duration::from_millis(500))
        .wait_timeout(Duration::from_secs(5))
}

/// Everything a user can see of an error: its message, its debug form and its sources.
fn everything_about<E: std::error::Error>(e: &E) -> String {
    let mut all = format!("{e} {e:?}");
    let mut source = e.source();
    while let Some(s) = source {
        all.push_str(&format!(" | {s} {s:?}"));
        source = s.source();
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requirepass_works_and_a_missing_or_wrong_password_is_a_typed_error() {
    let server = requirepass_server();
    let cache = support::cache(&server.url(), "reports", quick()).await;
    let value: String = cache
        .get_or_compute("2019-05", TTL, || async { Ok::<_, String>("ok".into()) })
        .await
        .expect("computed through the password-protected server");
    assert_eq!(value, "ok");
    assert_eq!(
        cache.get::<String>("2019-05").await.unwrap().as_deref(),
        Some("ok")
    );
    let guard = cache.lock("sync").unwrap().acquire().await.unwrap();
    guard.release().await.unwrap();

    let anonymous = format!("redis://127.0.0.1:{}/0", server.port());
    let wrong = format!("redis://:{WRONG_PASSWORD}@127.0.0.1:{}/0", server.port());
    for url in [anonymous, wrong] {
        let cache = support::cache(&url, "reports", quick()).await;
        let result = cache
            .get_or_compute("2019-06", TTL, || async {
                Ok::<String, String>("no".into())
            })
            .await;
        let Err(e) = result else {
            panic!("a login without the right password must fail");
        };
        assert!(e.is_backend(), "{e:?}");
        assert!(!everything_about(&e).contains(WRONG_PASSWORD), "{e:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_works_and_its_key_patterns_confine_the_cache_to_its_namespace() {
    // alice may touch only keys and channels under `reports:`; every key and channel a cache in
    // namespace `reports` uses (in plain commands and inside scripts) must fall under it.
    let server = RedisServer::start_with(
        &[
            "--user",
            "alice",
            "on",
            &format!(">{PASSWORD}"),
            "~reports:*",
            "&reports:*",
            "+@all",
        ]
        .map(String::from),
        &format!("alice:{PASSWORD}@"),
    );
    let url = server.url();
    let holder = support::cache(&url, "reports", quick()).await;
    let waiter = support::cache(&url, "reports", quick()).await;
    let computing = tokio::spawn(async move {
        holder
            .get_or_compute("2019-05", TTL, || async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok::<_, String>("from alice".to_string())
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Waits for the holder (subscribing to the wake-up channel), then reads its value.
    let waited: String = waiter
        .get_or_compute("2019-05", TTL, || async {
            Ok::<_, String>("not me".into())
        })
        .await
        .unwrap();
    assert_eq!(waited, "from alice");
    assert_eq!(computing.await.unwrap().unwrap(), "from alice");
    let _ = waiter
        .set("2019-06", &"set".to_string(), TTL)
        .await
        .unwrap();
    let _ = waiter.invalidate("2019-06").await.unwrap();
    let guard = waiter.lock("sync").unwrap().acquire().await.unwrap();
    assert!(guard.extend().await.unwrap());
    guard.release().await.unwrap();

    // The same login in another namespace is refused by the server: the patterns are real.
    let outside = support::cache(&url, "other", quick()).await;
    let refused = outside
        .get_or_compute("2019-05", TTL, || async {
            Ok::<String, String>("x".into())
        })
        .await;
    assert!(matches!(&refused, Err(e) if e.is_backend()), "{refused:?}");
}

fn captured_logs() -> &'static Captured {
    static LOGS: OnceLock<Captured> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Captured::default();
        let writer = logs.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(move || writer.clone())
            .init();
        logs
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_never_show_in_debug_display_errors_or_logs() {
    let logs = captured_logs();
    let server = requirepass_server();
    let good = server.url();
    let wrong = format!("redis://:{WRONG_PASSWORD}@127.0.0.1:{}/0", server.port());
    let unreachable = format!("redis://:{PASSWORD}@127.0.0.1:{}/0", free_port());
    let unparsable = format!("redis://:{PASSWORD}@127.0.0.1:not-a-port/0");
    let mut seen = Vec::new();

    // Builders, caches and locks, as a user would print them.
    let builder = Cache::builder()
        .redis_url(good.as_str())
        .namespace("reports");
    seen.push(format!("{builder:?}"));
    let cache = builder.build().await.unwrap();
    seen.push(format!("{cache:?} {:?}", cache.lock("sync").unwrap()));
    let lock_builder = Lock::builder("sync").redis_url(good.as_str());
    seen.push(format!("{lock_builder:?}"));
    seen.push(format!("{:?}", lock_builder.build().await.unwrap()));

    // Errors: a wrong password, an unreachable server, a URL that does not parse.
    for url in [&wrong, &unreachable] {
        let cache = support::cache(url, "reports", quick()).await;
        let e = cache
            .get_or_compute("k", TTL, || async { Ok::<_, String>(1u8) })
            .await
            .unwrap_err();
        assert!(e.is_backend(), "{e:?}");
        seen.push(everything_about(&e));
        let e = cache.lock("sync").unwrap().acquire().await.unwrap_err();
        seen.push(everything_about(&e));
    }
    let e = Cache::builder()
        .redis_url(unparsable.as_str())
        .build()
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    seen.push(everything_about(&e));

    // A wrong password is a refusal: surfaced whatever the fallback (issue 26), still without
    // the password.
    let refused = support::cache(
        &wrong,
        "reports",
        quick().on_backend_error(OnBackendError::ComputeUncached),
    )
    .await;
    let e = refused
        .get_or_compute("k", TTL, || async { Ok::<_, String>(7u8) })
        .await
        .unwrap_err();
    assert!(e.is_refused(), "{e:?}");
    seen.push(everything_about(&e));

    // Logs: the fallback (for an unreachable server, whose URL holds the password) and the
    // leader's standby loop log the backend's errors.
    let fallback = support::cache(
        &unreachable,
        "reports",
        quick().on_backend_error(OnBackendError::ComputeUncached),
    )
    .await;
    let value = fallback
        .get_or_compute("k", TTL, || async { Ok::<_, String>(7u8) })
        .await
        .unwrap();
    assert_eq!(value, 7);
    let lock = Lock::builder("sync")
        .redis_url(unreachable.as_str())
        .build()
        .await
        .unwrap();
    Leader::new(lock, Duration::from_millis(10))
        .run(
            |_| async { Ok::<(), String>(()) },
            tokio::time::sleep(Duration::from_secs(3)),
        )
        .await
        .unwrap();

    let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        logged.contains("backend unavailable; computing without the cache")
            && logged.contains("standby: cannot reach the lock"),
        "the logs were captured: {logged}"
    );
    seen.push(logged);
    for text in &seen {
        for secret in [PASSWORD, WRONG_PASSWORD] {
            assert!(!text.contains(secret), "a password leaked into: {text}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_keys_and_values_are_refused_on_redis_at_the_documented_limits() {
    let server = RedisServer::start();
    // A 64 MiB value takes longer than the breaker's default stall bound (500 ms) to send on a
    // debug build: as its docs say, a cache storing values that large sets `stall` above their
    // transfer time.
    let cache = Cache::builder()
        .redis_url(server.url())
        .namespace("reports")
        .options(quick())
        .breaker(BreakerOptions::default().stall(Duration::from_secs(30)))
        .build()
        .await
        .unwrap();
    let mut conn = server.conn();

    // Keys: MAX_KEY_BYTES bytes of two-byte characters work (escaped to three times as many);
    // one byte more is refused before anything reaches Redis.
    let longest = "é".repeat(MAX_KEY_BYTES / 2);
    assert_eq!(longest.len(), MAX_KEY_BYTES);
    let got: String = cache
        .get_or_compute(&longest, TTL, || async { Ok::<_, String>("long".into()) })
        .await
        .unwrap();
    assert_eq!(got, "long");
    assert_eq!(
        cache.get::<String>(&longest).await.unwrap().as_deref(),
        Some("long")
    );
    let keys_before: usize = redis::cmd("DBSIZE").query(&mut conn).unwrap();
    let too_long = format!("{longest}x");
    let refused = cache
        .get_or_compute(&too_long, TTL, || async {
            Ok::<String, String>("no".into())
        })
        .await;
    assert!(
        matches!(refused, Err(Error::InvalidKey { .. })),
        "{refused:?}"
    );
    assert!(matches!(
        cache.get::<String>(&too_long).await,
        Err(Error::InvalidKey { .. })
    ));
    assert!(matches!(
        cache.set(&too_long, &1u8, TTL).await,
        Err(Error::InvalidKey { .. })
    ));
    assert!(matches!(
        cache.invalidate(&too_long).await,
        Err(Error::InvalidKey { .. })
    ));
    assert!(matches!(
        cache.lock(&too_long),
        Err(Error::InvalidKey { .. })
    ));
    let keys_after: usize = redis::cmd("DBSIZE").query(&mut conn).unwrap();
    assert_eq!(keys_before, keys_after, "an oversize key reached Redis");

    // Values: a payload of exactly MAX_VALUE_BYTES is stored and read back; one byte more is
    // refused with a message naming the limit, and neither a value nor a lock is left behind.
    // (A String encodes as a 5-byte length prefix for this size, then its bytes.)
    let at_limit = "v".repeat(MAX_VALUE_BYTES - 5);
    let _ = cache.set("big", &at_limit, TTL).await.unwrap();
    let back: String = cache.get("big").await.unwrap().expect("the value is there");
    assert_eq!(back.len(), at_limit.len());
    drop((at_limit, back));
    let over = "v".repeat(MAX_VALUE_BYTES - 4);
    let e = cache.set("bigger", &over, TTL).await.unwrap_err();
    assert!(
        matches!(e, Error::ValueTooLarge { size, limit } if size == MAX_VALUE_BYTES + 1 && limit == MAX_VALUE_BYTES),
        "{e:?}"
    );
    assert!(e.to_string().contains(&MAX_VALUE_BYTES.to_string()), "{e}");
    let e = cache
        .get_or_compute("bigger", TTL, move || async move { Ok::<_, String>(over) })
        .await
        .unwrap_err();
    assert!(matches!(e, Error::ValueTooLarge { .. }), "{e:?}");
    let left: Vec<String> = redis::cmd("KEYS")
        .arg("reports:{bigger}*")
        .query(&mut conn)
        .unwrap();
    assert!(
        left.iter().all(|k| k.ends_with("_fence")),
        "only the fencing counter may remain: {left:?}"
    );
}

/// The Lua scripts must take every key they touch from KEYS (so Redis Cluster routes them and
/// ACL key patterns apply); data, tokens and channel names come through ARGV.
#[test]
fn every_key_a_script_touches_comes_from_keys() {
    // The prelude, and every script's file beside its typed call.
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/store/redis/scripts");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("the scripts' folder")
        .map(|entry| entry.expect("a script's file").path())
        .collect();
    files.sort();
    files.push(format!("{dir}.rs").into());
    assert!(files.len() > 10, "the scripts' files: {files:?}");
    let source: String = files
        .iter()
        .map(|path| std::fs::read_to_string(path).expect("a script's source"))
        .collect();
    let source = source.as_str();
    let mut calls = 0;
    for (at, _) in source.match_indices("redis.") {
        let rest = &source[at..];
        let Some(args) = rest
            .strip_prefix("redis.call(")
            .or_else(|| rest.strip_prefix("redis.pcall("))
        else {
            continue;
        };
        calls += 1;
        let args = &args[..args.find(')').expect("a closed call")];
        let mut parts = args.split(',').map(str::trim);
        let command = parts
            .next()
            .unwrap()
            .trim_matches(['\'', '"'])
            .to_uppercase();
        let first = parts.next().unwrap_or("");
        match command.as_str() {
            // No key.
            "TIME" => {}
            // A channel, not a key: it must still come from the caller's arguments.
            // (`channel` is the parameter of `announce`, whose callers are checked below.)
            "PUBLISH" => assert!(
                first.starts_with("ARGV[") || first == "channel",
                "PUBLISH to {first}"
            ),
            // `fence`, `key`, `value` and `lock` are the helpers' parameters; their callers are
            // checked below.
            _ => assert!(
                first.starts_with("KEYS[") || ["fence", "key", "value", "lock"].contains(&first),
                "{command} touches {first}, not a key from KEYS"
            ),
        }
    }
    assert!(calls >= 20, "the scan found the scripts' calls ({calls})");
    let mut helper_calls = 0;
    for helper in [
        "bump_fence(",
        "set_expiring(",
        "keep_at_least(",
        "set_keeping(",
    ] {
        for (at, _) in source.match_indices(helper) {
            let arg = source[at + helper.len()..].trim_start();
            // The definition itself (`local function helper(key, ...)`) names the parameter.
            let defined = source[..at].ends_with("function ");
            assert!(
                defined
                    || arg.starts_with("KEYS[")
                    || arg.starts_with("fence,")
                    || arg.starts_with("key,")
                    || arg.starts_with("lock,"),
                "{helper} called with {}",
                &arg[..20.min(arg.len())]
            );
            helper_calls += usize::from(!defined);
        }
    }
    assert!(
        helper_calls >= 10,
        "the scan found the helpers' calls ({helper_calls})"
    );
    // The per-entry helpers that single-key and batch scripts share: their key parameters from
    // KEYS (`read_or_lock(value, lock, fence, ...)`, `invalidate(value, fence, ...)`), the rest
    // (tokens, durations, channels) from ARGV.
    let mut entry_helper_calls = 0;
    for (helper, keys) in [("read_or_lock(", 3), ("invalidate(", 2)] {
        for (at, _) in source.match_indices(helper) {
            if source[..at].ends_with("function ") {
                continue;
            }
            let args = &source[at + helper.len()..];
            let args: Vec<&str> = args[..args.find('\n').expect("one line")]
                .split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .collect();
            for (i, arg) in args.iter().enumerate() {
                let from = if i < keys { "KEYS[" } else { "ARGV[" };
                assert!(arg.starts_with(from), "{helper} argument {i} is {arg}");
            }
            entry_helper_calls += 1;
        }
    }
    assert!(
        entry_helper_calls >= 4,
        "the scan found the entry helpers' calls ({entry_helper_calls})"
    );
    // `announce(channel, fence, key)`: the channel from ARGV, the key it names from KEYS (or,
    // inside the `invalidate` helper, its parameters, whose callers are checked above).
    let mut announces = 0;
    for (at, _) in source.match_indices("announce(") {
        if source[..at].ends_with("function ") {
            continue;
        }
        let args = &source[at + "announce(".len()..];
        let args: Vec<&str> = args[..args.find('\n').expect("one line")]
            .split(',')
            .map(str::trim)
            .collect();
        assert!(
            args[0].starts_with("ARGV[") || args[0] == "near_channel",
            "announce on {}",
            args[0]
        );
        let key = args.last().expect("a key").trim_end_matches(')');
        assert!(
            key.starts_with("KEYS[") || key == "value",
            "announce names {key}"
        );
        announces += 1;
    }
    assert!(
        announces >= 3,
        "the scan found the announcements ({announces})"
    );
}
