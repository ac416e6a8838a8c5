//! The CLI's side of the control API: blocking HTTP(S) through ureq, a bearer token, JSON
//! answers. `https://` servers are verified against the public web roots, or only against the
//! CA given with `--ca-cert` (a server's own or self-signed certificate).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ureq::tls::{Certificate, RootCerts, TlsConfig};

/// How long one call may take in all (a savepoint of a large job waits for it).
const CALL_TIMEOUT: Duration = Duration::from_secs(180);
/// Largest answer read (a job list, a checkpoint's detail).
const MAX_ANSWER: u64 = 64 << 20;

/// Where the API is and how to authenticate.
#[derive(Clone)]
pub struct Client {
    /// `http://host:port` or `https://host:port`, without a trailing `/`.
    pub base: String,
    /// Bearer token.
    pub token: String,
    agent: ureq::Agent,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("base", &self.base).finish_non_exhaustive()
    }
}

/// A failed call: the server's error message or why it could not be reached.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ClientError(pub String);

impl Client {
    /// A client for `url` (`http://host:port`, `https://host:port` or `host:port`), trusting
    /// the usual web roots for `https://`.
    pub fn new(url: &str, token: &str) -> Self {
        Self::build(url, token, None)
    }

    /// A client that trusts only the certificates in the PEM file `ca` (a private CA, or the
    /// server's self-signed certificate).
    pub fn with_ca(url: &str, token: &str, ca: &Path) -> Result<Self, ClientError> {
        let certs: Vec<Certificate<'static>> = crate::pem::certificates(ca)
            .map_err(|e| ClientError(format!("--ca-cert {}: {e}", ca.display())))?
            .iter()
            .map(|c| Certificate::from_der(c.as_ref()).to_owned())
            .collect();
        Ok(Self::build(url, token, Some(RootCerts::Specific(Arc::new(certs)))))
    }

    fn build(url: &str, token: &str, roots: Option<RootCerts>) -> Self {
        let url = url.trim_end_matches('/');
        let base = if url.contains("://") { url.to_string() } else { format!("http://{url}") };
        let mut tls = TlsConfig::builder();
        if let Some(r) = roots {
            tls = tls.root_certs(r);
        }
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(CALL_TIMEOUT))
            .tls_config(tls.build())
            .build();
        Client { base, token: token.to_string(), agent: ureq::Agent::new_with_config(config) }
    }

    /// Calls `method path` with `body`; returns the JSON answer.
    pub fn call(&self, method: &str, path: &str, body: &[u8]) -> Result<serde_json::Value, ClientError> {
        let url = format!("{}{path}", self.base);
        let unreachable = |e: ureq::Error| ClientError(format!("cannot reach the Weir API at {}: {e}", self.base));
        let auth = format!("Bearer {}", self.token);
        let answer = if method == "GET" {
            self.agent.get(&url).header("Authorization", &auth).call()
        } else {
            let req = ureq::http::Request::builder()
                .method(method)
                .uri(&url)
                .header("Authorization", &auth)
                .body(body)
                .map_err(|e| ClientError(format!("{method} {url}: {e}")))?;
            self.agent.run(req)
        };
        let mut answer = answer.map_err(unreachable)?;
        let status = answer.status().as_u16();
        let text = answer.body_mut().with_config().limit(MAX_ANSWER).read_to_string().map_err(unreachable)?;
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
        if status == 200 {
            Ok(v)
        } else {
            let msg = v.get("error").and_then(|e| e.as_str()).map(str::to_string).unwrap_or_else(|| v.to_string());
            Err(ClientError(msg))
        }
    }
}
