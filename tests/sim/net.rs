//! The simulated network and the server's record: every request and reply of every
//! instance's connection travels through [`Net`], which delays it by a seeded amount (requests
//! of different connections reorder, those of one connection never: each leaves after the one
//! before it), loses it with its connection, holds it while the server is frozen, or drops it
//! while its instance is cut off. What the server carried out is recorded in the server's order,
//! with the time it ran.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use stampede_guard::__private::sim::{Applied, Network, Server};
use tokio::time::Instant;

/// How often each fault strikes, per request or reply (in parts per thousand).
#[derive(Debug, Clone, Copy)]
pub struct Rates {
    /// A long delay (10..80 ms) instead of a short one (0..3 ms).
    pub slow: u32,
    /// The connection drops: this message and every other in flight on it are lost.
    pub drop: u32,
}

/// One connection's state: when its last request reached the server and its last reply
/// reached the client (the next ones come no earlier: one connection is a FIFO), and which
/// incarnation of the connection is current (a drop starts a new one).
#[derive(Debug)]
struct Conn {
    last_request: Instant,
    last_reply: Instant,
    incarnation: u64,
    /// Until then the instance is cut off: its messages are lost in the network (the client
    /// sees its response time-out).
    cut_until: Instant,
}

#[derive(Debug)]
struct State {
    rng: StdRng,
    conns: Vec<Conn>,
    /// From then until `frozen_until` the server runs nothing (a frozen process: requests
    /// wait, then run in the order they came).
    frozen_from: Instant,
    frozen_until: Instant,
    /// What the server ran: when (the simulation's clock), for which connection, what.
    applied: Vec<(u64, u64, Applied)>,
}

/// The network connection of instance `instance`'s near-tier feed (its calls' is
/// `instance`).
pub fn feed_conn(instance: usize) -> usize {
    crate::plan::INSTANCES + instance
}

/// The network of one schedule, shared by every connection.
#[derive(Debug, Clone)]
pub struct Net {
    state: Arc<Mutex<State>>,
    rates: Rates,
    /// Whose clock stamps what the server ran.
    server: Arc<Server>,
}

impl Net {
    /// The network of `instances` instances: a connection each for its calls, and one for
    /// its near-tier feed ([`feed_conn`]).
    pub fn new(seed: u64, instances: usize, rates: Rates, server: Arc<Server>) -> Self {
        let connections = instances * 2;
        let now = Instant::now();
        let conn = || Conn {
            last_request: now,
            last_reply: now,
            incarnation: 0,
            cut_until: now,
        };
        Net {
            state: Arc::new(Mutex::new(State {
                rng: StdRng::seed_from_u64(seed),
                conns: (0..connections).map(|_| conn()).collect(),
                frozen_from: now,
                frozen_until: now,
                applied: Vec::new(),
            })),
            rates,
            server,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Freezes the server for `ms`.
    pub fn freeze(&self, ms: u64) {
        let until = Instant::now() + Duration::from_millis(ms);
        let mut state = self.state();
        if state.frozen_until <= Instant::now() {
            state.frozen_from = Instant::now();
        }
        state.frozen_until = state.frozen_until.max(until);
    }

    /// Cuts instance `instance` off for `ms` (its connection and its feed's), and drops what
    /// they had in flight.
    pub fn cut(&self, instance: usize, ms: u64) {
        self.cut_conns(&[instance, feed_conn(instance)], ms);
    }

    /// Cuts only instance `instance`'s connection for calls off for `ms`; its feed's stays.
    pub fn cut_calls(&self, instance: usize, ms: u64) {
        self.cut_conns(&[instance], ms);
    }

    fn cut_conns(&self, conns: &[usize], ms: u64) {
        let until = Instant::now() + Duration::from_millis(ms);
        let mut state = self.state();
        for &conn in conns {
            let c = &mut state.conns[conn];
            c.cut_until = c.cut_until.max(until);
            c.incarnation += 1;
        }
    }

    /// Drops connection `conn`: what it had in flight is lost.
    pub fn drop_connection(&self, conn: usize) {
        self.state().conns[conn].incarnation += 1;
    }

    /// What the server ran, in its order.
    pub fn applied(&self) -> Vec<(u64, u64, Applied)> {
        self.state().applied.clone()
    }

    /// When a message of `conn` sent now arrives, the connection's incarnation it left
    /// under, and whether it is lost silently (its instance is cut off).
    fn travel(&self, conn: u64, reply: bool) -> (Instant, u64, bool) {
        let now = Instant::now();
        let mut state = self.state();
        let rates = self.rates;
        let slow = state.rng.random_range(0..1000) < rates.slow;
        let delay = if slow {
            state.rng.random_range(10..80)
        } else {
            state.rng.random_range(0..3)
        };
        let dropped = state.rng.random_range(0..1000) < rates.drop;
        let frozen_until = state.frozen_until;
        let c = &mut state.conns[conn as usize];
        let incarnation = c.incarnation;
        // The connection drops while this message travels: it and every other in flight
        // on it fail when they would have arrived.
        if dropped {
            c.incarnation += 1;
        }
        let cut = c.cut_until > now;
        let last = if reply {
            &mut c.last_reply
        } else {
            &mut c.last_request
        };
        // One connection delivers in order: a millisecond after the message before it at
        // the earliest (tokio's timer counts milliseconds; two wake-ups in one tick would run
        // in the timer's order, not the connection's).
        let mut at = (now + Duration::from_millis(delay)).max(*last + Duration::from_millis(1));
        if !reply {
            at = at.max(frozen_until);
        }
        *last = at;
        (at, incarnation, cut)
    }

    /// The message left under `incarnation` still counts at its arrival: its connection was
    /// not dropped or cut meanwhile, and (a request) the server is not frozen.
    fn arrives(&self, conn: u64, incarnation: u64) -> bool {
        let state = self.state();
        state.conns[conn as usize].incarnation == incarnation
    }

    fn message(&self, conn: u64, reply: bool) -> Pin<Box<dyn Future<Output = bool> + Send>> {
        let (at, incarnation, lost) = self.travel(conn, reply);
        let net = self.clone();
        Box::pin(async move {
            if lost {
                // Lost in the network: the client hears nothing, and gives up at its response
                // time-out.
                std::future::pending::<()>().await;
            }
            tokio::time::sleep_until(at).await;
            if !reply {
                // A request that reaches a frozen server waits for it, keeping its place: it
                // runs as long after the thaw as it came after the freeze, so one connection's
                // requests still run in order.
                let (from, until) = {
                    let state = net.state();
                    (state.frozen_from, state.frozen_until)
                };
                if until > at && at >= from {
                    tokio::time::sleep_until(until + (at - from)).await;
                }
            }
            net.arrives(conn, incarnation)
        })
    }
}

impl Network for Net {
    fn request(&self, conn: u64) -> Pin<Box<dyn Future<Output = bool> + Send>> {
        self.message(conn, false)
    }

    fn reply(&self, conn: u64) -> Pin<Box<dyn Future<Output = bool> + Send>> {
        self.message(conn, true)
    }

    fn applied(&self, conn: u64, change: Applied) {
        let at = self.server.now_us();
        self.state().applied.push((at, conn, change));
    }
}
