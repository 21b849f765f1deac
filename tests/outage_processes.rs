//! A Redis outage across real processes (issue 21, "Measured"): two instances, each a `Cache`
//! with a near tier that serves while down, fail-safe and auto-recovery, in their own OS
//! processes (the binary re-executes itself; `STAMPEDE_CHILD` names the instance), on a real
//! redis-server that the test kills and restarts empty, or cuts off behind a black-holing proxy.
//!
//! What is asserted, from the lines each instance prints (every call with its start and end in
//! epoch milliseconds, shared by the processes of one machine):
//! - during the outage a key held in process answers `Source::Held`, with no error at all; a key
//!   never held is an error; with `ComputeUncached` it is computed once per key per process;
//! - an invalidation made by A during the outage returns `Written::Queued`, is replayed when
//!   Redis answers, and after the replay plus `max_staleness` no instance serves the invalidated
//!   value (B held a copy of it; behind the proxy Redis still held it too);
//! - both instances come back to the normal path (hits and computations, the breaker closed);
//! - each instance writes at most 6 WARN or ERROR lines for the whole outage (issue 35's log
//!   policy), a leader standing by or losing its lease included;
//! - readiness (`Health::is_ready`) stays true throughout: both instances serve;
//! - A reads the key it invalidated during the outage with `ComputeUncached`: the database sees
//!   one query for it per instance for the whole outage, the value held until the replay.
//!
//! The third run is the trial's outage: Redis frozen (SIGSTOP) for 15 s, then killed and
//! restarted empty; the p99 of held reads per second is printed.
//!
//! Bounds are polling limits, never speed claims; how long the recovery took is printed.

/// The shared helpers this file uses, one module each (tests/support/).
mod support {
    pub mod process;
    pub mod proxy;
    pub mod runtime;
    pub mod server;
    pub mod signal;
    pub mod worker;
    pub use {process::*, proxy::*, runtime::*, server::*, signal::*, worker::*};
}

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use stampede_guard::leader::{Leader, Role};
use stampede_guard::{
    Cache, CallOptions, Computed, ConnectionOptions, NearCacheOptions, OnBackendError,
    RecoveryOptions, Source,
};
use support::{runtime, signal, Mode, Proxy, RedisServer, Worker};

const NAMESPACE: &str = "outage-procs";
const TTL: Duration = Duration::from_secs(60);
const MAX_STALENESS: Duration = Duration::from_millis(200);
/// A key both instances hold before the outage and nobody changes.
const HELD: &str = "held";
/// A key both instances hold before the outage, whose row A changes during it (then invalidates).
const CHANGED: &str = "changed";
/// How long Redis stays away (killed, or black-holed).
const OUTAGE: Duration = Duration::from_secs(2);
/// How long Redis stays frozen in the trial's outage, before it is killed and restarted empty.
const FROZEN: Duration = Duration::from_secs(15);
/// Generous polling limit for anything the test waits for (start-up, replay, recovery).
const WITHIN: Duration = Duration::from_secs(20);
/// The callers of one key in one `ComputeUncached` round.
const CALLERS: usize = 4;
/// The most WARN and ERROR lines an instance may write for one outage (issue 35's log policy).
const MAX_LOG_LINES: usize = 6;

fn main() {
    let tests: &[(&str, fn())] = &[
        (
            "a_killed_server_then_restarted_empty_is_no_outage_and_the_queued_invalidation_wins",
            killed_and_restarted_empty,
        ),
        (
            "a_black_holed_path_is_no_outage_and_the_queued_invalidation_wins_over_the_old_value",
            black_holed,
        ),
        (
            "a_server_frozen_then_killed_is_no_outage_and_logs_a_handful_of_lines",
            frozen_then_killed,
        ),
    ];
    support::run_child_or_tests("outage_processes", tests, child);
}

/// Milliseconds since the epoch: the one clock that both instances and the test read alike.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

// ---------------------------------------------------------------------------------------------
// The instances (child processes)
// ---------------------------------------------------------------------------------------------

/// The "database" the instances compute from: a file holding the generation of `CHANGED`'s row,
/// which the test bumps during the outage (the commit whose invalidation cannot reach Redis).
#[derive(Clone)]
struct Database(PathBuf);

impl Database {
    fn path(dir: &Path) -> PathBuf {
        dir.join("generation")
    }

    fn commit(dir: &Path, generation: u32) {
        std::fs::write(Self::path(dir), generation.to_string()).expect("the database file");
    }

    /// The value of `key` now.
    fn value(&self, key: &str) -> Result<String, String> {
        if key != CHANGED {
            return Ok("steady".to_owned());
        }
        let generation = std::fs::read_to_string(&self.0).map_err(|e| e.to_string())?;
        Ok(format!("gen-{}", generation.trim()))
    }
}

/// The cache of one instance: a near tier serving while down, fail-safe, auto-recovery, short
/// time-outs, the default breaker (as a service would run it).
async fn instance_cache(url: &str) -> Result<Cache, String> {
    Cache::builder()
        .redis_url(url)
        .namespace(NAMESPACE)
        .options(CallOptions::default().fail_safe_for(Duration::from_secs(60)))
        .connection(
            ConnectionOptions::default()
                .connect_timeout(Duration::from_millis(300))
                .response_timeout(Duration::from_millis(300)),
        )
        .near_cache(
            NearCacheOptions::new(10_000)
                .max_staleness(MAX_STALENESS)
                .serve_while_down(Duration::from_secs(60)),
        )
        .auto_recovery(RecoveryOptions::default())
        .build()
        .await
        .map_err(|e| e.to_string())
}

fn child(role: &str) -> Result<(), String> {
    let url = std::env::var("STAMPEDE_URL").map_err(|e| e.to_string())?;
    let dir = PathBuf::from(std::env::var("STAMPEDE_DIR").map_err(|e| e.to_string())?);
    // The crate logs through `tracing`: as a service would, at INFO and above, to stderr, which
    // the test counts.
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(std::io::stderr)
        .try_init();
    runtime().block_on(instance(role.to_owned(), url, dir))
}

async fn instance(role: String, url: String, dir: PathBuf) -> Result<(), String> {
    let cache = instance_cache(&url).await?;
    let db = Database(Database::path(&dir));
    for key in [HELD, CHANGED] {
        until_held(&cache, &db, key).await?;
    }
    println!("ready");
    let stop = dir.join("stop");
    let reads = tokio::spawn(read_loop(
        cache.clone(),
        db.clone(),
        role.clone(),
        stop.clone(),
    ));
    let rounds = tokio::spawn(uncached_loop(cache.clone(), role.clone(), stop.clone()));
    let leader = tokio::spawn(leader_loop(cache.clone(), role.clone(), stop.clone()));
    let readiness = tokio::spawn(readiness_loop(cache.clone(), stop.clone()));
    if role == "a" {
        tokio::spawn(written_loop(cache.clone(), db, dir.clone()));
    }
    control_loop(&cache, &role, &dir).await;
    reads.await.map_err(|e| e.to_string())?;
    leader.await.map_err(|e| e.to_string())??;
    readiness.await.map_err(|e| e.to_string())?;
    let max = rounds.await.map_err(|e| e.to_string())?;
    println!("max_concurrent {max}");
    Ok(())
}

/// One read of `key` through the whole path, computing from the database.
async fn read(cache: &Cache, db: &Database, key: &str) -> Result<(String, Source), String> {
    let value = db.value(key);
    let fetched = cache
        .fetch(key, TTL, move |_| async move { value.map(Computed::new) })
        .await
        .map_err(|e| e.to_string())?;
    Ok((fetched.value, fetched.source))
}

/// Reads `key` until the near tier answers it: its copy is held in this process.
async fn until_held(cache: &Cache, db: &Database, key: &str) -> Result<(), String> {
    for _ in 0..200 {
        let hits = cache.stats().near_hits;
        read(cache, db, key).await?;
        if cache.stats().near_hits > hits {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("the near tier never served {key}"))
}

/// Reads the held keys and a key never read before, every 25 ms, printing each outcome as
/// `read <key> <start ms> <end ms> ok <value> <source>` or `... err <error>`.
async fn read_loop(cache: Cache, db: Database, role: String, stop: PathBuf) {
    let mut round = 0u64;
    while !stop.exists() {
        round += 1;
        let never = format!("never-{role}-{round}");
        for (label, key) in [(HELD, HELD), (CHANGED, CHANGED), ("never", never.as_str())] {
            let start = now_ms();
            let outcome = match read(&cache, &db, key).await {
                Ok((value, source)) => format!("ok {value} {source:?}"),
                Err(e) => format!("err {e}"),
            };
            println!("read {label} {start} {} {outcome}", now_ms());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A leader for the job `sync` (one runner in the fleet), its role changes printed as
/// `leader <ms> <role>`; it stops when the test asks.
async fn leader_loop(cache: Cache, role: String, stop: PathBuf) -> Result<(), String> {
    let lock = cache.lock("sync").map_err(|e| e.to_string())?;
    let leader = Leader::new(lock, Duration::from_millis(100));
    let mut status = leader.status();
    let printer = tokio::spawn(async move {
        while status.changed().await.is_ok() {
            let name = match *status.borrow() {
                Role::Active { .. } => "active",
                Role::Standby => "standby",
                _ => "stopped",
            };
            println!("leader {} {name}", now_ms());
        }
    });
    let job = |_| async { Ok::<(), String>(()) };
    let stopped = async move {
        while !stop.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let ran = leader
        .run(job, stopped)
        .await
        .map_err(|e| format!("{role}: {e}"));
    let _ = printer.await;
    ran
}

/// Whether the instance should receive traffic, every 50 ms: `readiness <ms> <true|false>`.
async fn readiness_loop(cache: Cache, stop: PathBuf) {
    while !stop.exists() {
        let ready = cache.health().await.is_ready();
        println!("readiness {} {ready}", now_ms());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A only: once it invalidated `CHANGED` (its write queued while Redis is away), reads it with
/// `ComputeUncached` every 25 ms, each computation printed (`computed-written <ms>`) and each
/// read (`written <start> <end> <source>`).
async fn written_loop(cache: Cache, db: Database, dir: PathBuf) {
    let cache = cache.with_options(
        cache
            .options()
            .clone()
            .on_backend_error(OnBackendError::ComputeUncached),
    );
    while !dir.join("invalidated").exists() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    while !dir.join("stop").exists() {
        let start = now_ms();
        let value = db.value(CHANGED);
        let outcome = cache
            .fetch(CHANGED, TTL, move |_| async move {
                println!("computed-written {}", now_ms());
                value.map(Computed::new)
            })
            .await;
        let source = outcome.map_or_else(|_| "err".to_owned(), |f| format!("{:?}", f.source));
        println!("written {start} {} {source}", now_ms());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Rounds of `CALLERS` concurrent calls of one new key with `ComputeUncached`, each computation
/// printed (`computed <key>`) and the round's sources after it (`round <key> <start> <end>
/// <sources>`). Returns the most computations of one key that ever ran at once here.
async fn uncached_loop(cache: Cache, role: String, stop: PathBuf) -> usize {
    let cache = cache.with_options(
        cache
            .options()
            .clone()
            .on_backend_error(OnBackendError::ComputeUncached),
    );
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut round = 0u64;
    while !stop.exists() {
        round += 1;
        let key = format!("uncached-{role}-{round}");
        let start = now_ms();
        let sources = uncached_round(&cache, &key, &running, &most).await;
        println!("round {key} {start} {} {}", now_ms(), sources.join(","));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    most.load(Ordering::SeqCst)
}

/// One round: `CALLERS` calls of `key` at once; each call's source, or `err`.
async fn uncached_round(
    cache: &Cache,
    key: &str,
    running: &Arc<AtomicUsize>,
    most: &Arc<AtomicUsize>,
) -> Vec<String> {
    // The computation waits until every caller has set out, so that all of them can join the
    // one flight: a caller arriving after it ended would compute again, rightly.
    let arrived = Arc::new(AtomicUsize::new(0));
    let calls: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (cache, key) = (cache.clone(), key.to_owned());
            let (arrived, running, most) = (arrived.clone(), running.clone(), most.clone());
            tokio::spawn(async move {
                arrived.fetch_add(1, Ordering::SeqCst);
                let computed = key.clone();
                let computation = move |_| async move {
                    let deadline = Instant::now() + Duration::from_secs(2);
                    while arrived.load(Ordering::SeqCst) < CALLERS && Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    println!("computed {computed}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    running.fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, String>(Computed::new(1u32))
                };
                match cache.fetch(&key, TTL, computation).await {
                    Ok(fetched) => format!("{:?}", fetched.source),
                    Err(_) => "err".to_owned(),
                }
            })
        })
        .collect();
    let mut sources = Vec::with_capacity(CALLERS);
    for call in calls {
        sources.push(call.await.unwrap_or_else(|_| "panicked".to_owned()));
    }
    sources
}

/// Prints the instance's state every 20 ms (`status <ms> <breaker> <queued> <replayed>
/// <held served>`); as A, invalidates `CHANGED` once the test asks (`invalidated <start> <end>
/// <written>`); ends when the test asks.
async fn control_loop(cache: &Cache, role: &str, dir: &Path) {
    let mut invalidated = false;
    while !dir.join("stop").exists() {
        let stats = cache.stats();
        println!(
            "status {} {:?} {} {} {}",
            now_ms(),
            stats.breaker,
            stats.recovery_queued,
            stats.recovery_replayed,
            stats.held_served
        );
        if role == "a" && !invalidated && dir.join("invalidate").exists() {
            invalidated = true;
            let start = now_ms();
            let written = match cache.invalidate(CHANGED).await {
                Ok(written) => format!("{written:?}"),
                Err(e) => format!("err {e}"),
            };
            println!("invalidated {start} {} {written}", now_ms());
            touch(&dir.join("invalidated"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The test (the parent process)
// ---------------------------------------------------------------------------------------------

/// How Redis goes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGKILL, then a new, empty server on the same port.
    Kill,
    /// The path black-holed by the proxy (nothing answers, no RST), then open again; the server
    /// keeps its data.
    Blackhole,
    /// The trial's outage: SIGSTOP for `FROZEN` (requests time out), then SIGKILL and a new,
    /// empty server on the same port.
    FreezeThenKill,
}

fn killed_and_restarted_empty() {
    outage(Fault::Kill);
}

fn black_holed() {
    outage(Fault::Blackhole);
}

fn frozen_then_killed() {
    outage(Fault::FreezeThenKill);
}

/// One read an instance printed.
struct Read {
    key: String,
    start: u64,
    end: u64,
    /// The value and its source's name, or the error.
    outcome: Result<(String, String), String>,
}

/// A read as a failure message shows it: its key, start and end, and outcome.
impl std::fmt::Debug for Read {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}..{} {:?}",
            self.key, self.start, self.end, self.outcome
        )
    }
}

impl Read {
    fn parse(line: &str) -> Option<Read> {
        let mut words = line.strip_prefix("read ")?.splitn(5, ' ');
        let key = words.next()?.to_owned();
        let start = words.next()?.parse().ok()?;
        let end = words.next()?.parse().ok()?;
        let outcome = match (words.next()?, words.next()?) {
            ("ok", rest) => {
                let (value, source) = rest.split_once(' ')?;
                Ok((value.to_owned(), source.to_owned()))
            }
            (_, error) => Err(error.to_owned()),
        };
        Some(Read {
            key,
            start,
            end,
            outcome,
        })
    }

    /// Whether it started and ended within `[from, to]`.
    fn within(&self, from: u64, to: u64) -> bool {
        self.start >= from && self.end <= to
    }

    fn source(&self) -> Option<&str> {
        self.outcome
            .as_ref()
            .ok()
            .map(|(_, source)| source.as_str())
    }

    fn value(&self) -> Option<&str> {
        self.outcome.as_ref().ok().map(|(value, _)| value.as_str())
    }
}

/// One state line an instance printed.
#[derive(Debug)]
struct Status {
    at: u64,
    breaker: String,
    queued: u64,
    replayed: u64,
    held_served: u64,
}

impl Status {
    fn parse(line: &str) -> Option<Status> {
        let words: Vec<&str> = line.strip_prefix("status ")?.split(' ').collect();
        let [at, breaker, queued, replayed, held_served] = words[..] else {
            return None;
        };
        Some(Status {
            at: at.parse().ok()?,
            breaker: breaker.to_owned(),
            queued: queued.parse().ok()?,
            replayed: replayed.parse().ok()?,
            held_served: held_served.parse().ok()?,
        })
    }
}

/// One instance as the test sees it: its process and the file its logs go to.
struct Instance {
    role: &'static str,
    worker: Worker,
    log: PathBuf,
}

impl Instance {
    fn spawn(role: &'static str, url: &str, dir: &Path) -> Instance {
        let log = dir.join(format!("{role}.log"));
        let file = std::fs::File::create(&log).expect("the instance's log file");
        let vars = [
            ("STAMPEDE_URL", url.to_owned()),
            ("STAMPEDE_DIR", dir.display().to_string()),
        ];
        Instance {
            role,
            worker: Worker::spawn_logging_to(role, &vars, file),
            log,
        }
    }

    fn ready(&self) -> bool {
        self.worker.last("ready").is_some()
    }

    fn lines(&self) -> Vec<String> {
        self.worker.lines().into_iter().map(|(_, l)| l).collect()
    }

    fn reads(&self, key: &str) -> Vec<Read> {
        let reads = self.lines().into_iter().filter_map(|l| Read::parse(&l));
        reads.filter(|r| r.key == key).collect()
    }

    fn statuses(&self) -> Vec<Status> {
        let lines = self.lines();
        lines.iter().filter_map(|l| Status::parse(l)).collect()
    }

    /// The WARN and ERROR lines of its logs so far (tracing-subscriber's `fmt`:
    /// `<time>  WARN <target>: ...`).
    fn log_lines(&self) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines = text
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "));
        lines.map(str::to_owned).collect()
    }

    /// When it was back on the normal path after `up`: its breaker closed and a read of `HELD`
    /// answered by the cache (a hit) or computed into it, not held.
    fn back_to_normal(&self, up: u64) -> Option<u64> {
        let closed = self
            .statuses()
            .into_iter()
            .find(|s| s.at >= up && s.breaker == "Closed")?;
        let normal = self
            .reads(HELD)
            .into_iter()
            .find(|r| r.start >= up && matches!(r.source(), Some("Hit" | "Computed")))?;
        Some(closed.at.max(normal.end))
    }

    /// Whether its leader's last role change made it the active one.
    fn leading(&self) -> bool {
        let last = self.worker.last("leader ").map(|(_, line)| line);
        last.is_some_and(|line| line.ends_with(" active"))
    }

    /// Waits for it to end (once the test touched `stop`); its log's tail if it failed.
    fn stop(&mut self) {
        if !self.worker.wait_success() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            panic!(
                "instance {} failed; its log ends:\n{}",
                self.role,
                tail.join("\n")
            );
        }
    }
}

fn touch(path: &Path) {
    std::fs::write(path, b"").expect("a control file");
}

/// Polls `probe` every 20 ms until it gives a value, at most `WITHIN`.
fn poll<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WITHIN;
    loop {
        if let Some(found) = probe() {
            return found;
        }
        assert!(Instant::now() < deadline, "not within {WITHIN:?}: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sleeps until the epoch millisecond `at` (at once if it has passed).
fn sleep_until(at: u64) {
    std::thread::sleep(Duration::from_millis(at.saturating_sub(now_ms())));
}

/// `CHANGED`'s value and fence as the server holds them, read with a plain client (the value is
/// the envelope's bytes: the value's text is in them as is).
fn on_server(server: &RedisServer) -> (Option<Vec<u8>>, Option<u64>) {
    let value_key = format!("{NAMESPACE}:{{{CHANGED}}}");
    let mut conn = server.conn();
    let value = redis::cmd("GET").arg(&value_key).query(&mut conn);
    let fence = redis::cmd("GET")
        .arg(format!("{value_key}_fence"))
        .query(&mut conn);
    (
        value.expect("GET on the test server"),
        fence.expect("GET on the test server"),
    )
}

fn holds_generation_1(value: Option<&[u8]>) -> bool {
    value.is_some_and(|bytes| bytes.windows(5).any(|w| w == b"gen-1"))
}

impl Timeline {
    /// Reads for a failure message: how many, the first five with their times from the start
    /// of the outage, and the run's moments on the same scale.
    fn show<R: std::borrow::Borrow<Read>>(&self, reads: &[R]) -> String {
        let first: Vec<String> = reads
            .iter()
            .take(5)
            .map(|r| {
                let r = r.borrow();
                let from = |at: u64| i128::from(at) - i128::from(self.down);
                format!(
                    "{} {:+}..{:+} ms {:?}",
                    r.key,
                    from(r.start),
                    from(r.end),
                    r.outcome
                )
            })
            .collect();
        format!(
            "{} reads; the first: {first:#?}; (ms from down) invalidated {:+}, up {:+}, replayed {:+}",
            reads.len(),
            i128::from(self.invalidated.1) - i128::from(self.down),
            i128::from(self.up) - i128::from(self.down),
            i128::from(self.replayed) - i128::from(self.down),
        )
    }
}

/// The moments of one run, in epoch milliseconds.
struct Timeline {
    down: u64,
    /// A's `invalidate` call during the outage: its start and end.
    invalidated: (u64, u64),
    up: u64,
    /// The first moment A reported its queue replayed and empty.
    replayed: u64,
}

/// The run: both instances warm, Redis away for `OUTAGE` (A invalidates `CHANGED` meanwhile),
/// Redis back, then the checks on what each instance printed.
fn outage(fault: Fault) {
    let mut server = RedisServer::start();
    let proxy = (fault == Fault::Blackhole).then(|| Proxy::start(server.port()));
    let url = proxy.as_ref().map_or_else(|| server.url(), Proxy::url);
    let dir = tempfile::tempdir().expect("a temp dir for the instances");
    let dir = dir.path();
    Database::commit(dir, 1);
    let [a, b] = ["a", "b"].map(|role| Instance::spawn(role, &url, dir));
    poll("both instances hold their keys", || {
        (a.ready() && b.ready()).then_some(())
    });
    std::thread::sleep(Duration::from_millis(300));
    let (_, fence_before) = on_server(&server);
    let logs_before = [a.log_lines().len(), b.log_lines().len()];

    match (&proxy, fault) {
        (Some(proxy), Fault::Blackhole) => proxy.set_mode(Mode::Blackhole),
        (_, Fault::FreezeThenKill) => signal(server.pid().expect("the server runs"), "STOP"),
        _ => server.kill(),
    }
    // Once the fault is in place (a signal is sent by a process of its own): a read that began
    // before it may still have been answered.
    let down = now_ms();
    // Past the near tier's proof: the copies are held, not served as hits.
    std::thread::sleep(Duration::from_millis(700));
    Database::commit(dir, 2);
    touch(&dir.join("invalidate"));
    let (invalidated, written) = poll("A's invalidation during the outage", || {
        let (_, line) = a.worker.last("invalidated ")?;
        let words: Vec<String> = line.split(' ').map(str::to_owned).collect();
        let (start, end) = (words.get(1)?.parse().ok()?, words.get(2)?.parse().ok()?);
        Some(((start, end), words[3..].join(" ")))
    });
    assert_eq!(written, "Queued", "A's invalidation during the outage");
    let away = if fault == Fault::FreezeThenKill {
        FROZEN
    } else {
        OUTAGE
    };
    sleep_until(down + u64::try_from(away.as_millis()).unwrap_or(u64::MAX));

    if fault == Fault::Blackhole {
        let (value, _) = on_server(&server);
        assert!(
            holds_generation_1(value.as_deref()),
            "behind the black hole Redis still holds the old value"
        );
    }
    let up = now_ms();
    match (&proxy, fault) {
        // The requests held in the hole are dropped with their connections, never delivered
        // late: the queued invalidation can only land by its replay.
        (Some(proxy), Fault::Blackhole) => {
            proxy.cut();
            proxy.set_mode(Mode::Pass);
        }
        // SIGKILL ends a stopped process too; the new server starts empty.
        (_, Fault::FreezeThenKill) => {
            server.kill();
            server.restart();
        }
        _ => server.restart(),
    }
    let replayed = poll("A's queue replayed", || {
        let statuses = a.statuses().into_iter();
        let mut drained = statuses.filter(|s| s.at >= up && s.replayed >= 1 && s.queued == 0);
        drained.next().map(|s| s.at)
    });
    let normal = [&a, &b].map(|i| poll("back to the normal path", || i.back_to_normal(up)));
    poll("one leader in the fleet again", || {
        let active = [&a, &b].iter().filter(|i| i.leading()).count();
        (active == 1).then_some(())
    });
    // Time for reads past the replay plus max_staleness, and for the logs of the recovery.
    sleep_until(replayed + 1_500);
    let logs = [&a, &b].map(Instance::log_lines);
    let time = Timeline {
        down,
        invalidated,
        up,
        replayed,
    };
    let (value, fence_after) = on_server(&server);
    touch(&dir.join("stop"));
    let [mut a, mut b] = [a, b];
    a.stop();
    b.stop();

    for (instance, role) in [(&a, "a"), (&b, "b")] {
        check_outage(instance, role, &time);
        check_recovery(instance, role, &time);
        check_ready(instance, role);
    }
    let queries = check_written(&a, &time, fault == Fault::FreezeThenKill);
    assert!(
        !holds_generation_1(value.as_deref()),
        "the invalidated value is gone from Redis"
    );
    assert!(
        fence_after > fence_before,
        "the fence moved ({fence_before:?} -> {fence_after:?})"
    );
    for ((role, logs), before) in ["a", "b"].iter().zip(&logs).zip(logs_before) {
        let during = &logs[before..];
        assert!(
            during.len() <= MAX_LOG_LINES,
            "instance {role} wrote {} WARN/ERROR lines for one outage:\n{}",
            during.len(),
            during.join("\n")
        );
    }
    let held = [&a, &b].map(|i| i.statuses().last().map_or(0, |s| s.held_served));
    let p99 = [&a, &b].map(|i| worst_p99_per_second(i, &time));
    println!(
        "outage_processes ({fault:?}): A's invalidation replayed {} ms after Redis returned; \
         back to the normal path after {} ms (A) and {} ms (B); calls served held {} (A), {} (B); \
         queries of the key A wrote during the outage {queries} (A); held reads' p99 in the \
         first second {} ms (A), {} ms (B), the worst of any later second {} ms (A), {} ms (B); \
         WARN/ERROR lines {} (A), {} (B)",
        replayed - up,
        normal[0] - up,
        normal[1] - up,
        held[0],
        held[1],
        p99[0].0,
        p99[1].0,
        p99[0].1,
        p99[1].1,
        logs[0].len() - logs_before[0],
        logs[1].len() - logs_before[1],
    );
}

/// During the outage: held keys answer `Held` with no error, a key never held is an error, and
/// with `ComputeUncached` each key is computed once in the process.
fn check_outage(instance: &Instance, role: &str, time: &Timeline) {
    let errors: Vec<Read> = instance
        .reads(HELD)
        .into_iter()
        .filter(|r| r.outcome.is_err())
        .collect();
    assert!(
        errors.is_empty(),
        "{role}: a held key failed: {}",
        time.show(&errors)
    );
    // Copies of `CHANGED` are held until A invalidates it (A's own copy goes then).
    let held_until = if role == "a" {
        time.invalidated.0
    } else {
        time.up
    };
    let changed = instance.reads(CHANGED).into_iter();
    let errors: Vec<Read> = changed
        // Strictly before: a read that ends in the millisecond the invalidation starts may
        // already have met it.
        .filter(|r| r.end < held_until && r.outcome.is_err())
        .collect();
    assert!(
        errors.is_empty(),
        "{role}: a held key failed: {}",
        time.show(&errors)
    );

    // Past the near tier's proof (`max_staleness`) and the first failing requests.
    let during = |r: &Read| r.within(time.down + 500, time.up);
    let held: Vec<Read> = instance.reads(HELD).into_iter().filter(during).collect();
    assert!(!held.is_empty(), "{role}: no read during the outage");
    let not_held: Vec<&Read> = held.iter().filter(|r| r.source() != Some("Held")).collect();
    assert!(
        not_held.is_empty(),
        "{role}: not served as held: {}",
        time.show(&not_held)
    );

    let never = instance
        .reads("never")
        .into_iter()
        .filter(|r| r.within(time.down, time.up));
    let never: Vec<Read> = never.collect();
    assert!(
        !never.is_empty(),
        "{role}: no read of a new key during the outage"
    );
    let answered: Vec<&Read> = never.iter().filter(|r| r.outcome.is_ok()).collect();
    assert!(
        answered.is_empty(),
        "{role}: a key never held was answered: {}",
        time.show(&answered)
    );

    let statuses = instance.statuses().into_iter();
    let mut outage = statuses.filter(|s| s.at > time.down && s.at < time.up);
    assert!(
        outage.any(|s| s.breaker == "Open"),
        "{role}: the breaker never opened"
    );
    check_uncached(instance, role, time);
}

/// `ComputeUncached`: one computation per key per process, however many callers, and during the
/// outage every caller answered (`Uncached` for the one that computed).
fn check_uncached(instance: &Instance, role: &str, time: &Timeline) {
    let lines = instance.lines();
    let computed = |key: &str| {
        let line = format!("computed {key}");
        lines.iter().filter(|l| **l == line).count()
    };
    let mut during = 0;
    for line in lines.iter().filter_map(|l| l.strip_prefix("round ")) {
        let words: Vec<&str> = line.split(' ').collect();
        let [key, start, end, sources] = words[..] else {
            panic!("{role}: a round line without its fields: {line}");
        };
        assert_eq!(computed(key), 1, "{role}: computations of {key}: {line}");
        let (start, end): (u64, u64) = (start.parse().unwrap(), end.parse().unwrap());
        if start >= time.down && end <= time.up {
            during += 1;
            let sources: Vec<&str> = sources.split(',').collect();
            assert!(
                !sources.contains(&"err") && sources.contains(&"Uncached"),
                "{role}: {key} during the outage: {sources:?}"
            );
        }
    }
    assert!(
        during > 0,
        "{role}: no ComputeUncached round during the outage"
    );
    let most = instance.worker.last("max_concurrent ").map(|(_, l)| l);
    assert_eq!(most.as_deref(), Some("max_concurrent 1"), "{role}");
}

/// Readiness (`Health::is_ready`) stayed true from start to end: the instance served throughout,
/// so a load balancer's probe would not have taken it out.
fn check_ready(instance: &Instance, role: &str) {
    let lines = instance.lines();
    let states: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("readiness "))
        .collect();
    assert!(!states.is_empty(), "{role}: no readiness reported");
    let not_ready: Vec<&&str> = states.iter().filter(|s| !s.ends_with(" true")).collect();
    assert!(not_ready.is_empty(), "{role}: not ready at {not_ready:?}");
}

/// A's reads of the key it invalidated during the outage, with `ComputeUncached`: at most one
/// query of the database while Redis was away (the value held until the replay), and every read
/// that began and ended in the outage answered, the later ones `Held`. `long`: an outage long
/// enough that reads surely ran in it (the trial's 15 s); a 2 s outage on a loaded machine may
/// see its first read still waiting on the reconnection when Redis returns. Returns the number
/// of queries.
fn check_written(a: &Instance, time: &Timeline, long: bool) -> usize {
    let lines = a.lines();
    let at = |line: &str, prefix: &str| -> Option<u64> {
        line.strip_prefix(prefix)?.split(' ').next()?.parse().ok()
    };
    // The loop reads once the invalidation returned (`invalidated` is printed first): a
    // computation in the millisecond it returned is in the outage.
    let computed: Vec<u64> = lines
        .iter()
        .filter_map(|l| at(l, "computed-written "))
        .collect();
    let queries = computed
        .iter()
        .filter(|&&ms| ms >= time.invalidated.1 && ms < time.up)
        .count();
    assert!(
        queries <= 1,
        "A queried the written key {queries} times while Redis was away"
    );
    // `written <start> <end> <source>`, begun and ended in the outage.
    let reads: Vec<Vec<&str>> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("written "))
        .map(|l| l.split(' ').collect::<Vec<&str>>())
        .filter(|w| {
            let ms = |i: usize| w.get(i).and_then(|v| v.parse::<u64>().ok());
            ms(0).is_some_and(|start| start >= time.invalidated.1)
                && ms(1).is_some_and(|end| end < time.up)
        })
        .collect();
    let failed: Vec<&Vec<&str>> = reads.iter().filter(|w| w.get(2) == Some(&"err")).collect();
    assert!(
        failed.is_empty(),
        "reads of the written key failed: {failed:?}"
    );
    if long {
        assert_eq!(
            queries, 1,
            "A never computed the written key during the outage (invalidated {:?}, up {}, \
             computed at {computed:?}, reads {reads:?})",
            time.invalidated, time.up
        );
        assert!(
            reads.len() >= 2,
            "A read the written key {} times",
            reads.len()
        );
    }
    let later = reads.iter().skip(1).filter(|w| w.get(2) != Some(&"Held"));
    let later: Vec<&Vec<&str>> = later.collect();
    assert!(later.is_empty(), "later reads not held: {later:?}");
    queries
}

/// The p99, in ms, of the held key's reads in the outage's first second (the reads under way
/// when Redis went away wait for their time-out), and the worst p99 of any later second: printed,
/// not asserted (tests check behaviour, benches speed).
fn worst_p99_per_second(instance: &Instance, time: &Timeline) -> (u64, u64) {
    let mut by_second: std::collections::BTreeMap<u64, Vec<u64>> = Default::default();
    for read in instance
        .reads(HELD)
        .into_iter()
        .filter(|r| r.within(time.down, time.up))
    {
        by_second
            .entry((read.start - time.down) / 1_000)
            .or_default()
            .push(read.end - read.start);
    }
    let p99 = |mut took: Vec<u64>| {
        took.sort_unstable();
        took[(took.len() * 99).div_ceil(100).saturating_sub(1)]
    };
    let first = by_second.remove(&0).map_or(0, p99);
    (first, by_second.into_values().map(p99).max().unwrap_or(0))
}

/// After Redis returns: A never serves the value it invalidated, no instance serves it past the
/// replay plus `max_staleness`, and both serve the new one.
fn check_recovery(instance: &Instance, role: &str, time: &Timeline) {
    let reads = instance.reads(CHANGED);
    if role == "a" {
        let served: Vec<&Read> = reads
            .iter()
            .filter(|r| r.start > time.invalidated.1 && r.value() == Some("gen-1"))
            .collect();
        assert!(
            served.is_empty(),
            "A served what it invalidated: {}",
            time.show(&served)
        );
    }
    let cutoff = time.replayed + u64::try_from(MAX_STALENESS.as_millis()).unwrap_or(u64::MAX);
    let after: Vec<&Read> = reads.iter().filter(|r| r.start > cutoff).collect();
    let old: Vec<&Read> = after
        .iter()
        .copied()
        .filter(|r| r.value() == Some("gen-1"))
        .collect();
    assert!(
        old.is_empty(),
        "{role} served the invalidated value past the replay plus max_staleness: {}",
        time.show(&old)
    );
    assert!(
        after.iter().any(|r| r.value() == Some("gen-2")),
        "{role} never served the new value after the replay: {}",
        time.show(&after)
    );
}
