//! A client span per Redis request, in one place: the store's data connection is wrapped in
//! [`Traced`], so every command, script call (`EVALSHA`, and the `SCRIPT LOAD` of a reload) and
//! pipeline the store sends gets one span with the OpenTelemetry attributes of a Redis client
//! call, whichever file built it. `tracing-opentelemetry` passes `db.*`, `server.*` and
//! `error.type` through as attributes and reads `otel.kind`, `otel.name` and `otel.status_code`.
//!
//! The spans are at `debug` level under the target `stampede_guard::redis`. Without a subscriber
//! that wants them, a request pays one level check and its future is sent as it is: no box, no
//! wrapper (the hit benchmark in `docs/observability.md`).
//!
//! Coalesced reads (`coalesce.rs`): one `MGET` carries many callers' reads. Each queued caller
//! gets its own client span for its read, covering its wait for the shared answer and marked
//! `stampede_guard.coalesced`; the `MGET` itself is sent inside the first of them, and a request
//! sent inside one of these spans opens no second span. So every caller's trace shows the
//! request its read went out in, and none shows it twice.
//!
//! Explained in the guide: `docs/observability.md` (Spans).

use std::sync::Arc;

use redis::aio::ConnectionLike;
use redis::{Arg, Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};
use tracing::field::Empty;
use tracing::{Instrument, Span};

use super::classify::classify;

/// The name of every client span (its `otel.name` says the operation): how a request sent
/// inside one knows it is already traced.
const SPAN_NAME: &str = "redis";

/// Where a connection's requests go: the attributes each client span carries.
#[derive(Debug, Default)]
pub(crate) struct Target {
    /// `db.namespace`: the database index, as text (`"0"` on a cluster).
    namespace: String,
    /// `server.address` and `server.port` of a single server (a Unix socket has no port: 0
    /// is left out). `None` on a cluster: the node a request goes to is chosen inside the
    /// cluster client, below this seam.
    server: Option<(String, u16)>,
}

impl Target {
    /// The target of a connection to the server of `info`.
    pub(crate) fn of(info: &redis::ConnectionInfo) -> Self {
        let server = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => Some((host.clone(), *port)),
            redis::ConnectionAddr::TcpTls { host, port, .. } => Some((host.clone(), *port)),
            redis::ConnectionAddr::Unix(path) => Some((path.display().to_string(), 0)),
            _ => None,
        };
        Target {
            namespace: info.redis_settings().db().to_string(),
            server,
        }
    }

    /// A cluster's target: database 0, the node unknown here.
    pub(crate) fn cluster() -> Self {
        Target {
            namespace: "0".to_owned(),
            server: None,
        }
    }

    /// A client span for `operation` (a command's name, or `BATCH ...` for a pipeline) of
    /// `batch` commands (recorded only for a pipeline or a coalesced read, as the conventions
    /// ask: `db.operation.batch.size` is for batches of two or more).
    pub(crate) fn span(&self, operation: &str, batch: Option<usize>) -> Span {
        let span = tracing::debug_span!(
            target: "stampede_guard::redis",
            SPAN_NAME,
            otel.name = operation,
            otel.kind = "client",
            otel.status_code = Empty,
            db.system.name = "redis",
            db.operation.name = operation,
            db.namespace = self.namespace.as_str(),
            db.operation.batch.size = Empty,
            db.response.status_code = Empty,
            server.address = Empty,
            server.port = Empty,
            "error.type" = Empty,
            stampede_guard.error_class = Empty,
            stampede_guard.coalesced = Empty,
        );
        if span.is_disabled() {
            return span;
        }
        if let Some((address, port)) = &self.server {
            span.record("server.address", address.as_str());
            if *port != 0 {
                span.record("server.port", port);
            }
        }
        if let Some(size) = batch.filter(|size| *size > 1) {
            span.record("db.operation.batch.size", size);
        }
        span
    }
}

/// Records the failure of a request on its span: the server's error code as
/// `db.response.status_code` and `error.type`, else the failure's class (`unreachable`, ...),
/// which `stampede_guard.error_class` always carries; the span's status is then an error.
pub(crate) fn record_error(span: &Span, error: &RedisError) {
    if span.is_disabled() {
        return;
    }
    let class = classify(error).as_str();
    match error.code() {
        Some(code) => {
            span.record("db.response.status_code", code);
            span.record("error.type", code);
        }
        None => {
            span.record("error.type", class);
        }
    }
    span.record("stampede_guard.error_class", class);
    span.record("otel.status_code", "ERROR");
}

/// Records on `span` the outcome of its request.
fn record<T>(span: &Span, answer: &RedisResult<T>) {
    if let Err(e) = answer {
        record_error(span, e);
    }
}

/// Whether the current span is one of these client spans: a request sent inside one is its
/// request (a coalesced read's `MGET`), and opens no span of its own.
fn inside_client_span() -> bool {
    Span::current()
        .metadata()
        .is_some_and(|meta| meta.name() == SPAN_NAME && meta.target() == "stampede_guard::redis")
}

/// A command's name as the conventions want it: its first word (`GET`, `MGET`, `EVALSHA`).
fn command_name(cmd: &Cmd) -> &str {
    match cmd.args_iter().next() {
        Some(Arg::Simple(name)) => std::str::from_utf8(name).unwrap_or("?"),
        _ => "?",
    }
}

/// A pipeline's operation: `BATCH <command>` when every command is the same, else `BATCH`.
fn pipeline_name(pipeline: &Pipeline) -> String {
    let mut names = pipeline.cmd_iter().map(command_name);
    let first = names.next().unwrap_or("?");
    if names.all(|name| name == first) {
        format!("BATCH {first}")
    } else {
        "BATCH".to_owned()
    }
}

/// A connection whose every request is a client span (see the module's docs).
#[derive(Clone)]
pub(crate) struct Traced<C> {
    conn: C,
    target: Arc<Target>,
}

impl<C> Traced<C> {
    /// `conn`, its requests traced as going to `target`.
    pub(crate) fn new(conn: C, target: Arc<Target>) -> Self {
        Traced { conn, target }
    }
}

impl<C> Traced<C> {
    /// The client span of a request named by `name` (its operation, and its size if a
    /// pipeline), or `None` (the request goes out as it is): without a subscriber that wants
    /// it, after one level check; inside a client span already (a coalesced read's `MGET`).
    fn span_of(&self, name: impl FnOnce() -> (String, Option<usize>)) -> Option<Span> {
        if !tracing::enabled!(target: "stampede_guard::redis", tracing::Level::DEBUG)
            || inside_client_span()
        {
            return None;
        }
        let (operation, batch) = name();
        let span = self.target.span(&operation, batch);
        (!span.is_disabled()).then_some(span)
    }
}

/// `request` inside `span`, its failure recorded there; as it is without a span (no box, no
/// wrapper).
fn traced<'a, T: Send + 'a>(span: Option<Span>, request: RedisFuture<'a, T>) -> RedisFuture<'a, T> {
    let Some(span) = span else {
        return request;
    };
    Box::pin(async move {
        let answer = request.instrument(span.clone()).await;
        record(&span, &answer);
        answer
    })
}

impl<C: ConnectionLike + Send + 'static> ConnectionLike for Traced<C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let span = self.span_of(|| (command_name(cmd).to_owned(), None));
        traced(span, self.conn.req_packed_command(cmd))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let span = self.span_of(|| (pipeline_name(pipeline), Some(pipeline.len())));
        traced(span, self.conn.req_packed_commands(pipeline, offset, count))
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_is_named_by_its_first_word_and_a_pipeline_by_its_commands() {
        assert_eq!(command_name(redis::cmd("MGET").arg("a").arg("b")), "MGET");
        let mut same = redis::pipe();
        same.cmd("GET").arg("a").cmd("GET").arg("b");
        assert_eq!(pipeline_name(&same), "BATCH GET");
        let mut mixed = redis::pipe();
        mixed.cmd("EVALSHA").arg("x").cmd("WAIT").arg(1).arg(10);
        assert_eq!(pipeline_name(&mixed), "BATCH");
    }

    #[test]
    fn a_single_server_is_named_and_a_cluster_is_not() {
        let info: redis::ConnectionInfo = "redis://127.0.0.1:6390/3".parse().unwrap();
        let target = Target::of(&info);
        assert_eq!(target.namespace, "3");
        assert_eq!(target.server, Some(("127.0.0.1".to_owned(), 6390)));
        assert_eq!(Target::cluster().server, None);
    }
}
