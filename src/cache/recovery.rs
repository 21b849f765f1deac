//! Auto-recovery ([`CacheBuilder::auto_recovery`](crate::CacheBuilder::auto_recovery)): the
//! writes (`set`, `invalidate`, `invalidate_many`, `invalidate_tag(s)`, `clear`) that could not
//! reach the backend because it was unreachable or busy are queued in this process and
//! replayed, fenced, when it answers (an epoch's raise only ever raises it).
//! The machinery one file down: `recovery/queue.rs` (the bounded queue, locked state only) and
//! `recovery/replay.rs` (replaying one key, and the background task that drains the queue).
//!
//! What it promises, and what it does not (a process that exits loses its queue: that is an
//! outbox's job) is in the guide: `docs/after-commit.md` and `docs/guarantees.md`.

mod gate;
mod queue;
mod replay;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use queue::Queue;
pub(crate) use queue::{Intent, Queued};

use std::any::Any;

use crate::error::BackendErrorKind;
use crate::stats::{Counters, Event};
use crate::store::{Store, StoreError, StoreResult};
use crate::wire::key::EntryKeys;
use crate::Error;

/// The bounds of the auto-recovery queue ([`CacheBuilder::auto_recovery`](crate::CacheBuilder::auto_recovery)).
///
/// Defaults: 10,000 keys (a tag or a clear waiting counts as one) and 64 MiB of queued value
/// bytes (an invalidation holds none). A write
/// that would pass either bound is refused with [`Error::RecoveryQueueFull`]: the queue never
/// grows past them, and never drops a write it accepted to make room. A bound of 0 refuses
/// every write that could not be applied (recovery in name only).
///
/// ```
/// use stampede_guard::RecoveryOptions;
///
/// let options = RecoveryOptions::default().max_entries(50_000).max_bytes(16 << 20);
/// assert_eq!(options.get_max_entries(), 50_000);
/// assert_eq!(options.get_max_bytes(), 16 << 20);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
#[must_use]
pub struct RecoveryOptions {
    /// How many keys may wait at once; each key holds one intent, the newest.
    max_entries: usize,
    /// How many value bytes the queued `set`s may hold at once (their encoded values).
    max_bytes: usize,
}

impl Default for RecoveryOptions {
    /// 10,000 keys, 64 MiB: an outage of minutes on a busy service, at a bounded cost.
    fn default() -> Self {
        RecoveryOptions {
            max_entries: 10_000,
            max_bytes: 64 << 20,
        }
    }
}

impl RecoveryOptions {
    crate::options::setters! {
        /// At most this many keys wait for the backend at once (default 10,000).
        ///
        /// ```
        /// let options = stampede_guard::RecoveryOptions::default().max_entries(100);
        /// assert_eq!(options.get_max_entries(), 100);
        /// ```
        max_entries: usize;

        /// At most this many bytes of encoded values wait at once (default 64 MiB).
        ///
        /// ```
        /// let options = stampede_guard::RecoveryOptions::default().max_bytes(1 << 20);
        /// assert_eq!(options.get_max_bytes(), 1 << 20);
        /// ```
        max_bytes: usize;
    }

    /// The bound on keys.
    ///
    /// ```
    /// assert_eq!(stampede_guard::RecoveryOptions::default().get_max_entries(), 10_000);
    /// ```
    pub fn get_max_entries(&self) -> usize {
        self.max_entries
    }

    /// The bound on value bytes.
    ///
    /// ```
    /// assert_eq!(stampede_guard::RecoveryOptions::default().get_max_bytes(), 64 << 20);
    /// ```
    pub fn get_max_bytes(&self) -> usize {
        self.max_bytes
    }
}

/// What became of a write ([`Cache::set`](crate::Cache::set),
/// [`Cache::invalidate`](crate::Cache::invalidate),
/// [`Cache::invalidate_many`](crate::Cache::invalidate_many),
/// [`Cache::invalidate_tag`](crate::Cache::invalidate_tag),
/// [`Cache::invalidate_tags`](crate::Cache::invalidate_tags), [`Cache::clear`](crate::Cache::clear)).
///
/// A caller after a database commit needs to know: `Applied`, the cache holds the change now;
/// `Queued`, Redis could not be reached and the change waits in this process's
/// [auto-recovery](crate::CacheBuilder::auto_recovery) queue, replayed within about a second of
/// the server answering again, and until then this instance does not serve the key (or, for a
/// tag or a clear, any value of the namespace) from Redis before replaying it.
/// Either way the row is committed: answer success, and say which if the client cares (the
/// guide's [after a commit](https://github.com/stampede-guard/stampede-guard/blob/main/docs/after-commit.md)).
///
/// ```
/// use stampede_guard::{Cache, Written};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), stampede_guard::Error> {
/// let cache = Cache::in_memory();
/// let written = cache.invalidate("2019-05").await?;
/// assert_eq!(written, Written::Applied);
/// assert_eq!(written.as_str(), "applied");
/// # Ok(())
/// # }
/// ```
#[must_use = "a write after a database commit must know whether the cache applied it or only queued it"]
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Written {
    /// The backend carried out the write.
    Applied,
    /// The backend was unreachable or busy: the write waits in the auto-recovery queue.
    Queued,
    /// The backend failed and [`OnBackendError::ComputeUncached`](crate::OnBackendError::ComputeUncached)
    /// answered a `set` as skipped, as if the value had been evicted at once (never an
    /// invalidation: a lost invalidation is an error, or queued).
    Skipped,
}

impl Written {
    /// Whether the backend carried out the write.
    ///
    /// ```
    /// assert!(stampede_guard::Written::Applied.is_applied());
    /// ```
    pub fn is_applied(self) -> bool {
        self == Written::Applied
    }

    /// Whether the write waits in the auto-recovery queue.
    ///
    /// ```
    /// assert!(stampede_guard::Written::Queued.is_queued());
    /// ```
    pub fn is_queued(self) -> bool {
        self == Written::Queued
    }

    /// `"applied"`, `"queued"` or `"skipped"`: for a response header or a JSON field.
    ///
    /// ```
    /// assert_eq!(stampede_guard::Written::Queued.as_str(), "queued");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Written::Applied => "applied",
            Written::Queued => "queued",
            Written::Skipped => "skipped",
        }
    }
}

/// The queue and what its replay needs, shared by the cache's handles and the background task.
pub(crate) struct Shared {
    /// A std mutex: held for a few map operations, never across an `.await`.
    queue: Mutex<Queue>,
    /// The queue's length, read without the lock on every read of a key (the fast path when
    /// nothing is queued, which is almost always).
    len: AtomicUsize,
    /// Wakes the background task: something was queued, or the cache was dropped.
    wake: Notify,
    /// Set by the drop guard ([`Recovery`]): the background task ends.
    stopped: AtomicBool,
    store: Arc<dyn Store>,
    counters: Arc<Counters>,
    /// The namespace's clear key, whose node's clock a replayed raise reads its floor from
    /// (as `invalidate_tag` does).
    clock: String,
}

impl Shared {
    /// Runs `f` on the locked queue, then publishes its length (to `len` and to `Stats`).
    fn with_queue<R>(&self, f: impl FnOnce(&mut Queue) -> R) -> R {
        let mut queue = crate::sync::lock(&self.queue);
        let answer = f(&mut queue);
        let len = queue.len();
        // Under the lock: two changes must not publish their lengths in the wrong order (a
        // length of 0 with a write queued would let a read skip its replay).
        self.len.store(len, Ordering::Release);
        self.counters.set_recovery_queued(len);
        drop(queue);
        answer
    }
}

/// The cache's handle on auto-recovery, owned by the cache's `Inner`: when the last handle of the
/// cache drops, this guard stops the background task (as mini-redis's `DbDropGuard` does). What
/// is still queued then is lost with the process's memory.
pub(crate) struct Recovery {
    shared: Arc<Shared>,
}

impl Drop for Recovery {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::Release);
        // `notify_one` keeps a permit if the task is not waiting now: it cannot miss this.
        self.shared.wake.notify_one();
    }
}

impl Recovery {
    /// The queue, bounded by `options`, and its background task (spawned on the current tokio
    /// runtime: `CacheBuilder::build` runs on one).
    pub(crate) fn start(
        options: RecoveryOptions,
        store: Arc<dyn Store>,
        counters: Arc<Counters>,
        clock: String,
    ) -> Self {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::new(options.max_entries, options.max_bytes)),
            len: AtomicUsize::new(0),
            wake: Notify::new(),
            stopped: AtomicBool::new(false),
            store,
            counters,
            clock,
        });
        crate::time::spawn(replay::drain(Arc::clone(&shared)));
        Recovery { shared }
    }

    /// How many keys have a write waiting for the backend (for `Cache::health` and `Stats`).
    pub(crate) fn len(&self) -> usize {
        self.shared.len.load(Ordering::Acquire)
    }

    /// Queues `batch` (all or nothing) and wakes the replay: `Queued`, or
    /// [`Error::RecoveryQueueFull`] when it does not fit.
    fn queue(&self, batch: Vec<Queued>) -> Result<Written, Error> {
        let pushed = self.shared.with_queue(|queue| queue.push(batch));
        match pushed {
            Ok(()) => {
                self.shared.wake.notify_one();
                Ok(Written::Queued)
            }
            Err(limit) => {
                self.shared.counters.record(Event::RecoveryRefused);
                Err(Error::RecoveryQueueFull {
                    queued: self.len(),
                    limit,
                })
            }
        }
    }

    /// Writes of these keys reached the backend: any intent queued for them is older.
    fn forget<'a>(&self, keys: impl IntoIterator<Item = &'a EntryKeys>) {
        if self.len() == 0 {
            return;
        }
        self.shared.with_queue(|queue| {
            for keys in keys {
                queue.forget(&keys.value);
            }
        });
    }

    /// What this process holds for `keys` while a write of theirs waits for the backend (see
    /// [`Held`]).
    pub(crate) fn held<T: Clone + 'static>(&self, keys: &EntryKeys) -> Held<T> {
        if self.len() == 0 {
            return Held::NotQueued;
        }
        let held = crate::sync::lock(&self.shared.queue).held(&keys.value);
        match held {
            None => Held::NotQueued,
            Some((seq, value)) => match value.and_then(|held| held.downcast_ref::<T>().cloned()) {
                Some(value) => Held::Value(value),
                None => Held::Computing(seq),
            },
        }
    }

    /// Holds `value`, computed while the write `seq` of `keys` waited, until that write is
    /// replayed (or a newer one replaces it).
    pub(crate) fn hold<T: Send + Sync + 'static>(&self, keys: &EntryKeys, seq: u64, value: T) {
        let value: Arc<dyn Any + Send + Sync> = Arc::new(value);
        crate::sync::lock(&self.shared.queue).hold(&keys.value, seq, value);
    }

    /// Epochs raised directly (`invalidate_tag`, or `clear` when `cleared`): the raises queued
    /// for them are older, and a clear covers every queued raise.
    fn forget_raised(&self, names: &[String], cleared: bool) {
        if self.len() == 0 {
            return;
        }
        self.shared.with_queue(|queue| {
            queue.drop_held();
            if cleared {
                queue.forget_raises();
            }
            for name in names {
                queue.forget(name);
            }
        });
    }

    /// Replays the intent queued for `keys`, if any, here and now (a read of the key must not
    /// see Redis before its replay), after every queued raise of an epoch: which values a
    /// queued clear or tag kills is only known once they are read, so no read of the
    /// namespace sees Redis before those raises.
    pub(crate) async fn replay(&self, keys: &EntryKeys) -> StoreResult<()> {
        if self.len() == 0 || crate::planted::on(crate::planted::Bug::QueuedReplayedAfterRead) {
            return Ok(());
        }
        replay::replay_raises(&self.shared).await?;
        replay::replay_key(&self.shared, &keys.value)
            .await
            .map(drop)
    }
}

/// What a process holds for a key whose write waits for the backend: while the write is queued,
/// Redis still holds what that write replaces, so the key is computed without the cache once
/// (under the in-process flight) and that value is served to every later read until the replay,
/// as [`Source::Held`](crate::Source::Held): one computation per key and instance per outage,
/// not one per request.
pub(crate) enum Held<T> {
    /// No write of the key is queued.
    NotQueued,
    /// A write is queued (this sequence number) and nothing is held for it yet.
    Computing(u64),
    /// The value held for it.
    Value(T),
}

/// Whether a write that failed with `error` is queued: the backend was unreachable or busy, which
/// passes by itself. A refusal (permission, role, a foreign key type), a full memory or an
/// unknown error is the caller's to see, as without recovery: replaying would meet it again.
fn queues(error: &StoreError) -> bool {
    matches!(
        error.kind(),
        BackendErrorKind::Unreachable | BackendErrorKind::Busy
    )
}
