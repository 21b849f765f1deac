//! A store behind its circuit breaker: every operation asks the [`Breaker`] first and reports
//! what the backend answered; a refused operation fails at once, unreachable, without touching
//! the backend. The embedded store is never wrapped (it cannot fail).
//!
//! Explained in the guide: `docs/outages.md`.

use std::sync::Arc;
use std::time::Duration;

use super::breaker::{watch_period, Admit, Breaker};
use super::wakeup::Listener;
use super::{
    BoxFuture, Class, Clock, LockOp, LockStore, Op, Reply, Store, StoreError, StoreExt, StoreResult,
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
            crate::time::spawn(async move {
                let mut ticks = crate::time::interval(every);
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

    /// `request` (an operation of `class`, already built) if the breaker lets it through, with
    /// its outcome recorded: `failure` picks the failure out of it, if any. Otherwise the
    /// breaker's refusal at once (`request` is dropped unpolled: nothing was sent). A request
    /// still waiting when the breaker opens fails at once (dropped: the connection discards
    /// its answer). Clean-up is sent whatever the breaker says, and not counted.
    fn through<'a, T: Send + 'a>(
        &'a self,
        class: Class,
        request: BoxFuture<'a, StoreResult<T>>,
        failure: fn(&StoreResult<T>) -> Option<&StoreError>,
    ) -> BoxFuture<'a, StoreResult<T>> {
        // A lock write that waits for replicas waits unwatched by the stall watchdog (see
        // [`Breaker::sending_slow`]).
        let slow = match class {
            Class::CleanUp => return request,
            Class::LockWrite => self.slow_locks,
            Class::Plain => false,
        };
        if let Err(refused) = self.admit() {
            return Box::pin(std::future::ready(Err(refused)));
        }
        // Taken before the request is sent: an opening from here on is seen.
        let opened = self.breaker.opening();
        let waiting = if slow {
            self.breaker.sending_slow()
        } else {
            self.breaker.sending()
        };
        Box::pin(async move {
            let outcome = tokio::select! {
                biased;
                outcome = request => outcome,
                _ = opened => Err(self.breaker.aborted()),
            };
            waiting.ended(failure(&outcome));
            outcome
        })
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
        crate::time::spawn(async move {
            let ping = |inner: Arc<dyn Store>, breaker: Arc<Breaker>| async move {
                crate::time::timeout(limit, inner.ping())
                    .await
                    .unwrap_or_else(|_| Err(breaker.aborted()))
            };
            let mut outcome = ping(Arc::clone(&inner), Arc::clone(&breaker)).await;
            // A connection that died during the outage fails its first request after it: the
            // client reconnects on that failure, so one more try soon after tells whether the
            // backend is back, instead of a whole cool-down later.
            if outcome.as_ref().is_err_and(StoreError::connection_lost) {
                crate::time::sleep(PROBE_RETRY).await;
                outcome = ping(inner, Arc::clone(&breaker)).await;
            }
            breaker.record(outcome.as_ref().err());
        });
    }
}

/// Not refused by an open breaker: freeing a lock ([`Class::CleanUp`]) is clean-up, mostly of a
/// lock request that the breaker itself cut off (it may have been granted). Refused, the lock
/// would block its key for a whole lease once the backend answers; sent, it frees it then (a
/// frozen server runs it when it thaws). Nobody waits on it but its own task.
impl LockStore for GuardedStore {
    fn lock<'a>(&'a self, op: LockOp<'a>) -> BoxFuture<'a, StoreResult<Reply>> {
        self.through(op.class(), self.inner.lock(op), failure)
    }

    fn listen<'a>(&'a self, keys: &'a EntryKeys) -> BoxFuture<'a, StoreResult<Listener>> {
        self.through(Class::Plain, self.inner.listen(keys), |outcome| {
            outcome.as_ref().err()
        })
    }

    fn clock_drift(&self, lease: Duration) -> Duration {
        self.inner.clock_drift(lease)
    }
}

impl Store for GuardedStore {
    fn run<'a>(&'a self, op: Op<'a>) -> BoxFuture<'a, StoreResult<Reply>> {
        self.through(op.class(), self.inner.run(op), failure)
    }

    fn clock(&self) -> &dyn Clock {
        self.inner.clock()
    }
}

/// What the breaker counts of a reply: its failure. Of a batch's answers per entry, one answer
/// is enough to know the backend answers; otherwise the first failure.
fn failure(outcome: &StoreResult<Reply>) -> Option<&StoreError> {
    match outcome {
        Ok(Reply::PerEntry(answers)) if !answers.iter().any(Result::is_ok) => {
            answers.iter().find_map(|a| a.as_ref().err())
        }
        Ok(_) => None,
        Err(e) => Some(e),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::stats::{BreakerState, Counters};
    use crate::store::recording::Recording;
    use crate::store::{BreakerOptions, LockStoreExt, ReadOrLock};

    /// A backend that does not answer (too few nodes: unreachable, as a refused connection).
    fn unreachable() -> StoreError {
        StoreError::NoQuorum {
            reached: 0,
            needed: 1,
        }
    }

    /// A backend that fails every operation, unreachable, except a batch lock, of which it
    /// answers the first entry (held) and fails the others.
    struct HalfDown;

    impl LockStore for HalfDown {
        fn lock<'a>(&'a self, _: LockOp<'a>) -> BoxFuture<'a, StoreResult<Reply>> {
            Box::pin(std::future::ready(Err(unreachable())))
        }

        fn listen<'a>(&'a self, _: &'a EntryKeys) -> BoxFuture<'a, StoreResult<Listener>> {
            Box::pin(std::future::ready(Err(unreachable())))
        }
    }

    impl Store for HalfDown {
        fn run<'a>(&'a self, op: Op<'a>) -> BoxFuture<'a, StoreResult<Reply>> {
            let Op::ReadOrLockMany { entries, .. } = op else {
                return Box::pin(std::future::ready(Err(unreachable())));
            };
            let held = Ok(ReadOrLock::Held { expires_in: None });
            let answers = (0..entries.len())
                .map(|i| {
                    if i == 0 {
                        held.clone()
                    } else {
                        Err(unreachable())
                    }
                })
                .collect();
            Box::pin(std::future::ready(Ok(Reply::PerEntry(answers))))
        }

        fn clock(&self) -> &dyn Clock {
            self
        }
    }

    impl Clock for HalfDown {
        fn now_ms(&self) -> u64 {
            0
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_breaker_refuses_by_the_class_of_each_operation() {
        let backend = Arc::new(Recording::new(Arc::new(HalfDown)));
        let options = BreakerOptions::default()
            .failures(3)
            .cool_down(Duration::from_secs(60))
            .stall(Duration::from_millis(500));
        let breaker = Arc::new(Breaker::new(options, Arc::new(Counters::default())));
        let inner = Arc::clone(&backend) as Arc<dyn Store>;
        let store = GuardedStore::new(inner, Arc::clone(&breaker), false);
        let (a, b) = (
            EntryKeys::new("t", "a").unwrap(),
            EntryKeys::new("t", "b").unwrap(),
        );
        let batch = [(&a, "A", true), (&b, "B", true)];

        // One answer of a batch is enough to know the backend answers.
        for _ in 0..5 {
            let answers = store
                .read_or_lock_many(&batch, Duration::from_secs(1))
                .await;
            assert!(answers[0].is_ok() && answers[1].is_err());
        }
        assert_eq!(breaker.state(), BreakerState::Closed);
        for _ in 0..3 {
            assert!(store.get(&a).await.is_err());
        }
        assert_eq!(breaker.state(), BreakerState::Open);
        let sent = backend.log().len();

        // Open: a read and a batch fail at once, unsent...
        let refused = store.get(&a).await;
        assert!(matches!(refused, Err(StoreError::BreakerOpen { .. })));
        let answers = store
            .read_or_lock_many(&batch, Duration::from_secs(1))
            .await;
        assert!(answers
            .iter()
            .all(|a| matches!(a, Err(StoreError::BreakerOpen { .. }))));
        assert_eq!(backend.log().len(), sent, "nothing reached the backend");
        // ...but freeing a lock is clean-up: sent, and answered by the backend itself.
        let freed = store.unlock(&a, "A").await;
        assert!(matches!(freed, Err(StoreError::NoQuorum { .. })));
        let log = backend.log();
        assert_eq!(log.len(), sent + 1);
        assert_eq!(log[sent].op, "unlock");
    }
}
