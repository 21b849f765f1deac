//! Running many futures at once on the caller's own task: a batch waits for several keys, locks
//! several slots and stores several values concurrently.
//!
//! Not spawned tasks, on purpose: the futures borrow the call's state (its flight leaders, its
//! held locks), and dropping the call drops them all at once, which is what releases their
//! locks and hands their keys to the next caller (the cancellation contract of the single-key
//! path, unchanged).

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

/// Polls every future until all are done; their outputs in the order of `futures`.
pub(crate) async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut running: Vec<Option<Pin<Box<F>>>> =
        futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut outputs: Vec<Option<F::Output>> = running.iter().map(|_| None).collect();
    let mut left = running.len();
    std::future::poll_fn(|cx| {
        for (slot, output) in running.iter_mut().zip(outputs.iter_mut()) {
            if let Some(future) = slot {
                if let Poll::Ready(out) = future.as_mut().poll(cx) {
                    *output = Some(out);
                    *slot = None;
                    left -= 1;
                }
            }
        }
        if left == 0 {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn all_run_at_once_and_outputs_keep_their_order() {
        let started = tokio::time::Instant::now();
        let futures = (0..3u64)
            .map(|i| async move {
                tokio::time::sleep(Duration::from_millis(30 - 10 * i)).await;
                i
            })
            .collect();
        assert_eq!(join_all(futures).await, vec![0, 1, 2]);
        assert_eq!(
            started.elapsed(),
            Duration::from_millis(30),
            "concurrently, not in turn"
        );
    }
}
