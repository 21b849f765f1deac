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
//! forgets the lock. A holder takes the lock on every node it reaches, not just a majority, but
//! when it reached only a bare majority (a node slow or down), one such restart can hand a
//! majority to another client; several can in any case (the chaos harness's Redlock schedule sees
//! both). Run the nodes with persistence, or delay restarts by one lease, as the Redlock
//! description advises: with the delay the harness finds no overlap.
//!
//! Explained in the guide: `docs/cluster-and-redlock.md` (Redlock).

use std::sync::Arc;
use std::time::Duration;

use crate::store::quorum::QuorumStore;
use crate::store::ConnectionOptions;
use crate::wire::key::{validate_namespace, EntryKeys};
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
            namespace: crate::options::DEFAULT_NAMESPACE.to_owned(),
            nodes: Vec::new(),
            options: CallOptions::default(),
            node_timeout: None,
            connection: ConnectionOptions::default(),
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
    connection: ConnectionOptions,
}

impl std::fmt::Debug for RedlockBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockBuilder")
            .field("name", &self.name)
            .field("namespace", &self.namespace)
            .field("nodes", &self.nodes.len())
            .field("options", &self.options)
            .field("node_timeout", &self.node_timeout)
            .field("connection", &self.connection)
            .finish()
    }
}

impl RedlockBuilder {
    crate::options::setters! {
        /// The URLs of the independent masters (an odd number, at least 3).
        nodes: [impl Into<String>];
    }

    crate::options::setters! {
        /// The key prefix (default `"stampede"`).
        namespace: impl Into<String> = namespace.into();

        /// The lease, renewal, maximum hold, wait bound and backoff (see [`CallOptions`]).
        options: CallOptions;

        /// How long one node may take to answer before it counts as down (default: 1/20 of the
        /// lease, between 10 and 250 ms). Short, so that a dead node does not eat the lease.
        node_timeout: Duration = Some(node_timeout);

        /// How to reach each node: time-outs and reconnection attempts (see [`ConnectionOptions`]
        /// for the defaults). The [`node_timeout`](Self::node_timeout) still bounds each node's
        /// part of an acquisition; these bound the connection underneath it.
        ///
        /// ```
        /// use stampede_guard::{ConnectionOptions, Redlock};
        /// use std::time::Duration;
        ///
        /// let builder = Redlock::builder("sync").connection(
        ///     ConnectionOptions::default().connect_timeout(Duration::from_millis(100)),
        /// );
        /// # let _ = builder;
        /// ```
        connection: ConnectionOptions;
    }

    /// Builds the lock, connecting to every node at once, each within the connection's
    /// [`connect_timeout`](ConnectionOptions::connect_timeout): the node timeout is too short
    /// for a connection's set-up, so a first acquisition over cold connections would find no
    /// quorum. A node that does not answer now is no error; it connects when next asked.
    ///
    /// # Errors
    /// [`Error::Config`] for fewer than 3 nodes, an even number of nodes, or a URL that does not
    /// parse; [`Error::InvalidKey`] for a bad name or namespace.
    pub async fn build(self) -> Result<Lock, Error> {
        validate_namespace(&self.namespace)?;
        let keys = EntryKeys::new(&self.namespace, &self.name)?;
        let quorum = QuorumStore::connect(
            self.nodes,
            self.options.lease,
            self.node_timeout,
            &self.connection,
        )
        .await?;
        Ok(Lock::from_parts(Arc::new(quorum), keys, self.options))
    }
}
