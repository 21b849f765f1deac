//! A held per-key lock: its token, fencing token and heartbeat, and the guarantee that it is let
//! go on every exit path.
//!
//! Cancellation contract: if the holder's future is dropped or panics, `Drop` stops the heartbeat
//! at once and starts a best-effort unlock on the current runtime (which wakes the waiters). `Drop`
//! cannot wait for the backend, so if that unlock fails too, the lease running out is the backstop.

use std::sync::Arc;
use std::time::Duration;

use crate::key::EntryKeys;
use crate::lease::{Heartbeat, Lease};
use crate::store::{Store, StoreResult, Stored};

pub(crate) struct HeldLock {
    store: Arc<dyn Store>,
    keys: Arc<EntryKeys>,
    token: Arc<str>,
    fence: u64,
    heartbeat: Option<Heartbeat>,
    /// Cleared once the lock was handed back through the backend, so `Drop` has nothing to do.
    armed: bool,
}

impl std::fmt::Debug for HeldLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldLock")
            .field("key", &self.keys.user)
            .field("fence", &self.fence)
            .finish_non_exhaustive()
    }
}

impl HeldLock {
    /// Takes ownership of a lock just acquired with `token` and `fence`, and starts its heartbeat.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        keys: Arc<EntryKeys>,
        token: Arc<str>,
        fence: u64,
        lease: Duration,
        renew: bool,
    ) -> Self {
        let heartbeat = Heartbeat::start(
            Arc::clone(&store),
            Arc::clone(&keys),
            Arc::clone(&token),
            lease,
            renew,
        );
        HeldLock {
            store,
            keys,
            token,
            fence,
            heartbeat: Some(heartbeat),
            armed: true,
        }
    }

    pub(crate) fn lease(&self) -> Lease {
        let lost = self
            .heartbeat
            .as_ref()
            .map(Heartbeat::lost_signal)
            .expect("the heartbeat lives as long as the lock is held");
        Lease::held(self.fence, lost)
    }

    pub(crate) fn fence(&self) -> u64 {
        self.fence
    }

    /// Writes the value if our fencing token is still current, and lets the lock go.
    pub(crate) async fn store_and_unlock(
        mut self,
        value: Vec<u8>,
        ttl: Duration,
    ) -> StoreResult<Stored> {
        // Stop renewing first: a renewal racing the unlock would only report a spurious loss.
        self.heartbeat = None;
        let stored = self
            .store
            .store_and_unlock(&self.keys, &self.token, self.fence, value, ttl)
            .await?;
        self.armed = false;
        Ok(stored)
    }

    /// Lets the lock go; false if it was no longer ours.
    pub(crate) async fn release(mut self) -> StoreResult<bool> {
        self.heartbeat = None;
        let released = self.store.unlock(&self.keys, &self.token).await?;
        self.armed = false;
        Ok(released)
    }
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        self.heartbeat = None;
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(key = %self.keys.user, "lock dropped outside a runtime; it frees itself when its lease runs out");
            return;
        };
        let store = Arc::clone(&self.store);
        let keys = Arc::clone(&self.keys);
        let token = Arc::clone(&self.token);
        runtime.spawn(async move {
            if let Err(e) = store.unlock(&keys, &token).await {
                tracing::warn!(key = %keys.user, error = %e, "could not free an abandoned lock; it frees itself when its lease runs out");
            }
        });
    }
}
