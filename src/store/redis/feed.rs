//! The near tier's invalidation feed: one dedicated RESP3 connection per cache (per master on a
//! Redis Cluster) that hears of changed entries and is subscribed to this instance's own heartbeat
//! channel, which it publishes to and hears back from. Changes are heard in one of two ways:
//! - with tracking (the default), Redis itself reports every change of a key under the
//!   namespace's value-key prefix, whoever makes it (`CLIENT TRACKING on BCAST PREFIX`: writes
//!   of other programs, `DEL`, expiry, eviction; a flush reports everything);
//! - without it (turned off, or refused by the server), the connection subscribes to the
//!   namespace's near channel, where the crate's scripts announce the entries they change.
//!   With tracking on, those announcements would only repeat what tracking reports, so the
//!   connection does not subscribe to them (and Redis does not send them), unless the tier holds
//!   copies while the backend is down (`announced`).
//!
//! Invariants the near tier builds its staleness bound on:
//! - Redis delivers the messages of one connection in the order the server published them,
//!   whatever their channel. So when a heartbeat published at local time `t0` comes back on
//!   connection `n`, every announcement the server published before it has been handed to the
//!   sink before it: "the stream was current at `t0`". Tracking's reports come on the same
//!   connection; in `BCAST` mode Redis queues them at the end of the event-loop iteration that
//!   made the change, before it sends any reply of that iteration. So a change whose reply
//!   left the server before the heartbeat arrived there was reported before the heartbeat came
//!   back; one made in the heartbeat's own iteration completed after `t0`, which the proof does
//!   not claim. A flush is reported at once.
//! - A connection is never resumed: a new one gets a new number, announced with
//!   [`FeedSink::reset`] before it subscribes, so announcements lost in between cannot go unseen.
//!   Heartbeats are only counted for the connection they were sent on.
//! - On a Redis Cluster each master runs the scripts of its own slots, so it orders their
//!   announcements, and `PUBLISH` reaches every node: one connection per master, each proven
//!   by its own heartbeats, makes the stream current at the oldest of the latest proofs. A
//!   master's announcement also arrives through the other masters' connections (the cluster
//!   bus); those copies only drop copies again, they prove nothing. A change of the set of
//!   masters (a failover, a master added) starts a new connection set, as a reconnection does.
//! - Nothing here decides whether the stream is live: a failure is not detected, it simply stops
//!   the proofs (a black-holed socket fails nothing for seconds). The sink judges by the age of
//!   the last proof, on the local monotonic clock.
//!
//! Explained in the guide: `docs/near-cache.md`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::{AsyncConnectionConfig, ConnectionAddr, PushInfo, PushKind, Value};
use tokio::time::Instant;

use super::connection::{resp3, ConnectionOptions};
use crate::error::BackendErrorKind;
use crate::stats::TrackingState;

/// What the feed tells the near tier. Called on the connection's reader task: keep it short.
pub(crate) trait FeedSink: Send + Sync + 'static {
    /// A new connection (number `connection`) is being made; nothing heard before counts any
    /// more and announcements may have been lost: drop every copy.
    fn reset(&self, connection: u64);
    /// Connection `connection` dropped: if it is still the current one, drop every copy now,
    /// rather than at the reconnection.
    fn lost(&self, connection: u64);
    /// The connection is subscribed: announcements published from now on reach the sink.
    fn subscribed(&self, connection: u64);
    /// An entry changed: `value_key` now holds the write of `fence` (or nothing).
    fn invalidated(&self, value_key: &str, fence: u64);
    /// Redis reports (tracking) that the key `name` changed, by anyone; it may be no value key
    /// (a lock, a fencing counter).
    fn changed(&self, name: &[u8]);
    /// Redis reports (tracking) that every key may have changed (`FLUSHDB`, `FLUSHALL`).
    fn flushed(&self);
    /// Whether connection `connection` has tracking: said before [`subscribed`](Self::subscribed).
    fn tracking_state(&self, connection: u64, state: TrackingState);
    /// A heartbeat sent on `connection` at `sent` came back: the stream was current at `sent`.
    fn proof(&self, connection: u64, sent: Instant);
    /// Called every heartbeat period: the sink's chance to notice that its proof lapsed.
    fn tick(&self);
}

/// A feed ready to start (see [`Feed::start`]).
pub(crate) struct Feed {
    source: Source,
    connection: ConnectionOptions,
    near_channel: String,
    heartbeat_channel: String,
    period: Duration,
    /// The value-key prefixes Redis is asked to report changes under (`CLIENT TRACKING`);
    /// `None`: the crate's announcements only.
    tracked: Option<Vec<String>>,
    /// Whether to hear the crate's announcements even where tracking works: a tier that holds
    /// copies while the backend is down drops them on the crate's own changes (a report cannot
    /// tell an invalidation from another instance's refill).
    announced: bool,
}

/// What the feed has said in the log since it started: once per outage, once for a refusal.
#[derive(Default)]
struct Warned {
    outage: bool,
    refused: bool,
}

/// Where announcements are heard. Made once per cache: the size of a client is worth no box.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Source {
    /// One server, which runs every script and so orders every announcement.
    Server(redis::Client),
    /// A Redis Cluster, through these seed nodes. Each master orders the announcements of its
    /// own slots' scripts, so the feed holds one connection per master and proves each of them
    /// current; the stream is current at the oldest of those proofs. The masters are found at
    /// every connection and checked at every heartbeat.
    Cluster(Vec<redis::Client>),
}

impl Source {
    /// `client`'s server.
    pub(crate) fn server(client: &redis::Client) -> Result<Self, redis::RedisError> {
        Ok(Source::Server(resp3(client)?))
    }

    /// A Redis Cluster reached through `seeds` (URLs).
    pub(crate) fn cluster(seeds: &[String]) -> Result<Self, redis::RedisError> {
        let seeds = seeds
            .iter()
            .map(|url| resp3(&redis::Client::open(url.as_str())?))
            .collect::<Result<_, _>>()?;
        Ok(Source::Cluster(seeds))
    }
}

impl Feed {
    /// A feed of the near channel `near_channel` over `source`, with heartbeats every `period`
    /// on `heartbeat_prefix` + a fresh id.
    pub(crate) fn new(
        source: Source,
        connection: &ConnectionOptions,
        near_channel: String,
        heartbeat_prefix: &str,
        period: Duration,
        tracked: Option<Vec<String>>,
        announced: bool,
    ) -> Self {
        Feed {
            source,
            connection: connection.clone(),
            near_channel,
            heartbeat_channel: format!("{heartbeat_prefix}{}", uuid::Uuid::new_v4().simple()),
            // A zero period would spin; a millisecond is already far below any useful bound.
            period: period.max(Duration::from_millis(1)),
            tracked,
            announced,
        }
    }

    /// Runs the feed in a background task until the sink is dropped (the cache with it).
    pub(crate) fn start(self, sink: Weak<dyn FeedSink>) {
        tokio::spawn(self.run(sink));
    }

    async fn run(self, sink: Weak<dyn FeedSink>) {
        // Times in heartbeats are nanoseconds since this instant, so a message carries its own
        // send time and no table of pending heartbeats is needed.
        let base = Instant::now();
        let mut number = 0u64;
        // Warn once per outage, not at every attempt: the cache still works (from Redis).
        let mut warned = Warned::default();
        loop {
            number += 1;
            match sink.upgrade() {
                Some(sink) => sink.reset(number),
                None => return,
            }
            match self.serve(number, base, &sink, &mut warned).await {
                Err(e) if !warned.outage => {
                    warned.outage = true;
                    // The RESP3 hint only where it can be the cause: not for an outage.
                    let hint = if super::classify(&e) == BackendErrorKind::Unreachable {
                        ""
                    } else {
                        " (it needs RESP3, Redis 6 or later)"
                    };
                    crate::log::throttled!(warn, error = %e,
                        "near tier: its feed connection failed{hint}; reconnecting. Until it is \
                         back its copies are not served as hits: reads go to Redis, and while \
                         Redis is unreachable copies are served as held within \
                         serve_while_down (when set)");
                }
                Err(e) => tracing::debug!(error = %e, "near-tier feed still down; reconnecting"),
                Ok(()) => {}
            }
            // Between attempts, not in a tight loop while the server is down.
            tokio::time::sleep(self.period).await;
        }
    }

    /// The settings of every connection of the feed.
    fn config(&self) -> AsyncConnectionConfig {
        self.connection.async_config()
    }

    /// The servers to listen to now: the server, or the cluster's masters, with the list of
    /// masters (`host`, `port`) they were made from.
    async fn servers(
        &self,
    ) -> redis::RedisResult<(Vec<redis::Client>, Option<Vec<(String, u16)>>)> {
        match &self.source {
            Source::Server(client) => Ok((vec![client.clone()], None)),
            Source::Cluster(seeds) => {
                let mut last_error = None;
                for seed in seeds {
                    let found = async {
                        let mut conn = seed
                            .get_multiplexed_async_connection_with_config(&self.config())
                            .await?;
                        let masters = masters(&mut conn).await?;
                        let clients = masters
                            .iter()
                            .map(|(host, port)| on(seed, host, *port))
                            .collect::<redis::RedisResult<Vec<_>>>()?;
                        Ok::<_, redis::RedisError>((clients, Some(masters)))
                    };
                    match found.await {
                        Ok(found) => return Ok(found),
                        Err(e) => last_error = Some(e),
                    }
                }
                Err(last_error.unwrap_or_else(|| {
                    redis::RedisError::from((redis::ErrorKind::Client, "no cluster seed node"))
                }))
            }
        }
    }

    /// Connects to every server (each master of a cluster), asks each for tracking and
    /// subscribes each to what it must hear; with the tracking state of the whole set (refused
    /// if any server refused it).
    async fn connect(
        &self,
        servers: &[redis::Client],
        number: u64,
        base: Instant,
        sink: &Weak<dyn FeedSink>,
        warned: &mut Warned,
    ) -> redis::RedisResult<(Vec<redis::aio::MultiplexedConnection>, TrackingState)> {
        let proofs = Arc::new(Proofs::new(servers.len()));
        let mut conns = Vec::with_capacity(servers.len());
        let mut state = match self.tracked {
            Some(_) => TrackingState::On,
            None => TrackingState::Off,
        };
        for (index, server) in servers.iter().enumerate() {
            let listener = Listener {
                sink: Weak::clone(sink),
                near_channel: self.near_channel.clone(),
                heartbeat_channel: self.heartbeat_channel.clone(),
                number,
                index,
                base,
                proofs: Arc::clone(&proofs),
            };
            let config = self.config().set_push_sender(move |push: PushInfo| {
                listener.route(&push);
                Ok::<(), redis::aio::SendError>(())
            });
            let mut conn = server
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            let tracks = self.track(&mut conn, &mut warned.refused).await?;
            if !tracks && state == TrackingState::On {
                state = TrackingState::Refused;
            }
            let heartbeats = self.heartbeat_channel.as_str();
            if tracks && !self.announced {
                conn.subscribe(heartbeats).await?;
            } else {
                conn.subscribe(&[self.near_channel.as_str(), heartbeats][..])
                    .await?;
            }
            conns.push(conn);
        }
        Ok((conns, state))
    }

    /// One connection's life (one per master on a cluster): connect, subscribe, heartbeat until
    /// a command fails or the cluster's masters change.
    async fn serve(
        &self,
        number: u64,
        base: Instant,
        sink: &Weak<dyn FeedSink>,
        warned: &mut Warned,
    ) -> redis::RedisResult<()> {
        let (servers, masters) = self.servers().await?;
        let (mut conns, state) = self.connect(&servers, number, base, sink, warned).await?;
        // Every master must agree on the set we listen to (the seed's view may have been stale).
        if !self.agree(masters.as_deref(), &mut conns).await? {
            return Ok(());
        }
        match sink.upgrade() {
            Some(sink) => {
                sink.tracking_state(number, state);
                sink.subscribed(number);
            }
            None => return Ok(()),
        }
        // Up again: the next outage deserves its own warning.
        warned.outage = false;
        let mut ticks = tokio::time::interval(self.period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match sink.upgrade() {
                Some(sink) => sink.tick(),
                None => return Ok(()),
            }
            let sent = Instant::now();
            // A master this feed does not listen to (a replica promoted while the old master
            // lives on, a master added) would write unheard: start again with the new set, and
            // drop every copy now. Checked before the heartbeats, so no proof of this round
            // outlives a change seen.
            if !self.agree(masters.as_deref(), &mut conns).await? {
                if let Some(sink) = sink.upgrade() {
                    sink.lost(number);
                }
                return Ok(());
            }
            let nanos = u64::try_from(sent.duration_since(base).as_nanos()).unwrap_or(u64::MAX);
            for (index, conn) in conns.iter_mut().enumerate() {
                let _: i64 = redis::cmd("PUBLISH")
                    .arg(&self.heartbeat_channel)
                    .arg(format!("{number} {index} {nanos}"))
                    .query_async(conn)
                    .await?;
            }
        }
    }
}

impl Feed {
    /// Asks the server on `conn` to report every change under the tracked prefixes; whether it
    /// does. A refusal (an ACL without `client`, a service that disables the command) leaves the
    /// feed on the crate's announcements, said once in the log (`warned`); an outage is an error.
    async fn track(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
        warned: &mut bool,
    ) -> redis::RedisResult<bool> {
        let Some(prefixes) = &self.tracked else {
            return Ok(false);
        };
        let mut cmd = redis::cmd("CLIENT");
        cmd.arg("TRACKING").arg("ON").arg("BCAST");
        for prefix in prefixes {
            cmd.arg("PREFIX").arg(prefix);
        }
        match cmd.query_async::<()>(conn).await {
            Ok(()) => Ok(true),
            Err(e)
                if matches!(
                    super::classify(&e),
                    BackendErrorKind::Unreachable | BackendErrorKind::Busy
                ) =>
            {
                Err(e)
            }
            Err(e) => {
                if !std::mem::replace(warned, true) {
                    crate::log::throttled!(warn, error = %e,
                        "near tier: the server refused CLIENT TRACKING, so changes made outside \
                         this crate (other programs' writes, DEL, expiry, eviction, FLUSHDB) are \
                         not seen: a copy of such a value may be served until its own \
                         fresh-until; the crate's own writes are still announced");
                }
                Ok(false)
            }
        }
    }

    /// Whether every connection's node (each a master of a cluster) names exactly `masters` as
    /// the cluster's masters; always for a single server (`None`). Asking every node, not one,
    /// means a node that lags behind a failover (or sits in a minority partition) is noticed.
    async fn agree(
        &self,
        masters: Option<&[(String, u16)]>,
        conns: &mut [redis::aio::MultiplexedConnection],
    ) -> redis::RedisResult<bool> {
        let Some(expected) = masters else {
            return Ok(true);
        };
        for conn in conns.iter_mut() {
            if self::masters(conn).await? != expected {
                tracing::debug!("near-tier feed: the cluster's masters changed; reconnecting");
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// The masters of the cluster `conn` belongs to, as it sees them (`CLUSTER SLOTS`), sorted.
async fn masters(
    conn: &mut redis::aio::MultiplexedConnection,
) -> redis::RedisResult<Vec<(String, u16)>> {
    let ranges: Vec<Value> = redis::cmd("CLUSTER").arg("SLOTS").query_async(conn).await?;
    let mut masters: Vec<(String, u16)> = ranges
        .iter()
        .filter_map(|range| {
            let Value::Array(fields) = range else {
                return None;
            };
            let Some(Value::Array(master)) = fields.get(2) else {
                return None;
            };
            let host = match master.first() {
                Some(Value::BulkString(host)) => String::from_utf8_lossy(host).into_owned(),
                Some(Value::SimpleString(host)) => host.clone(),
                _ => return None,
            };
            let Some(Value::Int(port)) = master.get(1) else {
                return None;
            };
            Some((host, u16::try_from(*port).ok()?))
        })
        .collect();
    masters.sort();
    masters.dedup();
    if masters.is_empty() {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "CLUSTER SLOTS named no master",
        )));
    }
    Ok(masters)
}

/// `seed`'s settings (TLS, credentials, RESP3) for the node at `host:port`. An empty host is
/// Redis's way of saying "the address you asked me on".
fn on(seed: &redis::Client, host: &str, port: u16) -> redis::RedisResult<redis::Client> {
    let info = seed.get_connection_info().clone();
    let mut addr = info.addr().clone();
    match &mut addr {
        ConnectionAddr::Tcp(h, p)
        | ConnectionAddr::TcpTls {
            host: h, port: p, ..
        } => {
            if !host.is_empty() {
                *h = host.to_owned();
            }
            *p = port;
        }
        _ => {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "a cluster seed must be a TCP address",
            )))
        }
    }
    redis::Client::open(info.set_addr(addr))
}

/// The latest proof of each connection of one feed connection set, in nanoseconds since the
/// feed's base (0: none yet).
struct Proofs(Box<[AtomicU64]>);

impl Proofs {
    fn new(connections: usize) -> Self {
        Proofs((0..connections).map(|_| AtomicU64::new(0)).collect())
    }

    /// Records that connection `index` was current at `nanos`; returns when every connection
    /// was last proven current, the oldest of their proofs, once each has one.
    fn record(&self, index: usize, nanos: u64) -> Option<u64> {
        self.0.get(index)?.fetch_max(nanos, Ordering::AcqRel);
        let oldest = self.0.iter().map(|p| p.load(Ordering::Acquire)).min()?;
        (oldest > 0).then_some(oldest)
    }
}

/// What one connection's push messages go to.
struct Listener {
    sink: Weak<dyn FeedSink>,
    near_channel: String,
    heartbeat_channel: String,
    number: u64,
    index: usize,
    base: Instant,
    proofs: Arc<Proofs>,
}

impl Listener {
    /// Hands one push message to the sink. Called on the connection's reader task.
    fn route(&self, push: &PushInfo) {
        let Some(sink) = self.sink.upgrade() else {
            return;
        };
        match push.kind {
            PushKind::Message => {
                let [Value::BulkString(channel), Value::BulkString(payload), ..] =
                    push.data.as_slice()
                else {
                    return;
                };
                let Ok(payload) = std::str::from_utf8(payload) else {
                    return;
                };
                if channel.as_slice() == self.near_channel.as_bytes() {
                    if let Some((fence, key)) = parse_announcement(payload) {
                        sink.invalidated(key, fence);
                    }
                } else if channel.as_slice() == self.heartbeat_channel.as_bytes() {
                    // Only a heartbeat sent on this very connection proves it current (on a
                    // cluster, each heartbeat also reaches the other masters' connections).
                    if let Some((number, index, nanos)) = parse_heartbeat(payload) {
                        if number == self.number && index == self.index {
                            if let Some(oldest) = self.proofs.record(index, nanos) {
                                sink.proof(number, self.base + Duration::from_nanos(oldest));
                            }
                        }
                    }
                }
            }
            // Tracking's report: `[names]`, or null for a flush. A shape not understood
            // drops everything, which is always safe.
            PushKind::Invalidate => match push.data.first() {
                Some(Value::Array(names)) => {
                    for name in names {
                        match name {
                            Value::BulkString(name) => sink.changed(name),
                            Value::SimpleString(name) => sink.changed(name.as_bytes()),
                            _ => sink.flushed(),
                        }
                    }
                }
                _ => sink.flushed(),
            },
            // Messages may be lost from here on: drop everything now rather than at the
            // reconnection.
            PushKind::Disconnection => sink.lost(self.number),
            _ => {}
        }
    }
}

/// `"<fence> <value key>"`, as the scripts' `announce` writes it.
pub(crate) fn parse_announcement(payload: &str) -> Option<(u64, &str)> {
    let (fence, key) = payload.split_once(' ')?;
    Some((fence.parse().ok()?, key))
}

/// `"<connection number> <index of the connection in its set> <nanoseconds since the feed's
/// base>"`.
fn parse_heartbeat(payload: &str) -> Option<(u64, usize, u64)> {
    let mut parts = payload.split(' ');
    let heartbeat = (
        parts.next()?.parse().ok()?,
        parts.next()?.parse().ok()?,
        parts.next()?.parse().ok()?,
    );
    parts.next().is_none().then_some(heartbeat)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_and_heartbeats_parse_and_garbage_does_not() {
        assert_eq!(
            parse_announcement("1700000000123456 reports:{2019 05}"),
            Some((1_700_000_000_123_456, "reports:{2019 05}"))
        );
        assert_eq!(parse_announcement("1.7e+15 k"), None);
        assert_eq!(parse_announcement("nospace"), None);
        assert_eq!(parse_heartbeat("3 1 12345"), Some((3, 1, 12345)));
        assert_eq!(parse_heartbeat("3 12345"), None);
        assert_eq!(parse_heartbeat("3 1 2 3"), None);
    }
}
