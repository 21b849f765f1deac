//! The single-key path of the `get_or_compute` family, from the call to a hit, in the order it
//! runs: the quick hits (near tier, embedded store), the call's span and per-call object
//! ([`KeyCall`]), the one read of the value with its epochs, the entry decoded and judged (alive
//! by its epochs, worth serving by its freshness), the tiers fed, the value served and the call
//! counted. A miss goes on in `miss.rs` (the in-process flight, then the distributed part); what
//! a failure falls back to is decided by the table of `fallback.rs`.
//!
//! Every other path that reads a stored entry (the batch, `get`, the claim loop) judges it with
//! the same functions, so a value is served alike whichever way it was read.
//!
//! Explained in the guide: `docs/how-it-works.md` (the protocol and its round trips); the path
//! of a hit, step by step: `docs/architecture.md`.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tracing::Instrument;

use crate::cache::bounds::{CacheValue, ComputeFailure, ComputedFuture};
use crate::cache::engine::Engine;
use crate::cache::entry::StoredEntry;
use crate::cache::fallback::Answer;
use crate::cache::freshness::{judge, unit_draw, worth, Via, Worth};
use crate::cache::tags::{outlived, Epochs, SEEN_PER_BATCH};
use crate::cache::tiers::{Read, Tiers, HELD_AFTER};
use crate::cache::trace::CallSpan;
use crate::stats::{Answered, Event};
use crate::store::{Blob, StoreExt, StoreResult};
use crate::time::saturate;
use crate::wire::codec::Codec;
use crate::wire::envelope::Envelope;
use crate::wire::key::EntryKeys;
use crate::wire::shape;
use crate::{Error, Fetched, Lease, Source};

/// One call of the single-key path, from its first read to its outcome: the engine it runs on,
/// its keys, its TTL, when it began to wait (the in-process flight or the lock) and its
/// computation. Its steps are the methods below (a hit) and those of `miss.rs`, `compute.rs` and
/// `uncached.rs`; the batch's counterpart is `Batch`. `T` and `E` are the value's and the
/// computation's error's types: parameters of the call, because the bound that names them
/// (`Fut: ComputedFuture<T, E>`) takes them as a trait's parameters, which do not fix them for an
/// `impl` block (E0207).
pub(crate) struct KeyCall<'e, C, T, E, F> {
    pub(crate) engine: &'e Engine<C>,
    pub(crate) keys: Arc<EntryKeys>,
    /// Whole: every TTL below is at most FOREVER.
    pub(crate) ttl: Duration,
    /// Since when this call waits: for the wait bound and the soft timeout.
    pub(crate) started: Instant,
    pub(crate) f: F,
    /// The call's span (`cache/trace.rs`), disabled without a subscriber that wants it: the
    /// steps record on it the tier that answered and the fence a computation ran under.
    pub(crate) span: tracing::Span,
    /// The call holds no `T` and no `E`: a `fn` type, which owns neither.
    pub(crate) types: PhantomData<fn() -> (T, E)>,
}

impl<'e, C: Codec, T: CacheValue, E: ComputeFailure, F, Fut: ComputedFuture<T, E>>
    KeyCall<'e, C, T, E, F>
where
    F: FnOnce(Lease) -> Fut + Send + 'static,
{
    /// `started`: when the call began (its miss waits from when it joins the flight).
    pub(crate) fn new(
        engine: &'e Engine<C>,
        keys: EntryKeys,
        ttl: Duration,
        started: Instant,
        f: F,
        span: tracing::Span,
    ) -> Self {
        KeyCall {
            engine,
            keys: Arc::new(keys),
            ttl,
            started,
            f,
            span,
            types: PhantomData,
        }
    }

    /// Records the tier that answered the call on its span.
    pub(crate) fn answered_by(&self, tier: &'static str) {
        if !self.span.is_disabled() {
            self.span.record("tier", tier);
        }
    }

    /// The call after the quick hits (`fetch`'s near and memory hits): a near copy when XFetch
    /// is on, else the first read.
    async fn first(self) -> Result<Fetched<T>, Error> {
        // The near tier with XFetch on: a fresh copy is served through `serve`, which draws as
        // for a Redis hit (without XFetch, `fetch` answered near hits before coming here).
        if self.engine.options.early_refresh_beta > 0.0 {
            if let Some(entry) = self.engine.near_copy::<T>(self.keys.user()) {
                self.answered_by("near");
                return (self.serve(entry, Source::Hit)).map(|fetched| fetched.via(Via::Near));
            }
        }
        self.read_first().await
    }

    /// The call's first read: a near copy's ticket first, for the answer to go into the near
    /// tier; one read of the value with its epochs; on a miss, the in-process single flight
    /// ([`share_or_load`](Self::share_or_load), in `miss.rs`).
    async fn read_first(self) -> Result<Fetched<T>, Error> {
        let engine = self.engine;
        let keys = &*self.keys;
        engine.clock_ready().await;
        let ticket = (engine.core.tiers.as_ref()).and_then(|tiers| tiers.ticket(keys));

        // The hit path: one MGET (the value and its epochs), no script, no in-process
        // bookkeeping. A value past its stale window is not a hit: it goes on to the lock,
        // taken over it.
        let mut start = Start::Read;
        let read = match engine.first_read_or_held::<T>(&self.keys).await {
            Ok(read) => read,
            Err(held) => {
                self.answered_by("near");
                return Ok(held);
            }
        };
        match read {
            Ok((Some(bytes), mut epochs)) => {
                match engine.read_live::<T>(keys, &bytes, &mut epochs).await {
                    Some(entry) => match engine.sort(entry) {
                        Sorted::Serve(entry) => {
                            engine.remember_near(Read {
                                ticket,
                                keys,
                                entry: &entry,
                                len: bytes.len(),
                                epochs: &epochs,
                            });
                            engine.keep_decoded(keys, &bytes, &entry);
                            self.answered_by(engine.store_tier());
                            return self.serve(entry, Source::Hit);
                        }
                        Sorted::Past(_) => start = Start::Replace,
                    },
                    // Bytes that are not ours, or a value a tag or a clear invalidated: the
                    // lock is taken over them, to replace them.
                    None => start = Start::Replace,
                }
            }
            Ok((None, _)) => {}
            Err(e) => {
                let held = engine.held_copy::<T>(keys.user(), &e);
                match (engine.on_backend_failure(&e, held.is_some()), held) {
                    (Answer::ServeHeld, Some(held)) => {
                        self.answered_by("near");
                        return Ok(held);
                    }
                    // The fallback applies in `load`, under the single flight.
                    (Answer::ComputeUncached, _) => {}
                    _ => return Err(Error::backend("get", e)),
                }
            }
        }
        // Boxed: the miss's future (kilobytes: the flight, the claim loop, the computation)
        // would otherwise sit inside every hit's, which is built and moved whole on each call.
        Box::pin(self.share_or_load(start)).await
    }

    /// Serves `entry` to this call, found `fresh` (a hit, or a value another caller computed
    /// while this one waited): a refresh goes to the background with the call's computation.
    pub(crate) fn serve(self, entry: StoredEntry<T>, fresh: Source) -> Result<Fetched<T>, Error> {
        let engine = self.engine;
        match engine.judge_entry(entry, self.keys.user(), fresh) {
            Judged::Served(outcome) => outcome,
            Judged::Refresh(served, fence) => {
                engine.refresh_in_background(self.keys, self.ttl, self.f, fence);
                Ok(served)
            }
        }
    }
}

impl<C: Codec> Engine<C> {
    /// A near hit or an embedded store's decoded hit, counted, when a hit needs nothing more
    /// than the value: no XFetch draw.
    pub(crate) fn quick_hit<T: Clone + 'static>(&self, key: &str) -> Option<T> {
        if self.options.early_refresh_beta > 0.0 {
            return None;
        }
        let core = &self.core;
        let tiers = self.read_tiers()?;
        let value = tiers.quick_hit(&core.namespace, key, &core.counters)?;
        if self.options.trace_near_hits {
            let tier = if tiers.is_embedded() {
                "memory"
            } else {
                "near"
            };
            CallSpan::quick_hit(&core.namespace, key, self.options.span_keys, tier);
        }
        Some(value)
    }

    /// The tier a value read from the store comes from, in spans.
    pub(crate) fn store_tier(&self) -> &'static str {
        match &self.core.tiers {
            Some(tiers) if tiers.is_embedded() => "memory",
            _ => "redis",
        }
    }

    /// `Cache::fetch` once [`quick_hit`](Self::quick_hit) found nothing: the call's span and
    /// its outcome counted.
    pub(crate) async fn fetch_beyond_quick_hit<T, E, F, Fut>(
        &self,
        key: &str,
        ttl: Duration,
        f: F,
    ) -> Result<Fetched<T>, Error>
    where
        T: CacheValue,
        E: ComputeFailure,
        F: FnOnce(Lease) -> Fut + Send + 'static,
        Fut: ComputedFuture<T, E>,
    {
        // One span per call (`cache/trace.rs`); how it ended is recorded when it ends.
        let span = CallSpan::open(&self.core.namespace, key, self.options.span_keys);
        // Taken whole, once, here: every TTL below is at most FOREVER.
        let ttl = saturate(ttl);
        // tokio's clock, like every other timing here, so paused-time tests see it move.
        let started = crate::time::now();
        // Without a subscriber for it, the span is disabled: then no wrapper is polled, entered
        // and exited on every poll of the call.
        let result = match EntryKeys::new(&self.core.namespace, key) {
            Ok(keys) => {
                let call = KeyCall::new(self, keys, ttl, started, f, span.clone());
                if span.is_disabled() {
                    call.first().await
                } else {
                    call.first().instrument(span.clone()).await
                }
            }
            Err(e) => Err(e),
        };
        let outcome = self.count_outcome(&result, started);
        let waited = || u64::try_from(crate::time::since(started).as_millis()).unwrap_or(u64::MAX);
        CallSpan::close(&span, &result, outcome, waited);
        result
    }

    /// A fresh near copy of `key`, to be judged as a hit read from Redis is.
    pub(crate) fn near_copy<T: Clone + 'static>(&self, key: &str) -> Option<StoredEntry<T>> {
        let synced = self.core.store.clock_synced();
        self.read_tiers()?.near_copy(key, synced)
    }

    /// Freshness is stamped and judged by the store's clock: calibrate it before the first use
    /// (once per cache; after that, an atomic load).
    pub(crate) async fn clock_ready(&self) {
        let store = &self.core.store;
        if !store.clock_synced() {
            store.sync_clock().await;
        }
    }

    /// The one read of a single key, with its epochs (`get`, and `fetch` before its flight):
    /// one `MGET` on Redis. A write of this key still queued goes first (auto-recovery;
    /// failing, it fails the read), and an answer drops what the near tier held of the key from
    /// before an outage.
    pub(crate) async fn first_read(&self, keys: &EntryKeys) -> StoreResult<(Option<Blob>, Epochs)> {
        // Asked here rather than through `replay_queued`: a cache without auto-recovery asks
        // nothing on its hit path.
        if let Some(recovery) = &self.core.recovery {
            recovery.replay(keys).await?;
        }
        let read = self.read_with_epochs(keys).await;
        if read.is_ok() {
            if let Some(tiers) = &self.core.tiers {
                tiers.reached(keys);
            }
        }
        read
    }

    /// [`first_read`](Self::first_read), or a held copy (`Err`) when Redis leaves it unanswered
    /// for [`HELD_AFTER`] while the near tier's feed is silent past its proof: the server has
    /// stopped answering, and the copy it would serve once the breaker opens answers now.
    pub(crate) async fn first_read_or_held<T: Clone + 'static>(
        &self,
        keys: &Arc<EntryKeys>,
    ) -> Result<StoreResult<(Option<Blob>, Epochs)>, Fetched<T>> {
        match self.read_tiers().filter(|tiers| tiers.silent()) {
            // Boxed: the hit's own future does not grow by the rare path's timer and task.
            Some(tiers) => Box::pin(self.read_while_silent(tiers, keys)).await,
            None => Ok(self.first_read(keys).await),
        }
    }

    /// [`first_read_or_held`](Self::first_read_or_held) while the feed is silent.
    async fn read_while_silent<T: Clone + 'static>(
        &self,
        tiers: &Tiers,
        keys: &Arc<EntryKeys>,
    ) -> Result<StoreResult<(Option<Blob>, Epochs)>, Fetched<T>> {
        // In a task: a read answered by a held copy stays out, in the sight of the breaker's
        // stall watchdog (which opens it on reads left waiting), rather than dropped and sent
        // anew by every call while the server is silent.
        let (engine, owned) = (self.clone(), Arc::clone(keys));
        let mut read = crate::time::spawn(async move { engine.first_read(&owned).await });
        let joined = match crate::time::timeout(HELD_AFTER, &mut read).await {
            Ok(joined) => joined,
            Err(_) => match tiers.held_unanswered::<T>(keys.user(), self.options.fail_safe_for) {
                Some(held) => return Err(held),
                None => read.await,
            },
        };
        match joined {
            Ok(answer) => Ok(answer),
            Err(failed) if failed.is_panic() => std::panic::resume_unwind(failed.into_panic()),
            // The runtime is shutting down: read here, as without a near tier.
            Err(_) => Ok(self.first_read(keys).await),
        }
    }

    /// The epochs a read of `keys` asks for with the values: the namespace's, the handle's
    /// tags', and those the keys' values carried when last read.
    pub(crate) fn read_names(&self, keys: &[&EntryKeys]) -> Arc<[String]> {
        let mut names: Option<Vec<String>> = None;
        for keys in keys {
            let Some(seen) = self.core.tags.seen(&keys.value) else {
                continue;
            };
            // A key whose tags the handle names (the common tagged hit) adds nothing: the
            // handle's names are shared, not copied.
            for name in seen.iter() {
                if self.tagging.names.contains(name) {
                    continue;
                }
                let names = names.get_or_insert_with(|| self.tagging.names.to_vec());
                if names.len() - self.tagging.names.len() >= SEEN_PER_BATCH {
                    break;
                }
                if !names.contains(name) {
                    names.push(name.clone());
                }
            }
        }
        names.map_or_else(|| Arc::clone(&self.tagging.names), Into::into)
    }

    /// Reads the value of `keys` with the epochs [`read_names`](Self::read_names) gives, in one
    /// round trip.
    pub(crate) async fn read_with_epochs(
        &self,
        keys: &EntryKeys,
    ) -> StoreResult<(Option<Blob>, Epochs)> {
        let names = self.read_names(&[keys]);
        let (bytes, values) = self.core.store.get_with_epochs(keys, &names).await?;
        let epochs = Epochs::of(&names, values);
        self.core.tags.note(&epochs);
        Ok((bytes, epochs))
    }

    /// [`read_stored`](Self::read_stored), then [`alive`](Self::alive): a value invalidated by
    /// a tag or a clear is no value (logged at debug), and neither is one whose epochs could
    /// not be read: it is replaced under the lock, as bytes that do not decode are (on a
    /// cluster the epochs' node may be down while the value's answers).
    pub(crate) async fn read_live<T: DeserializeOwned + 'static>(
        &self,
        keys: &EntryKeys,
        bytes: &[u8],
        epochs: &mut Epochs,
    ) -> Option<StoredEntry<T>> {
        let entry = self.read_stored::<T>(keys, bytes)?;
        self.saw_tags(keys, &entry.tags);
        match self.alive(&entry, epochs).await {
            Ok(true) => Some(entry),
            Ok(false) => {
                tracing::debug!(key = %keys.user(), "the value was invalidated by a tag or a clear; treating it as a miss");
                None
            }
            Err(e) => {
                tracing::debug!(key = %keys.user(), error = %e, "could not read the value's epochs; treating it as a miss");
                None
            }
        }
    }

    /// Bytes that are not ours are a miss: logged, then recomputed and overwritten. So is a
    /// value written for another shape of `T` (another deploy's version of the type): decoding
    /// it could succeed and give garbage (bincode is positional).
    pub(crate) fn read_stored<T: DeserializeOwned + 'static>(
        &self,
        keys: &EntryKeys,
        bytes: &[u8],
    ) -> Option<StoredEntry<T>> {
        let codec = &self.core.codec;
        let envelope = match Envelope::decode(bytes, codec.id()) {
            Ok(envelope) => envelope,
            Err(foreign) => {
                crate::log::throttled!(warn, key = %keys.user(), reason = %foreign, "unreadable bytes under the key; treating as a miss");
                return None;
            }
        };
        // A compare of two numbers: the shape of `T` was traced on its first use, not here.
        if envelope.shape != shape::fingerprint::<T>() {
            crate::log::throttled!(warn, key = %keys.user(), r#type = std::any::type_name::<T>(),
                "value written for another shape of the type (fields or variants renamed, reordered, added, removed or retyped: another deploy?); treating as a miss");
            return None;
        }
        let value = if envelope.negative {
            Err(String::from_utf8_lossy(envelope.payload).into_owned())
        } else {
            match codec.decode(envelope.payload) {
                Ok(value) => Ok(value),
                Err(e) => {
                    crate::log::throttled!(warn, key = %keys.user(), error = %e, "value does not decode as the requested type; treating as a miss");
                    return None;
                }
            }
        };
        Some(StoredEntry::of(&envelope, value))
    }

    /// Remembers the tags the value of `keys` carries (`tags`, as read or as written), for the
    /// next read of the key (and for a follower of its computation: see
    /// [`computed_before_no_invalidation`](Self::computed_before_no_invalidation)).
    pub(crate) fn saw_tags(&self, keys: &EntryKeys, tags: &[String]) {
        // A tagless value (the common hit) costs nothing here. A key whose value lost its tags
        // keeps its remembered names until they are evicted: they only cost its reads a few
        // more keys in their `MGET`.
        if tags.is_empty() {
            return;
        }
        // Unchanged since last seen (the common tagged hit): nothing is built or written.
        if let Some(held) = self.core.tags.seen(&keys.value) {
            let same = |(held, tag): (&String, &String)| {
                self.epoch_name(tag).is_ok_and(|name| *held == name)
            };
            if held.len() == tags.len() && held.iter().zip(tags).all(same) {
                return;
            }
        }
        let names = self.tag_epoch_names(tags).unwrap_or_default();
        self.core.tags.remember(&keys.value, names);
    }

    /// Whether `entry` is alive, reading the epochs `epochs` lacks.
    pub(crate) async fn alive<T>(
        &self,
        entry: &StoredEntry<T>,
        epochs: &mut Epochs,
    ) -> StoreResult<bool> {
        self.complete_epochs([entry], epochs).await?;
        Ok(self.alive_by(entry, epochs))
    }

    /// Reads, in one request, the epochs `entries` need that `epochs` lacks (tags the handle
    /// did not name: one more round trip).
    pub(crate) async fn complete_epochs<'e, T: 'e>(
        &self,
        entries: impl IntoIterator<Item = &'e StoredEntry<T>>,
        epochs: &mut Epochs,
    ) -> StoreResult<()> {
        let mut missing: Vec<String> = Vec::new();
        let mut need = |name: &str| {
            if epochs.get(name).is_none() && !missing.iter().any(|held| held == name) {
                missing.push(name.to_owned());
            }
        };
        for entry in entries {
            // A tagless value (the common hit) needs the namespace's epoch alone: no names
            // are built for it.
            if entry.tags.is_empty() {
                need(&self.tagging.names[0]);
                continue;
            }
            for name in self.epoch_names(&entry.tags).into_iter().flatten() {
                need(&name);
            }
        }
        if !missing.is_empty() {
            let values = self.core.store.epochs(&missing).await?;
            epochs.add(missing, values);
            self.core.tags.note(epochs);
        }
        Ok(())
    }

    /// Whether `entry` was born after the namespace's epoch and each of its tags' in `epochs`;
    /// an epoch `epochs` lacks counts as raised.
    pub(crate) fn alive_by<T>(&self, entry: &StoredEntry<T>, epochs: &Epochs) -> bool {
        if entry.tags.is_empty() {
            // The namespace's epoch alone judges it: no names to build.
            return epochs
                .get(&self.tagging.names[0])
                .is_some_and(|epoch| outlived(entry.born, epoch));
        }
        // Each name looked up as it is made: an invalid tag (no name) makes the value gone.
        let alive = |name: &str| {
            epochs
                .get(name)
                .is_some_and(|epoch| outlived(entry.born, epoch))
        };
        alive(&self.tagging.names[0])
            && (entry.tags.iter()).all(|tag| self.epoch_name(tag).is_ok_and(|name| alive(&name)))
    }

    /// Sorts a stored entry for this caller: serve it (live, or a throttled fallback), or it is
    /// past its stale window: compute.
    pub(crate) fn sort<T>(&self, entry: StoredEntry<T>) -> Sorted<T> {
        if self.worth_of(&entry).served() {
            Sorted::Serve(entry)
        } else {
            Sorted::Past(entry)
        }
    }

    /// Where `entry` stands for this handle's options, by the store's clock now.
    pub(crate) fn worth_of<T>(&self, entry: &StoredEntry<T>) -> Worth {
        let stale_ms = u64::try_from(self.options.stale_for.as_millis()).unwrap_or(u64::MAX);
        worth(
            self.core.store.now_ms(),
            entry.fresh_until_ms,
            entry.throttled,
            stale_ms,
            self.options.fail_safe(),
        )
    }

    /// What a read found goes into the near tier, with the epochs of its tags.
    pub(crate) fn remember_near<T: Clone + Send + Sync + 'static>(&self, read: Read<'_, T>) {
        // Without a near tier there is nothing to remember: not even the clock is read.
        let Some(tiers) = self
            .core
            .tiers
            .as_ref()
            .filter(|tiers| tiers.near().is_some())
        else {
            return;
        };
        let tags = &read.entry.tags;
        let now_ms = self.core.store.now_ms();
        tiers.remember(read, || self.tag_epoch_names(tags), now_ms);
    }

    /// The embedded store keeps a value it handed out decoded, for this handle's quick hits
    /// (only without XFetch, which never takes them).
    pub(crate) fn keep_decoded<T: Clone + Send + Sync + 'static>(
        &self,
        keys: &EntryKeys,
        bytes: &Blob,
        entry: &StoredEntry<T>,
    ) {
        if let (Some(tiers), 0.0) = (&self.core.tiers, self.options.early_refresh_beta) {
            tiers.keep_decoded(keys, bytes, entry, || self.epoch_names(&entry.tags));
        }
    }

    /// What serving `entry` (found as `fresh` says) takes, decided before anything is prepared
    /// for a refresh, so that every path (a single key's, each key of a batch) decides alike:
    /// a remembered failure, a throttled fail-safe copy and a value neither stale nor drawn by
    /// XFetch are served as they are; any other value is served with a background refresh.
    pub(crate) fn judge_entry<T>(
        &self,
        entry: StoredEntry<T>,
        key: &str,
        fresh: Source,
    ) -> Judged<T> {
        let value = match entry.value {
            Ok(value) => value,
            Err(message) => {
                return Judged::Served(Err(Error::RecentFailure {
                    key: key.to_owned(),
                    message,
                }))
            }
        };
        if entry.throttled {
            // Sorted for serving, so within its throttle: the source failed a moment ago.
            return Judged::Served(Ok(self.serve_fallback(value)));
        }
        let beta = self.options.early_refresh_beta;
        // Draw only when XFetch is on: the hit path stays free of the random number generator.
        let draw = if beta > 0.0 { unit_draw() } else { 1.0 };
        let worth = judge(
            self.core.store.now_ms(),
            entry.fresh_until_ms,
            entry.compute_ms,
            beta,
            draw,
        );
        let served = |source| Fetched::new(value, source);
        match worth {
            Worth::RefreshEarly => Judged::Refresh(served(fresh), entry.fence),
            Worth::Stale => Judged::Refresh(served(Source::Stale), entry.fence),
            // `judge` says fresh, refreshed early or stale of a served value.
            Worth::Fresh | Worth::Kept | Worth::Dead => Judged::Served(Ok(served(fresh))),
        }
    }

    /// Counts a call's outcome (a call that `started` then), once, by how it was answered, and
    /// names it for the span.
    pub(crate) fn count_outcome<T>(
        &self,
        result: &Result<Fetched<T>, Error>,
        started: tokio::time::Instant,
    ) -> &'static str {
        let counters = &self.core.counters;
        let failed = |miss| counters.record(Event::Failed { miss });
        match result {
            Ok(fetched) => {
                let answer = answered(fetched);
                if matches!(answer, Answered::Joined | Answered::Waited) {
                    // Timed only here: a hit does not read the clock again.
                    counters.record(Event::AnsweredAfter(answer, crate::time::since(started)));
                } else {
                    counters.record(Event::Answered(answer));
                }
                match fetched.source {
                    Source::Hit => "hit",
                    Source::Stale => "stale",
                    Source::Computed => "miss-computed",
                    Source::Waited => "waited",
                    Source::Uncached => "fallback",
                    Source::FailSafe => "fail-safe",
                    Source::Held => "held",
                }
            }
            Err(Error::ComputeTimeout { .. }) => {
                failed(true);
                "hard-timeout"
            }
            Err(Error::WaitTimeout { .. }) => {
                failed(true);
                counters.record(Event::WaitTimeout);
                "wait-timeout"
            }
            Err(e) if e.is_backend() => {
                failed(false);
                counters.record(Event::BackendError);
                "backend-error"
            }
            Err(Error::RecentFailure { .. }) => {
                failed(false);
                "recent-failure"
            }
            Err(_) => {
                failed(true);
                "error"
            }
        }
    }
}

/// How a call that got `fetched` was answered: its source, and for a hit or a wait, who found
/// the value (the near tier; this process's flight, which the call joined).
fn answered<T>(fetched: &Fetched<T>) -> Answered {
    match (fetched.source, fetched.via) {
        (Source::Hit, Via::Near) => Answered::NearHit,
        (Source::Hit, _) => Answered::Hit,
        (Source::Computed, _) => Answered::Computed,
        (Source::Waited, Via::Flight) => Answered::Joined,
        (Source::Waited, _) => Answered::Waited,
        (Source::Stale, _) => Answered::Stale,
        (Source::FailSafe, _) => Answered::FailSafe,
        (Source::Held, _) => Answered::Held,
        (Source::Uncached, _) => Answered::Uncached,
    }
}

/// Where the wait-or-lock loop of a key starts (`Engine::claim`).
pub(crate) enum Start {
    /// Nothing read says otherwise: read the value or take the lock.
    Read,
    /// What the key holds must be replaced: a value past its stale window or bytes that do not
    /// decode. The lock is taken over it (the fallback is read once the lock is taken).
    Replace,
    /// The lock was found held, expiring in this long: wait for its holder first.
    Held(Option<Duration>),
}

/// A stored entry, sorted by `Engine::sort`.
pub(crate) enum Sorted<T> {
    /// Serve it (`KeyCall::serve` decides fresh, stale or throttled fallback).
    Serve(StoredEntry<T>),
    /// Past its stale window: take the lock over it and compute (`Engine::keep` makes it the
    /// fallback, once the lock is taken).
    Past(StoredEntry<T>),
}

/// How a stored entry is served (`Engine::judge_entry`).
pub(crate) enum Judged<T> {
    /// As it is.
    Served(Result<Fetched<T>, Error>),
    /// With a background refresh of the entry written under this fence.
    Refresh(Fetched<T>, u64),
}
