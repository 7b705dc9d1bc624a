//! TLS for the HTTP-style listeners (the scheduler's admin API, the agent's TCP API):
//! a rustls acceptor from the same PEM files the gRPC services take.

use std::path::Path;
use std::sync::Arc;

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A certificate or key that cannot serve TLS, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("TLS: {0}")]
pub struct TlsSetupError(pub String);

/// A TLS acceptor from a PEM certificate chain and its private key.
pub fn acceptor(cert: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor, TlsSetupError> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsSetupError(format!("read the certificate {}: {e}", cert.display())))?;
    if chain.is_empty() {
        return Err(TlsSetupError(format!(
            "{} holds no certificate",
            cert.display()
        )));
    }
    let private = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| TlsSetupError(format!("read the private key {}: {e}", key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsSetupError(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| TlsSetupError(format!("{} and {}: {e}", cert.display(), key.display())))?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}
