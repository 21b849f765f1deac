//! The circuit breaker in front of a cache's backend connection: after a run of failures it
//! opens, and every call fails fast (as unreachable) instead of paying a time-out each, until a
//! probe sent in the background finds the backend answering again.
//!
//! # States (resilience4j's and Polly's names)
//! - **closed**: calls go through; `failures` unreachable or busy answers in a row open it. Any
//!   answer (a value, a miss, even a refusal: the server spoke) resets the count.
//! - **open**: calls fail at once with an unreachable [`StoreError`]; after `cool_down` the
//!   first call to arrive starts one probe (a `PING` over the same connection) and fails fast
//!   itself: no caller ever waits on a probe.
//! - **half-open**: the probe is in flight; calls still fail fast. Its success closes the
//!   breaker; its failure opens it for another `cool_down`.
//!
//! A success that comes back while the breaker is open (a request sent before it opened, a
//! frozen server that thaws) closes it too: it is the same evidence a probe gives.
//!
//! # A black hole: the stall watchdog
//! A connection that nothing answers (no RST: a frozen server, a dropped route) would fail each
//! request only at its response time-out (5 s by default), and every caller would wait that
//! long. So the breaker also watches the connection: when requests have waited `stall`
//! (1 s) with no answer at all arriving since (not to them, not to any other request), it
//! opens, and the requests still waiting fail at once (unreachable, possibly carried out, like
//! a time-out) and take their fallback (`serve_while_down`, `ComputeUncached`). A live server
//! answers a cache in well under a millisecond; a connection busy with a large answer still
//! shows life by that answer's end, so keep `stall` above your largest value's transfer. The
//! watchdog is one task per cache, looking every quarter of `stall`. Lock writes that wait for
//! replicas (`ConnectionOptions::wait_for_replicas`) are not watched: they travel on a
//! connection of their own and are answered slowly by design, up to their `WAIT` timeout;
//! their response time-out bounds them.
//!
//! # Logging
//! One warning when it opens and one line when it closes, with the counts in between; the
//! probes' comings and goings are at debug level. Never a line per call.
//!
//! Explained in the guide: `docs/outages.md`.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::futures::Notified;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::StoreError;
use crate::error::BackendErrorKind;
use crate::stats::{BreakerState, Counters, Event};

/// The circuit breaker's settings, given to
/// [`CacheBuilder::breaker`](crate::CacheBuilder::breaker). On by default for Redis (the
/// embedded store cannot fail).
///
/// | setting | default | what it does |
/// |---|---|---|
/// | [`failures`](Self::failures) | 3 | unreachable or busy answers in a row that open the breaker |
/// | [`cool_down`](Self::cool_down) | 1 s | how long it stays open before a probe is sent |
/// | [`stall`](Self::stall) | 1 s | requests waiting this long with no answer at all from the connection open it (a black hole), and the waiting requests fail at once |
///
/// ```
/// use stampede_guard::{BreakerOptions, Cache};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), stampede_guard::Error> {
/// let breaker = BreakerOptions::default()
///     .failures(5)
///     .cool_down(Duration::from_millis(500));
/// assert_eq!(breaker.get_failures(), 5);
/// let cache = Cache::builder().breaker(breaker).build().await?; // .redis_url(..) for Redis
/// # let _ = cache;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
#[must_use]
pub struct BreakerOptions {
    failures: u32,
    cool_down: Duration,
    stall: Duration,
}

impl Default for BreakerOptions {
    fn default() -> Self {
        BreakerOptions {
            // Three in a row is rare on a healthy server, and a caller who meets a dead one
            // pays at most three failures before everyone fails fast.
            failures: 3,
            // Short enough that service is back within about a second of the server.
            cool_down: Duration::from_secs(1),
            // Far above any answer of a live server to a cache (a hit takes well under a
            // millisecond; a script loaded over a slow link, a few round trips), far below the
            // 5 s response time-out every waiting call would pay.
            stall: Duration::from_secs(1),
        }
    }
}

impl BreakerOptions {
    /// No breaker: every call tries the backend and pays its time-out (the behaviour before
    /// the breaker existed).
    ///
    /// ```
    /// let off = stampede_guard::BreakerOptions::disabled();
    /// assert_eq!(off.get_failures(), 0);
    /// ```
    pub fn disabled() -> Self {
        BreakerOptions {
            failures: 0,
            ..Self::default()
        }
    }

    /// How many unreachable or busy answers in a row open the breaker (default 3; 0 turns it
    /// off, as [`disabled`](Self::disabled) does).
    pub fn failures(mut self, failures: u32) -> Self {
        self.failures = failures;
        self
    }

    /// How long the breaker stays open before it sends a probe (default 1 s). Taken whole: any
    /// `Duration`, saturated where it is used.
    pub fn cool_down(mut self, cool_down: Duration) -> Self {
        self.cool_down = crate::time::saturate(cool_down);
        self
    }

    /// How long requests may wait with no answer at all arriving on the connection before the
    /// breaker opens (default 1 s; [`Duration::ZERO`] turns this check off). A frozen server
    /// or a black-holed connection answers nothing, and each request would wait for its
    /// response time-out (5 s by default); with this check, once the breaker opens every
    /// request still waiting fails at once (as unreachable: it may have been carried out), and
    /// the calls take their fallback. Keep it above the longest answer your server gives,
    /// such as the transfer of your largest value.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let options = stampede_guard::BreakerOptions::default().stall(Duration::from_secs(2));
    /// assert_eq!(options.get_stall(), Duration::from_secs(2));
    /// ```
    pub fn stall(mut self, stall: Duration) -> Self {
        self.stall = crate::time::saturate(stall);
        self
    }

    /// The stall bound in force ([`Duration::ZERO`]: off).
    pub fn get_stall(&self) -> Duration {
        self.stall
    }

    /// The number of failures in a row that opens the breaker (0: never).
    ///
    /// ```
    /// assert_eq!(stampede_guard::BreakerOptions::default().get_failures(), 3);
    /// ```
    pub fn get_failures(&self) -> u32 {
        self.failures
    }

    /// The cool-down in force.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let options = stampede_guard::BreakerOptions::default();
    /// assert_eq!(options.get_cool_down(), Duration::from_secs(1));
    /// ```
    pub fn get_cool_down(&self) -> Duration {
        self.cool_down
    }

    pub(crate) fn enabled(&self) -> bool {
        self.failures > 0
    }
}

/// What the breaker lets a call do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Go to the backend.
    Pass,
    /// Fail fast.
    Refuse,
    /// Fail fast, and send the probe: the cool-down is over and this call came first.
    RefuseAndProbe,
}

/// A circuit breaker's state, shared by every handle of one cache.
#[derive(Debug)]
pub(crate) struct Breaker {
    options: BreakerOptions,
    /// The [`BreakerState`] as a number, read without a lock on every call.
    state: AtomicU8,
    /// Unreachable or busy answers in a row; reset by any answer.
    in_a_row: AtomicU32,
    /// What the transitions need; taken only when a call fails or the breaker is not closed.
    spell: Mutex<Spell>,
    counters: Arc<Counters>,
    /// Requests sent and not yet answered.
    in_flight: AtomicUsize,
    /// Answers received, ever: the stall watchdog looks for it standing still. A count, not a
    /// time: no clock read per request on the hot path.
    answers: AtomicU64,
    /// The watchdog's own notes between its looks.
    watch: Mutex<Watch>,
    /// Notified each time the breaker opens: requests waiting then fail at once.
    opened: Notify,
    /// Set when another connection to the backend came up ([`nudge`](Self::nudge)): the next
    /// call sends the probe without waiting for the cool-down.
    nudged: std::sync::atomic::AtomicBool,
}

/// The bookkeeping of the current run of failures (a lock guards it: it changes on failures
/// and transitions only, never on the hot path of a healthy backend).
#[derive(Debug, Default)]
struct Spell {
    /// When the run of failures began (the first of them): "unreachable since".
    since: Option<Instant>,
    /// When the breaker last opened, or its last probe failed.
    opened_at: Option<Instant>,
    /// Calls failed fast since it opened, for the line that says it closed.
    refused: u64,
    /// The last failure, for the warning that says it opened.
    last_error: Option<String>,
}

const CLOSED: u8 = 0;
const OPEN: u8 = 1;
const HALF_OPEN: u8 = 2;

impl Breaker {
    pub(crate) fn new(options: BreakerOptions, counters: Arc<Counters>) -> Self {
        Breaker {
            options,
            state: AtomicU8::new(CLOSED),
            in_a_row: AtomicU32::new(0),
            spell: Mutex::default(),
            counters,
            in_flight: AtomicUsize::new(0),
            answers: AtomicU64::new(0),
            watch: Mutex::new(Watch {
                answers: 0,
                quiet_since: crate::time::now(),
                last_look: crate::time::now(),
            }),
            opened: Notify::new(),
            nudged: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The stall bound in force; zero when the check is off.
    pub(crate) fn stall(&self) -> Duration {
        self.options.stall
    }

    /// Another connection to the same backend came up (the near tier's feed subscribed
    /// again): it answers, so an open breaker probes at the next call instead of after its
    /// cool-down. Otherwise the feed's announcements, arriving first, drop the copies this
    /// instance holds while its calls still fail fast, and those calls fail.
    pub(crate) fn nudge(&self) {
        if self.state.load(Ordering::Acquire) != CLOSED {
            self.nudged.store(true, Ordering::Release);
        }
    }

    /// The cool-down in force.
    pub(crate) fn cool_down(&self) -> Duration {
        self.options.cool_down
    }

    /// A request is about to be sent: counted as waiting until the returned guard ends it
    /// ([`InFlight::ended`]) or is dropped (the caller gave up on it: not an answer). The guard
    /// carries the signal of the breaker opening, which the request waits on beside its answer;
    /// taken at admission, so an opening between admission and the first poll is not missed.
    pub(crate) fn sending(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight {
            breaker: self,
            watched: true,
        }
    }

    /// As [`sending`](Self::sending), for a request answered slowly by design (a lock write
    /// that waits for replicas, up to its `WAIT` timeout): left out of the stall watchdog's
    /// count, which would take its wait for a dead server. Its outcome is still recorded, and
    /// it still fails at once when the breaker opens.
    pub(crate) fn sending_slow(&self) -> InFlight<'_> {
        InFlight {
            breaker: self,
            watched: false,
        }
    }

    /// Resolves when the breaker opens after this call: taken before a request is sent, it
    /// fails the request at once if the breaker opens while it waits. (A `Notify`, not a
    /// channel: nothing is subscribed or counted per request.)
    pub(crate) fn opening(&self) -> Notified<'_> {
        self.opened.notified()
    }

    /// The connection showed life: an answer came.
    fn progressed(&self) {
        self.answers.fetch_add(1, Ordering::Relaxed);
    }

    /// The watchdog's check, every quarter of `stall`: requests have waited longer than `stall`
    /// with no answer at all since (a frozen server, a black hole). Opens the breaker, which
    /// fails them at once. Quiet counts from the last look that saw an answer come, or nothing
    /// waiting, so it fires between `stall` and `stall` plus one look after the last sign of
    /// life.
    pub(crate) fn check_stall(&self) {
        let stall = self.options.stall;
        if stall.is_zero() {
            return;
        }
        let now = crate::time::now();
        let answers = self.answers.load(Ordering::Acquire);
        let waiting = self.in_flight.load(Ordering::Acquire);
        let mut watch = crate::sync::lock(&self.watch);
        let previous = std::mem::replace(&mut watch.last_look, now);
        // A look long after the last one means this runtime did not run meanwhile (a paused
        // process, a runtime nobody drove): the answers may be waiting in the socket, unread.
        // That time is not the backend's silence.
        let unwatched = now.saturating_duration_since(previous) > watch_period(stall) * 2;
        // Before the first answer ever, the connection is still being made: its own time-out
        // (`connect_timeout`) bounds that, and a slow link's first requests must not open it.
        if waiting == 0
            || answers == 0
            || answers != watch.answers
            || unwatched
            || self.state.load(Ordering::Acquire) != CLOSED
        {
            watch.answers = answers;
            watch.quiet_since = now;
            return;
        }
        let quiet = now.saturating_duration_since(watch.quiet_since);
        if quiet <= stall {
            return;
        }
        let quiet_since = watch.quiet_since;
        drop(watch);
        let mut spell = crate::sync::lock(&self.spell);
        if self.state.load(Ordering::Acquire) != CLOSED {
            return;
        }
        spell.since.get_or_insert(quiet_since);
        self.open(spell, now);
        let quiet_ms = quiet.as_millis();
        crate::log::throttled!(
            warn,
            waiting,
            quiet_ms,
            "circuit breaker open: {waiting} requests waited {quiet_ms} ms with no answer from \
             the backend; they fail now, and calls fail fast (or take their fallback) until a \
             probe finds it answering"
        );
    }

    /// The error of a request that was waiting when the breaker opened: unreachable, and it
    /// may have been carried out (it was sent), like a time-out.
    pub(crate) fn aborted(&self) -> StoreError {
        StoreError::Redis {
            source: std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the circuit breaker opened while this request waited for its answer (it may \
                 have been carried out)",
            )
            .into(),
            kind: BackendErrorKind::Unreachable,
            key: None,
        }
    }

    /// Opens the breaker (the state lock held), counts it and fails every waiting request.
    fn open(&self, mut spell: std::sync::MutexGuard<'_, Spell>, now: Instant) {
        self.state.store(OPEN, Ordering::Release);
        spell.opened_at = Some(now);
        spell.refused = 0;
        drop(spell);
        self.counters.breaker(BreakerState::Open);
        self.opened.notify_waiters();
    }

    /// The state now.
    pub(crate) fn state(&self) -> BreakerState {
        match self.state.load(Ordering::Acquire) {
            OPEN => BreakerState::Open,
            HALF_OPEN => BreakerState::HalfOpen,
            _ => BreakerState::Closed,
        }
    }

    /// How long the backend has been failing, if the last answer was a failure (closed with
    /// failures in a row, or not closed).
    pub(crate) fn failing_for(&self) -> Option<Duration> {
        let since = crate::sync::lock(&self.spell).since?;
        Some(crate::time::since(since))
    }

    /// Whether a call may go to the backend now.
    pub(crate) fn admit(&self) -> Admit {
        if self.state.load(Ordering::Acquire) == CLOSED {
            return Admit::Pass;
        }
        let mut spell = crate::sync::lock(&self.spell);
        spell.refused += 1;
        self.counters.record(Event::FastFailure);
        let cooled = self.nudged.swap(false, Ordering::AcqRel)
            || spell
                .opened_at
                .is_some_and(|at| crate::time::since(at) >= self.options.cool_down);
        if cooled
            && self
                .state
                .compare_exchange(OPEN, HALF_OPEN, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            tracing::debug!("circuit breaker half-open: probing the backend");
            return Admit::RefuseAndProbe;
        }
        Admit::Refuse
    }

    /// The error a refused call fails with: unreachable, never sent, saying why and for how
    /// long.
    pub(crate) fn refusal(&self) -> StoreError {
        StoreError::BreakerOpen {
            failures: self.options.failures,
            failing_for: self.failing_for().unwrap_or_default(),
        }
    }

    /// Records what the backend answered (or failed to).
    pub(crate) fn record(&self, failed: Option<&StoreError>) {
        match failed {
            Some(e) if counts_against(e) => self.failed(e),
            _ => self.answered(),
        }
    }

    /// The backend answered: a run of failures ends, and a breaker that was not closed closes.
    fn answered(&self) {
        self.progressed();
        if self.in_a_row.load(Ordering::Relaxed) == 0
            && self.state.load(Ordering::Acquire) == CLOSED
        {
            return;
        }
        let mut spell = crate::sync::lock(&self.spell);
        self.in_a_row.store(0, Ordering::Relaxed);
        let was = self.state.swap(CLOSED, Ordering::AcqRel);
        let since = spell.since.take();
        if was == CLOSED {
            return;
        }
        let refused = std::mem::take(&mut spell.refused);
        spell.opened_at = None;
        drop(spell);
        self.counters.breaker(BreakerState::Closed);
        let down_ms = since.map_or(0, |at| crate::time::since(at).as_millis());
        tracing::info!(
            down_ms,
            failed_fast = refused,
            "circuit breaker closed: the backend answers again"
        );
    }

    fn failed(&self, e: &StoreError) {
        let in_a_row = self.in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        let mut spell = crate::sync::lock(&self.spell);
        let now = crate::time::now();
        spell.since.get_or_insert(now);
        match self.state.load(Ordering::Acquire) {
            CLOSED if in_a_row >= self.options.failures => {
                self.open(spell, now);
                crate::log::throttled!(warn, failures = in_a_row, kind = %e.kind(), error = %e,
                    "circuit breaker open: the backend failed {in_a_row} times in a row; \
                     calls fail fast (or take their fallback) until a probe finds it answering");
            }
            HALF_OPEN => {
                // The probe failed: another cool-down.
                self.state.store(OPEN, Ordering::Release);
                spell.opened_at = Some(now);
                spell.last_error = Some(e.to_string());
                tracing::debug!(error = %e, "circuit breaker probe failed; open again");
            }
            _ => spell.last_error = Some(e.to_string()),
        }
    }
}

/// How often the stall watchdog looks: a quarter of `stall`, at least every 5 ms.
pub(crate) fn watch_period(stall: Duration) -> Duration {
    (stall / 4).max(Duration::from_millis(5))
}

/// What the stall watchdog remembers between two looks.
#[derive(Debug)]
struct Watch {
    /// The answer count at its last look.
    answers: u64,
    /// Its last look that saw an answer come, or nothing waiting.
    quiet_since: Instant,
    /// Its last look.
    last_look: Instant,
}

/// A request waiting for its answer, as the stall watchdog counts it (see [`Breaker::sending`]).
#[derive(Debug)]
pub(crate) struct InFlight<'a> {
    breaker: &'a Breaker,
    /// Counted in `in_flight` (see [`Breaker::sending_slow`]).
    watched: bool,
}

impl InFlight<'_> {
    /// The request ended with `outcome`: recorded (an answer shows the connection alive, a
    /// failure counts against it).
    pub(crate) fn ended(self, failed: Option<&StoreError>) {
        self.breaker.record(failed);
        // Dropped here: no longer waiting.
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.watched {
            self.breaker.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Whether a failure counts against the backend: it did not answer (unreachable) or said it
/// cannot now (busy, loading). A refusal, a full memory or a wrong type is an answer.
pub(crate) fn counts_against(e: &StoreError) -> bool {
    matches!(
        e.kind(),
        BackendErrorKind::Unreachable | BackendErrorKind::Busy
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unreachable() -> StoreError {
        StoreError::Redis {
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into(),
            kind: BackendErrorKind::Unreachable,
            key: None,
        }
    }

    fn refused() -> StoreError {
        StoreError::Redis {
            source: redis::RedisError::from((redis::ErrorKind::Client, "NOPERM")),
            kind: BackendErrorKind::RefusedPermission,
            key: None,
        }
    }

    fn breaker() -> (Breaker, Arc<Counters>) {
        let counters = Arc::new(Counters::default());
        let options = BreakerOptions::default()
            .failures(3)
            .cool_down(Duration::from_secs(1))
            .stall(Duration::from_millis(500));
        (Breaker::new(options, Arc::clone(&counters)), counters)
    }

    #[tokio::test(start_paused = true)]
    async fn opens_after_failures_in_a_row_and_a_probe_closes_it() {
        let (b, counters) = breaker();
        b.record(Some(&unreachable()));
        b.record(Some(&unreachable()));
        b.record(None);
        b.record(Some(&unreachable()));
        b.record(Some(&unreachable()));
        assert_eq!(b.state(), BreakerState::Closed, "an answer resets the run");
        b.record(Some(&unreachable()));
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.admit(), Admit::Refuse);
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(b.admit(), Admit::Refuse);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(b.admit(), Admit::RefuseAndProbe, "one probe");
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert_eq!(b.admit(), Admit::Refuse, "only one");
        b.record(None);
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.admit(), Admit::Pass);
        let stats = counters.snapshot();
        assert_eq!((stats.breaker_opened, stats.fast_failures), (1, 4));
        assert_eq!(stats.breaker, BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_opens_it_for_another_cool_down() {
        let (b, counters) = breaker();
        for _ in 0..3 {
            b.record(Some(&unreachable()));
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(b.admit(), Admit::RefuseAndProbe);
        b.record(Some(&unreachable()));
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(counters.snapshot().breaker, BreakerState::Open);
        assert_eq!(b.admit(), Admit::Refuse, "a new cool-down began");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(b.admit(), Admit::RefuseAndProbe);
        assert_eq!(counters.snapshot().breaker_opened, 1, "still one opening");
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_is_an_answer_and_failing_for_counts_from_the_first_failure() {
        let (b, _) = breaker();
        b.record(Some(&unreachable()));
        tokio::time::advance(Duration::from_millis(300)).await;
        b.record(Some(&refused()));
        assert_eq!(b.failing_for(), None, "the server spoke");
        b.record(Some(&unreachable()));
        tokio::time::advance(Duration::from_millis(200)).await;
        b.record(Some(&unreachable()));
        assert_eq!(b.failing_for(), Some(Duration::from_millis(200)));
        assert!(b.refusal().to_string().contains("circuit breaker open"));
        assert_eq!(b.refusal().kind(), BackendErrorKind::Unreachable);
        assert!(!b.refusal().may_have_been_applied(), "never sent");
    }

    #[tokio::test(start_paused = true)]
    async fn requests_waiting_past_the_stall_with_no_answer_open_it_and_are_told() {
        let (b, counters) = breaker();
        let look = Duration::from_millis(125);
        let waiting = b.sending();
        let told = b.opening();
        // Looks every 125 ms, as the watchdog does; an answer to another request at 400 ms.
        let mut opened_at = None;
        for tick in 1..=12u64 {
            tokio::time::advance(look).await;
            if tick == 3 {
                b.sending().ended(None);
            }
            b.check_stall();
            if b.state() == BreakerState::Open {
                opened_at = Some(tick * 125);
                break;
            }
        }
        // The last look that saw life was at 375 ms: quiet for more than 500 ms from there.
        assert_eq!(
            opened_at,
            Some(1_000),
            "opened a look after 500 ms of quiet"
        );
        // Polled first, before its zero deadline is looked at.
        assert!(
            crate::time::timeout(Duration::ZERO, told).await.is_ok(),
            "the waiting request is told"
        );
        drop(waiting);
        assert_eq!(counters.snapshot().breaker_opened, 1);
        assert!(b.aborted().may_have_been_applied());
        assert!(b.failing_for().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_never_stalls() {
        let (b, _) = breaker();
        for _ in 0..80 {
            tokio::time::advance(Duration::from_millis(125)).await;
            b.check_stall();
        }
        // The first request after an idle spell: quiet counts from the last look, not from
        // the last answer seconds ago.
        let _waiting = b.sending();
        for _ in 0..4 {
            tokio::time::advance(Duration::from_millis(125)).await;
            b.check_stall();
        }
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_given_up_on_is_no_longer_waiting() {
        let (b, _) = breaker();
        // A renewal or a handler dropped mid-request: its guard goes with it.
        drop(b.sending());
        for _ in 0..80 {
            tokio::time::advance(Duration::from_millis(125)).await;
            b.check_stall();
        }
        assert_eq!(b.state(), BreakerState::Closed, "nothing waits");
    }

    #[tokio::test(start_paused = true)]
    async fn time_the_watchdog_did_not_run_is_not_silence() {
        let (b, _) = breaker();
        b.sending().ended(None);
        b.check_stall();
        let _waiting = b.sending();
        // The runtime did not run for 3 s (a paused process): its next look starts afresh.
        tokio::time::advance(Duration::from_secs(3)).await;
        b.check_stall();
        assert_eq!(b.state(), BreakerState::Closed);
        for _ in 0..5 {
            tokio::time::advance(Duration::from_millis(125)).await;
            b.check_stall();
        }
        assert_eq!(
            b.state(),
            BreakerState::Open,
            "then quiet for 625 ms of looking"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_nudge_sends_the_probe_without_waiting_for_the_cool_down() {
        let (b, _) = breaker();
        b.nudge();
        assert_eq!(b.admit(), Admit::Pass, "closed: a nudge does nothing");
        for _ in 0..3 {
            b.record(Some(&unreachable()));
        }
        assert_eq!(b.admit(), Admit::Refuse);
        b.nudge();
        assert_eq!(b.admit(), Admit::RefuseAndProbe, "at once");
        assert_eq!(b.admit(), Admit::Refuse, "one probe");
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_never_answered_is_left_to_its_connect_timeout() {
        let (b, _) = breaker();
        let _waiting = b.sending();
        for _ in 0..40 {
            tokio::time::advance(Duration::from_millis(125)).await;
            b.check_stall();
        }
        assert_eq!(b.state(), BreakerState::Closed);
    }
}
