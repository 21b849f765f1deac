//! The doctor's scenario: a short, bounded run of what the crate relies on, against one server,
//! in a namespace of its own that it deletes afterwards. Each check gives one row of the table:
//! it works, it fell back (and what that costs), or it failed (and why); nothing panics on a
//! server's answer. `tests/doctor.rs` runs it against the test servers and reads the verdicts.
//!
//! Bounded: every check runs under [`CHECK_BOUND`], the whole under about a minute at worst; a
//! server that answers normally takes a few seconds.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stampede_guard::{
    Cache, CallOptions, Capabilities, ConnectionOptions, Error, NearCacheOptions, TrackingState,
};

/// The longest any one check may take.
pub const CHECK_BOUND: Duration = Duration::from_secs(10);
/// The checks that run once the caches are built, in order (before them: `server`, the lock
/// paths and the fallbacks the probe found).
pub const CHECKS: [&str; 8] = [
    "round trip",
    "single flight",
    "wake-up",
    "lock and fencing",
    "near tier",
    "tags",
    "batch",
    "clean-up",
];
/// Rounds of the wake-up measurement.
const WAKE_ROUNDS: usize = 20;
/// The near tier's bound in the feed check.
const MAX_STALENESS: Duration = Duration::from_millis(500);
const TTL: Duration = Duration::from_secs(60);

/// What a check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// As on a full Redis.
    Works,
    /// The server lacks something; the crate took its fallback (the detail says its cost).
    FellBack,
    /// The check could not pass on this server (the detail says why).
    Failed,
    /// Not run: an earlier failure makes it meaningless.
    Skipped,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Verdict::Works => "works",
            Verdict::FellBack => "fell back",
            Verdict::Failed => "FAILED",
            Verdict::Skipped => "skipped",
        }
    }
}

/// One line of the table.
#[derive(Debug, Clone)]
pub struct Row {
    pub check: &'static str,
    pub verdict: Verdict,
    pub detail: String,
}

/// The doctor's findings.
#[derive(Debug, Default)]
pub struct Report {
    pub rows: Vec<Row>,
    /// What the probe found, if the server answered as Redis.
    pub capabilities: Option<Capabilities>,
    /// Options recommended for this server.
    pub recommendations: Vec<String>,
}

impl Report {
    fn row(&mut self, check: &'static str, verdict: Verdict, detail: impl Into<String>) {
        let detail = detail.into();
        self.rows.push(Row {
            check,
            verdict,
            detail,
        });
    }

    /// The verdict of `check`, if it ran (read by `tests/doctor.rs`).
    #[allow(dead_code)]
    pub fn verdict(&self, check: &str) -> Option<Verdict> {
        self.rows
            .iter()
            .find(|r| r.check == check)
            .map(|r| r.verdict)
    }

    /// Whether any check failed.
    pub fn verdict_failed(&self) -> bool {
        self.rows.iter().any(|r| r.verdict == Verdict::Failed)
    }

    /// The table, as printed.
    pub fn table(&self) -> String {
        let width = self.rows.iter().map(|r| r.check.len()).max().unwrap_or(5);
        let mut out = format!("{:width$} | {:9} | detail\n", "check", "verdict");
        out.push_str(&format!(
            "{}-|-{}-|-------\n",
            "-".repeat(width),
            "-".repeat(9)
        ));
        for row in &self.rows {
            let verdict = row.verdict.as_str();
            out.push_str(&format!(
                "{:width$} | {verdict:9} | {}\n",
                row.check, row.detail
            ));
        }
        if !self.recommendations.is_empty() {
            out.push_str("\nrecommended for this server:\n");
            for line in &self.recommendations {
                out.push_str(&format!("- {line}\n"));
            }
        }
        out
    }
}

/// A check's outcome, before it becomes a row.
type Checked = Result<(Verdict, String), String>;

/// Runs `check` under [`CHECK_BOUND`], as one row.
async fn run<F: std::future::Future<Output = Checked>>(
    report: &mut Report,
    name: &'static str,
    check: F,
) {
    match tokio::time::timeout(CHECK_BOUND, check).await {
        Ok(Ok((verdict, detail))) => report.row(name, verdict, detail),
        Ok(Err(why)) => report.row(name, Verdict::Failed, why),
        Err(_) => report.row(
            name,
            Verdict::Failed,
            format!("no answer within {CHECK_BOUND:?}"),
        ),
    }
}

/// The error's message and its first source: what a user needs to see (a refusal's code).
fn said(e: &Error) -> String {
    match std::error::Error::source(e) {
        Some(source) => format!("{e} ({source})"),
        None => e.to_string(),
    }
}

/// A write's outcome as a check reads it (no auto-recovery here: a write is applied or fails).
fn wrote(written: Result<stampede_guard::Written, Error>) -> Result<(), String> {
    written.map(|_| ()).map_err(|e| said(&e))
}

/// Everything the doctor needs to reach the server.
struct Target {
    url: String,
    namespace: String,
    connection: ConnectionOptions,
}

impl Target {
    async fn cache(&self, near: Option<NearCacheOptions>) -> Result<Cache, Error> {
        let mut builder = Cache::builder()
            .redis_url(self.url.clone())
            .namespace(self.namespace.clone())
            .connection(self.connection.clone())
            .options(
                CallOptions::default()
                    .lease(Duration::from_secs(2))
                    .wait_timeout(CHECK_BOUND),
            );
        if let Some(near) = near {
            builder = builder.near_cache(near);
        }
        builder.build().await
    }
}

/// Runs the scenario against `url`.
pub async fn diagnose(url: &str) -> Report {
    let mut report = Report::default();
    let target = Target {
        url: url.to_owned(),
        namespace: format!("stampede-doctor-{}", uuid::Uuid::new_v4().simple()),
        connection: ConnectionOptions::default().connect_timeout(Duration::from_secs(3)),
    };
    let (a, b) = match connect(&mut report, &target).await {
        Some(caches) => caches,
        None => {
            for check in CHECKS {
                report.row(check, Verdict::Skipped, "not run: the server check failed");
            }
            return report;
        }
    };
    round_trip(&mut report, url).await;
    run(&mut report, "single flight", single_flight(&a, &b)).await;
    run(&mut report, "wake-up", wake_up(&a, &b)).await;
    run(&mut report, "lock and fencing", lock_and_fencing(&a)).await;
    run(&mut report, "near tier", near_tier(&target, &a, url)).await;
    run(&mut report, "tags", tags(&a)).await;
    run(&mut report, "batch", batch(&a)).await;
    run(&mut report, "clean-up", clean_up(url, &target.namespace)).await;
    recommend(&mut report);
    report
}

/// Builds the two caches (two connections) and reports what the server allows.
async fn connect(report: &mut Report, target: &Target) -> Option<(Cache, Cache)> {
    let built = tokio::time::timeout(CHECK_BOUND, async {
        Ok::<_, Error>((target.cache(None).await?, target.cache(None).await?))
    })
    .await;
    let (a, b) = match built {
        Ok(Ok(caches)) => caches,
        Ok(Err(e)) => {
            report.row("server", Verdict::Failed, said(&e));
            return None;
        }
        Err(_) => {
            report.row("server", Verdict::Failed, "build() did not return in time");
            return None;
        }
    };
    // Built while the server did not answer: the probe runs at its first answer.
    if a.capabilities().is_none() {
        if let Err(e) = a.get::<u32>("reachable").await {
            report.row("server", Verdict::Failed, said(&e));
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let Some(caps) = a.capabilities() else {
        report.row(
            "server",
            Verdict::Failed,
            "the server did not answer the capability probe",
        );
        return None;
    };
    report.row(
        "server",
        Verdict::Works,
        format!("{} {}", caps.server, caps.version),
    );
    let renewal = caps.renewal();
    let release = caps.release();
    let lua_free = |path: stampede_guard::LockWrite| {
        if path == stampede_guard::LockWrite::Script {
            (
                Verdict::FellBack,
                format!("{path}: one EVALSHA, as on any server with Lua"),
            )
        } else {
            (Verdict::Works, format!("{path}: no Lua"))
        }
    };
    let (verdict, detail) = lua_free(renewal);
    report.row("lock renewal", verdict, detail);
    let (verdict, detail) = lua_free(release);
    report.row("lock release", verdict, detail);
    for line in caps.fallbacks() {
        if !line.contains("IFEQ") && !line.contains("DELEX") {
            report.row("fallback", Verdict::FellBack, line);
        }
    }
    report.capabilities = Some(caps);
    Some((a, b))
}

/// `PING` round trips on a connection of the doctor's own.
async fn round_trip(report: &mut Report, url: &str) {
    let measured = tokio::time::timeout(CHECK_BOUND, async {
        let mut conn = own_connection(url).await?;
        let mut times = Vec::new();
        for _ in 0..20 {
            let start = Instant::now();
            redis::cmd("PING")
                .query_async::<()>(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            times.push(start.elapsed());
        }
        Ok::<_, String>(percentiles(&mut times))
    })
    .await;
    match measured {
        Ok(Ok((p50, p99))) => report.row(
            "round trip",
            Verdict::Works,
            format!("PING p50 {p50:?}, p99 {p99:?} (20)"),
        ),
        Ok(Err(e)) => report.row("round trip", Verdict::Failed, e),
        Err(_) => report.row("round trip", Verdict::Failed, "PING did not answer in time"),
    }
}

/// p50 and p99 of `times` (sorted here).
fn percentiles(times: &mut [Duration]) -> (Duration, Duration) {
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

/// Eight callers on each of two caches (two connections) ask for one missing key: one
/// computation in all.
async fn single_flight(a: &Cache, b: &Cache) -> Checked {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut calls = Vec::new();
    for i in 0..16 {
        let cache = if i % 2 == 0 { a.clone() } else { b.clone() };
        let runs = Arc::clone(&runs);
        calls.push(tokio::spawn(async move {
            cache
                .get_or_compute("single-flight", TTL, || async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Ok::<_, std::io::Error>(42u32)
                })
                .await
        }));
    }
    for call in calls {
        match call.await {
            Ok(Ok(42)) => {}
            Ok(Ok(other)) => return Err(format!("a caller got {other}, not 42")),
            Ok(Err(e)) => return Err(said(&e)),
            Err(e) => return Err(format!("a caller panicked: {e}")),
        }
    }
    computed_once(&runs, "16 callers over 2 connections")
}

/// Works if `runs` counted one computation for `what`.
fn computed_once(runs: &AtomicUsize, what: &str) -> Checked {
    match runs.load(Ordering::SeqCst) {
        1 => Ok((Verdict::Works, format!("{what}: 1 computation"))),
        n => Err(format!("{what}: {n} computations")),
    }
}

/// A connection of the doctor's own, for what no cache call does (`PING`, an outside `DEL`,
/// the clean-up).
async fn own_connection(url: &str) -> Result<redis::aio::MultiplexedConnection, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())
}

/// A waiter on `b` wakes when `a`'s computation stores its value: the time between the two.
async fn wake_up(a: &Cache, b: &Cache) -> Checked {
    let mut times = Vec::new();
    for round in 0..WAKE_ROUNDS {
        let key = format!("wake-{round}");
        let (a, b, leader_key) = (a.clone(), b.clone(), key.clone());
        let leader = tokio::spawn(async move {
            let value = a
                .get_or_compute(&leader_key, TTL, move || async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok::<_, std::io::Error>(round)
                })
                .await;
            (value, Instant::now())
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let waited = b
            .get_or_compute(&key, TTL, || async { Ok::<_, std::io::Error>(usize::MAX) })
            .await
            .map_err(|e| said(&e))?;
        let woke = Instant::now();
        let (led, stored) = leader.await.map_err(|e| e.to_string())?;
        led.map_err(|e| said(&e))?;
        if waited != round {
            return Err(format!(
                "the waiter computed its own value in round {round}: no wake-up"
            ));
        }
        times.push(woke.saturating_duration_since(stored));
    }
    let (p50, p99) = percentiles(&mut times);
    Ok((
        Verdict::Works,
        format!("p50 {p50:?}, p99 {p99:?} ({WAKE_ROUNDS} rounds)"),
    ))
}

/// A lock is exclusive, renewed, released, and its fencing tokens rise.
async fn lock_and_fencing(a: &Cache) -> Checked {
    let lock = a.lock("doctor-lock").map_err(|e| said(&e))?;
    let first = lock.acquire().await.map_err(|e| said(&e))?;
    let token = first.fencing_token();
    if lock.try_acquire().await.map_err(|e| said(&e))?.is_some() {
        return Err("a second holder got the lock while it was held".to_owned());
    }
    if !first.extend().await.map_err(|e| said(&e))? {
        return Err("the holder could not renew its own lock".to_owned());
    }
    first.release().await.map_err(|e| said(&e))?;
    let second = lock.acquire().await.map_err(|e| said(&e))?;
    let next = second.fencing_token();
    second.release().await.map_err(|e| said(&e))?;
    if next <= token {
        return Err(format!("fencing token went from {token} to {next}"));
    }
    Ok((
        Verdict::Works,
        format!("exclusive, renewed, released; token {token} < {next}"),
    ))
}

/// A near tier sees another instance's `set` and an outside `DEL` (tracking), or only the
/// crate's own changes (fallback).
async fn near_tier(target: &Target, a: &Cache, url: &str) -> Checked {
    let near = NearCacheOptions::new(100).max_staleness(MAX_STALENESS);
    let c = target.cache(Some(near)).await.map_err(|e| said(&e))?;
    wrote(a.set("near", &1u32, TTL).await)?;
    let _ = c.get::<u32>("near").await.map_err(|e| said(&e))?;
    wrote(a.set("near", &2u32, TTL).await)?;
    let seen_set =
        eventually(|| async { c.get::<u32>("near").await.ok().flatten() == Some(2) }).await;
    if !seen_set {
        return Err("the near tier kept serving a value another instance replaced".to_owned());
    }
    // An outside DEL of the value key (`ns:{key}`), as another program would.
    let mut conn = own_connection(url).await?;
    let value_key = format!("{}:{{near}}", target.namespace);
    redis::cmd("DEL")
        .arg(&value_key)
        .query_async::<()>(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    let seen_del =
        eventually(|| async { c.get::<u32>("near").await.ok().flatten().is_none() }).await;
    let tracking = c.stats().near_tracking;
    match (tracking, seen_del) {
        (TrackingState::On, true) => Ok((Verdict::Works, "tracking on: another instance's set and an outside DEL seen".to_owned())),
        (TrackingState::On, false) => Err("tracking on, yet an outside DEL was not seen".to_owned()),
        (state, true) => Ok((
            Verdict::FellBack,
            format!("tracking {state}: copies are read again once max_staleness old; an outside DEL was seen within {:?}", 4 * MAX_STALENESS),
        )),
        (state, false) => Err(format!("tracking {state}, and an outside DEL was not seen within {:?}", 4 * MAX_STALENESS)),
    }
}

/// Whether `condition` holds within four times the near tier's bound, polled.
async fn eventually<F, Fut>(condition: F) -> bool
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + 4 * MAX_STALENESS;
    while Instant::now() < deadline {
        if condition().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}

/// A tagged value goes with its tag; an untagged one stays.
async fn tags(a: &Cache) -> Checked {
    let tagged = a.with_options(a.options().clone().tags(["doctor-tag"]));
    wrote(tagged.set("tagged", &1u32, TTL).await)?;
    wrote(a.set("untagged", &2u32, TTL).await)?;
    wrote(a.invalidate_tag("doctor-tag").await)?;
    let gone = a
        .get::<u32>("tagged")
        .await
        .map_err(|e| said(&e))?
        .is_none();
    let kept = a.get::<u32>("untagged").await.map_err(|e| said(&e))? == Some(2);
    match (gone, kept) {
        (true, true) => Ok((
            Verdict::Works,
            "invalidate_tag removed the tagged value only".to_owned(),
        )),
        _ => Err(format!(
            "after invalidate_tag: tagged gone {gone}, untagged kept {kept}"
        )),
    }
}

/// Twelve keys in one batch: one computation for the misses, then all hits.
async fn batch(a: &Cache) -> Checked {
    let keys: Vec<String> = (0..12).map(|i| format!("batch-{i}")).collect();
    let runs = Arc::new(AtomicUsize::new(0));
    for _ in 0..2 {
        let runs = Arc::clone(&runs);
        let answers = a
            .get_or_compute_many(&keys, TTL, move |missing: Vec<String>| {
                runs.fetch_add(1, Ordering::SeqCst);
                async move { Ok::<_, std::io::Error>(missing.into_iter().map(|k| (k.clone(), k.len()))) }
            })
            .await;
        for answer in answers {
            answer.map_err(|e| said(&e))?;
        }
    }
    computed_once(&runs, "12 keys asked twice (then 12 hits)")
}

/// Deletes every key of the doctor's namespace.
async fn clean_up(url: &str, namespace: &str) -> Checked {
    let mut conn = own_connection(url).await?;
    let mut cursor = 0u64;
    let mut deleted = 0usize;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{namespace}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("SCAN: {e}"))?;
        if !keys.is_empty() {
            deleted += keys.len();
            redis::cmd("DEL")
                .arg(&keys)
                .query_async::<()>(&mut conn)
                .await
                .map_err(|e| format!("DEL: {e}"))?;
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    Ok((
        Verdict::Works,
        format!("{deleted} keys of {namespace} deleted"),
    ))
}

/// Options to use on this server, from what the checks found.
fn recommend(report: &mut Report) {
    let Some(caps) = report.capabilities.clone() else {
        return;
    };
    let mut say = |line: &str| report.recommendations.push(line.to_owned());
    if !caps.tracking_bcast
        || report
            .rows
            .iter()
            .any(|r| r.check == "near tier" && r.verdict == Verdict::FellBack)
    {
        say("near tier: tracking is not available; each hot key is read again once per max_staleness, so size max_staleness for that load (docs/near-cache.md)");
    }
    if !caps.wait {
        say("do not set ConnectionOptions::wait_for_replicas (no WAIT)");
    }
    if !caps.config_get {
        say("CONFIG GET is refused: check yourself that maxmemory-policy is noeviction (docs/guarantees.md)");
    }
    if caps.renewal() == stampede_guard::LockWrite::Script {
        say("lock writes run as scripts: on a server that requires declared keys, they declare every key they touch");
    }
    if report.rows.iter().all(|r| r.verdict != Verdict::Failed) {
        say("the defaults (ConnectionOptions::default(), coalesce_reads on) suit this server");
    }
}
