//! The plain reads and writes of one key or tag, for the cache's API page: `get` (no
//! computation), `set`, the invalidations (keys, tags, the namespace). A failed write goes to
//! the auto-recovery queue where there is one.

use std::time::Duration;

use serde::{de::DeserializeOwned, Serialize};

use crate::cache::batch::MAX_BATCH_KEYS;
use crate::cache::engine::Engine;
use crate::cache::recovery::{Intent, Queued};
use crate::stats::Event;
use crate::store::StoreExt;
use crate::time::saturate;
use crate::wire::codec::Codec;
use crate::wire::key::EntryKeys;
use crate::{Error, Written};

impl<C: Codec> Engine<C> {
    /// [`Cache::get`]: a value fresh or stale, never computed; a value kept by the fail-safe
    /// past its stale window is no answer.
    pub(crate) async fn get<T: DeserializeOwned + 'static>(
        &self,
        key: &str,
    ) -> Result<Option<T>, Error> {
        let keys = EntryKeys::new(&self.core.namespace, key)?;
        self.check_tags()?;
        // The near tier first, as for every read (unless the handle skips it): a copy it
        // serves is fresh, and judged by the epochs of its namespace and tags.
        if let Some(value) = self
            .read_tiers()
            .and_then(|tiers| tiers.near_read::<T>(key))
        {
            return Ok(Some(value));
        }
        // A write of this key still queued goes first: Redis may hold what it replaced.
        let (bytes, mut epochs) = match self.first_read(&keys).await {
            Ok(read) => read,
            Err(e) => {
                self.fail_open("get", &keys, e, "reading it as a miss")?;
                return Ok(None);
            }
        };
        let Some(bytes) = bytes else {
            return Ok(None);
        };
        // A value past its stale window (kept by the fail-safe) is no answer to a plain read.
        Ok(self
            .read_live::<T>(&keys, &bytes, &mut epochs)
            .await
            .filter(|stored| self.worth_of(stored).live())
            .and_then(|stored| stored.value.ok()))
    }

    /// [`Cache::set`].
    pub(crate) async fn set<T: Serialize + DeserializeOwned + 'static>(
        &self,
        key: &str,
        value: &T,
        ttl: Duration,
    ) -> Result<Written, Error> {
        let keys = EntryKeys::new(&self.core.namespace, key)?;
        self.check_tags()?;
        let tags = self.value_tags(key, &[])?;
        let ttl = saturate(ttl);
        self.clock_ready().await;
        let born = self.born_now().await;
        let bytes = self.encode_value(value, ttl, Duration::ZERO, 0, (born, &tags))?;
        let stored_for = self.options.stored_for(ttl);
        // Kept for the queue only when there is one: a copy of the value per write otherwise.
        let kept = self.core.recovery.as_ref().map(|_| bytes.clone());
        let written = self
            .core
            .store
            .set(&keys, bytes, stored_for, self.options.lease)
            .await;
        // Also after a failure: the write may have been applied.
        self.core.wrote(&keys);
        let error = match written {
            Ok(()) => return Ok(self.written(std::slice::from_ref(&keys))),
            Err(e) => e,
        };
        if let Some(bytes) = kept {
            let intent = Intent::Set {
                keys: keys.clone(),
                bytes,
            };
            let batch = vec![self.queued(intent)];
            if let Some(queued) = self.queue_failed("set", batch, &error) {
                return queued;
            }
        }
        self.fail_open("set", &keys, error, "the write is skipped")
            .map(|()| Written::Skipped)
    }

    /// [`Cache::invalidate`].
    pub(crate) async fn invalidate(&self, key: &str) -> Result<Written, Error> {
        let keys = EntryKeys::new(&self.core.namespace, key)?;
        let done = self.core.store.invalidate(&keys, self.options.lease).await;
        // Also after a failure: the invalidation may have been applied.
        self.core.wrote(&keys);
        let error = match done {
            Ok(()) => return Ok(self.written(std::slice::from_ref(&keys))),
            Err(e) => e,
        };
        let batch = vec![self.queued(Intent::Invalidate { keys })];
        self.queue_or_fail("invalidate", batch, error)
    }

    /// [`Cache::invalidate_many`].
    pub(crate) async fn invalidate_many<K>(&self, keys: K) -> Result<Written, Error>
    where
        K: IntoIterator,
        K::Item: AsRef<str>,
    {
        let entries = keys
            .into_iter()
            .map(|key| EntryKeys::new(&self.core.namespace, key.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        if entries.len() > MAX_BATCH_KEYS {
            return Err(Error::TooManyKeys {
                keys: entries.len(),
                limit: MAX_BATCH_KEYS,
            });
        }
        let refs: Vec<&EntryKeys> = entries.iter().collect();
        let done = self
            .core
            .store
            .invalidate_many(&refs, self.options.lease)
            .await;
        // Also after a failure: some invalidations may have been applied.
        for keys in &entries {
            self.core.wrote(keys);
        }
        let error = match done {
            Ok(()) => return Ok(self.written(&entries)),
            Err(e) => e,
        };
        // Every key, applied or not: which ones the backend took is unknown, and replaying an
        // invalidation twice is harmless.
        let batch = entries
            .into_iter()
            .map(|keys| self.queued(Intent::Invalidate { keys }))
            .collect();
        self.queue_or_fail("invalidate", batch, error)
    }

    /// [`Cache::invalidate_tags`].
    pub(crate) async fn invalidate_tags<I>(&self, tags: I) -> Result<Written, Error>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let mut names = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut given = 0;
        for tag in tags {
            given += 1;
            let name = crate::wire::key::tag_key(&self.core.namespace, tag.as_ref())?;
            if seen.insert(name.clone()) {
                names.push(name);
            }
        }
        if names.len() > MAX_BATCH_KEYS {
            return Err(Error::TooManyKeys {
                keys: given,
                limit: MAX_BATCH_KEYS,
            });
        }
        if names.is_empty() {
            return Ok(Written::Applied);
        }
        self.raise_or_queue("invalidate_tag", names, false).await
    }

    /// [`Cache::clear`].
    pub(crate) async fn clear(&self) -> Result<Written, Error> {
        let names = vec![self.tagging.names[0].clone()];
        self.raise_or_queue("clear", names, true).await
    }

    /// Raises the epochs `names` (the namespace's when `clear`), or queues the raise when the
    /// backend is unreachable or busy and auto-recovery is on.
    async fn raise_or_queue(
        &self,
        op: &'static str,
        names: Vec<String>,
        clear: bool,
    ) -> Result<Written, Error> {
        let error = match self.raise(&names).await {
            Ok(()) => return Ok(self.raised(&names, clear)),
            Err(e) => e,
        };
        // Every name, raised or not: which ones the backend took is unknown, and raising an
        // epoch twice only kills what the first raise missed.
        let batch = names
            .into_iter()
            .map(|name| match clear {
                true => self.queued(Intent::Clear { name }),
                false => self.queued(Intent::RaiseTag { name }),
            })
            .collect();
        if let Some(queued) = self.queue_failed(op, batch, &error) {
            // A flight of this process led before this call is not shared with the calls after
            // it, as after a raise (whose floor is unknown here: any mark above the leader's).
            self.core
                .tags
                .raise_mark(self.core.tags.mark().saturating_add(1));
            return queued;
        }
        self.core.counters.record(Event::BackendError);
        Err(Error::backend(op, error))
    }

    /// A write that could not be made now, for the auto-recovery queue.
    fn queued(&self, intent: Intent) -> Queued {
        Queued {
            intent,
            lease: self.options.lease,
        }
    }
}
