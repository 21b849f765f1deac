//! A value that changes and the tasks that wait for its changes: the part of
//! `tokio::sync::watch` that the in-process flights (`wait/flight.rs`) and the wake-up hub
//! (`store/wakeup.rs`) use, with one difference that matters: the waiters of one change are
//! woken in the order they began to wait.
//!
//! Why not `watch` itself: it spreads its receivers over eight `Notify`s, each receiver's picked
//! by the runtime's random generator, which stable tokio seeds from the OS and offers no way
//! to seed. Several receivers of one change (the followers of one flight, the waiters of one
//! key) then wake in an order that changes from run to run, and the seeded simulation
//! (`tests/sim/`, issue 39) could not replay a schedule. Here one `Notify` wakes them in the
//! order they registered.
//!
//! The `std` mutex is held only to read or replace the value, never across an `.await`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::sync::lock;

/// The value and its version (how many times it was sent).
struct Shared<T> {
    value: Mutex<(u64, T)>,
    notify: Notify,
    receivers: AtomicUsize,
    /// The sender is gone: no change will come.
    closed: AtomicBool,
}

/// The sending half: one per value.
pub(crate) struct Sender<T> {
    shared: Arc<Shared<T>>,
}

/// A receiving half: sees every change sent after the version it last saw.
pub(crate) struct Receiver<T> {
    shared: Arc<Shared<T>>,
    seen: u64,
}

/// The sender went away without the change a waiter waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Closed;

/// A value `init` and its first receiver.
pub(crate) fn channel<T>(init: T) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        value: Mutex::new((0, init)),
        notify: Notify::new(),
        receivers: AtomicUsize::new(1),
        closed: AtomicBool::new(false),
    });
    let rx = Receiver {
        shared: Arc::clone(&shared),
        seen: 0,
    };
    (Sender { shared }, rx)
}

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("receivers", &self.receiver_count())
            .finish_non_exhaustive()
    }
}

impl<T> Sender<T> {
    /// Changes the value in place and wakes every waiter.
    pub(crate) fn send_modify(&self, modify: impl FnOnce(&mut T)) {
        {
            let mut value = lock(&self.shared.value);
            value.0 = value.0.wrapping_add(1);
            modify(&mut value.1);
        }
        self.shared.notify.notify_waiters();
    }

    /// Replaces the value and wakes every waiter.
    pub(crate) fn send_replace(&self, new: T) {
        self.send_modify(|value| *value = new);
    }

    /// A new receiver, which has seen the current value.
    pub(crate) fn subscribe(&self) -> Receiver<T> {
        self.shared.receivers.fetch_add(1, Ordering::AcqRel);
        Receiver {
            shared: Arc::clone(&self.shared),
            seen: lock(&self.shared.value).0,
        }
    }

    /// How many receivers exist.
    pub(crate) fn receiver_count(&self) -> usize {
        self.shared.receivers.load(Ordering::Acquire)
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.notify.notify_waiters();
    }
}

impl<T> Receiver<T> {
    /// Completes at the first change after the last one this receiver saw (at once if one was
    /// sent since), and marks it seen; `Err` once the sender is gone without one.
    pub(crate) async fn changed(&mut self) -> Result<(), Closed>
    where
        T: Clone,
    {
        self.wait_until(|_| true).await.map(|_| ())
    }

    /// Waits until the value satisfies `ready`, looking at the current value first, and
    /// answers with a copy of it; `Err` once the sender is gone and it never did.
    pub(crate) async fn wait_for(&mut self, ready: impl Fn(&T) -> bool) -> Result<T, Closed>
    where
        T: Clone,
    {
        {
            let value = lock(&self.shared.value);
            if ready(&value.1) {
                self.seen = value.0;
                return Ok(value.1.clone());
            }
        }
        self.wait_until(ready).await
    }

    /// Waits for a change, not yet seen, after which the value satisfies `ready`.
    async fn wait_until(&mut self, ready: impl Fn(&T) -> bool) -> Result<T, Closed>
    where
        T: Clone,
    {
        loop {
            // Registered before the value is looked at: a change sent in between still wakes
            // this wait.
            let notified = self.shared.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let value = lock(&self.shared.value);
                if value.0 != self.seen {
                    self.seen = value.0;
                    if ready(&value.1) {
                        return Ok(value.1.clone());
                    }
                }
            }
            if self.shared.closed.load(Ordering::Acquire) {
                return Err(Closed);
            }
            notified.await;
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        self.shared.receivers.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_change_before_the_wait_is_seen_and_a_seen_one_is_not_seen_again() {
        let (tx, mut rx) = channel(0u32);
        tx.send_replace(1);
        tokio::time::timeout(Duration::from_secs(1), rx.changed())
            .await
            .expect("the earlier change wakes the wait")
            .expect("the sender is alive");
        let again = tokio::time::timeout(Duration::from_millis(50), rx.changed()).await;
        assert!(again.is_err(), "a change seen once is not seen twice");
    }

    #[tokio::test]
    async fn waiters_wake_in_the_order_they_began_to_wait() {
        let (tx, rx) = channel(0u32);
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..16 {
            let mut rx = tx.subscribe();
            let order = Arc::clone(&order);
            tasks.push(tokio::spawn(async move {
                rx.wait_for(|v| *v == 1).await.expect("sent");
                lock(&order).push(i);
            }));
            tokio::task::yield_now().await;
        }
        drop(rx);
        tx.send_replace(1);
        for task in tasks {
            task.await.expect("the waiter ends");
        }
        assert_eq!(*lock(&order), (0..16).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_sender_gone_ends_every_wait_and_receivers_are_counted() {
        let (tx, mut rx) = channel(0u32);
        let second = tx.subscribe();
        assert_eq!(tx.receiver_count(), 2);
        drop(second);
        assert_eq!(tx.receiver_count(), 1);
        let waiting = tokio::spawn(async move { rx.wait_for(|v| *v == 9).await });
        tokio::task::yield_now().await;
        drop(tx);
        assert_eq!(waiting.await.expect("the waiter ends"), Err(Closed));
    }
}
