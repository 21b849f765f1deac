//! The tags of what the layer stores for a request: the tag function's answer, checked before
//! anything is read, so that a response is never stored without the tags meant to invalidate
//! it. A request whose tags cannot be had passes through, and that is logged once a minute.

use std::time::Duration;

use axum::http::request;

use super::TagFn;
use crate::log::LogThrottle;
use crate::{Cache, Codec, Error};

/// How often at most the refusals of a process are logged, with their count since the last line.
const REFUSED_LOG_EVERY: Duration = Duration::from_secs(60);

/// The requests whose tags could not be had, across every layer of the process: a tag function
/// that fails on every request must not write a line per request.
static REFUSED: LogThrottle = LogThrottle::new();

/// A handle on `cache` that carries the tags `tag_fn` gives for the request, or `None` (logged)
/// when it gives none or one the cache refuses: the request then passes.
pub(super) fn tagged<C: Codec>(
    cache: &Cache<C>,
    tag_fn: &TagFn,
    parts: &request::Parts,
) -> Option<Cache<C>> {
    let refused = match tag_fn(parts) {
        Some(tags) => {
            let tagged = cache.tagged(tags);
            match tagged.engine.check_tags() {
                Ok(()) => return Some(tagged),
                Err(e) => Some(e),
            }
        }
        None => None,
    };
    log_refused(refused.as_ref(), parts);
    None
}

/// One line a minute at most, saying why, what happened to the requests, and what to change.
fn log_refused(error: Option<&Error>, parts: &request::Parts) {
    let path = parts.uri.path();
    let why = match error {
        Some(e) => format!("it gave a tag the cache refuses ({e})"),
        None => "it gave no tags (None)".to_owned(),
    };
    match REFUSED.due(REFUSED_LOG_EVERY) {
        Some(count) => tracing::warn!(count, path, reason = %why,
            "response cache: requests passed uncached because of the tag function (count since \
             the last such line; reason: the last one's); make it return Some with tags that \
             are not empty, at most MAX_KEY_BYTES long and, with the cache's own, at most MAX_TAGS"),
        None => tracing::debug!(path, reason = %why,
            "response cache: a request passed uncached because of the tag function"),
    }
}
