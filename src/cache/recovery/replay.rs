//! Replaying queued writes: one key at a time under its gate ([`replay_key`], also called inline
//! by a read of a queued key), and the background task that drains the queue oldest first,
//! retrying with a capped backoff while the backend does not answer ([`drain`]).
//!
//! Fencing: every replay is the normal fenced invalidation (fence bumped, value deleted,
//! announced), a queued `set` too. The queue cannot tell its value from a newer one, nor an
//! empty slot from a newer invalidation (another instance's, after a database commit, while
//! this one was cut off): writing it, even only into an empty slot, could bring back a value
//! older than that commit. An invalidation is always safe; the next read computes the truth
//! (FusionCache's lesson #163: the distributed entry is expired on replay).
//!
//! A raise of an epoch (a tag's, or the namespace's for a clear) is replayed as the direct call
//! makes it: its floor is the namespace's clock at the replay, and the script sets the epoch to
//! the higher of that floor and one above what it holds. An epoch only rises: a replay never
//! lowers one raised meanwhile by another instance, and it kills every value born before it,
//! so before the call too (and those born during the outage: a miss, never a stale value).
//!
//! Cancellation: a replay dropped half-way (a reader's future dropped) leaves its intent queued;
//! running it again invalidates again (a miss, never a stale value).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::queue::{Intent, Queued};
use super::{queues, Shared};
use crate::stats::Event;
use crate::store::StoreExt;
use crate::store::StoreResult;

/// The first wait after a failed replay; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// The longest wait between two attempts: an invalidation made during an outage is applied
/// within about this long of the server's return.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Replays the intent queued for `key` (a value key), if one still is: true if one was.
pub(super) async fn replay_key(shared: &Shared, key: &str) -> StoreResult<bool> {
    let Some((_, _, gate)) = peek(shared, |queue| queue.pending(key)) else {
        return Ok(false);
    };
    let _turn = gate.lock().await;
    // Read again with the gate held: the replay before ours may have completed the intent, or a
    // newer write replaced it.
    let Some((seq, queued, _)) = peek(shared, |queue| queue.pending(key)) else {
        return Ok(false);
    };
    apply(shared, &queued).await?;
    if shared.with_queue(|queue| queue.complete(key, seq)) {
        shared.counters.record(Event::RecoveryReplayed);
    }
    Ok(true)
}

/// Replays every queued raise of an epoch (the reads of the namespace wait for them: see
/// `Recovery::replay`). Few: one per tag, and none beside a queued clear.
pub(super) async fn replay_raises(shared: &Shared) -> StoreResult<()> {
    for name in peek(shared, |queue| queue.raises()) {
        replay_key(shared, &name).await?;
    }
    Ok(())
}

/// Reads the queue without publishing its length (nothing changes).
fn peek<R>(shared: &Shared, f: impl FnOnce(&super::Queue) -> R) -> R {
    f(&crate::sync::lock(&shared.queue))
}

/// Carries out one queued write: an invalidation of a key, whatever was queued for it, or the
/// raise of an epoch (see the module docs).
async fn apply(shared: &Shared, queued: &Queued) -> StoreResult<()> {
    let store = shared.store.as_ref();
    match &queued.intent {
        Intent::Set { keys, .. } | Intent::Invalidate { keys } => {
            store.invalidate(keys, queued.lease).await
        }
        Intent::RaiseTag { name } | Intent::Clear { name } => {
            let floor = store.born(&shared.clock).await?;
            store.raise_epochs(std::slice::from_ref(name), floor).await
        }
    }
}

/// The background task: replays the oldest queued key while there is one, waits to be woken
/// when there is none, and ends when the cache's drop guard stops it. While the backend does
/// not answer it retries every 100 ms, doubling up to 1 s; it logs once when replays start
/// failing (with the cause: FusionCache's lesson #312) and once when the queue has drained,
/// never once per write.
pub(super) async fn drain(shared: Arc<Shared>) {
    let mut backoff = FIRST_BACKOFF;
    // Since the first failure: how many writes were replayed, and how many attempts failed.
    let mut failing: Option<(u64, u64)> = None;
    while !shared.stopped.load(Ordering::Acquire) {
        let Some(key) = peek(&shared, |queue| queue.oldest()) else {
            if let Some((replayed, failed)) = failing.take() {
                tracing::info!(
                    replayed,
                    failed_attempts = failed,
                    "auto-recovery: the backend answers again; every queued write was replayed"
                );
            }
            shared.wake.notified().await;
            continue;
        };
        match replay_key(&shared, &key).await {
            Ok(replayed) => {
                backoff = FIRST_BACKOFF;
                if let Some((count, _)) = failing.as_mut() {
                    *count += u64::from(replayed);
                }
            }
            Err(error) => {
                match failing.as_mut() {
                    Some((_, failed)) => *failed += 1,
                    None => {
                        tracing::warn!(queued = shared.len.load(Ordering::Relaxed),
                            kind = %error.kind(), error = %error,
                            "auto-recovery: queued writes cannot be replayed yet; retrying every second at most (logged once, and once more when the queue has drained)");
                        failing = Some((0, 1));
                    }
                }
                // A failure that does not pass by itself (a refusal) must not hold up the
                // other keys: this one goes last. Each key has one intent, so the order between
                // keys carries no meaning.
                if !queues(&error) {
                    shared.with_queue(|queue| {
                        if let Some((seq, _, _)) = queue.pending(&key) {
                            queue.move_to_back(&key, seq);
                        }
                    });
                }
                crate::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}
