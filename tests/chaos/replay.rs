//! Reading the cache server's MONITOR output back into the server's side of the history
//! ([`ServerEvent`]s and [`Change`]s): which script acquired, bumped, deleted or wrote what,
//! replaying the fencing counters from their seeds, and which epoch (a tag's, the namespace's
//! clear key) a script raised to what. Keys and stored values are read through the
//! crate's own decoder (`stampede_guard::__private`), so that a change of the format changes
//! the replay with it; bytes it refuses are an [`ServerEvent::Unreadable`] write.

use stampede_guard::__private::{entry_key, epoch_key, read_stored, stored_bytes, KeyKind};

use crate::fences::Fences;
use crate::history::{parse_value, BumpCause, Change, Epoch, Raise, Rollback, ServerEvent, Write};
use crate::NAMESPACE;

/// The replay's tests, run by the binary's `main` (the chaos test has its own harness).
pub const TESTS: &[(&str, fn())] = &[
    (
        "monitor_replay_rebuilds_the_servers_decisions",
        monitor_replay_rebuilds_the_servers_decisions,
    ),
    (
        "monitor_replay_counts_outside_writes_as_changes",
        monitor_replay_counts_outside_writes_as_changes,
    ),
    (
        "monitor_replay_reads_the_clock_and_the_raised_epochs",
        monitor_replay_reads_the_clock_and_the_raised_epochs,
    ),
    (
        "monitor_replay_follows_the_counters_across_a_clusters_nodes",
        monitor_replay_follows_the_counters_across_a_clusters_nodes,
    ),
];

pub use crate::support::parse_monitor_line;

/// The commands of the outside writer (another program writing value keys), kept in the log.
const OUTSIDE_WRITES: &[&[u8]] = &[b"SET", b"DEL", b"UNLINK", b"PEXPIRE", b"FLUSHDB"];

/// Whether a MONITOR line is a client's write of one of the namespace's value keys, or a
/// flush: a change the scripts did not make, which rule (f) counts all the same.
pub fn is_outside_write(line: &str) -> bool {
    match parse_monitor_line(line) {
        Some((false, args)) => writes_values(NAMESPACE, &args),
        _ => false,
    }
}

/// Whether a client's command (its arguments) writes one of `namespace`'s value keys, or
/// flushes the database.
fn writes_values(namespace: &str, args: &[Vec<u8>]) -> bool {
    match args {
        [cmd, ..] if cmd.eq_ignore_ascii_case(b"FLUSHDB") => true,
        [cmd, key, ..] => {
            OUTSIDE_WRITES.iter().any(|w| cmd.eq_ignore_ascii_case(w))
                && std::str::from_utf8(key)
                    .ok()
                    .and_then(|k| value_name(namespace, k))
                    .is_some()
        }
        _ => false,
    }
}

/// The changes an outside write made: a value key written with foreign bytes, deleted, or set to
/// expire (`PEXPIRE k ms`: gone `ms` later), or every key by a flush, which also forgets every
/// fencing counter and lock, as a restart does (a new life for rules (b) and (c)).
fn outside_write(
    namespace: &str,
    life: u32,
    args: &[Vec<u8>],
    at_us: u64,
    counters: &mut Fences,
    events: &mut Vec<ServerEvent>,
    changes: &mut Vec<Change>,
) {
    let gone = |key: String, at_us: u64| Change {
        key,
        at_us,
        value: None,
    };
    match args {
        [cmd, ..] if cmd.eq_ignore_ascii_case(b"FLUSHDB") => {
            let mut keys: Vec<String> = changes.iter().map(|c| c.key.clone()).collect();
            keys.sort();
            keys.dedup();
            changes.extend(keys.into_iter().map(|k| gone(k, at_us)));
            counters.clear(events);
            events.push(ServerEvent::Life(life));
        }
        [cmd, key, rest @ ..] => {
            let Some(name) = std::str::from_utf8(key)
                .ok()
                .and_then(|k| value_name(namespace, k))
            else {
                return;
            };
            let at_us = if cmd.eq_ignore_ascii_case(b"PEXPIRE") {
                let ms: u64 = rest
                    .first()
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                at_us + ms * 1000
            } else {
                at_us
            };
            changes.push(gone(name, at_us));
        }
        _ => {}
    }
}

/// The entry (its user key) and the kind of `key` if it is one of the keys the cache builds in
/// `namespace`, read by the crate's own key layout (`stampede_guard::__private`).
fn entry_of(namespace: &str, key: &[u8]) -> Option<(String, KeyKind)> {
    entry_key(namespace, std::str::from_utf8(key).ok()?)
}

/// The entry's name if `key` is the value key of an entry in `namespace` (`ns:{name}`).
pub fn value_name(namespace: &str, key: &str) -> Option<String> {
    match entry_key(namespace, key)? {
        (name, KeyKind::Value) => Some(name),
        _ => None,
    }
}

/// The lock's name if `key` is the lock key of an entry in `namespace` (`ns:{name}_lock`).
pub fn lock_name(namespace: &str, key: &str) -> Option<String> {
    match entry_key(namespace, key)? {
        (name, KeyKind::Lock) => Some(name),
        _ => None,
    }
}

/// The epoch `key` is if it is one of the namespace's epoch keys (its clear key, a tag's),
/// read by the crate's own key layout: no entry's key, and no value.
pub fn epoch_name(namespace: &str, key: &str) -> Option<Epoch> {
    epoch_key(namespace, key)
}

/// What a stored value's bytes hold, read as the cache reads them.
struct Decoded {
    fence: u64,
    born: u64,
    tags: Vec<String>,
    value: String,
}

/// The envelope's fence, birth and tags and the value (a `String`) of stored value bytes, read
/// as the cache reads them; an error says why the crate refuses them.
fn decode_value(bytes: &[u8]) -> Result<Decoded, String> {
    let stored = read_stored::<String>(bytes)?;
    match (stored.value, stored.failure) {
        (Some(value), _) => Ok(Decoded {
            fence: stored.fence,
            born: stored.born,
            tags: stored.tags,
            value,
        }),
        (None, failure) => Err(format!("a remembered failure, not a value: {failure:?}")),
    }
}

/// The epoch a script's command works on, if any: a `GET` or `SET` of an epoch key (the
/// script that raises it), or its announcement on the near channel (`PUBLISH` of
/// `"0 <epoch key>"`). A clock read (`TIME` alone, the script every birth and raise starts
/// from) names no key and changes nothing.
fn epoch_of_command(namespace: &str, args: &[Vec<u8>]) -> Option<Epoch> {
    fn text(arg: &[u8]) -> Option<&str> {
        std::str::from_utf8(arg).ok()
    }
    match args {
        [cmd, _channel, message] if cmd.eq_ignore_ascii_case(b"PUBLISH") => {
            let (fence, key) = text(message)?.split_once(' ')?;
            (fence == "0").then_some(())?;
            epoch_name(namespace, key)
        }
        [_cmd, key, ..] => epoch_name(namespace, text(key)?),
        _ => None,
    }
}

/// Replays the commands one script ran on one epoch: the `SET` is the raise, the `PUBLISH` its
/// announcement. Bytes that are not a number are reported, as a value the crate cannot read.
fn replay_raise(
    epoch: Epoch,
    script: Vec<Vec<Vec<u8>>>,
    at_us: u64,
    events: &mut Vec<ServerEvent>,
) {
    let announced = script.iter().any(|args| {
        args.first()
            .is_some_and(|cmd| cmd.eq_ignore_ascii_case(b"PUBLISH"))
    });
    let set = script.iter().find_map(|args| match args.as_slice() {
        [cmd, key, value, ..] if cmd.eq_ignore_ascii_case(b"SET") => Some((key, value)),
        _ => None,
    });
    // A read alone (no raise) changes nothing.
    let Some((key, value)) = set else {
        return;
    };
    match std::str::from_utf8(value).ok().and_then(|v| v.parse().ok()) {
        Some(value) => events.push(ServerEvent::Raise(Raise {
            epoch,
            value,
            at_us,
            announced,
        })),
        None => events.push(ServerEvent::Unreadable {
            key: String::from_utf8_lossy(key).into_owned(),
            reason: format!(
                "an epoch set to {:?}, not a number",
                String::from_utf8_lossy(value)
            ),
        }),
    }
}

/// Replays one server life's MONITOR lines: the fencing counters from their seeds, and every
/// acquisition, bump and write that the scripts performed. Script commands (`[0 lua]`) of one
/// script are contiguous and follow the client's EVALSHA line, so client lines separate scripts.
pub fn replay_monitor(namespace: &str, life: u32, lines: &[String]) -> Vec<ServerEvent> {
    replay(namespace, life, lines).0
}

/// [`replay_monitor`], and the changes of values with their times for rule (f). The log marks
/// each client line with a `C`.
pub fn replay(namespace: &str, life: u32, lines: &[String]) -> (Vec<ServerEvent>, Vec<Change>) {
    let mut events = vec![ServerEvent::Life(life)];
    let mut changes = Vec::new();
    let mut counters = Fences::default();
    let mut script: Vec<Vec<Vec<u8>>> = Vec::new();
    // When the current script ran.
    let mut script_at = 0u64;
    let flush = |script: &mut Vec<Vec<Vec<u8>>>,
                 at_us: u64,
                 counters: &mut Fences,
                 events: &mut Vec<ServerEvent>,
                 changes: &mut Vec<Change>| {
        // A batch's script (a read-or-lock or an invalidation of many keys) works on several
        // entries, each as a single key's script would: each entry's commands are replayed as
        // a script of their own, in the order the entries first appear. The commands on an
        // epoch (a raise) are replayed per epoch, apart: an epoch key is no entry's.
        let mut entries: Vec<(String, Vec<Vec<Vec<u8>>>)> = Vec::new();
        let mut epochs: Vec<(Epoch, Vec<Vec<Vec<u8>>>)> = Vec::new();
        for args in script.drain(..) {
            let args = probe_as_command(args);
            if let Some(epoch) = epoch_of_command(namespace, &args) {
                match epochs.iter_mut().find(|(e, _)| *e == epoch) {
                    Some((_, commands)) => commands.push(args),
                    None => epochs.push((epoch, vec![args])),
                }
                continue;
            }
            let Some((entry, _)) = args.get(1).and_then(|key| entry_of(namespace, key)) else {
                continue;
            };
            match entries.iter_mut().find(|(e, _)| *e == entry) {
                Some((_, commands)) => commands.push(args),
                None => entries.push((entry, vec![args])),
            }
        }
        for (entry, commands) in entries {
            counters.script_of(&entry, at_us, events);
            replay_script(namespace, counters, commands, at_us, events, changes);
        }
        for (epoch, commands) in epochs {
            replay_raise(epoch, commands, at_us, events);
        }
    };
    for line in lines {
        // A cluster's merged log says which node the scripts that follow ran on, and which
        // entries a migration moves (see `fences.rs`); a server's own log has neither.
        if let Some(marker) = cluster_marker(line) {
            flush(
                &mut script,
                script_at,
                &mut counters,
                &mut events,
                &mut changes,
            );
            match marker {
                Marker::Node(node) => counters.on_node(node),
                Marker::Moving(node, entries) => {
                    for entry in entries {
                        counters.moving(entry, node);
                    }
                }
            }
            continue;
        }
        // Anything but a script command (a client's command, or the `C` that stands for one)
        // ends the script before it.
        match parse_monitor_line(line) {
            Some((true, args)) => {
                if script.is_empty() {
                    script_at = monitor_time_us(line).unwrap_or(0);
                }
                script.push(args);
            }
            other => {
                flush(
                    &mut script,
                    script_at,
                    &mut counters,
                    &mut events,
                    &mut changes,
                );
                if let Some((false, args)) = other.filter(|(_, a)| writes_values(namespace, a)) {
                    let at_us = monitor_time_us(line).unwrap_or(0);
                    outside_write(
                        namespace,
                        life,
                        &args,
                        at_us,
                        &mut counters,
                        &mut events,
                        &mut changes,
                    );
                }
            }
        }
    }
    flush(
        &mut script,
        script_at,
        &mut counters,
        &mut events,
        &mut changes,
    );
    (events, changes)
}

/// Replays the commands one script ran on one entry: an acquisition, a bump (invalidation or
/// `set`), a fenced delete, a write, and the change of value it made.
fn replay_script(
    namespace: &str,
    counters: &mut Fences,
    script: Vec<Vec<Vec<u8>>>,
    at_us: u64,
    events: &mut Vec<ServerEvent>,
    changes: &mut Vec<Change>,
) {
    let mut bumped: Option<(String, u64)> = None;
    let mut locked = false;
    let mut deleted: Option<String> = None;
    let mut written: Option<(String, Vec<u8>)> = None;
    for args in script {
        let [cmd, key, rest @ ..] = args.as_slice() else {
            continue;
        };
        let Some((entry, part)) = entry_of(namespace, key) else {
            continue;
        };
        match (cmd.to_ascii_uppercase().as_slice(), part) {
            (b"SET", KeyKind::Fence) => {
                // Right after the INCR, in the same script, the bump sets the counter to the
                // clock: with `KEEPTTL` when the clock was above counter + 1 (a raise), else a
                // counter that INCR just created (1) is seeded. Either way the value set is the
                // number that bump handed out.
                let value = rest
                    .first()
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .and_then(|v| v.parse().ok())
                    .expect("a numeric fence value");
                if bumped.as_ref().is_some_and(|(k, _)| *k == entry) {
                    bumped = Some((entry.clone(), value));
                }
                if rest.iter().any(|a| a.eq_ignore_ascii_case(b"KEEPTTL")) {
                    counters.raise(&entry, value, events);
                } else {
                    counters.seed(&entry, value, events);
                }
            }
            (b"INCR", KeyKind::Fence) => {
                let n = counters.incr(&entry);
                bumped = Some((entry, n));
            }
            (b"SET", KeyKind::Lock) => locked = true,
            (b"PROBE", KeyKind::Fence) => {
                let value = rest
                    .first()
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                counters.probed(&entry, value, events);
            }
            (b"DEL", KeyKind::Value) => deleted = Some(entry),
            (b"SET", KeyKind::Value) => {
                written = Some((entry, rest.first().cloned().unwrap_or_default()))
            }
            _ => {}
        }
    }
    let changed = match (&bumped, &deleted, &written) {
        (_, _, Some((key, _))) => Some(key.clone()),
        (Some((key, _)), _, _) if !locked => Some(key.clone()),
        (None, Some(key), None) => Some(key.clone()),
        _ => None,
    };
    if let Some((key, n)) = bumped {
        let what = if locked {
            events.push(ServerEvent::Acquire {
                key: key.clone(),
                token: n,
            });
            (Some(n), "acquisition")
        } else if deleted.is_some() {
            events.push(ServerEvent::Bump {
                key: key.clone(),
                cause: BumpCause::Invalidate,
            });
            (None, "invalidation")
        } else {
            events.push(ServerEvent::Bump {
                key: key.clone(),
                cause: BumpCause::Set,
            });
            (None, "set")
        };
        counters.record(&key, events.len() - 1, Some(what));
    } else if let Some(key) = deleted {
        // A delete without a bump: the fenced delete of a failed refresh.
        events.push(ServerEvent::Delete { key });
    }
    if let Some((key, bytes)) = written {
        let Decoded {
            fence,
            born,
            tags,
            value,
        } = match decode_value(&bytes) {
            Ok(read) => read,
            Err(reason) => {
                // Not judged as a write (its fence is unknown): the checker reports it.
                changes.push(Change {
                    key: key.clone(),
                    at_us,
                    value: None,
                });
                events.push(ServerEvent::Unreadable { key, reason });
                return;
            }
        };
        changes.push(Change {
            key: key.clone(),
            at_us,
            value: Some(value.clone()),
        });
        let parts = parse_value(&value);
        // Judged by what was written, not by the script's shape, so that a script that
        // skipped its fence check is still held to the rules of a computed write.
        let computed = parts.as_ref().is_none_or(|p| p.computed);
        counters.record(&key, events.len(), None);
        events.push(ServerEvent::Write(Write {
            counter: counters.get(&key),
            computed,
            token: parts.map(|p| p.token).unwrap_or(0),
            key: key.clone(),
            fence,
            value,
            born,
            tags,
            at_us,
        }));
        if computed {
            // The store script wrote it only while the counter equalled its fence.
            counters.written(&key, fence, events);
        }
    } else if let Some(key) = changed {
        changes.push(Change {
            key,
            at_us,
            value: None,
        });
    }
}

/// What the cluster schedule's probe of a fencing counter printed (`ECHO "probe <fence key>
/// <value>"` in its script, after the `GET`; see `cluster.rs`), as a command of the entry:
/// `PROBE <fence key> <value>`. Any other command as it is.
fn probe_as_command(args: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    if let [cmd, message] = args.as_slice() {
        if cmd.eq_ignore_ascii_case(b"ECHO") {
            let words: Vec<&[u8]> = message.split(|b| *b == b' ').collect();
            if let [b"probe", key, value] = words.as_slice() {
                return vec![b"PROBE".to_vec(), key.to_vec(), value.to_vec()];
            }
        }
    }
    args
}

/// A line of a cluster's merged log that is no command (see `fences.rs`).
enum Marker<'l> {
    /// `N <node>`: the script lines that follow ran on this node.
    Node(u32),
    /// `M <node> <entry>...`: a migration moves these entries to this node.
    Moving(u32, Vec<&'l str>),
}

fn cluster_marker(line: &str) -> Option<Marker<'_>> {
    let mut words = line.split(' ');
    let kind = words.next()?;
    let node: u32 = words.next()?.parse().ok()?;
    match kind {
        "N" => Some(Marker::Node(node)),
        "M" => Some(Marker::Moving(node, words.collect())),
        _ => None,
    }
}

/// The timestamp that starts a MONITOR line (`1700000000.123456 ...`), in µs.
fn monitor_time_us(line: &str) -> Option<u64> {
    let (secs, micros) = line.split(' ').next()?.split_once('.')?;
    let micros = format!("{micros:0<6}");
    Some(secs.parse::<u64>().ok()? * 1_000_000 + micros.get(..6)?.parse::<u64>().ok()?)
}

// ---------------------------------------------------------------------------------------------
// The tests, on hand-made MONITOR logs.

/// A value as the cache stores it (born at `born` with `tags`), escaped as MONITOR prints it.
fn monitor_envelope(fence: u64, (born, tags): (u64, &[&str]), text: &str) -> String {
    stored_bytes(fence, 1_700_000_000_000, (born, tags), &text.to_owned())
        .expect("a String encodes")
        .iter()
        .map(|b| {
            if b.is_ascii_graphic() && *b != b'"' && *b != b'\\' {
                (*b as char).to_string()
            } else {
                format!("\\x{b:02x}")
            }
        })
        .collect()
}

/// Hand-made MONITOR logs: single-key scripts, a batch's scripts, and a value the crate cannot
/// read.
fn monitor_replay_rebuilds_the_servers_decisions() {
    let envelope = |fence: u64, text: &str| monitor_envelope(fence, (0, &[]), text);
    let v = "V|k0|101|w0.1|1|-".to_string();
    let lines: Vec<String> = [
        r#"1.0 [0 127.0.0.1:1] "evalsha" "abc" "3""#.to_string(),
        r#"1.1 [0 lua] "GET" "chaos:{k0}""#.into(),
        r#"1.2 [0 lua] "SET" "chaos:{k0}_lock" "tok" "NX" "PX" "400""#.into(),
        r#"1.3 [0 lua] "EXISTS" "chaos:{k0}_fence""#.into(),
        r#"1.4 [0 lua] "TIME""#.into(),
        r#"1.5 [0 lua] "SET" "chaos:{k0}_fence" "100""#.into(),
        r#"1.6 [0 lua] "INCR" "chaos:{k0}_fence""#.into(),
        r#"1.7 [0 lua] "PEXPIRE" "chaos:{k0}_fence" "800""#.into(),
        "C".into(),
        r#"2.1 [0 lua] "GET" "chaos:{k0}_fence""#.into(),
        format!(
            r#"2.2 [0 lua] "SET" "chaos:{{k0}}" "{}" "PX" "900""#,
            envelope(101, &v)
        ),
        r#"2.3 [0 lua] "GET" "chaos:{k0}_lock""#.into(),
        "C".into(),
        r#"3.1 [0 lua] "EXISTS" "chaos:{k0}_fence""#.into(),
        r#"3.2 [0 lua] "INCR" "chaos:{k0}_fence""#.into(),
        r#"3.3 [0 lua] "DEL" "chaos:{k0}""#.into(),
        "C".into(),
        // A failed refresh's fenced delete: no bump, the value and the lock go.
        r#"4.1 [0 lua] "GET" "chaos:{k0}_fence""#.into(),
        r#"4.2 [0 lua] "DEL" "chaos:{k0}""#.into(),
        r#"4.3 [0 lua] "GET" "chaos:{k0}_lock""#.into(),
        r#"4.4 [0 lua] "DEL" "chaos:{k0}_lock""#.into(),
    ]
    .to_vec();
    let (events, changes) = replay(NAMESPACE, 0, &lines);
    assert_eq!(events, replay_monitor(NAMESPACE, 0, &lines));
    // The changes of the value: the computed write, the invalidation, the fenced delete; an
    // acquisition is none.
    assert_eq!(
        changes,
        vec![
            Change {
                key: "k0".into(),
                at_us: 2_100_000,
                value: Some(v.clone()),
            },
            Change {
                key: "k0".into(),
                at_us: 3_100_000,
                value: None,
            },
            Change {
                key: "k0".into(),
                at_us: 4_100_000,
                value: None,
            },
        ]
    );
    assert_eq!(
        events,
        vec![
            ServerEvent::Life(0),
            ServerEvent::Acquire {
                key: "k0".into(),
                token: 101
            },
            ServerEvent::Write(Write {
                key: "k0".into(),
                computed: true,
                token: 101,
                fence: 101,
                counter: Some(101),
                value: v,
                born: 0,
                tags: vec![],
                at_us: 2_100_000,
            }),
            ServerEvent::Bump {
                key: "k0".into(),
                cause: BumpCause::Invalidate
            },
            ServerEvent::Delete { key: "k0".into() },
        ]
    );

    // A batch's read-or-lock script locks several entries at once, and a batch's invalidation
    // bumps several: each entry is replayed as its own script (the replay once took the first
    // key's fence for the second's and reported writes as out of order).
    let lines: Vec<String> = [
        r#"5.0 [0 127.0.0.1:1] "evalsha" "def" "6""#,
        r#"5.1 [0 lua] "GET" "chaos:{k1}""#,
        r#"5.2 [0 lua] "SET" "chaos:{k1}_lock" "t1" "PX" "400" "NX""#,
        r#"5.3 [0 lua] "INCR" "chaos:{k1}_fence""#,
        r#"5.4 [0 lua] "TIME""#,
        r#"5.5 [0 lua] "SET" "chaos:{k1}_fence" "500" "PX" "800""#,
        r#"5.6 [0 lua] "GET" "chaos:{k2}""#,
        r#"5.7 [0 lua] "SET" "chaos:{k2}_lock" "t2" "PX" "400" "NX""#,
        r#"5.8 [0 lua] "INCR" "chaos:{k2}_fence""#,
        r#"5.9 [0 lua] "TIME""#,
        r#"5.91 [0 lua] "SET" "chaos:{k2}_fence" "600" "PX" "800""#,
        "C",
        r#"6.1 [0 lua] "INCR" "chaos:{k1}_fence""#,
        r#"6.2 [0 lua] "DEL" "chaos:{k1}""#,
        r#"6.3 [0 lua] "INCR" "chaos:{k2}_fence""#,
        r#"6.4 [0 lua] "DEL" "chaos:{k2}""#,
    ]
    .map(str::to_owned)
    .to_vec();
    let (events, changes) = replay(NAMESPACE, 0, &lines);
    let acquired = |key: &str, token| ServerEvent::Acquire {
        key: key.into(),
        token,
    };
    let invalidated = |key: &str| ServerEvent::Bump {
        key: key.into(),
        cause: BumpCause::Invalidate,
    };
    assert_eq!(
        events,
        vec![
            ServerEvent::Life(0),
            acquired("k1", 500),
            acquired("k2", 600),
            invalidated("k1"),
            invalidated("k2"),
        ]
    );
    let changed: Vec<&str> = changes.iter().map(|c| c.key.as_str()).collect();
    assert_eq!(changed, ["k1", "k2"], "an invalidation changes each key");

    // Bytes the crate refuses (here the previous format version) are reported, not read as
    // fence 0: the write becomes an unreadable event and its change a value nobody can name.
    let lines: Vec<String> = [
        r#"7.0 [0 127.0.0.1:1] "evalsha" "abc" "3""#,
        r#"7.1 [0 lua] "GET" "chaos:{k0}_fence""#,
        r#"7.2 [0 lua] "SET" "chaos:{k0}" "SG\x01\x01\x00" "PX" "900""#,
    ]
    .map(str::to_owned)
    .to_vec();
    let (events, changes) = replay(NAMESPACE, 0, &lines);
    assert!(
        matches!(&events[..], [ServerEvent::Life(0), ServerEvent::Unreadable { key, .. }] if key == "k0"),
        "{events:?}"
    );
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].value, None);
}

/// Another program's writes of value keys (client lines, not scripts) are changes: a `SET` of
/// foreign bytes, `DEL`, `UNLINK` now, `PEXPIRE` when it expires; a `FLUSHDB` deletes every key
/// seen and starts a new life (the counters and locks are gone). Other keys and commands are not.
fn monitor_replay_counts_outside_writes_as_changes() {
    let lines: Vec<String> = [
        r#"1.0 [0 127.0.0.1:9] "SET" "chaos:{k0}" "from another program""#,
        r#"1.5 [0 127.0.0.1:9] "SET" "filler:1" "x""#,
        r#"1.6 [0 127.0.0.1:9] "GET" "chaos:{k1}""#,
        r#"2.0 [0 127.0.0.1:9] "DEL" "chaos:{k1}""#,
        r#"2.5 [0 127.0.0.1:9] "DEL" "chaos:{k1}_lock""#,
        r#"3.0 [0 127.0.0.1:9] "UNLINK" "chaos:{k2}""#,
        r#"4.0 [0 127.0.0.1:9] "PEXPIRE" "chaos:{k0}" "1""#,
        r#"5.0 [0 127.0.0.1:9] "FLUSHDB""#,
    ]
    .iter()
    .map(|l| l.to_string())
    .collect();
    let kept: Vec<bool> = lines.iter().map(|l| is_outside_write(l)).collect();
    assert_eq!(kept, [true, false, false, true, false, true, true, true]);
    let (events, changes) = replay(NAMESPACE, 3, &lines);
    let gone = |key: &str, at_us: u64| Change {
        key: key.into(),
        at_us,
        value: None,
    };
    assert_eq!(
        changes,
        vec![
            gone("k0", 1_000_000),
            gone("k1", 2_000_000),
            gone("k2", 3_000_000),
            gone("k0", 4_001_000),
            gone("k0", 5_000_000),
            gone("k1", 5_000_000),
            gone("k2", 5_000_000),
        ]
    );
    assert_eq!(events, vec![ServerEvent::Life(3), ServerEvent::Life(3)]);
}

/// The scripts of tags and clear: a clock read (`TIME` alone) changes nothing; a raise (`GET`,
/// `SET`, `PUBLISH "0 <epoch key>"` on the near channel) is a [`Raise`] of its epoch, not a
/// change of any value, nor an outside write; a tagged value's envelope gives its birth and
/// tags; an epoch set to bytes that are not a number is reported.
fn monitor_replay_reads_the_clock_and_the_raised_epochs() {
    let v = "V|k0|101|w0.1|7|t1+t2";
    let lines: Vec<String> = [
        r#"1.0 [0 127.0.0.1:1] "evalsha" "clock" "1" "chaos:{%c}""#.to_string(),
        r#"1.1 [0 lua] "TIME""#.into(),
        "C".into(),
        r#"2.1 [0 lua] "GET" "chaos:{%t:t1}""#.into(),
        r#"2.2 [0 lua] "SET" "chaos:{%t:t1}" "1700000000000123""#.into(),
        r#"2.3 [0 lua] "PUBLISH" "chaos:near-tier" "0 chaos:{%t:t1}""#.into(),
        "C".into(),
        r#"3.1 [0 lua] "GET" "chaos:{%c}""#.into(),
        r#"3.2 [0 lua] "SET" "chaos:{%c}" "1700000000000500""#.into(),
        r#"3.3 [0 lua] "PUBLISH" "chaos:near-tier" "0 chaos:{%c}""#.into(),
        "C".into(),
        r#"4.1 [0 lua] "GET" "chaos:{k0}_fence""#.into(),
        format!(
            r#"4.2 [0 lua] "SET" "chaos:{{k0}}" "{}" "PX" "900""#,
            monitor_envelope(101, (1_700_000_000_000_600, &["t1", "t2"]), v)
        ),
        r#"4.3 [0 lua] "PUBLISH" "chaos:near-tier" "101 chaos:{k0}""#.into(),
        "C".into(),
        // A tag whose name needs escaping, raised without a near channel (no announcement).
        r#"5.1 [0 lua] "GET" "chaos:{%t:a%20b}""#.into(),
        r#"5.2 [0 lua] "SET" "chaos:{%t:a%20b}" "1700000000000700""#.into(),
        "C".into(),
        r#"6.1 [0 lua] "SET" "chaos:{%t:t2}" "not a number""#.into(),
    ]
    .to_vec();
    assert!(
        lines.iter().all(|l| !is_outside_write(l)),
        "no script command is an outside write"
    );
    let (events, changes) = replay(NAMESPACE, 0, &lines);
    let raise = |epoch: Epoch, value, at_us, announced| {
        ServerEvent::Raise(Raise {
            epoch,
            value,
            at_us,
            announced,
        })
    };
    assert_eq!(
        events,
        vec![
            ServerEvent::Life(0),
            raise(
                Epoch::Tag("t1".into()),
                1_700_000_000_000_123,
                2_100_000,
                true
            ),
            raise(Epoch::Clear, 1_700_000_000_000_500, 3_100_000, true),
            ServerEvent::Write(Write {
                key: "k0".into(),
                computed: true,
                token: 101,
                fence: 101,
                counter: None,
                value: v.into(),
                born: 1_700_000_000_000_600,
                tags: vec!["t1".into(), "t2".into()],
                at_us: 4_100_000,
            }),
            raise(
                Epoch::Tag("a b".into()),
                1_700_000_000_000_700,
                5_100_000,
                false
            ),
            ServerEvent::Unreadable {
                key: "chaos:{%t:t2}".into(),
                reason: r#"an epoch set to "not a number", not a number"#.into(),
            },
        ]
    );
    // Only the value's write changed a value: a raise changes none (the near tiers hear of it
    // by the epoch, and rule (h) judges what it invalidated).
    assert_eq!(
        changes,
        vec![Change {
            key: "k0".into(),
            at_us: 4_100_000,
            value: Some(v.into()),
        }]
    );
    // An epoch key is no entry's key, and an entry's key is no epoch.
    for key in ["chaos:{%c}", "chaos:{%t:t1}"] {
        assert_eq!(value_name(NAMESPACE, key), None, "{key}");
        assert_eq!(lock_name(NAMESPACE, key), None, "{key}");
    }
    for key in [
        "chaos:{k0}",
        "chaos:{%25c}",
        "chaos:{k0}_lock",
        "other:{%c}",
    ] {
        assert_eq!(epoch_name(NAMESPACE, key), None, "{key}");
    }
}

/// A cluster's merged log (`N <node>` before each script, `M <node> <entry>` for a migration):
/// node 0 seeds k0's counter at 100 and grants 101; a failover puts k0 on node 1, which grants
/// a token the replay counts from 0 until node 1 accepts a computed write with fence 101: the
/// counter was 100 at the switch, so node 0's 101 was lost, and node 1's acquisition is patched
/// to 101. A migration to node 2 carries the counter (no switch); a switch with no write after
/// it stays unproven, one whose counter was gone is reseeded, one the controller's probe
/// reads the counter of after it is proven by the probe, and one whose first bump set the
/// counter to the clock (`SET ... KEEPTTL`) is raised.
fn monitor_replay_follows_the_counters_across_a_clusters_nodes() {
    let acquire = |at: &str, seed: Option<&str>| {
        let mut lines = vec![
            format!(r#"{at} [0 lua] "SET" "chaos:{{k0}}_lock" "t" "NX" "PX" "400""#),
            format!(r#"{at} [0 lua] "INCR" "chaos:{{k0}}_fence""#),
        ];
        if let Some(seed) = seed {
            lines.push(format!(r#"{at} [0 lua] "TIME""#));
            lines.push(format!(
                r#"{at} [0 lua] "SET" "chaos:{{k0}}_fence" "{seed}" "PX" "800""#
            ));
        }
        lines
    };
    let v = "V|k0|101|w1.1|1|-";
    let mut lines: Vec<String> = vec!["N 0".into()];
    lines.extend(acquire("1.0", Some("100")));
    lines.extend(["C".into(), "N 0".into()]);
    lines.extend(acquire("2.0", None));
    lines.extend(["C".into(), "N 1".into()]);
    lines.extend(acquire("3.0", None));
    lines.extend(["C".into(), "N 1".into()]);
    lines.push(r#"4.0 [0 lua] "GET" "chaos:{k0}_fence""#.into());
    lines.push(format!(
        r#"4.1 [0 lua] "SET" "chaos:{{k0}}" "{}" "PX" "900""#,
        monitor_envelope(101, (0, &[]), v)
    ));
    lines.extend(["C".into(), "M 2 k0".into(), "N 2".into()]);
    lines.extend(acquire("5.0", None));
    // A failover to node 3 that nothing proves, then one to node 4 whose counter was gone.
    lines.extend(["C".into(), "N 3".into()]);
    lines.extend(acquire("6.0", None));
    lines.extend(["C".into(), "N 4".into()]);
    lines.extend(acquire("7.0", Some("900")));
    // A failover to node 5, proven by the controller's probe of the counter (901 after one
    // bump there: it went on from 900).
    lines.extend(["C".into(), "N 5".into()]);
    lines.extend(acquire("8.0", None));
    lines.extend([
        "C".into(),
        "N 5".into(),
        r#"9.0 [0 lua] "GET" "chaos:{k0}_fence""#.into(),
        r#"9.1 [0 lua] "ECHO" "probe chaos:{k0}_fence 901""#.into(),
    ]);
    // A failover to node 6, whose first bump sets the counter to its clock (950, above 901 +
    // 1): raised, its start unknown; a later bump in the same µs is counted from the clock.
    lines.extend(["C".into(), "N 6".into()]);
    lines.extend(acquire("10.0", None));
    lines.push(r#"10.0 [0 lua] "TIME""#.into());
    lines.push(r#"10.0 [0 lua] "SET" "chaos:{k0}_fence" "950" "KEEPTTL""#.into());
    lines.extend(["C".into(), "N 6".into()]);
    lines.extend(acquire("11.0", None));
    let (events, _) = replay(NAMESPACE, 0, &lines);
    let acquired = |token| ServerEvent::Acquire {
        key: "k0".into(),
        token,
    };
    let rollback = |at_us, to, reseeded, from, lost: Vec<(u64, &'static str)>, survivor| {
        ServerEvent::Rollback(Rollback {
            key: "k0".into(),
            at_us,
            to,
            reseeded,
            raised: false,
            from,
            lost,
            survivor,
        })
    };
    let ServerEvent::Write(written) = &events[5] else {
        panic!("a write after the switch: {events:?}");
    };
    assert_eq!((written.fence, written.counter), (101, Some(101)));
    assert_eq!(
        events,
        vec![
            ServerEvent::Life(0),
            acquired(100),
            acquired(101),
            rollback(
                3_000_000,
                Some(100),
                false,
                Some(101),
                vec![(101, "acquisition")],
                Some((Some(100), "acquisition"))
            ),
            acquired(101),
            events[5].clone(),
            acquired(102),
            rollback(6_000_000, None, false, Some(102), vec![], None),
            acquired(1),
            rollback(7_000_000, None, true, None, vec![], None),
            acquired(900),
            rollback(
                8_000_000,
                Some(900),
                false,
                Some(900),
                vec![],
                Some((Some(900), "acquisition"))
            ),
            acquired(901),
            ServerEvent::Rollback(Rollback {
                key: "k0".into(),
                at_us: 10_000_000,
                to: None,
                reseeded: false,
                raised: true,
                from: Some(901),
                lost: vec![],
                survivor: None,
            }),
            acquired(950),
            acquired(951),
        ]
    );
}
