//! The API's requests and answers as the routes see them (the server side of HTTP is hyper's,
//! in `listener.rs`), and the CLI's small blocking client: one request per connection
//! (`Connection: close`), `Content-Length` bodies.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Largest accepted body (a component upload).
pub const MAX_BODY: usize = 64 << 20;
/// Largest accepted request line + headers.
pub const MAX_HEAD: usize = 16 << 10;

/// A parsed request.
#[derive(Debug)]
pub struct Request {
    /// `GET`, `POST`, ...
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// `key=value` pairs of the query, undecoded.
    pub query: Vec<(String, String)>,
    /// Bearer token, if any.
    pub token: Option<String>,
    /// Body.
    pub body: Vec<u8>,
}

impl Request {
    /// A query parameter.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// A response: status and JSON body.
#[derive(Debug)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Body (JSON unless `content_type` says otherwise).
    pub body: String,
    /// Its media type.
    pub content_type: &'static str,
}

impl Response {
    /// 200 with a JSON value.
    pub fn ok(v: &impl serde::Serialize) -> Self {
        Response {
            status: 200,
            body: serde_json::to_string_pretty(v).unwrap_or_else(|_| "null".into()),
            content_type: "application/json",
        }
    }

    /// An error status with `{"error": message}`.
    pub fn error(status: u16, message: impl Into<String>) -> Self {
        Response {
            status,
            body: serde_json::json!({ "error": message.into() }).to_string(),
            content_type: "application/json",
        }
    }

    /// 200 with text in the Prometheus exposition format.
    pub fn prometheus(body: String) -> Self {
        Response { status: 200, body, content_type: "text/plain; version=0.0.4; charset=utf-8" }
    }
}

/// Sends one request to `addr` (`host:port`) and returns (status, body).
pub fn send(
    addr: &str,
    method: &str,
    path: &str,
    token: &str,
    body: &[u8],
    timeout: Duration,
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(timeout))?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("malformed HTTP response"))?;
    Ok((status, body.to_string()))
}

/// Percent-decodes a query value.
pub fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                match u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Percent-encodes a query value.
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|c| match c {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => (c as char).to_string(),
            _ => format!("%{c:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_round_trip() {
        for s in ["/tmp/a b/sp", "x%y&z=1", "ünï", ""] {
            assert_eq!(decode(&encode(s)), s);
        }
        assert_eq!(decode("%zz"), "%zz");
        assert_eq!(decode("a%2"), "a%2");
    }
}
