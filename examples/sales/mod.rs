//! The database behind the `sqlx_query` and `axum_report` examples: a table of orders seeded with
//! the same rows on every run, and the slow aggregate query that builds one month's report (or,
//! for a batch, every missing month's in one query).
//!
//! SQLite in memory by default, so the examples run with no set-up; `DATABASE_URL` picks another
//! database (`postgres://user@host/db`, or `sqlite:///tmp/sales.db?mode=rwc` for a file). Both go
//! through sqlx's `Any` driver, so there is one pool type and one query for both, written with
//! `$1` placeholders, which SQLite and PostgreSQL both accept.
#![allow(dead_code)] // each example uses a different part of this module

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::any::AnyPoolOptions;
use sqlx::AnyPool;

/// The table the examples own. A name of its own so that pointing `DATABASE_URL` at a real
/// database never touches a table of yours.
const TABLE: &str = "stampede_guard_sales";
/// Seeded months: 2019-01 … 2019-12.
pub const MONTHS: usize = 12;
/// Orders seeded per month.
pub const ORDERS_PER_MONTH: i64 = 2_000;

/// A named in-memory SQLite database shared by every connection of the pool. (`sqlite::memory:`
/// would not do through the `Any` driver: it parses the URL per connection, so each connection
/// would get a fresh, empty database.)
pub const DEFAULT_DATABASE_URL: &str = "sqlite:file:stampede-guard-sales?mode=memory&cache=shared";

/// One month's report, as the dashboard shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MonthlyReport {
    pub month: String,
    pub orders: i64,
    pub revenue_cents: i64,
    pub regions: Vec<RegionTotal>,
}

/// One region's share of a month.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionTotal {
    pub region: String,
    pub orders: i64,
    pub revenue_cents: i64,
}

/// The orders database and a count of the report queries run against it.
pub struct SalesDb {
    pool: AnyPool,
    /// What the database is, for printing (no password).
    description: String,
    /// How long one report query takes in all: see [`SalesDb::monthly_report`].
    query_time: Duration,
    /// Every report query run, per month: the figure the examples are about.
    queries: Mutex<BTreeMap<String, u64>>,
    /// PostgreSQL (a list is bound as one parameter), else SQLite (one placeholder per item).
    postgres: bool,
    total: AtomicU64,
}

/// `2019-01` for 0, … `2019-12` for 11.
pub fn month(i: usize) -> String {
    format!("{}-{:02}", 2019 + i / 12, i % 12 + 1)
}

/// Whether `s` looks like a month, `YYYY-MM`.
pub fn is_month(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 7
        && b[4] == b'-'
        && b[..4].iter().chain(&b[5..]).all(u8::is_ascii_digit)
        && matches!(s[5..].parse::<u8>(), Ok(1..=12))
}

impl SalesDb {
    /// Connects to `url` (a SQLite or PostgreSQL URL), creates the table if it is missing and
    /// seeds it. Seeding is idempotent (fixed ids, `ON CONFLICT DO NOTHING`), so runs against a
    /// persistent database see the same rows every time.
    pub async fn open(url: &str, query_time: Duration) -> Result<Self, sqlx::Error> {
        sqlx::any::install_default_drivers();
        let pool = AnyPoolOptions::new()
            .max_connections(8)
            // A shared in-memory SQLite database lives only while a connection to it is open.
            .min_connections(1)
            .connect(url)
            .await?;
        let db = SalesDb {
            pool,
            description: describe(url),
            postgres: url.starts_with("postgres"),
            query_time,
            queries: Mutex::default(),
            total: AtomicU64::new(0),
        };
        db.seed().await?;
        Ok(db)
    }

    async fn seed(&self) -> Result<(), sqlx::Error> {
        // INTEGER, not BIGINT: PostgreSQL sums a BIGINT column into NUMERIC, an INTEGER one into
        // BIGINT, which is the i64 that both databases hand back.
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS {TABLE} (
                 id INTEGER PRIMARY KEY,
                 month TEXT NOT NULL,
                 region TEXT NOT NULL,
                 amount_cents INTEGER NOT NULL
             )"
        ))
        .execute(&self.pool)
        .await?;
        for m in 0..MONTHS {
            // One statement per month: a counter from a recursive CTE makes the month's orders,
            // with amounts from a fixed arithmetic scramble (the same on both databases).
            // `WHERE true` keeps SQLite from reading `ON CONFLICT` as a join constraint.
            sqlx::query(&format!(
                "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < $3 - 1)
                 INSERT INTO {TABLE} (id, month, region, amount_cents)
                 SELECT $1 * $3 + i, $2,
                        CASE i % 4 WHEN 0 THEN 'north' WHEN 1 THEN 'east'
                                   WHEN 2 THEN 'south' ELSE 'west' END,
                        500 + (i * 7919 + $1 * 104729) % 20000
                 FROM n WHERE true
                 ON CONFLICT (id) DO NOTHING"
            ))
            .bind(m as i64)
            .bind(month(m))
            .bind(ORDERS_PER_MONTH)
            .execute(&self.pool)
            .await?;
        }
        Ok(())
    }

    /// The slow aggregate query: one month's orders and revenue, per region.
    ///
    /// The seeded table is small, so the query itself takes milliseconds. A production database
    /// under load takes longer: the example holds the connection for `query_time` in all, as a
    /// slow query holds it, so concurrent callers overlap and queue for the pool's 8 connections.
    pub async fn monthly_report(&self, month: &str) -> Result<MonthlyReport, sqlx::Error> {
        self.total.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut queries) = self.queries.lock() {
            *queries.entry(month.to_owned()).or_default() += 1;
        }
        let mut conn = self.pool.acquire().await?;
        let started = tokio::time::Instant::now();
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(&format!(
            "SELECT region, COUNT(*), SUM(amount_cents)
             FROM {TABLE} WHERE month = $1
             GROUP BY region ORDER BY region"
        ))
        .bind(month)
        .fetch_all(&mut *conn)
        .await?;
        tokio::time::sleep_until(started + self.query_time).await;
        drop(conn);

        let regions: Vec<RegionTotal> = rows
            .into_iter()
            .map(|(region, orders, revenue_cents)| RegionTotal {
                region,
                orders,
                revenue_cents,
            })
            .collect();
        Ok(MonthlyReport {
            month: month.to_owned(),
            orders: regions.iter().map(|r| r.orders).sum(),
            revenue_cents: regions.iter().map(|r| r.revenue_cents).sum(),
            regions,
        })
    }

    /// The batch form of [`monthly_report`](Self::monthly_report): the reports of all of
    /// `months` from **one** query (`GROUP BY month, region`), holding the connection for
    /// `query_time` once. PostgreSQL: `WHERE month = ANY(...)` (the `Any` driver binds no arrays,
    /// so the list travels as one text parameter, split by `string_to_array`); SQLite:
    /// `WHERE month IN ($1, $2, ...)`. A month without orders has no report in the answer.
    pub async fn monthly_reports(
        &self,
        months: &[String],
    ) -> Result<Vec<MonthlyReport>, sqlx::Error> {
        self.total.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut queries) = self.queries.lock() {
            for month in months {
                *queries.entry(month.clone()).or_default() += 1;
            }
        }
        let mut conn = self.pool.acquire().await?;
        let started = tokio::time::Instant::now();
        let select = "SELECT month, region, COUNT(*), SUM(amount_cents)";
        let group = "GROUP BY month, region ORDER BY month, region";
        let rows: Vec<(String, String, i64, i64)> = if self.postgres {
            sqlx::query_as(&format!(
                "{select} FROM {TABLE} WHERE month = ANY(string_to_array($1, ',')) {group}"
            ))
            .bind(months.join(","))
            .fetch_all(&mut *conn)
            .await?
        } else {
            let placeholders: Vec<String> = (1..=months.len()).map(|i| format!("${i}")).collect();
            let sql = format!(
                "{select} FROM {TABLE} WHERE month IN ({}) {group}",
                placeholders.join(", ")
            );
            let mut query = sqlx::query_as(&sql);
            for month in months {
                query = query.bind(month.as_str());
            }
            query.fetch_all(&mut *conn).await?
        };
        tokio::time::sleep_until(started + self.query_time).await;
        drop(conn);

        let mut reports: Vec<MonthlyReport> = Vec::new();
        for (month, region, orders, revenue_cents) in rows {
            if reports.last().is_none_or(|r| r.month != month) {
                reports.push(MonthlyReport {
                    month: month.clone(),
                    orders: 0,
                    revenue_cents: 0,
                    regions: Vec::new(),
                });
            }
            if let Some(report) = reports.last_mut() {
                report.orders += orders;
                report.revenue_cents += revenue_cents;
                report.regions.push(RegionTotal {
                    region,
                    orders,
                    revenue_cents,
                });
            }
        }
        Ok(reports)
    }

    /// Report queries run so far.
    pub fn queries(&self) -> u64 {
        self.total.load(Ordering::SeqCst)
    }

    /// Report queries run so far, per month.
    pub fn queries_by_month(&self) -> BTreeMap<String, u64> {
        self.queries.lock().map(|q| q.clone()).unwrap_or_default()
    }

    /// Which database this is, without its password.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// Closes the pool's connections.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Records one order of `amount_cents` in `month` (region `north`) and commits it; returns
    /// its id. Not a report query, so not counted in [`SalesDb::queries`].
    pub async fn add_order(&self, month: &str, amount_cents: i64) -> Result<i64, sqlx::Error> {
        // One statement, so the id and the row commit together (two concurrent inserts may
        // pick the same id on PostgreSQL: one then fails; fine for an example).
        let (id,): (i64,) = sqlx::query_as(&format!(
            "INSERT INTO {TABLE} (id, month, region, amount_cents)
             SELECT COALESCE(MAX(id), 0) + 1, $1, 'north', $2 FROM {TABLE}
             RETURNING id"
        ))
        .bind(month)
        .bind(amount_cents)
        .fetch_one(&self.pool)
        .await?;
        Ok(id)
    }

    /// Every seeded month's orders and revenue in one aggregate: the year summary that the
    /// `axum_report` example's leader job writes into the cache. Not a report query, so not
    /// counted in [`SalesDb::queries`].
    pub async fn year_totals(&self) -> Result<(i64, i64), sqlx::Error> {
        sqlx::query_as(&format!(
            "SELECT COUNT(*), COALESCE(SUM(amount_cents), 0) FROM {TABLE}"
        ))
        .fetch_one(&self.pool)
        .await
    }
}

fn describe(url: &str) -> String {
    if url == DEFAULT_DATABASE_URL {
        return "SQLite in memory".to_owned();
    }
    let kind = if url.starts_with("sqlite:") {
        "SQLite"
    } else if url.starts_with("postgres") {
        "PostgreSQL"
    } else {
        "database"
    };
    format!("{kind} at {}", redact(url))
}

/// The URL without its password, for printing.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let user_end = url[scheme + 3..at]
                .find(':')
                .map_or(at, |colon| scheme + 3 + colon);
            if user_end == at {
                url.to_owned()
            } else {
                format!("{}:***{}", &url[..user_end], &url[at..])
            }
        }
        _ => url.to_owned(),
    }
}
