//! What the Redis benches read and the runtime they read it on: the load generator's 1 KiB
//! value, and a client on one thread.

/// The size of the load generator's value (see `examples/stampede_bench`).
pub const VALUE_BYTES: usize = 1024;

/// The load generator's value: a 1,024-byte `String`.
pub fn value() -> String {
    "2019-05|".repeat(VALUE_BYTES / 8 + 1)[..VALUE_BYTES].to_owned()
}

/// One thread for the client, so that redis-server has the other core to itself. On a
/// multi-thread runtime a 1-in-flight call's latency swings between ~19 and ~58 µs run to run,
/// depending on whether the caller and the connection's driver task land on the same worker:
/// that measures the scheduler, not the library.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}
