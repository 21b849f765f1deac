//! An HTTP service: `GET /report/{month}` returns the month's sales report, computed from the
//! database through the cache. However many requests for a cold month arrive at once, the
//! database runs its query once; `GET /report/{year}` returns the year's twelve months through one
//! batch call (one query for every month missing from the cache); `GET /stats` shows how many
//! queries the database ran.
//!
//! ```text
//! cargo run --example axum_report --features axum                       # SQLite in memory, embedded cache
//! cargo run --example axum_report --features axum -- --redis redis://127.0.0.1:6379/0
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!   cargo run --example axum_report --features axum                     # PostgreSQL
//!
//! curl -i http://127.0.0.1:3000/report/2019-05
//! curl -i http://127.0.0.1:3000/report/2019
//! curl http://127.0.0.1:3000/stats
//! ```
//!
//! Options: `--listen ADDR` (default `127.0.0.1:3000`; port 0 picks a free one), `--redis URL`,
//! `--query-ms MS` (how long one report query takes, default 200). The first line printed is
//! `listening on http://ADDR`.
//!
//! With `--redis`, several instances of this service share one cache: start two on different
//! ports and a month is still computed once across both.

mod sales;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use sales::{MonthlyReport, SalesDb};
use stampede_guard::Cache;

/// How long a report stays cached. Past months do not change; an hour keeps memory bounded.
const TTL: Duration = Duration::from_secs(3600);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What every handler shares: cheap to clone (both are handles).
#[derive(Clone)]
struct App {
    cache: Cache,
    db: Arc<SalesDb>,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = parse_args()?;
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| sales::DEFAULT_DATABASE_URL.into());
    let db = Arc::new(SalesDb::open(&url, args.query_time).await?);
    let cache = match &args.redis {
        Some(redis) => {
            Cache::builder()
                .redis_url(redis.as_str())
                .namespace("axum-report-example")
                .build()
                .await?
        }
        None => Cache::in_memory(),
    };

    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    // The first line says where to connect; a test that starts this with port 0 reads it.
    println!("listening on http://{}", listener.local_addr()?);
    println!(
        "database: {}; cache: {}",
        db.description(),
        args.redis
            .as_deref()
            .map_or("embedded memory store".to_owned(), |u| format!(
                "Redis at {}",
                sales::redact(u)
            ))
    );
    let app = router(App { cache, db });
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

fn router(app: App) -> Router {
    Router::new()
        .route("/report/{month}", get(report))
        .route("/stats", get(stats))
        .with_state(app)
}

/// `GET /report/2019-05`: the month's report, computed once however many requests ask at once.
/// `GET /report/2019`: the year's (see [`year`]).
async fn report(State(app): State<App>, Path(month): Path<String>) -> Result<Response, AppError> {
    if month.len() == 4 && month.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(year(app, &month).await?.into_response());
    }
    if !sales::is_month(&month) {
        return Err(AppError::BadMonth(month));
    }
    let db = app.db.clone();
    let key = month.clone();
    let report = app
        .cache
        .get_or_compute(&key, TTL, move || async move {
            db.monthly_report(&month).await // Result<MonthlyReport, sqlx::Error>
        })
        .await?;
    Ok(Json(report).into_response())
}

/// The year's twelve monthly reports through one batch call: months in the cache cost no query,
/// the others one query for all of them. A month without orders is a report of zero orders.
async fn year(app: App, year: &str) -> Result<Json<Vec<MonthlyReport>>, AppError> {
    let months: Vec<String> = (1..=12).map(|m| format!("{year}-{m:02}")).collect();
    let db = app.db.clone();
    let reports = app
        .cache
        .get_or_compute_many(&months, TTL, move |missing: Vec<String>| {
            let db = db.clone();
            async move {
                let mut found: std::collections::HashMap<String, MonthlyReport> = db
                    .monthly_reports(&missing)
                    .await?
                    .into_iter()
                    .map(|r| (r.month.clone(), r))
                    .collect();
                let zero = |month: String| MonthlyReport {
                    month,
                    orders: 0,
                    revenue_cents: 0,
                    regions: Vec::new(),
                };
                Ok::<_, sqlx::Error>(
                    missing
                        .into_iter()
                        .map(|m| (m.clone(), found.remove(&m).unwrap_or_else(|| zero(m))))
                        .collect::<Vec<_>>(),
                )
            }
        })
        .await;
    // All twelve or the first error (each month has its own result, if a handler wants them).
    Ok(Json(reports.into_iter().collect::<Result<_, _>>()?))
}

/// `GET /stats`: how many report queries the database ran, in all and per month, and what the
/// cache did (hits, misses, waits, ...).
async fn stats(State(app): State<App>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "queries": app.db.queries(),
        "queries_by_month": app.db.queries_by_month(),
        "cache": app.cache.stats(),
    }))
}

/// The handler's errors: its own (a path that is no month) and the cache's.
enum AppError {
    BadMonth(String),
    Cache(stampede_guard::Error),
}

/// `?` on a cache call turns its error into an `AppError`.
impl From<stampede_guard::Error> for AppError {
    fn from(e: stampede_guard::Error) -> Self {
        AppError::Cache(e)
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        match self {
            AppError::BadMonth(month) => (
                StatusCode::BAD_REQUEST,
                format!("not a month: {month:?} (expected YYYY-MM, e.g. 2019-05, or a year)"),
            )
                .into_response(),
            // The crate's mapping (feature `axum`): 503 + Retry-After when Redis is down or the
            // wait timed out, 500 when the query failed; details go to the log, not the client.
            AppError::Cache(e) => e.into_response(),
        }
    }
}

struct Args {
    listen: String,
    redis: Option<String>,
    query_time: Duration,
}

fn parse_args() -> Result<Args, String> {
    const USAGE: &str =
        "usage: axum_report [--listen 127.0.0.1:3000] [--redis redis://host:port/db] [--query-ms MS]";
    let mut args = Args {
        listen: "127.0.0.1:3000".to_owned(),
        redis: None,
        query_time: Duration::from_millis(200),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--listen" => args.listen = value,
            "--redis" => args.redis = Some(value),
            "--query-ms" => {
                let ms = value
                    .parse()
                    .map_err(|_| format!("--query-ms needs a number\n{USAGE}"))?;
                args.query_time = Duration::from_millis(ms);
            }
            _ => return Err(USAGE.to_owned()),
        }
    }
    Ok(args)
}
