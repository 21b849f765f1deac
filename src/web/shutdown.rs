//! One shutdown signal for the whole process: every clone completes when Ctrl-C or SIGTERM
//! arrives, so the server and the leader stop on the same signal.
//!
//! Handing `tokio::signal::ctrl_c()` to one of them alone stops it and leaves the other running
//! (a server still serving after its leader stopped, or the other way round); a second
//! `ctrl_c()` future would also race the first for the same signal.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::watch;

/// A shutdown signal that completes, in every clone, once the future it was made from does:
/// Ctrl-C or SIGTERM for [`shutdown_signal`]. It is a `Future<Output = ()>` itself, so a clone
/// goes wherever a shutdown future is taken: `axum::serve(..).with_graceful_shutdown(..)` and
/// [`Leader::run`](crate::leader::Leader::run) both.
///
/// A clone made after the signal completes at once.
///
/// ```
/// use stampede_guard::{leader::Leader, web::Shutdown, Cache};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // In a service: `let shutdown = web::shutdown_signal();` (Ctrl-C or SIGTERM).
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// let shutdown = Shutdown::when(async move { let _ = stopped.await; });
///
/// let cache = Cache::in_memory();
/// let leader = Leader::new(cache.lock("nightly")?, Duration::from_secs(60));
/// let leader = tokio::spawn(leader.run(|_ctx| async { Ok::<(), String>(()) }, shutdown.clone()));
///
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let server = tokio::spawn({
///     let shutdown = shutdown.clone();
///     async move { axum::serve(listener, axum::Router::new()).with_graceful_shutdown(shutdown).await }
/// });
///
/// let _ = stop.send(()); // Ctrl-C
/// server.await??;
/// leader.await??;
/// assert!(shutdown.is_requested());
/// # Ok(())
/// # }
/// ```
pub struct Shutdown {
    requested: watch::Receiver<bool>,
    /// This clone's wait, made on its first poll (a clone that is never awaited costs nothing).
    waiting: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

/// Ctrl-C, or SIGTERM on Unix (what `kill`, systemd and Kubernetes send), as a [`Shutdown`]
/// that every part of the service awaits.
///
/// ```no_run
/// use stampede_guard::web;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let shutdown = web::shutdown_signal();
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
/// axum::serve(listener, axum::Router::new())
///     .with_graceful_shutdown(shutdown.clone())
///     .await?;
/// # Ok(())
/// # }
/// ```
///
/// # Panics
/// Outside a Tokio runtime (it spawns the task that listens for the signals).
pub fn shutdown_signal() -> Shutdown {
    Shutdown::when(async {
        ctrl_c_or_sigterm().await;
        tracing::info!("shutdown requested");
    })
}

impl Shutdown {
    /// A shutdown signal that completes once `signal` does (a test's channel, an admin
    /// endpoint's trigger). `signal` runs in a task of its own until then.
    ///
    /// ```
    /// use stampede_guard::web::Shutdown;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let shutdown = Shutdown::when(async {});
    /// shutdown.clone().await;
    /// assert!(shutdown.is_requested());
    /// # }
    /// ```
    ///
    /// # Panics
    /// Outside a Tokio runtime.
    pub fn when(signal: impl Future<Output = ()> + Send + 'static) -> Shutdown {
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            // Every receiver dropped: nobody is waiting, and nothing is left to tell.
            tokio::select! {
                () = signal => { let _ = tx.send(true); }
                () = tx.closed() => {}
            }
        });
        Shutdown {
            requested: rx,
            waiting: None,
        }
    }

    /// Whether shutdown has been requested.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let shutdown = stampede_guard::web::Shutdown::when(std::future::pending());
    /// assert!(!shutdown.is_requested());
    /// # }
    /// ```
    pub fn is_requested(&self) -> bool {
        *self.requested.borrow()
    }
}

impl Clone for Shutdown {
    fn clone(&self) -> Self {
        Shutdown {
            requested: self.requested.clone(),
            waiting: None,
        }
    }
}

impl std::fmt::Debug for Shutdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shutdown")
            .field("requested", &self.is_requested())
            .finish()
    }
}

impl Future for Shutdown {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut requested = self.requested.clone();
        let waiting = self.waiting.get_or_insert_with(|| {
            Box::pin(async move {
                // An error means the sender is gone; it goes only after sending `true`, or
                // with every receiver, and this is one.
                let _ = requested.wait_for(|&stop| stop).await;
            })
        });
        waiting.as_mut().poll(cx)
    }
}

/// Ctrl-C, or SIGTERM on Unix.
async fn ctrl_c_or_sigterm() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
