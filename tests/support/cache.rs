//! A `Cache` on a test server in one call: a new test needs a server, a cache and its options,
//! and nothing else. Needs `server` declared beside it.

use stampede_guard::{Cache, CallOptions};

use super::server::RedisServer;

/// What a test cache connects to: a test server, or a URL (all a child process has, or a proxy's
/// in front of a server, or one with other credentials).
pub trait Target {
    /// The `redis://` (or `rediss://`) URL to connect to.
    fn redis_url(&self) -> String;
}

impl Target for RedisServer {
    fn redis_url(&self) -> String {
        self.url()
    }
}

impl Target for str {
    fn redis_url(&self) -> String {
        self.to_owned()
    }
}

impl Target for String {
    fn redis_url(&self) -> String {
        self.clone()
    }
}

/// A `Cache` in `namespace` on `target`, with `options`.
pub async fn cache<T: Target + ?Sized>(target: &T, namespace: &str, options: CallOptions) -> Cache {
    Cache::builder()
        .redis_url(target.redis_url())
        .namespace(namespace)
        .options(options)
        .build()
        .await
        .expect("a cache on the test server")
}
