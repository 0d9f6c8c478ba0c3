//! Certificates the TLS tests make for themselves (rcgen): a test CA, certificates it issues, their PEM files, and a
//! rustls client that trusts the CA.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

/// A certificate authority made for one test.
pub struct TestCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A certificate (PEM) and its private key (PEM).
pub struct Issued {
    pub cert: String,
    pub key: String,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let key = KeyPair::generate().expect("CA key");
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = p.self_signed(&key).expect("CA certificate");
        TestCa { cert, key }
    }

    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A server certificate for `names` (DNS names or IP addresses), with `cn` as its common name.
    pub fn issue(&self, cn: &str, names: &[&str]) -> Issued {
        let key = KeyPair::generate().expect("key");
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut p = CertificateParams::new(names).expect("params");
        p.distinguished_name.push(DnType::CommonName, cn);
        let cert = p
            .signed_by(&key, &self.cert, &self.key)
            .expect("certificate");
        Issued {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// A fresh directory for one test's files.
pub fn tls_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "infergate-it-tls-{}-{tag}-{}",
        std::process::id(),
        fastrand_suffix()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn fastrand_suffix() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Write `text` to `dir/name`; returns the path.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// A rustls client configuration trusting only `ca_pem`, offering `http/1.1`.
pub fn client_trusting(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(cfg)
}

/// The common name of a DER certificate's subject.
pub fn common_name(der: &[u8]) -> String {
    let (_, c) = x509_parser::parse_x509_certificate(der).expect("peer certificate parses");
    let cn = c
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_string();
    cn
}
