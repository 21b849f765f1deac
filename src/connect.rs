//! Which backend a builder was given, how to reach it ([`ConnectionOptions`]), and opening it.
//!
//! Explained in the guide: `docs/configuration.md` (Connections).

use std::sync::Arc;
use std::time::Duration;

use crate::store::feed::Feed;
use crate::store::redis::{near_channels, RedisStore};
use crate::store::{MemoryLimits, MemoryStore, Store};
use crate::Error;

/// The longest timeout passed on to the Redis client: longer ones (up to `Duration::MAX`) are
/// taken whole and saturate here, once, so the client's own arithmetic never overflows.
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// How a cache or a lock talks to Redis: the time-outs and the reconnection attempts. Given to
/// [`CacheBuilder::connection`](crate::CacheBuilder::connection),
/// [`LockBuilder::connection`](crate::LockBuilder::connection) and
/// [`RedlockBuilder::connection`](crate::RedlockBuilder::connection); used for a single server,
/// for each Redlock node and (the time-outs) for every node of a Redis Cluster.
///
/// | setting | default | what it bounds |
/// |---|---|---|
/// | [`connect_timeout`](Self::connect_timeout) | 2 s | one attempt to open a connection (TCP, TLS, login) |
/// | [`response_timeout`](Self::response_timeout) | 5 s | one command's answer; a hung server becomes [`Error::Backend`] |
/// | [`reconnect_retries`](Self::reconnect_retries) | 2 | attempts after the first failed one, with a jittered exponential delay of at most 500 ms in between; a cluster keeps its own command retries (they also follow redirections during a failover) |
///
/// While no connection can be made, each call fails with [`Error::Backend`], and each failure
/// costs `1 + reconnect_retries` attempts: the first call makes them itself; after a failure one
/// reconnection runs in the background, which the next call awaits or finds failed. With the
/// defaults a refused connection fails in about half a second; with `reconnect_retries(0)`, at
/// the first refused attempt. Timeouts above 24 hours (up to `Duration::MAX`) count as 24 hours.
///
/// ```
/// use stampede_guard::{Cache, ConnectionOptions};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), stampede_guard::Error> {
/// let connection = ConnectionOptions::default()
///     .connect_timeout(Duration::from_millis(250))
///     .response_timeout(Duration::from_secs(1))
///     .reconnect_retries(0); // fail fast: one attempt per call while Redis is down
/// assert_eq!(connection.get_reconnect_retries(), 0);
/// let cache = Cache::builder().connection(connection).build().await?; // .redis_url(..) for Redis
/// # let _ = cache;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[must_use]
pub struct ConnectionOptions {
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) reconnect_retries: usize,
}

impl Default for ConnectionOptions {
    fn default() -> Self {
        ConnectionOptions {
            connect_timeout: Duration::from_secs(2),
            // Generous for a 64 MiB value on a busy server, short enough that a hung server
            // surfaces as an error rather than a hang.
            response_timeout: Duration::from_secs(5),
            reconnect_retries: 2,
        }
    }
}

impl ConnectionOptions {
    /// How long one attempt to open a connection may take (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout.min(MAX_TIMEOUT);
        self
    }

    /// How long one command may wait for its answer (default 5 s). Keep it above the time your
    /// largest value takes to transfer.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout.min(MAX_TIMEOUT);
        self
    }

    /// How many more attempts to connect after a failed one, before the call that needed the
    /// connection fails (default 2; 0 means one attempt).
    pub fn reconnect_retries(mut self, retries: usize) -> Self {
        self.reconnect_retries = retries;
        self
    }

    /// The connect timeout in force.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let options = stampede_guard::ConnectionOptions::default();
    /// assert_eq!(options.get_connect_timeout(), Duration::from_secs(2));
    /// ```
    pub fn get_connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The response timeout in force.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let options = stampede_guard::ConnectionOptions::default();
    /// assert_eq!(options.get_response_timeout(), Duration::from_secs(5));
    /// ```
    pub fn get_response_timeout(&self) -> Duration {
        self.response_timeout
    }

    /// The number of reconnection retries in force.
    ///
    /// ```
    /// let options = stampede_guard::ConnectionOptions::default();
    /// assert_eq!(options.get_reconnect_retries(), 2);
    /// ```
    pub fn get_reconnect_retries(&self) -> usize {
        self.reconnect_retries
    }
}

// Built once per cache or lock, so the size of a `redis::Client` (larger with the `tls` feature's
// TLS settings) costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Backend {
    Memory(MemoryLimits),
    RedisUrl(String),
    RedisClient(redis::Client),
    /// Seed node URLs of a Redis Cluster.
    RedisCluster(Vec<String>),
}

impl Backend {
    /// A name for `Debug` output; never the URL, which may carry a password.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Backend::Memory(_) => "memory",
            Backend::RedisUrl(_) | Backend::RedisClient(_) => "redis",
            Backend::RedisCluster(_) => "redis cluster",
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
    /// every `heartbeat`. The embedded store is refused: one process has no other instance to
    /// hear from, and [`Cache::in_memory`](crate::Cache::in_memory) already serves from memory.
    pub(crate) fn open_announcing(
        self,
        connection: &ConnectionOptions,
        namespace: &str,
        heartbeat: Duration,
    ) -> Result<(Arc<dyn Store>, Feed), Error> {
        let connect = |e| Error::backend("connect", e);
        let client = match self {
            Backend::Memory(_) => {
                return Err(Error::Config(
                    "the near cache is a tier in front of Redis (redis_url, redis_client or \
                     redis_cluster); the embedded store already holds its values in memory"
                        .to_owned(),
                ))
            }
            Backend::RedisCluster(seeds) => {
                // A cluster has database 0 only: no channel suffix.
                let (near_channel, heartbeat_prefix) = near_channels(namespace, "");
                let store = RedisStore::connect_cluster(&seeds, connection)
                    .map_err(connect)?
                    .announcing(namespace);
                let feed = Feed::cluster(
                    &seeds,
                    connection,
                    near_channel,
                    &heartbeat_prefix,
                    heartbeat,
                )
                .map_err(|e| connect(e.into()))?;
                return Ok((Arc::new(store), feed));
            }
            Backend::RedisUrl(url) => parse_url(&url)?,
            Backend::RedisClient(client) => client,
        };
        let store = RedisStore::connect(client.clone(), connection)
            .map_err(connect)?
            .announcing(namespace);
        let (near_channel, heartbeat_prefix) = near_channels(namespace, store.channel_suffix());
        let feed = Feed::new(
            &client,
            connection,
            near_channel,
            &heartbeat_prefix,
            heartbeat,
        )
        .map_err(|e| connect(e.into()))?;
        Ok((Arc::new(store), feed))
    }
}

fn parse_url(url: &str) -> Result<redis::Client, Error> {
    redis::Client::open(url).map_err(|e| {
        // The parse error is not quoted: it may repeat the URL, password included.
        Error::Config(format!("the Redis URL does not parse ({:?})", e.kind()))
    })
}
