//! What a computed key costs the server (issue 38), for the steady state's JSON line:
//! - `redis_usec_per_compute`: the server's time in the commands clients sent, from
//!   `INFO commandstats` (reset at the round's start), over the round's computations. A script's
//!   `usec` includes the commands it runs, so those (`INNER`) are left out of the sum, as is the
//!   generator's bookkeeping; a `GET` a client sent is also one a script may run, and is counted.
//! - `redis_cpu_usec_per_compute`: the server process's CPU (`INFO cpu`, user + system, all
//!   threads), before and after the round, over the same computations: networking included.
//! - `requests_per_won_miss`: after the round, one computation of a fresh key by a warm cache,
//!   under `MONITOR`: the commands that client sent (scripts' own commands, `[0 lua]`, left out).

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

use crate::admin::{commandstats_sum, Admin};
use crate::config::{Config, Target};
use crate::BoxError;

/// Commands only this crate's scripts run (clients send none of them in the churn soak), and the
/// generator's bookkeeping (its counters' `INCR`s are among the scripts' `incr`s: left out too).
const INNER: [&str; 10] = [
    "set", "incr", "time", "pttl", "pexpire", "persist", "exists", "del", "publish", "spublish",
];

/// The server's time in client-sent commands since `CONFIG RESETSTAT`, in µs (see the module).
pub(crate) fn command_usec(admin: &mut Admin) -> Result<u64, BoxError> {
    let mut total = 0;
    for conn in &mut admin.masters {
        let stats: String = redis::cmd("INFO").arg("commandstats").query(conn)?;
        total += client_usec(&stats);
    }
    Ok(total)
}

fn client_usec(stats: &str) -> u64 {
    commandstats_sum(stats, "usec=", |name| {
        INNER.contains(&name)
            || matches!(name, "info" | "flushdb" | "hello" | "monitor" | "echo")
            || name.starts_with("config|")
            || name.starts_with("client|")
    })
}

/// The masters' processes' CPU so far (user + system), in µs.
pub(crate) fn cpu_usec(admin: &mut Admin) -> Result<u64, BoxError> {
    let mut total = 0.0;
    for conn in &mut admin.masters {
        let info: String = redis::cmd("INFO").arg("cpu").query(conn)?;
        total += info
            .lines()
            .filter_map(|line| {
                let (name, value) = line.split_once(':')?;
                matches!(name, "used_cpu_sys" | "used_cpu_user")
                    .then(|| value.trim().parse::<f64>().ok())?
            })
            .sum::<f64>();
    }
    Ok((total * 1e6) as u64)
}

/// The commands one won miss sends, counted under `MONITOR` (one server only: `None` on a
/// cluster, whose nodes each need a monitor).
pub(crate) fn requests_per_won_miss(config: &Config) -> Result<Option<usize>, BoxError> {
    let Target::Server(url) = &config.target else {
        return Ok(None);
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let cache = config.cache().await?;
        let compute = |n: u64| move || async move { Ok::<_, String>(n) };
        let _: u64 = cache
            .get_or_compute("cost-probe-warm-up", config.ttl, compute(1))
            .await?;
        // What the first answer starts in the background (the clock, the held epoch) settles.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut monitor = Monitor::start(url)?;
        let _: u64 = cache
            .get_or_compute("cost-probe-won-miss", config.ttl, compute(2))
            .await?;
        Ok(Some(monitor.client_commands(url)?))
    })
}

/// A `MONITOR` connection, read line by line.
struct Monitor {
    lines: BufReader<TcpStream>,
}

impl Monitor {
    fn start(url: &str) -> Result<Self, BoxError> {
        let mut stream = TcpStream::connect(address(url))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.write_all(b"MONITOR\r\n")?;
        let mut lines = BufReader::new(stream);
        let mut ok = String::new();
        lines.read_line(&mut ok)?;
        if ok.trim() != "+OK" {
            return Err(format!("MONITOR answered {ok:?}").into());
        }
        Ok(Monitor { lines })
    }

    /// The commands clients sent since the start, up to a marker sent now.
    fn client_commands(&mut self, url: &str) -> Result<usize, BoxError> {
        let marker = "stampede-bench-cost-marker";
        let mut conn = redis::Client::open(url)?.get_connection()?;
        let _: String = redis::cmd("ECHO").arg(marker).query(&mut conn)?;
        let mut sent = 0;
        loop {
            let mut line = String::new();
            if self.lines.read_line(&mut line)? == 0 {
                return Err("MONITOR closed before the marker".into());
            }
            if line.contains(marker) {
                break;
            }
            if !line.contains(" lua] ") {
                sent += 1;
            }
        }
        let _ = self.lines.get_ref().shutdown(Shutdown::Both);
        Ok(sent)
    }
}

/// `host:port` of `redis://[user:password@]host:port[/db]`.
fn address(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest).to_owned()
}
