//! The observability example (`examples/observability.rs`) against a redis-server of its own:
//! after some stampedes, its Prometheus scrape holds the metric names that
//! `docs/observability.md` and the Grafana dashboard (`docs/grafana-dashboard.json`) use, and
//! none of the names they replaced.
//!
//! `cargo test` builds the examples next to the test binaries when their features are on
//! (`--all-features`, or `--features metrics`); a run that did not build it fails and says how.
#![cfg(feature = "metrics")]

/// The shared helpers this file uses, one module each (tests/support/).
mod support {
    pub mod example;
    pub mod server;
    pub use {example::*, server::*};
}

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{example_binary, RedisServer};

/// The example's binary.
fn example() -> PathBuf {
    example_binary(
        "observability",
        "run `cargo build --example observability --features metrics` (plain `cargo test \
         --all-features` builds it)",
    )
}

/// The example's process, killed (by its pid) when the test ends, passed or not.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The body of `GET http://addr/metrics`, over a plain HTTP/1.0 request.
fn scrape(addr: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("the scrape endpoint answers");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    body.to_owned()
}

/// The value of the sample `series` (name and labels, exactly as scraped), if there is one.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn the_example_serves_the_documented_metric_names_after_a_stampede() {
    let server = RedisServer::start();
    let child = Command::new(example())
        .args(["--url", &server.url(), "--listen", "127.0.0.1:0"])
        // Each key is invalidated every 6th wave, so it also lives past its TTL (600 ms) into
        // its stale window, and past that.
        .args(["--seconds", "90", "--callers", "10", "--keys", "6"])
        .args(["--ttl-ms", "600", "--compute-ms", "50"])
        // Spans are made but not exported: no collector here.
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the example starts");
    let mut child = Running(child);
    let stdout = child.0.stdout.take().expect("piped");
    let mut first = String::new();
    BufReader::new(stdout).read_line(&mut first).unwrap();
    let addr = first
        .trim()
        .strip_prefix("metrics at http://")
        .and_then(|rest| rest.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("expected `metrics at http://ADDR/metrics`, got {first:?}"))
        .to_owned();

    // Until the keys have been computed, waited for and served stale (a few TTLs), or a minute.
    let computed = r#"stampede_guard_calls_total{answer="computed"}"#;
    let deadline = Instant::now() + Duration::from_secs(60);
    let text = loop {
        let text = scrape(&addr);
        let saved = sample(&text, "stampede_guard_computations_saved_total").unwrap_or(0.0);
        let stale = sample(&text, r#"stampede_guard_calls_total{answer="stale"}"#);
        if sample(&text, computed).unwrap_or(0.0) >= 3.0 && saved > 0.0 && stale.is_some() {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "no stampede seen in a minute:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    for name in [
        r#"stampede_guard_calls_total{answer="hit"}"#,
        r#"stampede_guard_calls_total{answer="joined"}"#,
        "stampede_guard_computes_total",
        "stampede_guard_compute_seconds_bucket",
        "stampede_guard_compute_seconds_count",
        "stampede_guard_lock_wait_seconds_bucket",
        "stampede_guard_lock_wait_seconds_sum",
        "stampede_guard_computations_saved_total",
    ] {
        assert!(
            text.contains(name),
            "{name} missing from the scrape:\n{text}"
        );
    }
    // Two instances in one process, one key at a time: the second instance's callers wait on
    // the first's lock (or the other way round) at least once.
    let waited = sample(&text, r#"stampede_guard_calls_total{answer="waited"}"#);
    assert!(
        waited.is_some_and(|n| n > 0.0),
        "no call waited on the lock:\n{text}"
    );
    // Each call once: the answers and the saved computations agree.
    let answer = |a: &str| {
        sample(
            &text,
            &format!(r#"stampede_guard_calls_total{{answer="{a}"}}"#),
        )
    };
    let saved = sample(&text, "stampede_guard_computations_saved_total").unwrap();
    let joined_and_waited = answer("joined").unwrap_or(0.0) + answer("waited").unwrap_or(0.0);
    // Scraped at one instant, but the counters are updated one after the other: a call may be
    // between the two. The two figures differ by the calls in flight at most.
    assert!(
        (saved - joined_and_waited).abs() <= 20.0,
        "{saved} vs {joined_and_waited}"
    );
    for gone in [
        "stampede_guard_hits_total",
        "stampede_guard_misses_total",
        "stampede_guard_waits_total",
        "stampede_guard_wait_seconds",
    ] {
        let exported = text.lines().any(|line| line.starts_with(gone));
        assert!(!exported, "{gone} is still exported:\n{text}");
    }
}
