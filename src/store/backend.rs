//! Which backend a builder was given, and opening it: the one place that knows every kind of
//! store, so the builders above stay free of any one backend's types.
//!
//! Explained in the guide: `docs/configuration.md` (Connections).

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::redis::{near_channels, ConnectionOptions, Feed, FeedSink, RedisStore, Source};
use super::{MemoryLimits, MemoryStore, Store};
use crate::Error;

/// Which backend a builder was given, kept until `build()` opens it.
// Built once per cache or lock, so the size of a `redis::Client` (larger with the `tls` feature's
// TLS settings) costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Backend {
    /// The embedded store, with its limits.
    Memory(MemoryLimits),
    /// One Redis server, by URL (parsed when opened, so a bad URL is a build error).
    RedisUrl(String),
    /// One Redis server, through a client the user configured (TLS, credentials...).
    RedisClient(redis::Client),
    /// Seed node URLs of a Redis Cluster.
    RedisCluster(Vec<String>),
    /// The deterministic simulation's connection to its simulated server (`tests/sim/`).
    #[cfg(feature = "simulation")]
    Simulated(Arc<super::simulated::Connection>),
}

/// Where a near tier hears of changes: Redis's feed, or the simulated server's.
// Made once per cache and started at once: the Redis feed's size is worth no box.
#[allow(clippy::large_enum_variant)]
pub(crate) enum AnyFeed {
    /// A Redis server's or cluster's feed.
    Redis(Feed),
    /// The simulated server's feed (`tests/sim/`).
    #[cfg(feature = "simulation")]
    Simulated(super::simulated::Feed),
}

impl AnyFeed {
    /// Runs the feed in a background task until the sink is dropped (the cache with it).
    pub(crate) fn start(self, sink: Weak<dyn FeedSink>) {
        match self {
            AnyFeed::Redis(feed) => feed.start(sink),
            #[cfg(feature = "simulation")]
            AnyFeed::Simulated(feed) => feed.start(sink),
        }
    }
}

impl Backend {
    /// A name for `Debug` output; never the URL, which may carry a password.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Backend::Memory(_) => "memory",
            Backend::RedisUrl(_) | Backend::RedisClient(_) => "redis",
            Backend::RedisCluster(_) => "redis cluster",
            #[cfg(feature = "simulation")]
            Backend::Simulated(_) => "simulated",
        }
    }

    /// Opens the store. Redis, a single server or a cluster, connects lazily: this does not wait
    /// for it, and calls fail with a backend error until it answers.
    ///
    /// With `announce_to`, a single server's scripts announce every change of an entry to the
    /// near tiers of that namespace, whether or not this instance has a near tier itself: one
    /// instance built without it must not be the writer whose changes the others never hear of.
    /// It costs a `PUBLISH` per `set`, `invalidate` or replacing write (to a channel nobody may
    /// listen to) and an `EXISTS` inside the script of a fill.
    pub(crate) fn open(
        self,
        connection: &ConnectionOptions,
        announce_to: Option<&str>,
    ) -> Result<Arc<dyn Store>, Error> {
        let client = match self {
            Backend::Memory(limits) => return Ok(Arc::new(MemoryStore::new(limits))),
            #[cfg(feature = "simulation")]
            Backend::Simulated(store) => return Ok(store),
            Backend::RedisCluster(seeds) => {
                let mut store = RedisStore::connect_cluster(&seeds, connection)
                    .map_err(|e| Error::backend("connect", e))?;
                if let Some(namespace) = announce_to {
                    store = store.announcing(namespace);
                }
                return Ok(Arc::new(store));
            }
            Backend::RedisUrl(url) => parse_url(&url)?,
            Backend::RedisClient(client) => client,
        };
        let mut store =
            RedisStore::connect(client, connection).map_err(|e| Error::backend("connect", e))?;
        if let Some(namespace) = announce_to {
            store = store.announcing(namespace);
        }
        Ok(Arc::new(store))
    }

    /// Opens Redis (a single server or a cluster) whose scripts announce changed entries to the
    /// near tiers of `namespace`, and the feed (not started) that hears them, with heartbeats
    /// every `heartbeat`; with `tracked`, the feed also asks Redis to report every change of a
    /// key under those prefixes, whoever makes it (`CLIENT TRACKING`). The embedded store is refused: one process has no other instance to
    /// hear from, and [`Cache::in_memory`](crate::Cache::in_memory) already serves from memory.
    pub(crate) fn open_announcing(
        self,
        connection: &ConnectionOptions,
        namespace: &str,
        heartbeat: Duration,
        tracked: Option<Vec<String>>,
        announced: bool,
    ) -> Result<(Arc<dyn Store>, AnyFeed), Error> {
        let connect = |e| Error::backend("connect", e);
        #[cfg(feature = "simulation")]
        let tracks = tracked.is_some();
        let feed = |source, suffix: &str| {
            let (near_channel, heartbeat_prefix) = near_channels(namespace, suffix);
            AnyFeed::Redis(Feed::new(
                source,
                connection,
                near_channel,
                &heartbeat_prefix,
                heartbeat,
                tracked,
                announced,
            ))
        };
        let client = match self {
            Backend::Memory(_) => {
                return Err(Error::Config(
                    "the near cache is a tier in front of Redis (redis_url, redis_client or \
                     redis_cluster); the embedded store already holds its values in memory"
                        .to_owned(),
                ))
            }
            #[cfg(feature = "simulation")]
            Backend::Simulated(store) => {
                let Some(feed) = store.feed(namespace, heartbeat, tracks) else {
                    return Err(Error::Config(
                        "this simulated connection has no near-tier feed (Connection::with_feed)"
                            .to_owned(),
                    ));
                };
                return Ok((store, AnyFeed::Simulated(feed)));
            }
            Backend::RedisCluster(seeds) => {
                let store = RedisStore::connect_cluster(&seeds, connection)
                    .map_err(connect)?
                    .announcing(namespace);
                let source = Source::cluster(&seeds).map_err(|e| connect(e.into()))?;
                // A cluster has database 0 only: no channel suffix.
                return Ok((Arc::new(store), feed(source, "")));
            }
            Backend::RedisUrl(url) => parse_url(&url)?,
            Backend::RedisClient(client) => client,
        };
        let store = RedisStore::connect(client.clone(), connection)
            .map_err(connect)?
            .announcing(namespace);
        let source = Source::server(&client).map_err(|e| connect(e.into()))?;
        let feed = feed(source, store.channel_suffix());
        Ok((Arc::new(store), feed))
    }
}

/// The client of a Redis URL; a URL that does not parse is a configuration error.
fn parse_url(url: &str) -> Result<redis::Client, Error> {
    redis::Client::open(url).map_err(|e| {
        // The parse error is not quoted: it may repeat the URL, password included.
        Error::Config(format!("the Redis URL does not parse ({:?})", e.kind()))
    })
}
