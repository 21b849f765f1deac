//! The fail-safe's decisions, one small function each, so that every path that reads, waits or
//! computes (the single-key path here, the batch path per key) takes them the same way:
//!
//! - keeping an entry past its stale window (`Engine::sort` in `fetch.rs` found it so) as a
//!   [`Kept`] fallback, and reading it again for one (`Engine::look_again`);
//! - when a caller's soft timeout falls (`Engine::soft_deadline`);
//! - how the fallback is served (`Engine::serve_fallback`, `Engine::fall_back`), when the table
//!   of `cache/fallback.rs` answers a failure with it.
//!
//! Invariants: a kept value is served only as [`Source::FailSafe`], never as a hit, and never
//! enters the near tier; a throttled copy is written only under the computing caller's lock and
//! fencing token, in the same step that frees the lock, so it never overwrites a newer value.

use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::cache::engine::Engine;
use crate::cache::entry::StoredEntry;
use crate::cache::fallback::{decide, Answer, AtHand, Failure};
use crate::cache::fetch::Sorted;
use crate::time::later_by;
use crate::wire::codec::Codec;
use crate::wire::key::EntryKeys;
use crate::{Error, Fetched, Source};

/// A value past its stale window, kept as the fallback of the computation that replaces it.
#[derive(Debug, Clone)]
pub(crate) struct Kept<T> {
    pub value: T,
    /// Its stored bytes, from which a throttled copy is made after a failure.
    pub bytes: Vec<u8>,
}

impl<C: Codec> Engine<C> {
    /// The fallback an expired `entry` offers this handle: its value, if the fail-safe is on and
    /// it is a value (a remembered failure is never a fallback).
    pub(crate) fn keep<T>(&self, entry: StoredEntry<T>, bytes: &[u8]) -> Option<Kept<T>> {
        if !self.options.fail_safe() {
            return None;
        }
        entry.value.ok().map(|value| Kept {
            value,
            bytes: bytes.to_vec(),
        })
    }

    /// When a call that started at `started` stops waiting and answers with its fallback: at
    /// its soft timeout, if a soft timeout is set and the table serves a fail-safe value then,
    /// which it can only keep with the fail-safe on (without one, the call goes on).
    pub(crate) fn soft_deadline(&self, started: Instant) -> Option<Instant> {
        let has = AtHand::kept(self.options.fail_safe());
        if decide(Failure::SoftTimeout, has) != Answer::ServeKept {
            return None;
        }
        self.options
            .soft_timeout
            .map(|budget| later_by(started, budget))
    }

    /// Serves a kept value as the fallback (counted with the call's outcome, in `fetch`).
    pub(crate) fn serve_fallback<T>(&self, value: T) -> Fetched<T> {
        Fetched::new(value, Source::FailSafe)
    }

    /// A computation or a wait ended with `error`: the fallback if one is kept and the table
    /// (`cache/fallback.rs`) serves it for this error, else the error. Only the kept value is
    /// at hand here: a failure to remember was written when the lock was let go.
    pub(crate) fn fall_back<T>(
        &self,
        error: Error,
        kept: Option<Kept<T>>,
        keys: &EntryKeys,
    ) -> Result<Fetched<T>, Error> {
        let has = AtHand::kept(kept.is_some());
        let answer = Failure::of(&error).map(|failure| decide(failure, has));
        match (answer, kept) {
            (Some(Answer::ServeKept), Some(kept)) => {
                crate::log::throttled!(warn, key = %keys.user(), error = %error.chain(), "serving the fail-safe value");
                Ok(self.serve_fallback(kept.value))
            }
            _ => Err(error),
        }
    }

    /// Reads the key again once a waiter's budget ran out (its soft timeout, or its wait bound):
    /// a value that landed meanwhile (`Ok(Some(entry))`, to serve), or the fallback kept in the
    /// store (`Err(kept)`), or nothing.
    pub(crate) async fn look_again<T: DeserializeOwned + 'static>(
        &self,
        keys: &EntryKeys,
    ) -> Option<Result<StoredEntry<T>, Kept<T>>> {
        let (bytes, mut epochs) = self.read_with_epochs(keys).await.ok()?;
        let bytes = bytes?;
        // A value a tag or a clear invalidated is no fallback either.
        let entry = self.read_live::<T>(keys, &bytes, &mut epochs).await?;
        match self.sort(entry) {
            Sorted::Serve(entry) => Some(Ok(entry)),
            Sorted::Past(entry) => self.keep(entry, &bytes).map(Err),
        }
    }
}

/// The fail-safe's decisions, each on a memory cache under paused time (its clock is tokio's).
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::{StoreExt, Write};
    use crate::wire::codec::Bincode;
    use crate::Cache;
    use crate::CallOptions;

    /// A memory cache whose calls use `options`.
    fn cache(options: CallOptions) -> Engine<Bincode> {
        Cache::in_memory().with_options(options).engine
    }

    /// The fail-safe on (an hour), with a stale window of ten seconds.
    fn fail_safe() -> CallOptions {
        CallOptions::default()
            .fail_safe_for(Duration::from_secs(3600))
            .stale_for(Duration::from_secs(10))
    }

    /// A value of 5 fresh until `fresh_until_ms` (store clock); a fail-safe copy if `throttled`.
    fn entry(fresh_until_ms: u64, throttled: bool) -> StoredEntry<u64> {
        StoredEntry {
            value: Ok(5),
            fresh_until_ms,
            compute_ms: 0,
            fence: 1,
            throttled,
            born: 1,
            tags: Vec::new(),
        }
    }

    /// Whether `cache` sorts `entry` for serving.
    fn served(cache: &Engine<Bincode>, entry: StoredEntry<u64>) -> bool {
        matches!(cache.sort(entry), Sorted::Serve(_))
    }

    #[tokio::test(start_paused = true)]
    async fn a_value_is_served_through_its_stale_window_and_replaced_after() {
        let cache = cache(fail_safe());
        let now = cache.core.store.now_ms();
        assert!(served(&cache, entry(now + 1, false)), "fresh");
        assert!(
            served(&cache, entry(now - 9_000, false)),
            "stale, within its window"
        );
        assert!(
            !served(&cache, entry(now - 11_000, false)),
            "past its stale window"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttled_copy_is_served_until_its_throttle_ends() {
        let cache = cache(fail_safe());
        let now = cache.core.store.now_ms();
        assert!(served(&cache, entry(now + 1, true)), "within its throttle");
        assert!(
            !served(&cache, entry(now - 1, true)),
            "its throttle over: no stale window"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_value_is_kept_and_only_with_the_fail_safe_on() {
        let bytes = [1u8, 2, 3];
        let kept = cache(fail_safe()).keep(entry(0, false), &bytes).unwrap();
        assert_eq!((kept.value, kept.bytes), (5, bytes.to_vec()));
        let failure = StoredEntry::<u64> {
            value: Err("down".into()),
            ..entry(0, false)
        };
        assert!(cache(fail_safe()).keep(failure, &bytes).is_none());
        assert!(cache(CallOptions::default())
            .keep(entry(0, false), &bytes)
            .is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_soft_timeout_counts_only_with_the_fail_safe_on() {
        let soft = Some(Duration::from_millis(100));
        let started = crate::time::now();
        let on = cache(fail_safe().soft_timeout(soft));
        assert_eq!(
            on.soft_deadline(started),
            Some(started + Duration::from_millis(100))
        );
        let off = cache(CallOptions::default().soft_timeout(soft));
        assert_eq!(off.soft_deadline(started), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_fallback_answers_a_failure_or_a_time_out_but_not_a_caller_bug() {
        let cache = cache(fail_safe());
        let keys = EntryKeys::new(&cache.core.namespace, "k").unwrap();
        let kept = || {
            Some(Kept {
                value: 5u64,
                bytes: Vec::new(),
            })
        };
        let failed = || Error::compute(std::io::Error::other("down"));
        let answer = cache.fall_back(failed(), kept(), &keys).unwrap();
        assert_eq!((answer.value, answer.source), (5, Source::FailSafe));
        let timed_out = Error::WaitTimeout {
            key: "k".into(),
            waited: Duration::from_secs(1),
        };
        assert!(cache.fall_back(timed_out, kept(), &keys).is_ok());
        let bug = Error::Config("bad".into());
        assert!(matches!(
            cache.fall_back(bug, kept(), &keys),
            Err(Error::Config(_))
        ));
        assert!(matches!(
            cache.fall_back(failed(), None::<Kept<u64>>, &keys),
            Err(Error::Compute(_))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttled_copy_is_the_kept_value_fenced_and_fresh_for_the_throttle() {
        let cache = cache(fail_safe().fail_safe_throttle(Duration::from_secs(5)));
        let keys = EntryKeys::new(&cache.core.namespace, "k").unwrap();
        let kept = cache
            .encode_value(&5u64, Duration::from_secs(1), Duration::ZERO, 3, (1, &[]))
            .unwrap();
        let Some(Write::Keep { bytes, at_least }) = cache.throttled_copy(&kept, 9) else {
            panic!("a copy to keep");
        };
        assert_eq!(at_least, Duration::from_secs(5));
        let copy = cache.read_stored::<u64>(&keys, &bytes).unwrap();
        assert_eq!((copy.value, copy.fence, copy.throttled), (Ok(5), 9, true));
        assert_eq!(copy.fresh_until_ms, cache.core.store.now_ms() + 5_000);
    }
}
