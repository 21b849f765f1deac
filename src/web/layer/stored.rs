//! What the layer stores under a key (a whole response, the `Vary` marker of a resource, or the
//! note that a resource is not cacheable), and the responses built back from it: the full one,
//! the body-less one for `HEAD`, and `304 Not Modified` for a matching `If-None-Match`.

use std::hash::{Hash, Hasher};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::http::{header, response, HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The value stored under a key: this is the serde type every instance reads and writes.
#[derive(Debug, Clone)]
pub(super) enum Entry {
    /// A response to replay.
    Response(StoredResponse),
    /// Under a primary key: the resource's responses vary on these request headers (lower
    /// case, sorted); each combination of values has its own key ([`super::key::secondary`]).
    Vary(Vec<String>),
    /// The resource answered with something not stored (`no-store`, `private`, a status not
    /// configured, a body over the limit): for a while, requests go straight to the handler
    /// instead of queueing behind one another for a response that will not be shared (what
    /// Varnish calls hit-for-pass).
    Pass,
}

/// A response as stored: status, headers, body, its entity tag, and when it was stored.
#[derive(Debug, Clone)]
pub(super) struct StoredResponse {
    status: u16,
    /// Names and raw values, in order (a name may come more than once).
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    /// The response's own `ETag`, or one made from its status and body.
    etag: String,
    /// Wall-clock milliseconds since the epoch, for `Age` (instances' clocks agree well enough
    /// for a header that is informative).
    stored_at_ms: u64,
}

/// Headers never stored: hop-by-hop ones (RFC 9110 §7.6.1), the length (the body's own is
/// sent), and what the layer writes itself on every response it serves.
fn is_stored(name: &HeaderName, source_header: &HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "content-length"
            | "age"
    ) && name != source_header
}

impl StoredResponse {
    /// The response `parts` with `body`, ready to store; its `ETag` is the response's own or
    /// a strong one made from the status and body.
    pub(super) fn new(parts: &response::Parts, body: Bytes, source_header: &HeaderName) -> Self {
        Self::build(parts, body, source_header, true)
    }

    /// The response `parts` with `body`, handed to requests but not stored (a 5xx shared with
    /// the requests that waited for it): no `ETag` is made, since a client would send back a
    /// tag that names nothing the cache holds; the response's own is kept.
    pub(super) fn unstored(
        parts: &response::Parts,
        body: Bytes,
        source_header: &HeaderName,
    ) -> Self {
        Self::build(parts, body, source_header, false)
    }

    /// This response, made to be stored but served without having been (computed while the
    /// backend was down, or its write failed): the `ETag` made for it is taken off again.
    pub(super) fn into_unstored(mut self) -> Self {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::OK);
        if self.etag == made_etag(status, &self.body) {
            self.headers
                .retain(|(name, _)| name.as_str() != header::ETAG.as_str());
            self.etag.clear();
        }
        self
    }

    fn build(
        parts: &response::Parts,
        body: Bytes,
        source_header: &HeaderName,
        make_etag: bool,
    ) -> Self {
        let etag = match parts.headers.get(header::ETAG).map(|v| v.to_str()) {
            Some(Ok(etag)) => etag.to_owned(),
            _ if make_etag => made_etag(parts.status, &body),
            _ => String::new(),
        };
        // A stored response's tag goes last, in the one form `matches` compares; an unstored
        // one keeps the handler's header as it came.
        let mut headers: Vec<(String, Vec<u8>)> = parts
            .headers
            .iter()
            .filter(|(name, _)| is_stored(name, source_header))
            .filter(|(name, _)| !make_etag || *name != header::ETAG)
            .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
            .collect();
        if make_etag {
            headers.push((header::ETAG.as_str().to_owned(), etag.clone().into_bytes()));
        }
        StoredResponse {
            status: parts.status.as_u16(),
            headers,
            body: body.into(),
            etag,
            stored_at_ms: now_ms(),
        }
    }

    /// Seconds since it was stored (0 if a clock went back).
    pub(super) fn age(&self) -> u64 {
        now_ms().saturating_sub(self.stored_at_ms) / 1000
    }

    /// Whether `If-None-Match` in `request` names this response's tag (the weak comparison of
    /// RFC 9110 §13.1.2, which is the one for `If-None-Match`), or is `*`.
    pub(super) fn matches(&self, request: &HeaderMap) -> bool {
        if self.etag.is_empty() {
            return false; // nothing stored to be unchanged
        }
        let ours = self.etag.trim_start_matches("W/");
        request
            .get_all(header::IF_NONE_MATCH)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .any(|theirs| theirs == "*" || theirs.trim_start_matches("W/") == ours)
    }

    /// The whole response (without its body for `HEAD`, its length kept).
    pub(super) fn into_response(self, head: bool) -> Response<Body> {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::OK);
        let length = HeaderValue::from(self.body.len());
        let body = if head {
            Body::empty()
        } else {
            Body::from(Bytes::from(self.body))
        };
        let mut response = Response::new(body);
        *response.status_mut() = status;
        let headers = response.headers_mut();
        copy_headers(self.headers, headers, |_| true);
        headers.insert(header::CONTENT_LENGTH, length);
        response
    }

    /// `304 Not Modified` with the headers RFC 9110 §15.4.5 asks for.
    pub(super) fn not_modified(self) -> Response<Body> {
        let mut response = Response::new(Body::empty());
        *response.status_mut() = StatusCode::NOT_MODIFIED;
        copy_headers(self.headers, response.headers_mut(), |name| {
            matches!(
                name,
                "cache-control" | "content-location" | "date" | "etag" | "expires" | "vary"
            )
        });
        response
    }
}

fn copy_headers(from: Vec<(String, Vec<u8>)>, to: &mut HeaderMap, keep: impl Fn(&str) -> bool) {
    for (name, value) in from {
        if !keep(&name) {
            continue;
        }
        // Written from a valid header: these only fail on bytes some other writer put there.
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(&value),
        ) {
            to.append(name, value);
        }
    }
}

/// A strong tag from the status and the body: the same response gives the same tag on every
/// instance (it is made once, by the instance that stores the response, and stored with it).
fn made_etag(status: StatusCode, body: &[u8]) -> String {
    // Two differently keyed SipHashes: 128 bits, with the length, against accidental equality.
    let hash = |seed: u64| {
        let mut hasher = std::hash::DefaultHasher::new();
        (seed, status.as_u16(), body).hash(&mut hasher);
        hasher.finish()
    };
    format!("\"{:x}-{:016x}{:016x}\"", body.len(), hash(1), hash(2))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The stored form of an [`Entry`]: a tuple (serde has its impls; the crate's serde has no
/// derive), tagged 0 (a response), 1 (`Vary` names) or 2 (passing). Fields an entry does not
/// use are empty.
type Wire = (
    u8,
    u16,
    Vec<(String, Vec<u8>)>,
    ByteString,
    String,
    u64,
    Vec<String>,
);

const RESPONSE: u8 = 0;
const VARY: u8 = 1;
const PASS: u8 = 2;

impl Serialize for Entry {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        const NONE: &[(String, Vec<u8>)] = &[];
        match self {
            Entry::Response(r) => (
                RESPONSE,
                r.status,
                &r.headers,
                ByteStr(&r.body),
                &r.etag,
                r.stored_at_ms,
                &[] as &[String],
            )
                .serialize(serializer),
            Entry::Vary(names) => {
                (VARY, 0u16, NONE, ByteStr(&[]), "", 0u64, names).serialize(serializer)
            }
            Entry::Pass => {
                (PASS, 0u16, NONE, ByteStr(&[]), "", 0u64, &[] as &[String]).serialize(serializer)
            }
        }
    }
}

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let (tag, status, headers, body, etag, stored_at_ms, names): Wire =
            Deserialize::deserialize(deserializer)?;
        match tag {
            RESPONSE => Ok(Entry::Response(StoredResponse {
                status,
                headers,
                body: body.0,
                etag,
                stored_at_ms,
            })),
            VARY => Ok(Entry::Vary(names)),
            PASS => Ok(Entry::Pass),
            other => Err(serde::de::Error::custom(format_args!(
                "unknown response-cache entry tag {other}"
            ))),
        }
    }
}

/// The body written as one byte string (bincode writes a length and the bytes, and reads them
/// back in one copy), not as a sequence of numbers read one by one.
struct ByteStr<'a>(&'a [u8]);

impl Serialize for ByteStr<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(self.0)
    }
}

/// A body read back.
struct ByteString(Vec<u8>);

impl<'de> Deserialize<'de> for ByteString {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_byte_buf(BytesVisitor)
            .map(ByteString)
    }
}

struct BytesVisitor;

impl<'de> serde::de::Visitor<'de> for BytesVisitor {
    type Value = Vec<u8>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a byte string")
    }

    fn visit_bytes<E>(self, v: &[u8]) -> Result<Vec<u8>, E> {
        Ok(v.to_vec())
    }

    fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
        Ok(v)
    }

    // Codecs without a byte-string type (JSON) write a sequence of numbers.
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
        let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
        while let Some(b) = seq.next_element()? {
            bytes.push(b);
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Bincode, Codec};

    fn stored(headers: &[(&str, &str)], body: &'static [u8]) -> StoredResponse {
        let mut response = Response::builder().status(200);
        for (n, v) in headers {
            response = response.header(*n, *v);
        }
        let (parts, ()) = response.body(()).unwrap().into_parts();
        StoredResponse::new(
            &parts,
            Bytes::from_static(body),
            &HeaderName::from_static("x-cache"),
        )
    }

    #[test]
    fn the_codec_round_trips_a_response_and_keeps_no_hop_by_hop_header() {
        let response = stored(
            &[
                ("content-type", "text/plain"),
                ("connection", "close"),
                ("x-cache", "hit"),
                ("set", "a"),
                ("set", "b"),
            ],
            b"body \x00\xff",
        );
        let bytes = Bincode.encode(&Entry::Response(response)).unwrap();
        let Entry::Response(back) = Bincode.decode::<Entry>(&bytes).unwrap() else {
            panic!("not a response");
        };
        assert_eq!(back.body, b"body \x00\xff");
        let names: Vec<&str> = back.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["content-type", "set", "set", "etag"]);
    }

    #[test]
    fn a_made_etag_depends_on_the_body_and_if_none_match_compares_weakly() {
        let a = stored(&[], b"a");
        assert_ne!(a.etag, stored(&[], b"b").etag);
        assert_eq!(a.etag, stored(&[], b"a").etag);
        let mut request = HeaderMap::new();
        request.insert(
            header::IF_NONE_MATCH,
            HeaderValue::from_str(&format!("\"x\", W/{}", a.etag)).unwrap(),
        );
        assert!(a.matches(&request));
        request.insert(header::IF_NONE_MATCH, HeaderValue::from_static("\"x\""));
        assert!(!a.matches(&request));
        request.insert(header::IF_NONE_MATCH, HeaderValue::from_static("*"));
        assert!(a.matches(&request));
        let own = stored(&[("etag", "\"v7\"")], b"a");
        assert_eq!(own.etag, "\"v7\"");
    }

    #[test]
    fn a_response_not_stored_carries_no_made_etag_and_keeps_its_own() {
        let etag_of = |response: StoredResponse| {
            let response = response.into_response(false);
            response.headers().get(header::ETAG).cloned()
        };
        let (made, own) = (stored(&[], b"a"), stored(&[("etag", "\"v7\"")], b"a"));
        assert!(etag_of(made.clone()).is_some());
        assert_eq!(etag_of(made.clone().into_unstored()), None);
        assert!(!made.into_unstored().matches(&{
            let mut request = HeaderMap::new();
            request.insert(header::IF_NONE_MATCH, HeaderValue::from_static("*"));
            request
        }));
        assert_eq!(
            etag_of(own.into_unstored()),
            Some(HeaderValue::from_static("\"v7\""))
        );
        let (parts, ()) = Response::builder()
            .status(503)
            .body(())
            .unwrap()
            .into_parts();
        let header = HeaderName::from_static("x-cache");
        let failed = StoredResponse::unstored(&parts, Bytes::from_static(b"down"), &header);
        assert_eq!(etag_of(failed), None);
    }
}
