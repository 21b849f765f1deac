//! Runs one plan: the instances over one simulated server on tokio's current-thread runtime
//! with paused time, every random draw of the crate seeded from the plan's seed; records the
//! history the chaos checker judges (calls, computations, critical sections, what the server
//! ran). The same plan gives the same history: nothing here reads the machine's clock or its
//! randomness.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use stampede_guard::__private::sim::{self, Applied, Connection, Network, Server, Skew};
use stampede_guard::__private::{epoch_key, read_stored};
use stampede_guard::leader::{JobContext, Leader, Role};
use stampede_guard::{
    Cache, CallOptions, Computed, Error, Lease, NearCacheOptions, RecoveryOptions, Source, Written,
};

use crate::history::{
    parse_value, tags_label, BumpCause, Call, Change, Compute, Ending, FailoverWindow, History,
    Outcome, Raise, Rollback, Section, ServerEvent, Write,
};
use crate::net::{feed_conn, Net, Rates};
use crate::plan::{Action, Fault, Plan, What, INSTANCES, LEADER};

const NAMESPACE: &str = "sim";
/// The server's wall clock at the start of every schedule (2026-01-01): fixed, not read.
const EPOCH_MS: u64 = 1_767_225_600_000;
const LEASE: Duration = Duration::from_millis(150);
/// The client's response time-out.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(250);
const WAIT_TIMEOUT: Duration = Duration::from_secs(3);
/// The most a call may take: a wait, a computation past a few leases, the retries.
const CALL_BOUND: Duration = Duration::from_secs(10);
/// How many values the server keeps: fewer than the keys and locks, so it evicts.
const MAX_ENTRIES: u64 = 4;
/// A killed instance's connection stays cut this long: past the end of any schedule.
const KILLED_FOR_MS: u64 = 3_600_000;
/// The instances that run a near tier (the others read the server for every call).
pub const NEAR: &[usize] = &[0, 1];
/// Their staleness bound: a heartbeat every quarter of it.
const MAX_STALENESS: Duration = Duration::from_millis(200);
/// How long a feed waits for a heartbeat or a report before it gives its connection up: long,
/// as over a black-holed socket, so the bound rests on the proofs alone.
pub const FEED_GIVES_UP: Duration = Duration::from_secs(1);
/// The near instances that also serve held copies while the server is unreachable
/// (`serve_while_down`), and for how long: rule (g) judges what they serve.
const HOLDS: &[usize] = &[1];
const SERVE_WHILE_DOWN: Duration = Duration::from_millis(300);
/// The bound on each instance's clock (docs/history/simulation.md, "Clocks that drift"): its
/// rate off by up to this many parts per million (NTP's limit on a clock's frequency error;
/// the crate's `time::MAX_DRIFT_PPM`, which its leases and near tier give up), its wall clock
/// off the server's by up to an hour (what docs/guarantees.md promises freshness for).
pub const MAX_DRIFT_PPM: i32 = 500;
pub const MAX_OFFSET_MS: i64 = 3_600_000;

/// Each instance's clock, drawn from the schedule's seed apart from the plan's draws (so a
/// shrunk plan keeps its clocks, and the plan's own draws stay as they were).
pub fn skews(seed: u64) -> Vec<Skew> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xc10c_d21f_7000_0039);
    (0..INSTANCES)
        .map(|_| Skew {
            offset_ms: rng.random_range(-MAX_OFFSET_MS..=MAX_OFFSET_MS),
            ppm: rng.random_range(-MAX_DRIFT_PPM..=MAX_DRIFT_PPM),
        })
        .collect()
}

/// What one instance records, shared by its tasks (all on one thread).
#[derive(Default)]
struct Recorder {
    calls: Vec<Call>,
    computes: Vec<Compute>,
    sections: Vec<Section>,
    next_id: u64,
    sink: HashMap<String, u64>,
}

/// The schedule's shared pieces.
#[derive(Clone)]
struct Ctx {
    server: Arc<Server>,
    log: Arc<Mutex<Recorder>>,
}

/// Each instance's clock: from when, and how fast.
#[derive(Clone)]
struct Clocks {
    base: tokio::time::Instant,
    skews: Vec<Skew>,
}

impl Clocks {
    /// How fast `instance`'s monotonic clock runs (0 when clocks do not drift).
    fn ppm(&self, instance: usize) -> i32 {
        self.skews.get(instance).map_or(0, |skew| skew.ppm)
    }

    /// Spawns `work` of `instance` on its clock (the crate's own tasks for it follow).
    fn spawn<F>(&self, instance: usize, work: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        tokio::spawn(sim::drifted(self.base, self.ppm(instance), work))
    }
}

impl Ctx {
    fn now(&self) -> u64 {
        self.server.now_us()
    }

    fn log(&self) -> std::sync::MutexGuard<'_, Recorder> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn next_id(&self) -> u64 {
        let mut log = self.log();
        log.next_id += 1;
        log.next_id
    }

    /// A call begins: its index in the log.
    fn begin(&self, instance: &str, op: &str, key: &str) -> (usize, u64) {
        let id = self.next_id();
        let start_us = self.now();
        let mut log = self.log();
        log.calls.push(Call {
            instance: instance.to_string(),
            id,
            op: op.to_string(),
            key: key.to_string(),
            start_us,
            end_us: None,
            outcome: Outcome::Pending,
            held: false,
            hit: false,
            source: String::new(),
        });
        (log.calls.len() - 1, id)
    }

    /// A call ends; `source` is where its value came from, and whether from the near tier.
    fn end(&self, at: usize, outcome: Outcome, source: Option<(Source, bool)>) {
        let end = self.now();
        let mut log = self.log();
        let call = &mut log.calls[at];
        call.end_us = Some(end);
        call.outcome = outcome;
        if let Some((source, near)) = source {
            call.held = source == Source::Held;
            call.hit = source == Source::Hit;
            // A near hit is a hit (rule (f) judges it), labelled apart for the timeline.
            call.source = match (source, near) {
                (Source::Hit, true) => "near".to_string(),
                _ => format!("{source:?}").to_lowercase(),
            };
        }
    }

    fn computed(&self, instance: &str, key: &str, token: u64, began: u64, value: &str) {
        let end_us = self.now();
        self.log().computes.push(Compute {
            instance: instance.to_string(),
            key: key.to_string(),
            token,
            start_us: began,
            end_us,
            value: value.to_string(),
        });
    }
}

impl Ctx {
    /// One run of a leader's job at `t0` under `token`: a write to the sink, counted in the
    /// term's section (begun if the term is new); how long the run then works (seeded).
    fn leader_run(
        &self,
        instance: &str,
        term: &Mutex<Option<(u64, usize)>>,
        token: u64,
        asked_us: u64,
        t0: u64,
    ) -> u64 {
        let mut term = term.lock().unwrap_or_else(|p| p.into_inner());
        let id = self.next_id();
        let mut log = self.log();
        let max = log.sink.entry(LEADER.to_string()).or_insert(0);
        let accepted = u32::from(token >= *max);
        *max = (*max).max(token);
        let at = match *term {
            Some((t, at)) if t == token => at,
            _ => {
                log.sections.push(Section {
                    instance: instance.to_string(),
                    id,
                    lock: LEADER.to_string(),
                    token,
                    asked_us,
                    start_us: t0,
                    end_us: t0,
                    writes: 0,
                    accepted: 0,
                });
                *term = Some((token, log.sections.len() - 1));
                log.sections.len() - 1
            }
        };
        let section = &mut log.sections[at];
        section.end_us = t0;
        section.writes += 1;
        section.accepted += accepted;
        // The run's work: 10..80 ms, drawn from the run's id (the plan's own draws stay apart).
        10 + (id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) % 70
    }
}

fn kind(e: &Error) -> String {
    let debug = format!("{e:?}");
    debug
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or("Other")
        .to_string()
}

fn outcome<T: ToString>(got: Result<T, Error>) -> Outcome {
    match got {
        Ok(v) => Outcome::Value(v.to_string()),
        Err(e) => Outcome::Error(kind(&e)),
    }
}

fn done(got: Result<Written, Error>) -> Outcome {
    match got {
        Ok(Written::Queued) => Outcome::Queued,
        Ok(_) => Outcome::Done,
        Err(e) => Outcome::Error(kind(&e)),
    }
}

/// One call of `instance`, recorded as the chaos workers record theirs.
async fn call(ctx: Ctx, cache: Cache, instance: String, action: Action) {
    match action {
        Action::Fetch {
            key,
            compute_ms,
            fail,
            ttl_ms,
            handle_tags,
            computed_tags,
        } => {
            let (at, id) = ctx.begin(&instance, "get_or_compute", &key);
            let handle = with_tags(&cache, &handle_tags);
            let label = tags_label(&[&handle_tags[..], &computed_tags[..]].concat());
            let (inner, k, me) = (ctx.clone(), key.clone(), instance.clone());
            let got = handle
                .fetch(
                    &key,
                    Duration::from_millis(ttl_ms),
                    move |lease: Lease| async move {
                        let began = inner.now();
                        let token = lease.fencing_token().unwrap_or(0);
                        tokio::time::sleep(Duration::from_millis(compute_ms)).await;
                        if fail {
                            return Err("planned failure".to_string());
                        }
                        let value = format!("V|{k}|{token}|{me}|{id}|{label}");
                        inner.computed(&me, &k, token, began, &value);
                        Ok(Computed::new(value).tags(computed_tags))
                    },
                )
                .await;
            let source = got.as_ref().ok().map(|f| (f.source, sim::from_near(f)));
            ctx.end(at, outcome(got.map(|f| f.value)), source);
        }
        Action::Batch {
            keys,
            compute_ms,
            leave_out,
            ttl_ms,
            handle_tags,
        } => {
            batch(
                ctx,
                cache,
                instance,
                keys,
                compute_ms,
                leave_out,
                ttl_ms,
                handle_tags,
            )
            .await
        }
        Action::Set { key, handle_tags } => {
            let (at, id) = ctx.begin(&instance, "set", &key);
            let value = format!("S|{key}|{instance}|{id}|{}", tags_label(&handle_tags));
            let handle = with_tags(&cache, &handle_tags);
            let got = handle.set(&key, &value, Duration::from_millis(1500)).await;
            ctx.end(at, done(got), None);
        }
        Action::Invalidate { key } => {
            let (at, _) = ctx.begin(&instance, "invalidate", &key);
            let got = cache.invalidate(&key).await;
            ctx.end(at, done(got), None);
        }
        Action::InvalidateTag { tag } => {
            let (at, _) = ctx.begin(&instance, "invalidate_tag", &tag);
            let got = cache.invalidate_tag(&tag).await;
            ctx.end(at, done(got), None);
        }
        Action::Clear => {
            let (at, _) = ctx.begin(&instance, "clear", "*");
            let got = cache.clear().await;
            ctx.end(at, done(got), None);
        }
        Action::Lock { name, holds_ms } => section(ctx, cache, instance, name, holds_ms).await,
        // Started by `drive`, which holds its shutdown.
        Action::Lead => {}
    }
}

/// How often an active leader runs its job.
const LEADER_EVERY: Duration = Duration::from_millis(30);

/// A `Leader` on [`LEADER`] until `stop` says so: each run of its job checks that the lease
/// holds, writes to the fenced sink and works a seeded while; one section per term (fencing
/// token), as the chaos workers record theirs, judged by rules (a) and (b) as a lock's.
async fn lead(
    ctx: Ctx,
    cache: Cache,
    instance: String,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let Ok(lock) = cache.lock(LEADER) else {
        return;
    };
    let leader = Leader::new(lock, LEADER_EVERY);
    // When the instance last went to standby: no later than its request of the lock that its
    // next term holds (the section's "asked" time, from which a loss of the lock counts).
    let standby_since = Arc::new(AtomicU64::new(ctx.now()));
    let mut status = leader.status();
    let (watcher, since) = (ctx.clone(), Arc::clone(&standby_since));
    let watching = tokio::spawn(async move {
        while status.changed().await.is_ok() {
            if *status.borrow_and_update() == Role::Standby {
                since.store(watcher.now(), Ordering::Relaxed);
            }
        }
    });
    // The term's section in the log, by token.
    let term: Arc<Mutex<Option<(u64, usize)>>> = Arc::default();
    let job = move |job: JobContext| {
        let (ctx, term, me) = (ctx.clone(), Arc::clone(&term), instance.clone());
        let asked_us = standby_since.load(Ordering::Relaxed);
        async move {
            let t0 = ctx.now();
            if job.is_cancelled() {
                return Ok::<(), String>(());
            }
            let token = job.fencing_token();
            let pause = ctx.leader_run(&me, &term, token, asked_us, t0);
            tokio::time::sleep(Duration::from_millis(pause)).await;
            Ok(())
        }
    };
    let shutdown = async move {
        let _ = stop.wait_for(|stopped| *stopped).await;
    };
    let _ = leader.run(job, shutdown).await;
    watching.abort();
}

/// The handle that gives values these tags.
fn with_tags(cache: &Cache, tags: &[String]) -> Cache {
    if tags.is_empty() {
        return cache.clone();
    }
    cache.with_options(cache.options().clone().tags(tags.to_vec()))
}

/// One `fetch_many`, recorded as one call per key asked.
#[allow(clippy::too_many_arguments)]
async fn batch(
    ctx: Ctx,
    cache: Cache,
    instance: String,
    keys: Vec<String>,
    compute_ms: u64,
    leave_out: bool,
    ttl_ms: u64,
    handle_tags: Vec<String>,
) {
    let started: Vec<(usize, u64)> = keys
        .iter()
        .map(|key| ctx.begin(&instance, "batch", key))
        .collect();
    let label = tags_label(&handle_tags);
    let left_out = leave_out.then(|| keys[0].clone());
    let (inner, me) = (ctx.clone(), instance.clone());
    let handle = with_tags(&cache, &handle_tags);
    let got = handle
        .fetch_many(
            &keys,
            Duration::from_millis(ttl_ms),
            move |locked: Vec<(String, Lease)>| {
                let (ctx, me, label, left_out) =
                    (inner.clone(), me.clone(), label.clone(), left_out.clone());
                async move {
                    let began = ctx.now();
                    tokio::time::sleep(Duration::from_millis(compute_ms)).await;
                    let mut values = Vec::new();
                    for (key, lease) in locked {
                        if left_out.as_ref() == Some(&key) {
                            continue;
                        }
                        let token = lease.fencing_token().unwrap_or(0);
                        let value = format!("V|{key}|{token}|{me}|{}|{label}", ctx.next_id());
                        ctx.computed(&me, &key, token, began, &value);
                        values.push((key, Computed::new(value)));
                    }
                    Ok::<_, String>(values)
                }
            },
        )
        .await;
    for ((at, _), result) in started.into_iter().zip(got) {
        let source = result.as_ref().ok().map(|f| (f.source, sim::from_near(f)));
        ctx.end(at, outcome(result.map(|f| f.value)), source);
    }
}

/// A critical section under a `Lock`: before each write to the fenced sink, a check that the
/// lease is still valid.
async fn section(ctx: Ctx, cache: Cache, instance: String, name: String, holds_ms: Vec<u64>) {
    let Ok(lock) = cache.lock(&name) else {
        return;
    };
    let id = ctx.next_id();
    let asked_us = ctx.now();
    let Ok(guard) = lock.acquire().await else {
        return;
    };
    let token = guard.fencing_token();
    let start_us = ctx.now();
    let (mut end_us, mut writes, mut accepted) = (start_us, 0, 0);
    for hold in holds_ms {
        let t0 = ctx.now();
        if !guard.is_held() {
            break;
        }
        end_us = t0;
        writes += 1;
        {
            let mut log = ctx.log();
            let max = log.sink.entry(name.clone()).or_insert(0);
            if token >= *max {
                *max = token;
                accepted += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(hold)).await;
    }
    let _ = guard.release().await;
    ctx.log().sections.push(Section {
        instance,
        id,
        lock: name,
        token,
        asked_us,
        start_us,
        end_us,
        writes,
        accepted,
    });
}

/// What a run of a plan left: the history, and the server's record as lines (for the
/// determinism test and the timeline).
pub struct Ran {
    pub history: History,
    /// What the instances' own counters say the run did, by name (`Cache::stats`): the near
    /// tiers' hits, the queued writes replayed, for the census.
    pub counted: Vec<(&'static str, u64)>,
}

/// The instances' caches, one connection each, each built on its own clock.
async fn instances(server: &Arc<Server>, net: &Net, clocks: &Clocks) -> Vec<Cache> {
    let options = CallOptions::default()
        .lease(LEASE)
        .wait_timeout(WAIT_TIMEOUT)
        .stale_for(Duration::from_millis(100))
        .early_refresh(1.0);
    let mut caches = Vec::new();
    for i in 0..INSTANCES {
        let connection = Connection::new(
            Arc::clone(server),
            Arc::new(net.clone()),
            i as u64,
            RESPONSE_TIMEOUT,
        )
        .with_feed(feed_conn(i) as u64, FEED_GIVES_UP);
        let connection = match clocks.skews.get(i) {
            Some(skew) => connection.with_skew(*skew),
            None => connection,
        };
        let mut builder = sim::builder(connection)
            .namespace(NAMESPACE)
            .options(options.clone())
            .auto_recovery(RecoveryOptions::default());
        if NEAR.contains(&i) {
            let mut near = NearCacheOptions::new(100).max_staleness(MAX_STALENESS);
            if HOLDS.contains(&i) {
                near = near.serve_while_down(SERVE_WHILE_DOWN);
            }
            builder = builder.near_cache(near);
        }
        let built = sim::drifted(clocks.base, clocks.ppm(i), builder.build()).await;
        let cache = built.expect("a simulated cache builds");
        caches.push(cache);
    }
    caches
}

/// Runs `plan` and records its history.
pub fn run(plan: &Plan, rates: Rates) -> Ran {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    sim::seed_thread(Some(plan.seed));
    let ran = runtime.block_on(drive(plan, rates));
    sim::seed_thread(None);
    ran
}

async fn drive(plan: &Plan, rates: Rates) -> Ran {
    let clocks = Clocks {
        base: tokio::time::Instant::now(),
        skews: match plan.clocks_drift {
            true => skews(plan.seed),
            false => Vec::new(),
        },
    };
    let server = Server::new(MAX_ENTRIES, EPOCH_MS);
    let net = Net::new(plan.seed, INSTANCES, rates, Arc::clone(&server));
    let caches = instances(&server, &net, &clocks).await;
    let ctx = Ctx {
        server: Arc::clone(&server),
        log: Arc::default(),
    };
    let start = tokio::time::Instant::now();
    // Each instance's call tasks, and whether it was killed.
    let mut tasks: Vec<Vec<tokio::task::JoinHandle<()>>> =
        (0..INSTANCES).map(|_| Vec::new()).collect();
    let mut killed = [false; INSTANCES];
    // Each instance's leaders, told to shut down once the plan's steps are done.
    let mut leaders: Vec<Vec<tokio::task::JoinHandle<()>>> =
        (0..INSTANCES).map(|_| Vec::new()).collect();
    let stop_leaders = tokio::sync::watch::Sender::new(false);
    // Where each restart falls in the server's record, and when.
    let mut restarts: Vec<(usize, u64)> = Vec::new();
    // When the replica catches up (each failover's lag before it), and where in the server's
    // record it last did: what a failover keeps.
    let mut syncs = plan.replica_syncs().into_iter().peekable();
    let mut synced = 0;
    let mut failovers: Vec<FailedOver> = Vec::new();
    for step in &plan.steps {
        while let Some(at_ms) = syncs.next_if(|at| *at <= step.at_ms) {
            tokio::time::sleep_until(start + Duration::from_millis(at_ms)).await;
            server.sync_replica();
            synced = net.applied().len();
        }
        tokio::time::sleep_until(start + Duration::from_millis(step.at_ms)).await;
        match &step.what {
            What::Call { instance, .. } if killed[*instance] => {}
            What::Call { instance, action } => {
                let (cache, me) = (caches[*instance].clone(), format!("i{instance}"));
                // A leader runs until the schedule's end; a call ends by itself.
                let (started, task) = match action {
                    Action::Lead => {
                        let stop = stop_leaders.subscribe();
                        (
                            &mut leaders,
                            clocks.spawn(*instance, lead(ctx.clone(), cache, me, stop)),
                        )
                    }
                    _ => {
                        let work = call(ctx.clone(), cache, me, action.clone());
                        (&mut tasks, clocks.spawn(*instance, work))
                    }
                };
                started[*instance].push(task);
            }
            What::Fault(Fault::Kill(i)) => {
                // Nothing of it reaches the server any more (a killed process cleans nothing
                // up: its locks run out with their leases), then its tasks stop.
                net.cut(*i, KILLED_FOR_MS);
                killed[*i] = true;
                for task in tasks[*i].iter().chain(&leaders[*i]) {
                    task.abort();
                }
            }
            What::Fault(Fault::Freeze(ms)) => net.freeze(*ms),
            What::Fault(Fault::Restart) => {
                restarts.push((net.applied().len(), ctx.now()));
                server.restart_empty();
                synced = net.applied().len();
            }
            What::Fault(Fault::Failover { .. }) => {
                let failed_over = fail_over(&server, &net, synced, ctx.now());
                synced = failed_over.index;
                failovers.push(failed_over);
            }
            What::Fault(Fault::Drop(i)) => net.drop_connection(*i),
            What::Fault(Fault::OutsideDelete(key)) => {
                outside(&net, server.outside_delete(NAMESPACE, key))
            }
            What::Fault(Fault::OutsideSet { key, bytes, ttl_ms }) => outside(
                &net,
                server.outside_set(NAMESPACE, key, bytes.as_bytes(), *ttl_ms),
            ),
            What::Fault(Fault::OutsideExpire(key, ms)) => {
                if let Some(change) = server.outside_expire(NAMESPACE, key, *ms) {
                    outside(&net, Some(change));
                    tokio::spawn(expire_when_due(
                        server.clone(),
                        net.clone(),
                        key.clone(),
                        *ms,
                    ));
                }
            }
            What::Fault(Fault::FlushDb) => {
                // Every lock and epoch goes, as in a restart: the checker counts it as a new
                // life of the server (as the chaos test counts its outside writer's flush).
                restarts.push((net.applied().len(), ctx.now()));
                outside(&net, Some(server.flushdb()));
                synced = net.applied().len();
            }
            What::Fault(Fault::Cut(i, ms)) => net.cut(*i, *ms),
            What::Fault(Fault::CutCalls(i, ms)) => net.cut_calls(*i, *ms),
        }
    }
    // The leaders shut down (releasing their lock) with the schedule's last step.
    stop_leaders.send_replace(true);
    // Every call ends within its bound; one that does not stays unended, and rule (d) says so.
    let _ = tokio::time::timeout(CALL_BOUND * 2, async {
        for task in tasks.into_iter().chain(leaders).flatten() {
            let _ = task.await;
        }
    })
    .await;
    // Background work (renewals, releases) settles, then each instance reports its flights.
    tokio::time::sleep(LEASE * 4).await;
    let endings = caches
        .iter()
        .enumerate()
        .map(|(i, cache)| Ending {
            instance: format!("i{i}"),
            killed: killed[i],
            clean_exit: !killed[i],
            in_flight: Some(cache.in_flight()),
        })
        .collect();
    let log = std::mem::take(&mut *ctx.log());
    let (server_events, changes) = server_record(&net.applied(), &restarts, &failovers);
    let history = History {
        calls: log.calls,
        computes: log.computes,
        sections: log.sections,
        server: server_events,
        restarts_us: restarts.iter().map(|(_, at)| *at).collect(),
        endings,
        lease_ms: LEASE.as_millis() as u64,
        near_instances: NEAR
            .iter()
            .map(|i| (format!("i{i}"), MAX_STALENESS.as_micros() as u64))
            .collect(),
        held_bounds: HOLDS
            .iter()
            .map(|i| (format!("i{i}"), SERVE_WHILE_DOWN.as_micros() as u64))
            .collect(),
        call_bound_us: CALL_BOUND.as_micros() as u64,
        changes,
        failovers: failovers.iter().map(FailedOver::window).collect(),
        ..History::default()
    };
    let mut counted = counted(&caches);
    counted.extend(outside_counted(&net.applied()));
    Ran { history, counted }
}

/// The connection the outside writer's changes are recorded under: none of an instance's.
const OUTSIDE: u64 = u64::MAX;

/// Records an outside write the server ran, in the server's order.
fn outside(net: &Net, change: Option<Applied>) {
    if let Some(change) = change {
        Network::applied(net, OUTSIDE, change);
    }
}

/// A shortened life falls due `ms` later: the expiry is recorded (and reported) then, if the
/// value is gone.
async fn expire_when_due(server: Arc<Server>, net: Net, key: String, ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    outside(&net, server.expire_due(NAMESPACE, &key));
}

/// The outside writes the server ran, by kind, for the census.
fn outside_counted(applied: &[(u64, u64, Applied)]) -> Vec<(&'static str, u64)> {
    let count = |f: fn(&Applied) -> bool| {
        applied
            .iter()
            .filter(|(_, conn, change)| *conn == OUTSIDE && f(change))
            .count() as u64
    };
    vec![
        (
            "outside sets",
            count(|c| matches!(c, Applied::OutsideSet { .. })),
        ),
        (
            "outside expiries",
            count(|c| matches!(c, Applied::Expired { .. })),
        ),
        ("flushes", count(|c| matches!(c, Applied::Flushed))),
    ]
}

/// The instances' counters the census asks for, summed.
fn counted(caches: &[Cache]) -> Vec<(&'static str, u64)> {
    let stats: Vec<_> = caches.iter().map(Cache::stats).collect();
    let sum = |f: fn(&stampede_guard::Stats) -> u64| stats.iter().map(f).sum();
    vec![
        ("near hits", sum(|s| s.near_hits)),
        ("replayed writes", sum(|s| s.recovery_replayed)),
        ("held", sum(|s| s.held_served)),
    ]
}

/// A failover to the lagging replica, as the run saw it: where it fell in the server's
/// record, where the replica had last caught up, and each key's fencing counter before and
/// after it, with the value it left.
struct FailedOver {
    index: usize,
    at_us: u64,
    synced: usize,
    keys: Vec<String>,
    from: Vec<Option<u64>>,
    kept: Vec<(Option<u64>, Option<Vec<u8>>)>,
}

/// Fails the server over to its replica and closes every connection, as clients of a
/// master that went away see it; what it lost, for the history.
fn fail_over(server: &Server, net: &Net, synced: usize, at_us: u64) -> FailedOver {
    let applied = net.applied();
    let mut keys: Vec<String> = applied.iter().filter_map(|(_, _, a)| key_of(a)).collect();
    keys.sort();
    keys.dedup();
    let from = keys
        .iter()
        .map(|k| server.fence_and_value(NAMESPACE, k).0)
        .collect();
    server.fail_over();
    for conn in 0..INSTANCES * 2 {
        net.drop_connection(conn);
    }
    let kept = keys
        .iter()
        .map(|k| server.fence_and_value(NAMESPACE, k))
        .collect();
    FailedOver {
        index: applied.len(),
        at_us,
        synced,
        keys,
        from,
        kept,
    }
}

/// The entry a change is of, if any.
fn key_of(change: &Applied) -> Option<String> {
    match change {
        Applied::Acquired { key, .. }
        | Applied::Written { key, .. }
        | Applied::Deleted { key }
        | Applied::Set { key, .. }
        | Applied::Invalidated { key }
        | Applied::Bumped { key }
        | Applied::OutsideDeleted { key }
        | Applied::OutsideSet { key }
        | Applied::OutsideExpire { key, .. }
        | Applied::Expired { key } => Some(key.clone()),
        Applied::Raised { .. } | Applied::Flushed => None,
    }
}

impl FailedOver {
    /// The checker's window: the one server fails over every key, lock and epoch at once.
    fn window(&self) -> FailoverWindow {
        FailoverWindow {
            from_us: self.at_us,
            to_us: self.at_us,
            kind: "replica_lag".to_string(),
            tags: crate::plan::hash_tags(),
        }
    }

    /// What it did to each key, as the chaos replay proves a failover's effect: the counter
    /// the new master goes on from, the acquisitions it lost (whose tokens it may hand out
    /// again), the last bump it kept; and each key's value going back.
    /// `undone`: what earlier failovers lost (their replica's copy to their switch), which no
    /// replica after them holds.
    fn record(
        &self,
        applied: &[(u64, u64, Applied)],
        lives: &[usize],
        undone: &[std::ops::Range<usize>],
        events: &mut Vec<ServerEvent>,
        changes: &mut Vec<Change>,
    ) {
        // Bumps before the replica's copy count from the server's last new life before it.
        let life_start = lives.iter().copied().filter(|&at| at <= self.synced).max();
        let kept_from = life_start.unwrap_or(0);
        for (i, key) in self.keys.iter().enumerate() {
            let (to, value) = &self.kept[i];
            let bumps = |range: std::ops::Range<usize>| {
                let start = range.start;
                applied[range]
                    .iter()
                    .enumerate()
                    .filter(move |(at, _)| !undone.iter().any(|lost| lost.contains(&(start + at))))
                    .filter_map(move |(_, (_, _, a))| bump_of(a, key))
            };
            let lost = bumps(self.synced..self.index)
                .filter_map(|(token, what)| token.map(|t| (t, what)))
                .collect();
            let survivor = bumps(kept_from..self.synced).next_back();
            events.push(ServerEvent::Rollback(Rollback {
                key: key.clone(),
                at_us: self.at_us,
                to: *to,
                reseeded: false,
                // A counter the replica never had is seeded again from the clock at the next
                // bump: above every token before.
                raised: to.is_none(),
                from: self.from[i],
                lost,
                survivor,
            }));
            let value = value
                .as_deref()
                .and_then(|bytes| read_stored::<String>(bytes).ok())
                .and_then(|stored| stored.value);
            changes.push(Change {
                key: key.clone(),
                at_us: self.at_us,
                value,
            });
        }
    }
}

/// A bump of `key`'s fencing counter: an acquisition's token, or what else bumped it.
fn bump_of(change: &Applied, key: &str) -> Option<(Option<u64>, &'static str)> {
    match change {
        Applied::Acquired { key: k, token } if k == key => Some((Some(*token), "acquisition")),
        Applied::Set { key: k, .. } | Applied::Bumped { key: k } if k == key => Some((None, "set")),
        Applied::Invalidated { key: k } if k == key => Some((None, "invalidation")),
        _ => None,
    }
}

/// The server's record in the checker's terms, restarts and failovers in their places.
fn server_record(
    applied: &[(u64, u64, Applied)],
    restarts: &[(usize, u64)],
    failovers: &[FailedOver],
) -> (Vec<ServerEvent>, Vec<Change>) {
    let mut events = Vec::new();
    let mut changes = Vec::new();
    let mut life = 0;
    let lives: Vec<usize> = restarts.iter().map(|(at, _)| *at).collect();
    let mut restarts = restarts.iter().peekable();
    let mut failovers = failovers.iter().peekable();
    let mut undone = Vec::new();
    for i in 0..=applied.len() {
        // A failover and a restart at one place: the run ran them in the plan's order, and a
        // restart (or flush) right after a failover empties what it kept either way.
        while let Some(f) = failovers.next_if(|f| f.index <= i) {
            f.record(applied, &lives, &undone, &mut events, &mut changes);
            undone.push(f.synced..f.index);
        }
        while restarts.next_if(|(at, _)| *at <= i).is_some() {
            life += 1;
            events.push(ServerEvent::Life(life));
        }
        let Some((at_us, _conn, change)) = applied.get(i) else {
            break;
        };
        let at_us = *at_us;
        match change {
            Applied::Acquired { key, token } => events.push(ServerEvent::Acquire {
                key: key.clone(),
                token: *token,
            }),
            Applied::Written { key, bytes } => {
                if let Some(e) = write(key, bytes, true, at_us, &mut changes) {
                    events.push(e);
                }
            }
            Applied::Set { key, bytes } => {
                events.push(ServerEvent::Bump {
                    key: key.clone(),
                    cause: BumpCause::Set,
                });
                if let Some(e) = write(key, bytes, false, at_us, &mut changes) {
                    events.push(e);
                }
            }
            Applied::Invalidated { key } => {
                events.push(ServerEvent::Bump {
                    key: key.clone(),
                    cause: BumpCause::Invalidate,
                });
                changes.push(Change {
                    key: key.clone(),
                    at_us,
                    value: None,
                });
            }
            Applied::Deleted { key } => {
                events.push(ServerEvent::Delete { key: key.clone() });
                changes.push(Change {
                    key: key.clone(),
                    at_us,
                    value: None,
                });
            }
            Applied::Bumped { key } => events.push(ServerEvent::Bump {
                key: key.clone(),
                cause: BumpCause::Set,
            }),
            // Another program's change: no value of the crate's, so no write to judge, but a
            // change every near copy must hear of (rule (f)), as in the chaos replay.
            Applied::OutsideDeleted { key }
            | Applied::OutsideSet { key }
            | Applied::Expired { key } => changes.push(Change {
                key: key.clone(),
                at_us,
                value: None,
            }),
            // The value stays until it expires.
            Applied::OutsideExpire { .. } => {}
            Applied::Flushed => {
                let mut keys: Vec<String> = changes.iter().map(|c| c.key.clone()).collect();
                keys.sort();
                keys.dedup();
                changes.extend(keys.into_iter().map(|key| Change {
                    key,
                    at_us,
                    value: None,
                }));
            }
            Applied::Raised { name, value } => match epoch_key(NAMESPACE, name) {
                Some(epoch) => events.push(ServerEvent::Raise(Raise {
                    epoch,
                    value: *value,
                    at_us,
                    announced: true,
                })),
                None => events.push(ServerEvent::Unreadable {
                    key: name.clone(),
                    reason: "not an epoch of the namespace".to_string(),
                }),
            },
        }
    }
    (events, changes)
}

/// A write the server accepted, read back as the cache reads it. A remembered failure is no
/// value: it is left out, as the chaos replay leaves it out.
fn write(
    key: &str,
    bytes: &[u8],
    computed: bool,
    at_us: u64,
    changes: &mut Vec<Change>,
) -> Option<ServerEvent> {
    let stored = match read_stored::<String>(bytes) {
        Ok(stored) => stored,
        Err(reason) => {
            return Some(ServerEvent::Unreadable {
                key: key.to_string(),
                reason,
            })
        }
    };
    let value = stored.value?;
    changes.push(Change {
        key: key.to_string(),
        at_us,
        value: Some(value.clone()),
    });
    let token = if computed {
        parse_value(&value).map_or(0, |p| p.token)
    } else {
        0
    };
    Some(ServerEvent::Write(Write {
        key: key.to_string(),
        computed,
        token,
        fence: stored.fence,
        counter: Some(stored.fence),
        value,
        born: stored.born,
        tags: stored.tags,
        at_us,
    }))
}
