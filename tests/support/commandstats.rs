//! What a server ran, from `INFO commandstats`: to count the commands an operation costs
//! (`CONFIG RESETSTAT` before, the counts after). Scripts' own commands (`redis.call` inside
//! an `EVALSHA`) are counted under their names too. Needs `server` declared beside it.

use std::collections::BTreeMap;

use super::server::{admin, RedisServer};

/// Zeroes the server's command counts.
pub fn reset_command_stats(server: &RedisServer) {
    let _: () = redis::cmd(&admin("CONFIG"))
        .arg("RESETSTAT")
        .query(&mut server.conn())
        .expect("CONFIG RESETSTAT");
}

/// How many times the server ran each command since the last [`reset_command_stats`], but
/// the `INFO` and `CONFIG` calls of the caller itself (under its admin name on a managed-like
/// server) and what a client sends when it opens a connection (`AUTH`, `HELLO`, `SELECT`,
/// `CLIENT SETINFO`/`SETNAME`/`ID`/`TRACKING`, as `monitor.rs` leaves out): connections open
/// lazily, so maybe while counting; Redis 7.2 and later and Valkey run `CLIENT SETINFO`, which
/// Redis 7.0 refuses, and the crate logs in as a user of its own on a managed-like server. By
/// name, in order.
pub fn commands_since_reset(server: &RedisServer) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.conn())
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .filter(|(name, _)| {
            !name.starts_with("info")
                && !name.starts_with("config")
                && !name.starts_with("stampede-admin-")
                && !matches!(
                    name.as_str(),
                    "auth"
                        | "hello"
                        | "select"
                        | "client|setinfo"
                        | "client|setname"
                        | "client|id"
                        | "client|tracking"
                )
        })
        .collect()
}
