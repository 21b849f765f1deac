//! What a piece of code logs, read back as text: a subscriber for the current thread only, so
//! that tests running beside it in the same binary do not write into it. Needs `logs` declared
//! beside it.

use super::logs::Captured;

/// Runs `f` and returns what it logged at `info` and above on this thread (code that logs from
/// other threads, a multi-thread runtime's workers, is not seen: run it on a current-thread
/// runtime inside `f`).
pub fn logged<R>(f: impl FnOnce() -> R) -> (R, String) {
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let logs = logs.clone();
            move || logs.clone()
        })
        .with_ansi(false)
        .finish();
    let out = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    (out, text)
}
