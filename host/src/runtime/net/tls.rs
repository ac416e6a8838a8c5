//! TLS between the members of a cluster (coordinators and workers), for the control plane and
//! the data plane alike: mutual TLS with rustls (ring provider), every member presenting a
//! certificate for the name [`CLUSTER_NAME`] that chains to the cluster's CA — or, as Flink
//! recommends for internal traffic, one self-signed certificate shared by every member, which
//! is then its own CA.
//!
//! Invariants: with TLS configured, a member speaks and accepts only TLS, and only with a peer
//! whose certificate verifies against the cluster's CA (a plain-TCP peer or one with another
//! CA's certificate never reaches HTTP/2, let alone the cluster secret check); a TLS handshake
//! that does not finish within [`HANDSHAKE_TIMEOUT`] is dropped; bad files stop the member at
//! start with the file named.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// The name every member's certificate is issued for (and verified against: members connect
/// by address, which changes, not by name).
pub const CLUSTER_NAME: &str = "weir-cluster";

/// How long a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection, plain or encrypted.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A connection as HTTP/2 runs over it.
pub type Stream = Box<dyn Io>;

/// The cluster's TLS settings, loaded.
#[derive(Clone)]
pub struct ClusterTls {
    acceptor: tokio_rustls::TlsAcceptor,
    connector: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for ClusterTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterTls")
    }
}

/// Why the TLS files do not make a configuration.
#[derive(Debug, thiserror::Error)]
#[error("--tls-{what} {}: {message}", path.display())]
pub struct TlsSetupError {
    /// `cert`, `key` or `ca`.
    pub what: &'static str,
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub message: String,
}

impl ClusterTls {
    /// This member's certificate chain and key, and the CA its peers' certificates must chain
    /// to (default: `cert` itself, a certificate shared by every member).
    pub fn load(cert: &Path, key: &Path, ca: Option<&Path>) -> Result<ClusterTls, TlsSetupError> {
        let err = |what: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |message: String| TlsSetupError { what, path, message }
        };
        let certs = crate::pem::certificates(cert).map_err(err("cert", cert))?;
        let private = PrivateKeyDer::from_pem_file(key).map_err(|e| err("key", key)(e.to_string()))?;
        let ca_path = ca.unwrap_or(cert);
        let mut roots = rustls::RootCertStore::empty();
        for c in crate::pem::certificates(ca_path).map_err(err("ca", ca_path))? {
            roots.add(c).map_err(|e| err("ca", ca_path)(e.to_string()))?;
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| err("ca", ca_path)(e.to_string()))?;
        let mismatch = |e: rustls::Error| err("key", key)(format!("{e}; check that it belongs to {}", cert.display()));
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(mismatch)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs.clone(), private.clone_key())
            .map_err(mismatch)?;
        server.alpn_protocols = vec![b"h2".to_vec()];
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(mismatch)?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, private)
            .map_err(mismatch)?;
        client.alpn_protocols = vec![b"h2".to_vec()];
        Ok(ClusterTls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
            connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
        })
    }
}

/// The server side of a new connection: TLS when configured.
pub async fn accept(tls: Option<&ClusterTls>, sock: TcpStream) -> std::io::Result<Stream> {
    let _ = sock.set_nodelay(true);
    match tls {
        None => Ok(Box::new(sock)),
        Some(t) => match tokio::time::timeout(HANDSHAKE_TIMEOUT, t.acceptor.accept(sock)).await {
            Ok(s) => Ok(Box::new(s?)),
            Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out")),
        },
    }
}

/// The client side of a new connection: TLS when configured.
pub async fn connect(tls: Option<&ClusterTls>, sock: TcpStream) -> std::io::Result<Stream> {
    let _ = sock.set_nodelay(true);
    match tls {
        None => Ok(Box::new(sock)),
        Some(t) => {
            let name = ServerName::try_from(CLUSTER_NAME).expect("a valid DNS name");
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, t.connector.connect(name, sock)).await {
                Ok(s) => Ok(Box::new(s?)),
                Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out")),
            }
        }
    }
}
