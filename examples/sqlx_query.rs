//! A slow aggregate query under concurrent load, run three ways: plain cache-aside (every caller
//! that misses runs the query), through `get_or_compute` (one caller runs it, the others get its
//! result), and the dashboard's whole year through `get_or_compute_many` (one query for the
//! twelve missing months, `= ANY($1)` on PostgreSQL, `IN (...)` on SQLite). The query count goes
//! from one per caller to one.
//!
//! ```text
//! cargo run --example sqlx_query                                        # SQLite in memory
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!   cargo run --example sqlx_query                                      # PostgreSQL
//! cargo run --example sqlx_query -- --callers 100 --query-ms 300 --json # other sizes; JSON lines
//! ```
//!
//! The database is seeded by the example (table `stampede_guard_sales`, 12 months × 2,000 orders).

mod sales;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sales::{MonthlyReport, SalesDb};
use stampede_guard::Cache;
use tokio::sync::Barrier;

const MONTH: &str = "2019-05";
const TTL: Duration = Duration::from_secs(300);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Args {
    callers: usize,
    query_time: Duration,
    json: bool,
}

/// What one mode did.
struct Run {
    mode: &'static str,
    queries: u64,
    wall: Duration,
    report: MonthlyReport,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = parse_args()?;
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| sales::DEFAULT_DATABASE_URL.into());
    let db = Arc::new(SalesDb::open(&url, args.query_time).await?);
    if !args.json {
        println!(
            "database: {} ({} months × {} orders), one report query takes {:?}",
            db.description(),
            sales::MONTHS,
            sales::ORDERS_PER_MONTH,
            args.query_time
        );
        println!(
            "{} concurrent callers ask for the report of {MONTH} (batch: for the year's {} months \
             in one call), cache cold\n",
            args.callers,
            sales::MONTHS
        );
    }

    let mut runs = Vec::new();
    for mode in ["naive", "guarded", "batch"] {
        // A new cache per mode, so both start cold.
        let run = run(mode, Cache::in_memory(), db.clone(), args.callers).await?;
        if args.json {
            let line = serde_json::json!({
                "mode": run.mode,
                "months": if run.mode == "batch" { sales::MONTHS } else { 1 },
                "callers": args.callers,
                "queries": run.queries,
                "wall_ms": run.wall.as_secs_f64() * 1e3,
                "database": db.description(),
                "report": run.report,
            });
            println!("{line}");
        }
        runs.push(run);
    }
    db.close().await;

    if !args.json {
        println!(
            "{:<8} {:>8} {:>8} {:>9}",
            "mode", "queries", "callers", "wall ms"
        );
        for run in &runs {
            println!(
                "{:<8} {:>8} {:>8} {:>9.0}",
                run.mode,
                run.queries,
                args.callers,
                run.wall.as_secs_f64() * 1e3
            );
        }
        let report = &runs[0].report;
        let same = runs.iter().all(|r| &r.report == report);
        println!(
            "\n{}: {} orders, revenue {:.2}; every caller of both modes got {}",
            report.month,
            report.orders,
            report.revenue_cents as f64 / 100.0,
            if same {
                "the same report"
            } else {
                "DIFFERENT reports"
            }
        );
    }
    Ok(())
}

/// `callers` tasks, released at once, each asking for the month's report.
async fn run(
    mode: &'static str,
    cache: Cache,
    db: Arc<SalesDb>,
    callers: usize,
) -> Result<Run, BoxError> {
    let before = db.queries();
    let start = Arc::new(Barrier::new(callers));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..callers {
        let (cache, db, start) = (cache.clone(), db.clone(), start.clone());
        tasks.spawn(async move {
            start.wait().await;
            match mode {
                "naive" => cache_aside(&cache, db).await,
                "batch" => year(&cache, db).await,
                _ => guarded(&cache, db).await,
            }
        });
    }
    let mut reports = Vec::new();
    while let Some(report) = tasks.join_next().await {
        reports.push(report??);
    }
    let wall = started.elapsed();
    let report = reports.pop().ok_or("no callers")?;
    if reports.iter().any(|r| r != &report) {
        return Err(format!("{mode}: callers got different reports").into());
    }
    Ok(Run {
        mode,
        queries: db.queries() - before,
        wall,
        report,
    })
}

/// Plain cache-aside: look, and on a miss run the query and store its result. Every caller that
/// looks before the first result lands runs the query too: the stampede.
async fn cache_aside(cache: &Cache, db: Arc<SalesDb>) -> Result<MonthlyReport, BoxError> {
    if let Some(report) = cache.get(MONTH).await? {
        return Ok(report);
    }
    let report = db.monthly_report(MONTH).await?;
    let _ = cache.set(MONTH, &report, TTL).await?;
    Ok(report)
}

/// The same through `get_or_compute`: one caller runs the query, the others get its result.
async fn guarded(cache: &Cache, db: Arc<SalesDb>) -> Result<MonthlyReport, BoxError> {
    let report = cache
        .get_or_compute(MONTH, TTL, move || async move {
            db.monthly_report(MONTH).await // Result<MonthlyReport, sqlx::Error>
        })
        .await?;
    Ok(report)
}

/// The dashboard's year through `get_or_compute_many`: one call for the twelve months, and on
/// a cold cache one query for all of them. Returns the report of [`MONTH`] to compare with the
/// other modes (after checking that every month came back).
async fn year(cache: &Cache, db: Arc<SalesDb>) -> Result<MonthlyReport, BoxError> {
    let months: Vec<String> = (0..sales::MONTHS).map(sales::month).collect();
    let reports: Vec<MonthlyReport> = cache
        .get_or_compute_many(&months, TTL, move |missing: Vec<String>| {
            let db = db.clone();
            async move {
                let reports = db.monthly_reports(&missing).await?;
                // Keyed by month: a month the query did not return fails alone.
                Ok::<_, sqlx::Error>(reports.into_iter().map(|r| (r.month.clone(), r)))
            }
        })
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    reports
        .into_iter()
        .find(|r| r.month == MONTH)
        .ok_or_else(|| format!("no report for {MONTH}").into())
}

fn parse_args() -> Result<Args, String> {
    const USAGE: &str = "usage: sqlx_query [--callers N] [--query-ms MS] [--json]";
    let mut args = Args {
        callers: 50,
        query_time: Duration::from_millis(200),
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut number = || -> Result<u64, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{flag} needs a number\n{USAGE}"))
        };
        match flag.as_str() {
            "--callers" => args.callers = number()?.max(1) as usize,
            "--query-ms" => args.query_time = Duration::from_millis(number()?),
            "--json" => args.json = true,
            _ => return Err(USAGE.into()),
        }
    }
    Ok(args)
}
