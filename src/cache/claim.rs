//! The wait-or-lock loop of one key ([`WaitOrLock`]), shared by the single-key path and a
//! batch's keys that another process holds: read the value or take the lock; when the lock is
//! held, wait for its holder (woken when the value lands) and look again, until a value is
//! found, the lock is this caller's, or the budget runs out (then the fail-safe's fallback, if
//! one is kept).
//!
//! Cancellation: the lock request's guard ([`Acquiring`]) is armed before the first request is
//! sent, so a caller dropped at any `.await` here frees a lock it may have been granted; the
//! lease expiry is the backstop.

use std::ops::ControlFlow::{self, Break, Continue};
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::cache::engine::Engine;
use crate::cache::entry::StoredEntry;
use crate::cache::failsafe::Kept;
use crate::cache::fallback::{decide, Answer, AtHand, Failure};
use crate::cache::fetch::{Sorted, Start};
use crate::cache::origin::{Leader, Origin};
use crate::cache::tags::Epochs;
use crate::lock::lease::{Acquiring, HeldLock, Renewal};
use crate::stats::Event;
use crate::store::StoreExt;
use crate::store::{HolderTrace, LockStore, ReadOrLock, StoreError};
use crate::wait::waiting::{Waiter, Wake};
use crate::wire::codec::Codec;
use crate::wire::key::EntryKeys;
use crate::{Error, Source};

/// How the wait-or-lock loop of a key ended.
pub(crate) enum Claim<T> {
    /// A value to serve (fresh, stale, or a throttled fail-safe copy), found as the source says.
    Found(StoredEntry<T>, Source),
    /// The lock is this caller's: compute, with the fallback kept if there is one.
    Locked(HeldLock, Option<Kept<T>>),
    /// The budget (soft timeout or wait bound) ran out; the fail-safe's fallback answers.
    Fallback(T),
    /// The wait bound ran out with no fallback.
    Failed(Error),
    /// The read-or-lock request failed: the call's [`OnBackendError`](crate::OnBackendError) decides.
    Backend(StoreError),
}

/// Why a wait was cut short.
enum Cut {
    /// The soft timeout: look for the fallback.
    Budget,
    /// The wait bound ([`Error::WaitTimeout`]): look for the fallback, else this error.
    Bound(Error),
}

/// Waits as [`Waiter::wait`] does, cut at the soft timeout `soft` if there is one.
async fn wait_within(
    waiter: &mut Waiter<'_>,
    expires_in: Option<Duration>,
    soft: Option<Instant>,
) -> Result<Wake, Cut> {
    let wait = waiter.wait(expires_in);
    match soft {
        Some(soft) => match crate::time::timeout_at(soft, wait).await {
            Ok(woke) => woke.map_err(Cut::Bound),
            Err(_) => Err(Cut::Budget),
        },
        None => wait.await.map_err(Cut::Bound),
    }
}

impl<C: Codec> Engine<C> {
    /// The wait-or-lock loop of one key, from `start` (what the call has seen already), for a
    /// call that started at `started` (its wait bound and soft timeout count from there).
    pub(crate) async fn claim<T: DeserializeOwned + 'static>(
        &self,
        keys: &Arc<EntryKeys>,
        started: Instant,
        start: Start,
    ) -> Claim<T> {
        self.claim_traced(keys, started, start, &tracing::Span::none())
            .await
            .0
    }

    /// [`claim`](Self::claim) for the call whose span is `span`: with an OpenTelemetry layer
    /// (the `opentelemetry` feature), the lock it takes carries the span's trace context, and
    /// a lock it finds held tells whose computation it waits for (`cache/trace.rs`).
    pub(crate) async fn claim_traced<T: DeserializeOwned + 'static>(
        &self,
        keys: &Arc<EntryKeys>,
        started: Instant,
        start: Start,
        span: &tracing::Span,
    ) -> (Claim<T>, Origin) {
        let mut claiming = WaitOrLock::new(self, keys, started, start);
        claiming.trace = Leader::traceparent(span);
        claiming.run().await
    }

    /// The guard of a lock request for `keys` on this cache's store, armed before it is sent;
    /// its lease is renewed as the handle's options say, counted in its stats.
    pub(crate) fn acquiring(&self, keys: &Arc<EntryKeys>) -> Acquiring {
        let renewal = Renewal {
            counters: Some(Arc::clone(&self.core.counters)),
            ..Renewal::from(&self.options)
        };
        Acquiring::new(
            Arc::clone(&self.core.store) as Arc<dyn LockStore>,
            Arc::clone(keys),
            renewal,
        )
    }
}

/// One caller's wait-or-lock loop on one key: what it has learnt so far about the key, kept
/// between its steps. Each step either ends the loop with a [`Claim`] (`Break`) or says what to
/// do next by setting these fields (`Continue`).
struct WaitOrLock<'a, C> {
    cache: &'a Engine<C>,
    keys: &'a Arc<EntryKeys>,
    /// The lock request's drop guard: frees a lock granted to a caller that went away.
    acquiring: Acquiring,
    /// This caller's lock token, the same on every request, so a grant is recognised as ours.
    token: Arc<str>,
    /// Wake-ups, backoff and the wait bound of this call.
    waiter: Waiter<'a>,
    /// Whether the read-or-lock request returns the value: cleared after bytes that do not
    /// decode, or a value past its stale window, so the lock is taken over them to replace them.
    read_value: bool,
    /// The lock was found held (expiring in this long): wait for its holder before asking again.
    wait_for: Option<Option<Duration>>,
    /// How a value found now is reported: a hit, or after a wait.
    found: Source,
    /// After a wait, a plain GET looks first: the value has usually landed, and a GET is cheaper
    /// for the server than the read-or-lock script.
    look_first: bool,
    /// The fail-safe's budget for waiting on another caller's computation; spent once.
    soft: Option<Instant>,
    /// This caller's W3C `traceparent`, stored beside a lock it takes; `None` (nothing stored
    /// or read) without an OpenTelemetry layer.
    trace: Option<String>,
    /// The computation this caller waits for, as its holder's trace said.
    origin: Origin,
}

impl<'a, C: Codec> WaitOrLock<'a, C> {
    /// The loop as `start` says to begin it; the lock request's guard is armed here.
    fn new(cache: &'a Engine<C>, keys: &'a Arc<EntryKeys>, started: Instant, start: Start) -> Self {
        let acquiring = cache.acquiring(keys);
        let token = acquiring.token();
        let waiter = Waiter::new(cache.core.store.as_ref(), keys, &cache.options, started);
        let (read_value, wait_for) = match start {
            Start::Read => (true, None),
            Start::Replace => (false, None),
            Start::Held(expires_in) => (true, Some(expires_in)),
        };
        WaitOrLock {
            cache,
            keys,
            acquiring,
            token,
            waiter,
            read_value,
            wait_for,
            found: if wait_for.is_some() {
                Source::Waited
            } else {
                Source::Hit
            },
            look_first: false,
            soft: cache.soft_deadline(started),
            trace: None,
            origin: Origin::none(),
        }
    }

    /// Runs the loop to its end: how it ended, and whose computation it waited for.
    async fn run<T: DeserializeOwned + 'static>(mut self) -> (Claim<T>, Origin) {
        loop {
            if let Some(expires_in) = self.wait_for.take() {
                if let Break(claim) = self.wait_for_holder(expires_in).await {
                    return (claim, self.origin);
                }
            }
            if self.look_first {
                if let Break(claim) = self.look_after_wait().await {
                    return (claim, self.origin);
                }
            }
            let (answer, asked) = match self.ask_store().await {
                Ok(asked) => asked,
                Err(e) => return (Claim::Backend(e), self.origin),
            };
            match answer {
                ReadOrLock::Acquired { fence, born } => {
                    // This caller computes: its own span is the origin (`compute.rs`).
                    let claim = self.take_lock(fence, born, asked).await;
                    return (claim, Origin::none());
                }
                ReadOrLock::Value(bytes) => {
                    if let Break(claim) = self.take_value(&bytes).await {
                        return (claim, self.origin);
                    }
                }
                ReadOrLock::Held { expires_in } => self.lock_held(expires_in),
            }
        }
    }

    /// The holder of the lock found held stored its trace: the computation this caller
    /// waits for (a malformed one is ignored, logged once in a while).
    fn holder_is(&mut self, holder: Option<HolderTrace>) {
        if let Some(holder) = holder {
            if let Some(leader) = Leader::parse(holder.fence, &holder.traceparent) {
                self.origin = Origin::of(Some(leader));
            }
        }
    }

    /// Waits for the lock's holder (expiring in `expires_in`): woken when its value lands, or
    /// cut by the soft timeout or the wait bound, when the fallback may answer.
    async fn wait_for_holder<T: DeserializeOwned + 'static>(
        &mut self,
        expires_in: Option<Duration>,
    ) -> ControlFlow<Claim<T>> {
        let mut woke = wait_within(&mut self.waiter, expires_in, self.soft).await;
        if matches!(woke, Ok(Wake::Subscribed)) {
            // Listening now: a value that landed before is read here, a later one wakes us.
            // The lock was just seen held, so wait rather than retry it.
            if let Some(entry) = self.read_entry().await {
                if let Sorted::Serve(entry) = self.cache.sort(entry) {
                    return Break(Claim::Found(entry, self.found));
                }
            }
            woke = wait_within(&mut self.waiter, expires_in, self.soft).await;
        }
        if let Err(cut) = woke {
            self.after_cut(cut).await?;
        }
        self.look_first = true;
        Continue(())
    }

    /// The soft timeout or the wait bound cut a wait: read the key again, for a value that
    /// landed or the fallback kept in the store (this one, or the throttled copy a failed
    /// computation elsewhere left), which the table (`cache/fallback.rs`) serves. Without one,
    /// the soft timeout is spent and does nothing, and the wait bound is the call's error.
    async fn after_cut<T: DeserializeOwned + 'static>(
        &mut self,
        cut: Cut,
    ) -> ControlFlow<Claim<T>> {
        let kept = match self.cache.look_again::<T>(self.keys).await {
            Some(Ok(entry)) => return Break(Claim::Found(entry, self.found)),
            Some(Err(kept)) => Some(kept),
            None => None,
        };
        let failure = match cut {
            Cut::Budget => Failure::SoftTimeout,
            Cut::Bound(_) => Failure::WaitTimeout,
        };
        match (decide(failure, AtHand::kept(kept.is_some())), kept, cut) {
            (Answer::ServeKept, Some(kept), cut) => {
                if matches!(cut, Cut::Budget) {
                    self.cache.core.counters.record(Event::SoftTimeout);
                }
                Break(Claim::Fallback(kept.value))
            }
            (_, _, Cut::Bound(e)) => Break(Claim::Failed(e)),
            // The table's answer to a soft timeout without a fallback: go on, the budget spent.
            (_, _, Cut::Budget) => {
                self.soft = None;
                Continue(())
            }
        }
    }

    /// After a wait: a plain read, which finds the holder's value if it landed; a value past its
    /// stale window found there is to be replaced under the lock.
    async fn look_after_wait<T: DeserializeOwned + 'static>(&mut self) -> ControlFlow<Claim<T>> {
        if let Some(entry) = self.read_entry().await {
            match self.cache.sort(entry) {
                Sorted::Serve(entry) => return Break(Claim::Found(entry, self.found)),
                Sorted::Past(_) => self.read_value = false,
            }
        }
        Continue(())
    }

    /// Sends the read-or-lock request: its answer, and when it was asked (a lease granted counts
    /// from then). On a failure the guard frees the lock, which may have been granted anyway.
    async fn ask_store(&mut self) -> Result<(ReadOrLock, Instant), StoreError> {
        let asked = self.acquiring.sending();
        let store = &self.cache.core.store;
        let lease = self.cache.options.lease;
        let asking = match &self.trace {
            None => store
                .read_or_lock(self.keys, &self.token, lease, self.read_value)
                .await
                .map(|answer| (answer, None)),
            Some(trace) => {
                store
                    .read_or_lock_traced(self.keys, &self.token, lease, self.read_value, trace)
                    .await
            }
        };
        match asking.map(|(answer, holder)| {
            self.holder_is(holder);
            answer
        }) {
            Ok(answer) => {
                if !matches!(answer, ReadOrLock::Acquired { .. }) {
                    self.acquiring.refused();
                }
                Ok((answer, asked))
            }
            Err(e) => {
                self.acquiring.failed(&e);
                Err(e)
            }
        }
    }

    /// The store answered with the value: serve it, unless it is past its stale window, does
    /// not decode or was invalidated by a tag or a clear (its epochs are read now), when the
    /// next request takes the lock over it.
    async fn take_value<T: DeserializeOwned + 'static>(
        &mut self,
        bytes: &[u8],
    ) -> ControlFlow<Claim<T>> {
        let mut epochs = Epochs::default();
        if let Some(entry) = self
            .cache
            .read_live::<T>(self.keys, bytes, &mut epochs)
            .await
        {
            if let Sorted::Serve(entry) = self.cache.sort(entry) {
                return Break(Claim::Found(entry, self.found));
            }
        }
        self.read_value = false;
        self.look_first = false;
        Continue(())
    }

    /// The store answered that another caller holds the lock: wait for it, then read again.
    fn lock_held(&mut self, expires_in: Option<Duration>) {
        self.read_value = true;
        self.found = Source::Waited;
        self.wait_for = Some(expires_in);
    }

    /// The lock is ours (`fence`, asked at `asked`). The fallback is what the key holds now,
    /// under our lock: a value invalidated (or set) since it was kept is no fallback, and
    /// serving it or writing its throttled copy would undo that change.
    async fn take_lock<T: DeserializeOwned + 'static>(
        self,
        fence: u64,
        born: Option<u64>,
        asked: Instant,
    ) -> Claim<T> {
        let held = self.acquiring.granted(fence, asked).with_birth(born);
        // Found held and waited on, then granted with no value landed: a take-over.
        let took_over = || {
            if self.found == Source::Waited {
                self.cache.core.counters.record(Event::LockTakeover);
            }
        };
        if self.read_value {
            // The script found no value: nothing is kept.
            took_over();
            return Claim::Locked(held, None);
        }
        // Taken over a value past its window (or unreadable bytes): a value another caller
        // wrote between our read and our lock is served instead of computing again.
        match self.cache.look_again::<T>(self.keys).await {
            Some(Ok(entry)) => {
                drop(held.release().await);
                Claim::Found(entry, self.found)
            }
            kept => {
                took_over();
                Claim::Locked(held, kept.and_then(Result::err))
            }
        }
    }

    /// A plain read of the value with its epochs; errors, unreadable bytes and a value a tag or
    /// a clear invalidated count as nothing found (the read-or-lock that follows reports the
    /// first and replaces the others).
    async fn read_entry<T: DeserializeOwned + 'static>(&self) -> Option<StoredEntry<T>> {
        match self.cache.read_with_epochs(self.keys).await {
            Ok((Some(bytes), mut epochs)) => {
                self.cache.read_live(self.keys, &bytes, &mut epochs).await
            }
            Ok((None, _)) | Err(_) => None,
        }
    }
}

/// The loop's decisions, one per test, on the memory store under paused time (the store runs
/// on tokio's clock, so leases, waits and budgets elapse as the test advances it).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::Cache;
    use crate::{CallOptions, Computed};

    /// A memory cache whose calls use `options`.
    fn cache(options: CallOptions) -> Cache {
        Cache::in_memory().with_options(options)
    }

    /// The keys of `key` in `cache`'s namespace.
    fn keys(cache: &Cache, key: &str) -> Arc<EntryKeys> {
        Arc::new(EntryKeys::new(cache.namespace(), key).unwrap())
    }

    /// Takes the lock of `keys` as another process would: no guard, no renewal, so it frees
    /// itself when `lease` runs out.
    async fn hold_elsewhere(cache: &Cache, keys: &EntryKeys, lease: Duration) {
        let answer = cache
            .engine
            .core
            .store
            .read_or_lock(keys, "elsewhere", lease, false);
        assert!(matches!(answer.await.unwrap(), ReadOrLock::Acquired { .. }));
    }

    /// The fail-safe on (an hour), nothing else changed.
    fn fail_safe() -> CallOptions {
        CallOptions::default().fail_safe_for(Duration::from_secs(3600))
    }

    /// Writes `value` fresh for a second, then lets it expire (the fail-safe keeps it stored).
    async fn expired_value(cache: &Cache, key: &str, value: u64) {
        let _ = cache
            .set(key, &value, Duration::from_secs(1))
            .await
            .unwrap();
        crate::time::sleep(Duration::from_secs(2)).await;
    }

    /// Claims `keys` from the start, for a call starting now.
    async fn claim(cache: &Cache, keys: &Arc<EntryKeys>) -> Claim<u64> {
        cache
            .engine
            .claim::<u64>(keys, crate::time::now(), Start::Read)
            .await
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_lock_makes_the_claim_wait_then_find_the_value() {
        let cache = cache(CallOptions::default());
        let keys = keys(&cache, "k");
        let Claim::Locked(held, None) = claim(&cache, &keys).await else {
            panic!("the first caller takes the lock, with nothing kept");
        };
        let waiter = crate::time::spawn({
            let (cache, keys) = (cache.clone(), Arc::clone(&keys));
            async move { claim(&cache, &keys).await }
        });
        crate::time::sleep(Duration::from_millis(500)).await;
        assert!(!waiter.is_finished(), "the waiter waits for the holder");
        let computed = Computed::new(7u64);
        let stored = cache.engine.store_computed(
            held,
            &keys,
            Duration::from_secs(60),
            computed,
            (Duration::ZERO, 1),
        );
        assert_eq!(stored.await.unwrap(), (7, true));
        match waiter.await.unwrap() {
            Claim::Found(entry, Source::Waited) => assert_eq!(entry.value, Ok(7)),
            _ => panic!("the waiter finds the holder's value, as a wait"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_lock_lets_the_waiter_take_it() {
        let cache = cache(CallOptions::default().lease(Duration::from_secs(1)));
        let keys = keys(&cache, "k");
        hold_elsewhere(&cache, &keys, Duration::from_secs(1)).await;
        let started = crate::time::now();
        let Claim::Locked(_held, None) = claim(&cache, &keys).await else {
            panic!("the waiter takes the lock once its holder's lease runs out");
        };
        assert!(
            crate::time::since(started) >= Duration::from_secs(1),
            "not before the lease ran out"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_value_past_its_stale_window_is_taken_over_and_kept_as_the_fallback() {
        let cache = cache(fail_safe());
        let keys = keys(&cache, "k");
        expired_value(&cache, "k", 5).await;
        match claim(&cache, &keys).await {
            Claim::Locked(_held, Some(kept)) => assert_eq!(kept.value, 5),
            _ => panic!("the lock is taken over the expired value, which is kept"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_soft_timeout_answers_with_the_fallback() {
        let cache = cache(fail_safe().soft_timeout(Some(Duration::from_millis(100))));
        let keys = keys(&cache, "k");
        expired_value(&cache, "k", 5).await;
        hold_elsewhere(&cache, &keys, Duration::from_secs(10)).await;
        let started = crate::time::now();
        let Claim::Fallback(5) = claim(&cache, &keys).await else {
            panic!("the fallback answers at the soft timeout");
        };
        assert!(
            crate::time::since(started) < Duration::from_secs(1),
            "at the soft timeout"
        );
        assert_eq!(cache.stats().soft_timeouts, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_fallback_the_soft_timeout_does_nothing() {
        let options = fail_safe()
            .soft_timeout(Some(Duration::from_millis(100)))
            .wait_timeout(Duration::from_secs(2));
        let cache = cache(options);
        let keys = keys(&cache, "k");
        hold_elsewhere(&cache, &keys, Duration::from_secs(10)).await;
        let started = crate::time::now();
        let Claim::Failed(Error::WaitTimeout { .. }) = claim(&cache, &keys).await else {
            panic!("the wait bound ends the wait, with its error");
        };
        assert!(
            crate::time::since(started) >= Duration::from_secs(2),
            "the soft timeout did not end it"
        );
        assert_eq!(cache.stats().soft_timeouts, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_bound_answers_with_the_fallback() {
        let cache = cache(fail_safe().wait_timeout(Duration::from_secs(2)));
        let keys = keys(&cache, "k");
        expired_value(&cache, "k", 5).await;
        hold_elsewhere(&cache, &keys, Duration::from_secs(10)).await;
        let started = crate::time::now();
        let Claim::Fallback(5) = claim(&cache, &keys).await else {
            panic!("the fallback answers at the wait bound");
        };
        assert!(
            crate::time::since(started) >= Duration::from_secs(2),
            "at the wait bound"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_invalidation_while_waiting_takes_the_fallback_away() {
        let cache = cache(fail_safe().wait_timeout(Duration::from_secs(2)));
        let keys = keys(&cache, "k");
        expired_value(&cache, "k", 5).await;
        hold_elsewhere(&cache, &keys, Duration::from_secs(10)).await;
        let waiter = crate::time::spawn({
            let (cache, keys) = (cache.clone(), Arc::clone(&keys));
            async move { claim(&cache, &keys).await }
        });
        crate::time::sleep(Duration::from_millis(500)).await;
        let _ = cache.invalidate("k").await.unwrap();
        match waiter.await.unwrap() {
            Claim::Failed(Error::WaitTimeout { .. }) => {}
            Claim::Fallback(_) => panic!("the invalidated value was served as the fallback"),
            _ => panic!("the wait bound ends the wait, with its error"),
        }
    }
}
