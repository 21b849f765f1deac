//! The tokio runtime of a test that drives its own (a child process, or a test whose proxy or
//! server must be started and dropped outside the runtime).

/// A multi-threaded runtime with two workers and every driver: what `#[tokio::test(flavor =
/// "multi_thread", worker_threads = 2)]` builds, for code that cannot use the attribute.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}
