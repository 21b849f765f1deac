//! The dashboard case: 10 concurrent requests each need all 12 months of a report, and the cache
//! is cold. Each request asks for its year in one `get_or_compute_many` call; the database answers
//! every missing month with one slow query (`WHERE month = ANY($1) GROUP BY month`). Every month
//! is computed once, by one query.
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

/// Every query that ran: the request that ran it, and the months it covered.
type Ledger = Arc<Mutex<Vec<(usize, Vec<String>)>>>;

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
        let _ = cache.invalidate_many((0..MONTHS).map(month)).await?;
    }
    println!(
        "backend: {}; {REQUESTS} concurrent requests × {MONTHS} months, one {QUERY_TIME:?} query for all missing months\n",
        redis.as_deref().map_or("embedded memory store".to_string(), |u| format!("Redis at {}", redact(u)))
    );

    let ledger = Ledger::default();
    let started = Instant::now();
    let mut requests = Vec::new();
    for request in 0..REQUESTS {
        let (cache, ledger) = (cache.clone(), ledger.clone());
        requests.push(tokio::spawn(async move {
            // A dashboard request fetches its 12 months in one call.
            let begun = Instant::now();
            let months: Vec<String> = (0..MONTHS).map(month).collect();
            let report: Vec<u64> = cache
                .get_or_compute_many(&months, TTL, move |missing: Vec<String>| {
                    slow_query(missing, request, ledger.clone())
                })
                .await
                .into_iter()
                .collect::<Result<_, _>>()?;
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
    let mut by_month: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (request, months) in ledger.iter() {
        for month in months {
            by_month.entry(month).or_default().push(*request);
        }
    }
    for (month, by) in &by_month {
        let who: Vec<String> = by.iter().map(|r| format!("#{r}")).collect();
        println!("{month:<9} {:>8}×  {}", by.len(), who.join(", "));
    }
    let queries = ledger.len();
    println!("\n{:<9} {:>9}", "request", "latency");
    latencies.sort();
    for (request, took) in &latencies {
        println!("#{request:<8} {:>6} ms", took.as_millis());
    }
    println!(
        "\n{queries} queries ran for {} month lookups (one query per month and request without the \
         cache: {}); all done in {} ms",
        REQUESTS * MONTHS,
        REQUESTS * MONTHS,
        wall.as_millis()
    );
    Ok(())
}

fn month(i: usize) -> String {
    format!("{}-{:02}", 2019 + i / 12, i % 12 + 1)
}

/// Stands in for the slow aggregate query of the missing months,
/// `SELECT month, SUM(..) FROM orders WHERE month = ANY($1) GROUP BY month`: one query, one
/// total per month.
async fn slow_query(
    months: Vec<String>,
    request: usize,
    ledger: Ledger,
) -> Result<Vec<(String, u64)>, std::io::Error> {
    if let Ok(mut ledger) = ledger.lock() {
        ledger.push((request, months.clone()));
    }
    tokio::time::sleep(QUERY_TIME).await;
    Ok(months
        .into_iter()
        .map(|month| {
            let total = month.bytes().map(u64::from).sum();
            (month, total)
        })
        .collect())
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
