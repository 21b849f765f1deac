//! The cache key of a request: method, path and query, the key function's part, and the values
//! of the request headers that the response names in `Vary`.
//!
//! How a `Vary` learned from a response becomes part of the key: the first key of a request
//! (the *primary key*) has no header values in it. When the response to it names headers in
//! `Vary`, the layer stores a marker under the primary key (the header names) and the response
//! under a second key built from the primary key and the values of those headers in the
//! request. A later request reads the marker, builds its second key from its own header values
//! and reads (or computes) that. So a resource costs one extra read once it is known to vary,
//! and nothing when it does not.

use axum::http::{request, HeaderMap, Method};

/// The separator between the parts of a key: it cannot occur in a URI or a header value, so two
/// different requests cannot build the same key (a key function's own part may hold anything;
/// it is last but for the header values, whose names it cannot contain).
const SEPARATOR: char = '\n';

/// The primary key of a request: `GET` for a `HEAD` too (they share an entry), the path and
/// query as sent, and the key function's part, if any.
pub(super) fn primary(prefix: &str, request: &request::Parts, extra: Option<&str>) -> String {
    let method = if request.method == Method::HEAD {
        &Method::GET
    } else {
        &request.method
    };
    let target = request
        .uri
        .path_and_query()
        .map_or("/", |target| target.as_str());
    of(prefix, method, target, extra)
}

/// The primary key of a `method` request for `target` (path and query).
pub(super) fn of(prefix: &str, method: &Method, target: &str, extra: Option<&str>) -> String {
    let mut key = format!("{prefix}{method} {target}");
    if let Some(extra) = extra {
        key.push(SEPARATOR);
        key.push_str(extra);
    }
    key
}

/// What a response's `Vary` says about the requests it may answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Vary {
    /// Any request for the resource (no `Vary`).
    Any,
    /// The requests whose named headers (lower case, sorted, each once) have the same values.
    On(Vec<String>),
    /// No other request (`Vary: *`): not stored.
    Never,
}

impl Vary {
    /// The `Vary` fields of a response.
    pub(super) fn of(headers: &HeaderMap) -> Vary {
        let mut names = Vec::new();
        for value in headers.get_all(axum::http::header::VARY) {
            let Ok(value) = value.to_str() else {
                return Vary::Never;
            };
            for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                if name == "*" {
                    return Vary::Never;
                }
                names.push(name.to_ascii_lowercase());
            }
        }
        names.sort();
        names.dedup();
        if names.is_empty() {
            Vary::Any
        } else {
            Vary::On(names)
        }
    }
}

/// The secondary key: `primary` with a digest of the values of the `names` headers of the
/// request, or `None` when a value is not text (the layer passes such a request through, since
/// a lossy reading could give two different values one key). A digest (name-based UUID, SHA-1),
/// not the values: a `Vary: Cookie` must not write session cookies into Redis key names, where
/// `SCAN`, `MONITOR`, the slow log and the dump files show them.
pub(super) fn secondary(primary: &str, names: &[String], headers: &HeaderMap) -> Option<String> {
    let mut values_of = String::new();
    for name in names {
        values_of.push(SEPARATOR);
        values_of.push_str(name);
        let mut values = headers.get_all(name.as_str()).iter().peekable();
        if values.peek().is_none() {
            // Absent differs from present and empty.
            values_of.push('!');
            continue;
        }
        values_of.push(':');
        for (i, value) in values.enumerate() {
            if i > 0 {
                values_of.push(',');
            }
            values_of.push_str(value.to_str().ok()?.trim());
        }
    }
    let digest = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, values_of.as_bytes());
    Some(format!("{primary}{SEPARATOR}{}", digest.simple()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{header, HeaderValue, Request};

    fn parts(method: Method, uri: &str, headers: &[(&str, &str)]) -> request::Parts {
        let mut request = Request::builder().method(method).uri(uri);
        for (n, v) in headers {
            request = request.header(*n, *v);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn head_shares_gets_key_and_the_query_is_part_of_it() {
        let get = parts(Method::GET, "/r?a=1", &[]);
        let head = parts(Method::HEAD, "/r?a=1", &[]);
        assert_eq!(primary("p:", &get, None), "p:GET /r?a=1");
        assert_eq!(primary("p:", &get, None), primary("p:", &head, None));
        let other = parts(Method::GET, "/r?a=2", &[]);
        assert_ne!(primary("p:", &get, None), primary("p:", &other, None));
        assert_eq!(
            primary("p:", &get, Some("tenant-7")),
            "p:GET /r?a=1\ntenant-7"
        );
    }

    #[test]
    fn vary_is_read_from_every_field_and_star_is_never() {
        let mut headers = HeaderMap::new();
        assert_eq!(Vary::of(&headers), Vary::Any);
        headers.append(
            header::VARY,
            HeaderValue::from_static("Accept-Language, accept"),
        );
        headers.append(header::VARY, HeaderValue::from_static("accept-language"));
        assert_eq!(
            Vary::of(&headers),
            Vary::On(vec!["accept".into(), "accept-language".into()])
        );
        headers.append(header::VARY, HeaderValue::from_static("*"));
        assert_eq!(Vary::of(&headers), Vary::Never);
    }

    #[test]
    fn absent_empty_and_different_values_give_different_keys() {
        let names = vec!["accept-language".to_owned()];
        let key = |h: &[(&str, &str)]| secondary("k", &names, &parts(Method::GET, "/", h).headers);
        let fr = key(&[("accept-language", "fr")]);
        let fr_key = fr.as_deref().expect("text values give a key");
        // The primary key, then a digest: no header value is written into a Redis key name.
        assert!(
            fr_key.starts_with("k\n") && !fr_key.contains("fr"),
            "{fr_key}"
        );
        assert_ne!(fr, key(&[("accept-language", "de")]));
        assert_ne!(key(&[]), key(&[("accept-language", "")]));
        assert_eq!(fr, key(&[("Accept-Language", " fr ")]));
    }
}
