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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::options::CallOptions;
use crate::wire::key::{self, MAX_TAGS};
use crate::Error;

/// The epochs a handle reads with every value, from its namespace and its
/// [`CallOptions::tags`].
#[derive(Clone, Debug)]
pub(crate) struct Tagging {
    /// The namespace's clear key, then the epochs of the handle's tags: read with the value in
    /// one round trip.
    pub(crate) names: Arc<[String]>,
    /// The handle's tags whose epochs follow the clear key in `names`, in the same order: a
    /// value with these tags finds its epoch names here, built once per handle, not per read.
    pub(crate) tags: Vec<String>,
    /// Why the handle's tags cannot be used (an empty or over-long tag, too many), if so:
    /// every call of the handle reports it.
    pub(crate) invalid: Option<Error>,
}

impl Tagging {
    pub(crate) fn new(namespace: &str, options: &CallOptions) -> Self {
        let mut names = vec![key::clear_key(namespace)];
        let mut tags = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut invalid = None;
        for tag in options.get_tags() {
            match key::tag_key(namespace, tag) {
                Ok(name) if seen.insert(name.clone()) => {
                    names.push(name);
                    tags.push(tag.clone());
                }
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
            tags,
            invalid,
        }
    }
}

/// How many keys' tags [`SeenTags`] remembers.
const SEEN_KEYS: u64 = 10_000;

/// The most epoch names remembered for one key: its values' tags, the last and earlier ones.
const SEEN_NAMES_PER_KEY: usize = 2 * MAX_TAGS;

/// How many remembered epochs one batch read asks for with its values; past that, the rest
/// come in one more round trip.
pub(crate) const SEEN_PER_BATCH: usize = 64;

/// The epoch names of the tags each key's values carried when read or written (the last
/// value's, and earlier ones up to a bound), so the next read asks for them with the value, in the same round trip: a value tagged by
/// its computation ([`Computed::tags`](crate::Computed::tags)) then costs a hit no more than
/// one tagged by the handle. Bounded; a key it forgot costs one more round trip, once.
struct SeenTags {
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

    /// Remembers `names` for `key`, beside those already remembered for it (a change only:
    /// an unchanged entry is not written again).
    ///
    /// Added to, not replaced: a follower of this process's flight judges its leader's value
    /// by the names remembered for the key (`outlives_invalidations_since`), and another call
    /// may read or compute a value of the key with other tags between the leader's write and
    /// that judgement. Replaced, the leader's tags were forgotten there, and a follower that
    /// began after one of them was invalidated got the leader's value all the same (found by
    /// the deterministic simulation: `tests/sim/`, finding 1). An extra name only costs a read
    /// one more key in its `MGET`, and a follower one more refusal; past
    /// [`SEEN_NAMES_PER_KEY`] the new names replace the old.
    fn remember(&self, key: &str, names: Vec<String>) {
        self.any.store(true, Ordering::Release);
        let held = self.names.get(key);
        let merged = match &held {
            Some(held) if held.len() + names.len() <= SEEN_NAMES_PER_KEY => {
                let mut merged = held.to_vec();
                for name in names {
                    if !merged.contains(&name) {
                        merged.push(name);
                    }
                }
                merged
            }
            _ => names,
        };
        if held.is_none_or(|held| *held != *merged) {
            self.names.insert(key.to_owned(), merged.into());
        }
    }
}

/// What this process remembers of tags, shared by every handle of a cache: the tags each
/// key's value carried when last seen, and the highest epoch read or raised (the epoch mark:
/// an in-process flight is shared only by callers that know no newer one than its leader, see
/// `wait/flight.rs`).
#[derive(Default)]
pub(crate) struct TagMemory {
    seen: SeenTags,
    mark: AtomicU64,
}

impl TagMemory {
    /// The highest epoch this process has read or raised.
    pub(crate) fn mark(&self) -> u64 {
        self.mark.load(Ordering::Acquire)
    }

    /// Raises the mark to what a read found.
    pub(crate) fn note(&self, epochs: &Epochs) {
        self.raise_mark(epochs.highest());
    }

    /// Raises the mark to `floor` (an epoch this process raised).
    pub(crate) fn raise_mark(&self, floor: u64) {
        // Read first: a read that found no newer epoch (nearly every read) writes nothing, so
        // concurrent hits do not contend for the line.
        if self.mark.load(Ordering::Acquire) >= floor {
            return;
        }
        self.mark.fetch_max(floor, Ordering::AcqRel);
    }

    /// The epoch names of the tags the value of `key` carried when last seen.
    pub(crate) fn seen(&self, key: &str) -> Option<Arc<[String]>> {
        self.seen.get(key)
    }

    /// Remembers the epoch names of the tags of `key`'s value.
    pub(crate) fn remember(&self, key: &str, names: Vec<String>) {
        self.seen.remember(key, names);
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

    pub(crate) fn get(&self, name: &str) -> Option<u64> {
        self.iter()
            .find(|(held, _)| *held == name)
            .map(|(_, epoch)| epoch)
    }

    pub(crate) fn add(&mut self, names: Vec<String>, values: Vec<u64>) {
        self.more.extend(names.into_iter().zip(values));
    }

    /// The highest epoch read (bytes that are not a number, read as the highest, left out).
    pub(crate) fn highest(&self) -> u64 {
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

/// Whether a value born at `born` outlived an epoch: one never raised (0) judges nothing, and
/// a raised one takes every value born at or before it.
pub(crate) fn outlived(born: u64, epoch: u64) -> bool {
    epoch == 0 || born > epoch
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(tags: &[&str]) -> Vec<String> {
        tags.iter().map(|t| format!("ns:{{%t:{t}}}")).collect()
    }

    #[test]
    fn a_key_keeps_the_names_of_its_earlier_values_up_to_a_bound() {
        let memory = TagMemory::default();
        memory.remember("k", names(&["t2"]));
        // Another value of the key, with other tags: the leader's `t2` is still judged.
        memory.remember("k", names(&["t0"]));
        assert_eq!(memory.seen("k").as_deref(), Some(&names(&["t2", "t0"])[..]));
        memory.remember("k", names(&["t0", "t2"]));
        assert_eq!(memory.seen("k").as_deref(), Some(&names(&["t2", "t0"])[..]));
        // Past the bound, the new names replace the old.
        let many: Vec<String> = (0..SEEN_NAMES_PER_KEY).map(|i| format!("x{i}")).collect();
        memory.remember("k", many.clone());
        assert_eq!(memory.seen("k").as_deref(), Some(&many[..]));
    }
}
