//! In-process fan-out of "something changed on this key" notifications.
//!
//! A waiter registers a [`Listener`] *before* it re-checks the store; every notification after
//! that moment is seen by it, even one that arrives before it starts to wait, because a listener
//! is a `watch` receiver over a per-channel counter. That ordering is what makes a lost wake-up
//! impossible within a process (the backoff covers a lost one between processes).
//!
//! It belongs to the store layer because the stores make the notifications (the memory store on
//! each write, the Redis store from pub/sub messages) and hand out the listeners; the waiters in
//! `wait/` only consume them, so imports keep pointing down.
//!
//! Explained in the guide: `docs/how-it-works.md` (waiting and wake-ups).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::signal as watch;

use crate::sync::lock;

/// Channel name → counter bumped on every notification.
///
/// The `std` mutex is right here: it is held only for map look-ups, never across an `.await`.
#[derive(Debug, Default)]
pub(crate) struct Wakeups {
    /// Hashed by [`Hasher`](crate::random::Hasher): `notify_all` wakes in its order.
    channels: Mutex<HashMap<String, watch::Sender<u64>, crate::random::Hasher>>,
}

impl Wakeups {
    /// Starts listening on `channel`; the listener sees every [`notify`](Self::notify) from now on.
    pub(crate) fn listen(self: &Arc<Self>, channel: &str) -> Listener {
        let mut channels = lock(&self.channels);
        let rx = match channels.get(channel) {
            Some(tx) => tx.subscribe(),
            None => {
                let (tx, rx) = watch::channel(0);
                channels.insert(channel.to_owned(), tx);
                rx
            }
        };
        Listener {
            rx: Some(rx),
            hub: Arc::clone(self),
            channel: channel.to_owned(),
            on_drop: None,
        }
    }

    /// Wakes every listener of `channel`.
    pub(crate) fn notify(&self, channel: &str) {
        if let Some(tx) = lock(&self.channels).get(channel) {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Wakes every listener of every channel, e.g. after the notification connection dropped and
    /// messages may have been lost.
    pub(crate) fn notify_all(&self) {
        for tx in lock(&self.channels).values() {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// How many channels have listeners (for tests: nothing may be left behind).
    #[cfg(test)]
    pub(crate) fn channel_count(&self) -> usize {
        lock(&self.channels).len()
    }
}

/// A registration on one channel; dropping it unregisters.
pub(crate) struct Listener {
    rx: Option<watch::Receiver<u64>>,
    hub: Arc<Wakeups>,
    channel: String,
    /// Backend clean-up when this listener goes (the Redis store unsubscribes).
    on_drop: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("channel", &self.channel)
            .finish_non_exhaustive()
    }
}

impl Listener {
    pub(crate) fn on_drop(mut self, f: impl FnOnce() + Send + Sync + 'static) -> Self {
        self.on_drop = Some(Box::new(f));
        self
    }

    /// Completes at the next notification after the previous call (or after `listen`).
    pub(crate) async fn notified(&mut self) {
        let Some(rx) = self.rx.as_mut() else {
            return std::future::pending().await;
        };
        if rx.changed().await.is_err() {
            // The hub dropped the channel, which it does only once no listener is left; we are
            // one, so this cannot happen. Waiting for the backoff is the safe answer anyway.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        drop(self.rx.take());
        {
            let mut channels = lock(&self.hub.channels);
            if channels
                .get(&self.channel)
                .is_some_and(|tx| tx.receiver_count() == 0)
            {
                channels.remove(&self.channel);
            }
        }
        if let Some(f) = self.on_drop.take() {
            f();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_notification_before_the_wait_is_not_lost() {
        let hub = Arc::new(Wakeups::default());
        let mut l = hub.listen("k_done");
        hub.notify("k_done");
        tokio::time::timeout(Duration::from_secs(5), l.notified())
            .await
            .expect("the early notification must be seen");
    }

    #[tokio::test]
    async fn channels_are_removed_with_their_last_listener() {
        let hub = Arc::new(Wakeups::default());
        let a = hub.listen("x");
        let b = hub.listen("x");
        assert_eq!(hub.channel_count(), 1);
        drop(a);
        assert_eq!(hub.channel_count(), 1);
        drop(b);
        assert_eq!(hub.channel_count(), 0);
    }
}
