// The items that the blocks of docs/service-example.md use without showing them, as
// examples/axum_report.rs has them (its database stubbed), so that each block compiles as a doc
// test (src/lib.rs, module `guide`). A block's hidden first line includes this module and
// glob-imports it: an item the block defines itself shadows the one of the same name here.
#[allow(dead_code, unused_imports)]
mod service {
    pub use std::collections::HashMap;
    pub use std::sync::atomic::{AtomicU64, Ordering};
    pub use std::sync::Arc;
    pub use std::time::Duration;

    pub use axum::extract::{Path, State};
    pub use axum::http::StatusCode;
    pub use axum::response::{IntoResponse, Response};
    pub use axum::Json;
    pub use stampede_guard::leader::{JobContext, Leader, Role};
    pub use stampede_guard::Cache;
    pub use tokio::sync::watch;

    pub const TTL: Duration = Duration::from_secs(3600);
    pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

    #[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
    pub struct MonthlyReport {
        pub month: String,
        pub orders: i64,
        pub revenue_cents: i64,
        pub regions: Vec<(String, i64, i64)>,
    }

    impl MonthlyReport {
        pub fn from_rows(regions: Vec<(String, i64, i64)>) -> Self {
            let orders = regions.iter().map(|r| r.1).sum();
            let revenue_cents = regions.iter().map(|r| r.2).sum();
            MonthlyReport { month: String::new(), orders, revenue_cents, regions }
        }
    }

    pub struct SalesDb;

    impl SalesDb {
        pub async fn monthly_report(&self, month: &str) -> Result<MonthlyReport, sqlx::Error> {
            Ok(MonthlyReport::from_rows(vec![(month.to_owned(), 0, 0)]))
        }
        pub async fn monthly_reports(&self, _: &[String]) -> Result<Vec<MonthlyReport>, sqlx::Error> {
            Ok(Vec::new())
        }
    }

    pub mod sales {
        pub fn is_month(s: &str) -> bool {
            s.len() == 7
        }
    }

    #[derive(Clone)]
    pub struct App {
        pub cache: Cache,
        pub db: Arc<SalesDb>,
        pub role: watch::Receiver<Role>,
        pub summary_runs: Arc<AtomicU64>,
    }

    pub enum AppError {
        BadMonth(String),
        Db(sqlx::Error),
        Cache(stampede_guard::Error),
    }

    impl From<sqlx::Error> for AppError {
        fn from(e: sqlx::Error) -> Self {
            AppError::Db(e)
        }
    }

    impl From<stampede_guard::Error> for AppError {
        fn from(e: stampede_guard::Error) -> Self {
            AppError::Cache(e)
        }
    }

    impl IntoResponse for AppError {
        fn into_response(self) -> Response {
            match self {
                AppError::BadMonth(_) => StatusCode::BAD_REQUEST.into_response(),
                AppError::Db(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                AppError::Cache(e) => e.into_response(),
            }
        }
    }

    pub async fn year(_: App, _: &str) -> Result<Json<Vec<MonthlyReport>>, AppError> {
        Ok(Json(Vec::new()))
    }

    pub async fn write_summary(
        _: &Cache,
        _: &SalesDb,
        _: JobContext,
        _: Duration,
        _: &AtomicU64,
    ) -> Result<(), stampede_guard::Error> {
        Ok(())
    }

    pub struct Args {
        pub summary_every: Duration,
    }
}
