//! Every Lua script the crate sends touches only the keys it declares in KEYS, declares at least
//! one, and declares keys of one Redis Cluster slot: what ElastiCache Serverless and Dragonfly
//! (by default) require of a script, and what Redis Cluster requires of its keys. Checked on a
//! real server: the crate's operations run while `MONITOR` records each script's own commands
//! (`[0 lua]` lines); the keys of each command (as `COMMAND GETKEYS` names them) must be among
//! the KEYS of the `EVALSHA` that ran it. A failure names the script and the key.

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod cluster;
    pub mod monitor;
    pub mod monitor_line;
    pub mod poll;
    pub mod server;
    pub use {cluster::*, monitor::*, monitor_line::*, server::*};
}

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use stampede_guard::leader::{JobContext, Leader};
use stampede_guard::{Cache, CacheBuilder, CallOptions, LockWrite, NearCacheOptions, Written};
use support::{parse_monitor_line, Monitor, RedisCluster, RedisServer};

const TTL: Duration = Duration::from_secs(60);

/// One command as `MONITOR` printed it: whether a script ran it, and its arguments (unescaped).
struct Line {
    lua: bool,
    args: Vec<Vec<u8>>,
}

/// Splits a MONITOR line (`1700000000.123456 [0 lua] "SET" "k" "v\x01"`).
fn parse(line: &str) -> Option<Line> {
    let (lua, args) = parse_monitor_line(line)?;
    (!args.is_empty()).then_some(Line { lua, args })
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The lines `monitor` saw until now, read.
fn lines_seen(monitor: &Monitor, server: &RedisServer) -> Vec<Line> {
    monitor
        .lines_until_now(server)
        .iter()
        .filter_map(|line| parse(line))
        .collect()
}

/// Whether a server shows a script's own commands after its `EVALSHA` line (Redis 6, and
/// Redis 7 and Valkey as seen so far) or before it: found with a script of the test's own.
fn script_line_comes_first(server: &RedisServer, monitor: &Monitor) -> bool {
    // No key: any node of a cluster runs it.
    let _: Vec<String> = redis::cmd("EVAL")
        .arg("return redis.call('TIME')")
        .arg(0)
        .query(&mut server.conn())
        .unwrap();
    let lines = lines_seen(monitor, server);
    let eval = lines
        .iter()
        .position(|l| l.args[0].eq_ignore_ascii_case(b"EVAL"));
    let get = lines.iter().position(|l| l.lua);
    match (eval, get) {
        (Some(eval), Some(get)) => eval < get,
        _ => panic!("the probe script's lines were not seen on MONITOR"),
    }
}

/// One script run: which script, the KEYS it declared, and the commands it ran.
struct Run {
    script: String,
    declared: Vec<Vec<u8>>,
    commands: Vec<Vec<Vec<u8>>>,
}

/// The script runs in `lines`, each with its own commands (a script's commands are contiguous:
/// the server runs one script at a time). `first`: the `EVALSHA` line comes before them.
fn runs(lines: Vec<Line>, first: bool, names: &HashMap<String, &'static str>) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    let mut pending: Vec<Vec<Vec<u8>>> = Vec::new();
    let mut open = false;
    for Line { lua, args } in lines {
        if lua {
            match runs.last_mut() {
                Some(run) if first && open => run.commands.push(args),
                _ if !first => pending.push(args),
                _ => panic!("a script's command with no EVALSHA before it: {args:?}"),
            }
            continue;
        }
        assert!(
            pending.is_empty(),
            "script commands with no EVALSHA after them: {pending:?}"
        );
        open = false;
        let name = args[0].to_ascii_uppercase();
        if !name.starts_with(b"EVAL") && !name.starts_with(b"FCALL") {
            continue;
        }
        let sha = text(&args[1]).to_ascii_lowercase();
        let count: usize = text(&args[2]).parse().expect("numkeys");
        let script = names
            .get(&sha)
            .map_or_else(|| format!("(unknown script {sha})"), |n| (*n).to_owned());
        runs.push(Run {
            script,
            declared: args[3..3 + count].to_vec(),
            commands: std::mem::take(&mut pending),
        });
        open = true;
    }
    runs
}

/// The keys of a command, as the server's `COMMAND GETKEYS` names them (none for `PUBLISH`,
/// `TIME`...).
fn keys_of(conn: &mut redis::Connection, command: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut getkeys = redis::cmd("COMMAND");
    getkeys.arg("GETKEYS");
    for arg in command {
        getkeys.arg(arg.as_slice());
    }
    getkeys.query(conn).unwrap_or_default()
}

/// The Redis Cluster slot of `key` (CRC16/XMODEM of its hash tag, modulo 16384).
fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let close = key[open + 1..].iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &key[open + 1..open + 1 + close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in tagged {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// Every rule broken by `runs`, one line each, naming the script and the key; and which scripts
/// ran. On a single server (`cluster` false) a batch's script (`*_many`) may declare the keys
/// of several slots (the server has no slots; each entry's own keys share one); on a cluster
/// every script's keys must share one.
fn check(server: &RedisServer, runs: &[Run], cluster: bool) -> (Vec<String>, BTreeSet<String>) {
    let mut conn = server.conn();
    let mut broken = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for run in runs {
        seen.insert(run.script.clone());
        if run.declared.is_empty() {
            broken.insert(format!("script {} declares no KEYS", run.script));
        }
        let slots: BTreeSet<u16> = run.declared.iter().map(|k| slot(k)).collect();
        if slots.len() > 1 && (cluster || !run.script.ends_with("_many")) {
            broken.insert(format!(
                "script {} declares keys of {} slots: {:?}",
                run.script,
                slots.len(),
                run.declared.iter().map(|k| text(k)).collect::<Vec<_>>()
            ));
        }
        for command in &run.commands {
            for key in keys_of(&mut conn, command) {
                if !run.declared.contains(&key) {
                    broken.insert(format!(
                        "script {} touches key {:?} ({}) that it did not declare in KEYS {:?}",
                        run.script,
                        text(&key),
                        text(&command[0]),
                        run.declared.iter().map(|k| text(k)).collect::<Vec<_>>()
                    ));
                }
            }
        }
    }
    (broken.into_iter().collect(), seen)
}

/// Script names by SHA, as the crate sends them.
fn names() -> HashMap<String, &'static str> {
    stampede_guard::__private::script_names()
        .into_iter()
        .map(|(name, sha)| (sha.to_ascii_lowercase(), name))
        .collect()
}

async fn cache(server: &impl Fn() -> CacheBuilder) -> Cache {
    server()
        .namespace("keys")
        .near_cache(NearCacheOptions::new(100))
        .build()
        .await
        .expect("a cache")
}

/// The operations of a cache on one server or cluster (`server`: a builder that names it): a
/// miss won and computed, a wait on another's computation, set, invalidate, invalidate_many,
/// tags and their invalidation, clear, a batch, inspect, a lock acquired, extended and
/// released, a leader's run.
async fn operations(server: impl Fn() -> CacheBuilder) {
    let a = cache(&server).await;
    let b = cache(&server).await;
    let slow = || async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok::<_, std::io::Error>("computed".to_owned())
    };
    // A miss won by one caller while the other waits for its value.
    let (x, y) = tokio::join!(
        a.get_or_compute("won", TTL, slow),
        b.get_or_compute("won", TTL, slow)
    );
    assert_eq!(
        (x.unwrap(), y.unwrap()),
        ("computed".into(), "computed".into())
    );
    assert_eq!(
        a.set("set", &"v".to_owned(), TTL).await.unwrap(),
        Written::Applied
    );
    assert_eq!(a.invalidate("won").await.unwrap(), Written::Applied);
    assert_eq!(
        a.invalidate_many(["set", "other"]).await.unwrap(),
        Written::Applied
    );
    let tagged = a.tagged(["team"]);
    let value = || async { Ok::<_, std::io::Error>("tagged".to_owned()) };
    tagged.get_or_compute("tagged", TTL, value).await.unwrap();
    assert_eq!(a.invalidate_tag("team").await.unwrap(), Written::Applied);
    assert_eq!(
        a.invalidate_tags(["team", "other"]).await.unwrap(),
        Written::Applied
    );
    let keys: Vec<String> = (0..12).map(|i| format!("batch-{i}")).collect();
    let many = a
        .get_or_compute_many(&keys, TTL, |missing: Vec<String>| async move {
            Ok::<_, std::io::Error>(
                missing
                    .into_iter()
                    .map(|k| (k.clone(), k))
                    .collect::<Vec<_>>(),
            )
        })
        .await;
    assert_eq!(many.len(), 12);
    assert!(many.iter().all(Result::is_ok), "{many:?}");
    a.inspect("batch-0").await.unwrap();
    assert_eq!(a.clear().await.unwrap(), Written::Applied);
    // A lock: acquired, extended, released.
    let lock = a.lock("job").unwrap();
    let guard = lock.acquire().await.unwrap();
    assert!(guard.extend().await.unwrap());
    guard.release().await.unwrap();
    // A leader's run: its start recorded, the last one read.
    let leader = Leader::new(a.lock("leader").unwrap(), Duration::from_secs(3600));
    let (ran, done) = tokio::sync::oneshot::channel::<()>();
    let mut ran = Some(ran);
    leader
        .run(
            move |_: JobContext| {
                if let Some(ran) = ran.take() {
                    let _ = ran.send(());
                }
                std::future::ready(Ok::<_, String>(()))
            },
            async move {
                let _ = done.await;
            },
        )
        .await
        .unwrap();
}

/// The split store's operations (values on one server, locks through a Redlock of three): the
/// fences taken on the value store, a write under one, a wake-up, a set over the Redlock.
async fn split_store_operations(values: String, locks: Vec<String>) {
    let split = Cache::builder()
        .redis_url(values)
        .redlock(locks)
        .namespace("split")
        .options(CallOptions::default().lease(Duration::from_secs(5)))
        .build()
        .await
        .expect("a cache with Redlock locks");
    let value = || async { Ok::<_, std::io::Error>("v".to_owned()) };
    split.get_or_compute("k", TTL, value).await.unwrap();
    assert_eq!(
        split.set("k", &"w".to_owned(), TTL).await.unwrap(),
        Written::Applied
    );
    assert_eq!(split.invalidate("k").await.unwrap(), Written::Applied);
    let failing = || async { Err::<String, _>(std::io::Error::other("no value")) };
    let _ = split.get_or_compute("failing", TTL, failing).await;
}

/// The scripts that the server at `url` never runs, because a command without Lua does their
/// work there (`docs/servers.md`, Lua-free lock writes): Valkey 8.1 renews by `SET ... IFEQ`.
async fn lua_free(url: &str) -> Vec<&'static str> {
    let cache = Cache::builder()
        .redis_url(url)
        .build()
        .await
        .expect("a cache");
    let found = cache
        .capabilities()
        .expect("a single server is probed at build");
    let mut replaced = Vec::new();
    if found.renewal() != LockWrite::Script {
        replaced.push("extend");
    }
    if found.release() != LockWrite::Script {
        replaced.push("unlock");
    }
    replaced
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_script_touches_only_the_keys_it_declares_and_declares_one() {
    let server = RedisServer::start();
    let lock_nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let watched = watch(std::iter::once(&server).chain(&lock_nodes));
    let url = server.url();
    operations(|| Cache::builder().redis_url(url.clone())).await;
    split_store_operations(
        server.url(),
        lock_nodes.iter().map(RedisServer::url).collect(),
    )
    .await;
    let seen = assert_kept(&watched, false);
    let replaced = lua_free(&url).await;
    // The operations above run every script the crate has (but those this server's Lua-free
    // lock writes replace): a script left out would pass unchecked.
    let missed: Vec<&str> = names()
        .into_values()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter(|name| !seen.contains_key(*name) && !replaced.contains(name))
        .collect();
    assert!(
        missed.is_empty(),
        "scripts the operations did not run (so not checked): {missed:?}; ran: {seen:?}"
    );
}

/// On a Redis Cluster (the scripts sent with `SPUBLISH`, batches per slot), every script's keys
/// share one slot too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_every_script_keeps_to_its_declared_keys_of_one_slot() {
    let cluster = RedisCluster::start();
    let watched = watch(cluster.nodes.iter());
    let urls = cluster.urls();
    operations(|| Cache::builder().redis_cluster(urls.clone())).await;
    let seen = assert_kept(&watched, true);
    assert!(seen.contains_key("read_or_lock_many"), "{seen:?}");
    assert!(seen.contains_key("invalidate_many"), "{seen:?}");
}

/// A `MONITOR` on each of `servers`, and whether each shows a script's `EVALSHA` first.
fn watch<'s>(
    servers: impl Iterator<Item = &'s RedisServer>,
) -> Vec<(&'s RedisServer, Monitor, bool)> {
    servers
        .map(|s| {
            let watch = Monitor::start(s);
            let first = script_line_comes_first(s, &watch);
            (s, watch, first)
        })
        .collect()
}

/// Reads what every watched server saw, fails naming each script that broke a rule and the
/// key, and returns how many servers ran each script.
fn assert_kept(
    watched: &[(&RedisServer, Monitor, bool)],
    cluster: bool,
) -> BTreeMap<String, usize> {
    let names = names();
    let mut broken = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (s, watch, first) in watched {
        let runs = runs(lines_seen(watch, s), *first, &names);
        let (server_broken, server_seen) = check(s, &runs, cluster);
        broken.extend(server_broken);
        for script in server_seen {
            *seen.entry(script).or_default() += 1;
        }
    }
    assert!(
        broken.is_empty(),
        "scripts that break the rules (only declared keys, at least one, one slot):\n{}",
        broken.join("\n")
    );
    seen
}

#[test]
fn monitor_lines_and_slots_are_read_as_the_server_writes_them() {
    let line = parse(r#"1700000000.123456 [0 lua] "SET" "ns:{k}" "a\x01\"b" "PX" "10""#).unwrap();
    assert!(line.lua);
    assert_eq!(line.args[2], b"a\x01\"b");
    let client = parse(r#"1700000000.1 [0 127.0.0.1:5000] "EVALSHA" "ab" "1" "ns:{k}""#).unwrap();
    assert!(!client.lua);
    assert_eq!(client.args.len(), 4);
    // Known slots (CLUSTER KEYSLOT): only the hash tag counts.
    assert_eq!(slot(b"foo"), 12182);
    assert_eq!(slot(b"ns:{foo}_lock"), 12182);
    assert_eq!(slot(b"{}foo"), slot(b"{}foo"));
    assert_ne!(slot(b"{}foo"), slot(b"foo"));
}

/// The check itself: a script of the test's own that reads a key it did not declare, and one
/// that declares none, are both named, with the key.
#[test]
fn a_script_that_breaks_a_rule_is_named_with_the_key() {
    let server = RedisServer::start();
    let watched = watch(std::iter::once(&server));
    let mut conn = server.conn();
    let _: Option<String> = redis::cmd("EVAL")
        .arg("redis.call('GET', KEYS[1]); return redis.call('GET', 'ns:{other}')")
        .arg(2)
        .arg("ns:{declared}")
        .arg("ns:{declared}_fence")
        .query(&mut conn)
        .unwrap();
    let _: Option<String> = redis::cmd("EVAL")
        .arg("return redis.call('GET', 'ns:{k}')")
        .arg(0)
        .query(&mut conn)
        .unwrap();
    let (_, watch, first) = &watched[0];
    let runs = runs(lines_seen(watch, &server), *first, &names());
    let (broken, _) = check(&server, &runs, true);
    assert_eq!(broken.len(), 3, "{broken:#?}");
    assert!(broken.iter().any(|b| b.contains("declares no KEYS")));
    assert!(broken
        .iter()
        .any(|b| b.contains(r#"touches key "ns:{other}" (GET)"#)));
    assert!(broken.iter().any(|b| b.contains(r#"touches key "ns:{k}""#)));
}
