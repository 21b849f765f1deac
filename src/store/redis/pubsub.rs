//! Wake-up notifications: one RESP3 connection per store carries every subscription, with a
//! reference count per channel so that a channel is subscribed once however many local waiters
//! listen on it, and unsubscribed when the last one goes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use redis::aio::ConnectionManager;
use redis::{PushInfo, PushKind, Value};

use super::cluster::LazyCluster;
use super::connection::{resp3, ConnectionOptions};
use crate::store::wakeup::{Listener, Wakeups};
use crate::store::StoreResult;
use crate::sync::lock;

/// The connection that carries subscriptions: plain pub/sub on one server, sharded pub/sub on a
/// cluster (the subscription lands on the node that owns the channel's slot).
enum Subscriber {
    /// One server: `SUBSCRIBE`.
    Single(ConnectionManager),
    /// A cluster: `SSUBSCRIBE`, routed to the node of the channel's slot.
    Cluster(LazyCluster),
}

impl Subscriber {
    /// Subscribes to `channel` on the node that publishes it.
    async fn subscribe(&self, channel: &str) -> StoreResult<()> {
        match self {
            Subscriber::Single(conn) => Ok(conn.clone().subscribe(channel).await?),
            Subscriber::Cluster(conn) => Ok(conn.get().await?.ssubscribe(channel).await?),
        }
    }

    /// Undoes [`subscribe`](Self::subscribe).
    async fn unsubscribe(&self, channel: &str) -> StoreResult<()> {
        match self {
            Subscriber::Single(conn) => Ok(conn.clone().unsubscribe(channel).await?),
            Subscriber::Cluster(conn) => Ok(conn.get().await?.sunsubscribe(channel).await?),
        }
    }
}

/// Wake-up notifications over one RESP3 connection per store, with per-channel reference counts
/// so that a channel is subscribed once however many local waiters listen on it.
pub(crate) struct PubSub {
    /// The connection that holds the subscriptions.
    conn: Subscriber,
    /// Where the pushed messages wake local waiters.
    wakeups: Arc<Wakeups>,
    /// Channel → state. The `std` mutex guards only counts and is never held across `.await`.
    channels: Mutex<HashMap<String, Arc<Subscription>>>,
}

/// One channel's state: how many local listeners it has, and whether the server has us on it.
#[derive(Default)]
struct Subscription {
    /// Local listeners of the channel; the last one out unsubscribes.
    listeners: std::sync::atomic::AtomicUsize,
    /// Whether the server has us subscribed; the async mutex orders SUBSCRIBE and UNSUBSCRIBE of
    /// one channel, so an unsubscribe can never overtake a later subscribe.
    subscribed: tokio::sync::Mutex<bool>,
}

impl PubSub {
    /// The subscriber of one server: a RESP3 connection of its own (pushes need it), which
    /// subscribes again by itself after a reconnection.
    pub(crate) fn connect(
        client: &redis::Client,
        connection: &ConnectionOptions,
    ) -> StoreResult<Arc<Self>> {
        let client = resp3(client)?;
        let wakeups = Arc::new(Wakeups::default());
        let sink = Arc::clone(&wakeups);
        let config = connection
            .manager_config()
            .set_push_sender(move |push: PushInfo| {
                route_push(&sink, push);
                Ok::<(), redis::aio::SendError>(())
            })
            .set_automatic_resubscription();
        let conn = ConnectionManager::new_lazy_with_config(client, config)?;
        Ok(PubSub::new(Subscriber::Single(conn), wakeups))
    }

    /// The subscriber of a Redis Cluster reached through `seeds`: sharded pub/sub over a lazy
    /// RESP3 cluster connection.
    pub(crate) fn connect_cluster(
        seeds: &[String],
        connection: &ConnectionOptions,
    ) -> StoreResult<Arc<Self>> {
        let wakeups = Arc::new(Wakeups::default());
        let sink = Arc::clone(&wakeups);
        let subscriber = LazyCluster::new(
            connection
                .cluster_builder(seeds)
                .use_protocol(redis::ProtocolVersion::RESP3)
                .push_sender(move |push: PushInfo| {
                    route_push(&sink, push);
                    Ok::<(), redis::aio::SendError>(())
                })
                .build()?,
        );
        Ok(PubSub::new(Subscriber::Cluster(subscriber), wakeups))
    }

    /// A subscriber with no channel yet.
    fn new(conn: Subscriber, wakeups: Arc<Wakeups>) -> Arc<Self> {
        Arc::new(PubSub {
            conn,
            wakeups,
            channels: Mutex::new(HashMap::new()),
        })
    }

    /// A listener of `channel`, subscribing to it unless another listener already did.
    pub(crate) async fn listen(self: &Arc<Self>, channel: &str) -> StoreResult<Listener> {
        let sub = {
            let mut channels = lock(&self.channels);
            let sub = Arc::clone(channels.entry(channel.to_owned()).or_default());
            sub.listeners
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            sub
        };
        // Registered before SUBSCRIBE completes: a message that arrives right after is not lost.
        let me = Arc::clone(self);
        let name = channel.to_owned();
        let listener = self
            .wakeups
            .listen(channel)
            .on_drop(move || me.release(name));
        let mut subscribed = sub.subscribed.lock().await;
        if !*subscribed {
            self.conn.subscribe(channel).await?;
            *subscribed = true;
        }
        Ok(listener)
    }

    /// One listener fewer; the last one out unsubscribes, in the background since `Drop` cannot wait.
    fn release(self: Arc<Self>, channel: String) {
        let Some(sub) = lock(&self.channels).get(&channel).cloned() else {
            return;
        };
        if sub
            .listeners
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
            != 1
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let mut subscribed = sub.subscribed.lock().await;
            let idle = || sub.listeners.load(std::sync::atomic::Ordering::SeqCst) == 0;
            if !idle() {
                return;
            }
            if *subscribed {
                if let Err(e) = self.conn.unsubscribe(&channel).await {
                    tracing::debug!(channel, error = %e, "unsubscribe failed");
                }
                *subscribed = false;
            }
            let mut channels = lock(&self.channels);
            if idle() && channels.get(&channel).is_some_and(|s| Arc::ptr_eq(s, &sub)) {
                channels.remove(&channel);
            }
        });
    }
}

/// Runs on the connection's reader task for every push message: keep it short.
fn route_push(wakeups: &Wakeups, push: PushInfo) {
    match push.kind {
        PushKind::Message | PushKind::SMessage => {
            if let Some(Value::BulkString(channel)) = push.data.first() {
                if let Ok(channel) = std::str::from_utf8(channel) {
                    wakeups.notify(channel);
                }
            }
        }
        // Messages may have been missed while the connection was down: everyone re-checks.
        PushKind::Disconnection => wakeups.notify_all(),
        _ => {}
    }
}
