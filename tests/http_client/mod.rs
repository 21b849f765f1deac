//! A minimal HTTP/1.1 client for the tests: one `GET` or `POST` per connection (`Connection: close`), the
//! response read to the end. Real requests over a real socket, and no HTTP client crate to build.
#![allow(dead_code)] // each test binary uses a different part of this module

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A response: status, headers (names lower-cased) and body.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    /// The first header named `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// `GET path` on `addr` (`host:port`); panics if there is no complete response within 30 s.
pub async fn get(addr: &str, path: &str) -> Response {
    request("GET", addr, path).await
}

/// `POST path` on `addr`, with an empty body; as [`get`] otherwise.
pub async fn post(addr: &str, path: &str) -> Response {
    request("POST", addr, path).await
}

async fn request(method: &str, addr: &str, path: &str) -> Response {
    send(method, addr, path, &[]).await
}

/// `method path` on `addr` with extra request headers; as [`get`] otherwise.
pub async fn send(method: &str, addr: &str, path: &str, headers: &[(&str, &str)]) -> Response {
    try_send(method, addr, path, headers)
        .await
        .unwrap_or_else(|e| panic!("{method} {path} on {addr}: {e}"))
}

/// As [`send`], but a connection closed without a response (a handler that panicked) is an
/// error, not a panic.
pub async fn try_send(
    method: &str,
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<Response> {
    tokio::time::timeout(
        Duration::from_secs(30),
        try_request(method, addr, path, headers),
    )
    .await
    .unwrap_or_else(|_| panic!("{method} {path} on {addr}: no response within 30 s"))
}

async fn try_request(
    method: &str,
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect(addr).await?;
    let extra: String = headers
        .iter()
        .map(|(n, v)| format!("{n}: {v}\r\n"))
        .collect();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let raw = String::from_utf8(raw).expect("a UTF-8 response");
    let Some((head, body)) = raw.split_once("\r\n\r\n") else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("no end of headers in {raw:?}"),
        ));
    };
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let response = Response {
        status,
        headers,
        body: body.to_owned(),
    };
    // The services under test send sized bodies; a chunked one would need decoding.
    assert_ne!(
        response.header("transfer-encoding"),
        Some("chunked"),
        "unexpected chunked body"
    );
    // A response to HEAD gives the length of the body it leaves out.
    if let Some(length) = response
        .header("content-length")
        .filter(|_| method != "HEAD")
    {
        assert_eq!(
            length.parse::<usize>().ok(),
            Some(body.len()),
            "{response:?}"
        );
    }
    Ok(response)
}
