//! TLS for the API (`[tls]` in `server.toml`): a certificate chain and its private key, in PEM
//! files the server's operator provides, turned into a rustls server configuration.
//!
//! Invariant: a server configured for TLS speaks only TLS (1.2 and 1.3, rustls' safe defaults
//! with the ring provider) on its port; a file that is missing, empty or does not match its key
//! stops the server at start with the file named, never at the first connection.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject;
use serde::Deserialize;

/// `[tls]`: where the certificate chain and its key are.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// PEM file: the server's certificate first, then its intermediates.
    pub cert: PathBuf,
    /// PEM file: the certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or parsed as PEM.
    #[error("[tls] {what} {path}: {message}")]
    File {
        /// `cert` or `key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The certificate and the key do not make a configuration (e.g. they do not match).
    #[error("[tls] {cert} with key {key}: {message}; check that the key belongs to the certificate")]
    Config {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls' reason.
        message: String,
    },
}

impl TlsFiles {
    /// The rustls server configuration for these files (HTTP/1.1 by ALPN).
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let certs = crate::pem::certificates(&self.cert).map_err(|message| TlsError::File {
            what: "cert",
            path: self.cert.clone(),
            message,
        })?;
        let key = PrivateKeyDer::from_pem_file(&self.key).map_err(|e| TlsError::File {
            what: "key",
            path: self.key.clone(),
            message: e.to_string(),
        })?;
        let config_error =
            |message: String| TlsError::Config { cert: self.cert.clone(), key: self.key.clone(), message };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| config_error(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| config_error(e.to_string()))?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }

    /// The paths made absolute against `dir` (the directory of `server.toml`).
    pub fn relative_to(mut self, dir: &Path) -> Self {
        if self.cert.is_relative() {
            self.cert = dir.join(&self.cert);
        }
        if self.key.is_relative() {
            self.key = dir.join(&self.key);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn a_matching_pair_configures_and_bad_files_are_named() {
        let d = tempfile::tempdir().unwrap();
        let a = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let b = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let cert = write(d.path(), "cert.pem", &a.cert.pem());
        let key = write(d.path(), "key.pem", &a.signing_key.serialize_pem());
        let other_key = write(d.path(), "other.pem", &b.signing_key.serialize_pem());
        let empty = write(d.path(), "empty.pem", "");

        let cfg = TlsFiles { cert: cert.clone(), key: key.clone() }.server_config().unwrap();
        assert_eq!(cfg.alpn_protocols, vec![b"http/1.1".to_vec()]);

        let e = TlsFiles { cert: cert.clone(), key: other_key }.server_config().unwrap_err().to_string();
        assert!(e.contains("cert.pem") && e.contains("other.pem") && e.contains("belongs"), "{e}");
        let e = TlsFiles { cert: empty.clone(), key: key.clone() }.server_config().unwrap_err().to_string();
        assert!(e.contains("cert") && e.contains("empty.pem") && e.contains("no CERTIFICATE"), "{e}");
        let e = TlsFiles { cert: cert.clone(), key: empty }.server_config().unwrap_err().to_string();
        assert!(e.contains("key") && e.contains("empty.pem"), "{e}");
        let e = TlsFiles { cert: d.path().join("missing.pem"), key }.server_config().unwrap_err().to_string();
        assert!(e.contains("missing.pem"), "{e}");
    }

    #[test]
    fn relative_paths_are_resolved_against_the_config_directory() {
        let f =
            TlsFiles { cert: "tls/cert.pem".into(), key: "/abs/key.pem".into() }.relative_to(Path::new("/etc/weir"));
        assert_eq!(f.cert, Path::new("/etc/weir/tls/cert.pem"));
        assert_eq!(f.key, Path::new("/abs/key.pem"));
    }
}
