//! The lock operations over a majority of independent stores: the store side of
//! [`Redlock`](crate::Redlock). The algorithm, its fencing rule and what it does not guarantee are
//! described in `lock/redlock.rs`, which builds a [`Lock`](crate::Lock) over this store.
//!
//! Explained in the guide: `docs/cluster-and-redlock.md` (Redlock).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{
    Acquire, Backend, BoxFuture, ConnectionOptions, LockStore, Store, StoreError, StoreResult,
};
use crate::error::Error;
use crate::join::join_all;
use crate::store::wakeup::Listener;
use crate::wire::key::EntryKeys;

/// The lock operations over a majority of independent stores.
pub(crate) struct QuorumStore {
    nodes: Vec<Arc<dyn Store>>,
    node_timeout: Duration,
}

impl QuorumStore {
    /// Connects (lazily) to the nodes. `node_timeout` defaults to 1/20 of the lease, between 10
    /// and 250 ms.
    pub(crate) fn connect(
        urls: Vec<String>,
        lease: Duration,
        node_timeout: Option<Duration>,
        connection: &ConnectionOptions,
    ) -> Result<Self, Error> {
        let n = urls.len();
        if n < 3 || n.is_multiple_of(2) {
            return Err(Error::Config(format!(
                "Redlock needs an odd number of nodes, at least 3 (got {n})"
            )));
        }
        let mut nodes = Vec::with_capacity(n);
        for url in urls {
            nodes.push(Backend::RedisUrl(url).open(connection, None)?);
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
            let valid = |now: Instant| {
                crate::time::later_by(now, self.clock_drift(lease))
                    < crate::time::later_by(started, lease)
            };
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

    /// Recorded on every node it reaches; refused if any node knows a newer term.
    fn record_run<'a>(
        &'a self,
        keys: &'a EntryKeys,
        fence: u64,
        keep: Duration,
    ) -> BoxFuture<'a, StoreResult<bool>> {
        Box::pin(async move {
            let answers = self.on_all(|n| n.record_run(keys, fence, keep)).await;
            let reached = answers.iter().flatten().count();
            if reached < self.quorum() {
                return Err(self.no_quorum(reached));
            }
            Ok(answers.iter().flatten().all(|recorded| *recorded))
        })
    }

    /// The most recent run any node of a majority knows of: every recorded run reached a
    /// majority, and any two majorities share a node.
    fn since_last_run<'a>(
        &'a self,
        keys: &'a EntryKeys,
    ) -> BoxFuture<'a, StoreResult<Option<Duration>>> {
        Box::pin(async move {
            let answers = self.on_all(|n| n.since_last_run(keys)).await;
            let reached = answers.iter().flatten().count();
            if reached < self.quorum() {
                return Err(self.no_quorum(reached));
            }
            Ok(answers.into_iter().flatten().flatten().min())
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

