//! Freshness across machines whose clocks disagree: a reader whose clock runs an hour ahead, and a
//! writer whose clock is behind by more than the TTL. Both run as real processes (this binary,
//! re-executed under `faketime`, which shifts the wall clock of one process), against one real
//! redis-server; freshness must follow the server's clock, not theirs.

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod cache;
    pub mod clock;
    pub mod process;
    pub mod server;
    pub use {cache::*, clock::*, process::*, server::*};
}

use std::process::Command;
use std::time::Duration;

use stampede_guard::{CallOptions, Source};
use support::cache;
use support::{now_us, RedisServer};

const TTL: Duration = Duration::from_secs(60);

fn main() {
    let tests: &[(&str, fn())] = &[
        (
            "a_reader_whose_clock_runs_ahead_still_gets_fresh_hits",
            a_reader_whose_clock_runs_ahead_still_gets_fresh_hits,
        ),
        (
            "a_writer_whose_clock_is_behind_by_more_than_the_ttl_writes_fresh_values",
            a_writer_whose_clock_is_behind_writes_fresh_values,
        ),
    ];
    support::run_child_or_tests("clock_skew", tests, child);
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// The options of every cache in this test and in its skewed children.
fn options() -> CallOptions {
    CallOptions::default().stale_for(Duration::from_secs(600))
}

/// Runs a child role of this binary with its wall clock shifted by `shift` (faketime syntax,
/// e.g. `+1h`), and returns what it printed.
fn run_skewed(shift: &str, role: &str, url: &str, key: &str) -> String {
    let exe = std::env::current_exe().expect("the test binary's path");
    let output = Command::new("faketime")
        .arg("-f")
        .arg(shift)
        .arg(exe)
        .env("STAMPEDE_CHILD", role)
        .env("URL", url)
        .env("KEY", key)
        // Only the wall clock moves: timers and leases run on the monotonic clock.
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .output();
    let output = match output {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "faketime was not found on PATH. This test shifts one process's clock with it: \
             install it (Debian/Ubuntu: `apt-get install faketime`, macOS: `brew install \
             libfaketime`) or run `bash .ci/test`, which installs it."
        ),
        Err(e) => panic!("could not run faketime: {e}"),
    };
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "child {role} failed: {}{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The child reports its own clock, so a shift that did not happen cannot pass unnoticed.
    let clock: u64 = field(&stdout, "clock_ms")
        .parse()
        .expect("the child's clock");
    let skew = clock.abs_diff(now_us() / 1000);
    assert!(
        skew > 2 * TTL.as_millis() as u64,
        "faketime did not shift the child's clock ({skew} ms off)"
    );
    stdout
}

fn field<'a>(stdout: &'a str, name: &str) -> &'a str {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in the child's output: {stdout}"))
}

fn a_reader_whose_clock_runs_ahead_still_gets_fresh_hits() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let cache = cache(&server, "skew", options()).await;
        let _ = cache
            .set("2019-05", &"report".to_string(), TTL)
            .await
            .expect("written");
    });
    let out = run_skewed("+1h", "reader", &server.url(), "2019-05");
    assert_eq!(field(&out, "source"), "Hit", "{out}");
    assert_eq!(field(&out, "value"), "report", "{out}");
}

fn a_writer_whose_clock_is_behind_writes_fresh_values() {
    let server = RedisServer::start();
    run_skewed("-5m", "writer", &server.url(), "2019-06");
    runtime().block_on(async {
        let read = cache(&server, "skew", options())
            .await
            .fetch("2019-06", TTL, |_| async {
                Ok::<_, std::io::Error>(stampede_guard::Computed::new("recomputed".to_string()))
            })
            .await
            .expect("read");
        assert_eq!(
            (read.value.as_str(), read.source),
            ("written behind", Source::Hit)
        );
    });
}

fn child(role: &str) -> Result<(), String> {
    let url = std::env::var("URL").map_err(|e| e.to_string())?;
    let key = std::env::var("KEY").map_err(|e| e.to_string())?;
    println!("clock_ms {}", now_us() / 1000);
    runtime().block_on(async {
        let cache = cache(&url, "skew", options()).await;
        match role {
            "reader" => {
                let read = cache
                    .fetch(&key, TTL, |_| async {
                        Ok::<_, std::io::Error>(stampede_guard::Computed::new(
                            "recomputed".to_string(),
                        ))
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                println!("source {:?}", read.source);
                println!("value {}", read.value);
            }
            "writer" => {
                cache
                    .get_or_compute(&key, TTL, || async {
                        Ok::<_, std::io::Error>("written behind".to_string())
                    })
                    .await
                    .map_err(|e| e.to_string())?;
            }
            other => return Err(format!("unknown role {other}")),
        }
        Ok(())
    })
}
