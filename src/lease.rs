//! The lease of a held lock: the heartbeat that renews it, and the signal that says it was lost.
//!
//! The heartbeat is a spawned task owned by [`Heartbeat`]; dropping the owner aborts it, so it
//! stops on every exit path of the holder (return, error, panic, cancellation) and can never renew
//! a lock after its holder is gone.
//!
//! Invariant: the holder's own view of validity never outlasts the lock in the backend. The
//! validity deadline is counted from *before* each acquisition or renewal request was sent, so a
//! slow reply can only shorten it; and it is checked against the clock, not only the heartbeat's
//! verdict, so a process that was paused (SIGSTOP, a long GC-like stall) sees its lease as lost the
//! moment it resumes, before the heartbeat task has even run.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::key::EntryKeys;
use crate::stats::{Counters, Event};
use crate::store::LockStore;

/// The holder's view of its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseState {
    /// Until when the lock is certainly ours unless someone broke the protocol.
    valid_until: Instant,
    /// The heartbeat gave up: renewal failed past the deadline, found the lock taken, or the
    /// maximum hold time passed.
    lost: bool,
}

/// What the computation (or the job) sees of its lock: the fencing token, and whether the lease
/// still holds.
///
/// A lease is lost when renewal fails for longer than the lease (the backend unreachable, the
/// process paused) or finds the lock taken by someone else. Watch for it with
/// [`lost`](Self::lost) and stop early: a result produced after the loss is not written over a
/// newer holder's.
///
/// ```
/// use stampede_guard::Cache;
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let cache = Cache::in_memory();
/// let report = cache
///     .get_or_compute_with_lease("2019-05", Duration::from_secs(60), |lease| async move {
///         let token = lease.fencing_token().expect("computed under the lock");
///         tokio::select! {
///             _ = lease.lost() => Err("lease lost, giving up"),
///             rows = async { 42u64 } => Ok((token, rows)),
///         }
///     })
///     .await
///     .unwrap();
/// assert_eq!(report.1, 42);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Lease {
    fence: Option<u64>,
    /// `None` when there is no lock to lose.
    state: Option<watch::Receiver<LeaseState>>,
}

impl Lease {
    pub(crate) fn held(fence: u64, state: watch::Receiver<LeaseState>) -> Self {
        Lease {
            fence: Some(fence),
            state: Some(state),
        }
    }

    /// A lease for a computation that runs without the lock (the backend is down and the call's
    /// fallback is [`Fallback::ComputeUncached`](crate::Fallback::ComputeUncached)): no token,
    /// never lost.
    pub(crate) fn unlocked() -> Self {
        Lease {
            fence: None,
            state: None,
        }
    }

    /// The fencing token of this acquisition: strictly greater than every token handed out
    /// before for this key. Pass it to the systems you write to, and have them refuse writes
    /// carrying a lower token than one they have seen. `None` when computing without the lock.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fence
    }

    /// Whether the lease has been lost, by the heartbeat's verdict or by the clock.
    pub fn is_lost(&self) -> bool {
        self.state.as_ref().is_some_and(|rx| {
            let state = *rx.borrow();
            state.lost || Instant::now() >= state.valid_until
        })
    }

    /// Completes once the lease is lost; never completes while it holds.
    pub async fn lost(&self) {
        let Some(mut rx) = self.state.clone() else {
            return std::future::pending().await;
        };
        loop {
            let state = *rx.borrow_and_update();
            if state.lost {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(state.valid_until) => return,
                changed = rx.changed() => {
                    if changed.is_err() {
                        // The heartbeat is gone; it marks the lease lost as it goes.
                        return;
                    }
                }
            }
        }
    }
}

/// How the heartbeat renews a lease.
#[derive(Debug, Clone)]
pub(crate) struct Renewal {
    pub lease: Duration,
    /// Off: the lease simply runs out.
    pub renew: bool,
    /// Stop renewing this long after the acquisition.
    pub max_hold: Option<Duration>,
    /// Where renewals and losses are counted (a cache's own locks).
    pub counters: Option<Arc<Counters>>,
}

/// Owns the renewal task of one held lock; dropping it stops the task and marks the lease lost
/// (the holder is letting go), which every [`Lease`] handed out sees at once.
#[derive(Debug)]
pub(crate) struct Heartbeat {
    task: JoinHandle<()>,
    state: Arc<watch::Sender<LeaseState>>,
    lease: Duration,
}

impl Heartbeat {
    /// Starts renewing `keys.lock` for `token` every `lease / 3`. `asked` is when the acquisition
    /// request was sent: the lease counts from then.
    pub(crate) fn start(
        store: Arc<dyn LockStore>,
        keys: Arc<EntryKeys>,
        token: Arc<str>,
        asked: Instant,
        renewal: Renewal,
    ) -> Self {
        let lease = renewal.lease;
        let state = Arc::new(watch::Sender::new(LeaseState {
            valid_until: asked + lease,
            lost: false,
        }));
        let tx = Arc::clone(&state);
        let renew_until = renewal.max_hold.map(|hold| asked + hold);
        let task = tokio::spawn(async move {
            let period = lease / 3;
            let mut valid_until = asked + lease;
            loop {
                let stop_renewing =
                    !renewal.renew || renew_until.is_some_and(|until| Instant::now() >= until);
                if stop_renewing {
                    tokio::time::sleep_until(valid_until).await;
                    break;
                }
                let mut next = (Instant::now() + period).min(valid_until);
                if let Some(until) = renew_until {
                    next = next.min(until);
                }
                tokio::time::sleep_until(next).await;
                if Instant::now() >= valid_until {
                    break;
                }
                if renew_until.is_some_and(|until| Instant::now() >= until) {
                    tracing::info!(key = %keys.user, "maximum hold time reached; no more renewals");
                    continue;
                }
                let asked = Instant::now();
                let extension = tokio::time::timeout(period, store.extend(&keys, &token, lease));
                match extension.await {
                    Ok(Ok(true)) => {
                        if let Some(counters) = &renewal.counters {
                            counters.record(Event::LeaseRenewed);
                        }
                        valid_until = asked + lease;
                        tx.send_replace(LeaseState {
                            valid_until,
                            lost: false,
                        });
                    }
                    Ok(Ok(false)) => {
                        tracing::warn!(key = %keys.user, "lease lost: the lock is no longer ours");
                        break;
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(key = %keys.user, error = %e, "lease renewal failed; retrying");
                    }
                    Err(_) => {
                        tracing::warn!(key = %keys.user, "lease renewal timed out; retrying");
                    }
                }
            }
            if let Some(counters) = &renewal.counters {
                counters.record(Event::LeaseLost);
            }
            tx.send_replace(LeaseState {
                valid_until,
                lost: true,
            });
        });
        Heartbeat { task, state, lease }
    }

    pub(crate) fn state(&self) -> watch::Receiver<LeaseState> {
        self.state.subscribe()
    }

    /// Records the outcome of a renewal made outside the heartbeat (a manual extend).
    pub(crate) fn renewed(&self, asked: Instant, extended: bool) {
        self.state.send_modify(|s| {
            if s.lost {
                return;
            }
            if extended {
                s.valid_until = s.valid_until.max(asked + self.lease);
            } else {
                s.lost = true;
            }
        });
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.task.abort();
        self.state.send_modify(|s| s.lost = true);
    }
}
