//! Redlock: one lock over N independent Redis masters, held while a majority holds it.
//!
//! The algorithm (Redis's published Redlock, with fencing added):
//! 1. Take the lock on every node in parallel (`SET NX PX` with one token), each request bounded
//!    by a per-node timeout, and bump each node's fencing counter.
//! 2. It is ours if a majority granted it and time is left: validity = lease − elapsed − drift,
//!    drift = 1 % of the lease + 2 ms. Otherwise release it everywhere and retry after a jittered
//!    delay (the [`Lock`]'s backoff).
//! 3. The fencing token is the maximum of the counters the majority returned, and it is written
//!    back (raised) on that majority before the lock counts as taken. Any later majority shares a
//!    node with this one, whose counter is now at least this token, so the next token is greater:
//!    tokens strictly increase. (Taking the maximum alone would not do: a later majority that
//!    misses the node with the highest counter could hand out a lower token.)
//! 4. Renewal extends on all nodes and holds while a majority extends; release frees every node.
//!
//! What it does not guarantee: a lease is not safety. A holder paused past its lease, or nodes
//! whose clocks jump, can leave two processes believing they hold the lock (Kleppmann, "How to do
//! distributed locking", 2016). The fencing token is what makes the write safe: the system written
//! to must refuse tokens lower than one it has seen. A node that restarts without persistence
//! forgets the lock; since a holder takes the lock on every node it reaches (not just a majority),
//! one such restart cannot hand a majority to another client, but several can: run the nodes with
//! persistence, or delay restarts by one lease, as the Redlock description advises.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use crate::connect::Backend;
use crate::key::{validate_namespace, EntryKeys};
use crate::store::{Acquire, BoxFuture, LockStore, Store, StoreError, StoreResult};
use crate::wakeup::Listener;
use crate::{CallOptions, Error, Lock};

/// Builds a [`Lock`] that holds over a majority of independent Redis masters.
///
/// ```no_run
/// use stampede_guard::Redlock;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), stampede_guard::Error> {
/// let lock = Redlock::builder("nightly-sync")
///     .nodes(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
///     .build()
///     .await?;
/// let guard = lock.acquire().await?; // the same LockGuard as a single-node Lock
/// println!("fencing token {}", guard.fencing_token());
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Redlock;

impl Redlock {
    /// A builder for the Redlock named `name`.
    pub fn builder(name: impl Into<String>) -> RedlockBuilder {
        RedlockBuilder {
            name: name.into(),
            namespace: crate::cache::DEFAULT_NAMESPACE.to_owned(),
            nodes: Vec::new(),
            options: CallOptions::default(),
            node_timeout: None,
        }
    }
}

/// Builds a Redlock [`Lock`]: nodes, namespace, options and the per-node timeout.
///
/// ```
/// let builder = stampede_guard::Redlock::builder("sync").namespace("jobs");
/// # let _ = builder;
/// ```
#[must_use]
pub struct RedlockBuilder {
    name: String,
    namespace: String,
    /// Not printed by `Debug` beyond their count: URLs may carry passwords.
    nodes: Vec<String>,
    options: CallOptions,
    node_timeout: Option<Duration>,
}

impl std::fmt::Debug for RedlockBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockBuilder")
            .field("name", &self.name)
            .field("namespace", &self.namespace)
            .field("nodes", &self.nodes.len())
            .field("options", &self.options)
            .field("node_timeout", &self.node_timeout)
            .finish()
    }
}

impl RedlockBuilder {
    /// The URLs of the independent masters (an odd number, at least 3).
    pub fn nodes<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.nodes = urls.into_iter().map(Into::into).collect();
        self
    }

    /// The key prefix (default `"stampede"`).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// The lease, renewal, maximum hold, wait bound and backoff (see [`CallOptions`]).
    pub fn options(mut self, options: CallOptions) -> Self {
        self.options = options;
        self
    }

    /// How long one node may take to answer before it counts as down (default: 1/20 of the lease,
    /// between 10 and 250 ms). Short, so that a dead node does not eat the lease.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = Some(timeout);
        self
    }

    /// Builds the lock. Connections are made on first use.
    ///
    /// # Errors
    /// [`Error::Config`] for fewer than 3 nodes, an even number of nodes, or a URL that does not
    /// parse; [`Error::InvalidKey`] for a bad name or namespace.
    pub async fn build(self) -> Result<Lock, Error> {
        validate_namespace(&self.namespace)?;
        let keys = EntryKeys::new(&self.namespace, &self.name)?;
        let quorum =
            QuorumStore::connect(self.nodes, self.options.lease, self.node_timeout).await?;
        Ok(Lock::from_parts(Arc::new(quorum), keys, self.options))
    }
}

/// The lock operations over a majority of independent stores.
pub(crate) struct QuorumStore {
    nodes: Vec<Arc<dyn Store>>,
    node_timeout: Duration,
}

impl QuorumStore {
    /// Connects (lazily) to the nodes. `node_timeout` defaults to 1/20 of the lease, between 10
    /// and 250 ms.
    pub(crate) async fn connect(
        urls: Vec<String>,
        lease: Duration,
        node_timeout: Option<Duration>,
    ) -> Result<Self, Error> {
        let n = urls.len();
        if n < 3 || n.is_multiple_of(2) {
            return Err(Error::Config(format!(
                "Redlock needs an odd number of nodes, at least 3 (got {n})"
            )));
        }
        let mut nodes = Vec::with_capacity(n);
        for url in urls {
            nodes.push(Backend::RedisUrl(url).open().await?);
        }
        let node_timeout = node_timeout.unwrap_or_else(|| {
            (lease / 20).clamp(Duration::from_millis(10), Duration::from_millis(250))
        });
        Ok(QuorumStore {
            nodes,
            node_timeout,
        })
    }

    fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// Runs `op` on every node at once; a node's answer is `None` if it failed or timed out.
    async fn on_all<'a, T: Send + 'a>(
        &'a self,
        op: impl Fn(&'a dyn Store) -> BoxFuture<'a, StoreResult<T>>,
    ) -> Vec<Option<T>> {
        let timeout = self.node_timeout;
        let calls = self.nodes.iter().map(|node| {
            let call = op(node.as_ref());
            Box::pin(async move { tokio::time::timeout(timeout, call).await.ok()?.ok() })
                as BoxFuture<'a, Option<T>>
        });
        join_all(calls.collect()).await
    }

    fn no_quorum(&self, reached: usize) -> StoreError {
        StoreError::NoQuorum {
            reached,
            needed: self.quorum(),
        }
    }
}

impl LockStore for QuorumStore {
    fn try_lock<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<Acquire>> {
        Box::pin(async move {
            let started = Instant::now();
            let answers = self.on_all(|n| n.try_lock(keys, token, lease)).await;
            let reached = answers.iter().flatten().count();
            let fences: Vec<(usize, u64)> = answers
                .iter()
                .enumerate()
                .filter_map(|(i, a)| match a {
                    Some(Acquire::Acquired { fence }) => Some((i, *fence)),
                    _ => None,
                })
                .collect();
            let expires_in = answers
                .iter()
                .filter_map(|a| match a {
                    Some(Acquire::Held { expires_in }) => *expires_in,
                    _ => None,
                })
                .min();
            let valid = |now: Instant| now + self.clock_drift(lease) < started + lease;
            if fences.len() >= self.quorum() && valid(Instant::now()) {
                let token_fence = fences.iter().map(|(_, f)| *f).max().unwrap_or(0);
                let holders: Vec<Arc<dyn Store>> = fences
                    .iter()
                    .map(|(i, _)| Arc::clone(&self.nodes[*i]))
                    .collect();
                let raised = join_all(
                    holders
                        .iter()
                        .map(|n| {
                            let call = n.raise_fence(keys, token_fence, lease);
                            let timeout = self.node_timeout;
                            Box::pin(
                                async move { tokio::time::timeout(timeout, call).await.ok()?.ok() },
                            ) as BoxFuture<'_, Option<()>>
                        })
                        .collect(),
                )
                .await;
                if raised.iter().flatten().count() >= self.quorum() && valid(Instant::now()) {
                    return Ok(Acquire::Acquired { fence: token_fence });
                }
            }
            // Not ours: undo what we took, so others need not wait for it to expire.
            self.on_all(|n| n.unlock(keys, token)).await;
            if reached < self.quorum() {
                return Err(self.no_quorum(reached));
            }
            Ok(Acquire::Held { expires_in })
        })
    }

    fn extend<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<bool>> {
        Box::pin(async move {
            let answers = self.on_all(|n| n.extend(keys, token, lease)).await;
            let reached = answers.iter().flatten().count();
            if answers
                .iter()
                .flatten()
                .filter(|extended| **extended)
                .count()
                >= self.quorum()
            {
                return Ok(true);
            }
            if reached < self.quorum() {
                // Unknown, not lost: the heartbeat retries until the lease runs out.
                return Err(self.no_quorum(reached));
            }
            Ok(false)
        })
    }

    fn unlock<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
    ) -> BoxFuture<'a, StoreResult<bool>> {
        Box::pin(async move {
            let answers = self.on_all(|n| n.unlock(keys, token)).await;
            let reached = answers.iter().flatten().count();
            let released = answers.iter().flatten().filter(|r| **r).count();
            if released >= self.quorum() {
                return Ok(true);
            }
            if reached < self.quorum() {
                return Err(self.no_quorum(reached));
            }
            Ok(false)
        })
    }

    /// The maximum of the bumped counters of a majority, raised on that majority: above every
    /// token any majority handed out before.
    fn next_fence<'a>(
        &'a self,
        keys: &'a EntryKeys,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<u64>> {
        Box::pin(async move {
            let answers = self.on_all(|n| n.next_fence(keys, lease)).await;
            let fences: Vec<u64> = answers.into_iter().flatten().collect();
            if fences.len() < self.quorum() {
                return Err(self.no_quorum(fences.len()));
            }
            let fence = fences.into_iter().max().unwrap_or(0);
            self.raise_fence(keys, fence, lease).await?;
            Ok(fence)
        })
    }

    fn raise_fence<'a>(
        &'a self,
        keys: &'a EntryKeys,
        floor: u64,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<()>> {
        Box::pin(async move {
            let answers = self.on_all(|n| n.raise_fence(keys, floor, lease)).await;
            let reached = answers.iter().flatten().count();
            if reached < self.quorum() {
                return Err(self.no_quorum(reached));
            }
            Ok(())
        })
    }

    /// Wake-ups from any one node: a release publishes on every node.
    fn listen<'a>(&'a self, keys: &'a EntryKeys) -> BoxFuture<'a, StoreResult<Listener>> {
        Box::pin(async move {
            let mut last = self.no_quorum(0);
            for node in &self.nodes {
                match tokio::time::timeout(self.node_timeout * 4, node.listen(keys)).await {
                    Ok(Ok(listener)) => return Ok(listener),
                    Ok(Err(e)) => last = e,
                    Err(_) => {}
                }
            }
            Err(last)
        })
    }

    fn clock_drift(&self, lease: Duration) -> Duration {
        lease / 100 + Duration::from_millis(2)
    }
}

/// Polls every future until all are done; the answers in order. (A few lines instead of a
/// dependency: the futures borrow from the caller, so `tokio::task::JoinSet` does not fit.)
async fn join_all<'a, T>(mut futures: Vec<BoxFuture<'a, T>>) -> Vec<T> {
    let mut done: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx: &mut Context<'_>| {
        let mut pending = false;
        for (future, slot) in futures.iter_mut().zip(done.iter_mut()) {
            if slot.is_none() {
                match Pin::new(future).poll(cx) {
                    Poll::Ready(value) => *slot = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    done.into_iter().flatten().collect()
}
