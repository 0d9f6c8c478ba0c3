//! `tracing` (top level): OpenTelemetry spans of each request, exported over OTLP/HTTP to a collector.

use std::time::Duration;

use serde_norway::Value;

use super::walk::read_keys;
use super::walk::{Field, Node};
use super::ConfigError;

/// The OTLP/HTTP path of traces, appended to an `endpoint` given without one.
pub const TRACES_PATH: &str = "/v1/traces";

/// Spans waiting for export at most, by default (the OpenTelemetry SDK's default); past it new spans are dropped.
pub const DEFAULT_QUEUE_SPANS: usize = 2048;

/// Spans sent in one export at most, by default (the SDK's default).
pub const DEFAULT_BATCH_SPANS: usize = 512;

/// How often queued spans are exported, by default (the SDK's default).
pub const DEFAULT_EXPORT_INTERVAL: Duration = Duration::from_secs(5);

/// The longest one export may take, retries included, by default (OTLP's default).
pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

const DEFAULT_SERVICE_NAME: &str = "infergate";

/// Request tracing (absent from the file: off).
#[derive(Debug, Clone, PartialEq)]
pub struct TracingConfig {
    /// Where spans are sent: an OTLP/HTTP traces URL (`http://127.0.0.1:4318/v1/traces`).
    pub endpoint: String,
    /// The share of traces started here that are recorded (0 to 1); a client's `traceparent` decides for its own.
    pub sample_ratio: f64,
    /// `service.name` of the spans.
    pub service_name: String,
    /// Spans waiting for export at most; a full queue drops spans (counted), never blocks a request.
    pub queue_spans: usize,
    /// Spans sent in one export at most.
    pub batch_spans: usize,
    /// How often queued spans are exported (a full batch goes at once).
    pub export_interval: Duration,
    /// The longest one export may take, retries included.
    pub export_timeout: Duration,
}

impl TracingConfig {
    /// `tracing`: absent or null = off; otherwise a mapping that needs `endpoint`.
    pub(super) fn read_optional(f: &Field<'_>) -> Result<Option<TracingConfig>, ConfigError> {
        match f.value() {
            None | Some(Value::Null) => Ok(None),
            Some(_) => TracingConfig::read(f.section()?).map(Some),
        }
    }

    pub(super) fn read(n: Node<'_>) -> Result<TracingConfig, ConfigError> {
        read_keys!(
            n;
            endpoint,
            sample_ratio,
            service_name,
            queue_spans,
            batch_spans,
            export_interval,
            export_timeout,
        );
        endpoint.required()?;
        let url = traces_url(endpoint.string()?.trim()).map_err(|r| endpoint.err(r))?;
        let service_name = match service_name.value() {
            None => DEFAULT_SERVICE_NAME.to_string(),
            Some(_) => match service_name.string()?.trim() {
                "" => return Err(service_name.err("must not be empty")),
                s => s.to_string(),
            },
        };
        let queue = super::values::to_usize(queue_spans.positive_or(DEFAULT_QUEUE_SPANS as u64)?);
        let batch = super::values::to_usize(batch_spans.positive_or(DEFAULT_BATCH_SPANS as u64)?);
        if batch > queue {
            return Err(batch_spans.err(format!(
                "{batch} is more than queue_spans ({queue}); a batch is taken from the queue"
            )));
        }
        Ok(TracingConfig {
            endpoint: url,
            sample_ratio: ratio(&sample_ratio)?,
            service_name,
            queue_spans: queue,
            batch_spans: batch,
            export_interval: export_interval.duration_or(DEFAULT_EXPORT_INTERVAL)?,
            export_timeout: export_timeout.duration_or(DEFAULT_EXPORT_TIMEOUT)?,
        })
    }
}

/// `sample_ratio`: a number from 0 to 1, default 1 (every trace the router starts).
fn ratio(f: &Field<'_>) -> Result<f64, ConfigError> {
    match f.value() {
        None => Ok(1.0),
        Some(Value::Number(n)) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if !(0.0..=1.0).contains(&x) {
                return Err(f.err(format!(
                    "must be a number from 0 (record no trace the router starts) to 1 (every one), found {x}"
                )));
            }
            Ok(x)
        }
        Some(other) => Err(f.type_err("a number from 0 to 1", other)),
    }
}

/// The OTLP/HTTP traces URL: `http://host:port` alone gets `/v1/traces` (as `OTEL_EXPORTER_OTLP_ENDPOINT` does).
fn traces_url(text: &str) -> Result<String, String> {
    const EXAMPLE: &str = "e.g. `http://127.0.0.1:4318/v1/traces`";
    let rest = match text.split_once("://") {
        Some((s, rest)) if s.eq_ignore_ascii_case("http") => rest,
        Some((s, _)) if s.eq_ignore_ascii_case("https") => {
            return Err(format!(
                "https is not supported; send to a collector on the node or the private network over http:// ({EXAMPLE})"
            ))
        }
        _ => return Err(format!("expected an OTLP/HTTP URL ({EXAMPLE})")),
    };
    let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    if authority.is_empty() {
        return Err(format!("missing host ({EXAMPLE})"));
    }
    if authority.contains('@') || path.contains(['?', '#']) {
        return Err(format!(
            "give only host, port and path, without credentials or a query ({EXAMPLE})"
        ));
    }
    let url = if path.is_empty() || path == "/" {
        format!("http://{authority}{TRACES_PATH}")
    } else {
        format!("http://{authority}{path}")
    };
    // A port, when given, is 1 to 65535 (`http::Uri` takes any digits and then reports no port).
    let port = match authority.rsplit_once(':') {
        Some((host, p)) if !p.contains(']') && !host.is_empty() => Some(p.parse::<u16>().ok()),
        _ => None,
    };
    match (url.parse::<http::Uri>(), port) {
        (Ok(_), None | Some(Some(1..))) => Ok(url),
        _ => Err(format!("`{text}` is not a valid URL ({EXAMPLE})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::*;

    #[test]
    fn off_by_default_and_defaults_when_on() {
        assert_eq!(parse(POOL).unwrap().tracing, None);
        let c = parse(&format!(
            "tracing: {{ endpoint: \"http://127.0.0.1:4318\" }}\n{POOL}"
        ))
        .unwrap();
        assert_eq!(
            c.tracing,
            Some(TracingConfig {
                endpoint: "http://127.0.0.1:4318/v1/traces".into(),
                sample_ratio: 1.0,
                service_name: "infergate".into(),
                queue_spans: DEFAULT_QUEUE_SPANS,
                batch_spans: DEFAULT_BATCH_SPANS,
                export_interval: DEFAULT_EXPORT_INTERVAL,
                export_timeout: DEFAULT_EXPORT_TIMEOUT,
            })
        );
        let c = parse(&format!(
            "tracing:\n  endpoint: http://collector.local:4318/otlp/v1/traces\n  sample_ratio: 0.25\n  \
             service_name: gpu-node-7\n  queue_spans: 100\n  batch_spans: 10\n  export_interval: 200ms\n  \
             export_timeout: 2s\n{POOL}"
        ))
        .unwrap()
        .tracing
        .unwrap();
        assert_eq!(c.endpoint, "http://collector.local:4318/otlp/v1/traces");
        assert_eq!(c.sample_ratio, 0.25);
        assert_eq!(c.service_name, "gpu-node-7");
        assert_eq!((c.queue_spans, c.batch_spans), (100, 10));
        assert_eq!(c.export_interval, Duration::from_millis(200));
        assert_eq!(c.export_timeout, Duration::from_secs(2));
    }

    #[test]
    fn bad_values_name_their_key() {
        let with = |t: &str| format!("tracing: {t}\n{POOL}");
        assert_err(&with("{}"), "tracing.endpoint", &["required"]);
        assert_err(&with("on"), "tracing", &["expected a mapping"]);
        assert_err(
            &with("{ endpoint: \"https://c:4318\" }"),
            "tracing.endpoint",
            &["https is not supported"],
        );
        assert_err(
            &with("{ endpoint: \"127.0.0.1:4318\" }"),
            "tracing.endpoint",
            &["expected an OTLP/HTTP URL"],
        );
        assert_err(
            &with("{ endpoint: \"http://u:p@c:4318\" }"),
            "tracing.endpoint",
            &["without credentials"],
        );
        assert_err(
            &with("{ endpoint: \"http://c:99999\" }"),
            "tracing.endpoint",
            &["not a valid URL"],
        );
        for bad in ["1.5", "-0.1"] {
            assert_err(
                &with(&format!(
                    "{{ endpoint: \"http://c\", sample_ratio: {bad} }}"
                )),
                "tracing.sample_ratio",
                &["from 0"],
            );
        }
        assert_err(
            &with("{ endpoint: \"http://c\", sample_ratio: half }"),
            "tracing.sample_ratio",
            &["expected a number from 0 to 1"],
        );
        assert_err(
            &with("{ endpoint: \"http://c\", queue_spans: 10, batch_spans: 20 }"),
            "tracing.batch_spans",
            &["more than queue_spans"],
        );
        assert_err(
            &with("{ endpoint: \"http://c\", queue_spans: 0 }"),
            "tracing.queue_spans",
            &["at least 1"],
        );
        assert_err(
            &with("{ endpoint: \"http://c\", export_interval: 5 }"),
            "tracing.export_interval",
            &["add a unit"],
        );
        assert_err(
            &with("{ endpoint: \"http://c\", sample_rate: 1 }"),
            "tracing.sample_rate",
            &["did you mean `sample_ratio`?"],
        );
    }
}
