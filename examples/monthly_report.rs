//! The dashboard case: 10 concurrent requests each need all 12 months of a report, each month is
//! one slow query, and the cache is cold. Every month is computed once.
//!
//! ```text
//! cargo run --example monthly_report                                  # embedded memory store
//! cargo run --example monthly_report -- --redis redis://127.0.0.1/0   # shared Redis
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stampede_guard::Cache;

const MONTHS: usize = 12;
const REQUESTS: usize = 10;
const QUERY_TIME: Duration = Duration::from_millis(300);
const TTL: Duration = Duration::from_secs(300);

/// Which request computed each month, and how many times.
type Ledger = Arc<Mutex<BTreeMap<String, Vec<usize>>>>;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redis = parse_args()?;
    let cache = match &redis {
        Some(url) => {
            Cache::builder()
                .redis_url(url.as_str())
                .namespace("monthly-report-example")
                .build()
                .await?
        }
        None => Cache::in_memory(),
    };
    if redis.is_some() {
        // Start cold, as the example promises (only this example's namespace is touched).
        for m in 0..MONTHS {
            cache.invalidate(&month(m)).await?;
        }
    }
    println!(
        "backend: {}; {REQUESTS} concurrent requests × {MONTHS} months, each month one {QUERY_TIME:?} query\n",
        redis.as_deref().map_or("embedded memory store".to_string(), |u| format!("Redis at {}", redact(u)))
    );

    let ledger = Ledger::default();
    let started = Instant::now();
    let mut requests = Vec::new();
    for request in 0..REQUESTS {
        let (cache, ledger) = (cache.clone(), ledger.clone());
        requests.push(tokio::spawn(async move {
            // A dashboard request fetches its 12 months at once.
            let begun = Instant::now();
            let mut months = tokio::task::JoinSet::new();
            for m in 0..MONTHS {
                let (cache, ledger, month) = (cache.clone(), ledger.clone(), month(m));
                months.spawn(async move {
                    let query_month = month.clone();
                    cache
                        .get_or_compute(&month, TTL, move || {
                            slow_query(query_month, request, ledger)
                        })
                        .await
                });
            }
            let mut report: Vec<u64> = Vec::new();
            while let Some(total) = months.join_next().await {
                report.push(total.map_err(std::io::Error::other)??);
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((request, report, begun.elapsed()))
        }));
    }
    let mut latencies = Vec::new();
    for r in requests {
        let (request, report, took) = r.await?.map_err(|e| e.to_string())?;
        assert_eq!(report.len(), MONTHS);
        latencies.push((request, took));
    }
    let wall = started.elapsed();

    println!("{:<9} {:>9}  by request", "month", "computed");
    let ledger = ledger.lock().map_err(|_| "ledger poisoned")?;
    let mut queries = 0;
    for (month, by) in ledger.iter() {
        queries += by.len();
        let who: Vec<String> = by.iter().map(|r| format!("#{r}")).collect();
        println!("{month:<9} {:>8}×  {}", by.len(), who.join(", "));
    }
    println!("\n{:<9} {:>9}", "request", "latency");
    latencies.sort();
    for (request, took) in &latencies {
        println!("#{request:<8} {:>6} ms", took.as_millis());
    }
    println!(
        "\n{queries} queries for {} month lookups (plain cache-aside: up to {}); all done in {} ms",
        REQUESTS * MONTHS,
        REQUESTS * MONTHS,
        wall.as_millis()
    );
    Ok(())
}

fn month(i: usize) -> String {
    format!("{}-{:02}", 2019 + i / 12, i % 12 + 1)
}

/// Stands in for the slow aggregate query of one month.
async fn slow_query(month: String, request: usize, ledger: Ledger) -> Result<u64, std::io::Error> {
    if let Ok(mut ledger) = ledger.lock() {
        ledger.entry(month.clone()).or_default().push(request);
    }
    tokio::time::sleep(QUERY_TIME).await;
    Ok(month.bytes().map(u64::from).sum())
}

fn parse_args() -> Result<Option<String>, String> {
    let mut args = std::env::args().skip(1);
    match (args.next().as_deref(), args.next()) {
        (None, _) => Ok(None),
        (Some("--redis"), Some(url)) => Ok(Some(url)),
        _ => Err("usage: monthly_report [--redis redis://host:port/db]".into()),
    }
}

/// The URL without its password, for printing.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}
