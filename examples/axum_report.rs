//! An HTTP service: `GET /report/{month}` returns the month's sales report, computed from the
//! database through the cache. However many requests for a cold month arrive at once, the
//! database runs its query once; `GET /report/{year}` returns the year's twelve months through one
//! batch call (one query for every month missing from the cache); `GET /stats` shows how many
//! queries the database ran.
//!
//! The guide's complete service (`docs/service-example.md` walks through it):
//! - `GET /report/...` sits behind `web::ResponseCacheLayer` (feature `tower`): the whole JSON
//!   response is cached, one handler execution per URL fleet-wide, with `x-cache`, `ETag` and
//!   `304`; below it the month's value is cached by `get_or_compute_with`, which the year's
//!   batch shares;
//! - `GET /report/{month}`: `get_or_compute_with`, the query computed once fleet-wide;
//! - `POST /refresh/{month}`: `get` the cached report, query the database, `set` the new one
//!   (a computation of that month still running has its write refused: it read older data);
//! - `POST /orders/{month}`: record an order (commit a row), then `invalidate` the month's
//!   report: `201 Created` once the row is committed, whether the cache applied the invalidation
//!   or queued it while Redis is down (auto-recovery; the `x-cache-invalidation` header and the
//!   `cache` field say which), so a client that retries on an error never inserts twice; with
//!   `Prefer: return=representation` the answer carries the month's report with the order in
//!   it, read past the near tier (`CallOptions::skip_near_cache`): the read-after-write;
//! - `GET /summary`: `get` the year's summary, which a `Leader` job writes: of all the instances
//!   sharing one Redis, only the active one runs it, every `--summary-every-ms`;
//! - `GET /health`: the cache's health report, 200 or 503 (`Health: IntoResponse`); `GET /livez` and
//!   `GET /readyz`, the probes for Kubernetes (`web::probes`);
//! - one shutdown signal (`web::shutdown_signal`, Ctrl-C or SIGTERM) stops the HTTP server and the leader together; the
//!   leader releases its lock at once, so another instance takes over without waiting for the
//!   lease to run out.
//!
//! ```text
//! cargo run --example axum_report --features axum                       # SQLite in memory, embedded cache
//! cargo run --example axum_report --features axum -- --redis redis://127.0.0.1:6379/0
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!   cargo run --example axum_report --features axum                     # PostgreSQL
//!
//! curl -i http://127.0.0.1:3000/report/2019-05
//! curl -i http://127.0.0.1:3000/report/2019
//! curl -i -X POST http://127.0.0.1:3000/orders/2019-05
//! curl -i -X POST -H 'Prefer: return=representation' http://127.0.0.1:3000/orders/2019-05
//! curl http://127.0.0.1:3000/stats
//! ```
//!
//! Options: `--listen ADDR` (default `127.0.0.1:3000`; port 0 picks a free one), `--redis URL`,
//! `--near-cache ENTRIES` (with `--redis`: keep up to this many reports in a near tier),
//! `--query-ms MS` (how long one report query takes, default 200), `--summary-every-ms MS` (the
//! leader job's interval, default 10000). The first line printed is `listening on http://ADDR`.
//!
//! With `--redis`, several instances of this service share one cache: start two on different
//! ports and a month is still computed once across both.

mod sales;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use sales::{MonthlyReport, SalesDb};
use serde::{Deserialize, Serialize};
use stampede_guard::leader::{JobContext, Leader, Role};
use stampede_guard::web::{self, ResponseCacheLayer};
use stampede_guard::{Cache, NearCacheOptions, RecoveryOptions};
use tokio::sync::watch;

/// How long a report stays cached. Past months do not change; an hour keeps memory bounded.
const TTL: Duration = Duration::from_secs(3600);
/// The cache key of the year summary that the leader job writes.
const SUMMARY_KEY: &str = "summary-2019";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What every handler shares: cheap to clone (all are handles).
#[derive(Clone)]
struct App {
    cache: Cache,
    db: Arc<SalesDb>,
    /// This instance's role in the leader election, for `/stats`.
    role: watch::Receiver<Role>,
    /// How many times this instance ran the leader job.
    summary_runs: Arc<AtomicU64>,
    /// The response cache in front of `/report/...`, for the keys of its entries.
    responses: ResponseCacheLayer,
}

/// The year's totals, written by whichever instance is the leader.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Summary {
    orders: i64,
    revenue_cents: i64,
    /// The fencing token of the leader's term that wrote it: a later term writes a higher one.
    written_by_term: u64,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = parse_args()?;
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| sales::DEFAULT_DATABASE_URL.into());
    let db = Arc::new(SalesDb::open(&url, args.query_time).await?);
    let cache = match &args.redis {
        Some(redis) => {
            let builder = Cache::builder()
                .redis_url(redis.as_str())
                .namespace("axum-report-example")
                // An invalidation after a commit that cannot reach Redis waits in this process
                // and is replayed when Redis answers, instead of failing the request.
                .auto_recovery(RecoveryOptions::default());
            match args.near_cache {
                Some(entries) => builder.near_cache(NearCacheOptions::new(entries)),
                None => builder,
            }
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

    // One signal for the whole process: the server and the leader both wait on it.
    let shutdown = web::shutdown_signal();

    // The leader job: only one instance of all those sharing the cache runs it at a time.
    let leader = Leader::new(cache.lock("year-summary")?, args.summary_every);
    let role = leader.status();
    let summary_runs = Arc::new(AtomicU64::new(0));
    let job = {
        let (cache, db, runs, every) = (
            cache.clone(),
            db.clone(),
            summary_runs.clone(),
            args.summary_every,
        );
        move |ctx: JobContext| {
            let (cache, db, runs) = (cache.clone(), db.clone(), runs.clone());
            async move { write_summary(&cache, &db, ctx, every, &runs).await }
        }
    };
    let leader = tokio::spawn(leader.run(job, shutdown.clone()));

    let app = router(App {
        responses: ResponseCacheLayer::new(cache.clone()).ttl(TTL),
        cache,
        db,
        role,
        summary_runs,
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.clone())
        .await?;
    println!("shutdown requested");
    println!("server stopped");
    // The same signal stopped the leader, which released its lock: another instance takes over
    // at once instead of one lease later.
    leader.await??;
    println!("leader stopped");
    Ok(())
}

fn router(app: App) -> Router {
    // Whole responses cached in front of the reports (the month's value is cached below too,
    // for the year's batch).
    let reports = Router::new()
        .route("/report/{month}", get(report))
        .layer(app.responses.clone());
    Router::new()
        .merge(reports)
        .route("/refresh/{month}", post(refresh))
        .route("/orders/{month}", post(add_order))
        .route("/summary", get(summary))
        .route("/stats", get(stats))
        .route(
            "/health",
            get(|State(app): State<App>| async move { app.cache.health().await }),
        )
        // `/livez` (the process runs) and `/readyz` (200 while this instance serves, Redis down
        // or not): docs/health-and-probes.md.
        .merge(web::probes(app.cache.clone()))
        .with_state(app)
}

/// The leader job: the year's totals, computed by one instance and `set` in the cache for all.
/// A run that lost its lease while querying does not write: a newer leader does.
async fn write_summary(
    cache: &Cache,
    db: &SalesDb,
    ctx: JobContext,
    every: Duration,
    runs: &AtomicU64,
) -> Result<(), BoxError> {
    let (orders, revenue_cents) = db.year_totals().await?;
    if ctx.is_cancelled() {
        return Ok(());
    }
    let summary = Summary {
        orders,
        revenue_cents,
        written_by_term: ctx.fencing_token(),
    };
    // Kept for three intervals: if the leader dies, the summary outlives the hand-over.
    let _ = cache
        .set(SUMMARY_KEY, &summary, every.saturating_mul(3))
        .await?;
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
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
    let report = month_report(&app.cache, &app.db, &month).await?;
    Ok(Json(report).into_response())
}

/// The month's report through `cache`, its query run once fleet-wide however many ask at once.
async fn month_report(
    cache: &Cache,
    db: &Arc<SalesDb>,
    month: &str,
) -> Result<MonthlyReport, stampede_guard::Error> {
    // Not `#[stampede_guard::cached]`: requests that wait for another's query would get that
    // query's error as a message, so a database outage (a 503 here) would reach them as a 500.
    // The attribute suits functions whose callers need the error's text, not its kind.
    cache
        .get_or_compute_with(month, TTL, db, |month, db| async move {
            db.monthly_report(&month).await // Result<MonthlyReport, sqlx::Error>
        })
        .await
}

/// The year's twelve monthly reports through one batch call: months in the cache cost no query,
/// the others one query for all of them. A month without orders is a report of zero orders.
async fn year(app: App, year: &str) -> Result<Json<Vec<MonthlyReport>>, AppError> {
    let months: Vec<String> = (1..=12).map(|m| format!("{year}-{m:02}")).collect();
    let reports = (app.cache)
        .get_or_compute_many_with(&months, TTL, &app.db, |missing, db| async move {
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
        })
        .await;
    // All twelve or the first error (each month has its own result, if a handler wants them).
    Ok(Json(reports.into_iter().collect::<Result<_, _>>()?))
}

/// `POST /refresh/2019-05`: query the month again now and replace the cached report, for every
/// instance; answers with the report that was cached before (if any) and the new one.
async fn refresh(
    State(app): State<App>,
    Path(month): Path<String>,
) -> Result<Json<serde_json::Value>, AppError> {
    if !sales::is_month(&month) {
        return Err(AppError::BadMonth(month));
    }
    let before: Option<MonthlyReport> = app.cache.get(&month).await?;
    let after = app.db.monthly_report(&month).await?;
    // A `get_or_compute` of this month still running read the database before this query: its
    // write is refused (fencing), so it cannot put the older report back over this one.
    let _ = app.cache.set(&month, &after, TTL).await?;
    // The whole responses that hold the month: computed again, from the new value, on next use.
    let _ = app
        .cache
        .invalidate_many(responses_of(&app, &month))
        .await?;
    Ok(Json(
        serde_json::json!({ "before": before, "after": after }),
    ))
}

/// `POST /orders/2019-05`: records an order of the month, then invalidates the month's report.
///
/// The row is committed before the cache is touched, so whatever happens to the invalidation the
/// answer is `201 Created`: a client that retried on an error would insert the order twice. The
/// invalidation is `applied`, or `queued` (Redis unreachable: replayed within about a second of
/// its return, and this instance does not serve the month from Redis meanwhile); if it could not
/// even be queued (`failed`: the queue is full, or Redis refused), the report's TTL bounds how
/// long the old one is served, and the log says why.
///
/// With `Prefer: return=representation` (RFC 7240) the answer's `report` is the month's report
/// with the order in it (`null` unless the invalidation was applied: a report read while Redis
/// is down could not be trusted to include it).
async fn add_order(
    State(app): State<App>,
    Path(month): Path<String>,
    headers: HeaderMap,
) -> Result<Response, AppError> {
    if !sales::is_month(&month) {
        return Err(AppError::BadMonth(month));
    }
    let id = app.db.add_order(&month, 1_000).await?;
    // The month's value, and the whole responses that hold it (the month's and the year's).
    let mut keys = responses_of(&app, &month);
    keys.push(month.clone());
    let cache = match app.cache.invalidate_many(&keys).await {
        Ok(written) => written.as_str(),
        Err(e) => {
            eprintln!("order {id} committed; invalidating report {month} failed: {e}");
            "failed"
        }
    };
    let report = match cache {
        "applied" if wants_representation(&headers) => {
            // The read-after-write. Whichever instance serves it, a read that must see a write
            // skips the near tier: this instance dropped its own copy as it invalidated, but
            // another instance's copy is served until the change reaches it (the cross-instance
            // window: docs/after-commit.md). The order is committed, so a failed read leaves the
            // report out rather than failing the request.
            let latest =
                (app.cache).with_options(app.cache.options().clone().skip_near_cache(true));
            match month_report(&latest, &app.db, &month).await {
                Ok(report) => Some(report),
                Err(e) => {
                    eprintln!("order {id} committed; reading report {month} failed: {e}");
                    None
                }
            }
        }
        _ => None,
    };
    let body = serde_json::json!({ "id": id, "month": month, "cache": cache, "report": report });
    Ok((
        StatusCode::CREATED,
        [("x-cache-invalidation", cache)],
        Json(body),
    )
        .into_response())
}

/// Whether the request asks for the written resource in the answer (`Prefer:
/// return=representation`, RFC 7240).
fn wants_representation(headers: &HeaderMap) -> bool {
    (headers.get_all("prefer").iter())
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|preference| {
            preference
                .trim()
                .eq_ignore_ascii_case("return=representation")
        })
}

/// The response cache's keys for the month's and its year's reports.
fn responses_of(app: &App, month: &str) -> Vec<String> {
    let year = &month[..4];
    [format!("/report/{month}"), format!("/report/{year}")]
        .iter()
        .map(|path| app.responses.key(path, None))
        .collect()
}

/// `GET /summary`: the year's totals, as the leader job last wrote them.
async fn summary(State(app): State<App>) -> Result<Json<Summary>, AppError> {
    match app.cache.get::<Summary>(SUMMARY_KEY).await? {
        Some(summary) => Ok(Json(summary)),
        None => Err(AppError::NoSummaryYet),
    }
}

/// `GET /stats`: how many report queries the database ran, in all and per month, what the
/// cache did (hits, misses, waits, ...), and this instance's part in the leader election.
async fn stats(State(app): State<App>) -> Json<serde_json::Value> {
    let role: Role = *app.role.borrow();
    Json(serde_json::json!({
        "queries": app.db.queries(),
        "queries_by_month": app.db.queries_by_month(),
        "cache": app.cache.stats(),
        "leader": { "role": role, "summary_runs": app.summary_runs.load(Ordering::SeqCst) },
    }))
}

/// The handlers' errors: their own (a path that is no month, no summary yet), the database's and
/// the cache's.
enum AppError {
    BadMonth(String),
    NoSummaryYet,
    Db(sqlx::Error),
    Cache(stampede_guard::Error),
}

/// `?` on a database call turns its error into an `AppError`.
impl From<sqlx::Error> for AppError {
    fn from(e: sqlx::Error) -> Self {
        AppError::Db(e)
    }
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
            AppError::NoSummaryYet => (
                StatusCode::SERVICE_UNAVAILABLE,
                [("retry-after", "1")],
                "the summary is not computed yet; try again shortly",
            )
                .into_response(),
            AppError::Db(e) => {
                eprintln!("database error: {e}");
                (StatusCode::INTERNAL_SERVER_ERROR, "database error").into_response()
            }
            // The crate's mapping (feature `axum`): 503 + Retry-After when Redis is down or the
            // wait timed out, 500 when the query failed; details go to the log, not the client.
            AppError::Cache(e) => e.into_response(),
        }
    }
}

struct Args {
    listen: String,
    redis: Option<String>,
    near_cache: Option<u64>,
    query_time: Duration,
    summary_every: Duration,
}

fn parse_args() -> Result<Args, String> {
    const USAGE: &str =
        "usage: axum_report [--listen 127.0.0.1:3000] [--redis redis://host:port/db] [--near-cache ENTRIES] [--query-ms MS] [--summary-every-ms MS]";
    let mut args = Args {
        listen: "127.0.0.1:3000".to_owned(),
        redis: None,
        near_cache: None,
        query_time: Duration::from_millis(200),
        summary_every: Duration::from_secs(10),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--listen" => args.listen = value,
            "--redis" => args.redis = Some(value),
            "--near-cache" => {
                let entries = value
                    .parse()
                    .map_err(|_| format!("--near-cache needs a number\n{USAGE}"))?;
                args.near_cache = Some(entries);
            }
            "--query-ms" => {
                let ms = value
                    .parse()
                    .map_err(|_| format!("--query-ms needs a number\n{USAGE}"))?;
                args.query_time = Duration::from_millis(ms);
            }
            "--summary-every-ms" => {
                let ms = value
                    .parse()
                    .map_err(|_| format!("--summary-every-ms needs a number\n{USAGE}"))?;
                args.summary_every = Duration::from_millis(ms);
            }
            _ => return Err(USAGE.to_owned()),
        }
    }
    Ok(args)
}
