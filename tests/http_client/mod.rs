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
    tokio::time::timeout(Duration::from_secs(30), try_request(method, addr, path))
        .await
        .unwrap_or_else(|_| panic!("{method} {path} on {addr}: no response within 30 s"))
        .unwrap_or_else(|e| panic!("{method} {path} on {addr}: {e}"))
}

async fn try_request(method: &str, addr: &str, path: &str) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect(addr).await?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let raw = String::from_utf8(raw).expect("a UTF-8 response");
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of headers in {raw:?}"));
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
    if let Some(length) = response.header("content-length") {
        assert_eq!(
            length.parse::<usize>().ok(),
            Some(body.len()),
            "{response:?}"
        );
    }
    Ok(response)
}
