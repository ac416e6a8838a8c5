//! The CLI's side of the control API.

use std::time::Duration;

use crate::api::http;

/// Where the API is and how to authenticate.
#[derive(Debug, Clone)]
pub struct Client {
    /// `host:port`.
    pub addr: String,
    /// Bearer token.
    pub token: String,
}

/// A failed call: the server's error message or why it could not be reached.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ClientError(pub String);

impl Client {
    /// A client for `url` (`http://host:port` or `host:port`).
    pub fn new(url: &str, token: &str) -> Self {
        let addr = url.trim_start_matches("http://").trim_end_matches('/').to_string();
        Client { addr, token: token.to_string() }
    }

    /// Calls `method path` with `body`; returns the JSON answer.
    pub fn call(&self, method: &str, path: &str, body: &[u8]) -> Result<serde_json::Value, ClientError> {
        let (status, text) = http::send(&self.addr, method, path, &self.token, body, Duration::from_secs(180))
            .map_err(|e| ClientError(format!("cannot reach the Weir API at {}: {e}", self.addr)))?;
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
        if status == 200 {
            Ok(v)
        } else {
            let msg = v.get("error").and_then(|e| e.as_str()).map(str::to_string).unwrap_or_else(|| v.to_string());
            Err(ClientError(msg))
        }
    }
}
