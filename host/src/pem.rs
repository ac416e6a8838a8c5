//! Certificates from PEM files the operator of Weir (or a job's author) names: the API's
//! `[tls]`, the CLI's `--ca-cert`, a PostgreSQL sink's `ca_cert`. One reader, so every place
//! refuses an empty or unreadable file the same way.

use std::path::Path;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// The certificates in the PEM file `path`, at least one; else why not (without the path,
/// which the caller names with the setting it came from).
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| e.to_string())?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    if certs.is_empty() {
        return Err("no CERTIFICATE block in the file".into());
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_certificates_and_refuses_empty_or_missing_files() {
        let d = tempfile::tempdir().unwrap();
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let p = d.path().join("two.pem");
        std::fs::write(&p, format!("{}{}", cert.cert.pem(), cert.cert.pem())).unwrap();
        assert_eq!(certificates(&p).unwrap().len(), 2);
        std::fs::write(&p, "").unwrap();
        assert!(certificates(&p).unwrap_err().contains("no CERTIFICATE"));
        assert!(certificates(&d.path().join("missing.pem")).is_err());
    }
}
