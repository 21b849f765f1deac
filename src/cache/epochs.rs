//! The engine's side of tags and clear (the rule is in `tags.rs`): the epoch names of a value's
//! tags, a follower's check that no tag moved since its leader started, a value's birth and
//! tags, and the raise of an epoch by `invalidate_tag` and `clear`. What a read asks for and
//! how an entry is judged by its epochs are steps of the hit, in `fetch.rs`.

use std::borrow::Cow;

use crate::cache::engine::Engine;
use crate::cache::tags::{Epochs, Tagging};
use crate::store::StoreExt;
use crate::store::StoreResult;
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
    pub(crate) fn epoch_name<'s>(&'s self, tag: &str) -> Result<Cow<'s, str>, Error> {
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
        let raised = self.raise_from_clock(names).await;
        // Also after a failure, the clock's read's too: the raise may have been applied, or it
        // waits in the auto-recovery queue, and a near copy judged by the epoch held now would
        // be served as if it had not. Read-your-writes here.
        if let Some(near) = self.core.near() {
            for name in names {
                near.epoch_changed(name);
            }
        }
        raised
    }

    /// The namespace's clock now, as the floor `names` are raised to.
    async fn raise_from_clock(&self, names: &[String]) -> StoreResult<()> {
        let floor = self.core.store.born(&self.tagging.names[0]).await?;
        // Flights led before this raise are not shared with calls that start after it.
        self.core.tags.raise_mark(floor);
        self.core.store.raise_epochs(names, floor).await
    }
}
