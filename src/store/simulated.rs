//! The deterministic simulation's server (feature `simulation`, for `tests/sim/` only): the
//! memory store, which `memory_model_tests.rs` keeps equivalent to the Lua scripts, behind one
//! connection per instance whose requests and replies travel through a [`Network`] the
//! simulation controls (delays, losses with the connection, a frozen server). The server can
//! be restarted empty, written by another program (`SET`, `DEL`, `PEXPIRE`, `FLUSHDB`), or
//! failed over to a replica that caught up at a moment the simulation chose, and it reports
//! every change it makes ([`Applied`]) in its own order: the server's side of the history the
//! chaos checker judges. Its fencing counters bump as the Redis script does (see
//! `MemoryStore::bump`), so a failover hands out no token twice there either.
//!
//! Every operation of the memory store is carried out when it is sent, with no `.await` inside,
//! so one operation is atomic here as a script is on Redis; the network decides only when it
//! is sent and whether its answer comes back.
//!
//! Each instance may also run a near-tier feed ([`feed`]) over a connection of its own: the
//! server reports its changes to every subscribed feed through the same network. Each has a
//! wall clock of its own too ([`clock`]), off the server's by a seeded offset and rate, whose
//! estimate of the server's clock its freshness is judged by, as on Redis.

mod clock;
mod feed;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::wakeup::Listener;
use super::{
    Acquire, BoxFuture, Clock, LockOp, LockStore, MemoryLimits, MemoryStore, Op, ReadOrLock, Reply,
    Store, StoreError, StoreResult, Stored, Write,
};
use crate::sync::lock;
use crate::wire::key::EntryKeys;
pub use clock::Skew;
use clock::WallClock;
pub(crate) use feed::Feed;
use feed::{Message, Subscription};

/// A change the simulated server made, in the server's order, by user key (an epoch by its
/// store name).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // The fields are named for what they hold: the user key, the bytes.
pub enum Applied {
    /// A lock was taken and the fencing counter bumped to `token`.
    Acquired { key: String, token: u64 },
    /// A fenced write (a computation's, or the fail-safe's copy) was accepted: these bytes.
    Written { key: String, bytes: Vec<u8> },
    /// A failed refresh's fenced delete was accepted.
    Deleted { key: String },
    /// `set`: the counter bumped, then these bytes written.
    Set { key: String, bytes: Vec<u8> },
    /// An invalidation: the counter bumped, the value deleted.
    Invalidated { key: String },
    /// The fencing counter bumped without a lock (`next_fence`).
    Bumped { key: String },
    /// An epoch (its store name) raised to `value`.
    Raised { name: String, value: u64 },
    /// Another program deleted the value (`DEL`): no fence bump.
    OutsideDeleted { key: String },
    /// Another program wrote bytes that are not the crate's under the value key (`SET`).
    OutsideSet { key: String },
    /// Another program shortened the value's life to `ms` (`PEXPIRE`); the value is still
    /// there until [`Expired`](Self::Expired).
    OutsideExpire { key: String, ms: u64 },
    /// A shortened life ran out: the value is gone.
    Expired { key: String },
    /// Another program flushed the database (`FLUSHDB`): every key is gone.
    Flushed,
}

/// What carries a connection's requests and replies: the simulation's network.
pub trait Network: Send + Sync + 'static {
    /// The request of connection `conn` travels to the server; `false`: lost with its
    /// connection, never carried out.
    fn request(&self, conn: u64) -> Pin<Box<dyn Future<Output = bool> + Send>>;
    /// Its reply travels back; `false`: lost with its connection (the request was carried out).
    fn reply(&self, conn: u64) -> Pin<Box<dyn Future<Output = bool> + Send>>;
    /// The server carried out a request of `conn` and changed this.
    fn applied(&self, conn: u64, change: Applied);
}

/// The simulated server: one memory store at a time (a restart replaces it with an empty one),
/// on a wall clock that starts at a given instant and moves with `tokio::time` only.
pub struct Server {
    store: Mutex<Arc<MemoryStore>>,
    /// What the replica holds (`None`: it has not caught up since the last failover, restart or
    /// flush): what the server becomes when it fails over.
    replica: Mutex<Option<Arc<MemoryStore>>>,
    /// The simulation's clock in microseconds ([`tick`]): births, epochs and the history.
    clock: Arc<AtomicU64>,
    limits: MemoryLimits,
    epoch_ms: u64,
    epoch: Instant,
    /// The near-tier feeds subscribed to this server process (a restart forgets them, as a
    /// new process knows no client), in the order they subscribed.
    feeds: Mutex<Vec<Subscription>>,
    next_subscription: AtomicU64,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Server {{ epoch_ms: {} }}", self.epoch_ms)
    }
}

impl Server {
    /// An empty server keeping at most `max_entries` values, whose clock reads `epoch_ms` now.
    pub fn new(max_entries: u64, epoch_ms: u64) -> Arc<Self> {
        let limits = MemoryLimits::default().max_entries(max_entries);
        let clock = Arc::new(AtomicU64::new(0));
        let store = MemoryStore::simulated(limits.clone(), epoch_ms, Arc::clone(&clock));
        Arc::new(Server {
            store: Mutex::new(Arc::new(store)),
            replica: Mutex::default(),
            clock,
            limits,
            epoch_ms,
            epoch: Instant::now(),
            feeds: Mutex::default(),
            next_subscription: AtomicU64::new(0),
        })
    }

    /// Restarts the server empty: values, locks, fencing counters and epochs are gone.
    pub fn restart_empty(&self) {
        let fresh =
            MemoryStore::simulated(self.limits.clone(), self.now_ms(), Arc::clone(&self.clock));
        *lock(&self.store) = Arc::new(fresh);
        lock(&self.feeds).clear();
        // The replica resynchronises from the empty server.
        *lock(&self.replica) = None;
    }

    /// Another program deletes the value of `key` in `namespace` (`DEL` of the value key, as
    /// an operator or a script would): no fence bump, no wake-up. What it changed, reported
    /// to the feeds as tracking reports it (`None`: not a key of the namespace).
    pub fn outside_delete(&self, namespace: &str, key: &str) -> Option<Applied> {
        let keys = EntryKeys::new(namespace, key).ok()?;
        self.current().outside_delete(&keys);
        Some(self.outside(Applied::OutsideDeleted {
            key: key.to_owned(),
        }))
    }

    /// Another program writes `bytes` under the value key of `key` (`SET`, with `PX ttl_ms` if
    /// given): no fence bump, no wake-up.
    pub fn outside_set(
        &self,
        namespace: &str,
        key: &str,
        bytes: &[u8],
        ttl_ms: Option<u64>,
    ) -> Option<Applied> {
        let keys = EntryKeys::new(namespace, key).ok()?;
        let ttl = ttl_ms.map(Duration::from_millis);
        self.current().outside_set(&keys, bytes.to_vec(), ttl);
        Some(self.outside(Applied::OutsideSet {
            key: key.to_owned(),
        }))
    }

    /// Another program shortens the life of the value of `key` to `ms` (`PEXPIRE`); `None` if
    /// there was no value (Redis answers 0 and reports nothing). Call
    /// [`expire_due`](Self::expire_due) `ms` later.
    pub fn outside_expire(&self, namespace: &str, key: &str, ms: u64) -> Option<Applied> {
        let keys = EntryKeys::new(namespace, key).ok()?;
        if !self
            .current()
            .outside_expire(&keys, Duration::from_millis(ms))
        {
            return None;
        }
        Some(self.outside(Applied::OutsideExpire {
            key: key.to_owned(),
            ms,
        }))
    }

    /// When a shortened life falls due: if the value is gone, the expiry is reported as
    /// Redis's tracking reports one (the memory store reports no expiry of its own, and a
    /// near copy read after the `PEXPIRE` must not outlive the value by more than its bound).
    /// `None`: a write since gave the key a value again, or the key is no value key.
    pub fn expire_due(&self, namespace: &str, key: &str) -> Option<Applied> {
        let keys = EntryKeys::new(namespace, key).ok()?;
        if self.current().fence_and_value(&keys).1.is_some() {
            return None;
        }
        Some(self.outside(Applied::Expired {
            key: key.to_owned(),
        }))
    }

    /// Another program flushes the database (`FLUSHDB`): values, locks, fencing counters and
    /// epochs are gone, as after a restart, but the process and its connections stay (the
    /// feeds are told, as tracking tells its clients of a flush).
    pub fn flushdb(&self) -> Applied {
        let store = self.current();
        *lock(&self.store) = Arc::new(store.flushed());
        // Replicated: the replica is empty too.
        *lock(&self.replica) = None;
        self.outside(Applied::Flushed)
    }

    /// The replica catches up: from now on it holds what the server holds now, until the next
    /// call (a replica that lags by as long as until then).
    pub fn sync_replica(&self) {
        let copy = self.current().replica();
        *lock(&self.replica) = Some(Arc::new(copy));
    }

    /// The server fails over to its replica: what it ran since the replica last caught up is
    /// lost (values, locks, fencing counters and epochs go back), and every connection closes
    /// (the instances' with [`Network`]; the feeds are forgotten, as a new master knows no
    /// client). Without a replica ([`sync_replica`](Self::sync_replica) since the last restart
    /// or flush) it takes an empty one.
    pub fn fail_over(&self) {
        let replica = lock(&self.replica).take();
        let store = match replica {
            Some(replica) => replica,
            None => Arc::new(self.current().flushed()),
        };
        // The old master comes back as the new one's replica, caught up from here.
        *lock(&self.replica) = Some(Arc::new(store.replica()));
        *lock(&self.store) = store;
        lock(&self.feeds).clear();
    }

    /// The fencing counter and the value's bytes the server holds for `key` now: what a
    /// failover left, for the history.
    pub fn fence_and_value(&self, namespace: &str, key: &str) -> (Option<u64>, Option<Vec<u8>>) {
        match EntryKeys::new(namespace, key) {
            Ok(keys) => self.current().fence_and_value(&keys),
            Err(_) => (None, None),
        }
    }

    /// Reports an outside write to the feeds; returns it, for the history.
    fn outside(&self, change: Applied) -> Applied {
        self.report(&change);
        change
    }

    /// Subscribes a feed of connection `conn` over `network`: its id, and where its
    /// messages arrive (dropping it unsubscribes).
    fn subscribe(
        &self,
        conn: u64,
        network: Arc<dyn Network>,
    ) -> (u64, tokio::sync::mpsc::UnboundedReceiver<feed::InFlight>) {
        let id = self.next_subscription.fetch_add(1, Ordering::Relaxed);
        let (to_feed, reports) = tokio::sync::mpsc::unbounded_channel();
        lock(&self.feeds).push(Subscription {
            id,
            conn,
            network,
            to_feed,
        });
        (id, reports)
    }

    /// Runs the heartbeat of subscription `id`, sent at `sent`: its proof goes back behind
    /// every report before it. `false`: this process knows no such subscription.
    fn heartbeat(&self, id: u64, sent: Instant) -> bool {
        let feeds = lock(&self.feeds);
        let Some(feed) = feeds.iter().find(|f| f.id == id && !f.to_feed.is_closed()) else {
            return false;
        };
        feed.send(Message::Proof(sent));
        true
    }

    /// Reports `change` to every subscribed feed, now (in the server's order); forgets the
    /// feeds that are gone.
    fn report(&self, change: &Applied) {
        if matches!(change, Applied::Acquired { .. } | Applied::Bumped { .. }) {
            // Locks and fencing counters name no copy: not sent (the near tier skips them).
            return;
        }
        let mut feeds = lock(&self.feeds);
        feeds.retain(|f| !f.to_feed.is_closed());
        for feed in feeds.iter() {
            feed.send(Message::Change(change.clone()));
        }
    }

    /// The simulation's clock now, in microseconds: above every reading before it, and never
    /// behind the server's wall clock. Births and epochs are read from it too, so the history
    /// and the server's stamps compare.
    pub fn now_us(&self) -> u64 {
        let elapsed = u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX);
        crate::time::tick(
            &self.clock,
            self.epoch_ms.saturating_mul(1000).saturating_add(elapsed),
        )
    }

    fn current(&self) -> Arc<MemoryStore> {
        Arc::clone(&lock(&self.store))
    }
}

impl Clock for Server {
    fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.epoch_ms.saturating_add(elapsed)
    }
}

/// One instance's connection to the simulated server: the store a simulated cache is built over.
pub struct Connection {
    server: Arc<Server>,
    network: Arc<dyn Network>,
    conn: u64,
    /// How long a request waits for its reply before it fails as timed out (the client's
    /// response time-out).
    timeout: Duration,
    /// The network connection of this instance's near-tier feed, if it has one, and how long
    /// its feed waits for a heartbeat or a report before it gives the connection up.
    feed: Option<(u64, Duration)>,
    /// This instance's estimate of the server's clock, by which freshness is stamped and
    /// judged; `None`: the server's clock itself, exactly (no instance reads that on Redis).
    wall: Option<WallClock>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Connection {{ conn: {}, .. }}", self.conn)
    }
}

impl Connection {
    /// Connection `conn` to `server` over `network`, with the client's response time-out.
    pub fn new(
        server: Arc<Server>,
        network: Arc<dyn Network>,
        conn: u64,
        timeout: Duration,
    ) -> Self {
        Connection {
            server,
            network,
            conn,
            timeout,
            feed: None,
            wall: None,
        }
    }

    /// The same connection, for an instance whose wall clock is off the server's by `skew`:
    /// freshness is then judged by its estimate of the server's clock, measured over this
    /// connection as on Redis.
    pub fn with_skew(self, skew: Skew) -> Self {
        let wall = WallClock::new(
            Arc::clone(&self.server),
            Arc::clone(&self.network),
            self.conn,
            self.timeout,
            skew,
        );
        Connection {
            wall: Some(wall),
            ..self
        }
    }

    /// The same connection, with a near-tier feed over connection `feed` of the network (a
    /// cache built over it may run a near tier), which gives a connection up when a heartbeat
    /// or a report takes longer than `give_up` (a black-holed socket fails nothing for
    /// seconds: the near tier's bound must not rest on the feed noticing soon).
    pub fn with_feed(self, feed: u64, give_up: Duration) -> Self {
        Connection {
            feed: Some((feed, give_up)),
            ..self
        }
    }

    /// The near-tier feed of this connection for `namespace`, heartbeating every `period`;
    /// `None` without [`with_feed`](Self::with_feed).
    pub(crate) fn feed(&self, namespace: &str, period: Duration, tracked: bool) -> Option<Feed> {
        let (conn, give_up) = self.feed?;
        Some(Feed::new(self, (conn, give_up), namespace, period, tracked))
    }

    /// Sends a request that `carry_out` answers on the server's current store, reporting what
    /// it changed, within the response time-out.
    fn exchange<'a, T: Send + 'a>(
        &'a self,
        carry_out: impl FnOnce(Arc<MemoryStore>) -> BoxFuture<'a, (StoreResult<T>, Vec<Applied>)>
            + Send
            + 'a,
    ) -> BoxFuture<'a, StoreResult<T>> {
        Box::pin(async move {
            let exchange = async {
                if !self.network.request(self.conn).await {
                    return Err(io_error(std::io::ErrorKind::ConnectionReset));
                }
                let (answer, changes) = carry_out(self.server.current()).await;
                for change in changes {
                    self.server.report(&change);
                    self.network.applied(self.conn, change);
                }
                if !self.network.reply(self.conn).await {
                    return Err(io_error(std::io::ErrorKind::ConnectionReset));
                }
                answer
            };
            // The client's time-out, on its own clock.
            crate::time::timeout(self.timeout, exchange)
                .await
                .unwrap_or_else(|_| Err(io_error(std::io::ErrorKind::TimedOut)))
        })
    }
}

/// A failure as the Redis client reports it: the same classification as a real outage.
fn io_error(kind: std::io::ErrorKind) -> StoreError {
    StoreError::from(::redis::RedisError::from(std::io::Error::new(
        kind,
        "simulated network",
    )))
}

impl LockStore for Connection {
    fn lock<'a>(&'a self, op: LockOp<'a>) -> BoxFuture<'a, StoreResult<Reply>> {
        self.exchange(move |store| {
            Box::pin(async move {
                let answer = store.lock(op).await;
                let changes = lock_changes(&op, &answer);
                (answer, changes)
            })
        })
    }

    fn listen<'a>(&'a self, keys: &'a EntryKeys) -> BoxFuture<'a, StoreResult<Listener>> {
        self.exchange(move |store| Box::pin(async move { (store.listen(keys).await, Vec::new()) }))
    }
}

impl Store for Connection {
    fn run<'a>(&'a self, op: Op<'a>) -> BoxFuture<'a, StoreResult<Reply>> {
        self.exchange(move |store| {
            Box::pin(async move {
                let asked = op.clone();
                let answer = store.run(op).await;
                let mut changes = changes(&asked, &answer);
                if let Op::RaiseEpochs { names, .. } = asked {
                    if let Ok(Reply::Epochs(values)) = store.run(Op::Epochs { names }).await {
                        changes.extend(names.iter().zip(values).map(|(name, value)| {
                            Applied::Raised {
                                name: name.clone(),
                                value,
                            }
                        }));
                    }
                }
                (answer, changes)
            })
        })
    }

    fn clock(&self) -> &dyn Clock {
        self
    }
}

impl Clock for Connection {
    fn now_ms(&self) -> u64 {
        match &self.wall {
            Some(wall) => wall.now_ms(),
            None => self.server.now_ms(),
        }
    }

    fn is_synced(&self) -> bool {
        self.wall.as_ref().is_none_or(WallClock::is_synced)
    }

    fn sync(&self) -> BoxFuture<'_, ()> {
        match &self.wall {
            Some(wall) => wall.sync(),
            None => Box::pin(std::future::ready(())),
        }
    }
}

/// What a lock operation changed, by its reply.
fn lock_changes(op: &LockOp<'_>, answer: &StoreResult<Reply>) -> Vec<Applied> {
    match (op, answer) {
        (LockOp::TryLock { keys, .. }, Ok(Reply::Acquire(Acquire::Acquired { fence }))) => {
            vec![Applied::Acquired {
                key: keys.user().to_owned(),
                token: *fence,
            }]
        }
        (LockOp::NextFence { keys, .. }, Ok(Reply::Number(_))) => vec![Applied::Bumped {
            key: keys.user().to_owned(),
        }],
        _ => Vec::new(),
    }
}

/// What a value operation changed, by its reply.
fn changes(op: &Op<'_>, answer: &StoreResult<Reply>) -> Vec<Applied> {
    let acquired = |keys: &EntryKeys, answer: &ReadOrLock| match answer {
        ReadOrLock::Acquired { fence, .. } => vec![Applied::Acquired {
            key: keys.user().to_owned(),
            token: *fence,
        }],
        _ => Vec::new(),
    };
    let Ok(reply) = answer else {
        return Vec::new();
    };
    match (op, reply) {
        (Op::ReadOrLock { keys, .. }, Reply::ReadOrLock(answer))
        | (Op::ReadOrLock { keys, .. }, Reply::ReadOrLockTraced((answer, _))) => {
            acquired(keys, answer)
        }
        (Op::ReadOrLockMany { entries, .. }, Reply::PerEntry(answers)) => entries
            .iter()
            .zip(answers)
            .flat_map(|((keys, _, _), answer)| match answer {
                Ok(answer) => acquired(keys, answer),
                Err(_) => Vec::new(),
            })
            .collect(),
        (Op::StoreAndUnlock { keys, write, .. }, Reply::Stored(Stored { written, .. }))
            if *written =>
        {
            vec![fenced_write(keys, write)]
        }
        (Op::WriteFenced { keys, write, .. }, Reply::Flag(true)) => vec![fenced_write(keys, write)],
        (Op::Set { keys, value, .. }, Reply::Done) => vec![Applied::Set {
            key: keys.user().to_owned(),
            bytes: value.clone(),
        }],
        (Op::Invalidate { keys, .. }, Reply::Done) => vec![Applied::Invalidated {
            key: keys.user().to_owned(),
        }],
        (Op::InvalidateMany { entries, .. }, Reply::Done) => entries
            .iter()
            .map(|keys| Applied::Invalidated {
                key: keys.user().to_owned(),
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// An accepted fenced write of `write`.
fn fenced_write(keys: &EntryKeys, write: &Write) -> Applied {
    let key = keys.user().to_owned();
    match write {
        Write::Value { bytes, .. } | Write::Keep { bytes, .. } => Applied::Written {
            key,
            bytes: bytes.clone(),
        },
        Write::Delete => Applied::Deleted { key },
    }
}
