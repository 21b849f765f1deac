//! The lease of a held lock: the heartbeat that renews it, and the signal that says it was lost.
//!
//! The heartbeat is a spawned task owned by [`Heartbeat`]; dropping the owner aborts it, so it
//! stops on every exit path of the holder (return, error, panic, cancellation) and can never renew
//! a lock after its holder is gone.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::key::EntryKeys;
use crate::store::Store;

/// What the computation sees of its lock: the fencing token, and whether the lease still holds.
///
/// A lease is lost when renewal fails for longer than the lease (the backend unreachable, the
/// process paused) or finds the lock taken by someone else. A computation can watch for that
/// with [`lost`](Self::lost) and stop early; its result is then returned to its caller but not
/// written over a newer holder's.
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
    lost: Option<watch::Receiver<bool>>,
}

impl Lease {
    pub(crate) fn held(fence: u64, lost: watch::Receiver<bool>) -> Self {
        Lease {
            fence: Some(fence),
            lost: Some(lost),
        }
    }

    /// A lease for a computation that runs without the lock (the backend is down and the call's
    /// fallback is [`Fallback::ComputeUncached`](crate::Fallback::ComputeUncached)): no token,
    /// never lost.
    pub(crate) fn unlocked() -> Self {
        Lease {
            fence: None,
            lost: None,
        }
    }

    /// The fencing token of this acquisition: strictly greater than every token handed out
    /// before for this key. Pass it to the systems you write to, and have them refuse writes
    /// carrying a lower token than one they have seen. `None` when computing without the lock.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fence
    }

    /// Whether the lease has been lost.
    pub fn is_lost(&self) -> bool {
        self.lost.as_ref().is_some_and(|rx| *rx.borrow())
    }

    /// Completes once the lease is lost; never completes while it holds.
    pub async fn lost(&self) {
        let Some(mut rx) = self.lost.clone() else {
            return std::future::pending().await;
        };
        if rx.wait_for(|lost| *lost).await.is_err() {
            // The heartbeat is gone, which happens only after the holder finished.
            std::future::pending::<()>().await;
        }
    }
}

/// Owns the renewal task of one held lock; dropping it stops the task.
#[derive(Debug)]
pub(crate) struct Heartbeat {
    task: JoinHandle<()>,
    lost: watch::Receiver<bool>,
}

impl Heartbeat {
    /// Starts renewing `keys.lock` for `token` every `lease / 3`. With `renew` off, it only marks
    /// the lease lost when it runs out.
    pub(crate) fn start(
        store: Arc<dyn Store>,
        keys: Arc<EntryKeys>,
        token: Arc<str>,
        lease: Duration,
        renew: bool,
    ) -> Self {
        let (tx, lost) = watch::channel(false);
        let task = tokio::spawn(async move {
            // Counted from before the acquisition's reply at the latest, so never too late.
            let mut valid_until = Instant::now() + lease;
            let period = lease / 3;
            loop {
                if !renew {
                    tokio::time::sleep_until(valid_until).await;
                    break;
                }
                tokio::time::sleep_until((Instant::now() + period).min(valid_until)).await;
                if Instant::now() >= valid_until {
                    break;
                }
                let asked = Instant::now();
                let renewal = tokio::time::timeout(period, store.extend(&keys, &token, lease));
                match renewal.await {
                    Ok(Ok(true)) => valid_until = asked + lease,
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
            let _ = tx.send(true);
            // Keep the sender so that receivers read "lost" rather than "closed".
            std::future::pending::<()>().await;
        });
        Heartbeat { task, lost }
    }

    pub(crate) fn lost_signal(&self) -> watch::Receiver<bool> {
        self.lost.clone()
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}
