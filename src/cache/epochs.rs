//! The engine's side of tags and clear (the rule is in `tags.rs`): the epochs a read asks for
//! and remembers, an entry judged by them, a value's birth and tags, and the raise of an
//! epoch by `invalidate_tag` and `clear`.

use std::borrow::Cow;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::cache::engine::Engine;
use crate::cache::entry::StoredEntry;
use crate::cache::tags::{outlived, Epochs, Tagging, SEEN_PER_BATCH};
use crate::store::StoreExt;
use crate::store::{Blob, StoreResult};
use crate::wire::codec::Codec;
use crate::wire::key::{self, EntryKeys, MAX_TAGS};
use crate::Error;

impl<C: Codec> Engine<C> {
    /// For a follower of this process's flight of `keys`, whose leader started knowing the
    /// epoch mark `mark` and computed or read a value: whether none of that value's tags
    /// (remembered when it was written or read) was invalidated after the leader started. The
    /// follower's own read before it joined may not have known them (the key held no value
    /// then, or a value with other tags), so their epochs are read now: one more request, for a
    /// tagged value. No tags remembered: yes (the follower's own read, the
    /// namespace's epoch included, raised the mark it joined with). The epochs unreadable: no,
    /// as a read that cannot judge a value does not serve it.
    pub(crate) async fn outlives_invalidations_since(&self, keys: &EntryKeys, mark: u64) -> bool {
        let Some(names) = self.core.tags.seen(&keys.value) else {
            return true;
        };
        match self.core.store.epochs(&names).await {
            Ok(values) => {
                let epochs = Epochs::of(&names, values);
                self.core.tags.note(&epochs);
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

    /// The epoch names of a value with `tags`: the namespace's clear key, then one per tag
    /// (borrowed from the handle's when it names the tag: a hit of a value tagged by its handle
    /// builds no name); `None` for a tag that is no longer valid (written by another version),
    /// which makes the value unreadable.
    pub(crate) fn epoch_names<'s>(&'s self, tags: &[String]) -> Option<Vec<Cow<'s, str>>> {
        let clear = Cow::Borrowed(self.tagging.names[0].as_str());
        std::iter::once(Ok(clear))
            .chain(tags.iter().map(|tag| self.epoch_name(tag)))
            .collect::<Result<_, _>>()
            .ok()
    }

    /// The epoch name of `tag`: borrowed from the handle's when it names the tag.
    fn epoch_name<'s>(&'s self, tag: &str) -> Result<Cow<'s, str>, Error> {
        let Tagging { names, tags, .. } = &self.tagging;
        match tags.iter().position(|own| own == tag) {
            Some(at) => Ok(Cow::Borrowed(names[at + 1].as_str())),
            None => key::tag_key(&self.core.namespace, tag).map(Cow::Owned),
        }
    }

    /// The epoch names of `tags` alone (no clear key), or `None` if one is no longer valid.
    pub(crate) fn tag_epoch_names(&self, tags: &[String]) -> Option<Vec<String>> {
        tags.iter()
            .map(|tag| key::tag_key(&self.core.namespace, tag))
            .collect::<Result<_, _>>()
            .ok()
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
        match self.core.store.born(clock).await {
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
                key::tag_key(&self.core.namespace, tag)?;
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
        let floor = self.core.store.born(&self.tagging.names[0]).await?;
        // Flights led before this raise are not shared with calls that start after it.
        self.core.tags.raise_mark(floor);
        let raised = self.core.store.raise_epochs(names, floor).await;
        // Also after a failure: the raise may have been applied. Read-your-writes here.
        if let Some(near) = self.core.tiers.near() {
            for name in names {
                near.epoch_changed(name);
            }
        }
        raised
    }
}
