//! The doctor (`cargo run --example doctor -- <redis-url>`, issue 36): its scenario runs
//! against the test servers and its table's verdicts are read here. The scenario is the
//! example's own file, included as a module.

/// The shared helpers this file uses, one module each (tests/support/).
mod support {
    pub mod server;
    pub use server::*;
}

#[path = "../examples/doctor/scenario.rs"]
#[allow(dead_code)]
mod scenario;

use scenario::{diagnose, Verdict, CHECKS};
use support::RedisServer;

fn on_valkey() -> bool {
    support::programs()
        .server
        .file_name()
        .is_some_and(|name| name.to_string_lossy().contains("valkey"))
}

/// A server's command-line settings.
fn words(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// Keys left on the server.
fn keys_left(server: &RedisServer) -> usize {
    redis::cmd("DBSIZE").query(&mut server.conn()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_doctor_passes_on_the_test_server_and_cleans_up() {
    let server = RedisServer::start();
    let report = diagnose(&server.url()).await;
    eprintln!("{}", report.table());
    assert_eq!(report.verdict("server"), Some(Verdict::Works));
    for check in CHECKS {
        assert_eq!(
            report.verdict(check),
            Some(Verdict::Works),
            "{check}\n{}",
            report.table()
        );
    }
    let renewal = if on_valkey() {
        Verdict::Works
    } else {
        Verdict::FellBack
    };
    assert_eq!(report.verdict("lock renewal"), Some(renewal));
    assert!(!report.verdict_failed());
    assert_eq!(keys_left(&server), 0, "the doctor deletes what it wrote");
}

/// A managed-like server: `CLIENT` and `CONFIG` renamed away. Tracking and the eviction check
/// fall back, and the table says so and what to do; nothing fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managed_like_server_falls_back_and_says_so() {
    let args = words(&[
        "--rename-command",
        "CLIENT",
        "",
        "--rename-command",
        "CONFIG",
        "",
    ]);
    let server = RedisServer::start_with(&args, "");
    let report = diagnose(&server.url()).await;
    eprintln!("{}", report.table());
    assert_eq!(
        report.verdict("near tier"),
        Some(Verdict::FellBack),
        "{}",
        report.table()
    );
    let table = report.table();
    assert!(table.contains("no CLIENT TRACKING BCAST"), "{table}");
    assert!(table.contains("no CONFIG GET"), "{table}");
    assert!(table.contains("maxmemory-policy"), "{table}");
    assert!(!report.verdict_failed(), "{table}");
}

/// A user who may not run scripts, and a URL that is not Redis: one clear line, the rest
/// skipped, no panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lua_and_not_redis_are_one_clear_line() {
    let args = words(&[
        "--user",
        "app",
        "on",
        ">pw",
        "~*",
        "&*",
        "+@all",
        "-@scripting",
    ]);
    let server = RedisServer::start_with(&args, "app:pw@");
    let report = diagnose(&server.url()).await;
    let table = report.table();
    assert_eq!(report.verdict("server"), Some(Verdict::Failed), "{table}");
    assert!(
        table.contains("no Lua") && table.contains("+@scripting"),
        "{table}"
    );
    assert_eq!(
        report.verdict("single flight"),
        Some(Verdict::Skipped),
        "{table}"
    );

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}/0", listener.local_addr().unwrap());
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        while let Ok((mut socket, _)) = listener.accept().await {
            let _ = socket.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        }
    });
    let report = diagnose(&url).await;
    let table = report.table();
    assert_eq!(report.verdict("server"), Some(Verdict::Failed), "{table}");
    assert!(table.contains("not as Redis does"), "{table}");
}
