//! Leader election across real OS processes on a real redis-server: kill -9, SIGSTOP past the
//! lease, a Redis restart, and a graceful hand-over. Every job run appends its record through a
//! store that checks fencing tokens; the history is then checked for overlap and token order.

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod clock;
    pub mod poll;
    pub mod process;
    pub mod runtime;
    pub mod server;
    pub mod signal;
    pub mod worker;
    pub use {clock::*, poll::*, process::*, runtime::*, server::*, signal::*, worker::*};
}

use std::time::{Duration, Instant};

use stampede_guard::leader::{JobContext, Leader, Role};
use stampede_guard::{CallOptions, Lock};
use support::runtime;
use support::{eventually, now_us, signal, RedisServer, Worker};

fn main() {
    support::run_child_or_tests(
        "leader_processes",
        &[
            (
                "a_killed_leader_is_replaced_within_lease_and_one_backoff_step",
                killed_leader,
            ),
            (
                "a_leader_killed_right_after_a_run_is_replaced_on_schedule",
                killed_right_after_a_run,
            ),
            (
                "a_paused_leader_notices_the_loss_and_its_late_write_is_refused",
                paused_leader,
            ),
            (
                "a_redis_restart_ends_with_exactly_one_active",
                redis_restart,
            ),
            (
                "a_graceful_shutdown_hands_over_without_waiting_for_the_lease",
                graceful_handover,
            ),
            (
                "five_processes_contending_for_a_redlock_never_hold_it_together",
                redlock_contention,
            ),
        ],
        instance,
    );
}

/// The store the jobs write to: it accepts a record only if its fencing token is at least the
/// highest one it has accepted, and logs every attempt (accepted or not) to `history`.
const FENCED_APPEND: &str = r"
local max = tonumber(redis.call('GET', KEYS[1]) or '0')
local accepted = 0
if tonumber(ARGV[2]) >= max then
  redis.call('SET', KEYS[1], ARGV[2])
  accepted = 1
end
redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. ARGV[4] .. ' ' .. accepted)
return accepted
";

#[derive(Debug, Clone, PartialEq)]
struct Run {
    instance: String,
    token: u64,
    start: u64,
    end: u64,
    accepted: bool,
}

fn history(server: &RedisServer) -> Vec<Run> {
    let mut conn = server.conn();
    let lines: Vec<String> = redis::cmd("LRANGE")
        .arg("history")
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .unwrap();
    lines
        .iter()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Run {
                instance: f[0].to_string(),
                token: f[1].parse().unwrap(),
                start: f[2].parse().unwrap(),
                end: f[3].parse().unwrap(),
                accepted: f[4] == "1",
            }
        })
        .collect()
}

/// No two accepted runs overlap in time, and tokens never go down; they rise with each new term.
fn check_history(runs: &[Run]) {
    let mut accepted: Vec<&Run> = runs.iter().filter(|r| r.accepted).collect();
    accepted.sort_by_key(|r| r.start);
    assert!(!accepted.is_empty(), "no accepted run at all");
    for pair in accepted.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        assert!(a.end <= b.start, "accepted runs overlap: {a:?} and {b:?}");
        assert!(a.token <= b.token, "tokens went down: {a:?} then {b:?}");
        if a.instance != b.instance {
            assert!(
                a.token < b.token,
                "a new leader reused a token: {a:?} then {b:?}"
            );
        }
    }
}

fn spawn_instances(server: &RedisServer, n: usize, lease_ms: u64) -> Vec<Worker> {
    spawn_scheduled(server, n, lease_ms, 100)
}

/// Instances that run the job every `every_ms`.
fn spawn_scheduled(server: &RedisServer, n: usize, lease_ms: u64, every_ms: u64) -> Vec<Worker> {
    (0..n)
        .map(|i| {
            Worker::spawn(
                "leader",
                &[
                    ("STAMPEDE_URL", server.url()),
                    ("INSTANCE", format!("i{i}")),
                    ("LEASE_MS", lease_ms.to_string()),
                    ("EVERY_MS", every_ms.to_string()),
                ],
            )
        })
        .collect()
}

/// Indexes of the instances whose last reported role is active.
fn active(instances: &[Worker]) -> Vec<usize> {
    instances
        .iter()
        .enumerate()
        .filter(|(_, w)| {
            w.last("ROLE ")
                .is_some_and(|(_, l)| l.starts_with("ROLE active"))
        })
        .map(|(i, _)| i)
        .collect()
}

fn wait_for_one_active(instances: &[Worker], limit: Duration) -> usize {
    let mut found = None;
    assert!(
        eventually(limit, || {
            let a = active(instances);
            found = a.first().copied();
            a.len() == 1
        }),
        "no single active instance within {limit:?}"
    );
    found.unwrap()
}

fn killed_leader() {
    let server = RedisServer::start();
    let lease = Duration::from_secs(1);
    let mut instances = spawn_instances(&server, 3, lease.as_millis() as u64);
    let first = wait_for_one_active(&instances, Duration::from_secs(30));
    assert!(
        eventually(Duration::from_secs(10), || !history(&server).is_empty()),
        "no job run"
    );
    std::thread::sleep(Duration::from_millis(700));
    let killed = Instant::now();
    signal(instances[first].pid(), "KILL");
    let _ = instances[first].child.wait();
    let mut takeover = None;
    assert!(
        eventually(Duration::from_secs(30), || {
            takeover = instances
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != first)
                .filter_map(|(_, w)| w.last("ROLE active"))
                .map(|(at, _)| at)
                .find(|at| *at > killed);
            takeover.is_some()
        }),
        "no instance took over"
    );
    let took = takeover.unwrap() - killed;
    let bound = lease + CallOptions::default().get_backoff().max();
    println!("takeover after kill -9: {took:?} (lease {lease:?})");
    assert!(
        took < bound,
        "takeover took {took:?}, over lease + one backoff step ({bound:?})"
    );
    std::thread::sleep(Duration::from_millis(500));
    for (i, w) in instances.iter_mut().enumerate() {
        if i != first {
            signal(w.pid(), "TERM");
            assert!(w.wait_success(), "instance {i} did not shut down cleanly");
        }
    }
    check_history(&history(&server));
}

/// The schedule survives the leader: killed right after a run, its successor takes over within a
/// lease but runs the job one interval after that run, not at once (a daily job would otherwise
/// run twice in one day).
fn killed_right_after_a_run() {
    let server = RedisServer::start();
    let every = Duration::from_secs(3);
    let mut instances = spawn_scheduled(&server, 2, 1000, every.as_millis() as u64);
    let first = wait_for_one_active(&instances, Duration::from_secs(30));
    // A run is recorded 400 ms into it; kill the leader as soon as one is.
    assert!(
        eventually(Duration::from_secs(10), || !history(&server).is_empty()),
        "no job run"
    );
    signal(instances[first].pid(), "KILL");
    let _ = instances[first].child.wait();
    let other = format!("i{}", 1 - first);
    assert!(
        eventually(Duration::from_secs(30), || history(&server)
            .iter()
            .any(|r| r.instance == other)),
        "the standby never ran the job"
    );
    signal(instances[1 - first].pid(), "TERM");
    assert!(instances[1 - first].wait_success());
    let runs = history(&server);
    let last_killed = runs
        .iter()
        .filter(|r| r.instance != other)
        .map(|r| r.start)
        .max();
    let first_new = runs
        .iter()
        .filter(|r| r.instance == other)
        .map(|r| r.start)
        .min();
    let gap = first_new.unwrap() - last_killed.unwrap();
    println!("first run of the new leader {gap} ms after the last run (interval {every:?})");
    // Both starts are this machine's wall clock, each read after a round trip to the server that
    // keeps the schedule: allow for that latency on a loaded machine (the bug this guards
    // against runs the job a whole interval early, right after the takeover).
    assert!(
        gap + 100 >= every.as_millis() as u64,
        "the new leader ran {gap} ms after the last run, inside the {every:?} interval: {runs:?}"
    );
    check_history(&runs);
}

fn paused_leader() {
    let server = RedisServer::start();
    let lease = Duration::from_secs(1);
    let mut instances = spawn_instances(&server, 2, lease.as_millis() as u64);
    let a = wait_for_one_active(&instances, Duration::from_secs(30));
    let mut conn = server.conn();
    let marker = format!("inrun:i{a}");
    // Pause the active instance early in a run (its write is due 400 ms in).
    assert!(eventually(Duration::from_secs(10), || {
        let started: Option<u64> = redis::cmd("GET").arg(&marker).query(&mut conn).unwrap();
        started.is_some_and(|ms| (now_us() / 1000).saturating_sub(ms) < 100)
    }));
    signal(instances[a].pid(), "STOP");
    let stopped_ms = now_us() / 1000;
    let b = 1 - a;
    assert!(
        eventually(Duration::from_secs(10), || instances[b]
            .last("ROLE active")
            .is_some()),
        "the standby did not take over from the paused leader"
    );
    std::thread::sleep(lease * 2);
    let resumed = Instant::now();
    signal(instances[a].pid(), "CONT");
    assert!(
        eventually(Duration::from_secs(10), || instances[a]
            .last("ROLE ")
            .is_some_and(|(at, l)| at > resumed && l == "ROLE standby")),
        "the resumed instance did not step down"
    );
    std::thread::sleep(Duration::from_millis(1000));
    for w in instances.iter_mut() {
        signal(w.pid(), "TERM");
        assert!(w.wait_success(), "an instance did not shut down cleanly");
    }
    let runs = history(&server);
    let name = format!("i{a}");
    let late: Vec<&Run> = runs
        .iter()
        .filter(|r| r.instance == name && r.start < stopped_ms && r.end > stopped_ms)
        .collect();
    assert_eq!(
        late.len(),
        1,
        "the paused run's write is recorded: {runs:?}"
    );
    assert!(
        !late[0].accepted,
        "the late write was refused by the fencing check: {runs:?}"
    );
    let resumed_ms = stopped_ms + (lease * 2).as_millis() as u64;
    assert!(
        !runs
            .iter()
            .any(|r| r.instance == name && r.start > resumed_ms),
        "the resumed instance started a run without the lock: {runs:?}"
    );
    check_history(&runs);
}

fn redis_restart() {
    let mut server = RedisServer::start();
    let lease = Duration::from_secs(1);
    let mut instances = spawn_instances(&server, 3, lease.as_millis() as u64);
    wait_for_one_active(&instances, Duration::from_secs(30));
    let restarted = Instant::now();
    server.restart();
    // Everyone notices the lost lock key and competes again; exactly one wins.
    assert!(
        eventually(Duration::from_secs(30), || {
            let a = active(&instances);
            a.len() == 1
                && instances[a[0]]
                    .last("ROLE active")
                    .is_some_and(|(at, _)| at > restarted)
        }),
        "no single new leader after the restart"
    );
    std::thread::sleep(lease * 2);
    assert_eq!(active(&instances).len(), 1, "still exactly one active");
    for w in instances.iter_mut() {
        assert!(w.is_alive(), "an instance died");
        signal(w.pid(), "TERM");
        assert!(w.wait_success(), "an instance did not shut down cleanly");
    }
}

fn graceful_handover() {
    let server = RedisServer::start();
    // A long lease: only an explicit release lets the standby in this soon.
    let lease = Duration::from_secs(10);
    let mut instances = spawn_instances(&server, 2, lease.as_millis() as u64);
    let a = wait_for_one_active(&instances, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(300));
    let asked = Instant::now();
    signal(instances[a].pid(), "TERM");
    assert!(
        instances[a].wait_success(),
        "the leader did not shut down cleanly"
    );
    let b = 1 - a;
    assert!(
        eventually(Duration::from_secs(30), || instances[b]
            .last("ROLE active")
            .is_some()),
        "the standby never took over"
    );
    let took = instances[b].last("ROLE active").unwrap().0 - asked;
    println!("hand-over after SIGTERM: {took:?} (lease {lease:?})");
    // The lease is renewed every lease/3, so waiting for expiry would take at least 2/3 of it.
    assert!(
        took < lease * 2 / 3,
        "the hand-over waited for the lease: {took:?}"
    );
    signal(instances[b].pid(), "TERM");
    assert!(instances[b].wait_success());
}

const REDLOCK_ROUNDS: usize = 15;

fn redlock_contention() {
    let nodes: Vec<RedisServer> = std::thread::scope(|s| {
        let starting: Vec<_> = (0..6).map(|_| s.spawn(RedisServer::start)).collect();
        starting
            .into_iter()
            .map(|h| h.join().expect("a node"))
            .collect()
    });
    let (lock_nodes, history_server) = nodes.split_at(5);
    let urls: Vec<String> = lock_nodes.iter().map(RedisServer::url).collect();
    let mut contenders: Vec<Worker> = (0..5)
        .map(|i| {
            Worker::spawn(
                "redlock",
                &[
                    ("STAMPEDE_URL", history_server[0].url()),
                    ("REDLOCK_NODES", urls.join(",")),
                    ("INSTANCE", format!("r{i}")),
                ],
            )
        })
        .collect();
    for w in contenders.iter_mut() {
        assert!(w.wait_success(), "a contender failed");
    }
    let runs = history(&history_server[0]);
    assert_eq!(
        runs.len(),
        5 * REDLOCK_ROUNDS,
        "every critical section was recorded"
    );
    assert!(
        runs.iter().all(|r| r.accepted),
        "no holder was ever behind the highest token: {runs:?}"
    );
    check_history(&runs);
}

/// A Redlock contender: takes the lock, works a little, records its critical section through
/// the fenced history store, releases; `REDLOCK_ROUNDS` times.
async fn redlock_contender(history_url: &str, me: &str) -> Result<(), String> {
    let urls = std::env::var("REDLOCK_NODES").map_err(|e| e.to_string())?;
    let lock = stampede_guard::Redlock::builder("contended")
        .nodes(urls.split(','))
        .options(
            CallOptions::default()
                .lease(Duration::from_secs(2))
                .wait_timeout(Duration::from_secs(60)),
        )
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let client = redis::Client::open(history_url).map_err(|e| e.to_string())?;
    let mut history = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    for _ in 0..REDLOCK_ROUNDS {
        let guard = lock.acquire().await.map_err(|e| e.to_string())?;
        let start = now_us() / 1000;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let _: i64 = redis::Script::new(FENCED_APPEND)
            .key("max_token")
            .key("history")
            .arg(me)
            .arg(guard.fencing_token())
            .arg(start)
            .arg(now_us() / 1000)
            .invoke_async(&mut history)
            .await
            .map_err(|e| e.to_string())?;
        guard.release().await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// One instance: runs the leader loop until SIGTERM, printing role changes as `ROLE ...` lines
/// (or, as `redlock`, contends for a Redlock).
fn instance(role: &str) -> Result<(), String> {
    if role == "redlock" {
        let url = std::env::var("STAMPEDE_URL").map_err(|e| e.to_string())?;
        let me = std::env::var("INSTANCE").map_err(|e| e.to_string())?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        return runtime.block_on(redlock_contender(&url, &me));
    }
    if role != "leader" {
        return Err(format!("unknown role {role}"));
    }
    let url = std::env::var("STAMPEDE_URL").map_err(|e| e.to_string())?;
    let me = std::env::var("INSTANCE").map_err(|e| e.to_string())?;
    let lease_ms: u64 = std::env::var("LEASE_MS")
        .map_err(|e| e.to_string())?
        .parse()
        .map_err(|e| format!("{e}"))?;
    let runtime = runtime();
    runtime.block_on(async move {
        let lock = Lock::builder("copy-counters")
            .redis_url(url.as_str())
            .namespace("jobs")
            .options(CallOptions::default().lease(Duration::from_millis(lease_ms)))
            .build()
            .await
            .map_err(|e| e.to_string())?;
        let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
        let conn = redis::aio::ConnectionManager::new(client)
            .await
            .map_err(|e| e.to_string())?;
        let every_ms: u64 = std::env::var("EVERY_MS")
            .map_err(|e| e.to_string())?
            .parse()
            .map_err(|e| format!("{e}"))?;
        let leader = Leader::new(lock, Duration::from_millis(every_ms));
        let mut status = leader.status();
        tokio::spawn(async move {
            loop {
                let line = match *status.borrow_and_update() {
                    Role::Active { fencing_token } => format!("ROLE active {fencing_token}"),
                    Role::Standby => "ROLE standby".to_string(),
                    _ => "ROLE stopped".to_string(),
                };
                println!("{line}");
                if status.changed().await.is_err() {
                    break;
                }
            }
        });
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| e.to_string())?;
        let shutdown = async move {
            term.recv().await;
        };
        let job = move |ctx: JobContext| {
            let (mut conn, me) = (conn.clone(), me.clone());
            async move { run_once(&mut conn, &me, ctx).await }
        };
        leader.run(job, shutdown).await.map_err(|e| e.to_string())
    })
}

/// One job run: 500 ms of "work", whose write is issued 400 ms in and cannot be called back (as a
/// write already on the wire when the process pauses): only the fencing check stops it if late.
async fn run_once(
    conn: &mut redis::aio::ConnectionManager,
    me: &str,
    ctx: JobContext,
) -> Result<(), String> {
    let start = now_us() / 1000;
    let marker = format!("inrun:{me}");
    let _: () = redis::cmd("SET")
        .arg(&marker)
        .arg(start)
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    let (mut writer, me, token) = (conn.clone(), me.to_string(), ctx.fencing_token());
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let _: Result<i64, _> = redis::Script::new(FENCED_APPEND)
            .key("max_token")
            .key("history")
            .arg(&me)
            .arg(token)
            .arg(start)
            .arg(now_us() / 1000)
            .invoke_async(&mut writer)
            .await;
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _: () = redis::cmd("DEL")
        .arg(&marker)
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}
