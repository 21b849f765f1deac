//! A store that keeps a log of every operation it passes on: its name, what it was about, its
//! reply or failure, and when it was sent and answered (by `tokio::time`, so paused-time tests
//! read exact instants). Tests read the log to see what a call asked of its store; a
//! deterministic simulation compares the logs of two runs.
//!
//! The log holds owned, comparable descriptions, not the replies themselves: a reply's bytes
//! print alike whichever store holds them, so logs of two backends compare.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::wakeup::Listener;
use super::{BoxFuture, Clock, LockOp, LockStore, Op, Store, StoreResult};
use crate::error::BackendErrorKind;
use crate::sync::lock;
use crate::wire::key::EntryKeys;

/// One operation as the log keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Recorded {
    /// When it was sent.
    pub sent: Instant,
    /// When its answer came.
    pub answered: Instant,
    /// The typed call's name (`get`, `try_lock`, ..., and `listen`).
    pub op: &'static str,
    /// What it was about: the user keys of its entries, else the epochs' names.
    pub keys: Vec<String>,
    /// What it was answered.
    pub outcome: Outcome,
}

/// An operation's answer, as the log keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The reply, as `Debug` prints it.
    Replied(String),
    /// The failure: its kind and its message.
    Failed {
        kind: BackendErrorKind,
        message: String,
    },
}

impl Outcome {
    fn of<T: std::fmt::Debug>(answer: &StoreResult<T>) -> Self {
        match answer {
            Ok(reply) => Outcome::Replied(format!("{reply:?}")),
            Err(e) => Outcome::Failed {
                kind: e.kind(),
                message: e.to_string(),
            },
        }
    }
}

/// `inner`, with a log of everything asked of it. It is no memory store, even over one, so
/// that a cache over it reads through the log (its hit path does not skip the store).
pub(crate) struct Recording {
    inner: Arc<dyn Store>,
    log: Mutex<Vec<Recorded>>,
}

impl Recording {
    pub(crate) fn new(inner: Arc<dyn Store>) -> Self {
        Recording {
            inner,
            log: Mutex::default(),
        }
    }

    /// The operations answered so far, in the order they were answered.
    pub(crate) fn log(&self) -> Vec<Recorded> {
        lock(&self.log).clone()
    }

    /// `request`, sent now, logged when answered (a request dropped unanswered is not).
    fn record<'a, T: std::fmt::Debug + Send + 'a>(
        &'a self,
        op: &'static str,
        keys: Vec<String>,
        request: BoxFuture<'a, StoreResult<T>>,
    ) -> BoxFuture<'a, StoreResult<T>> {
        let sent = Instant::now();
        Box::pin(async move {
            let answer = request.await;
            lock(&self.log).push(Recorded {
                sent,
                answered: Instant::now(),
                op,
                keys,
                outcome: Outcome::of(&answer),
            });
            answer
        })
    }
}

impl LockStore for Recording {
    fn lock<'a>(&'a self, op: LockOp<'a>) -> BoxFuture<'a, StoreResult<super::Reply>> {
        let keys = vec![lock_keys(&op).user().to_owned()];
        self.record(op.name(), keys, self.inner.lock(op))
    }

    fn listen<'a>(&'a self, keys: &'a EntryKeys) -> BoxFuture<'a, StoreResult<Listener>> {
        let listening = self.inner.listen(keys);
        let request = Box::pin(async move { listening.await.map(Listening) });
        let logged = self.record("listen", vec![keys.user().to_owned()], request);
        Box::pin(async move { logged.await.map(|Listening(listener)| listener) })
    }

    fn clock_drift(&self, lease: Duration) -> Duration {
        self.inner.clock_drift(lease)
    }
}

impl Store for Recording {
    fn run<'a>(&'a self, op: Op<'a>) -> BoxFuture<'a, StoreResult<super::Reply>> {
        let keys = subjects(&op);
        self.record(op.name(), keys, self.inner.run(op))
    }

    fn clock(&self) -> &dyn Clock {
        self.inner.clock()
    }
}

/// A listener as the log shows it: that one was handed out.
struct Listening(Listener);

impl std::fmt::Debug for Listening {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Listener")
    }
}

/// The entry a lock operation is about.
fn lock_keys<'a>(op: &LockOp<'a>) -> &'a EntryKeys {
    match *op {
        LockOp::TryLock { keys, .. }
        | LockOp::Extend { keys, .. }
        | LockOp::Unlock { keys, .. }
        | LockOp::NextFence { keys, .. }
        | LockOp::RaiseFence { keys, .. }
        | LockOp::RecordRun { keys, .. }
        | LockOp::SinceLastRun { keys }
        | LockOp::Peek { keys } => keys,
    }
}

/// What an operation is about: the user keys of its entries, else the epochs' names.
fn subjects(op: &Op<'_>) -> Vec<String> {
    let users = |entries: &[&EntryKeys]| entries.iter().map(|k| k.user().to_owned()).collect();
    match op {
        Op::Get { keys }
        | Op::ReadOrLock { keys, .. }
        | Op::StoreAndUnlock { keys, .. }
        | Op::WriteFenced { keys, .. }
        | Op::Set { keys, .. }
        | Op::Invalidate { keys, .. }
        | Op::GetWithEpochs { keys, .. }
        | Op::Wake { keys } => vec![keys.user().to_owned()],
        Op::GetMany { entries }
        | Op::InvalidateMany { entries, .. }
        | Op::GetManyWithEpochs { entries, .. } => users(entries),
        Op::ReadOrLockMany { entries, .. } => entries
            .iter()
            .map(|(k, _, _)| k.user().to_owned())
            .collect(),
        Op::Born { clock } => vec![(*clock).to_owned()],
        Op::Epochs { names } | Op::RaiseEpochs { names, .. } => names.to_vec(),
        Op::Ping => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{LockStoreExt, MemoryStore, StoreExt};

    const LEASE: Duration = Duration::from_secs(10);

    #[tokio::test(start_paused = true)]
    async fn every_operation_is_logged_with_its_reply_and_its_time() {
        let store = Recording::new(Arc::new(MemoryStore::default()));
        let a = EntryKeys::new("t", "a").unwrap();
        let b = EntryKeys::new("t", "b").unwrap();
        let started = Instant::now();
        store
            .set(&a, b"v".to_vec(), Duration::from_secs(60), LEASE)
            .await
            .unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(store.get(&a).await.unwrap().as_deref(), Some(&b"v"[..]));
        let answers = store
            .read_or_lock_many(&[(&a, "A", true), (&b, "B", true)], LEASE)
            .await;
        assert_eq!(answers.len(), 2);
        assert!(!store.unlock(&b, "nobody").await.unwrap());
        store.listen(&a).await.unwrap();

        let log = store.log();
        let seen: Vec<(&str, Vec<String>)> = log.iter().map(|r| (r.op, r.keys.clone())).collect();
        let keys = |k: &[&str]| k.iter().map(|k| (*k).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            seen,
            [
                ("set", keys(&["a"])),
                ("get", keys(&["a"])),
                ("read_or_lock_many", keys(&["a", "b"])),
                ("unlock", keys(&["b"])),
                ("listen", keys(&["a"])),
            ]
        );
        assert_eq!(log[0].outcome, Outcome::Replied("Done".to_owned()));
        assert_eq!(
            log[1].outcome,
            Outcome::Replied(format!("Value(Some(Blob({:?})))", b"v"))
        );
        assert_eq!(log[3].outcome, Outcome::Replied("Flag(false)".to_owned()));
        assert_eq!(log[4].outcome, Outcome::Replied("Listener".to_owned()));
        assert_eq!(log[0].sent, started);
        assert_eq!(log[1].sent, started + Duration::from_secs(1));
        assert!(log.iter().all(|r| r.answered >= r.sent));
    }

    #[test]
    fn a_failure_is_logged_by_its_kind_and_message() {
        let refused = crate::store::StoreError::NoQuorum {
            reached: 1,
            needed: 2,
        };
        assert_eq!(
            Outcome::of::<()>(&Err(refused)),
            Outcome::Failed {
                kind: BackendErrorKind::Unreachable,
                message: "1 nodes answered, 2 needed".to_owned(),
            }
        );
    }
}
