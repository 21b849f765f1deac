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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Blob, MemoryStore, ReadOrLock, Stored, Write};

    /// Long beside the node timeout, as in use.
    const LEASE: Duration = Duration::from_secs(10);
    /// How long a node may take before it counts as down.
    const NODE_TIMEOUT: Duration = Duration::from_millis(50);

    /// The one key the tests use.
    fn keys() -> EntryKeys {
        EntryKeys::new("t", "report").unwrap()
    }

    /// A node that is down: every call fails at once, or never answers (`hang`).
    struct Down {
        hang: bool,
    }

    impl Down {
        /// The answer to any call: an error now, or none ever.
        fn answer<'a, T: Send + 'a>(&self) -> BoxFuture<'a, StoreResult<T>> {
            if self.hang {
                return Box::pin(std::future::pending());
            }
            let down = StoreError::NoQuorum {
                reached: 0,
                needed: 1,
            };
            Box::pin(std::future::ready(Err(down)))
        }
    }

    impl LockStore for Down {
        fn try_lock<'a>(
            &'a self,
            _: &'a EntryKeys,
            _: &'a str,
            _: Duration,
        ) -> BoxFuture<'a, StoreResult<Acquire>> {
            self.answer()
        }

        fn extend<'a>(
            &'a self,
            _: &'a EntryKeys,
            _: &'a str,
            _: Duration,
        ) -> BoxFuture<'a, StoreResult<bool>> {
            self.answer()
        }

        fn unlock<'a>(&'a self, _: &'a EntryKeys, _: &'a str) -> BoxFuture<'a, StoreResult<bool>> {
            self.answer()
        }

        fn next_fence<'a>(
            &'a self,
            _: &'a EntryKeys,
            _: Duration,
        ) -> BoxFuture<'a, StoreResult<u64>> {
            self.answer()
        }

        fn raise_fence<'a>(
            &'a self,
            _: &'a EntryKeys,
            _: u64,
            _: Duration,
        ) -> BoxFuture<'a, StoreResult<()>> {
            self.answer()
        }

        fn record_run<'a>(
            &'a self,
            _: &'a EntryKeys,
            _: u64,
            _: Duration,
        ) -> BoxFuture<'a, StoreResult<bool>> {
            self.answer()
        }

        fn since_last_run<'a>(
            &'a self,
            _: &'a EntryKeys,
        ) -> BoxFuture<'a, StoreResult<Option<Duration>>> {
            self.answer()
        }

        fn listen<'a>(&'a self, _: &'a EntryKeys) -> BoxFuture<'a, StoreResult<Listener>> {
            self.answer()
        }
    }

    impl Store for Down {
        fn get<'a>(&'a self, _: &'a EntryKeys) -> BoxFuture<'a, StoreResult<Option<Blob>>> {
            self.answer()
        }

        fn born<'a>(&'a self, _: &'a str) -> BoxFuture<'a, StoreResult<u64>> {
            self.answer()
        }

        fn epochs<'a>(&'a self, _: &'a [String]) -> BoxFuture<'a, StoreResult<Vec<u64>>> {
            self.answer()
        }

        fn raise_epochs<'a>(&'a self, _: &'a [String], _: u64) -> BoxFuture<'a, StoreResult<()>> {
            self.answer()
        }

        fn read_or_lock<'a>(
            &'a self,
            _: &'a EntryKeys,
            _: &'a str,
            _: Duration,
            _: bool,
        ) -> BoxFuture<'a, StoreResult<ReadOrLock>> {
            self.answer()
        }

        fn store_and_unlock<'a>(
            &'a self,
            _: &'a EntryKeys,
            _: &'a str,
            _: u64,
            _: Write,
        ) -> BoxFuture<'a, StoreResult<Stored>> {
            self.answer()
        }

        fn write_fenced<'a>(
            &'a self,
            _: &'a EntryKeys,
            _: u64,
            _: Write,
            _: Duration,
        ) -> BoxFuture<'a, StoreResult<bool>> {
            self.answer()
        }

        fn set<'a>(
            &'a self,
            _: &'a EntryKeys,
            _: Vec<u8>,
            _: Duration,
            _: Duration,
        ) -> BoxFuture<'a, StoreResult<()>> {
            self.answer()
        }

        fn invalidate<'a>(
            &'a self,
            _: &'a EntryKeys,
            _: Duration,
        ) -> BoxFuture<'a, StoreResult<()>> {
            self.answer()
        }

        fn wake<'a>(&'a self, _: &'a EntryKeys) -> BoxFuture<'a, StoreResult<()>> {
            self.answer()
        }

        fn now_ms(&self) -> u64 {
            0
        }
    }

    /// A quorum of three nodes, the last ones `down`, the others memory stores (also handed
    /// back, to look behind the quorum's back).
    fn quorum(down: &[Down]) -> (QuorumStore, Vec<Arc<MemoryStore>>) {
        let memory: Vec<Arc<MemoryStore>> = (down.len()..3)
            .map(|_| Arc::new(MemoryStore::default()))
            .collect();
        let mut nodes: Vec<Arc<dyn Store>> = memory
            .iter()
            .map(|node| Arc::clone(node) as Arc<dyn Store>)
            .collect();
        for d in down {
            nodes.push(Arc::new(Down { hang: d.hang }));
        }
        let store = QuorumStore {
            nodes,
            node_timeout: NODE_TIMEOUT,
        };
        (store, memory)
    }

    /// A node whose calls fail at once (refused connections).
    const FAILS: Down = Down { hang: false };
    /// A node that never answers (a paused server).
    const HANGS: Down = Down { hang: true };

    /// Whether another caller could take the lock on `node` now (keeping it if it could).
    async fn is_free(node: &MemoryStore, k: &EntryKeys) -> bool {
        let answer = node.try_lock(k, "probe", LEASE).await.unwrap();
        matches!(answer, Acquire::Acquired { .. })
    }

    #[tokio::test(start_paused = true)]
    async fn a_majority_grants_the_highest_fence_and_remembers_it() {
        let (store, nodes) = quorum(&[]);
        let k = keys();
        // Node 0 has handed out far more tokens than the others (their counters are seeded
        // from the clock, in microseconds).
        let high = nodes[0].next_fence(&k, LEASE).await.unwrap() + 1_000_000;
        nodes[0].raise_fence(&k, high, LEASE).await.unwrap();
        let answer = store.try_lock(&k, "a", LEASE).await.unwrap();
        assert_eq!(answer, Acquire::Acquired { fence: high + 1 });
        // Every holder was raised to it: its next number is above.
        for node in &nodes {
            assert_eq!(node.next_fence(&k, LEASE).await.unwrap(), high + 2);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn one_node_down_still_locks_and_two_down_is_no_quorum_with_the_rest_undone() {
        let (store, _nodes) = quorum(&[FAILS]);
        let k = keys();
        let answer = store.try_lock(&k, "a", LEASE).await.unwrap();
        assert!(matches!(answer, Acquire::Acquired { .. }));

        let (store, nodes) = quorum(&[FAILS, FAILS]);
        let answer = store.try_lock(&k, "a", LEASE).await;
        assert!(matches!(
            answer,
            Err(StoreError::NoQuorum {
                reached: 1,
                needed: 2
            })
        ));
        assert!(is_free(&nodes[0], &k).await, "the node it took was freed");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lock_held_on_a_majority_is_held_and_the_minority_taken_is_undone() {
        let (store, nodes) = quorum(&[]);
        let k = keys();
        for node in &nodes[..2] {
            node.try_lock(&k, "other", LEASE).await.unwrap();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let answer = store.try_lock(&k, "a", LEASE).await.unwrap();
        let Acquire::Held { expires_in } = answer else {
            panic!("held by another on a majority: {answer:?}");
        };
        assert!(expires_in.is_some_and(|left| left <= LEASE - Duration::from_secs(1)));
        assert!(is_free(&nodes[2], &k).await, "the minority taken was freed");
    }

    #[tokio::test(start_paused = true)]
    async fn nodes_that_never_answer_count_as_down_after_the_node_timeout() {
        let (store, _nodes) = quorum(&[HANGS, HANGS]);
        let k = keys();
        let started = Instant::now();
        let answer = tokio::time::timeout(LEASE, store.try_lock(&k, "a", LEASE))
            .await
            .expect("the hanging nodes are given up");
        assert!(matches!(
            answer,
            Err(StoreError::NoQuorum { reached: 1, .. })
        ));
        // One round to lock, one to undo.
        assert!(started.elapsed() <= NODE_TIMEOUT * 2 + Duration::from_millis(1));
    }

    #[tokio::test(start_paused = true)]
    async fn extend_and_unlock_need_a_majority() {
        let (store, nodes) = quorum(&[FAILS]);
        let k = keys();
        store.try_lock(&k, "a", LEASE).await.unwrap();
        assert!(store.extend(&k, "a", LEASE).await.unwrap());
        // Lost on one of the two nodes that answer: no majority extended, but one answered.
        assert!(nodes[0].unlock(&k, "a").await.unwrap());
        assert!(!store.extend(&k, "a", LEASE).await.unwrap());
        assert!(!store.unlock(&k, "a").await.unwrap());

        let (store, nodes) = quorum(&[FAILS]);
        store.try_lock(&k, "a", LEASE).await.unwrap();
        assert!(store.unlock(&k, "a").await.unwrap());
        for node in &nodes {
            assert!(is_free(node, &k).await);
        }

        let (store, _nodes) = quorum(&[FAILS, FAILS]);
        let unknown = store.extend(&k, "a", LEASE).await;
        assert!(
            matches!(unknown, Err(StoreError::NoQuorum { .. })),
            "unknown, not lost"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn next_fence_is_above_every_token_a_majority_handed_out() {
        let (store, nodes) = quorum(&[FAILS]);
        let k = keys();
        let high = nodes[1].next_fence(&k, LEASE).await.unwrap() + 1_000_000;
        nodes[1].raise_fence(&k, high, LEASE).await.unwrap();
        assert_eq!(store.next_fence(&k, LEASE).await.unwrap(), high + 1);
        let next = nodes[0].next_fence(&k, LEASE).await.unwrap();
        assert_eq!(next, high + 2, "raised on the majority");

        let (store, _nodes) = quorum(&[FAILS, FAILS]);
        assert!(store.next_fence(&k, LEASE).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn the_most_recent_run_counts_and_a_newer_term_on_any_node_refuses_a_run() {
        let (store, nodes) = quorum(&[]);
        let k = keys();
        let keep = Duration::from_secs(60);
        assert!(store.record_run(&k, 5, keep).await.unwrap());
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(nodes[2].record_run(&k, 9, keep).await.unwrap());
        // The most recent run any node knows of (the others' is 4 s old).
        tokio::time::sleep(Duration::from_secs(1)).await;
        let since = store.since_last_run(&k).await.unwrap();
        assert_eq!(since, Some(Duration::from_secs(1)));
        assert!(!store.record_run(&k, 7, keep).await.unwrap());
    }
}
