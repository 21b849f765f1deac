//! The simulated server's near-tier feed: what `store/redis/feed.rs` is to Redis, over the
//! simulation's network. Each instance's feed has a connection of its own; the server reports
//! every change of a value or an epoch to each subscribed feed (as `CLIENT TRACKING` in `BCAST`
//! mode does), and a heartbeat the feed sends comes back behind every report the server made
//! before it ran the heartbeat: the proof the near tier builds its staleness bound on.
//!
//! The invariants are Redis's (see `store/redis/feed.rs`), kept by the network: one
//! connection delivers in order (a report lost on the way, or one that does not come within the
//! response time-out, ends the connection, and the next one starts with `reset`: no report
//! can go unseen while copies are served); a frozen server runs no heartbeat, so no proof
//! comes; a restarted server knows no subscription, and the next heartbeat says so.
//!
//! Not reported, unlike Redis: a value the memory store evicts or lets expire by itself. No
//! copy outlives its value's own expiry (a copy is never served past its fresh-until), and
//! the checker counts no eviction as a change; the write that fills the key again is reported.
//! An expiry another program shortened (`PEXPIRE`) is reported when it falls due
//! (`Server::expire_due`): a copy could outlive that one.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::{Applied, Network, Server};
use crate::stats::TrackingState;
use crate::store::redis::FeedSink;
use crate::wire::key::EntryKeys;

/// What the server sends a subscribed feed.
#[derive(Debug, Clone)]
pub(super) enum Message {
    /// A change the server made (a value or an epoch).
    Change(Applied),
    /// The feed's heartbeat, sent at this instant, ran on the server.
    Proof(Instant),
}

/// A message on its way to a feed: when it arrives (`false`: lost with its connection).
pub(super) type InFlight = (Pin<Box<dyn Future<Output = bool> + Send>>, Message);

/// One subscribed feed, as the server knows it.
pub(super) struct Subscription {
    pub(super) id: u64,
    pub(super) conn: u64,
    pub(super) network: Arc<dyn Network>,
    pub(super) to_feed: mpsc::UnboundedSender<InFlight>,
}

impl Subscription {
    /// Sends `message` now: its travel is drawn now, so the connection keeps the server's order.
    pub(super) fn send(&self, message: Message) {
        let arrives = self.network.reply(self.conn);
        // A feed gone (its receiver dropped) is unsubscribed: the server forgets it.
        let _ = self.to_feed.send((arrives, message));
    }
}

/// A simulated instance's feed, ready to start (see [`Feed::start`]).
pub(crate) struct Feed {
    server: Arc<Server>,
    network: Arc<dyn Network>,
    conn: u64,
    /// A heartbeat or a report that takes longer ends the connection, as a real client's
    /// response time-out does.
    timeout: Duration,
    period: Duration,
    /// The namespace whose value keys the reports name (the server's changes carry user keys).
    namespace: String,
    tracking: TrackingState,
}

impl Feed {
    /// The feed of network connection `conn`, giving it up after `timeout` without an answer,
    /// with heartbeats every `period`; `tracked`: the near tier is told tracking is on
    /// (reports are the same either way: every change, whoever made it).
    pub(super) fn new(
        connection: &super::Connection,
        (conn, timeout): (u64, Duration),
        namespace: &str,
        period: Duration,
        tracked: bool,
    ) -> Self {
        Feed {
            server: Arc::clone(&connection.server),
            network: Arc::clone(&connection.network),
            conn,
            timeout,
            period: period.max(Duration::from_millis(1)),
            namespace: namespace.to_owned(),
            tracking: if tracked {
                TrackingState::On
            } else {
                TrackingState::Off
            },
        }
    }

    /// Runs the feed in a background task until the sink is dropped (the cache with it).
    pub(crate) fn start(self, sink: Weak<dyn FeedSink>) {
        crate::time::spawn(self.run(sink));
    }

    async fn run(self, sink: Weak<dyn FeedSink>) {
        let mut number = 0u64;
        loop {
            number += 1;
            match sink.upgrade() {
                Some(sink) => sink.reset(number),
                None => return,
            }
            self.serve(number, &sink).await;
            // Between attempts, as the Redis feed waits.
            crate::time::sleep(self.period).await;
        }
    }

    /// One connection's life: subscribe, then heartbeat until a heartbeat or a report is lost.
    async fn serve(&self, number: u64, sink: &Weak<dyn FeedSink>) {
        let Some((id, reports)) = self.subscribe().await else {
            return;
        };
        let (lost, mut heard_lost) = oneshot::channel();
        let delivery = Delivery {
            sink: Weak::clone(sink),
            number,
            namespace: self.namespace.clone(),
            timeout: self.timeout,
        };
        // Aborted when this connection ends: its reports stop with it.
        let delivering = AbortOnDrop(crate::time::spawn(delivery.run(reports, lost)));
        match sink.upgrade() {
            Some(sink) => {
                sink.tracking_state(number, self.tracking);
                sink.subscribed(number);
            }
            None => return,
        }
        let mut ticks = crate::time::interval(self.period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Biased: the simulation's runtime must not draw which branch goes first.
            tokio::select! {
                biased;
                _ = &mut heard_lost => break,
                _ = ticks.tick() => {
                    match sink.upgrade() {
                        Some(sink) => sink.tick(),
                        None => break,
                    }
                    if !self.heartbeat(id).await {
                        break;
                    }
                }
            }
        }
        drop(delivering);
    }

    /// Subscribes on the server, within the response time-out: the subscription and where
    /// its messages arrive.
    async fn subscribe(&self) -> Option<(u64, mpsc::UnboundedReceiver<InFlight>)> {
        let exchange = async {
            if !self.network.request(self.conn).await {
                return None;
            }
            let (id, reports) = self.server.subscribe(self.conn, Arc::clone(&self.network));
            // Dropping `reports` unsubscribes: a lost reply leaves nothing behind.
            self.network.reply(self.conn).await.then_some((id, reports))
        };
        crate::time::timeout(self.timeout, exchange)
            .await
            .ok()
            .flatten()
    }

    /// Sends a heartbeat: whether the server ran it on subscription `id` (its proof then
    /// travels back behind every report before it).
    async fn heartbeat(&self, id: u64) -> bool {
        let sent = crate::time::now();
        let exchange =
            async { self.network.request(self.conn).await && self.server.heartbeat(id, sent) };
        crate::time::timeout(self.timeout, exchange)
            .await
            .unwrap_or(false)
    }
}

/// Hands one connection's messages to the sink, in order.
struct Delivery {
    sink: Weak<dyn FeedSink>,
    number: u64,
    namespace: String,
    timeout: Duration,
}

impl Delivery {
    /// Until a message is lost (or late past the response time-out): then says so on `lost`.
    async fn run(self, mut reports: mpsc::UnboundedReceiver<InFlight>, lost: oneshot::Sender<()>) {
        while let Some((arrives, message)) = reports.recv().await {
            let arrived = crate::time::timeout(self.timeout, arrives).await;
            if arrived != Ok(true) {
                let _ = lost.send(());
                return;
            }
            let Some(sink) = self.sink.upgrade() else {
                return;
            };
            match message {
                Message::Proof(sent) => sink.proof(self.number, sent),
                // Tracking reports a flush as no key in particular: every copy goes.
                Message::Change(Applied::Flushed) => sink.flushed(),
                Message::Change(change) => {
                    if let Some(name) = self.name_of(&change) {
                        sink.changed(name.as_bytes());
                    }
                }
            }
        }
    }

    /// The name a tracking report of `change` carries: the value key, or the epoch's key.
    fn name_of(&self, change: &Applied) -> Option<String> {
        match change {
            Applied::Written { key, .. }
            | Applied::Deleted { key }
            | Applied::Set { key, .. }
            | Applied::Invalidated { key }
            | Applied::OutsideDeleted { key }
            | Applied::OutsideSet { key }
            | Applied::OutsideExpire { key, .. }
            | Applied::Expired { key } => {
                EntryKeys::new(&self.namespace, key).ok().map(|k| k.value)
            }
            Applied::Raised { name, .. } => Some(name.clone()),
            Applied::Acquired { .. } | Applied::Bumped { .. } | Applied::Flushed => None,
        }
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
