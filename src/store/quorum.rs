//! The lock operations over a majority of independent stores: the store side of
//! [`Redlock`](crate::Redlock). The algorithm, its fencing rule and what it does not guarantee are
//! described in `lock/redlock.rs`, which builds a [`Lock`](crate::Lock) over this store.
//!
//! Explained in the guide: `docs/cluster-and-redlock.md` (Redlock).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::op::FromReply;
use super::{
    Acquire, Backend, BoxFuture, ConnectionOptions, LockOp, LockPeek, LockStore, LockStoreExt,
    Reply, Store, StoreError, StoreExt, StoreResult,
};
use crate::error::Error;
use crate::join::join_all;
use crate::store::wakeup::Listener;
use crate::wire::key::EntryKeys;

/// Opens each node's connection now, all at once, each within `limit`. The node timeout bounds
/// a node's answer (1/20 of the lease: 15 ms for a 300 ms lease), too short for a connection's
/// set-up, which would otherwise fall in the first acquisition and cost it its quorum (a cold
/// start answered `NoQuorum`). A node that does not answer now is no error: a majority is
/// enough, and it connects when it is next asked.
async fn warm(nodes: &[Arc<dyn Store>], limit: Duration) {
    let pings = nodes.iter().map(|node| {
        Box::pin(async move {
            let _ = tokio::time::timeout(limit, node.ping()).await;
        }) as BoxFuture<'_, ()>
    });
    join_all(pings.collect()).await;
}

/// The lock operations over a majority of independent stores.
pub(crate) struct QuorumStore {
    nodes: Vec<Arc<dyn LockStore>>,
    node_timeout: Duration,
}

impl QuorumStore {
    /// Connects to the nodes, each within the connection's connect timeout (see [`warm`]); one
    /// that does not answer now connects when it is next asked. `node_timeout` defaults to 1/20
    /// of the lease, between 10 and 250 ms.
    pub(crate) async fn connect(
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
        let mut opened = Vec::with_capacity(n);
        for url in urls {
            opened.push(Backend::RedisUrl(url).open(connection, None)?);
        }
        warm(&opened, connection.connect_timeout).await;
        let nodes = opened
            .into_iter()
            .map(|node| node as Arc<dyn LockStore>)
            .collect();
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

    /// Sends `op` to each of `nodes` at once; a node's answer is `None` if it failed, timed out
    /// or answered with another reply.
    async fn on<'a, T: FromReply + Send + 'a>(
        &'a self,
        nodes: &'a [Arc<dyn LockStore>],
        op: LockOp<'a>,
    ) -> Vec<Option<T>> {
        let timeout = self.node_timeout;
        let calls = nodes.iter().map(|node| {
            let call = node.ask::<T>(op);
            Box::pin(async move { tokio::time::timeout(timeout, call).await.ok()?.ok() })
                as BoxFuture<'a, Option<T>>
        });
        join_all(calls.collect()).await
    }

    /// [`on`](Self::on) every node.
    async fn on_all<'a, T: FromReply + Send + 'a>(&'a self, op: LockOp<'a>) -> Vec<Option<T>> {
        self.on(&self.nodes, op).await
    }

    /// The answers of a majority, or no quorum.
    fn majority<T>(&self, answers: Vec<Option<T>>) -> StoreResult<Vec<T>> {
        let answered: Vec<T> = answers.into_iter().flatten().collect();
        if answered.len() < self.quorum() {
            return Err(self.no_quorum(answered.len()));
        }
        Ok(answered)
    }

    fn no_quorum(&self, reached: usize) -> StoreError {
        StoreError::NoQuorum {
            reached,
            needed: self.quorum(),
        }
    }

    async fn try_lock_on_majority(
        &self,
        keys: &EntryKeys,
        token: &str,
        lease: Duration,
    ) -> StoreResult<Acquire> {
        let started = Instant::now();
        let answers: Vec<Option<Acquire>> =
            self.on_all(LockOp::TryLock { keys, token, lease }).await;
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
            let holders: Vec<Arc<dyn LockStore>> = fences
                .iter()
                .map(|(i, _)| Arc::clone(&self.nodes[*i]))
                .collect();
            let raise = LockOp::RaiseFence {
                keys,
                floor: token_fence,
                lease,
            };
            let raised: Vec<Option<()>> = self.on(&holders, raise).await;
            if raised.iter().flatten().count() >= self.quorum() && valid(Instant::now()) {
                return Ok(Acquire::Acquired { fence: token_fence });
            }
        }
        // Not ours: undo what we took, so others need not wait for it to expire.
        self.on_all::<bool>(LockOp::Unlock { keys, token }).await;
        if reached < self.quorum() {
            return Err(self.no_quorum(reached));
        }
        Ok(Acquire::Held { expires_in })
    }

    /// True if a majority answered true; false if a majority answered but too few said true
    /// (an extension or a release, lost on too many nodes); no quorum otherwise (unknown, not
    /// lost: the heartbeat retries until the lease runs out).
    async fn on_majority(&self, op: LockOp<'_>) -> StoreResult<bool> {
        let answers: Vec<Option<bool>> = self.on_all(op).await;
        if answers.iter().flatten().filter(|yes| **yes).count() >= self.quorum() {
            return Ok(true);
        }
        self.majority(answers)?;
        Ok(false)
    }

    /// The maximum of the bumped counters of a majority, raised on that majority: above every
    /// token any majority handed out before.
    async fn next_fence_on_majority(&self, keys: &EntryKeys, lease: Duration) -> StoreResult<u64> {
        let answers = self.on_all(LockOp::NextFence { keys, lease }).await;
        let fence = self.majority(answers)?.into_iter().max().unwrap_or(0);
        self.raise_fence_on_majority(keys, fence, lease).await?;
        Ok(fence)
    }

    /// What the nodes' looks say together: the lock is held by the token a majority holds
    /// (for the least lease left among them), and the counter is the highest (every token a
    /// majority handed out is at most it).
    fn held_by_majority(&self, peeks: Vec<LockPeek>) -> LockPeek {
        let fence = peeks.iter().filter_map(|peek| peek.fence).max();
        let holders: Vec<&(String, Option<Duration>)> = peeks
            .iter()
            .filter_map(|peek| peek.holder.as_ref())
            .collect();
        let holder = holders.iter().find_map(|(token, _)| {
            let same: Vec<Option<Duration>> = (holders.iter())
                .filter(|(other, _)| other == token)
                .map(|(_, left)| *left)
                .collect();
            (same.len() >= self.quorum()).then(|| (token.clone(), same.into_iter().flatten().min()))
        });
        LockPeek { holder, fence }
    }

    async fn raise_fence_on_majority(
        &self,
        keys: &EntryKeys,
        floor: u64,
        lease: Duration,
    ) -> StoreResult<()> {
        let raise = LockOp::RaiseFence { keys, floor, lease };
        let answers: Vec<Option<()>> = self.on_all(raise).await;
        self.majority(answers).map(drop)
    }
}

impl LockStore for QuorumStore {
    /// Each operation over every node at once, decided by a majority. A run is recorded on
    /// every node it reaches and refused if any node knows a newer term; the last run is the
    /// most recent any node of a majority knows of (every recorded run reached a majority, and
    /// any two majorities share a node).
    fn lock<'a>(&'a self, op: LockOp<'a>) -> BoxFuture<'a, StoreResult<Reply>> {
        Box::pin(async move {
            Ok(match op {
                LockOp::TryLock { keys, token, lease } => {
                    Reply::Acquire(self.try_lock_on_majority(keys, token, lease).await?)
                }
                LockOp::Extend { .. } | LockOp::Unlock { .. } => {
                    Reply::Flag(self.on_majority(op).await?)
                }
                LockOp::NextFence { keys, lease } => {
                    Reply::Number(self.next_fence_on_majority(keys, lease).await?)
                }
                LockOp::RaiseFence { keys, floor, lease } => {
                    self.raise_fence_on_majority(keys, floor, lease).await?;
                    Reply::Done
                }
                LockOp::RecordRun { .. } => {
                    let recorded: Vec<bool> = self.majority(self.on_all(op).await)?;
                    Reply::Flag(recorded.into_iter().all(|yes| yes))
                }
                LockOp::SinceLastRun { .. } => {
                    let since: Vec<Option<Duration>> = self.majority(self.on_all(op).await)?;
                    Reply::Since(since.into_iter().flatten().min())
                }
                LockOp::Peek { .. } => {
                    let peeks: Vec<LockPeek> = self.majority(self.on_all(op).await)?;
                    Reply::Peek(self.held_by_majority(peeks))
                }
            })
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
    use crate::store::MemoryStore;

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
        fn lock<'a>(&'a self, _: LockOp<'a>) -> BoxFuture<'a, StoreResult<Reply>> {
            self.answer()
        }

        fn listen<'a>(&'a self, _: &'a EntryKeys) -> BoxFuture<'a, StoreResult<Listener>> {
            self.answer()
        }
    }

    /// A quorum of three nodes, the last ones `down`, the others memory stores (also handed
    /// back, to look behind the quorum's back).
    fn quorum(down: &[Down]) -> (QuorumStore, Vec<Arc<MemoryStore>>) {
        let memory: Vec<Arc<MemoryStore>> = (down.len()..3)
            .map(|_| Arc::new(MemoryStore::default()))
            .collect();
        let mut nodes: Vec<Arc<dyn LockStore>> = memory
            .iter()
            .map(|node| Arc::clone(node) as Arc<dyn LockStore>)
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

    #[tokio::test]
    async fn a_peek_names_the_holder_of_a_majority_and_the_highest_counter() {
        let (store, memory) = quorum(&[FAILS]);
        let k = keys();
        let Acquire::Acquired { fence } = store.try_lock(&k, "A", LEASE).await.unwrap() else {
            panic!("a free lock is taken");
        };
        let peek = store.peek(&k).await.unwrap();
        let (holder, left) = peek.holder.expect("held on both live nodes");
        assert_eq!((holder.as_str(), peek.fence), ("A", Some(fence)));
        assert!(left.is_some_and(|left| left <= LEASE));

        // Freed behind the quorum's back on one of the two live nodes: no majority holds it.
        assert!(memory[0].unlock(&k, "A").await.unwrap());
        let peek = store.peek(&k).await.unwrap();
        assert_eq!((peek.holder, peek.fence), (None, Some(fence)));
    }
}
