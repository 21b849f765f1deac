//! Drives the `axum_report` example over real HTTP: the example binary runs as a child process on
//! a free loopback port (SQLite in memory; Redis from a redis-server this test starts), and the
//! requests go through a socket. The database's query count comes from its `/stats` endpoint.
//! Shutdown is tested as an operator does it: a signal to the process (`kill -INT`, `kill -TERM`).
//!
//! Needs the `tower` feature and the example binary built by the same command:
//! `cargo build --features tower --example axum_report && cargo test --features tower --test axum_report`
//! (what `.ci/run` does).

mod http_client;
/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod example;
    pub mod server;
    pub use {example::*, server::*};
}

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use support::{example_binary, RedisServer};

/// Long enough that fifty requests sent together all arrive while the first query runs.
const QUERY_MS: &str = "300";

/// The example's binary.
fn example() -> PathBuf {
    example_binary(
        "axum_report",
        "run `cargo build --features tower --example axum_report`, then this test",
    )
}

/// The example running as a child process; killed (by its handle) on drop.
struct Service {
    child: Child,
    /// `127.0.0.1:PORT`, from the line it prints first.
    addr: String,
    /// The lines it printed after the first, as they come.
    lines: Receiver<String>,
}

impl Service {
    fn start(extra: &[&str]) -> Self {
        let mut child = Command::new(example())
            .args(["--listen", "127.0.0.1:0", "--query-ms", QUERY_MS])
            .args(extra)
            // Its own SQLite database, whatever the environment says.
            .env_remove("DATABASE_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the example starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        // Reads every line, so the child never blocks on a full pipe; hands over the first.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let first = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the example prints where it listens within 30 s");
        let addr = first
            .strip_prefix("listening on http://")
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
            .to_owned();
        Service {
            child,
            addr,
            lines: rx,
        }
    }

    /// Sends `signal` (`INT`, `TERM`) to the process, as Ctrl-C or `kill` would.
    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("the kill command runs");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits for the process to exit (bounded, so that a service that ignores the signal fails
    /// the test instead of hanging it) and returns its status.
    fn wait_for_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("the child's status") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the service was still running 30 s after the signal"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every line printed so far (after the first).
    fn printed(&self) -> Vec<String> {
        self.lines.try_iter().collect()
    }

    /// This instance's leader role and how many times it ran the leader job, from `/stats`.
    async fn leader(&self) -> (String, u64) {
        let stats = self.get("/stats").await.json();
        let role = stats["leader"]["role"].as_str().expect("a role").to_owned();
        let runs = stats["leader"]["summary_runs"].as_u64().expect("a count");
        (role, runs)
    }

    async fn get(&self, path: &str) -> http_client::Response {
        http_client::get(&self.addr, path).await
    }

    async fn post(&self, path: &str) -> http_client::Response {
        http_client::post(&self.addr, path).await
    }

    /// The orders in the month's report, as the service answers it now (`None` if not a 200).
    async fn orders(&self, month: &str) -> Option<i64> {
        let response = self.get(&format!("/report/{month}")).await;
        (response.status == 200).then(|| response.json()["orders"].as_i64().expect("orders"))
    }

    async fn queries(&self) -> u64 {
        let stats = self.get("/stats").await;
        assert_eq!(stats.status, 200, "{stats:?}");
        stats.json()["queries"].as_u64().expect("a query count")
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `n` requests for `path`, sent at once, spread round-robin over `services`.
async fn concurrent_gets(
    services: &[&Service],
    path: &str,
    n: usize,
) -> Vec<http_client::Response> {
    let mut requests = tokio::task::JoinSet::new();
    for i in 0..n {
        let addr = services[i % services.len()].addr.clone();
        let path = path.to_owned();
        requests.spawn(async move { http_client::get(&addr, &path).await });
    }
    requests.join_all().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_requests_for_a_cold_month_run_its_query_once() {
    let service = Service::start(&[]);
    assert_eq!(service.queries().await, 0);

    let responses = concurrent_gets(&[&service], "/report/2019-05", 50).await;
    for response in &responses {
        assert_eq!(response.status, 200, "{response:?}");
        assert_eq!(
            response.body, responses[0].body,
            "every caller gets the same report"
        );
        assert_eq!(response.header("content-type"), Some("application/json"));
    }
    let report = responses[0].json();
    assert_eq!(report["month"], "2019-05");
    assert_eq!(report["orders"], 2000);
    assert_eq!(report["regions"].as_array().map(Vec::len), Some(4));

    // The response cache ran the handler for one request; the others waited for its response.
    let computed: Vec<_> = responses
        .iter()
        .filter(|r| r.header("x-cache") == Some("computed"))
        .collect();
    assert_eq!(computed.len(), 1, "{responses:?}");
    assert!(responses.iter().all(|r| r.header("etag").is_some()));

    let stats = service.get("/stats").await.json();
    assert_eq!(stats["queries"], 1, "{stats}");
    assert_eq!(stats["queries_by_month"]["2019-05"], 1, "{stats}");
    // The cache's own counters, serialized (`Stats: Serialize`): two computations (the whole
    // response, and below it the month's value), and each of the 50 requests a hit or a miss
    // of the response, plus the handler's one call for the value.
    let cache = &stats["cache"];
    assert_eq!(cache["computes"], 2, "{stats}");
    let calls = cache["hits"].as_u64().unwrap() + cache["misses"].as_u64().unwrap();
    assert_eq!(calls, 51, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_month_is_queried_once_then_served_from_the_cache() {
    let service = Service::start(&[]);
    let months: Vec<String> = (1..=12).map(|m| format!("2019-{m:02}")).collect();
    let mut requests = tokio::task::JoinSet::new();
    for month in &months {
        for _ in 0..4 {
            let (addr, path) = (service.addr.clone(), format!("/report/{month}"));
            requests.spawn(async move { http_client::get(&addr, &path).await });
        }
    }
    for response in requests.join_all().await {
        assert_eq!(response.status, 200, "{response:?}");
        // Every month was seeded with its own 2,000 orders.
        assert_eq!(response.json()["orders"], 2000, "{response:?}");
    }
    assert_eq!(service.queries().await, 12);

    // Warm now: asking again runs nothing.
    for month in &months {
        let response = service.get(&format!("/report/{month}")).await;
        assert_eq!(response.status, 200, "{response:?}");
        assert_eq!(response.json()["month"], month.as_str());
    }
    let stats = service.get("/stats").await.json();
    assert_eq!(stats["queries"], 12, "{stats}");
    for month in &months {
        assert_eq!(stats["queries_by_month"][month], 1, "{month}: {stats}");
    }
}

/// `GET /report/2019`: twenty concurrent requests for the cold year run one query between them
/// (one batch call each, twelve months per query); a month already cached is left out of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_requests_for_a_cold_year_run_one_query_for_its_twelve_months() {
    let service = Service::start(&[]);
    assert_eq!(service.get("/report/2019-05").await.status, 200);
    let responses = concurrent_gets(&[&service], "/report/2019", 20).await;
    for response in &responses {
        assert_eq!(response.status, 200, "{response:?}");
        assert_eq!(
            response.body, responses[0].body,
            "every caller gets the same year"
        );
    }
    let year = responses[0].json();
    let months = year.as_array().expect("a list of twelve reports");
    assert_eq!(months.len(), 12);
    for (i, report) in months.iter().enumerate() {
        assert_eq!(report["month"], format!("2019-{:02}", i + 1));
        assert_eq!(report["orders"], 2000, "{report}");
    }
    let stats = service.get("/stats").await.json();
    assert_eq!(
        stats["queries"], 2,
        "2019-05 alone, then one query for the year: {stats}"
    );
    for i in 1..=12 {
        let month = format!("2019-{i:02}");
        assert_eq!(stats["queries_by_month"][&month], 1, "{month}: {stats}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_sharing_redis_run_a_cold_months_query_once_between_them() {
    let redis = RedisServer::start();
    let url = redis.url();
    let a = Service::start(&["--redis", &url]);
    let b = Service::start(&["--redis", &url]);

    let responses = concurrent_gets(&[&a, &b], "/report/2019-09", 50).await;
    for response in &responses {
        assert_eq!(response.status, 200, "{response:?}");
        assert_eq!(response.body, responses[0].body);
    }
    let (qa, qb) = (a.queries().await, b.queries().await);
    assert_eq!(qa + qb, 1, "instance a ran {qa} queries, b ran {qb}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_that_is_no_month_is_a_400_and_runs_nothing() {
    let service = Service::start(&[]);
    for path in ["/report/2019-13", "/report/may", "/report/2019-5"] {
        let response = service.get(path).await;
        assert_eq!(response.status, 400, "{path}: {response:?}");
        assert!(response.body.contains("expected YYYY-MM"), "{response:?}");
    }
    assert_eq!(service.get("/nowhere").await.status, 404);
    assert_eq!(service.queries().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_is_a_503_with_retry_after_and_runs_no_query() {
    // A real server, stopped: its port now refuses connections.
    let mut redis = RedisServer::start();
    let url = redis.url();
    redis.kill();
    let service = Service::start(&["--redis", &url]);

    let response = service.get("/report/2019-05").await;
    assert_eq!(response.status, 503, "{response:?}");
    assert_eq!(response.header("retry-after"), Some("1"), "{response:?}");
    let body: serde_json::Value = serde_json::from_str(&response.body).expect("a JSON body");
    assert_eq!(body["error"], "the cache is unavailable; try again shortly");
    // The client learns nothing of the server's set-up.
    assert!(!response.body.contains(&redis.port().to_string()));
    assert_eq!(service.queries().await, 0);

    // The process is alive whatever Redis does; it is not ready: the example configures no
    // fallback for reads (no held copies, no uncached computation), so every report fails.
    assert_eq!(service.get("/livez").await.status, 200);
    let ready = service.get("/readyz").await;
    assert_eq!(ready.status, 503, "{ready:?}");
    let report: serde_json::Value = serde_json::from_str(&ready.body).expect("a JSON report");
    assert_eq!(report["state"], "unavailable", "{report}");
    assert!(
        report["reasons"]
            .as_array()
            .is_some_and(|r| r.contains(&"no_fallback".into())),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_signal_stops_the_server_and_the_leader_and_the_process_exits() {
    let mut service = Service::start(&["--summary-every-ms", "100"]);
    // The only instance: it leads, and its job writes the year's summary for the handlers.
    eventually("the instance leads and has run its job", || async {
        let (role, runs) = service.leader().await;
        role == "active" && runs >= 1
    })
    .await;
    let summary = service.get("/summary").await;
    assert_eq!(summary.status, 200, "{summary:?}");
    assert_eq!(summary.json()["orders"], 12 * 2000, "{summary:?}");

    service.signal("INT"); // Ctrl-C
    let status = service.wait_for_exit();
    assert!(status.success(), "exit status {status}");
    let printed = service.printed();
    let at = |line: &str| printed.iter().position(|l| l == line);
    let (server, leader) = (at("server stopped"), at("leader stopped"));
    assert!(
        at("shutdown requested").is_some() && server.is_some() && leader.is_some(),
        "{printed:?}"
    );
    assert!(server < leader, "{printed:?}");
    // Nothing listens any more.
    assert!(
        tokio::net::TcpStream::connect(&service.addr).await.is_err(),
        "the server still accepts connections after the signal"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_instances_one_leads_and_a_shut_down_leader_hands_over_at_once() {
    let redis = RedisServer::start();
    let url = redis.url();
    let mut instances = [
        Service::start(&["--redis", &url, "--summary-every-ms", "100"]),
        Service::start(&["--redis", &url, "--summary-every-ms", "100"]),
    ];
    // One leads and has written the summary; the other stands by.
    let deadline = Instant::now() + Duration::from_secs(30);
    let roles = loop {
        let mut roles = Vec::new();
        for instance in &instances {
            roles.push(instance.leader().await.0);
        }
        let written = instances[0].get("/summary").await.status == 200;
        if written && roles.iter().filter(|r| *r == "active").count() == 1 {
            break roles;
        }
        assert!(
            Instant::now() < deadline,
            "no single leader within 30 s: {roles:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(roles.contains(&"standby".to_owned()), "{roles:?}");
    let active = roles.iter().position(|r| r == "active").unwrap();
    let standby = 1 - active;
    let first_term = instances[standby].get("/summary").await.json()["written_by_term"]
        .as_u64()
        .expect("a term");

    // SIGTERM, as an orchestrator stops an instance: the leader releases its lock on the way
    // out, so the other takes over well before the lease (5 s, the default) would have run out.
    let signalled = Instant::now();
    instances[active].signal("TERM");
    assert!(instances[active].wait_for_exit().success());
    eventually("the other instance takes over", || async {
        instances[standby].leader().await.0 == "active"
    })
    .await;
    let took = signalled.elapsed();
    assert!(
        took < Duration::from_secs(4),
        "the hand-over took {took:?}: the lock was not released on shutdown"
    );
    // The new leader's summary carries a later term's fencing token.
    eventually("the new leader writes the summary", || async {
        let summary = instances[standby].get("/summary").await.json();
        summary["written_by_term"]
            .as_u64()
            .is_some_and(|t| t > first_term)
    })
    .await;
}

/// `POST /orders/{month}` commits the order, invalidates the cached report (the next read sees
/// the order) and answers 201, saying the invalidation was applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_is_committed_and_its_cached_report_invalidated() {
    let redis = RedisServer::start();
    let service = Service::start(&["--redis", &redis.url()]);
    let before = service.orders("2019-05").await.expect("a report");

    let response = service.post("/orders/2019-05").await;
    assert_eq!(response.status, 201, "{response:?}");
    assert_eq!(response.header("x-cache-invalidation"), Some("applied"));
    assert_eq!(response.json()["cache"], "applied");
    assert_eq!(service.orders("2019-05").await, Some(before + 1));
}

/// With `Prefer: return=representation`, `POST /orders/{month}` answers with the month's report
/// read after the write (past the near tier): the order is in it. Without the header, no report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_asked_with_its_representation_answers_the_report_that_includes_it() {
    let redis = RedisServer::start();
    let service = Service::start(&["--redis", &redis.url(), "--near-cache", "1000"]);
    let before = service.orders("2019-05").await.expect("a report");

    let prefer = [("prefer", "return=representation")];
    let response = http_client::send("POST", &service.addr, "/orders/2019-05", &prefer).await;
    assert_eq!(response.status, 201, "{response:?}");
    assert_eq!(response.json()["cache"], "applied");
    assert_eq!(
        response.json()["report"]["orders"],
        before + 1,
        "{response:?}"
    );

    let plain = service.post("/orders/2019-05").await;
    assert_eq!(plain.status, 201, "{plain:?}");
    assert!(plain.json()["report"].is_null(), "{plain:?}");
    assert_eq!(service.orders("2019-05").await, Some(before + 2));
}

/// With Redis down, an order is still a 201 (the row is committed: a client retrying on an
/// error would insert it twice), its invalidation queued; once Redis is back with the old
/// report on disk, the report read includes the order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_made_while_redis_is_down_is_a_201_and_its_invalidation_is_replayed() {
    let mut redis = RedisServer::start();
    let service = Service::start(&["--redis", &redis.url()]);
    let before = service.orders("2019-05").await.expect("a report");
    // The cached report goes to disk, to come back with the server.
    redis::cmd("SAVE").exec(&mut redis.conn()).unwrap();
    redis.kill();

    let response = service.post("/orders/2019-05").await;
    assert_eq!(response.status, 201, "{response:?}");
    assert_eq!(response.header("x-cache-invalidation"), Some("queued"));
    assert_eq!(response.json()["cache"], "queued");

    redis.restart_loading();
    eventually("the report includes the order", || async {
        let orders = service.orders("2019-05").await;
        assert_ne!(orders, Some(before), "the invalidated report was served");
        orders == Some(before + 1)
    })
    .await;
}

/// Polls `condition` every 20 ms until it holds; panics with `what` after 30 s.
async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    while !condition().await {
        assert!(Instant::now() < deadline, "not within 30 s: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
