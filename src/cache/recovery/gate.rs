//! Where calls meet the auto-recovery queue: a read of a key replays the writes queued for it
//! first, a write that reached the backend drops what is queued for its keys, and a write that
//! could not is queued.

use crate::cache::engine::Engine;
use crate::stats::Event;
use crate::store::{StoreError, StoreResult};
use crate::wire::codec::Codec;
use crate::wire::key::EntryKeys;
use crate::Error;

use super::{queues, Queued, Written};

impl<C: Codec> Engine<C> {
    /// Before reading `entries` from the backend: replays the writes queued for them, so that
    /// this instance never serves a key from Redis before its own newer write (a set or an
    /// invalidation that could not be applied) has reached it. A replay that fails is the
    /// read's failure: the caller's fallback for a failed read applies.
    pub(crate) async fn replay_queued(&self, entries: &[&EntryKeys]) -> StoreResult<()> {
        let Some(recovery) = &self.core.recovery else {
            return Ok(());
        };
        for keys in entries {
            recovery.replay(keys).await?;
        }
        Ok(())
    }

    /// A write reached the backend: nothing queued for its keys may be replayed over it.
    pub(crate) fn written(&self, entries: &[EntryKeys]) -> Written {
        if let Some(recovery) = &self.core.recovery {
            recovery.forget(entries);
        }
        Written::Applied
    }

    /// Epochs `names` were raised (`clear` when `cleared`): nothing queued for them may be
    /// replayed over it, and a clear covers every queued raise.
    pub(crate) fn raised(&self, names: &[String], cleared: bool) -> Written {
        if let Some(recovery) = &self.core.recovery {
            recovery.forget_raised(names, cleared);
        }
        Written::Applied
    }

    /// A write of `batch` (its keys, its intents) failed with `error` during `op`: queued when
    /// recovery is on and the failure passes by itself; otherwise `None`, and the caller
    /// answers as without recovery.
    pub(crate) fn queue_failed(
        &self,
        op: &'static str,
        batch: Vec<Queued>,
        error: &StoreError,
    ) -> Option<Result<Written, Error>> {
        let recovery = self.core.recovery.as_ref()?;
        if !queues(error) {
            return None;
        }
        // Not a log line per call: the replay logs once when it starts failing and once when
        // it drains. Counted as a backend error, as the failed write is.
        self.core.counters.record(Event::BackendError);
        tracing::debug!(op, keys = batch.len(), kind = %error.kind(), error = %error,
            "backend unavailable; write queued for auto-recovery");
        Some(recovery.queue(batch))
    }

    /// [`queue_failed`](Self::queue_failed), or else the write's failure as the caller's
    /// error, counted.
    pub(crate) fn queue_or_fail(
        &self,
        op: &'static str,
        batch: Vec<Queued>,
        error: StoreError,
    ) -> Result<Written, Error> {
        if let Some(queued) = self.queue_failed(op, batch, &error) {
            return queued;
        }
        self.core.counters.record(Event::BackendError);
        Err(Error::backend(op, error))
    }
}
