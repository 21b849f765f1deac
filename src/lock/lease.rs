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
//!
//! Explained in the guide: `docs/lock-and-leader.md` and `docs/guarantees.md` (the fencing guarantee).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::log::LogThrottle;
use crate::options::CallOptions;
use crate::stats::{Counters, Event};
use crate::store::LockStoreExt;
use crate::store::StoreExt;
use crate::store::{LockStore, Store, StoreError, StoreResult, Stored, Write};
use crate::time::later_by;
use crate::wire::key::EntryKeys;

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
    /// fallback is [`OnBackendError::ComputeUncached`](crate::OnBackendError::ComputeUncached)): no token,
    /// never lost.
    pub(crate) fn unlocked() -> Self {
        Lease {
            fence: None,
            state: None,
        }
    }

    /// The fencing token of this acquisition: strictly greater than every token handed out
    /// before for this key, as long as the key's fencing counter survives (the crate keeps it as
    /// long as the lock and the value it guards; see [the exact guarantee](crate::Lock)). Pass
    /// it to the systems you write to, and have them refuse writes carrying a lower token than
    /// one they have seen. `None` when computing without the lock.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fence
    }

    /// Whether the lease has been lost, by the heartbeat's verdict or by the clock.
    pub fn is_lost(&self) -> bool {
        self.state.as_ref().is_some_and(|rx| {
            let state = *rx.borrow();
            state.lost || crate::time::now() >= state.valid_until
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
            // Biased, the change first: a renewal that landed as the old lease ran out is
            // read again above, not taken for a loss by a coin toss (and a seeded simulation
            // replays the same choice).
            tokio::select! {
                biased;
                changed = rx.changed() => {
                    if changed.is_err() {
                        // The heartbeat is gone; it marks the lease lost as it goes.
                        return;
                    }
                }
                _ = crate::time::sleep_until(state.valid_until) => return,
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

/// The renewal a call's options ask for, counted nowhere: a cache's own locks add its counters.
/// Built here rather than in `options.rs`, so the options stay a leaf that knows no lock.
impl From<&CallOptions> for Renewal {
    fn from(options: &CallOptions) -> Self {
        Renewal {
            lease: options.lease,
            renew: options.renew,
            max_hold: options.max_hold,
            counters: None,
        }
    }
}

/// Owns the renewal task of one held lock; dropping it stops the task and marks the lease lost
/// (the holder is letting go), which every [`Lease`] handed out sees at once.
#[derive(Debug)]
pub(crate) struct Heartbeat {
    task: JoinHandle<()>,
    state: Arc<watch::Sender<LeaseState>>,
    /// How long the lock is surely ours after a request that took or extended it: the lease,
    /// less what clock drift between the nodes that hold it may take (Redlock).
    valid_for: Duration,
}

impl Heartbeat {
    /// Starts renewing `keys.lock` for `token` every `lease / 3`. `asked` is when the acquisition
    /// request was sent: the lease counts from then, and from each renewal request after, less
    /// the store's clock drift every time.
    pub(crate) fn start(
        store: Arc<dyn LockStore>,
        keys: Arc<EntryKeys>,
        token: Arc<str>,
        asked: Instant,
        renewal: Renewal,
    ) -> Self {
        let valid_for = renewal
            .lease
            .saturating_sub(store.clock_drift(renewal.lease));
        let valid_until = later_by(asked, valid_for);
        let state = Arc::new(watch::Sender::new(LeaseState {
            valid_until,
            lost: false,
        }));
        let renewing = Renewing {
            store,
            keys,
            token,
            valid_for,
            valid_until,
            renew_until: renewal.max_hold.map(|hold| later_by(asked, hold)),
            renewal,
            state: Arc::clone(&state),
        };
        Heartbeat {
            task: crate::time::spawn(renewing.run()),
            state,
            valid_for,
        }
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
                s.valid_until = s.valid_until.max(later_by(asked, self.valid_for));
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

/// The heartbeat task of one held lock: what it renews, and until when the lease holds.
struct Renewing {
    store: Arc<dyn LockStore>,
    keys: Arc<EntryKeys>,
    token: Arc<str>,
    renewal: Renewal,
    /// How long the lock is surely ours after a request that took or extended it.
    valid_for: Duration,
    /// Counted from the last request that took or extended the lock.
    valid_until: Instant,
    /// When renewals stop: the maximum hold time after the acquisition, if one is set.
    renew_until: Option<Instant>,
    /// What every [`Lease`] of the lock sees.
    state: Arc<watch::Sender<LeaseState>>,
}

/// What one renewal request found.
enum Renewed {
    /// The lease is extended, or the request failed and is retried at the next beat (the lease
    /// still counts from the last good one).
    GoOn,
    /// The lock is no longer ours.
    Taken,
}

impl Renewing {
    /// Renews until the lease is lost, then says so.
    async fn run(mut self) {
        self.renew_while_held().await;
        self.lose();
    }

    /// Renews every third of the lease until the lease runs out (renewals off, past the maximum
    /// hold time, or failing for a whole lease) or a renewal finds the lock taken.
    async fn renew_while_held(&mut self) {
        let period = self.renewal.lease / 3;
        loop {
            if self.stops_renewing() {
                crate::time::sleep_until(self.valid_until).await;
                return;
            }
            let mut next = later_by(crate::time::now(), period).min(self.valid_until);
            if let Some(until) = self.renew_until {
                next = next.min(until);
            }
            crate::time::sleep_until(next).await;
            if crate::time::now() >= self.valid_until {
                return;
            }
            if self
                .renew_until
                .is_some_and(|until| crate::time::now() >= until)
            {
                tracing::info!(key = %self.keys.user(), "maximum hold time reached; no more renewals");
                continue;
            }
            if let Renewed::Taken = self.renew(period).await {
                return;
            }
        }
    }

    /// Whether renewing is over: renewals are off, or the maximum hold time has passed.
    fn stops_renewing(&self) -> bool {
        !self.renewal.renew
            || self
                .renew_until
                .is_some_and(|until| crate::time::now() >= until)
    }

    /// One renewal request, given up after `period`; a success moves the lease on, counted
    /// from when the request was sent.
    async fn renew(&mut self, period: Duration) -> Renewed {
        let keys = &self.keys;
        let asked = crate::time::now();
        let extension = self.store.extend(keys, &self.token, self.renewal.lease);
        let extension = async {
            if crate::planted::on(crate::planted::Bug::LeaseNotRenewed) {
                return Ok(true);
            }
            extension.await
        };
        match crate::time::timeout(period, extension).await {
            Ok(Ok(true)) => {
                if let Some(counters) = &self.renewal.counters {
                    counters.record(Event::LeaseRenewed);
                }
                self.valid_until = later_by(asked, self.valid_for);
                self.state.send_replace(LeaseState {
                    valid_until: self.valid_until,
                    lost: false,
                });
                Renewed::GoOn
            }
            Ok(Ok(false)) => {
                crate::log::throttled!(warn, key = %keys.user(), "lease lost: the lock is no longer ours");
                Renewed::Taken
            }
            Ok(Err(e)) => {
                // Retried by itself: what matters is a lease lost, logged at `warn` by its holder.
                crate::log::throttled!(info, key = %keys.user(), error = %e, "lease renewal failed; retrying");
                Renewed::GoOn
            }
            Err(_) => {
                crate::log::throttled!(info, key = %keys.user(), "lease renewal timed out; retrying");
                Renewed::GoOn
            }
        }
    }

    /// The lease is lost: counted, and every [`Lease`] sees it at once.
    fn lose(&self) {
        if let Some(counters) = &self.renewal.counters {
            counters.record(Event::LeaseLost);
        }
        self.state.send_replace(LeaseState {
            valid_until: self.valid_until,
            lost: true,
        });
    }
}

/// A fresh owner token: a random UUID, so no two acquisitions anywhere share one.
fn new_token() -> Arc<str> {
    crate::random::uuid_v4().simple().to_string().into()
}

/// The owner token of one caller's lock requests, from before the first request is sent until
/// the lock is held (or the caller gives up).
///
/// Every `.await` between sending a lock request and holding its guard is a cancellation window:
/// the server may have granted the lock while the caller is dropped before it sees the answer.
/// The token is known before the request goes out, so this is that guard: dropped while a
/// request is in flight (or after one failed, when the server may still have granted it), it frees
/// the lock in the background, so waiters are not held up for a whole lease.
pub(crate) struct Acquiring {
    store: Arc<dyn LockStore>,
    keys: Arc<EntryKeys>,
    token: Arc<str>,
    renewal: Renewal,
    /// Set from sending a request until a definite answer that it was not granted.
    maybe_granted: bool,
}

impl std::fmt::Debug for Acquiring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acquiring")
            .field("key", &self.keys.user())
            .field("maybe_granted", &self.maybe_granted)
            .finish_non_exhaustive()
    }
}

impl Acquiring {
    /// A fresh token for `keys`' lock, renewed by `renewal` once granted.
    pub(crate) fn new(store: Arc<dyn LockStore>, keys: Arc<EntryKeys>, renewal: Renewal) -> Self {
        Acquiring {
            store,
            keys,
            token: new_token(),
            renewal,
            maybe_granted: false,
        }
    }

    /// The token to send with the request.
    pub(crate) fn token(&self) -> Arc<str> {
        Arc::clone(&self.token)
    }

    /// Call right before sending a request that may take the lock; returns when it was sent, from
    /// which the lease counts.
    pub(crate) fn sending(&mut self) -> Instant {
        self.maybe_granted = true;
        crate::time::now()
    }

    /// The server answered that the lock was not taken (held by another, or a value was read).
    pub(crate) fn refused(&mut self) {
        self.maybe_granted = false;
    }

    /// The request failed: the lock is still freed on drop if the request may have been carried
    /// out (it reached the server and the answer was lost), not if it was never sent.
    pub(crate) fn failed(&mut self, error: &StoreError) {
        if !error.may_have_been_applied() {
            self.maybe_granted = false;
        }
    }

    /// The server granted the lock with `fence` to the request sent at `asked`: hold it and start
    /// renewing. The lease counts from `asked` (less clock drift: see [`Heartbeat::start`]), so
    /// the holder's view never outlasts the lock.
    pub(crate) fn granted(mut self, fence: u64, asked: Instant) -> HeldLock {
        self.maybe_granted = false;
        let heartbeat = Heartbeat::start(
            Arc::clone(&self.store),
            Arc::clone(&self.keys),
            Arc::clone(&self.token),
            asked,
            self.renewal.clone(),
        );
        HeldLock {
            store: Arc::clone(&self.store),
            keys: Arc::clone(&self.keys),
            token: Arc::clone(&self.token),
            fence,
            lease: self.renewal.lease,
            born: None,
            heartbeat: Some(heartbeat),
            armed: true,
        }
    }
}

impl Drop for Acquiring {
    fn drop(&mut self) {
        if self.maybe_granted {
            free_in_background(&self.store, &self.keys, &self.token);
        }
    }
}

/// How often at most a failure to free an abandoned lock is logged at `warn`.
const ABANDONED_LOG_EVERY: Duration = Duration::from_secs(60);

/// Frees `token`'s lock from a `Drop`, which cannot wait: best effort on the current runtime; the
/// lease running out is the backstop. Harmless when the lock is not (or no longer) `token`'s.
fn free_in_background(store: &Arc<dyn LockStore>, keys: &Arc<EntryKeys>, token: &Arc<str>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        crate::log::throttled!(warn, key = %keys.user(), "lock dropped outside a runtime; it frees itself when its lease runs out");
        return;
    };
    let store = Arc::clone(store);
    let keys = Arc::clone(keys);
    let token = Arc::clone(token);
    crate::time::spawn_on(&runtime, async move {
        if let Err(e) = store.unlock(&keys, &token).await {
            // An outage fails every such clean-up: one line a minute, with the count.
            static FAILED: LogThrottle = LogThrottle::new();
            match FAILED.due(ABANDONED_LOG_EVERY) {
                // Self-healing (the lease runs out): `info`, not a warning.
                Some(count) => tracing::info!(key = %keys.user(), count, error = %e,
                    "could not free abandoned locks (count since the last such line); each frees itself when its lease runs out"),
                None => tracing::debug!(key = %keys.user(), error = %e,
                    "could not free an abandoned lock; it frees itself when its lease runs out"),
            }
        }
    });
}

/// A lock held through the backend, renewing itself until it is handed back or dropped.
pub(crate) struct HeldLock {
    store: Arc<dyn LockStore>,
    keys: Arc<EntryKeys>,
    token: Arc<str>,
    fence: u64,
    lease: std::time::Duration,
    /// The namespace's clock read by the store in the step that granted the lock (see
    /// `ReadOrLock::Acquired`), the birth of the value computed under it; `None`: not read.
    born: Option<u64>,
    heartbeat: Option<Heartbeat>,
    /// Cleared once the lock was handed back through the backend, so `Drop` has nothing to do.
    armed: bool,
}

impl std::fmt::Debug for HeldLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldLock")
            .field("key", &self.keys.user())
            .field("fence", &self.fence)
            .finish_non_exhaustive()
    }
}

impl HeldLock {
    pub(crate) fn lease(&self) -> Lease {
        match &self.heartbeat {
            Some(heartbeat) => Lease::held(self.fence, heartbeat.state()),
            // Only after the lock was handed back, when no one asks any more.
            None => Lease::unlocked(),
        }
    }

    pub(crate) fn fence(&self) -> u64 {
        self.fence
    }

    /// The lock with the birth its grant came with, if any (see [`born`](Self::born)).
    pub(crate) fn with_birth(mut self, born: Option<u64>) -> Self {
        self.born = born;
        self
    }

    /// The namespace's clock when the store granted the lock, if it read it then: a value
    /// computed under the lock is born then, with no request of its own.
    pub(crate) fn born(&self) -> Option<u64> {
        self.born
    }

    /// The lock's name, as the user gave it.
    pub(crate) fn name(&self) -> &str {
        self.keys.user()
    }

    pub(crate) async fn extend(&self) -> StoreResult<bool> {
        let asked = crate::time::now();
        let extended = self
            .store
            .extend(&self.keys, &self.token, self.lease)
            .await?;
        if let Some(heartbeat) = &self.heartbeat {
            heartbeat.renewed(asked, extended);
        }
        Ok(extended)
    }

    /// Carries out `write` (a value, or deleting the value) in `store` (the one the lock was
    /// taken in) if our fencing token is still current, and lets the lock go.
    pub(crate) async fn store_and_unlock(
        mut self,
        store: &dyn Store,
        write: Write,
    ) -> StoreResult<Stored> {
        // Stop renewing first: a renewal racing the unlock would only report a spurious loss.
        self.heartbeat = None;
        let stored = store
            .store_and_unlock(&self.keys, &self.token, self.fence, write)
            .await?;
        self.armed = false;
        Ok(stored)
    }

    /// Lets the lock go; false if it was no longer ours.
    pub(crate) async fn release(mut self) -> StoreResult<bool> {
        self.heartbeat = None;
        let released = self.store.unlock(&self.keys, &self.token).await?;
        self.armed = false;
        Ok(released)
    }
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        self.heartbeat = None;
        if self.armed {
            free_in_background(&self.store, &self.keys, &self.token);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::*;
    use crate::store::wakeup::Listener;
    use crate::store::{Acquire, BoxFuture, LockOp, MemoryStore, Reply};

    /// Short, so a few leases pass in a test; renewed every second.
    const LEASE: Duration = Duration::from_secs(3);

    /// The memory store, counting the heartbeat's renewals, and unreachable for them on demand
    /// (a backend down while the lock is held).
    #[derive(Default)]
    struct Flaky {
        inner: MemoryStore,
        extends: AtomicUsize,
        down: AtomicBool,
    }

    impl LockStore for Flaky {
        fn lock<'a>(&'a self, op: LockOp<'a>) -> BoxFuture<'a, StoreResult<Reply>> {
            if let LockOp::Extend { .. } = op {
                self.extends.fetch_add(1, Ordering::SeqCst);
                if self.down.load(Ordering::SeqCst) {
                    let down = StoreError::NoQuorum {
                        reached: 0,
                        needed: 1,
                    };
                    return Box::pin(std::future::ready(Err(down)));
                }
            }
            self.inner.lock(op)
        }

        fn listen<'a>(&'a self, keys: &'a EntryKeys) -> BoxFuture<'a, StoreResult<Listener>> {
            self.inner.listen(keys)
        }
    }

    /// One lock to hold: its store, its keys, and where its renewals and losses are counted.
    struct Setup {
        store: Arc<Flaky>,
        keys: Arc<EntryKeys>,
        counters: Arc<Counters>,
    }

    /// A fresh store and counters for the key `report`.
    fn setup() -> Setup {
        Setup {
            store: Arc::new(Flaky::default()),
            keys: Arc::new(EntryKeys::new("t", "report").unwrap()),
            counters: Arc::new(Counters::default()),
        }
    }

    impl Setup {
        /// How the heartbeat renews: every third of [`LEASE`], or (`renew` off) never.
        fn renewal(&self, renew: bool) -> Renewal {
            Renewal {
                lease: LEASE,
                renew,
                max_hold: None,
                counters: Some(Arc::clone(&self.counters)),
            }
        }

        /// Takes the free lock as a caller does: guard first, then the request.
        async fn hold(&self, renew: bool) -> HeldLock {
            let store = Arc::clone(&self.store) as Arc<dyn LockStore>;
            let mut acquiring = Acquiring::new(store, Arc::clone(&self.keys), self.renewal(renew));
            let token = acquiring.token();
            let asked = acquiring.sending();
            let answer = self.store.try_lock(&self.keys, &token, LEASE).await;
            let Ok(Acquire::Acquired { fence }) = answer else {
                panic!("the lock is free: {answer:?}");
            };
            acquiring.granted(fence, asked)
        }

        /// Whether another caller could take the lock now (freed again if it could).
        async fn free(&self) -> bool {
            let other = "someone else";
            match self.store.try_lock(&self.keys, other, LEASE).await.unwrap() {
                Acquire::Acquired { .. } => {
                    self.store.unlock(&self.keys, other).await.unwrap();
                    true
                }
                Acquire::Held { .. } => false,
            }
        }

        /// Renewals and losses counted so far.
        fn renewals(&self) -> (u64, u64) {
            let stats = self.counters.snapshot();
            (stats.lease_renewals, stats.leases_lost)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn renewal_keeps_the_lock_alive_past_its_lease() {
        let s = setup();
        let held = s.hold(true).await;
        let lease = held.lease();
        crate::time::sleep(LEASE * 4).await;
        assert!(!s.free().await, "the lock ran out although it was renewed");
        assert!(!lease.is_lost());
        let (renewed, lost) = s.renewals();
        // Every third of a lease, for four leases.
        assert!(renewed >= 10, "{renewed} renewals");
        assert_eq!(lost, 0);
        drop(held);
    }

    #[tokio::test(start_paused = true)]
    async fn without_renewal_the_lease_runs_out() {
        let s = setup();
        let held = s.hold(false).await;
        let lease = held.lease();
        crate::time::sleep(LEASE / 2).await;
        assert!(!lease.is_lost());
        crate::time::timeout(LEASE, lease.lost())
            .await
            .expect("the lease ends when it runs out");
        // The holder gives up first, by what its clock may drift; the store a moment later.
        assert!(!s.free().await);
        crate::time::sleep(crate::time::drift_allowance(LEASE)).await;
        assert!(s.free().await);
        assert_eq!(s.store.extends.load(Ordering::SeqCst), 0);
        drop(held);
    }

    /// Found reading the lease against the simulation's drifting clocks (issue 39): a holder
    /// whose clock runs slow by the most a clock may (500 ppm) trusted its lease for up to a
    /// 2000th of it after the store let the lock go, when its request reached the store at
    /// once. The holder now gives that drift up.
    #[cfg(feature = "simulation")]
    #[tokio::test(start_paused = true)]
    async fn a_slow_clock_does_not_outlive_the_stores_lease() {
        let s = setup();
        let base = tokio::time::Instant::now();
        crate::time::drifted(base, -(crate::time::MAX_DRIFT_PPM as i32), async {
            let held = s.hold(false).await;
            let lease = held.lease();
            // A lease later on the store's clock (tokio's), the store has let the lock go...
            tokio::time::sleep(LEASE).await;
            // ...and the holder, on its slow clock, must know it has too.
            assert!(
                lease.is_lost(),
                "the holder still trusts a lease the store ended"
            );
            assert!(s.free().await);
            drop(held);
        })
        .await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_lock_taken_by_another_is_lost_at_the_next_renewal() {
        let s = setup();
        let held = s.hold(true).await;
        let lease = held.lease();
        // Behind the holder's back: its lock freed and taken by another caller.
        assert!(s.store.unlock(&s.keys, &held.token).await.unwrap());
        let thief = s.store.try_lock(&s.keys, "thief", LEASE).await.unwrap();
        assert!(matches!(thief, Acquire::Acquired { .. }));
        // Seen at the next renewal (a third of the lease), well before the lease runs out.
        crate::time::timeout(LEASE / 2, lease.lost())
            .await
            .expect("the loss is seen at the next renewal");
        assert!(lease.is_lost());
        assert_eq!(s.renewals(), (0, 1));
        drop(held);
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_failing_for_a_whole_lease_lose_it() {
        let s = setup();
        let held = s.hold(true).await;
        let lease = held.lease();
        s.store.down.store(true, Ordering::SeqCst);
        // A failed renewal is retried, not taken for a loss...
        crate::time::sleep(LEASE / 2).await;
        assert!(s.store.extends.load(Ordering::SeqCst) >= 1);
        assert!(!lease.is_lost());
        // ...until the lease counted from the last good request runs out.
        crate::time::timeout(LEASE, lease.lost())
            .await
            .expect("the lease is lost once it runs out");
        crate::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(s.renewals(), (0, 1), "the heartbeat gave up");
        drop(held);
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_the_guard_stops_the_heartbeat_and_frees_the_lock() {
        let s = setup();
        let held = s.hold(true).await;
        let lease = held.lease();
        crate::time::sleep(LEASE).await;
        let renewals = s.store.extends.load(Ordering::SeqCst);
        assert!(renewals >= 2, "{renewals} renewals");
        drop(held);
        assert!(lease.is_lost(), "the holder let go");
        // The background release runs at the next turn of the runtime.
        crate::time::sleep(Duration::from_millis(1)).await;
        assert!(s.free().await, "freed at once, not when its lease runs out");
        crate::time::sleep(LEASE * 3).await;
        assert_eq!(
            s.store.extends.load(Ordering::SeqCst),
            renewals,
            "no renewal after the drop"
        );
    }
}
