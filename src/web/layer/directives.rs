//! `Cache-Control`, read the way a shared cache reads it (RFC 9111 §5.2): the directives this
//! layer acts on, from every `Cache-Control` field of a request or a response.

use axum::http::{header, HeaderMap};

/// The directives the layer acts on. Anything it does not know is ignored, as the RFC asks.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Directives {
    pub(super) no_store: bool,
    /// With or without a field list: a field-scoped `no-cache="set-cookie"` cannot be honoured
    /// by a cache that replays whole responses, so it counts as the plain directive.
    pub(super) no_cache: bool,
    /// With or without a field list, for the same reason.
    pub(super) private: bool,
    pub(super) public: bool,
    pub(super) must_revalidate: bool,
    pub(super) max_age: Option<u64>,
    pub(super) s_maxage: Option<u64>,
}

impl Directives {
    /// The directives of every `Cache-Control` field in `headers`. A malformed number makes
    /// its directive count as 0 (RFC 9111 §4.2.1: an invalid freshness is stale).
    pub(super) fn of(headers: &HeaderMap) -> Directives {
        let mut found = Directives::default();
        for value in headers.get_all(header::CACHE_CONTROL) {
            let Ok(value) = value.to_str() else {
                // Not text: the one safe reading is that nothing may be stored.
                found.no_store = true;
                continue;
            };
            for directive in value.split(',') {
                let (name, argument) = match directive.split_once('=') {
                    Some((name, argument)) => {
                        (name.trim(), Some(argument.trim().trim_matches('"')))
                    }
                    None => (directive.trim(), None),
                };
                let seconds = || argument.and_then(|a| a.parse::<u64>().ok()).unwrap_or(0);
                match name.to_ascii_lowercase().as_str() {
                    "no-store" => found.no_store = true,
                    "no-cache" => found.no_cache = true,
                    "private" => found.private = true,
                    "public" => found.public = true,
                    "must-revalidate" | "proxy-revalidate" => found.must_revalidate = true,
                    "max-age" => found.max_age = Some(seconds()),
                    "s-maxage" => found.s_maxage = Some(seconds()),
                    _ => {}
                }
            }
        }
        found
    }

    /// How long a shared cache may keep the response: `s-maxage` over `max-age`.
    pub(super) fn shared_max_age(&self) -> Option<u64> {
        self.s_maxage.or(self.max_age)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn of(values: &[&str]) -> Directives {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(header::CACHE_CONTROL, HeaderValue::from_str(v).unwrap());
        }
        Directives::of(&headers)
    }

    #[test]
    fn every_field_and_directive_is_read_case_insensitively() {
        let d = of(&["Public, MAX-AGE=60", "s-maxage=\"300\""]);
        assert!(d.public && !d.no_store && !d.private);
        assert_eq!(
            (d.max_age, d.s_maxage, d.shared_max_age()),
            (Some(60), Some(300), Some(300))
        );
        assert!(of(&["private=\"set-cookie\""]).private);
        assert!(of(&["no-cache=\"x\", max-age=5"]).no_cache);
        assert!(of(&["no-store"]).no_store);
        assert_eq!(of(&["max-age=soon"]).max_age, Some(0), "invalid is stale");
        assert_eq!(of(&[]), Directives::default());
    }
}
