//! Steps 1 and 2 of a batch: the near tier answers the keys it holds, then one `MGET` reads the
//! others; a value found is served, one past its stale window (or unreadable) is marked to be
//! replaced under its lock.

use std::fmt::{Debug, Display};
use std::sync::Arc;

use serde::{de::DeserializeOwned, Serialize};

use super::{Batch, Outcome};
use crate::cache::entry::StoredEntry;
use crate::cache::fallback::Answer;
use crate::cache::fetch::Sorted;
use crate::cache::freshness::Via;
use crate::cache::tags::Epochs;
use crate::cache::tiers::Read;
use crate::store::Blob;
use crate::store::StoreExt;
use crate::wire::codec::Codec;
use crate::wire::key::EntryKeys;
use crate::{Error, Source};

impl<C, T, E> Batch<'_, C, T, E>
where
    C: Codec,
    T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
    E: Display + Debug + Send + Sync + 'static,
{
    /// The near tier first: no request for the keys it holds (none for a handle that skips
    /// it: `near_copy` then finds nothing).
    pub(super) fn answer_from_near(
        &self,
        distinct: &[Arc<EntryKeys>],
        outcomes: &mut [Option<Outcome<T>>],
    ) {
        for (slot, keys) in distinct.iter().enumerate() {
            if let Some(entry) = self.cache.near_copy::<T>(keys.user()) {
                let served = self.serve(entry, keys, Source::Hit);
                outcomes[slot] = Some(served.map(|fetched| fetched.via(Via::Near)));
            }
        }
    }

    /// What one read found for the `remote` keys, decoded (bytes that are not ours: `None`),
    /// each beside its bytes; the tags of each value are remembered for the next read.
    fn decoded(
        &self,
        distinct: &[Arc<EntryKeys>],
        remote: &[usize],
        values: Vec<Option<Blob>>,
    ) -> Vec<(Option<Blob>, Option<StoredEntry<T>>)> {
        let cache = self.cache;
        values
            .into_iter()
            .zip(remote)
            .map(|(bytes, &slot)| {
                let keys = &distinct[slot];
                if let Some(tiers) = &cache.core.tiers {
                    tiers.reached(keys);
                }
                let entry = bytes.as_ref().and_then(|b| cache.read_stored::<T>(keys, b));
                if let Some(entry) = &entry {
                    cache.saw_tags(keys, &entry.tags);
                }
                (bytes, entry)
            })
            .collect()
    }

    /// One read for every key still without an outcome; answers what it can, and says which
    /// keys hold a value that must be replaced (their locks are taken over it). Tickets are
    /// taken before the read is sent, for its answers to go into the near tier as a single
    /// key's read does.
    pub(super) async fn read_remote(
        &self,
        distinct: &[Arc<EntryKeys>],
        outcomes: &mut [Option<Outcome<T>>],
    ) -> Vec<bool> {
        let cache = self.cache;
        let mut replace = vec![false; distinct.len()];
        let remote: Vec<usize> = (0..distinct.len())
            .filter(|&slot| outcomes[slot].is_none())
            .collect();
        if remote.is_empty() {
            return replace;
        }
        cache.clock_ready().await;
        let tickets: Vec<_> = remote
            .iter()
            .map(|&slot| (cache.core.tiers.as_ref())?.ticket(&distinct[slot]))
            .collect();
        let entries: Vec<&EntryKeys> = remote.iter().map(|&slot| &*distinct[slot]).collect();
        // Writes of these keys still queued go first (auto-recovery); failing, they fail the read.
        // The epochs of the namespace and the handle's tags go in the same round trip.
        let names = &cache.read_names(&entries);
        let read = match cache.replay_queued(&entries).await {
            Ok(()) => cache.core.store.get_many_with_epochs(&entries, names).await,
            Err(e) => Err(e),
        };
        match read {
            Ok((values, epochs)) => {
                let mut epochs = Epochs::of(names, epochs);
                cache.core.tags.note(&epochs);
                let read = self.decoded(distinct, &remote, values);
                // Other tags' epochs, for every key at once: one more round trip at most. If
                // they cannot be read, those values are replaced (as for one key).
                let entries = read.iter().filter_map(|(_, entry)| entry.as_ref());
                let _ = cache.complete_epochs(entries, &mut epochs).await;
                for ((&slot, ticket), (bytes, entry)) in remote.iter().zip(tickets).zip(read) {
                    let keys = &distinct[slot];
                    let Some(bytes) = bytes else { continue };
                    let entry = entry.filter(|entry| {
                        crate::planted::on(crate::planted::Bug::EpochIgnoredInBatch)
                            || cache.alive_by(entry, &epochs)
                    });
                    match entry.map(|entry| cache.sort(entry)) {
                        Some(Sorted::Serve(entry)) => {
                            cache.remember_near(Read {
                                ticket,
                                keys,
                                entry: &entry,
                                len: bytes.len(),
                                epochs: &epochs,
                            });
                            outcomes[slot] = Some(self.serve(entry, keys, Source::Hit));
                        }
                        // Past its stale window, unreadable bytes, or invalidated by a tag or a
                        // clear.
                        Some(Sorted::Past(_)) | None => replace[slot] = true,
                    }
                }
            }
            Err(e) => {
                // Copies held while the backend is down answer their keys; the others fail,
                // or take the fallback when locking, under the single flight, as for one key.
                for &slot in &remote {
                    let held = cache.held_copy::<T>(distinct[slot].user(), &e);
                    match (cache.on_backend_failure(&e, held.is_some()), held) {
                        (Answer::ServeHeld, Some(held)) => outcomes[slot] = Some(Ok(held)),
                        (Answer::ComputeUncached, _) => {}
                        _ => outcomes[slot] = Some(Err(Error::backend("get", e.clone()))),
                    }
                }
            }
        }
        replace
    }
}
