//! Run one job on exactly one machine of many: the others stand by and take over when the active
//! one dies, pauses past its lease, loses Redis, or shuts down.
//!
//! States: standby (waiting for the lock) → active (holding it, running the job every interval)
//! → back to standby when the lease is lost, or stopped on shutdown.
//!
//! The schedule survives a change of leader: the start of every run is recorded with the lock's
//! state (by the store's clock, fenced by the term's token, so a paused old leader cannot move it
//! back), and a new leader's first run comes one interval after the last recorded one, not at
//! once. A daily job that ran at 02:00 is not run again at 02:00:05 because its leader died. The job gets a
//! [`JobContext`] with the fencing token and a cancellation that fires when the lease is lost;
//! the runner also drops a running job the moment the lease is lost, and never starts a run once
//! the lease is past its deadline (which a process resuming from a pause sees before anything
//! else).
//!
//! Guide: [Leader election](https://github.com/stampede-guard/stampede-guard/blob/main/docs/lock-and-leader.md#leader-election).

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

use crate::{Error, Lease, Lock};

/// Where an instance stands.
///
/// For status pages and health endpoints, its text form is one lowercase word, the same in
/// `Display`, [`as_str`](Self::as_str) and `serde` (a JSON string): `"standby"`, `"active"`,
/// `"stopped"`. The fencing token of an active term is left out of the word (it is a field of
/// [`Role::Active`] when a page wants it).
///
/// ```
/// use stampede_guard::leader::Role;
///
/// let role = Role::Active { fencing_token: 7 };
/// assert_eq!(role.to_string(), "active");
/// assert_eq!(
///     serde_json::json!({ "leader": role }).to_string(),
///     r#"{"leader":"active"}"#
/// );
/// assert_eq!(serde_json::to_string(&Role::Standby).unwrap(), r#""standby""#);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Role {
    /// Waiting for the lock.
    Standby,
    /// Holding the lock and running the job.
    Active {
        /// The fencing token of this term.
        fencing_token: u64,
    },
    /// Shut down.
    Stopped,
}

impl Role {
    /// The role as one lowercase word: `"standby"`, `"active"` or `"stopped"` (the text of
    /// `Display` and of `serde`).
    ///
    /// ```
    /// use stampede_guard::leader::Role;
    /// assert_eq!(Role::Stopped.as_str(), "stopped");
    /// ```
    pub fn as_str(&self) -> &'static str {
        match self {
            Role::Standby => "standby",
            Role::Active { .. } => "active",
            Role::Stopped => "stopped",
        }
    }
}

// `Display` and `serde` both give the word of [`Role::as_str`], so a status page's JSON reads
// `"leader": "active"`.
crate::stats::text_is_as_str!(Role);

/// What a job run sees of its term as the active instance.
///
/// ```
/// # use stampede_guard::leader::JobContext;
/// async fn copy_counters(ctx: JobContext) -> Result<(), String> {
///     if ctx.is_cancelled() {
///         return Ok(()); // the lease is gone: another instance is (or will be) active
///     }
///     let token = ctx.fencing_token(); // written along with the data, checked by the store
///     # let _ = token;
///     Ok(())
/// }
/// ```
#[derive(Debug, Clone)]
pub struct JobContext {
    fencing_token: u64,
    lease: Lease,
}

impl JobContext {
    /// The fencing token of the current term: strictly greater than any earlier term's.
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// Whether the lease is lost (the run should stop; its writes may be refused).
    pub fn is_cancelled(&self) -> bool {
        self.lease.is_lost()
    }

    /// Completes when the lease is lost.
    pub async fn cancelled(&self) {
        self.lease.lost().await
    }
}

/// The longest interval between runs: longer ones are taken as this (ten years), so every
/// deadline the runner computes is representable.
const LONGEST_INTERVAL: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Runs a job on one instance at a time.
///
/// ```
/// use stampede_guard::leader::{Leader, Role};
/// use stampede_guard::Lock;
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), stampede_guard::Error> {
/// let lock = Lock::builder("copy-counters").build().await?; // .redis_url(..) across machines
/// let leader = Leader::new(lock, Duration::from_millis(10));
/// let status = leader.status();
/// let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
/// let counted = runs.clone();
/// let shutdown = async {
///     tokio::time::sleep(Duration::from_millis(100)).await;
/// };
/// leader
///     .run(
///         move |ctx| {
///             let counted = counted.clone();
///             async move {
///                 assert!(ctx.fencing_token() > 0);
///                 counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
///                 Ok::<(), String>(())
///             }
///         },
///         shutdown,
///     )
///     .await?;
/// assert!(runs.load(std::sync::atomic::Ordering::SeqCst) > 0);
/// assert_eq!(*status.borrow(), Role::Stopped);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Leader {
    lock: Lock,
    every: Duration,
    status: watch::Sender<Role>,
}

/// Why a term as the active instance ended.
enum TermEnd {
    LeaseLost,
    Shutdown,
}

impl Leader {
    /// A runner that, while active, starts `job` every `every` (the next run starts when both
    /// the interval has passed and the previous run has finished). `every` is taken between
    /// 1 ms and ten years.
    pub fn new(lock: Lock, every: Duration) -> Self {
        Leader {
            lock,
            every: every.clamp(Duration::from_millis(1), LONGEST_INTERVAL),
            status: watch::Sender::new(Role::Standby),
        }
    }

    /// The current role, updated on every change.
    pub fn status(&self) -> watch::Receiver<Role> {
        self.status.subscribe()
    }

    /// Stands by, runs the job while active, and returns to standby whenever the lease is lost,
    /// until `shutdown` completes; then releases the lock at once (so a standby takes over without
    /// waiting for the lease to run out) and returns.
    ///
    /// A job's error is logged (`tracing`) and the next run starts on schedule. Backend errors
    /// while standing by are logged and retried with backoff: the connection reconnects by itself.
    ///
    /// # Errors
    /// None today: every failure is retried. The `Result` leaves room for a fatal configuration
    /// error to surface.
    pub async fn run<F, Fut, E>(
        self,
        mut job: F,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), Error>
    where
        F: FnMut(JobContext) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        tokio::pin!(shutdown);
        let name = self.lock.name().to_owned();
        let mut failures = 0u32;
        loop {
            self.set(Role::Standby, &name);
            let acquired = tokio::select! {
                // Biased here and below, shutdown (and a lost lease) before more work: a fixed
                // order, which a seeded simulation replays (an unbiased select draws one).
                biased;
                () = &mut shutdown => break,
                acquired = self.lock.acquire() => acquired,
            };
            let guard = match acquired {
                Ok(guard) => guard,
                Err(Error::WaitTimeout { .. }) => continue,
                Err(e) => {
                    crate::log::throttled!(warn, lock = %name, error = %e.chain(), "standby: cannot reach the lock; retrying");
                    let delay = self.lock.options().backoff.delay(failures);
                    failures = failures.saturating_add(1);
                    tokio::select! {
                        biased;
                        () = &mut shutdown => break,
                        () = crate::time::sleep(delay) => continue,
                    }
                }
            };
            failures = 0;
            let fencing_token = guard.fencing_token();
            self.set(Role::Active { fencing_token }, &name);
            let lease = guard.lease();
            match self
                .term(&lease, fencing_token, &mut job, &mut shutdown)
                .await
            {
                TermEnd::LeaseLost => {
                    crate::log::throttled!(warn, lock = %name, fencing_token, "lease lost: job cancelled, standing by");
                    drop(guard);
                }
                TermEnd::Shutdown => {
                    if let Err(e) = guard.release().await {
                        tracing::warn!(lock = %name, error = %e.chain(), "release on shutdown failed");
                    }
                    break;
                }
            }
        }
        self.set(Role::Stopped, &name);
        Ok(())
    }

    /// One term as the active instance.
    async fn term<F, Fut, E>(
        &self,
        lease: &Lease,
        fencing_token: u64,
        job: &mut F,
        shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> TermEnd
    where
        F: FnMut(JobContext) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        let first_run = tokio::select! {
            biased;
            () = &mut *shutdown => return TermEnd::Shutdown,
            () = lease.lost() => return TermEnd::LeaseLost,
            first_run = self.first_run() => first_run,
        };
        let mut ticks = crate::time::interval_at(first_run, self.every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = &mut *shutdown => return TermEnd::Shutdown,
                () = lease.lost() => return TermEnd::LeaseLost,
                _ = ticks.tick() => {}
            }
            // A process resuming from a pause sees its deadline passed here, before any run.
            if lease.is_lost() {
                return TermEnd::LeaseLost;
            }
            match self
                .lock
                .record_run(fencing_token, self.keep_record())
                .await
            {
                Ok(true) => {}
                // A newer term has run: this one is over, whatever the lease says.
                Ok(false) => return TermEnd::LeaseLost,
                Err(e) => {
                    // The backend is away: the lease is lost next, logged at `warn` then.
                    crate::log::throttled!(info, lock = %self.lock.name(), error = %e.chain(),
                        "could not record the run's start; a new leader may run it early");
                }
            }
            // Recording took a round trip, in which the process may have been paused past its
            // lease: look again, right before the run.
            if lease.is_lost() {
                return TermEnd::LeaseLost;
            }
            let ctx = JobContext {
                fencing_token,
                lease: lease.clone(),
            };
            tokio::select! {
                biased;
                () = &mut *shutdown => return TermEnd::Shutdown,
                () = lease.lost() => return TermEnd::LeaseLost,
                outcome = job(ctx) => {
                    if let Err(e) = outcome {
                        crate::log::throttled!(warn, lock = %self.lock.name(), error = %e, "job run failed");
                    }
                }
            }
        }
    }

    /// When a new term's first run is due: one interval after the last recorded run started, or
    /// now if none is recorded. If the record cannot be read, the run is not held back (a missed
    /// run is worse than an early one; the job's fencing token still guards its writes).
    async fn first_run(&self) -> tokio::time::Instant {
        let since = self.lock.since_last_run().await;
        // Counted from the answer, not the request: the reply's latency can only delay the run.
        let now = crate::time::now();
        match since {
            Ok(Some(since)) => now + self.every.saturating_sub(since),
            Ok(None) => now,
            Err(e) => {
                crate::log::throttled!(warn, lock = %self.lock.name(), error = %e.chain(),
                    "could not read when the job last ran; running it now");
                now
            }
        }
    }

    /// How long a run's record must outlive it: until the next run is due, and a lease more so
    /// that a standby taking over then still finds it. Capped, so any interval is representable.
    fn keep_record(&self) -> Duration {
        self.every
            .saturating_add(self.lock.options().get_lease())
            .min(LONGEST_INTERVAL)
    }

    fn set(&self, role: Role, name: &str) {
        let changed = self.status.send_if_modified(|current| {
            let changed = *current != role;
            *current = role;
            changed
        });
        if changed {
            tracing::info!(lock = %name, ?role, "leader role changed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Role;

    /// A status page shows one word per role, the same in text and in JSON.
    #[test]
    fn every_role_is_one_lowercase_word_in_display_and_json() {
        for (role, word) in [
            (Role::Standby, "standby"),
            (Role::Active { fencing_token: 42 }, "active"),
            (Role::Stopped, "stopped"),
        ] {
            assert_eq!(role.to_string(), word);
            assert_eq!(
                serde_json::to_value(role).unwrap(),
                serde_json::Value::String(word.to_owned())
            );
        }
    }
}
