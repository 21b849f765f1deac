//! `--outage-at-secs A --outage-secs B`: the cache's server frozen mid-run with `DEBUG SLEEP B`.
//! Its connections stay open and nothing answers, the hardest case for a client (no RST, no
//! refusal: only a timeout tells it).

use std::thread::JoinHandle;
use std::time::Instant;

use crate::config::Outage;
use crate::{BoxError, ADMIN_TIMEOUT};

/// The parent's own connection to the cache's server, kept for the outage: opened, and DEBUG
/// proven allowed, before the workers start, so that a server without
/// `--enable-debug-command local` fails the run at once instead of at second A.
pub(crate) struct Saboteur {
    conn: redis::Connection,
    outage: Outage,
}

impl Saboteur {
    pub(crate) fn connect(url: &str, outage: Outage) -> Result<Self, BoxError> {
        let mut conn = redis::Client::open(url)?.get_connection_with_timeout(ADMIN_TIMEOUT)?;
        // `DEBUG SLEEP 0` returns at once: the same command, refused the same way, without
        // freezing anything.
        redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(0)
            .exec(&mut conn)
            .map_err(|e| {
                format!(
                    "--outage-at-secs needs the DEBUG command, and the server refused it ({e}): \
                     start redis-server with `--enable-debug-command local` (or `yes`)"
                )
            })?;
        Ok(Saboteur { conn, outage })
    }

    /// On a thread of its own: waits until `released` + A, then freezes the server for B. The
    /// thread ends when the server answers again, so joining it is waiting for the outage's end.
    pub(crate) fn schedule(self, released: Instant) -> JoinHandle<Result<(), String>> {
        let Saboteur { mut conn, outage } = self;
        std::thread::spawn(move || {
            std::thread::sleep((released + outage.at).saturating_duration_since(Instant::now()));
            eprintln!(
                "stampede_bench: freezing the cache's server for {:?} (DEBUG SLEEP)",
                outage.length
            );
            // The reply comes when the server wakes up: no read timeout on this connection
            // (redis-rs clears the connect timeout once connected), whatever B is.
            let slept = redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg(outage.length.as_secs())
                .exec(&mut conn)
                .map_err(|e| format!("the outage's DEBUG SLEEP failed: {e}"));
            eprintln!("stampede_bench: the cache's server answers again");
            slept
        })
    }
}

/// Waits for the outage's end (a run shorter than A + B waits for it too: the parent's own
/// reads of the server would wait anyway), and reports whether it happened.
pub(crate) fn wait_for_end(outage: JoinHandle<Result<(), String>>) -> Result<(), BoxError> {
    match outage.join() {
        Ok(slept) => Ok(slept?),
        Err(_) => Err("the outage's thread panicked".into()),
    }
}
