//! Tags and clear: every value of a tag, or of the whole namespace, invalidated in a constant
//! number of commands, whatever the number of values.
//!
//! The rule. Every value records its birth (`born`): the namespace's clock when the computation
//! that produced it started, read after its lock was granted and before `f` ran (or when a `set`
//! was made). Each tag, and the namespace itself, has an epoch: the clock when it was last
//! invalidated (`invalidate_tag`, `clear`). A value is alive while it was born after the
//! namespace's epoch and after the epoch of each of its tags; otherwise it is gone: read as a
//! miss by every path (the single-key path, the batch, `get`, the fail-safe's fallback, the near
//! tier, the embedded store's decoded hits), replaced under the lock like bytes that do not
//! decode, and never served stale or as a fallback (BentoCache #71, rockscache #12).
//!
//! So a computation that started before an invalidation returned can write its value, but the
//! value is born before the epoch and nobody reads it: the fence rule of `invalidate`, per tag.
//! A computation that starts after it returned is born after the epoch (the clock is one clock:
//! on a cluster, the node that holds the namespace's clear key; see `Store::born`).
//!
//! Nothing is deleted: the space is reclaimed by TTL or eviction. An epoch is a key with no
//! expiry (one per tag ever invalidated, and one per namespace); losing one (`DEL`, eviction
//! under an `allkeys-*` policy) brings back the values it had invalidated, as losing a fencing
//! counter does (see `docs/tags.md`).
//!
//! Clear is its own epoch, checked on every read, not a special tag some path may forget
//! (FusionCache #600).

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::cache::entry::StoredEntry;
use crate::options::CallOptions;
use crate::store::StoreExt;
use crate::store::{Blob, StoreResult};
use crate::wire::codec::Codec;
use crate::wire::key::{self, EntryKeys, MAX_TAGS};
use crate::{Cache, Error};

/// The epochs a handle reads with every value, from its namespace and its
/// [`CallOptions::tags`].
#[derive(Clone, Debug)]
pub(crate) struct Tagging {
    /// The namespace's clear key, then the epochs of the handle's tags: read with the value in
    /// one round trip.
    pub(crate) names: Arc<[String]>,
    /// Why the handle's tags cannot be used (an empty or over-long tag, too many), if so:
    /// every call of the handle reports it.
    pub(crate) invalid: Option<Error>,
}

impl Tagging {
    pub(crate) fn new(namespace: &str, options: &CallOptions) -> Self {
        let mut names = vec![key::clear_key(namespace)];
        let mut seen = std::collections::HashSet::new();
        let mut invalid = None;
        for tag in options.get_tags() {
            match key::tag_key(namespace, tag) {
                Ok(name) if seen.insert(name.clone()) => names.push(name),
                Ok(_) => {}
                Err(e) => {
                    invalid.get_or_insert(e);
                }
            }
        }
        if names.len() - 1 > MAX_TAGS {
            invalid.get_or_insert(Error::TooManyTags {
                key: "(any: the handle's CallOptions::tags)".to_owned(),
                tags: names.len() - 1,
                limit: MAX_TAGS,
            });
        }
        Tagging {
            names: names.into(),
            invalid,
        }
    }
}

/// How many keys' tags [`SeenTags`] remembers.
const SEEN_KEYS: u64 = 10_000;

/// How many remembered epochs one batch read asks for with its values; past that, the rest
/// come in one more round trip.
const SEEN_PER_BATCH: usize = 64;

/// The epoch names of the tags each key's value carried when last read or written,
/// so the next read asks for them with the value, in the same round trip: a value tagged by
/// its computation ([`Computed::tags`](crate::Computed::tags)) then costs a hit no more than
/// one tagged by the handle. Bounded; a key it forgot costs one more round trip, once.
pub(crate) struct SeenTags {
    names: moka::sync::Cache<String, Arc<[String]>>,
    /// Whether any tagged value was seen: until then a read does not look the key up (the
    /// tagless hit, by far the most common, hashes nothing here).
    any: AtomicBool,
}

impl Default for SeenTags {
    fn default() -> Self {
        SeenTags {
            names: moka::sync::Cache::new(SEEN_KEYS),
            any: AtomicBool::new(false),
        }
    }
}

impl SeenTags {
    /// The epoch names of the tags the value of `key` carried when last seen.
    fn get(&self, key: &str) -> Option<Arc<[String]>> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        self.names.get(key)
    }

    /// Remembers `names` for `key` (a change only: an unchanged entry is not written again).
    fn remember(&self, key: &str, names: Vec<String>) {
        self.any.store(true, Ordering::Release);
        if self.names.get(key).is_none_or(|held| *held != *names) {
            self.names.insert(key.to_owned(), names.into());
        }
    }
}

/// The epochs a read found, by name: those it asked for with the value (shared with the
/// handle, not copied), then any read after it.
#[derive(Debug, Default, Clone)]
pub(crate) struct Epochs {
    names: Arc<[String]>,
    values: Vec<u64>,
    more: Vec<(String, u64)>,
}

impl Epochs {
    /// What a read of `names` answered (`values` in the same order).
    pub(crate) fn of(names: &Arc<[String]>, values: Vec<u64>) -> Self {
        Epochs {
            names: Arc::clone(names),
            values,
            more: Vec::new(),
        }
    }

    fn get(&self, name: &str) -> Option<u64> {
        self.iter()
            .find(|(held, _)| *held == name)
            .map(|(_, epoch)| epoch)
    }

    fn add(&mut self, names: Vec<String>, values: Vec<u64>) {
        self.more.extend(names.into_iter().zip(values));
    }

    /// The highest epoch read (bytes that are not a number, read as the highest, left out).
    fn highest(&self) -> u64 {
        self.iter()
            .map(|(_, epoch)| epoch)
            .filter(|&epoch| epoch != u64::MAX)
            .max()
            .unwrap_or(0)
    }

    /// Every epoch read, by name: the near tier holds them beside its copies.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        let asked = self
            .names
            .iter()
            .map(String::as_str)
            .zip(self.values.iter().copied());
        let more = self
            .more
            .iter()
            .map(|(name, epoch)| (name.as_str(), *epoch));
        asked.chain(more)
    }
}

impl<C: Codec> Cache<C> {
    /// The highest epoch this process has read or raised (see `wait/flight.rs`).
    pub(crate) fn epoch_mark(&self) -> u64 {
        self.inner.epoch_mark.load(Ordering::Acquire)
    }

    /// Raises the process's epoch mark to what a read found.
    pub(crate) fn note_epochs(&self, epochs: &Epochs) {
        self.inner
            .epoch_mark
            .fetch_max(epochs.highest(), Ordering::AcqRel);
    }

    /// For a follower of this process's flight of `keys`, whose leader started knowing the
    /// epoch mark `mark` and computed or read a value: whether none of that value's tags
    /// (remembered when it was written or read) was invalidated after the leader started. The
    /// follower's own read before it joined may not have known them (the key held no value
    /// then, or a value with other tags), so their epochs are read now: one more request, for a
    /// tagged value. No tags remembered: yes (the follower's own read, the
    /// namespace's epoch included, raised the mark it joined with). The epochs unreadable: no,
    /// as a read that cannot judge a value does not serve it.
    pub(crate) async fn outlives_invalidations_since(&self, keys: &EntryKeys, mark: u64) -> bool {
        let Some(names) = self.inner.seen_tags.get(&keys.value) else {
            return true;
        };
        match self.inner.store.epochs(&names).await {
            Ok(values) => {
                let epochs = Epochs::of(&names, values);
                self.note_epochs(&epochs);
                epochs.highest() <= mark
            }
            Err(_) => false,
        }
    }

    /// The handle's tags, if they can be used: checked by every call before it reads.
    pub(crate) fn check_tags(&self) -> Result<(), Error> {
        match &self.tagging.invalid {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// The epoch names of a value with `tags`: the namespace's clear key (borrowed: a tagless
    /// hit allocates nothing for it), then one per tag; `None` for a tag that is no longer
    /// valid (written by another version), which makes the value unreadable.
    pub(crate) fn epoch_names<'s>(&'s self, tags: &[String]) -> Option<Vec<Cow<'s, str>>> {
        let namespace = &self.inner.namespace;
        std::iter::once(Ok(Cow::Borrowed(self.tagging.names[0].as_str())))
            .chain(
                tags.iter()
                    .map(|tag| key::tag_key(namespace, tag).map(Cow::Owned)),
            )
            .collect::<Result<_, _>>()
            .ok()
    }

    /// The epoch names of `tags` alone (no clear key), or `None` if one is no longer valid.
    pub(crate) fn tag_epoch_names(&self, tags: &[String]) -> Option<Vec<String>> {
        tags.iter()
            .map(|tag| key::tag_key(&self.inner.namespace, tag))
            .collect::<Result<_, _>>()
            .ok()
    }

    /// The epochs a read of `keys` asks for with the values: the namespace's, the handle's
    /// tags', and those the keys' values carried when last read.
    pub(crate) fn read_names(&self, keys: &[&EntryKeys]) -> Arc<[String]> {
        let mut names: Option<Vec<String>> = None;
        for keys in keys {
            let Some(seen) = self.inner.seen_tags.get(&keys.value) else {
                continue;
            };
            let names = names.get_or_insert_with(|| self.tagging.names.to_vec());
            for name in seen.iter() {
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
        let names = self.tag_epoch_names(tags).unwrap_or_default();
        self.inner.seen_tags.remember(&keys.value, names);
    }

    /// Reads the value of `keys` with the epochs [`read_names`](Self::read_names) gives, in one
    /// round trip.
    pub(crate) async fn read_with_epochs(
        &self,
        keys: &EntryKeys,
    ) -> StoreResult<(Option<Blob>, Epochs)> {
        let names = self.read_names(&[keys]);
        let (bytes, values) = self.inner.store.get_with_epochs(keys, &names).await?;
        let epochs = Epochs::of(&names, values);
        self.note_epochs(&epochs);
        Ok((bytes, epochs))
    }

    /// Reads, in one request, the epochs `entries` need that `epochs` lacks (tags the handle
    /// did not name: one more round trip).
    pub(crate) async fn complete_epochs<'e, T: 'e>(
        &self,
        entries: impl IntoIterator<Item = &'e StoredEntry<T>>,
        epochs: &mut Epochs,
    ) -> StoreResult<()> {
        let mut missing: Vec<String> = Vec::new();
        for entry in entries {
            for name in self.epoch_names(&entry.tags).into_iter().flatten() {
                if epochs.get(&name).is_none() && !missing.iter().any(|held| *held == name) {
                    missing.push(name.into_owned());
                }
            }
        }
        if !missing.is_empty() {
            let values = self.inner.store.epochs(&missing).await?;
            epochs.add(missing, values);
            self.note_epochs(epochs);
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
        self.epoch_names(&entry.tags).is_some_and(|names| {
            names.iter().all(|name| {
                epochs
                    .get(name)
                    .is_some_and(|epoch| outlived(entry.born, epoch))
            })
        })
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
                tracing::debug!(key = %keys.user, "the value was invalidated by a tag or a clear; treating it as a miss");
                None
            }
            Err(e) => {
                tracing::debug!(key = %keys.user, error = %e, "could not read the value's epochs; treating it as a miss");
                None
            }
        }
    }

    /// The namespace's clock now, as a new value's birth. If it cannot be read, 0: the value
    /// is then gone after any clear or invalidation of its tags, and alive until then (a
    /// format-2 value, written before births were recorded, reads as born at 0 too).
    pub(crate) async fn born_now(&self) -> u64 {
        let clock = &self.tagging.names[0];
        match self.inner.store.born(clock).await {
            Ok(born) => born,
            Err(e) => {
                tracing::debug!(error = %e, "could not read the namespace's clock; the value is born at 0");
                0
            }
        }
    }

    /// The tags of a value of `key`: the handle's and the computation's, each once, checked.
    pub(crate) fn value_tags(&self, key: &str, computed: &[String]) -> Result<Vec<String>, Error> {
        let mut tags: Vec<String> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for tag in self.options.get_tags().iter().chain(computed) {
            if seen.insert(tag.as_str()) {
                key::tag_key(&self.inner.namespace, tag)?;
                tags.push(tag.clone());
            }
        }
        if tags.len() > MAX_TAGS {
            return Err(Error::TooManyTags {
                key: key.to_owned(),
                tags: tags.len(),
                limit: MAX_TAGS,
            });
        }
        Ok(tags)
    }

    /// Raises the epochs `names` to the namespace's clock now: what `invalidate_tag` and
    /// `clear` send (two requests, whatever the number of values).
    pub(crate) async fn raise(&self, names: &[String]) -> StoreResult<()> {
        let floor = self.inner.store.born(&self.tagging.names[0]).await?;
        // Flights led before this raise are not shared with calls that start after it.
        self.inner.epoch_mark.fetch_max(floor, Ordering::AcqRel);
        let raised = self.inner.store.raise_epochs(names, floor).await;
        // Also after a failure: the raise may have been applied. Read-your-writes here.
        if let Some(near) = &self.inner.near {
            for name in names {
                near.epoch_changed(name);
            }
        }
        raised
    }
}

/// Whether a value born at `born` outlived an epoch: one never raised (0) judges nothing, and
/// a raised one takes every value born at or before it.
pub(crate) fn outlived(born: u64, epoch: u64) -> bool {
    epoch == 0 || born > epoch
}
