//! A pool's `disaggregation`: prefill engines apart from the decode engines (the pool's own `endpoints`), and the
//! protocol the router speaks between the two legs (`connector`).
//!
//! The prefill set is read with a pool's keys (endpoints, policy, sessions, prefix, health_check, ...) and becomes
//! a pool of its own named `NAME/prefill` in `Config::pools`, after every configured pool: health checks, engine
//! stats, metrics, the status page, reload and the state file treat it as any pool. It serves no model; only the
//! prefill legs of its pool reach it.

use serde_norway::Value;

use super::walk::{read_keys, Field, Node};
use super::{ConfigError, PoolConfig};

/// How the two legs hand over the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connector {
    /// vLLM's `kv_transfer_params` round trip (NixlConnector; MooncakeConnector and MoRIIOConnector speak it too):
    /// the prefill leg asks `do_remote_decode`, its answer's `kv_transfer_params` go with the decode leg.
    Nixl,
}

impl Connector {
    pub fn as_str(self) -> &'static str {
        match self {
            Connector::Nixl => "nixl",
        }
    }
}

/// What a disaggregated pool (its endpoints are the decode engines) knows of its prefill set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disaggregation {
    pub connector: Connector,
    /// The name of the prefill set's pool in `Config::pools` (`prefill_set_name`).
    pub prefill_pool: String,
}

/// The pool name the prefill set of pool `pool` runs under (metrics, status page, reload messages).
pub fn prefill_set_name(pool: &str) -> String {
    format!("{pool}/prefill")
}

/// Keys of a pool that belong to the pool as a whole, not to its prefill set.
const POOL_ONLY: [&str; 5] = [
    "name",
    "models",
    "tokenizer",
    "expose_paths",
    "disaggregation",
];

impl Disaggregation {
    /// The `disaggregation` section of pool `pool`: None when absent; else the settings and the prefill set.
    pub(super) fn read(
        f: &Field<'_>,
        pool: &str,
    ) -> Result<Option<(Disaggregation, PoolConfig)>, ConfigError> {
        let Some(n) = f.optional_section()? else {
            return Ok(None);
        };
        let (d, prefill) = Self::read_section(n, pool)?;
        Ok(Some((d, prefill)))
    }

    pub(super) fn read_section(
        n: Node<'_>,
        pool: &str,
    ) -> Result<(Disaggregation, PoolConfig), ConfigError> {
        read_keys!(n; connector, prefill);
        let connector = match connector.value() {
            None => return Err(connector.err("required key is missing (the only protocol: `nixl`)")),
            Some(Value::String(s)) if s.trim() == "nixl" => Connector::Nixl,
            Some(Value::String(s)) => {
                return Err(connector.err(format!(
                    "unknown connector `{}`; the router speaks `nixl` (vLLM's kv_transfer_params round trip: \
                     NixlConnector, MooncakeConnector)",
                    s.trim()
                )))
            }
            Some(other) => return Err(connector.type_err("a string", other)),
        };
        if prefill.value().is_none() {
            return Err(
                prefill.err("required key is missing (the prefill engines: `endpoints`, ...)")
            );
        }
        let set = prefill.section()?;
        for key in POOL_ONLY {
            if let Some(Value::Mapping(m)) = prefill.value() {
                if m.contains_key(key) {
                    return Err(prefill.err_in(
                        key,
                        "belongs to the pool, not to its prefill set (the prefill set serves the pool's models)",
                    ));
                }
            }
        }
        let mut cfg = PoolConfig::read_set(set, prefill_set_name(pool))?;
        cfg.prefill_of = Some(pool.to_string());
        let d = Disaggregation {
            connector,
            prefill_pool: cfg.name.clone(),
        };
        Ok((d, cfg))
    }
}

/// No engine in both sets: each set's ledger, health and series must be the whole truth of its engines.
pub(super) fn check_apart(
    f: &Field<'_>,
    decode: &[super::EndpointConfig],
    set: &PoolConfig,
    pool: &str,
) -> Result<(), ConfigError> {
    for (i, ep) in set.endpoints.iter().enumerate() {
        if decode
            .iter()
            .any(|d| d.label.eq_ignore_ascii_case(&ep.label))
        {
            return Err(f.err_in(
                &format!("prefill.endpoints[{i}].url"),
                format!(
                    "`{}` is also a decode endpoint of pool `{pool}`; an engine serves one of the two sets",
                    ep.label
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config::testing::*;

    const DISAGG: &str = "pools:\n  - name: a\n    models: [m]\n    endpoints: [\"http://127.0.0.1:8201\"]\n    \
                          disaggregation:\n      connector: nixl\n      prefill:\n        endpoints: \
                          [\"http://127.0.0.1:8101\", \"http://127.0.0.1:8102\"]\n";

    #[test]
    fn the_prefill_set_is_a_pool_of_its_own_that_serves_no_model() {
        let c = parse(DISAGG).unwrap();
        assert_eq!(c.pools.len(), 2);
        let (decode, prefill) = (&c.pools[0], &c.pools[1]);
        let d = decode.disaggregation.as_ref().unwrap();
        assert_eq!(d.connector.as_str(), "nixl");
        assert_eq!(d.prefill_pool, "a/prefill");
        assert_eq!(prefill.name, "a/prefill");
        assert_eq!(prefill.prefill_of.as_deref(), Some("a"));
        assert!(prefill.models.is_empty());
        assert_eq!(prefill.endpoints.len(), 2);
        assert_eq!(decode.endpoints.len(), 1);
        assert_eq!(c.pool_for_model(Some("m")), Some(0));
        // A model-less request still finds the one pool a client can name.
        assert_eq!(c.pool_for_model(None), Some(0));
        assert_eq!(c.pool_for_model(Some("other")), None);
    }

    #[test]
    fn each_set_has_its_own_policy_and_checks() {
        let text = format!(
            "{DISAGG}        policy: predicted_ttft\n        sessions: {{}}\n        health_check: {{interval: 5s}}\n    \
             policy: load_aware\n"
        );
        let c = parse(&text).unwrap();
        assert_eq!(c.pools[0].policy.kind().as_str(), "load_aware");
        assert_eq!(c.pools[1].policy.kind().as_str(), "predicted_ttft");
        assert!(c.pools[1].policy.sessions().is_some());
        assert_eq!(
            c.pools[1].health_check.interval,
            std::time::Duration::from_secs(5)
        );
        assert_eq!(
            c.pools[0].health_check.interval,
            std::time::Duration::from_secs(2)
        );
    }

    #[test]
    fn prefill_engines_may_be_https_checked_as_the_set_tls_says() {
        let text = "pools:\n  - name: a\n    models: [m]\n    endpoints: [\"http://127.0.0.1:8201\"]\n    \
                    disaggregation:\n      connector: nixl\n      prefill:\n        endpoints: \
                    [\"https://127.0.0.1:8101\", \"http://127.0.0.1:8102\"]\n        \
                    tls: { server_name: prefill.internal }\n";
        let c = parse(text).unwrap();
        let set = &c.pools[1];
        assert_eq!(set.name, "a/prefill");
        let tls = set.endpoints[0].tls.as_ref().expect("https:// is TLS");
        assert_eq!(tls.server_name, "prefill.internal");
        assert!(set.endpoints[1].tls.is_none());
        assert!(c.pools[0].endpoints[0].tls.is_none());
        // The set's `tls` is its own: an https:// prefill engine without it is checked against its URL's host.
        let c = parse(&DISAGG.replace("http://127.0.0.1:8101", "https://127.0.0.1:8101")).unwrap();
        let tls = c.pools[1].endpoints[0].tls.as_ref().unwrap();
        assert_eq!(tls.server_name, "127.0.0.1");
    }

    #[test]
    fn errors_name_the_key() {
        let pool = "pools:\n  - name: a\n    endpoints: [\"http://127.0.0.1:8201\"]\n    disaggregation:\n";
        assert_err(
            &format!("{pool}      prefill: {{endpoints: [\"http://127.0.0.1:1\"]}}\n"),
            "pools[0].disaggregation.connector",
            &["required key is missing", "nixl"],
        );
        assert_err(
            &format!("{pool}      connector: p2p_nccl\n      prefill: {{endpoints: [\"http://127.0.0.1:1\"]}}\n"),
            "pools[0].disaggregation.connector",
            &["unknown connector `p2p_nccl`"],
        );
        assert_err(
            &format!("{pool}      connector: nixl\n"),
            "pools[0].disaggregation.prefill",
            &["required key is missing"],
        );
        assert_err(
            &format!("{pool}      connector: nixl\n      prefill: {{}}\n"),
            "pools[0].disaggregation.prefill.endpoints",
            &["at least one endpoint is required"],
        );
        assert_err(
            &format!("{pool}      connector: nixl\n      prefill: {{endpoints: [\"http://127.0.0.1:1\"], models: [x]}}\n"),
            "pools[0].disaggregation.prefill.models",
            &["belongs to the pool, not to its prefill set"],
        );
        assert_err(
            &format!("{pool}      connector: nixl\n      prefill: {{endpoints: [\"http://127.0.0.1:1\"], polcy: x}}\n"),
            "pools[0].disaggregation.prefill.polcy",
            &["did you mean `policy`?"],
        );
        assert_err(
            &format!("{pool}      connector: nixl\n      prefill: {{endpoints: [\"http://127.0.0.1:8201\"]}}\n"),
            "pools[0].disaggregation.prefill.endpoints[0].url",
            &["`127.0.0.1:8201` is also a decode endpoint of pool `a`"],
        );
        assert_err(
            "pools:\n  - name: a/prefill\n    models: [x]\n    endpoints: [\"http://127.0.0.1:9\"]\n  - name: a\n    models: [m]\n    \
             endpoints: [\"http://127.0.0.1:8201\"]\n    disaggregation:\n      connector: nixl\n      prefill: {endpoints: [\"http://127.0.0.1:1\"]}\n",
            "pools[1].disaggregation.prefill",
            &["pool `a/prefill` (pools[0]) already has the name of this prefill set"],
        );
    }
}
