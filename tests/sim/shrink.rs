//! A failing schedule, made readable: the checker's findings, its plan shrunk to the fewest
//! steps that still break the same rule (steps removed in halves, then quarters, ... then one
//! by one, while the failure stays), the shrunk run's history as a timeline, and the command
//! that replays the original exactly.

use crate::checker::check;
use crate::history::{History, Outcome, ServerEvent, Violation};
use crate::plan::Plan;
use crate::run::run;
use crate::RATES;

/// A schedule whose history broke the checker's rules.
pub struct Failure {
    pub violations: Vec<Violation>,
}

impl Failure {
    /// The rules broken.
    pub fn rules(&self) -> Vec<char> {
        self.violations.iter().map(|v| v.rule).collect()
    }

    /// The whole report: seed, replay command, findings, the shrunk plan and its timeline.
    pub fn report(&self, plan: &Plan) -> String {
        let mut out = format!(
            "schedule of seed {seed} broke the chaos checker's rules; replay it with\n  \
             STAMPEDE_SIM_SEED={seed} cargo test --features simulation --test sim \
             every_schedule -- --nocapture\n",
            seed = plan.seed
        );
        for v in self.violations.iter().take(5) {
            out.push_str(&format!("  {v}\n"));
        }
        // The clocks come from the seed, so the shrunk plan keeps them.
        let skews = match plan.clocks_drift {
            true => crate::run::skews(plan.seed),
            false => Vec::new(),
        };
        for (i, skew) in skews.iter().enumerate() {
            out.push_str(&format!(
                "  i{i}'s clock: {:+} ppm, wall clock {:+} ms off the server's\n",
                skew.ppm, skew.offset_ms
            ));
        }
        let rule = self.violations.first().map_or('?', |v| v.rule);
        let shrunk = shrink(plan, rule);
        out.push_str(&format!(
            "shrunk from {} to {} steps, still breaking rule ({rule}):\n",
            plan.steps.len(),
            shrunk.steps.len()
        ));
        for step in &shrunk.steps {
            out.push_str(&format!("  {step}\n"));
        }
        let history = run(&shrunk, RATES).history;
        for v in check(&history).iter().take(3) {
            out.push_str(&format!("  => {v}\n"));
        }
        out.push_str("timeline of the shrunk run (µs on the simulation's clock):\n");
        out.push_str(&timeline(&history));
        out
    }
}

/// Runs `plan` and judges its history.
pub fn judge(plan: &Plan) -> Result<(), Failure> {
    let violations = check(&run(plan, RATES).history);
    if violations.is_empty() {
        Ok(())
    } else {
        Err(Failure { violations })
    }
}

fn breaks(plan: &Plan, rule: char) -> bool {
    judge(plan).is_err_and(|f| f.rules().contains(&rule))
}

/// The fewest steps of `plan` that still break `rule`: chunks removed while the failure
/// stays, from halves down to single steps.
pub fn shrink(plan: &Plan, rule: char) -> Plan {
    let mut current = plan.clone();
    let mut chunk = current.steps.len().div_ceil(2).max(1);
    loop {
        let mut start = 0;
        while start < current.steps.len() {
            let mut fewer = current.clone();
            let end = (start + chunk).min(fewer.steps.len());
            fewer.steps.drain(start..end);
            if !fewer.steps.is_empty() && breaks(&fewer, rule) {
                current = fewer;
            } else {
                start += chunk;
            }
        }
        if chunk == 1 {
            return current;
        }
        chunk = chunk.div_ceil(2);
    }
}

/// Every recorded event in time order, one per line.
pub fn timeline(h: &History) -> String {
    let mut lines: Vec<(u64, String)> = Vec::new();
    let origin = h.calls.iter().map(|c| c.start_us).min().unwrap_or(0);
    for c in &h.calls {
        lines.push((
            c.start_us,
            format!("{} #{} {} {} begins", c.instance, c.id, c.op, c.key),
        ));
        if let Some(end) = c.end_us {
            let outcome = match &c.outcome {
                Outcome::Value(v) => format!("got {v} ({})", c.source),
                other => format!("{other:?}"),
            };
            lines.push((
                end,
                format!(
                    "{} #{} {} {} ends: {outcome}",
                    c.instance, c.id, c.op, c.key
                ),
            ));
        }
    }
    for c in &h.computes {
        lines.push((
            c.start_us,
            format!("{} computes {} under token {}", c.instance, c.key, c.token),
        ));
        lines.push((c.end_us, format!("{} computed {}", c.instance, c.value)));
    }
    for s in &h.sections {
        lines.push((
            s.start_us,
            format!(
                "{} holds lock {} (token {}) until {} ({} writes)",
                s.instance,
                s.lock,
                s.token,
                s.end_us.saturating_sub(origin),
                s.writes
            ),
        ));
    }
    for at in &h.restarts_us {
        lines.push((*at, "SERVER restarts empty (or is flushed)".to_string()));
    }
    for f in &h.failovers {
        lines.push((
            f.from_us,
            "SERVER fails over to its lagging replica".to_string(),
        ));
    }
    for e in &h.server {
        let line = match e {
            ServerEvent::Write(w) => Some((
                w.at_us,
                format!("SERVER writes {} = {} (fence {})", w.key, w.value, w.fence),
            )),
            ServerEvent::Raise(r) => Some((
                r.at_us,
                format!("SERVER raises {:?} to {}", r.epoch, r.value),
            )),
            _ => None,
        };
        lines.extend(line);
    }
    // Acquisitions and bumps carry no time of their own: listed in the server's order after.
    lines.sort_by_key(|(at, _)| *at);
    let mut out = String::new();
    for (at, line) in lines {
        out.push_str(&format!("  {:>9}  {line}\n", at.saturating_sub(origin)));
    }
    out.push_str("  server order of acquisitions and bumps:");
    for e in &h.server {
        match e {
            ServerEvent::Acquire { key, token } => out.push_str(&format!(" acq({key},{token})")),
            ServerEvent::Bump { key, cause } => out.push_str(&format!(" bump({key},{cause:?})")),
            ServerEvent::Life(n) => out.push_str(&format!(" LIFE{n}")),
            ServerEvent::Rollback(r) => out.push_str(&format!(
                " failover({},{:?}->{:?},lost {:?})",
                r.key, r.from, r.to, r.lost
            )),
            _ => {}
        }
    }
    out.push('\n');
    out
}
