//! Minimal HTTP/1.1: one request per connection (`Connection: close`), `Content-Length`
//! bodies only. Invariants: a malformed or oversized request gets a 400/413 answer and never
//! takes the server down; the head is capped at [`MAX_HEAD`] bytes, the whole request must
//! arrive within [`REQUEST_DEADLINE`], and the body is only read once the caller is
//! authorized (so an unauthenticated peer cannot make the server allocate or wait for it).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Largest accepted body (a component upload).
pub const MAX_BODY: usize = 64 << 20;
/// Largest accepted request line + headers.
pub const MAX_HEAD: usize = 16 << 10;
/// The whole request must have arrived by then.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(60);

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
    /// JSON body.
    pub body: String,
}

impl Response {
    /// 200 with a JSON value.
    pub fn ok(v: &impl serde::Serialize) -> Self {
        Response { status: 200, body: serde_json::to_string_pretty(v).unwrap_or_else(|_| "null".into()) }
    }

    /// An error status with `{"error": message}`.
    pub fn error(status: u16, message: impl Into<String>) -> Self {
        Response { status, body: serde_json::json!({ "error": message.into() }).to_string() }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        413 => "Payload Too Large",
        408 => "Request Timeout",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    }
}

/// Reads one request from `stream`; `authorized(token)` is asked before the body is read.
pub fn read_request(stream: &mut TcpStream, authorized: &dyn Fn(Option<&str>) -> bool) -> Result<Request, Response> {
    let deadline = std::time::Instant::now() + REQUEST_DEADLINE;
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut r = BufReader::new(stream);
    let mut head_bytes = 0usize;
    let mut read_line = |r: &mut BufReader<&mut TcpStream>, what: &str| -> Result<String, Response> {
        let mut line = Vec::new();
        let n = r
            .by_ref()
            .take((MAX_HEAD - head_bytes.min(MAX_HEAD)) as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(|e| Response::error(400, format!("reading {what}: {e}")))?;
        head_bytes += n;
        if head_bytes > MAX_HEAD {
            return Err(Response::error(413, format!("request head exceeds {MAX_HEAD} bytes")));
        }
        if std::time::Instant::now() > deadline {
            return Err(Response::error(408, "request too slow"));
        }
        String::from_utf8(line).map_err(|_| Response::error(400, format!("{what} is not UTF-8")))
    };
    let line = read_line(&mut r, "the request line")?;
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Err(Response::error(400, "malformed request line"));
    };
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let query = query
        .split('&')
        .filter(|q| !q.is_empty())
        .map(|q| q.split_once('=').map_or((q.to_string(), String::new()), |(k, v)| (k.into(), v.into())))
        .collect();
    let (mut len, mut token) = (0usize, None);
    loop {
        let h = read_line(&mut r, "headers")?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let Some((k, v)) = h.split_once(':') else { return Err(Response::error(400, "malformed header")) };
        let v = v.trim();
        if k.eq_ignore_ascii_case("content-length") {
            len = v.parse().map_err(|_| Response::error(400, "bad Content-Length"))?;
        } else if k.eq_ignore_ascii_case("authorization") {
            token = v.strip_prefix("Bearer ").map(str::to_string);
        }
    }
    if !authorized(token.as_deref()) {
        return Err(Response::error(401, "missing or wrong bearer token"));
    }
    if len > MAX_BODY {
        return Err(Response::error(413, format!("body of {len} bytes exceeds {MAX_BODY}")));
    }
    let mut body = Vec::with_capacity(len.min(1 << 20));
    let mut chunk = [0u8; 64 << 10];
    while body.len() < len {
        if std::time::Instant::now() > deadline {
            return Err(Response::error(408, "request too slow"));
        }
        let want = (len - body.len()).min(chunk.len());
        let n = r.read(&mut chunk[..want]).map_err(|e| Response::error(400, format!("reading the body: {e}")))?;
        if n == 0 {
            return Err(Response::error(400, "the body ended early"));
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Ok(Request { method: method.to_string(), path: path.to_string(), query, token, body })
}

/// Writes `resp` and closes.
pub fn write_response(stream: &mut TcpStream, resp: &Response) {
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        resp.status,
        reason(resp.status),
        resp.body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(resp.body.as_bytes());
    let _ = stream.flush();
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
