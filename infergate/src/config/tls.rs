//! `tls` (top level): the `listen` addresses speak HTTPS with this certificate and key, read and checked when the
//! file is loaded (and again on every reload, which is how a renewed certificate is taken).

use std::path::PathBuf;

use serde_norway::Value;

use super::access_log::file_path;
use super::walk::read_keys;
use super::walk::{Field, Node};
use super::ConfigError;
use crate::tls::{load_cert, CertInfo, LoadedCert};

/// TLS on the client listeners (absent from the file: plain HTTP).
#[derive(Clone)]
pub struct TlsConfig {
    /// PEM certificate chain, the server's certificate first (absolute path).
    pub cert_file: PathBuf,
    /// PEM private key of that certificate (absolute path).
    pub key_file: PathBuf,
    /// The chain and key as read when the file was loaded; `certificate` shows what of it may be shown.
    pub loaded: LoadedCert,
    /// The leaf's fingerprint, subject and expiry (its `Debug` is the short fingerprint, so a reload reports a
    /// renewed certificate as a change).
    pub certificate: CertInfo,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("TlsConfig")
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("certificate", &self.certificate)
            .finish()
    }
}

impl TlsConfig {
    /// `tls`: absent or null = plain HTTP; otherwise a mapping with `cert_file` and `key_file`.
    pub(super) fn read_optional(f: &Field<'_>) -> Result<Option<TlsConfig>, ConfigError> {
        match f.value() {
            None | Some(Value::Null) => Ok(None),
            Some(_) => TlsConfig::read(f.section()?).map(Some),
        }
    }

    pub(super) fn read(n: Node<'_>) -> Result<TlsConfig, ConfigError> {
        read_keys!(n; cert_file, key_file);
        cert_file.required()?;
        key_file.required()?;
        let cert_path = file_path(&cert_file, cert_file.string()?.trim())?;
        let key_path = file_path(&key_file, key_file.string()?.trim())?;
        // Each file's own errors name its key; a key that is not the certificate's is the key file's fault.
        crate::tls::read_certs(&cert_path).map_err(|r| cert_file.err(r))?;
        crate::tls::read_key(&key_path).map_err(|r| key_file.err(r))?;
        let loaded = load_cert(&cert_path, &key_path).map_err(|r| key_file.err(r))?;
        Ok(TlsConfig {
            cert_file: cert_path,
            key_file: key_path,
            certificate: loaded.info.clone(),
            loaded,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::config::testing::*;
    use crate::tls::testing::{self_signed, write_pem};

    #[test]
    fn off_by_default_and_loaded_when_set() {
        assert!(parse(POOL).unwrap().tls.is_none());
        assert!(parse(&format!("tls:\n{POOL}")).unwrap().tls.is_none());
        let (cert, key) = self_signed("router.test");
        let (c, k) = write_pem("cfg-ok", &cert, &key);
        let t = parse(&format!(
            "tls: {{ cert_file: {}, key_file: {} }}\n{POOL}",
            c.display(),
            k.display()
        ))
        .unwrap()
        .tls
        .unwrap();
        assert_eq!(t.cert_file, c);
        assert!(t.certificate.subject.contains("router.test"), "{t:?}");
        let shown = format!("{t:?}");
        assert!(!shown.contains("PRIVATE"), "{shown}");
        assert!(shown.contains("sha256:"), "{shown}");
    }

    #[test]
    fn bad_files_name_their_key_and_the_file() {
        let (cert, key) = self_signed("router.test");
        let (other_cert, other_key) = self_signed("other.test");
        let (c, k) = write_pem("cfg-a", &cert, &key);
        let (_, k2) = write_pem("cfg-b", &other_cert, &other_key);
        let yaml = |c: &str, k: &str| format!("tls: {{ cert_file: {c}, key_file: {k} }}\n{POOL}");
        let (cs, ks, k2s) = (
            c.display().to_string(),
            k.display().to_string(),
            k2.display().to_string(),
        );
        assert_err(
            &format!("tls: {{ cert_file: {cs} }}\n{POOL}"),
            "tls.key_file",
            &["required key is missing"],
        );
        assert_err(
            &yaml("/nonexistent/cert.pem", &ks),
            "tls.cert_file",
            &["cannot read `/nonexistent/cert.pem`"],
        );
        // The key file given as the certificate: no certificate in it.
        assert_err(&yaml(&ks, &ks), "tls.cert_file", &[&ks, "no certificate"]);
        assert_err(&yaml(&cs, &cs), "tls.key_file", &[&cs, "no private key"]);
        let garbage = temp_file(
            "tls-garbage.pem",
            "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        );
        assert_err(
            &yaml(&garbage.display().to_string(), &ks),
            "tls.cert_file",
            &["not valid PEM"],
        );
        assert_err(
            &yaml(&cs, &k2s),
            "tls.key_file",
            &["does not belong to the first certificate", &k2s, &cs],
        );
        assert_err(
            &format!("tls: {{ cert_file: {cs}, key_file: {ks}, ca: x }}\n{POOL}"),
            "tls.ca",
            &["unknown key"],
        );
        let _ = std::fs::remove_file(garbage);
    }
}
