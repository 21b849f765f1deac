//! A conformance check to run against your own Redis (or Valkey, Dragonfly, a managed service):
//!
//! ```text
//! cargo run --example doctor -- redis://user:password@host:6379/0
//! ```
//!
//! It runs a short, bounded scenario in a namespace of its own (`stampede-doctor-<uuid>`),
//! deletes that namespace's keys afterwards, and prints a table: what works, what fell back
//! and what that costs, the round-trip time, the wake-up latency, and the options it
//! recommends for the server. A read-only server, an ACL refusal or a server without Lua gives
//! a line that says so, never a panic. Exits 1 when a check failed. See `docs/servers.md`.

mod scenario;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Some(url) = std::env::args().nth(1) else {
        eprintln!("usage: cargo run --example doctor -- <redis-url>");
        std::process::exit(2);
    };
    let report = scenario::diagnose(&url).await;
    print!("{}", report.table());
    if report.verdict_failed() {
        std::process::exit(1);
    }
}
