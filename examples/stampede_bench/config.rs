//! The command line of BENCH.md (parsed by hand, by the parent and again by each worker), and
//! the cache and call options that the flags choose.

use std::time::Duration;

use stampede_guard::{Cache, CallOptions, NearCacheOptions, OnBackendError};

use crate::{BoxError, NAMESPACE};

/// How the value is cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `get_or_compute`: each missing key computed once.
    Guarded,
    /// Plain cache-aside through the same cache: `get`, on a miss compute and `set`.
    Naive,
}

/// How values expire (`--expiry-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expiry {
    /// At the TTL; the next caller computes and the others wait.
    Hard,
    /// Served for one more TTL after it, while one caller refreshes in the background.
    Stale,
    /// Refreshed before the TTL with XFetch's probability (beta 1.0).
    Xfetch,
}

impl Expiry {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Expiry::Hard => "hard",
            Expiry::Stale => "stale",
            Expiry::Xfetch => "xfetch",
        }
    }

    pub(crate) fn options(self, ttl: Duration) -> CallOptions {
        let options = CallOptions::default();
        match self {
            Expiry::Hard => options,
            Expiry::Stale => options.stale_for(ttl),
            Expiry::Xfetch => options.early_refresh(1.0),
        }
    }
}

/// What `--url` names: one server (the contract), or seed nodes of a Redis Cluster.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    Server(String),
    Cluster(Vec<String>),
}

impl Target {
    /// One URL is a server; a comma-separated list of several is a cluster's seed nodes.
    pub(crate) fn parse(urls: &str) -> Result<Self, BoxError> {
        let mut seeds: Vec<String> = urls
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect();
        match seeds.len() {
            0 => Err(format!("--url is required\n{USAGE}").into()),
            1 => Ok(Target::Server(seeds.remove(0))),
            _ => Ok(Target::Cluster(seeds)),
        }
    }

    /// Whether `self` and `other` name the same server(s): the same host and port (whatever
    /// the db or the login), or the same seed list. Decides whether the cache's server also
    /// counted the computations' INCRs.
    pub(crate) fn same_servers(&self, other: &Target) -> bool {
        let address = |url: &str| {
            redis::Client::open(url)
                .map(|c| c.get_connection_info().addr().to_string())
                .unwrap_or_else(|_| url.to_owned())
        };
        match (self, other) {
            (Target::Server(a), Target::Server(b)) => address(a) == address(b),
            (Target::Cluster(a), Target::Cluster(b)) => {
                let sorted = |seeds: &[String]| {
                    let mut addresses: Vec<String> = seeds.iter().map(|u| address(u)).collect();
                    addresses.sort();
                    addresses
                };
                sorted(a) == sorted(b)
            }
            _ => false,
        }
    }
}

/// `--outage-at-secs A --outage-secs B`: the cache's server is frozen (`DEBUG SLEEP B`) at
/// second A of the steady clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outage {
    /// When, from the release of the callers.
    pub(crate) at: Duration,
    /// How long the server sleeps.
    pub(crate) length: Duration,
}

/// The command line of BENCH.md; workers re-parse the same arguments.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) target: Target,
    pub(crate) processes: usize,
    pub(crate) tasks: usize,
    pub(crate) keys: usize,
    pub(crate) compute: Duration,
    pub(crate) payload: usize,
    pub(crate) rounds: usize,
    pub(crate) ttl: Duration,
    pub(crate) mode: Mode,
    pub(crate) expiry: Expiry,
    /// `Some(N)`: one steady-state run of N seconds instead of the rounds.
    pub(crate) steady: Option<Duration>,
    /// In steady state, each caller's pause between two calls.
    pub(crate) think: Duration,
    /// `Some(N)`: every worker's cache has a near tier of at most N entries.
    pub(crate) near: Option<u64>,
    /// The fail-safe duration, if given.
    pub(crate) fail_safe: Option<Duration>,
    /// The soft timeout, if given.
    pub(crate) soft_timeout: Option<Duration>,
    /// The hard timeout (`max_hold`), if given.
    pub(crate) hard_timeout: Option<Duration>,
    /// In steady state, every computation fails from this far into the run on.
    pub(crate) fail_after: Option<Duration>,
    /// Each caller asks for its K keys in one `get_or_compute_many` call.
    pub(crate) batch: bool,
    /// `--compute-uncached`: a call whose backend is down computes without the cache
    /// (`OnBackendError::ComputeUncached`).
    pub(crate) compute_uncached: bool,
    /// Where the computations count themselves (`--counter-url`); `--url`'s server(s) unless
    /// given, so that the cache's server can fail without losing the count.
    pub(crate) counters: Target,
    /// In steady state, the cache's server is frozen for a while (`--outage-at-secs`,
    /// `--outage-secs`).
    pub(crate) outage: Option<Outage>,
    /// How long the near tier may serve what it holds while the backend is unreachable
    /// (`--serve-while-down-secs`; see [`near_options`]).
    pub(crate) serve_while_down: Option<Duration>,
}

pub(crate) const USAGE: &str = "usage: stampede_bench --url redis://HOST:PORT/DB[,redis://HOST:PORT...] \
[--processes P] [--tasks T] [--keys K] [--compute-ms C] [--payload S] [--rounds R] [--ttl SECONDS] [--mode guarded|naive] \
[--expiry-mode hard|stale|xfetch] [--steady-secs N] [--think-ms MS] [--near-cache N] \
[--fail-safe-secs S] [--soft-timeout-ms MS] [--hard-timeout-ms MS] [--fail-after-secs N] [--batch] \
[--counter-url redis://HOST:PORT/DB] [--outage-at-secs A --outage-secs B] [--serve-while-down-secs N] \
[--compute-uncached]";

impl Config {
    /// Parses the flags by hand: a flat list of flags with one value each does not need a
    /// parser crate.
    pub(crate) fn from_args(args: impl Iterator<Item = String>) -> Result<Self, BoxError> {
        let (mut url, mut counter_url) = (String::new(), None::<String>);
        let (mut outage_at, mut outage_length) = (None::<Duration>, None::<Duration>);
        let mut config = Config {
            target: Target::Server(String::new()),
            processes: 4,
            tasks: 25,
            keys: 12,
            compute: Duration::from_millis(200),
            payload: 1024,
            rounds: 3,
            ttl: Duration::from_secs(300),
            mode: Mode::Guarded,
            expiry: Expiry::Hard,
            steady: None,
            think: Duration::from_millis(10),
            near: None,
            fail_safe: None,
            soft_timeout: None,
            hard_timeout: None,
            fail_after: None,
            batch: false,
            compute_uncached: false,
            counters: Target::Server(String::new()),
            outage: None,
            serve_while_down: None,
        };
        let mut args = args;
        while let Some(flag) = args.next() {
            if flag == "--help" || flag == "-h" {
                return Err(USAGE.into());
            }
            // The flags without a value.
            if flag == "--batch" {
                config.batch = true;
                continue;
            }
            if flag == "--compute-uncached" {
                config.compute_uncached = true;
                continue;
            }
            let value = args
                .next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
            let number = || {
                value
                    .parse::<u64>()
                    .map_err(|_| format!("{flag} takes a whole number, not {value:?}"))
            };
            match flag.as_str() {
                "--url" => url = value.clone(),
                "--processes" => config.processes = number()? as usize,
                "--tasks" => config.tasks = number()? as usize,
                "--keys" => config.keys = number()? as usize,
                "--compute-ms" => config.compute = Duration::from_millis(number()?),
                "--payload" => config.payload = number()? as usize,
                "--rounds" => config.rounds = number()? as usize,
                "--ttl" => config.ttl = Duration::from_secs(number()?),
                "--mode" => {
                    config.mode = match value.as_str() {
                        "guarded" => Mode::Guarded,
                        "naive" => Mode::Naive,
                        other => {
                            return Err(format!("--mode is guarded or naive, not {other:?}").into())
                        }
                    }
                }
                "--expiry-mode" => {
                    config.expiry = match value.as_str() {
                        "hard" => Expiry::Hard,
                        "stale" => Expiry::Stale,
                        "xfetch" => Expiry::Xfetch,
                        other => {
                            return Err(format!(
                                "--expiry-mode is hard, stale or xfetch, not {other:?}"
                            )
                            .into())
                        }
                    }
                }
                "--steady-secs" => config.steady = Some(Duration::from_secs(number()?)),
                "--think-ms" => config.think = Duration::from_millis(number()?),
                "--near-cache" => config.near = Some(number()?),
                "--fail-safe-secs" => config.fail_safe = Some(Duration::from_secs(number()?)),
                "--soft-timeout-ms" => config.soft_timeout = Some(Duration::from_millis(number()?)),
                "--hard-timeout-ms" => config.hard_timeout = Some(Duration::from_millis(number()?)),
                "--fail-after-secs" => config.fail_after = Some(Duration::from_secs(number()?)),
                "--counter-url" => counter_url = Some(value.clone()),
                "--outage-at-secs" => outage_at = Some(Duration::from_secs(number()?)),
                "--outage-secs" => outage_length = Some(Duration::from_secs(number()?)),
                "--serve-while-down-secs" => {
                    config.serve_while_down = Some(Duration::from_secs(number()?))
                }
                other => return Err(format!("unknown flag {other:?}\n{USAGE}").into()),
            }
        }
        config.target = Target::parse(&url)?;
        config.counters = match counter_url {
            Some(urls) => Target::parse(&urls)?,
            None => config.target.clone(),
        };
        config.outage = match (outage_at, outage_length) {
            (None, None) => None,
            (Some(at), Some(length)) => Some(Outage { at, length }),
            _ => {
                return Err(
                    format!("--outage-at-secs and --outage-secs go together\n{USAGE}").into(),
                )
            }
        };
        if let Some(outage) = config.outage {
            let Some(steady) = config.steady else {
                return Err(format!("--outage-at-secs needs --steady-secs\n{USAGE}").into());
            };
            if outage.at >= steady {
                return Err(format!(
                    "--outage-at-secs must be less than --steady-secs, or the outage is not in the run\n{USAGE}"
                )
                .into());
            }
            if outage.length.is_zero() {
                return Err(format!("--outage-secs must be at least 1 second\n{USAGE}").into());
            }
            if let Target::Cluster(_) = config.target {
                // DEBUG SLEEP freezes one server; which node of a cluster to freeze is a
                // different experiment.
                return Err(
                    format!("--outage-at-secs needs a single server --url\n{USAGE}").into(),
                );
            }
        }
        if config.serve_while_down.is_some() && config.near.is_none() {
            return Err(format!("--serve-while-down-secs needs --near-cache\n{USAGE}").into());
        }
        if config.processes == 0 || config.tasks == 0 || config.keys == 0 {
            return Err("--processes, --tasks and --keys must be at least 1".into());
        }
        if config.ttl.is_zero() {
            return Err("--ttl must be at least 1 second".into());
        }
        if config.fail_after.is_some() && config.steady.is_none() {
            return Err(format!("--fail-after-secs needs --steady-secs\n{USAGE}").into());
        }
        if config.fail_safe.is_some_and(|d| d.is_zero()) {
            return Err("--fail-safe-secs must be at least 1 second".into());
        }
        Ok(config)
    }

    /// The call options of the workers' caches: the expiry mode's, and the fail-safe's.
    pub(crate) fn options(&self) -> CallOptions {
        let mut options = self.expiry.options(self.ttl);
        if let Some(keep) = self.fail_safe {
            options = options.fail_safe_for(keep);
        }
        if self.compute_uncached {
            options = options.on_backend_error(OnBackendError::ComputeUncached);
        }
        options
            .soft_timeout(self.soft_timeout)
            .max_hold(self.hard_timeout)
    }
}

impl Config {
    /// The cache every worker (and the steady state's warm-up) calls through.
    pub(crate) async fn cache(&self) -> Result<Cache, BoxError> {
        let mut builder = Cache::builder()
            .namespace(NAMESPACE)
            .options(self.options());
        if let Some(entries) = self.near {
            builder = builder.near_cache(near_options(entries, self.serve_while_down));
        }
        let cache = match &self.target {
            Target::Server(url) => builder.redis_url(url.as_str()),
            Target::Cluster(seeds) => builder.redis_cluster(seeds.iter().cloned()),
        }
        .build()
        .await?;
        Ok(cache)
    }

    /// Whether the cache's server also runs the computations' INCRs, which `redis_cmds` then
    /// subtracts: not with `--counter-url` naming another server.
    fn counters_on_cache_server(&self) -> bool {
        self.target.same_servers(&self.counters)
    }

    /// The computations' INCRs that the cache's server ran, given the counts read back: all of
    /// them when the counters live there, none with `--counter-url` naming another server.
    pub(crate) fn counter_incrs(&self, computes: u64, batch_calls: u64) -> u64 {
        if self.counters_on_cache_server() {
            computes + batch_calls
        } else {
            0
        }
    }
}

/// The near tier of every worker's cache (and of the steady state's warm-up): at most `entries`
/// entries, serving what it holds for at most `serve_while_down` while the backend is
/// unreachable.
pub(crate) fn near_options(entries: u64, serve_while_down: Option<Duration>) -> NearCacheOptions {
    let options = NearCacheOptions::new(entries);
    match serve_while_down {
        Some(bound) => options.serve_while_down(bound),
        None => options,
    }
}
