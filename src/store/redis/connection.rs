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
/// | [`hold_epoch`](Self::hold_epoch) | on | a hit on one server reads its value alone, the namespace's epoch held under `CLIENT TRACKING`; off behind a sharding proxy |
/// | [`wait_for_replicas`](Self::wait_for_replicas) | off | a granted lock, a renewal and a fencing bump count only once that many replicas acknowledged them (`WAIT`) |
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
    pub(crate) hold_epoch: bool,
    /// Lock and fencing writes wait for this many replicas (`None`: off).
    pub(crate) wait_for_replicas: Option<ReplicaAcks>,
}

/// How many replicas must acknowledge a lock or fencing write, and how long the master waits
/// for them ([`ConnectionOptions::wait_for_replicas`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaAcks {
    /// At least 1: zero turns the option off.
    pub(crate) replicas: usize,
    /// At least 1 ms (`WAIT` reads 0 as "for ever") and at most [`MAX_TIMEOUT`].
    pub(crate) timeout: Duration,
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
            hold_epoch: true,
            wait_for_replicas: None,
        }
    }
}

impl ConnectionOptions {
    crate::options::setters! {
        /// How long one attempt to open a connection may take (default 2 s).
        connect_timeout: Duration = connect_timeout.min(MAX_TIMEOUT);

        /// How long one command may wait for its answer (default 5 s). Keep it above the time your
        /// largest value takes to transfer.
        response_timeout: Duration = response_timeout.min(MAX_TIMEOUT);

        /// How many more attempts to connect after a failed one, before the call that needed the
        /// connection fails (default 2; 0 means one attempt).
        reconnect_retries: usize;

        /// Whether concurrent single-key reads of one cache are coalesced (default on): a read that
        /// finds no other in flight is sent at once, by itself; reads that arrive while one is out
        /// wait for it and go out together as one `MGET`, so under load the server runs one command
        /// for many hits. Off: one command per read, as before (measured in `docs/performance.md`).
        ///
        /// ```
        /// let options = stampede_guard::ConnectionOptions::default().coalesce_reads(false);
        /// assert!(!options.get_coalesce_reads());
        /// ```
        coalesce_reads: bool;

        /// Whether a cache on one server holds its namespace's epoch in process (default on):
        /// every read needs the epoch (a value born before the last `clear` is no value), and
        /// held under Redis's `CLIENT TRACKING` on a connection of its own it is not read again
        /// until Redis says it changed, so a hit reads one key. That rests on one server writing
        /// the invalidation before the reply of any read it runs after the change. Turn it off
        /// where one address spreads keys over several shards behind a proxy (a multi-shard
        /// Redis Enterprise or Redis Cloud database): there the epoch's shard sends the
        /// invalidation and another answers the read, and nothing orders the two. Off, every
        /// read asks for the epoch beside the value. A Redis Cluster never holds it.
        ///
        /// ```
        /// let options = stampede_guard::ConnectionOptions::default().hold_epoch(false);
        /// assert!(!options.get_hold_epoch());
        /// ```
        hold_epoch: bool;
    }

    /// Makes lock writes failover-safe, as far as Redis replication can (off by default): every
    /// lock acquisition that grants, every lease renewal and every fencing-counter bump is
    /// followed by `WAIT replicas timeout` on the same connection, and counts only if at least
    /// `replicas` replicas acknowledged it. A granted acquisition that falls short is released
    /// at once and fails with [`Error::Backend`](crate::Error::Backend) of kind
    /// [`TooFewReplicas`](crate::BackendErrorKind::TooFewReplicas) (a cache treats it as any
    /// backend error, by its [`OnBackendError`](crate::OnBackendError)); a renewal that falls
    /// short does not move the lease on (the heartbeat retries); releases and value writes
    /// never wait. Applies to a cache's per-key locks, [`Lock`](crate::Lock),
    /// [`Leader`](crate::leader::Leader) and, per node, [`Redlock`](crate::Redlock) (a node counts
    /// toward the majority only once its own replicas acknowledged). `replicas` 0 turns it
    /// off; the timeout counts at least 1 ms (`WAIT 0` would block for ever) and at most
    /// 24 hours, and is added to [`response_timeout`](Self::response_timeout) for these
    /// writes.
    ///
    /// What it buys and what it does not (Redis' own words: `WAIT` does not make Redis strongly
    /// consistent): a failover that promotes a replica that acknowledged keeps the lock, but a
    /// failover may still promote one that did not, and a write acknowledged by every replica
    /// is lost if they all fail together. The writes go over a connection of their own,
    /// because `WAIT` holds the connection it is sent on until it returns; releases go over it
    /// too (without a `WAIT`), so a release is never read before the acquisition it undoes, and
    /// its requests do not count toward the breaker's stall bound. Explained in
    /// `docs/cluster-and-redlock.md` (Failover-safe locks).
    ///
    /// ```
    /// use std::time::Duration;
    /// let options = stampede_guard::ConnectionOptions::default()
    ///     .wait_for_replicas(1, Duration::from_millis(100));
    /// assert_eq!(
    ///     options.get_wait_for_replicas(),
    ///     Some((1, Duration::from_millis(100)))
    /// );
    /// let off = options.wait_for_replicas(0, Duration::from_millis(100));
    /// assert_eq!(off.get_wait_for_replicas(), None);
    /// ```
    pub fn wait_for_replicas(mut self, replicas: usize, timeout: Duration) -> Self {
        self.wait_for_replicas = (replicas > 0).then(|| ReplicaAcks {
            replicas,
            timeout: timeout.clamp(Duration::from_millis(1), MAX_TIMEOUT),
        });
        self
    }

    /// The replicas lock writes wait for and the longest wait, or `None` when they do not wait
    /// (the default).
    ///
    /// ```
    /// let options = stampede_guard::ConnectionOptions::default();
    /// assert_eq!(options.get_wait_for_replicas(), None);
    /// ```
    pub fn get_wait_for_replicas(&self) -> Option<(usize, Duration)> {
        self.wait_for_replicas
            .map(|acks| (acks.replicas, acks.timeout))
    }

    /// Whether reads are coalesced.
    pub fn get_coalesce_reads(&self) -> bool {
        self.coalesce_reads
    }

    /// Whether a cache on one server holds its namespace's epoch in process
    /// ([`hold_epoch`](Self::hold_epoch)).
    pub fn get_hold_epoch(&self) -> bool {
        self.hold_epoch
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

    /// The settings of the connection that carries the writes that wait for replicas: as
    /// [`manager_config`](Self::manager_config), with the answer awaited `WAIT`'s timeout
    /// longer, so a `WAIT` that runs its course is answered rather than cut off (cut off, the
    /// script's own answer would be lost with it).
    pub(crate) fn waited_manager_config(&self, acks: ReplicaAcks) -> ConnectionManagerConfig {
        self.manager_config()
            .set_response_timeout(Some(self.response_timeout.saturating_add(acks.timeout)))
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

    /// [`cluster_builder`](Self::cluster_builder) for the writes that wait for replicas (see
    /// [`waited_manager_config`](Self::waited_manager_config)).
    pub(crate) fn waited_cluster_builder(
        &self,
        seeds: &[String],
        acks: ReplicaAcks,
    ) -> ClusterClientBuilder {
        self.cluster_builder(seeds)
            .response_timeout(self.response_timeout.saturating_add(acks.timeout))
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
