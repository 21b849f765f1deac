//! A store behind its circuit breaker: every operation asks the [`Breaker`] first and reports
//! what the backend answered; a refused operation fails at once, unreachable, without touching
//! the backend. The embedded store is never wrapped (it cannot fail).
//!
//! Explained in the guide: `docs/outages.md`.

use std::sync::Arc;
use std::time::Duration;

use super::breaker::{watch_period, Admit, Breaker, InFlight};
use super::wakeup::Listener;
use super::{
    Acquire, Blob, BoxFuture, LockStore, ManyWithEpochs, MemoryStore, ReadOrLock, Store,
    StoreError, StoreResult, Stored, Write,
};
use crate::wire::key::EntryKeys;

/// How long after a probe that met a lost connection it tries once more.
const PROBE_RETRY: Duration = Duration::from_millis(100);

/// `inner`, whose every operation goes through `breaker`.
pub(crate) struct GuardedStore {
    inner: Arc<dyn Store>,
    breaker: Arc<Breaker>,
    /// Lock writes wait for replicas
    /// ([`ConnectionOptions::wait_for_replicas`](crate::ConnectionOptions::wait_for_replicas)):
    /// the stall watchdog leaves them out.
    slow_locks: bool,
}

impl GuardedStore {
    /// `inner` behind `breaker`, and the breaker's stall watchdog, spawned on the caller's
    /// runtime; it ends when the store is dropped. `slow_locks`: the lock writes wait for
    /// replicas, and the watchdog does not count them.
    pub(crate) fn new(inner: Arc<dyn Store>, breaker: Arc<Breaker>, slow_locks: bool) -> Self {
        let stall = breaker.stall();
        if !stall.is_zero() {
            let watched = Arc::downgrade(&breaker);
            let every = watch_period(stall);
            tokio::spawn(async move {
                let mut ticks = tokio::time::interval(every);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    ticks.tick().await;
                    let Some(breaker) = watched.upgrade() else {
                        return;
                    };
                    breaker.check_stall();
                }
            });
        }
        GuardedStore {
            inner,
            breaker,
            slow_locks,
        }
    }

    /// `op` if the breaker lets it through, with its outcome recorded; otherwise the
    /// breaker's refusal at once (`op` is dropped unpolled: nothing was sent). A request still
    /// waiting when the breaker opens fails at once (dropped: the connection discards its
    /// answer).
    fn through<'a, T: Send + 'a>(
        &'a self,
        op: BoxFuture<'a, StoreResult<T>>,
    ) -> BoxFuture<'a, StoreResult<T>> {
        self.through_as(op, false)
    }

    /// As [`through`](Self::through), for a lock write: when it waits for replicas, it waits
    /// unwatched by the stall watchdog (see [`Breaker::sending_slow`]).
    fn lock_write<'a, T: Send + 'a>(
        &'a self,
        op: BoxFuture<'a, StoreResult<T>>,
    ) -> BoxFuture<'a, StoreResult<T>> {
        self.through_as(op, self.slow_locks)
    }

    /// The request's place in the breaker's count: `slow`, out of the watchdog's.
    fn in_flight(&self, slow: bool) -> InFlight<'_> {
        if slow {
            self.breaker.sending_slow()
        } else {
            self.breaker.sending()
        }
    }

    fn through_as<'a, T: Send + 'a>(
        &'a self,
        op: BoxFuture<'a, StoreResult<T>>,
        slow: bool,
    ) -> BoxFuture<'a, StoreResult<T>> {
        match self.admit() {
            Ok(()) => {
                let mut waiting = self.in_flight(slow);
                Box::pin(async move {
                    let outcome = tokio::select! {
                        biased;
                        outcome = op => outcome,
                        _ = waiting.opened.changed() => Err(self.breaker.aborted()),
                    };
                    waiting.ended(outcome.as_ref().err());
                    outcome
                })
            }
            Err(refused) => Box::pin(std::future::ready(Err(refused))),
        }
    }

    fn admit(&self) -> StoreResult<()> {
        match self.breaker.admit() {
            Admit::Pass => Ok(()),
            Admit::Refuse => Err(self.breaker.refusal()),
            Admit::RefuseAndProbe => {
                self.probe();
                Err(self.breaker.refusal())
            }
        }
    }

    /// One `PING` over the backend's connection, in the background: no caller waits on it,
    /// and its outcome closes the breaker or opens it for another cool-down.
    fn probe(&self) {
        let inner = Arc::clone(&self.inner);
        let breaker = Arc::clone(&self.breaker);
        // Bounded: on a black hole the probe must not keep the breaker half-open for a whole
        // response time-out.
        let limit = breaker.stall().max(breaker.cool_down());
        tokio::spawn(async move {
            let ping = |inner: Arc<dyn Store>, breaker: Arc<Breaker>| async move {
                tokio::time::timeout(limit, inner.ping())
                    .await
                    .unwrap_or_else(|_| Err(breaker.aborted()))
            };
            let mut outcome = ping(Arc::clone(&inner), Arc::clone(&breaker)).await;
            // A connection that died during the outage fails its first request after it: the
            // client reconnects on that failure, so one more try soon after tells whether the
            // backend is back, instead of a whole cool-down later.
            if outcome.as_ref().is_err_and(StoreError::connection_lost) {
                tokio::time::sleep(PROBE_RETRY).await;
                outcome = ping(inner, Arc::clone(&breaker)).await;
            }
            breaker.record(outcome.as_ref().err());
        });
    }
}

impl LockStore for GuardedStore {
    fn try_lock<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<Acquire>> {
        self.lock_write(self.inner.try_lock(keys, token, lease))
    }

    fn extend<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<bool>> {
        self.lock_write(self.inner.extend(keys, token, lease))
    }

    /// Not refused by an open breaker: freeing a lock is clean-up, mostly of a lock request
    /// that the breaker itself cut off (it may have been granted). Refused, the lock would
    /// block its key for a whole lease once the backend answers; sent, it frees it then (a
    /// frozen server runs it when it thaws). Nobody waits on it but its own task.
    fn unlock<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
    ) -> BoxFuture<'a, StoreResult<bool>> {
        self.inner.unlock(keys, token)
    }

    fn next_fence<'a>(
        &'a self,
        keys: &'a EntryKeys,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<u64>> {
        self.lock_write(self.inner.next_fence(keys, lease))
    }

    fn raise_fence<'a>(
        &'a self,
        keys: &'a EntryKeys,
        floor: u64,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<()>> {
        self.lock_write(self.inner.raise_fence(keys, floor, lease))
    }

    fn record_run<'a>(
        &'a self,
        keys: &'a EntryKeys,
        fence: u64,
        keep: Duration,
    ) -> BoxFuture<'a, StoreResult<bool>> {
        self.through(self.inner.record_run(keys, fence, keep))
    }

    fn since_last_run<'a>(
        &'a self,
        keys: &'a EntryKeys,
    ) -> BoxFuture<'a, StoreResult<Option<Duration>>> {
        self.through(self.inner.since_last_run(keys))
    }

    fn listen<'a>(&'a self, keys: &'a EntryKeys) -> BoxFuture<'a, StoreResult<Listener>> {
        self.through(self.inner.listen(keys))
    }

    fn clock_drift(&self, lease: Duration) -> Duration {
        self.inner.clock_drift(lease)
    }
}

impl Store for GuardedStore {
    fn get<'a>(&'a self, keys: &'a EntryKeys) -> BoxFuture<'a, StoreResult<Option<Blob>>> {
        self.through(self.inner.get(keys))
    }

    fn read_or_lock<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
        lease: Duration,
        read_value: bool,
    ) -> BoxFuture<'a, StoreResult<ReadOrLock>> {
        self.lock_write(self.inner.read_or_lock(keys, token, lease, read_value))
    }

    fn store_and_unlock<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
        fence: u64,
        write: Write,
    ) -> BoxFuture<'a, StoreResult<Stored>> {
        self.through(self.inner.store_and_unlock(keys, token, fence, write))
    }

    fn write_fenced<'a>(
        &'a self,
        keys: &'a EntryKeys,
        fence: u64,
        write: Write,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<bool>> {
        self.through(self.inner.write_fenced(keys, fence, write, lease))
    }

    fn set<'a>(
        &'a self,
        keys: &'a EntryKeys,
        value: Vec<u8>,
        ttl: Duration,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<()>> {
        self.through(self.inner.set(keys, value, ttl, lease))
    }

    fn invalidate<'a>(
        &'a self,
        keys: &'a EntryKeys,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<()>> {
        self.through(self.inner.invalidate(keys, lease))
    }

    fn get_many<'a>(
        &'a self,
        entries: &'a [&'a EntryKeys],
    ) -> BoxFuture<'a, StoreResult<Vec<Option<Blob>>>> {
        self.through(self.inner.get_many(entries))
    }

    fn read_or_lock_many<'a>(
        &'a self,
        entries: &'a [(&'a EntryKeys, &'a str, bool)],
        lease: Duration,
    ) -> BoxFuture<'a, Vec<StoreResult<ReadOrLock>>> {
        if let Err(refused) = self.admit() {
            let answers = entries.iter().map(|_| Err(refused.clone())).collect();
            return Box::pin(std::future::ready(answers));
        }
        let mut waiting = self.in_flight(self.slow_locks);
        Box::pin(async move {
            let answers = tokio::select! {
                biased;
                answers = self.inner.read_or_lock_many(entries, lease) => answers,
                _ = waiting.opened.changed() => {
                    let aborted = self.breaker.aborted();
                    entries.iter().map(|_| Err(aborted.clone())).collect()
                }
            };
            // One answer is enough to know the backend answers; otherwise the first failure.
            let answered = answers.iter().any(Result::is_ok);
            let failure = answers.iter().find_map(|a| a.as_ref().err());
            waiting.ended(if answered { None } else { failure });
            answers
        })
    }

    fn invalidate_many<'a>(
        &'a self,
        entries: &'a [&'a EntryKeys],
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<()>> {
        self.through(self.inner.invalidate_many(entries, lease))
    }

    fn wake<'a>(&'a self, keys: &'a EntryKeys) -> BoxFuture<'a, StoreResult<()>> {
        self.through(self.inner.wake(keys))
    }

    fn born<'a>(&'a self, clock: &'a str) -> BoxFuture<'a, StoreResult<u64>> {
        self.through(self.inner.born(clock))
    }

    fn epochs<'a>(&'a self, names: &'a [String]) -> BoxFuture<'a, StoreResult<Vec<u64>>> {
        self.through(self.inner.epochs(names))
    }

    fn raise_epochs<'a>(
        &'a self,
        names: &'a [String],
        floor: u64,
    ) -> BoxFuture<'a, StoreResult<()>> {
        self.through(self.inner.raise_epochs(names, floor))
    }

    fn get_with_epochs<'a>(
        &'a self,
        keys: &'a EntryKeys,
        names: &'a Arc<[String]>,
    ) -> BoxFuture<'a, StoreResult<(Option<Blob>, Vec<u64>)>> {
        self.through(self.inner.get_with_epochs(keys, names))
    }

    fn get_many_with_epochs<'a>(
        &'a self,
        entries: &'a [&'a EntryKeys],
        names: &'a [String],
    ) -> BoxFuture<'a, StoreResult<ManyWithEpochs>> {
        self.through(self.inner.get_many_with_epochs(entries, names))
    }

    fn ping(&self) -> BoxFuture<'_, StoreResult<()>> {
        self.through(self.inner.ping())
    }

    fn now_ms(&self) -> u64 {
        self.inner.now_ms()
    }

    fn clock_synced(&self) -> bool {
        self.inner.clock_synced()
    }

    fn breaker(&self) -> Option<&Breaker> {
        Some(&self.breaker)
    }

    fn as_memory(&self) -> Option<&MemoryStore> {
        self.inner.as_memory()
    }

    fn sync_clock(&self) -> BoxFuture<'_, ()> {
        self.inner.sync_clock()
    }
}
