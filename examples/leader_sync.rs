//! One machine works, the others stand by: every instance runs the job "copy the counters into
//! the ledger" under one lock; only the active one runs it, every second, and the ledger refuses
//! any write whose fencing token is lower than one it has already accepted.
//!
//! ```text
//! cargo run --example leader_sync                       # 3 instances in one process, embedded store;
//!                                                       # the active one stops after 3 s: watch the hand-over
//! cargo run --example leader_sync -- --redis redis://127.0.0.1:6379/0 --name a   # one instance per terminal;
//!                                                       # Ctrl-C the active one and another takes over
//! ```
//! The ledger is a tab-separated file (`--ledger PATH`, default in the temp dir): one line per
//! accepted copy, `fencing_token  instance  unix_ms  counters`.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use stampede_guard::leader::{JobContext, Leader, Role};
use stampede_guard::{Cache, CallOptions, Lock};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse()?;
    let options = CallOptions::default().lease(Duration::from_secs(3));
    println!("ledger: {}", args.ledger.display());
    match &args.redis {
        Some(url) => {
            let cache = Cache::builder()
                .redis_url(url.as_str())
                .namespace("leader-sync-example")
                .options(options)
                .build()
                .await?;
            let shutdown = async {
                let _ = tokio::signal::ctrl_c().await;
            };
            instance(&args.name, cache, args.ledger.clone(), shutdown).await
        }
        None => {
            // Three instances on one embedded store. After 3 s the active one shuts down (and
            // releases at once): another takes over. After 6 s everyone stops.
            let cache = Cache::builder().options(options).build().await?;
            let mut stops = Vec::new();
            let mut instances = Vec::new();
            for name in ["a", "b", "c"] {
                let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
                stops.push((name, stop_tx));
                let (cache, ledger) = (cache.clone(), args.ledger.clone());
                instances.push(tokio::spawn(async move {
                    instance(name, cache, ledger, async move {
                        let _ = stop_rx.await;
                    })
                    .await
                }));
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
            let leader = last_writer(&args.ledger)?;
            println!("-- shutting down the active instance [{leader}] --");
            if let Some(i) = stops.iter().position(|(name, _)| *name == leader) {
                let _ = stops.remove(i).1.send(());
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
            println!("-- shutting down the others --");
            for (_, stop) in stops {
                let _ = stop.send(());
            }
            for i in instances {
                i.await??;
            }
            Ok(())
        }
    }
}

/// The instance that wrote the ledger's last line: the active one.
fn last_writer(ledger: &Path) -> Result<String, BoxError> {
    let file = File::open(ledger)?;
    let last = BufReader::new(file).lines().map_while(Result::ok).last();
    Ok(last
        .and_then(|l| l.split('\t').nth(1).map(str::to_string))
        .unwrap_or_default())
}

/// One instance: stands by, and copies the counters every second while it leads.
async fn instance(
    name: &str,
    cache: Cache,
    ledger: PathBuf,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), BoxError> {
    let lock: Lock = cache.lock("copy-counters")?;
    let leader = Leader::new(lock, Duration::from_secs(1));
    let mut status = leader.status();
    let me = name.to_string();
    let printer = tokio::spawn(async move {
        while status.changed().await.is_ok() {
            let role = *status.borrow_and_update();
            match role {
                Role::Active { fencing_token } => {
                    println!("[{me}] active (fencing token {fencing_token})")
                }
                Role::Standby => println!("[{me}] standby"),
                _ => println!("[{me}] stopped"),
            }
        }
    });
    let me = name.to_string();
    let job = move |ctx: JobContext| {
        let (cache, ledger, me) = (cache.clone(), ledger.clone(), me.clone());
        async move { copy_counters(&cache, &ledger, &me, ctx).await }
    };
    leader.run(job, shutdown).await?;
    // The runner is gone, so the printer ends after the last role change.
    printer.await?;
    Ok(())
}

/// The job: bump and read the source counters, then append them to the ledger under our token.
async fn copy_counters(
    cache: &Cache,
    ledger: &Path,
    me: &str,
    ctx: JobContext,
) -> Result<(), BoxError> {
    // The "source": a counter in the cache's backend that traffic would be incrementing.
    let hits: u64 = cache.get("hits").await?.unwrap_or(0) + 1;
    let _ = cache.set("hits", &hits, Duration::from_secs(3600)).await?;
    let counters = BTreeMap::from([("hits", hits)]);
    if ctx.is_cancelled() {
        return Ok(());
    }
    match fenced_append(ledger, ctx.fencing_token(), me, &counters)? {
        true => println!("[{me}] copied {counters:?}"),
        false => println!(
            "[{me}] ledger refused a stale write (token {})",
            ctx.fencing_token()
        ),
    }
    Ok(())
}

/// Appends a line unless the ledger already holds a higher token: the store-side fencing check.
/// An exclusive file lock makes check-and-append atomic among the writers on this machine.
fn fenced_append(
    ledger: &Path,
    token: u64,
    me: &str,
    counters: &BTreeMap<&str, u64>,
) -> Result<bool, BoxError> {
    let mut file: File = OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(ledger)?;
    file.lock()?;
    file.rewind()?;
    let highest = BufReader::new(&file)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| l.split('\t').next().and_then(|t| t.parse::<u64>().ok()))
        .max()
        .unwrap_or(0);
    if token < highest {
        return Ok(false);
    }
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    writeln!(file, "{token}\t{me}\t{now}\t{counters:?}")?;
    Ok(true)
}

struct Args {
    redis: Option<String>,
    name: String,
    ledger: PathBuf,
}

impl Args {
    fn parse() -> Result<Self, String> {
        let mut args = Args {
            redis: None,
            name: format!("pid{}", std::process::id()),
            ledger: std::env::temp_dir().join("stampede-guard-leader-sync.tsv"),
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let value = it.next().ok_or(format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--redis" => args.redis = Some(value),
                "--name" => args.name = value,
                "--ledger" => args.ledger = PathBuf::from(value),
                _ => {
                    return Err(
                        "usage: leader_sync [--redis URL] [--name NAME] [--ledger PATH]".into(),
                    )
                }
            }
        }
        Ok(args)
    }
}
