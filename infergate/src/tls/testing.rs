//! Certificates made for the unit tests (rcgen).

use std::path::PathBuf;

/// A self-signed certificate for `name` (its common name too) and its key, both PEM.
pub fn self_signed(name: &str) -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut p = rcgen::CertificateParams::new(vec![name.to_string()]).expect("params");
    p.distinguished_name.push(rcgen::DnType::CommonName, name);
    let cert = p.self_signed(&key).expect("certificate");
    (cert.pem(), key.serialize_pem())
}

/// Write `cert` and `key` to fresh temporary files; returns their paths.
pub fn write_pem(tag: &str, cert: &str, key: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir();
    let id = std::process::id();
    let c = dir.join(format!("infergate-tls-{id}-{tag}-cert.pem"));
    let k = dir.join(format!("infergate-tls-{id}-{tag}-key.pem"));
    std::fs::write(&c, cert).unwrap();
    std::fs::write(&k, key).unwrap();
    (c, k)
}
