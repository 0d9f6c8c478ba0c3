//! TLS material read from PEM files (a certificate chain with its key, CA bundles), each failure naming the file
//! and the reason, and the client listener's certificate, swapped in place on reload ([`ServerCert`]).
//!
//! rustls with the ring provider, as Pingora's `rustls` feature builds it: no OpenSSL in the binary.

use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;

#[cfg(test)]
pub mod testing;
#[cfg(test)]
mod tests;

/// The process's rustls provider (ring), installed once; Pingora and the Redis client use the same.
pub fn provider() -> Arc<CryptoProvider> {
    let _ = CryptoProvider::install_default(rustls::crypto::ring::default_provider());
    CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read `{}`: {e}", path.display()))
}

/// Every certificate in the PEM file at `path`, in order; an error when there is none or one is malformed.
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    parse_certs(path, &read(path)?)
}

/// Every certificate in `pem`, the contents of the file at `path` (named in an error), as [`read_certs`] checks
/// them.
pub fn parse_certs(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("`{}` is not valid PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "`{}` holds no certificate (expected PEM `-----BEGIN CERTIFICATE-----` blocks)",
            path.display()
        ));
    }
    for (i, c) in certs.iter().enumerate() {
        if let Err(e) = x509_parser::parse_x509_certificate(c) {
            return Err(format!(
                "`{}`: certificate {} cannot be parsed: {e}",
                path.display(),
                i + 1
            ));
        }
    }
    Ok(certs)
}

/// The private key in the PEM file at `path` (PKCS#8, PKCS#1 or SEC1).
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    parse_key(path, &read(path)?)
}

/// The private key in `pem`, the contents of the file at `path` (named in an error).
pub fn parse_key(path: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => format!(
            "`{}` holds no private key (expected a PEM `-----BEGIN PRIVATE KEY-----` block)",
            path.display()
        ),
        e => format!("`{}` is not valid PEM: {e}", path.display()),
    })
}

/// A trust store of the CA certificates in the PEM file at `path`.
pub fn read_ca(path: &Path) -> Result<RootCertStore, String> {
    ca_store(path, read_certs(path)?)
}

/// A trust store of `certs`, read from `path` (named in an error): each must be usable as a CA certificate.
pub fn ca_store(path: &Path, certs: Vec<CertificateDer<'static>>) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    for (i, c) in certs.into_iter().enumerate() {
        store.add(c).map_err(|e| {
            format!(
                "`{}`: certificate {} is not a usable CA certificate: {e}",
                path.display(),
                i + 1
            )
        })?;
    }
    Ok(store)
}

/// A certificate chain and its private key, loaded and checked to belong together.
#[derive(Clone)]
pub struct LoadedCert {
    pub key: Arc<CertifiedKey>,
    pub info: CertInfo,
}

impl std::fmt::Debug for LoadedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        write!(f, "LoadedCert({:?})", self.info)
    }
}

/// What is shown of a certificate: enough to tell a rotation happened, never the key.
#[derive(Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// SHA-256 of the leaf certificate, hex (as `openssl x509 -fingerprint -sha256` shows it, without colons).
    pub sha256: String,
    /// The leaf's subject, e.g. `CN=router.example.com`.
    pub subject: String,
    /// The leaf's `notAfter`, Unix seconds.
    pub not_after: i64,
}

impl std::fmt::Debug for CertInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Short enough for a reload message (`old → new`).
        write!(f, "sha256:{}", &self.sha256[..16.min(self.sha256.len())])
    }
}

impl std::fmt::Display for CertInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let expires = x509_parser::time::ASN1Time::from_timestamp(self.not_after)
            .map_or_else(|_| self.not_after.to_string(), |t| t.to_string());
        write!(
            f,
            "`{}` (sha256 {}, expires {expires})",
            self.subject, self.sha256
        )
    }
}

/// How long before its expiry a certificate is warned about at start and on reload.
const EXPIRY_WARNING: i64 = 14 * 86_400;

impl CertInfo {
    /// A warning when the certificate has expired, or expires within 14 days, at `now` (Unix seconds).
    pub fn expiry_warning(&self, now: i64) -> Option<String> {
        let left = self.not_after - now;
        if left <= 0 {
            Some(format!(
                "the certificate {self} has expired: clients will refuse it"
            ))
        } else if left < EXPIRY_WARNING {
            Some(format!(
                "the certificate {self} expires in {} hours: renew it and send SIGHUP",
                left / 3600
            ))
        } else {
            None
        }
    }
}

/// The leaf's fingerprint, subject and expiry (`der` was parsed by [`read_certs`]).
fn cert_info(der: &CertificateDer<'_>) -> CertInfo {
    let digest = ring::digest::digest(&ring::digest::SHA256, der);
    let sha256 = digest.as_ref().iter().map(|b| format!("{b:02X}")).collect();
    let (subject, not_after) = match x509_parser::parse_x509_certificate(der) {
        Ok((_, c)) => (c.subject().to_string(), c.validity().not_after.timestamp()),
        Err(_) => (String::new(), 0),
    };
    CertInfo {
        sha256,
        subject,
        not_after,
    }
}

/// Load the chain in `cert_file` and the key in `key_file`; the key must be the leaf certificate's.
pub fn load_cert(cert_file: &Path, key_file: &Path) -> Result<LoadedCert, String> {
    pair(
        cert_file,
        read_certs(cert_file)?,
        key_file,
        read_key(key_file)?,
    )
}

/// The chain `certs` (read from `cert_file`) with `key` (read from `key_file`); the key must be the leaf's.
pub fn pair(
    cert_file: &Path,
    certs: Vec<CertificateDer<'static>>,
    key_file: &Path,
    key: PrivateKeyDer<'static>,
) -> Result<LoadedCert, String> {
    let Some(leaf) = certs.first() else {
        return Err(format!("`{}` holds no certificate", cert_file.display()));
    };
    let info = cert_info(leaf);
    let key = CertifiedKey::from_der(certs, key, &provider()).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => format!(
            "the key in `{}` does not belong to the first certificate in `{}`",
            key_file.display(),
            cert_file.display()
        ),
        e => format!("`{}` is not a usable private key: {e}", key_file.display()),
    })?;
    Ok(LoadedCert {
        key: Arc::new(key),
        info,
    })
}

/// The client listener's certificate: every new handshake takes the one set last; connections already open keep
/// the one they began with.
pub struct ServerCert(ArcSwap<LoadedCert>);

impl std::fmt::Debug for ServerCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ServerCert({:?})", self.0.load().info)
    }
}

impl ServerCert {
    pub fn new(cert: &LoadedCert) -> Arc<ServerCert> {
        Arc::new(ServerCert(ArcSwap::from_pointee(cert.clone())))
    }

    /// Serve `cert` to new connections.
    pub fn set(&self, cert: &LoadedCert) {
        self.0.store(Arc::new(cert.clone()));
    }

    /// Whether `cert` (the same certificate, read again or not) is the one served now.
    pub fn serves(&self, cert: &LoadedCert) -> bool {
        self.0.load().info == cert.info
    }
}

impl ResolvesServerCert for ServerCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load().key.clone())
    }
}

/// The TLS settings of a client listener: TLS 1.2 and 1.3 (rustls offers nothing older), ALPN `http/1.1` (the
/// proxy serves HTTP/1.1), the certificate from `cert` at each handshake, handshakes on Pingora's offload threads
/// when `server` sets `downstream_tls_offload_threadpools`.
pub fn listener_settings(
    cert: &Arc<ServerCert>,
    server: &pingora_core::server::configuration::ServerConf,
) -> Result<pingora_core::listeners::tls::TlsSettings, String> {
    // `intermediate` only records the paths; the resolver set below takes their place.
    let mut settings = pingora_core::listeners::tls::TlsSettings::intermediate("", "")
        .map_err(|e| format!("TLS listener settings: {e}"))?;
    settings.set_cert_resolver(cert.clone());
    settings.set_alpn(pingora_core::protocols::ALPN::H1);
    settings.set_offload_threadpool_from_server_conf(server);
    Ok(settings)
}

/// Wall-clock seconds since the Unix epoch (for certificate expiry).
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}
