//! The response cache across a fleet: two instances of a service (each its own `Cache`, with
//! its own Redis connections, and its own axum server on a loopback socket) share one
//! redis-server this bench starts. Each round sends 1,000 concurrent cold `GET`s of 10 URLs,
//! spread round-robin over the two instances, each on its own connection; the handler takes
//! 100 ms. Prints the handler executions per URL (target 1.00) and the requests' latency
//! percentiles against the handler's own time.
//!
//! A custom harness (`harness = false`): `cargo bench --features tower --bench web_fleet`.

#[path = "../tests/http_client/mod.rs"]
mod http_client;
#[path = "../tests/support"]
/// The shared helpers this file uses, one module each (tests/support/).
mod support {
    pub mod percentile;
    pub mod server;
    pub use {percentile::*, server::*};
}

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::routing::get;
use axum::Router;
use stampede_guard::web::ResponseCacheLayer;
use stampede_guard::Cache;
use support::RedisServer;

const ROUNDS: usize = 5;
const REQUESTS: usize = 1_000;
const URLS: usize = 10;
const HANDLER_TIME: Duration = Duration::from_millis(100);

/// Handler executions per URL, over both instances.
type Runs = Arc<Mutex<HashMap<String, usize>>>;

/// Each request's time inside the server (from the layer's call to its response), apart from
/// the client's (which adds connecting and the accept loop).
static IN_SERVER: Mutex<Vec<Duration>> = Mutex::new(Vec::new());

async fn timed(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let started = Instant::now();
    let response = next.run(request).await;
    IN_SERVER.lock().unwrap().push(started.elapsed());
    response
}

async fn report(State(runs): State<Runs>, Path(id): Path<String>) -> String {
    *runs.lock().unwrap().entry(id.clone()).or_default() += 1;
    tokio::time::sleep(HANDLER_TIME).await;
    format!("report {id}")
}

/// One instance: its own cache (own connections) on `url`, its own server; returns its address.
async fn instance(url: &str, runs: &Runs) -> String {
    let cache = Cache::builder()
        .redis_url(url)
        .namespace("web-fleet")
        .build()
        .await
        .expect("the bench's redis-server");
    let app = Router::new()
        .route("/report/{id}", get(report))
        .layer(ResponseCacheLayer::new(cache))
        .layer(axum::middleware::from_fn(timed))
        .with_state(runs.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

#[tokio::main]
async fn main() {
    let redis = RedisServer::start();
    let runs: Runs = Arc::default();
    let instances = [
        instance(&redis.url(), &runs).await,
        instance(&redis.url(), &runs).await,
    ];
    let mut latencies = Vec::with_capacity(ROUNDS * REQUESTS);
    let mut words: HashMap<String, usize> = HashMap::new();
    for round in 0..ROUNDS {
        let mut requests = tokio::task::JoinSet::new();
        for i in 0..REQUESTS {
            let addr = instances[i % 2].clone();
            let path = format!("/report/{round}-{}", i % URLS);
            requests.spawn(async move {
                let started = Instant::now();
                let response = http_client::get(&addr, &path).await;
                (started.elapsed(), response)
            });
        }
        for (took, response) in requests.join_all().await {
            assert_eq!(response.status, 200, "{response:?}");
            let word = response.header("x-cache").unwrap_or("none").to_owned();
            *words.entry(word).or_default() += 1;
            latencies.push(took);
        }
    }
    latencies.sort();
    let runs = runs.lock().unwrap();
    let per_url: Vec<usize> = runs.values().copied().collect();
    let executions: usize = per_url.iter().sum();
    println!(
        "{ROUNDS} rounds x {REQUESTS} concurrent cold GETs of {URLS} URLs over 2 instances \
         (handler {} ms)",
        HANDLER_TIME.as_millis()
    );
    println!(
        "handler executions per URL: {:.2} (min {}, max {}, over {} URLs)",
        executions as f64 / per_url.len() as f64,
        per_url.iter().min().unwrap_or(&0),
        per_url.iter().max().unwrap_or(&0),
        per_url.len()
    );
    let mut words: Vec<_> = words.into_iter().collect();
    words.sort();
    println!("x-cache: {words:?}");
    let handler = HANDLER_TIME.as_secs_f64() * 1000.0;
    let mut in_server = IN_SERVER.lock().unwrap().clone();
    in_server.sort();
    for (what, samples) in [
        ("client (connect + request)", &latencies),
        ("in the server", &in_server),
    ] {
        let ms = |p| support::percentile_ms(samples, p);
        println!(
            "latency ms, {what}: p50 {:.1}, p90 {:.1}, p99 {:.1}, max {:.1}; p99 / handler time = {:.2}",
            ms(50.0),
            ms(90.0),
            ms(99.0),
            ms(100.0),
            ms(99.0) / handler
        );
    }
}
