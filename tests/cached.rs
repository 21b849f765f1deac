//! `#[stampede_guard::cached]` (feature `macros`) at run time, on the embedded store and on a
//! real redis-server: one run of the body for concurrent calls, the key built from the
//! arguments, a method whose cache is a field of `self`, and errors that keep their type.
// The expansion must not make a one-expression body's braces a warning (`month_len`).
#![deny(unused_braces)]

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod cache;
    pub mod server;
    pub use {cache::*, server::*};
}

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stampede_guard::{cached, Cache, CallOptions, Error};
use support::RedisServer;
use tokio::sync::Semaphore;

/// An application's error, as a handler would have it: its own failures, and the cache's.
#[derive(Debug)]
enum AppError {
    NotFound(String),
    Cache(Error),
}

impl From<Error> for AppError {
    fn from(error: Error) -> Self {
        AppError::Cache(error)
    }
}

impl fmt::Display for AppError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AppError::NotFound(what) => write!(f, "no report for {what}"),
            AppError::Cache(error) => write!(f, "cache: {error}"),
        }
    }
}

/// A service handle, as handler state is: cheap to clone, its cache a field.
#[derive(Clone)]
struct Reports {
    cache: Cache,
    /// How many times a body ran.
    runs: Arc<AtomicUsize>,
    /// A body waits for a permit here, so that a test decides when it finishes.
    gate: Arc<Semaphore>,
}

impl Reports {
    fn new(cache: Cache) -> Self {
        Reports {
            cache,
            runs: Arc::new(AtomicUsize::new(0)),
            gate: Arc::new(Semaphore::new(0)),
        }
    }

    #[cached(cache = self.cache, key = "total:{month}", ttl_secs = 300)]
    async fn total(&self, month: &str) -> Result<u64, AppError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        pass(&self.gate).await;
        Ok(month.len() as u64 * 100)
    }

    #[cached(
        cache = self.cache,
        key = "sales:{shop}:{day:02}",
        ttl = Duration::from_secs(60),
        options = CallOptions::default().wait_timeout(Duration::from_secs(30))
    )]
    async fn sales(&self, shop: String, day: u32) -> Result<String, AppError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(format!("{shop} sold on day {day}"))
    }

    #[cached(cache = self.cache, key = "missing:{month}", ttl_secs = 300)]
    async fn missing(&self, month: String) -> Result<u64, AppError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        pass(&self.gate).await;
        Err(AppError::NotFound(month))
    }
}

/// A one-expression body on one line: its braces are the expansion's, so no `unused_braces`
/// (denied in this file) on the user's function.
#[rustfmt::skip]
#[cached(cache = cache, key = "len:{month}", ttl_secs = 300)]
async fn month_len(cache: &Cache, month: String) -> Result<u64, Error> { Ok(month.len() as u64) }

/// Waits for a permit of `gate` and uses it up: each permit lets one body finish.
async fn pass(gate: &Semaphore) {
    gate.acquire()
        .await
        .expect("the gate is never closed")
        .forget();
}

/// Runs `calls` concurrent calls of `call` whose bodies wait at the gate, and opens it for
/// them once they have all started and had time to reach the cache (the test's runtime has one
/// thread: while this task sleeps, each call runs until it waits on the running body, or on
/// the server's answer). Whether they overlapped is checked afterwards from the counters.
async fn concurrently<T, F, Fut>(
    reports: &Reports,
    calls: usize,
    call: F,
) -> Vec<Result<T, AppError>>
where
    T: Send + 'static,
    F: Fn(Reports) -> Fut,
    Fut: std::future::Future<Output = Result<T, AppError>> + Send + 'static,
{
    let started = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..calls)
        .map(|_| {
            let (call, started) = (call(reports.clone()), started.clone());
            tokio::spawn(async move {
                started.fetch_add(1, Ordering::SeqCst);
                call.await
            })
        })
        .collect();
    while started.load(Ordering::SeqCst) < calls {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    reports.gate.add_permits(calls);
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.expect("no call panics"));
    }
    results
}

/// Ten concurrent calls of one key, all missing: one run of the body, one value for all.
async fn ten_calls_run_the_body_once(cache: Cache) {
    let reports = Reports::new(cache.clone());
    let results = concurrently(&reports, 10, |r| async move { r.total("2019-05").await }).await;
    for result in results {
        assert_eq!(result.expect("the value"), 700);
    }
    let stats = cache.stats();
    assert_eq!(
        (stats.misses, stats.hits),
        (10, 0),
        "all ten overlapped: {stats:?}"
    );
    assert_eq!(reports.runs.load(Ordering::SeqCst), 1, "{stats:?}");
    // A later call is a hit: the body does not run again.
    assert_eq!(reports.total("2019-05").await.expect("a hit"), 700);
    assert_eq!(reports.runs.load(Ordering::SeqCst), 1);
    assert_eq!(cache.in_flight(), 0, "nothing left behind");
}

/// The key is the template filled with the arguments (`{day:02}` formatted as `format!` would);
/// the options and a `Duration` TTL are taken.
async fn the_key_is_the_template_filled_in(cache: Cache) {
    let reports = Reports::new(cache.clone());
    let sold = reports
        .sales("north".to_string(), 7)
        .await
        .expect("a value");
    assert_eq!(sold, "north sold on day 7");
    let stored: Option<String> = cache.get("sales:north:07").await.expect("a read");
    assert_eq!(stored.as_deref(), Some("north sold on day 7"));
    // Other arguments are another key; the same ones are a hit.
    reports
        .sales("south".to_string(), 7)
        .await
        .expect("a value");
    reports
        .sales("north".to_string(), 7)
        .await
        .expect("a value");
    assert_eq!(reports.runs.load(Ordering::SeqCst), 2);
}

/// The body's error comes back as it was to the call that ran it; a call that waited on that
/// run gets the cache's error in `E`, carrying the message; nothing is cached.
async fn errors_keep_their_type(cache: Cache) {
    let reports = Reports::new(cache.clone());
    reports.gate.add_permits(1);
    match reports.missing("2019-05".to_string()).await {
        Err(AppError::NotFound(month)) => assert_eq!(month, "2019-05"),
        other => panic!("expected the body's own NotFound, got {other:?}"),
    }

    let month = || "2019-06".to_string();
    let results = concurrently(&reports, 5, |r| async move { r.missing(month()).await }).await;
    let (mut own, mut shared) = (0, 0);
    for result in results {
        match result {
            Err(AppError::NotFound(month)) => {
                assert_eq!(month, "2019-06");
                own += 1;
            }
            Err(AppError::Cache(error)) => {
                assert!(error.is_compute(), "{error:?}");
                let source = std::error::Error::source(&error).expect("the body's error");
                assert_eq!(source.to_string(), "no report for 2019-06");
                shared += 1;
            }
            Ok(value) => panic!("a failing body gave {value}"),
        }
    }
    // Each run's error goes back whole to its own caller; every other caller shared a run.
    let runs = reports.runs.load(Ordering::SeqCst) - 1;
    assert_eq!((own, shared), (runs, 5 - runs));
    assert_eq!(runs, 1, "one run for the five concurrent calls");
    let nothing: Option<u64> = cache.get("missing:2019-06").await.expect("a read");
    assert_eq!(nothing, None, "a failure is not cached");
}

#[tokio::test]
async fn memory_ten_calls_run_the_body_once() {
    ten_calls_run_the_body_once(Cache::in_memory()).await;
}

#[tokio::test]
async fn memory_the_key_is_the_template_filled_in() {
    the_key_is_the_template_filled_in(Cache::in_memory()).await;
    let cache = Cache::in_memory();
    assert_eq!(month_len(&cache, "2019-05".into()).await.unwrap(), 7);
    assert_eq!(cache.get::<u64>("len:2019-05").await.unwrap(), Some(7));
}

#[tokio::test]
async fn memory_errors_keep_their_type() {
    errors_keep_their_type(Cache::in_memory()).await;
}

#[tokio::test]
async fn redis_ten_calls_run_the_body_once() {
    let server = RedisServer::start();
    let cache = support::cache(&server, "cached", CallOptions::default()).await;
    ten_calls_run_the_body_once(cache).await;
}

#[tokio::test]
async fn redis_the_key_is_the_template_filled_in() {
    let server = RedisServer::start();
    let cache = support::cache(&server, "cached", CallOptions::default()).await;
    the_key_is_the_template_filled_in(cache).await;
}

#[tokio::test]
async fn redis_errors_keep_their_type() {
    let server = RedisServer::start();
    let cache = support::cache(&server, "cached", CallOptions::default()).await;
    errors_keep_their_type(cache).await;
}

/// The cache's own failures come back as `E::from(Error)`: here Redis is gone.
#[tokio::test]
async fn redis_a_backend_failure_is_the_functions_error_too() {
    let mut server = RedisServer::start();
    let cache = support::cache(&server, "cached", CallOptions::default()).await;
    server.kill();
    let reports = Reports::new(cache);
    reports.gate.add_permits(1);
    match reports.total("2019-05").await {
        Err(AppError::Cache(error)) => assert!(error.is_backend(), "{error:?}"),
        other => panic!("expected the cache's backend error, got {other:?}"),
    }
    assert_eq!(
        reports.runs.load(Ordering::SeqCst),
        0,
        "no body ran without the cache"
    );
}

/// An error type with `From<Error>` and nothing else: no `Display`, no `Debug` (an axum
/// handler's error enum often has neither). `#[cached]` takes it as it is.
enum Bare {
    Missing(String),
    Cache(Error),
}

impl From<Error> for Bare {
    fn from(error: Error) -> Self {
        Bare::Cache(error)
    }
}

/// `Debug` only: the cache's copy of its text is its `Debug`.
#[derive(Debug)]
enum DebugOnly {
    Missing(String),
    Cache(Error),
}

impl From<Error> for DebugOnly {
    fn from(error: Error) -> Self {
        DebugOnly::Cache(error)
    }
}

#[cached(cache = cache, key = "bare:{month}", ttl_secs = 300)]
async fn bare(cache: &Cache, gate: Arc<Semaphore>, month: String) -> Result<u64, Bare> {
    pass(&gate).await;
    Err(Bare::Missing(month))
}

#[cached(cache = cache, key = "debug:{month}", ttl_secs = 300)]
async fn debug_only(cache: &Cache, gate: Arc<Semaphore>, month: String) -> Result<u64, DebugOnly> {
    pass(&gate).await;
    Err(DebugOnly::Missing(month))
}

/// Two overlapping calls of `call` for `month`: the first runs the body, the second waits on
/// it; then the gate opens for the one body. Returns (the first's result, the second's).
async fn overlapping<T, F, Fut>(cache: &Cache, month: &str, call: F) -> (T, T)
where
    T: Send + 'static,
    F: Fn(Cache, Arc<Semaphore>, String) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    let gate = Arc::new(Semaphore::new(0));
    let first = tokio::spawn(call(cache.clone(), gate.clone(), month.to_owned()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = tokio::spawn(call(cache.clone(), gate.clone(), month.to_owned()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    gate.add_permits(1);
    (first.await.unwrap(), second.await.unwrap())
}

/// Two overlapping calls of `call` for `month` whose body fails: what the body's own error
/// named (its caller's), and the text of the cache's error the waiter got. `split` tells the
/// body's own error (`Ok`, the month it names) from the cache's (`Err`).
async fn own_and_shared<E, F, Fut>(
    cache: &Cache,
    month: &str,
    call: F,
    split: fn(E) -> Result<String, Error>,
) -> (String, String)
where
    E: Send + 'static,
    F: Fn(Cache, Arc<Semaphore>, String) -> Fut,
    Fut: std::future::Future<Output = Result<u64, E>> + Send + 'static,
{
    let (own, waited) = overlapping(cache, month, call).await;
    let (Err(own), Err(waited)) = (own, waited) else {
        panic!("the body fails");
    };
    let own = split(own).unwrap_or_else(|e| panic!("the body's own error, not {e:?}"));
    let shared = split(waited).expect_err("the cache's error for the waiter");
    assert!(shared.is_compute(), "{shared:?}");
    let text = std::error::Error::source(&shared).expect("the body's error");
    (own, text.to_string())
}

/// A function whose error type has only `From<Error>` returns it: the body's own error to the
/// call that ran it, and the cache's `Error` (its text: the type's name, or its `Debug` when
/// it has one) to a call that waited on that run.
async fn an_error_type_needs_only_from_error(cache: Cache) {
    let from_bare = |cache: Cache, gate, month| async move { bare(&cache, gate, month).await };
    let split_bare = |e| match e {
        Bare::Missing(month) => Ok(month),
        Bare::Cache(error) => Err(error),
    };
    let texts = own_and_shared(&cache, "2019-07", from_bare, split_bare).await;
    let name = "the #[cached] body failed with a cached::Bare";
    assert_eq!(texts, ("2019-07".to_owned(), name.to_owned()));

    let from_debug =
        |cache: Cache, gate, month| async move { debug_only(&cache, gate, month).await };
    let split_debug = |e| match e {
        DebugOnly::Missing(month) => Ok(month),
        DebugOnly::Cache(error) => Err(error),
    };
    let texts = own_and_shared(&cache, "2019-08", from_debug, split_debug).await;
    assert_eq!(
        texts,
        ("2019-08".to_owned(), "Missing(\"2019-08\")".to_owned())
    );
}

/// On the embedded store, then on a real server.
#[tokio::test]
async fn an_error_type_needs_only_from_error_on_either_store() {
    an_error_type_needs_only_from_error(Cache::in_memory()).await;
    let server = RedisServer::start();
    let options = CallOptions::default();
    an_error_type_needs_only_from_error(support::cache(&server, "bare", options).await).await;
}

/// A `#[cached]` body whose error is marked `NotShared` is not remembered by negative caching:
/// the next call runs the body again; a plain error is remembered.
#[tokio::test]
async fn a_not_shared_error_of_a_cached_body_is_not_remembered() {
    use stampede_guard::NotShared;

    type Boxed = Box<dyn std::error::Error + Send + Sync>;

    #[derive(Clone)]
    struct Access {
        cache: Cache,
        runs: Arc<AtomicUsize>,
    }

    impl Access {
        #[cached(cache = self.cache, key = "report:{user}", ttl_secs = 300)]
        async fn report(&self, user: u32, mine: bool) -> Result<u64, Boxed> {
            self.runs.fetch_add(1, Ordering::SeqCst);
            let denied = format!("user {user} may not see this report");
            Err(if mine {
                NotShared::new(denied).into()
            } else {
                denied.into()
            })
        }
    }

    let options = CallOptions::default().negative_ttl(Some(Duration::from_secs(60)));
    for (user, mine, runs) in [(7, true, 2), (8, false, 1)] {
        let access = Access {
            cache: Cache::in_memory().with_options(options.clone()),
            runs: Arc::new(AtomicUsize::new(0)),
        };
        assert!(access.report(user, mine).await.is_err());
        assert!(access.report(user, mine).await.is_err());
        assert_eq!(access.runs.load(Ordering::SeqCst), runs, "user {user}");
    }
}
