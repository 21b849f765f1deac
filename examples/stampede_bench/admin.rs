//! The parent's own connections: the compute counters, and the servers' flushing and command
//! statistics.

use redis::cluster::ClusterClientBuilder;
use redis::ConnectionAddr;

use crate::config::Target;
use crate::workload::{counter_key, db0_client, BATCH_CALLS_KEY};
use crate::{BoxError, ADMIN_TIMEOUT};

/// Clears the round's counters (on db 0, which FLUSHDB misses when the URL names another db).
pub(crate) fn clear_counters(
    counters: &mut dyn redis::ConnectionLike,
    months: &[String],
) -> Result<(), BoxError> {
    for m in months {
        redis::cmd("DEL").arg(counter_key(m)).exec(&mut *counters)?;
    }
    redis::cmd("DEL")
        .arg(BATCH_CALLS_KEY)
        .exec(&mut *counters)?;
    Ok(())
}

/// The round's counts: computations over every month, and calls of the batch computation.
pub(crate) fn read_counters(
    counters: &mut dyn redis::ConnectionLike,
    months: &[String],
) -> Result<(u64, u64), BoxError> {
    let mut computes = 0u64;
    for m in months {
        let n: Option<u64> = redis::cmd("GET")
            .arg(counter_key(m))
            .query(&mut *counters)?;
        computes += n.unwrap_or(0);
    }
    let batch_calls: Option<u64> = redis::cmd("GET")
        .arg(BATCH_CALLS_KEY)
        .query(&mut *counters)?;
    Ok((computes, batch_calls.unwrap_or(0)))
}

/// The parent's connection to the compute counters: db 0 of the server, or the cluster (the
/// counter keys of different months hash to different slots, which a cluster connection routes).
pub(crate) fn counters_connection(
    target: &Target,
) -> Result<Box<dyn redis::ConnectionLike>, BoxError> {
    Ok(match target {
        Target::Server(url) => {
            Box::new(db0_client(url)?.get_connection_with_timeout(ADMIN_TIMEOUT)?)
        }
        Target::Cluster(seeds) => Box::new(
            ClusterClientBuilder::new(seeds.iter().map(String::as_str))
                .connection_timeout(ADMIN_TIMEOUT)
                .response_timeout(ADMIN_TIMEOUT)
                .build()?
                .get_connection()?,
        ),
    })
}

/// The generator's side of the servers: flushing a round, resetting and reading the command
/// statistics. One server is its own single master. A cluster's nodes are found with
/// `CLUSTER NODES` on a seed and reached each over a plain connection.
pub(crate) struct Admin {
    /// Flushed each round; the round's `redis_cmds` is the sum of their `INFO commandstats`.
    pub(crate) masters: Vec<redis::Connection>,
    /// Statistics reset, never counted: a replica re-executes every write that its master
    /// replicates to it (the effects of scripts included), so counting replicas would count those
    /// writes a second time rather than work that the clients asked for.
    pub(crate) replicas: Vec<redis::Connection>,
}

impl Admin {
    pub(crate) fn connect(target: &Target) -> Result<Self, BoxError> {
        match target {
            Target::Server(url) => Ok(Admin {
                masters: vec![redis::Client::open(url.as_str())?
                    .get_connection_with_timeout(ADMIN_TIMEOUT)?],
                replicas: Vec::new(),
            }),
            Target::Cluster(seeds) => Self::connect_cluster(seeds),
        }
    }

    /// Asks the first seed that answers for `CLUSTER NODES`, and connects to every master and
    /// replica listed there, with the seed's settings (user, password) and the node's address.
    pub(crate) fn connect_cluster(seeds: &[String]) -> Result<Self, BoxError> {
        let mut last_error: BoxError = "no seed URL".into();
        for seed in seeds {
            let listing = redis::Client::open(seed.as_str())
                .and_then(|c| c.get_connection_with_timeout(ADMIN_TIMEOUT))
                .and_then(|mut conn| {
                    redis::cmd("CLUSTER")
                        .arg("NODES")
                        .query::<String>(&mut conn)
                });
            match listing {
                Ok(listing) => return Self::connect_nodes(seed, &listing),
                Err(e) => last_error = format!("cluster seed {seed}: {e}").into(),
            }
        }
        Err(last_error)
    }

    pub(crate) fn connect_nodes(seed: &str, listing: &str) -> Result<Self, BoxError> {
        let seed_info = redis::Client::open(seed)?.get_connection_info().clone();
        let mut admin = Admin {
            masters: Vec::new(),
            replicas: Vec::new(),
        };
        // `<id> <ip:port@cport[,hostname]> <flags> <master id> <ping> <pong> <epoch> <link> <slots>`
        for line in listing.lines().filter(|l| !l.trim().is_empty()) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(address), Some(flags)) = (fields.get(1), fields.get(2)) else {
                return Err(format!("unexpected CLUSTER NODES line {line:?}").into());
            };
            let flags: Vec<&str> = flags.split(',').collect();
            if flags
                .iter()
                .any(|f| matches!(*f, "fail" | "noaddr" | "handshake"))
            {
                eprintln!("stampede_bench: skipping cluster node {address} ({flags:?})");
                continue;
            }
            let host_port = address.split(['@', ',']).next().unwrap_or_default();
            let (host, port) = host_port
                .rsplit_once(':')
                .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
                .ok_or_else(|| format!("unexpected node address {address:?} in CLUSTER NODES"))?;
            let info = seed_info
                .clone()
                .set_addr(ConnectionAddr::Tcp(host.to_owned(), port));
            let mut conn = redis::Client::open(info)?
                .get_connection_with_timeout(ADMIN_TIMEOUT)
                .map_err(|e| format!("cluster node {host_port}: {e}"))?;
            // The node's own word on its role: the seed's listing can lag behind (right after
            // `--cluster create`, a node not yet told that another replicates still lists it
            // as a master, and a write there is refused `READONLY`).
            let role: Vec<redis::Value> = redis::cmd("ROLE")
                .query(&mut conn)
                .map_err(|e| format!("cluster node {host_port}: ROLE: {e}"))?;
            match role.first() {
                Some(redis::Value::BulkString(r)) if r == b"master" => admin.masters.push(conn),
                _ => admin.replicas.push(conn),
            }
        }
        if admin.masters.is_empty() {
            return Err(format!("CLUSTER NODES on {seed} lists no master").into());
        }
        Ok(admin)
    }

    /// Starts a round cold: `FLUSHDB` on every master (replicas follow their masters).
    pub(crate) fn flush(&mut self) -> Result<(), BoxError> {
        for conn in &mut self.masters {
            redis::cmd("FLUSHDB").exec(conn)?;
        }
        Ok(())
    }

    /// `CONFIG RESETSTAT` on every node, replicas included.
    pub(crate) fn reset_stats(&mut self) -> Result<(), BoxError> {
        for conn in self.masters.iter_mut().chain(&mut self.replicas) {
            redis::cmd("CONFIG").arg("RESETSTAT").exec(conn)?;
        }
        Ok(())
    }

    /// Commands that the masters ran since [`reset_stats`](Self::reset_stats), without the
    /// generator's own bookkeeping (see [`commands_executed`]). On a cluster this includes the
    /// `REPLCONF ACK` that each replica sends its master once a second: a few per round.
    pub(crate) fn commands_executed(&mut self) -> Result<u64, BoxError> {
        let mut total = 0;
        for conn in &mut self.masters {
            let stats: String = redis::cmd("INFO").arg("commandstats").query(conn)?;
            total += commands_executed(&stats);
        }
        Ok(total)
    }
}
/// Commands the server ran since `CONFIG RESETSTAT`, from `INFO commandstats`, without the
/// generator's own bookkeeping (BENCH.md): `info`, `config|*`, `flushdb`, `client|*`, `hello`.
pub(crate) fn commands_executed(stats: &str) -> u64 {
    commandstats_sum(stats, "calls=", |name| {
        matches!(name, "info" | "flushdb" | "hello")
            || name.starts_with("config|")
            || name.starts_with("client|")
    })
}

/// The sum of one field (`calls=`, `usec=`) of `INFO commandstats` over the commands that
/// `skip` does not name.
pub(crate) fn commandstats_sum(stats: &str, field: &str, skip: impl Fn(&str) -> bool) -> u64 {
    stats
        .lines()
        .filter_map(|line| line.strip_prefix("cmdstat_"))
        .filter_map(|line| {
            let (name, fields) = line.split_once(':')?;
            if skip(name) {
                return None;
            }
            fields
                .split(',')
                .find_map(|f| f.strip_prefix(field))
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum()
}
