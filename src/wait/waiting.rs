//! Waiting for another holder: a wake-up notification or a jittered, capped exponential
//! backoff, whichever comes first, never past the holder's lease, never past the wait bound.
//!
//! Order matters: the waiter listens *before* it looks again, so a value (or a release) that
//! lands between the look and the wait still wakes it.
//!
//! While a wake-up subscription is active, the backoff is only a safety net (a message lost with
//! a dropped connection, a holder that died without publishing, which the lease expiry covers
//! anyway), so it runs at its cap instead of starting small: polling a held lock every few
//! milliseconds would cost commands and buy nothing.
//!
//! Explained in the guide: `docs/how-it-works.md` (waiting and wake-ups).

use std::time::Duration;

use tokio::time::Instant;

use crate::store::wakeup::Listener;
use crate::store::LockStore;
use crate::wire::key::EntryKeys;
use crate::{CallOptions, Error};

pub(crate) struct Waiter<'a> {
    store: &'a dyn LockStore,
    keys: &'a EntryKeys,
    options: &'a CallOptions,
    started: Instant,
    listener: Option<Listener>,
    listened: bool,
    attempt: u32,
}

impl<'a> Waiter<'a> {
    pub(crate) fn new(
        store: &'a dyn LockStore,
        keys: &'a EntryKeys,
        options: &'a CallOptions,
        started: Instant,
    ) -> Self {
        Waiter {
            store,
            keys,
            options,
            started,
            listener: None,
            listened: false,
            attempt: 0,
        }
    }

    /// Called after the lock was found held (expiring in `expires_in`); returns when it is time
    /// to look again, or [`Error::WaitTimeout`] once the wait bound has passed.
    pub(crate) async fn wait(&mut self, expires_in: Option<Duration>) -> Result<Wake, Error> {
        if !self.listened {
            // First time: subscribe, and have the caller look again at once.
            self.listened = true;
            match self.store.listen(self.keys).await {
                Ok(l) => self.listener = Some(l),
                // Not a warning: every waiting call would log one while the subscription's
                // connection is down (the breaker and the feed say so once).
                Err(e) => tracing::debug!(key = %self.keys.user(), error = %e,
                    "wake-up subscription failed; waiting by polling"),
            }
            return Ok(Wake::Subscribed);
        }
        let waited = crate::time::since(self.started);
        let remaining = self.options.wait_timeout.saturating_sub(waited);
        if remaining.is_zero() {
            return Err(Error::WaitTimeout {
                key: self.keys.user().to_owned(),
                waited,
            });
        }
        let attempt = if self.listener.is_some() {
            u32::MAX
        } else {
            self.attempt
        };
        let mut delay = self.options.backoff.delay(attempt).min(remaining);
        if let Some(expires_in) = expires_in {
            // Look again the moment a dead holder's lease runs out.
            delay = delay.min(expires_in + Duration::from_millis(1));
        }
        self.attempt = self.attempt.saturating_add(1);
        match self.listener.as_mut() {
            Some(l) => {
                // Biased: either way the waiter looks again; in a fixed order, a seeded
                // simulation replays the same polls.
                tokio::select! {
                    biased;
                    _ = l.notified() => {}
                    _ = crate::time::sleep(delay) => {}
                }
            }
            None => crate::time::sleep(delay).await,
        }
        Ok(Wake::Slept)
    }
}

/// Why [`Waiter::wait`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// It just subscribed, without waiting: look again before waiting.
    Subscribed,
    /// It waited: a wake-up, the backoff, or the holder's lease running out.
    Slept,
}
