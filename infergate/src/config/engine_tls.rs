//! A pool's `tls`: how the router checks the certificates of its `https://` engines (the CA file that issued them,
//! the name they carry), set on each https endpoint of the pool.

use std::path::PathBuf;
use std::sync::Arc;

use pingora_core::protocols::tls::CaType;
use pingora_core::utils::tls::{parse_x509, WrappedX509};
use rustls::RootCertStore;
use serde_norway::Value;

use super::access_log::file_path;
use super::pool::EndpointConfig;
use super::walk::{read_keys, Field};
use super::ConfigError;

/// How the router speaks TLS to one `https://` endpoint.
#[derive(Clone)]
pub struct EngineTls {
    /// Sent as SNI and checked against the engine's certificate: the pool's `tls.server_name`, else the URL's host
    /// (an IP address is checked against the certificate's IP addresses and not sent).
    pub server_name: String,
    /// The pool's `tls.ca_file` (None: the system's CA certificates, or Pingora's `server.ca_file`).
    pub ca_file: Option<PathBuf>,
    /// Its certificates, as Pingora takes them per peer.
    pub ca: Option<Arc<CaType>>,
    /// The same certificates as the trust store of the router's own requests (scrapes, prefill legs): read with
    /// the configuration, so a file renamed or half-written afterwards changes nothing until the next reload.
    pub roots: Option<Arc<RootCertStore>>,
    /// SHA-256 of the CA certificates (a reload compares it).
    ca_sha256: String,
}

impl std::fmt::Debug for EngineTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineTls")
            .field("server_name", &self.server_name)
            .field("ca_file", &self.ca_file)
            .field("ca_sha256", &self.ca_sha256)
            .finish()
    }
}

impl PartialEq for EngineTls {
    fn eq(&self, other: &EngineTls) -> bool {
        (&self.server_name, &self.ca_file, &self.ca_sha256)
            == (&other.server_name, &other.ca_file, &other.ca_sha256)
    }
}

impl EngineTls {
    /// TLS to an endpoint whose URL host is `host` (as written, IPv6 in brackets), checked against the system's CAs.
    pub(super) fn for_host(host: &str) -> EngineTls {
        EngineTls {
            server_name: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            ca_file: None,
            ca: None,
            roots: None,
            ca_sha256: String::new(),
        }
    }

    /// Checked against `server_name` and the CA certificates in the file at `ca_file` (which must be readable).
    #[cfg(test)]
    pub(crate) fn for_tests(server_name: &str, ca_file: &std::path::Path) -> EngineTls {
        let roots = crate::tls::read_ca(ca_file).expect("a test CA file");
        EngineTls {
            ca_file: Some(ca_file.to_path_buf()),
            roots: Some(Arc::new(roots)),
            ..EngineTls::for_host(server_name)
        }
    }

    /// Checked against `server_name` and the system's CA certificates.
    #[cfg(test)]
    pub(crate) fn for_tests_system(server_name: &str) -> EngineTls {
        EngineTls::for_host(server_name)
    }
}

/// A pool's `tls` (`f`): absent = the defaults of [`EngineTls::for_host`]; otherwise `ca_file` and `server_name`
/// for every https endpoint in `endpoints`, of which there must be one.
pub(super) fn engine_tls(
    f: &Field<'_>,
    endpoints: &mut [EndpointConfig],
) -> Result<(), ConfigError> {
    let n = match f.value() {
        None | Some(Value::Null) => return Ok(()),
        Some(_) => f.section()?,
    };
    read_keys!(n; ca_file, server_name);
    if !endpoints.iter().any(|e| e.tls.is_some()) {
        return Err(f.err("applies to `https://` endpoints, and this pool has none"));
    }
    let name = match server_name.value() {
        None | Some(Value::Null) => None,
        Some(_) => {
            let s = server_name.string()?.trim();
            if rustls::pki_types::ServerName::try_from(s).is_err() {
                return Err(server_name.err(format!(
                    "`{s}` is not a DNS name or an IP address (the name in the engines' certificates)"
                )));
            }
            Some(s.to_string())
        }
    };
    let (ca_path, ca, roots, sha) = match ca_file.value() {
        None | Some(Value::Null) => (None, None, None, String::new()),
        Some(_) => {
            let path = file_path(&ca_file, ca_file.string()?.trim())?;
            // Read once: Pingora's per-peer certificates and the side clients' trust store come from one read.
            let certs = crate::tls::read_certs(&path).map_err(|r| ca_file.err(r))?;
            let roots = crate::tls::ca_store(&path, certs.clone()).map_err(|r| ca_file.err(r))?;
            let mut all = Vec::new();
            let wrapped: Vec<WrappedX509> = certs
                .into_iter()
                .map(|c| {
                    all.extend_from_slice(&c);
                    WrappedX509::new(c.to_vec(), parse_x509)
                })
                .collect();
            let sha = ring::digest::digest(&ring::digest::SHA256, &all);
            let sha = sha.as_ref().iter().map(|b| format!("{b:02x}")).collect();
            (
                Some(path),
                Some(Arc::<CaType>::from(wrapped)),
                Some(Arc::new(roots)),
                sha,
            )
        }
    };
    for tls in endpoints.iter_mut().filter_map(|e| e.tls.as_mut()) {
        if let Some(name) = &name {
            tls.server_name.clone_from(name);
        }
        tls.ca_file.clone_from(&ca_path);
        tls.ca.clone_from(&ca);
        tls.roots.clone_from(&roots);
        tls.ca_sha256.clone_from(&sha);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config::testing::*;
    use crate::tls::testing::{self_signed, write_pem};

    fn pool(eps: &str, extra: &str) -> String {
        format!("pools:\n  - name: a\n    endpoints: [{eps}]\n{extra}")
    }

    #[test]
    fn https_endpoints_default_to_port_443_their_host_and_the_system_cas() {
        let c = parse(&pool("\"https://127.0.0.1\", \"http://127.0.0.1:81\"", "")).unwrap();
        let eps = &c.pools[0].endpoints;
        assert_eq!(eps[0].label, "127.0.0.1:443");
        let tls = eps[0].tls.as_ref().unwrap();
        assert_eq!(tls.server_name, "127.0.0.1");
        assert!(tls.ca.is_none() && tls.ca_file.is_none());
        assert!(eps[1].tls.is_none());
        let v6 = parse(&pool("\"https://[::1]:8443\"", "")).unwrap();
        assert_eq!(
            v6.pools[0].endpoints[0].tls.as_ref().unwrap().server_name,
            "::1"
        );
    }

    #[test]
    fn the_pool_ca_and_name_apply_to_its_https_endpoints() {
        let (cert, key) = self_signed("ca.test");
        let (ca, _) = write_pem("engine-ca", &cert, &key);
        let c = parse(&pool(
            "\"https://127.0.0.1:8443\", \"http://127.0.0.1:81\"",
            &format!(
                "    tls: {{ ca_file: {}, server_name: vllm.internal }}\n",
                ca.display()
            ),
        ))
        .unwrap();
        let tls = c.pools[0].endpoints[0].tls.as_ref().unwrap();
        assert_eq!(tls.server_name, "vllm.internal");
        assert_eq!(tls.ca.as_ref().map(|c| c.len()), Some(1));
        assert_eq!(tls.ca_file.as_deref(), Some(ca.as_path()));
        assert!(format!("{tls:?}").contains("ca_sha256"));
        assert!(c.pools[0].endpoints[1].tls.is_none());
    }

    #[test]
    fn bad_settings_name_their_key() {
        let (cert, key) = self_signed("ca.test");
        let (ca, k) = write_pem("engine-ca-bad", &cert, &key);
        assert_err(
            &pool(
                "\"http://127.0.0.1:81\"",
                "    tls: { server_name: x.internal }\n",
            ),
            "pools[0].tls",
            &["applies to `https://` endpoints"],
        );
        assert_err(
            &pool(
                "\"https://127.0.0.1\"",
                &format!("    tls: {{ ca_file: {} }}\n", k.display()),
            ),
            "pools[0].tls.ca_file",
            &["no certificate"],
        );
        assert_err(
            &pool(
                "\"https://127.0.0.1\"",
                "    tls: { ca_file: /nonexistent/ca.pem }\n",
            ),
            "pools[0].tls.ca_file",
            &["cannot read `/nonexistent/ca.pem`"],
        );
        assert_err(
            &pool(
                "\"https://127.0.0.1\"",
                "    tls: { server_name: \"a b\" }\n",
            ),
            "pools[0].tls.server_name",
            &["not a DNS name"],
        );
        assert_err(
            &pool(
                "\"https://127.0.0.1\"",
                &format!("    tls: {{ ca_file: {}, verify: false }}\n", ca.display()),
            ),
            "pools[0].tls.verify",
            &["unknown key"],
        );
    }

    #[test]
    fn https_endpoints_may_have_engine_stats() {
        let c = parse(&pool(
            "\"https://127.0.0.1:8443\"",
            "    engine_stats: { interval: 1s }\n",
        ))
        .unwrap();
        assert!(c.pools[0].engine_stats.is_some());
        assert!(c.pools[0].endpoints[0].tls.is_some());
    }
}
