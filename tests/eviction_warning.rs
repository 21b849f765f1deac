//! The warning, once per store, when the Redis server's eviction policy can evict lock keys; and
//! silence where it cannot, or where the server does not let us look. Its own test binary: the
//! tracing subscriber is process-wide, and other tests' servers would warn into it.

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod logs;
    pub mod server;
    pub use server::*;
}

use std::sync::OnceLock;
use std::time::Duration;

use support::logs::Captured;

use stampede_guard::{Cache, Lock};
use support::RedisServer;

const WARNING: &str = "Redis may evict this store's lock keys";
const CHECKED_SAFE: &str = "Redis eviction policy checked";
const REFUSED: &str = "CONFIG GET refused";

impl Captured {
    fn count(&self, needle: &str) -> usize {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .matches(needle)
            .count()
    }
}

fn captured_logs() -> &'static Captured {
    static LOGS: OnceLock<Captured> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Captured::default();
        let writer = logs.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(move || writer.clone())
            .init();
        logs
    })
}

/// Waits (up to 10 s) until `needle` has been logged `n` times in all.
async fn logged(logs: &Captured, needle: &str, n: usize) -> bool {
    for _ in 0..200 {
        if logs.count(needle) >= n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

async fn used(cache: &Cache) {
    for i in 0..10 {
        let v = cache
            .get_or_compute(
                &format!("m{i}"),
                Duration::from_secs(60),
                move || async move { Ok::<_, String>(i) },
            )
            .await
            .expect("the server works");
        assert_eq!(v, i);
    }
}

fn server(policy: &str, extra: &[&str], userinfo: &str) -> RedisServer {
    let mut args: Vec<String> = ["--maxmemory", "64mb", "--maxmemory-policy", policy]
        .map(String::from)
        .to_vec();
    args.extend(extra.iter().map(|a| a.to_string()));
    RedisServer::start_with(&args, userinfo)
}

/// One test, cases in sequence: the log is shared, so each case counts what it added.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_that_can_evict_lock_keys_is_warned_about_once_per_store_and_only_then() {
    let logs = captured_logs();

    // allkeys-lru with a limit: warned once per store, however many calls it makes.
    let evicting = server("allkeys-lru", &[], "");
    let cache = Cache::builder()
        .redis_url(evicting.url())
        .build()
        .await
        .unwrap();
    assert_eq!(
        logs.count(WARNING),
        0,
        "the check waits for the first answer"
    );
    used(&cache).await;
    assert!(
        logged(logs, WARNING, 1).await,
        "allkeys-lru is warned about"
    );
    used(&cache).await;
    let lock = Lock::builder("sync")
        .redis_url(evicting.url())
        .build()
        .await
        .unwrap();
    lock.acquire().await.unwrap().release().await.unwrap();
    assert!(
        logged(logs, WARNING, 2).await,
        "the lock's own store warns too"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(logs.count(WARNING), 2, "once per store, not once per call");
    let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).to_string();
    assert!(
        text.contains("allkeys-lru") && text.contains("67108864"),
        "{text}"
    );

    // noeviction: checked, and silent.
    let safe = server("noeviction", &[], "");
    let cache = Cache::builder()
        .redis_url(safe.url())
        .build()
        .await
        .unwrap();
    used(&cache).await;
    assert!(logged(logs, CHECKED_SAFE, 1).await, "the check ran");
    assert_eq!(logs.count(WARNING), 2, "noeviction is not warned about");

    // An ACL user without CONFIG, on an evicting server: refused, silent, and no error.
    let refused = server(
        "allkeys-lru",
        &[
            "--user", "app", "on", ">secret", "~*", "&*", "+@all", "-config",
        ],
        "app:secret@",
    );
    let cache = Cache::builder()
        .redis_url(refused.url())
        .build()
        .await
        .unwrap();
    used(&cache).await;
    assert!(
        logged(logs, REFUSED, 1).await,
        "the check ran and was refused"
    );
    assert_eq!(
        logs.count(WARNING),
        2,
        "a refused CONFIG is not warned about"
    );
    used(&cache).await;
}
