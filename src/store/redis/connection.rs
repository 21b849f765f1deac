//! How to reach Redis ([`ConnectionOptions`]), and the settings of each kind of connection made
//! from them: the data connection, the wake-up subscriber, the near tier's feed and the cluster
//! client all take their time-outs from here, so one setting bounds them all.
//!
//! Explained in the guide: `docs/configuration.md` (Connections).

use std::time::Duration;

use redis::aio::ConnectionManagerConfig;
use redis::cluster::ClusterClientBuilder;
use redis::AsyncConnectionConfig;

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
/// | [`response_timeout`](Self::response_timeout) | 5 s | one command's answer; a hung server becomes [`Error::Backend`](crate::Error::Backend) |
/// | [`reconnect_retries`](Self::reconnect_retries) | 2 | attempts after the first failed one, with a jittered exponential delay of at most 500 ms in between; a cluster keeps its own command retries (they also follow redirections during a failover) |
/// | [`coalesce_reads`](Self::coalesce_reads) | on | concurrent single-key reads of one cache go out as one `MGET` while another is out (a lone read is sent at once) |
///
/// While no connection can be made, each call fails with [`Error::Backend`](crate::Error::Backend), and each failure
/// costs `1 + reconnect_retries` attempts: the first call makes them itself; after a failure one
/// reconnection runs in the background, which the next call awaits or finds failed. With the
/// defaults a refused connection fails in about half a second; with `reconnect_retries(0)`, at
/// the first refused attempt. Timeouts above 24 hours (up to `Duration::MAX`) count as 24 hours.
/// A cache's circuit breaker ([`BreakerOptions`](crate::BreakerOptions)) cuts this short: after
/// a few failures in a row, or requests waiting a second with no answer, calls fail at once
/// without any attempt until its probe finds Redis answering.
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
    pub(crate) coalesce_reads: bool,
}

impl Default for ConnectionOptions {
    fn default() -> Self {
        ConnectionOptions {
            connect_timeout: Duration::from_secs(2),
            // Generous for a 64 MiB value on a busy server, short enough that a hung server
            // surfaces as an error rather than a hang.
            response_timeout: Duration::from_secs(5),
            reconnect_retries: 2,
            coalesce_reads: true,
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

    /// Whether concurrent single-key reads of one cache are coalesced (default on): a read that
    /// finds no other in flight is sent at once, by itself; reads that arrive while one is out
    /// wait for it and go out together as one `MGET`, so under load the server runs one
    /// command for many hits. Off: one command per read, as before (measured in
    /// `docs/performance.md`).
    ///
    /// ```
    /// let options = stampede_guard::ConnectionOptions::default().coalesce_reads(false);
    /// assert!(!options.get_coalesce_reads());
    /// ```
    pub fn coalesce_reads(mut self, coalesce: bool) -> Self {
        self.coalesce_reads = coalesce;
        self
    }

    /// Whether reads are coalesced.
    pub fn get_coalesce_reads(&self) -> bool {
        self.coalesce_reads
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

impl ConnectionOptions {
    /// The settings of a single server's reconnecting connections (the data connection and the
    /// wake-up subscriber).
    pub(crate) fn manager_config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            // Retries of one reconnection attempt; while they run, calls fail fast with an error.
            .set_number_of_retries(self.reconnect_retries)
            .set_max_delay(Duration::from_millis(500))
    }

    /// The settings of a connection that is made anew rather than resumed (the near tier's
    /// feed): only the time-outs, since its owner reconnects by itself.
    pub(crate) fn async_config(&self) -> AsyncConnectionConfig {
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
    }

    /// A Redis Cluster client reached through `seeds`. The cluster client keeps its own retry
    /// policy for commands (it also retries to follow redirections during a failover), so only
    /// the time-outs are ours.
    pub(crate) fn cluster_builder(&self, seeds: &[String]) -> ClusterClientBuilder {
        ClusterClientBuilder::new(seeds.iter().map(String::as_str))
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.response_timeout)
    }
}

/// `client` turned to RESP3, which push messages (wake-ups, the near tier's feed) need.
pub(crate) fn resp3(client: &redis::Client) -> redis::RedisResult<redis::Client> {
    let info = client.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP3);
    redis::Client::open(info.set_redis_settings(settings))
}
