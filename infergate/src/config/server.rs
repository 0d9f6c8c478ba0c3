//! The `server` section: Pingora `ServerConf` fields, type-checked and checked by Pingora, with infergate's defaults.

use pingora::server::configuration::ServerConf;
use serde_norway::{Mapping, Value};

use super::walk::{Field, Node};
use super::{Config, ConfigError};

impl Config {
    /// The Pingora server configuration (`server_yaml`, validated when the file was loaded).
    pub fn server_conf(&self) -> ServerConf {
        ServerConf::from_yaml(&self.server_yaml)
            .expect("server_yaml was validated by Config::parse")
    }
}

/// The `server` section as YAML for `ServerConf::from_yaml`: each field type-checked, then checked by Pingora
/// alone (so its message names the field), then infergate's defaults added and the whole checked again.
pub(super) fn server_yaml(n: Node<'_>) -> Result<String, ConfigError> {
    let names: Vec<&'static str> = SERVER_FIELDS.iter().map(|(k, _)| *k).collect();
    n.accept(&names)?;
    let mut out = Mapping::new();
    for (k, v, f) in n.entries() {
        let field_kind = SERVER_FIELDS
            .iter()
            .find(|(name, _)| k.as_str() == Some(*name))
            .map(|(_, kind)| *kind)
            .unwrap_or(ServerKind::Other);
        server_value(&f, field_kind, v)?;
        let mut one = Mapping::new();
        one.insert(k.clone(), v.clone());
        let yaml = serde_norway::to_string(&Value::Mapping(one))
            .map_err(|e| f.err(format!("cannot re-encode: {e}")))?;
        if let Err(e) = ServerConf::from_yaml(&yaml) {
            return Err(f.err(format!("rejected by Pingora: {}", pingora_reason(&e))));
        }
        out.insert(k.clone(), v.clone());
    }
    for (name, default) in SERVER_DEFAULTS {
        if !out.contains_key(*name) {
            let v = match default {
                ServerDefault::Int(n) => Value::Number((*n).into()),
                ServerDefault::Str(s) => Value::String((*s).to_string()),
            };
            out.insert(Value::String((*name).to_string()), v);
        }
    }
    let yaml = serde_norway::to_string(&Value::Mapping(out))
        .map_err(|e| n.err(format!("cannot re-encode: {e}")))?;
    ServerConf::from_yaml(&yaml)
        .map_err(|e| n.err(format!("rejected by Pingora: {}", pingora_reason(&e))))?;
    Ok(yaml)
}

/// Type-checks one `server` field `f` (value `v`) as `field_kind`.
fn server_value(f: &Field<'_>, field_kind: ServerKind, v: &Value) -> Result<(), ConfigError> {
    match (field_kind, v) {
        (ServerKind::OptUint | ServerKind::OptNonZero | ServerKind::OptStr, Value::Null) => Ok(()),
        (ServerKind::Uint | ServerKind::OptUint, _) => f.uint().map(|_| ()),
        (ServerKind::OptNonZero | ServerKind::PosUint, _) => {
            if f.uint()? == 0 {
                return Err(f.err("must be at least 1"));
            }
            Ok(())
        }
        (ServerKind::Bool, Value::Bool(_)) => Ok(()),
        (ServerKind::Bool, other) => Err(f.type_err("true or false", other)),
        (ServerKind::Str | ServerKind::OptStr, _) => f.string().map(|_| ()),
        (ServerKind::StrList, Value::Sequence(seq)) => {
            for (i, item) in seq.iter().enumerate() {
                f.item(i, item).string()?;
            }
            Ok(())
        }
        (ServerKind::StrList, other) => Err(f.type_err("a list of strings", other)),
        (ServerKind::Other, _) => Ok(()),
    }
}

/// How a Pingora `ServerConf` field is type-checked before Pingora itself parses it.
#[derive(Clone, Copy)]
enum ServerKind {
    Uint,
    /// An integer of at least 1.
    PosUint,
    OptUint,
    OptNonZero,
    Bool,
    Str,
    OptStr,
    StrList,
    /// Checked by Pingora only.
    Other,
}

/// The fields of Pingora 0.9 `ServerConf` (without the `s2n` feature).
const SERVER_FIELDS: &[(&str, ServerKind)] = &[
    ("version", ServerKind::Uint),
    ("daemon", ServerKind::Bool),
    ("error_log", ServerKind::OptStr),
    ("pid_file", ServerKind::Str),
    ("upgrade_sock", ServerKind::Str),
    ("user", ServerKind::OptStr),
    ("group", ServerKind::OptStr),
    ("working_directory", ServerKind::OptStr),
    ("threads", ServerKind::PosUint),
    ("listener_tasks_per_fd", ServerKind::PosUint),
    ("work_stealing", ServerKind::Bool),
    ("runtime_enable_alt_timer", ServerKind::Bool),
    ("ca_file", ServerKind::OptStr),
    ("grace_period_seconds", ServerKind::OptUint),
    ("graceful_shutdown_timeout_seconds", ServerKind::OptUint),
    ("client_bind_to_ipv4", ServerKind::StrList),
    ("client_bind_to_ipv6", ServerKind::StrList),
    ("upstream_keepalive_pool_size", ServerKind::Uint),
    ("upstream_connect_offload_threadpools", ServerKind::OptUint),
    (
        "upstream_connect_offload_thread_per_pool",
        ServerKind::OptUint,
    ),
    ("downstream_tls_offload_threadpools", ServerKind::OptUint),
    (
        "downstream_tls_offload_thread_per_pool",
        ServerKind::OptUint,
    ),
    ("upstream_debug_ssl_keylog", ServerKind::Bool),
    ("max_retries", ServerKind::Uint),
    (
        "upgrade_sock_connect_accept_max_retries",
        ServerKind::OptUint,
    ),
    ("max_blocking_threads", ServerKind::OptUint),
    ("blocking_threads_ttl_seconds", ServerKind::OptUint),
    (
        "fast_timeout_to_tokio_threshold_seconds",
        ServerKind::OptUint,
    ),
    ("runtime_metrics_poll_time_histogram", ServerKind::Bool),
    (
        "runtime_metrics_poll_time_histogram_scale",
        ServerKind::Other,
    ),
    (
        "runtime_metrics_poll_time_histogram_resolution_micros",
        ServerKind::OptUint,
    ),
    (
        "runtime_metrics_poll_time_histogram_buckets",
        ServerKind::OptUint,
    ),
    ("daemon_wait_for_ready", ServerKind::Bool),
    ("daemon_ready_timeout_seconds", ServerKind::OptNonZero),
    ("daemon_notify_timeout_seconds", ServerKind::OptNonZero),
];

/// Values infergate sets in `server:` when the file does not.
const SERVER_DEFAULTS: &[(&str, ServerDefault)] = &[
    ("grace_period_seconds", ServerDefault::Int(30)),
    ("graceful_shutdown_timeout_seconds", ServerDefault::Int(5)),
    ("threads", ServerDefault::Int(2)),
    ("pid_file", ServerDefault::Str("/tmp/infergate.pid")),
    (
        "upgrade_sock",
        ServerDefault::Str("/tmp/infergate_upgrade.sock"),
    ),
];

enum ServerDefault {
    Int(u64),
    Str(&'static str),
}

/// The reason text of a Pingora error (the cause if there is one: the context repeats the whole YAML).
fn pingora_reason(e: &pingora::Error) -> String {
    let text = match (&e.cause, &e.context) {
        (Some(c), _) => c.to_string(),
        (None, Some(ctx)) => ctx.as_str().to_string(),
        (None, None) => e.to_string(),
    };
    // A position would point into the YAML infergate generated, not into the user's file.
    match text.rfind(" at line ") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use crate::config::testing::*;

    #[test]
    fn server_section() {
        assert_err(
            &format!("server: {{ max_blocking_threads: 0 }}\n{POOL}"),
            "server.max_blocking_threads",
            &[
                "rejected by Pingora",
                "max_blocking_threads must be greater than zero",
            ],
        );
        assert_err(
            &format!("server: {{ runtime_metrics_poll_time_histogram_scale: cubic }}\n{POOL}"),
            "server.runtime_metrics_poll_time_histogram_scale",
            &["rejected by Pingora: runtime_metrics_poll_time_histogram_scale: unknown variant `cubic`"],
        );
        assert!(!parse(&format!(
            "server: {{ runtime_metrics_poll_time_histogram_scale: cubic }}\n{POOL}"
        ))
        .unwrap_err()
        .reason
        .contains(" at line "));
        assert_err(
            &format!("server: {{ daemon_ready_timeout_seconds: 0 }}\n{POOL}"),
            "server.daemon_ready_timeout_seconds",
            &["at least 1"],
        );
        assert_err(
            &format!("server: [1]\n{POOL}"),
            "server",
            &["expected a mapping, found a list"],
        );
        let c = parse(&format!(
            "server:\n  grace_period_seconds: 7\n  error_log: null\n{POOL}"
        ))
        .unwrap();
        let s = c.server_conf();
        assert_eq!(s.grace_period_seconds, Some(7));
        assert_eq!(s.graceful_shutdown_timeout_seconds, Some(5));
        assert!(
            c.server_yaml.contains("grace_period_seconds: 7"),
            "{}",
            c.server_yaml
        );
    }
}
