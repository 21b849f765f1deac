//! Runs the `sqlx_query` example (built by `cargo test`) and checks what it reports: under 50
//! concurrent callers on a cold cache, plain cache-aside runs the database query many times,
//! `get_or_compute` once, and every caller of both gets the same report.
//!
//! SQLite always (in memory, and in a file); PostgreSQL with
//! `DATABASE_URL=postgres://... cargo test --test sqlx_query -- --ignored`, which `.ci/run` does
//! when a PostgreSQL server answers on 127.0.0.1:5432.

/// The shared helpers this file uses, one module each (tests/support/).
mod support {
    pub mod example;
    pub use example::*;
}

use std::path::PathBuf;
use std::process::Command;

use support::example_binary;

use serde_json::Value;

const CALLERS: u64 = 50;

/// The example's binary.
fn example() -> PathBuf {
    example_binary(
        "sqlx_query",
        "run `cargo build --example sqlx_query` (plain `cargo test` builds it; `cargo test \
         --test sqlx_query` alone does not)",
    )
}

/// Runs the example against `database_url` (None: its default, SQLite in memory); checks its
/// batch line and returns the other two, naive then guarded.
fn run(database_url: Option<&str>) -> (Value, Value) {
    let mut command = Command::new(example());
    command.args([
        "--json",
        "--callers",
        &CALLERS.to_string(),
        "--query-ms",
        "100",
    ]);
    match database_url {
        Some(url) => command.env("DATABASE_URL", url),
        None => command.env_remove("DATABASE_URL"),
    };
    let output = command.output().expect("the example starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the example failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let [naive, guarded, batch] =
        <[Value; 3]>::try_from(lines).expect("three lines, naive, guarded and batch");
    assert_eq!(naive["mode"], "naive");
    assert_eq!(guarded["mode"], "guarded");
    // The year in one call per caller: one query for the twelve months, the same report of
    // 2019-05 as the other modes.
    assert_eq!(batch["mode"], "batch");
    assert_eq!(batch["months"].as_u64(), Some(12), "{batch}");
    assert_eq!(batch["queries"].as_u64(), Some(1), "{batch}");
    assert_eq!(batch["report"], guarded["report"], "{batch}");
    (naive, guarded)
}

/// The figures the example is about, and the report's contents.
fn check(naive: &Value, guarded: &Value) {
    for line in [naive, guarded] {
        assert_eq!(line["callers"].as_u64(), Some(CALLERS), "{line}");
    }
    let naive_queries = naive["queries"].as_u64().unwrap();
    assert!(
        (2..=CALLERS).contains(&naive_queries),
        "cache-aside stampedes: callers that miss together each run the query: {naive}"
    );
    assert_eq!(guarded["queries"].as_u64(), Some(1), "{guarded}");

    // Every caller of both modes got one and the same report (the example fails otherwise),
    // and it is the seeded month: 2,000 orders over four regions.
    assert_eq!(naive["report"], guarded["report"]);
    let report = &guarded["report"];
    assert_eq!(report["month"], "2019-05");
    assert_eq!(report["orders"], 2000, "{report}");
    let regions = report["regions"].as_array().unwrap();
    assert_eq!(regions.len(), 4, "{report}");
    let revenue: i64 = regions
        .iter()
        .map(|r| r["revenue_cents"].as_i64().unwrap())
        .sum();
    assert_eq!(report["revenue_cents"].as_i64(), Some(revenue), "{report}");
}

#[test]
fn sqlite_in_memory_naive_runs_the_query_per_caller_guarded_once() {
    let (naive, guarded) = run(None);
    assert_eq!(guarded["database"], "SQLite in memory");
    check(&naive, &guarded);
}

#[test]
fn sqlite_file_seeded_twice_holds_the_same_rows_and_gives_the_same_report() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("sales.db").display()
    );
    let (naive, first) = run(Some(&url));
    check(&naive, &first);
    assert!(dir.path().join("sales.db").is_file());
    // The second run finds the table and seeds nothing twice.
    let (naive, second) = run(Some(&url));
    check(&naive, &second);
    assert_eq!(first["report"], second["report"]);
    // And a file database holds what the in-memory one does.
    assert_eq!(first["report"], run(None).1["report"]);
}

#[test]
#[ignore = "needs DATABASE_URL=postgres://... (run with -- --ignored)"]
fn postgres_naive_runs_the_query_per_caller_guarded_once() {
    let url = std::env::var("DATABASE_URL").unwrap_or_default();
    assert!(
        url.starts_with("postgres://") || url.starts_with("postgresql://"),
        "this test needs a PostgreSQL database: set DATABASE_URL=postgres://user@host:port/db \
         (got {url:?}); .ci/run sets it when a server answers on 127.0.0.1:5432"
    );
    let (naive, guarded) = run(Some(&url));
    assert!(
        guarded["database"]
            .as_str()
            .unwrap()
            .starts_with("PostgreSQL"),
        "{guarded}"
    );
    check(&naive, &guarded);
    // The same seed gives the same report as SQLite's.
    assert_eq!(guarded["report"], run(None).1["report"]);
}
