//! The near tier's invalidation feed: one dedicated RESP3 connection per cache, subscribed to the
//! namespace's near channel (where the scripts announce changed entries) and to this instance's
//! own heartbeat channel, which it publishes to and hears back from.
//!
//! Invariants the near tier builds its staleness bound on:
//! - Redis delivers the messages of one connection in the order the server published them,
//!   whatever their channel. So when a heartbeat published at local time `t0` comes back on
//!   connection `n`, every announcement the server published before it has been handed to the
//!   sink before it: "the stream was current at `t0`".
//! - A connection is never resumed: a new one gets a new number, announced with
//!   [`FeedSink::reset`] before it subscribes, so announcements lost in between cannot go unseen.
//!   Heartbeats are only counted for the connection they were sent on.
//! - Nothing here decides whether the stream is live: a failure is not detected, it simply stops
//!   the proofs (a black-holed socket fails nothing for seconds). The sink judges by the age of
//!   the last proof, on the local monotonic clock.
//!
//! Explained in the guide: `docs/near-cache.md`.

use std::sync::Weak;
use std::time::Duration;

use redis::{AsyncConnectionConfig, PushInfo, PushKind, Value};
use tokio::time::Instant;

use crate::connect::ConnectionOptions;

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
    /// A heartbeat sent on `connection` at `sent` came back: the stream was current at `sent`.
    fn proof(&self, connection: u64, sent: Instant);
    /// Called every heartbeat period: the sink's chance to notice that its proof lapsed.
    fn tick(&self);
}

/// A feed ready to start (see [`Feed::start`]).
pub(crate) struct Feed {
    client: redis::Client,
    connection: ConnectionOptions,
    near_channel: String,
    heartbeat_channel: String,
    period: Duration,
}

impl Feed {
    /// A feed of the near channel `near_channel` over `client`'s server (turned to RESP3 for
    /// push messages), with heartbeats every `period` on `heartbeat_prefix` + a fresh id.
    pub(crate) fn new(
        client: &redis::Client,
        connection: &ConnectionOptions,
        near_channel: String,
        heartbeat_prefix: &str,
        period: Duration,
    ) -> Result<Self, redis::RedisError> {
        let info = client.get_connection_info().clone();
        let resp3 = info
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3);
        let client = redis::Client::open(info.set_redis_settings(resp3))?;
        Ok(Feed {
            client,
            connection: connection.clone(),
            near_channel,
            heartbeat_channel: format!("{heartbeat_prefix}{}", uuid::Uuid::new_v4().simple()),
            // A zero period would spin; a millisecond is already far below any useful bound.
            period: period.max(Duration::from_millis(1)),
        })
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
        let mut warned = false;
        loop {
            number += 1;
            match sink.upgrade() {
                Some(sink) => sink.reset(number),
                None => return,
            }
            match self.serve(number, base, &sink, &mut warned).await {
                Err(e) if !warned => {
                    warned = true;
                    tracing::warn!(error = %e,
                        "near tier: its feed connection failed (it needs RESP3, Redis 6 or later); \
                         reads go to Redis until the feed is back");
                }
                Err(e) => tracing::debug!(error = %e, "near-tier feed still down; reconnecting"),
                Ok(()) => {}
            }
            // Between attempts, not in a tight loop while the server is down.
            tokio::time::sleep(self.period).await;
        }
    }

    /// One connection's life: connect, subscribe, heartbeat until a command fails.
    async fn serve(
        &self,
        number: u64,
        base: Instant,
        sink: &Weak<dyn FeedSink>,
        warned: &mut bool,
    ) -> redis::RedisResult<()> {
        let near_channel = self.near_channel.clone();
        let heartbeat_channel = self.heartbeat_channel.clone();
        let push_sink = Weak::clone(sink);
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connection.connect_timeout))
            .set_response_timeout(Some(self.connection.response_timeout))
            .set_push_sender(move |push: PushInfo| {
                if let Some(sink) = push_sink.upgrade() {
                    route(
                        &*sink,
                        &push,
                        &near_channel,
                        &heartbeat_channel,
                        number,
                        base,
                    );
                }
                Ok::<(), redis::aio::SendError>(())
            });
        let mut conn = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        conn.subscribe(&[self.near_channel.as_str(), self.heartbeat_channel.as_str()][..])
            .await?;
        match sink.upgrade() {
            Some(sink) => sink.subscribed(number),
            None => return Ok(()),
        }
        // Up again: the next outage deserves its own warning.
        *warned = false;
        let mut ticks = tokio::time::interval(self.period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match sink.upgrade() {
                Some(sink) => sink.tick(),
                None => return Ok(()),
            }
            let sent = Instant::now();
            let nanos = u64::try_from(sent.duration_since(base).as_nanos()).unwrap_or(u64::MAX);
            let _: i64 = redis::cmd("PUBLISH")
                .arg(&self.heartbeat_channel)
                .arg(format!("{number} {nanos}"))
                .query_async(&mut conn)
                .await?;
        }
    }
}

/// Hands one push message to the sink.
fn route(
    sink: &dyn FeedSink,
    push: &PushInfo,
    near_channel: &str,
    heartbeat_channel: &str,
    number: u64,
    base: Instant,
) {
    match push.kind {
        PushKind::Message => {
            let [Value::BulkString(channel), Value::BulkString(payload), ..] = push.data.as_slice()
            else {
                return;
            };
            let Ok(payload) = std::str::from_utf8(payload) else {
                return;
            };
            if channel.as_slice() == near_channel.as_bytes() {
                if let Some((fence, key)) = parse_announcement(payload) {
                    sink.invalidated(key, fence);
                }
            } else if channel.as_slice() == heartbeat_channel.as_bytes() {
                if let Some((sent_on, nanos)) = parse_heartbeat(payload) {
                    // Only this connection's own heartbeats prove it current.
                    if sent_on == number {
                        sink.proof(number, base + Duration::from_nanos(nanos));
                    }
                }
            }
        }
        // Messages may be lost from here on: drop everything now rather than at the reconnect.
        PushKind::Disconnection => sink.lost(number),
        _ => {}
    }
}

/// `"<fence> <value key>"`, as the scripts' `announce` writes it.
pub(crate) fn parse_announcement(payload: &str) -> Option<(u64, &str)> {
    let (fence, key) = payload.split_once(' ')?;
    Some((fence.parse().ok()?, key))
}

/// `"<connection number> <nanoseconds since the feed's base>"`.
fn parse_heartbeat(payload: &str) -> Option<(u64, u64)> {
    let (number, nanos) = payload.split_once(' ')?;
    Some((number.parse().ok()?, nanos.parse().ok()?))
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
        assert_eq!(parse_heartbeat("3 12345"), Some((3, 12345)));
        assert_eq!(parse_heartbeat("3"), None);
    }
}
