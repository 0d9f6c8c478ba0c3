//! The strict Prometheus text parser, and the metric names it requires of vLLM (V0 / V1) and SGLang.

use crate::config::EngineKind;
use crate::placement::EngineLoad;

// Why not the `prometheus-parse` crate: its line regexes use `\w+` for metric names, which excludes ':'; every
// `vllm:*` / `sglang:*` sample line (and their HELP/TYPE lines) is classified "Ignored" and silently dropped, so a
// real vLLM dump parses "successfully" with none of the metrics we need - exactly the all-zero failure this module
// must not have. Its label parser also splits on ',' and '=' inside quoted values (vLLM's `lora_requests_info`
// has `waiting_lora_adapters="a,b"`), and it never reports malformed input. The test
// `prometheus_parse_crate_drops_colon_names` pins this down. Below is a small, strict parser of the text exposition
// format (0.0.4, and the OpenMetrics subset engines emit): comments skipped, every other line must be
// `name[{labels}] value [timestamp] [# exemplar]`, or the whole scrape is garbage (as Prometheus itself does).

/// Why a metrics dump gave no load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// Well-formed, but required metrics are absent. `close` lists metric names found that look like the wanted
    /// ones (same base name under another prefix, or another engine kind's names), to point at the misconfiguration.
    Missing { close: Vec<String> },
    /// Not a Prometheus text dump (or a required gauge has an unusable value).
    Garbage(String),
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParseError::Missing { close } if close.is_empty() => {
                write!(
                    f,
                    "required metrics missing; no similarly named metrics found"
                )
            }
            ParseError::Missing { close } => {
                write!(
                    f,
                    "required metrics missing; similarly named metrics found: {}",
                    close.join(", ")
                )
            }
            ParseError::Garbage(why) => write!(f, "unparsable metrics: {why}"),
        }
    }
}

impl std::error::Error for ParseError {}

/// Base names (without prefix) of the gauges each engine kind must export: running, waiting, and cache usage
/// (alternatives in order of preference: vLLM V1 `kv_cache_usage_perc`, then V0 / early V1 `gpu_cache_usage_perc`).
fn base_names(kind: EngineKind) -> (&'static str, &'static str, &'static [&'static str]) {
    match kind {
        EngineKind::Vllm => (
            "num_requests_running",
            "num_requests_waiting",
            &["kv_cache_usage_perc", "gpu_cache_usage_perc"],
        ),
        EngineKind::Sglang => ("num_running_reqs", "num_queue_reqs", &["token_usage"]),
    }
}

/// The full metric names `parse` requires, for messages: running, waiting, and "a|b" for the usage alternatives.
pub fn required_names(kind: EngineKind, prefix: &str) -> Vec<String> {
    let (r, w, u) = base_names(kind);
    let usage: Vec<String> = u.iter().map(|b| format!("{prefix}{b}")).collect();
    vec![
        format!("{prefix}{r}"),
        format!("{prefix}{w}"),
        usage.join("|"),
    ]
}

/// At most this many close names are reported.
const MAX_CLOSE_NAMES: usize = 8;

/// A name "looks like" a wanted one when it ends with a known base name of any engine kind, right after a
/// separator (or is the bare base name).
fn looks_close(name: &str) -> bool {
    [EngineKind::Vllm, EngineKind::Sglang].iter().any(|&k| {
        let (r, w, u) = base_names(k);
        [r, w]
            .iter()
            .chain(u.iter())
            .any(|base| match name.strip_suffix(base) {
                Some("") => true,
                Some(head) => head.ends_with([':', '_']),
                None => false,
            })
    })
}

/// Parse a Prometheus text dump into engine load. Gauges with several samples (e.g. one per `engine` label of a
/// data-parallel vLLM) are summed for running / waiting and averaged for cache usage. All three are required:
/// absent means unknown (`Missing`), never idle.
pub fn parse(text: &str, kind: EngineKind, prefix: &str) -> Result<EngineLoad, ParseError> {
    let (r, w, u) = base_names(kind);
    let running_name = format!("{prefix}{r}");
    let waiting_name = format!("{prefix}{w}");
    let usage_names: Vec<String> = u.iter().map(|b| format!("{prefix}{b}")).collect();

    // (sum, samples) per wanted gauge; usage per alternative.
    let mut running = (0.0f64, 0usize);
    let mut waiting = (0.0f64, 0usize);
    let mut usage = vec![(0.0f64, 0usize); usage_names.len()];
    let mut samples = 0usize;
    let mut close: Vec<String> = Vec::new();

    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, value) = parse_sample(line).map_err(|why| {
            let shown: String = line.chars().take(80).collect();
            ParseError::Garbage(format!("line {}: {why}: `{shown}`", n + 1))
        })?;
        samples += 1;
        let slot = if name == running_name {
            Some(&mut running)
        } else if name == waiting_name {
            Some(&mut waiting)
        } else {
            usage_names
                .iter()
                .position(|u| u == name)
                .map(|i| &mut usage[i])
        };
        match slot {
            Some(slot) => {
                if !(value.is_finite() && value >= 0.0) {
                    return Err(ParseError::Garbage(format!(
                        "line {}: {name} has value {value}",
                        n + 1
                    )));
                }
                slot.0 += value;
                slot.1 += 1;
            }
            None => {
                if close.len() < MAX_CLOSE_NAMES
                    && looks_close(name)
                    && !close.iter().any(|c| c == name)
                {
                    close.push(name.to_string());
                }
            }
        }
    }
    if samples == 0 {
        return Err(ParseError::Garbage("no metric samples".to_string()));
    }
    let usage = usage.iter().find(|(_, k)| *k > 0).copied();
    match (running.1 > 0, waiting.1 > 0, usage) {
        (true, true, Some((sum, k))) => Ok(EngineLoad {
            running: running.0.round() as u64,
            waiting: waiting.0.round() as u64,
            kv_usage: (sum / k as f64).clamp(0.0, 1.0),
            own_at_sample: 0,
        }),
        _ => {
            close.sort();
            Err(ParseError::Missing { close })
        }
    }
}

/// One sample line: `name[{labels}] value [timestamp] [# exemplar]`. Labels are validated but not kept.
fn parse_sample(line: &str) -> Result<(&str, f64), &'static str> {
    let b = line.as_bytes();
    let is_start = |c: u8| c.is_ascii_alphabetic() || c == b'_' || c == b':';
    let is_cont = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    if b.is_empty() || !is_start(b[0]) {
        return Err("expected a metric name");
    }
    let mut i = 1;
    while i < b.len() && is_cont(b[i]) {
        i += 1;
    }
    let name = &line[..i];
    let mut rest = line[i..].trim_start();
    if let Some(after) = rest.strip_prefix('{') {
        rest = skip_labels(after)?.trim_start();
    }
    let mut parts = rest.split_ascii_whitespace();
    let value = parts.next().ok_or("missing value")?;
    let value: f64 = value.parse().map_err(|_| "bad value")?;
    match parts.next() {
        None => {}
        Some("#") => {} // OpenMetrics exemplar
        Some(ts) => {
            ts.parse::<f64>().map_err(|_| "bad timestamp")?;
            if let Some(tok) = parts.next() {
                if tok != "#" {
                    return Err("trailing text");
                }
            }
        }
    }
    Ok((name, value))
}

/// Skip `name="value",...}` (escapes `\\`, `\"`, `\n` inside values; a trailing comma allowed). Returns the text
/// after the closing brace.
fn skip_labels(s: &str) -> Result<&str, &'static str> {
    let b = s.as_bytes();
    let mut i = 0;
    let skip_ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    loop {
        skip_ws(&mut i);
        if i < b.len() && b[i] == b'}' {
            return Ok(&s[i + 1..]);
        }
        let start = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        if i == start || b[start].is_ascii_digit() {
            return Err("bad label name");
        }
        skip_ws(&mut i);
        if i >= b.len() || b[i] != b'=' {
            return Err("expected `=` after label name");
        }
        i += 1;
        skip_ws(&mut i);
        if i >= b.len() || b[i] != b'"' {
            return Err("expected a quoted label value");
        }
        i += 1;
        loop {
            match b.get(i) {
                None => return Err("unterminated label value"),
                Some(b'\\') => i += 2,
                Some(b'"') => break,
                Some(_) => i += 1,
            }
        }
        i += 1;
        skip_ws(&mut i);
        match b.get(i) {
            Some(b',') => i += 1,
            Some(b'}') => {}
            _ => return Err("expected `,` or `}` after a label"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine_stats::fixtures::{SGLANG, VLLM_V0, VLLM_V1};

    fn approx(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn vllm_v1_sums_requests_and_averages_usage_across_engines() {
        let l = parse(VLLM_V1, EngineKind::Vllm, "vllm:").unwrap();
        assert_eq!((l.running, l.waiting), (5, 4));
        assert!(approx(l.kv_usage, 0.375), "{l:?}");
    }

    #[test]
    fn vllm_v0_names() {
        let l = parse(VLLM_V0, EngineKind::Vllm, "vllm:").unwrap();
        assert_eq!((l.running, l.waiting), (7, 1));
        assert!(approx(l.kv_usage, 0.875));
    }

    #[test]
    fn v1_usage_name_wins_when_both_are_exported() {
        let both = format!("{VLLM_V1}vllm:gpu_cache_usage_perc{{engine=\"0\"}} 0.9\n");
        assert!(approx(
            parse(&both, EngineKind::Vllm, "vllm:").unwrap().kv_usage,
            0.375
        ));
    }

    #[test]
    fn sglang_names() {
        let l = parse(SGLANG, EngineKind::Sglang, "sglang:").unwrap();
        assert_eq!((l.running, l.waiting), (8, 4));
        assert!(approx(l.kv_usage, 0.2));
        // The wrong kind is Missing, and the close names show what the endpoint really is.
        match parse(SGLANG, EngineKind::Vllm, "vllm:") {
            Err(ParseError::Missing { close }) => {
                assert_eq!(
                    close,
                    vec![
                        "sglang:num_queue_reqs",
                        "sglang:num_running_reqs",
                        "sglang:token_usage"
                    ]
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn misprefixed_dump_is_missing_with_close_names_not_zeros() {
        let underscored = VLLM_V1.replace("vllm:", "vllm_");
        match parse(&underscored, EngineKind::Vllm, "vllm:") {
            Err(ParseError::Missing { close }) => assert_eq!(
                close,
                vec![
                    "vllm_kv_cache_usage_perc",
                    "vllm_num_requests_running",
                    "vllm_num_requests_waiting"
                ]
            ),
            other => panic!("{other:?}"),
        }
        // With the matching prefix configured it parses.
        assert_eq!(
            parse(&underscored, EngineKind::Vllm, "vllm_")
                .unwrap()
                .running,
            5
        );
        let e = parse(&underscored, EngineKind::Vllm, "vllm:").unwrap_err();
        assert!(e.to_string().contains("vllm_num_requests_running"), "{e}");
    }

    #[test]
    fn any_required_gauge_absent_is_missing() {
        let no_usage: String = VLLM_V1
            .lines()
            .filter(|l| !l.contains("cache_usage"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(
            parse(&no_usage, EngineKind::Vllm, "vllm:"),
            Err(ParseError::Missing { close: vec![] })
        );
        let no_waiting: String = VLLM_V0
            .lines()
            .filter(|l| !l.contains("waiting"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(matches!(
            parse(&no_waiting, EngineKind::Vllm, "vllm:"),
            Err(ParseError::Missing { .. })
        ));
        // Only comments: a dump without the metrics.
        assert!(matches!(
            parse("# EOF\n", EngineKind::Vllm, "vllm:"),
            Err(ParseError::Garbage(_))
        ));
    }

    #[test]
    fn garbage_is_an_error() {
        for text in [
            "<html><body>502 Bad Gateway</body></html>",
            "",
            "{\"detail\":\"Not Found\"}",
            "vllm:num_requests_running{engine=\"0\" 3",
            "vllm:num_requests_running three",
            "vllm:num_requests_running{engine=0} 3",
            "vllm:num_requests_running 3 123 extra",
        ] {
            match parse(text, EngineKind::Vllm, "vllm:") {
                Err(ParseError::Garbage(why)) => assert!(!why.is_empty()),
                other => panic!("{text:?}: {other:?}"),
            }
        }
        // NaN or negative in a required gauge is unusable, not a number to route on.
        let nan = VLLM_V0.replace("} 7.0", "} NaN");
        assert!(matches!(
            parse(&nan, EngineKind::Vllm, "vllm:"),
            Err(ParseError::Garbage(_))
        ));
    }

    #[test]
    fn format_details_timestamps_escapes_exemplars() {
        let text = "vllm:num_requests_running{a=\"x\\\"}y\",b=\"\\\\\",} 2 1700000000000\n\
                    vllm:num_requests_waiting 1 # {trace_id=\"abc\"} 0.5\n\
                    vllm:kv_cache_usage_perc{engine = \"0\"} +Inf\n";
        let l = parse(text, EngineKind::Vllm, "vllm:");
        // +Inf usage is not a usable value.
        assert!(matches!(l, Err(ParseError::Garbage(_))), "{l:?}");
        let text = text.replace("+Inf", "1.5e-1");
        let l = parse(&text, EngineKind::Vllm, "vllm:").unwrap();
        assert_eq!((l.running, l.waiting), (2, 1));
        assert!(approx(l.kv_usage, 0.15));
    }

    /// Why the parser is hand-written: prometheus-parse 0.2 drops every sample whose name contains ':'.
    #[test]
    fn prometheus_parse_crate_drops_colon_names() {
        let scrape =
            prometheus_parse::Scrape::parse(VLLM_V1.lines().map(|l| Ok(l.to_string()))).unwrap();
        assert!(scrape.samples.iter().any(|s| s.metric == "python_info"));
        assert!(
            !scrape.samples.iter().any(|s| s.metric.starts_with("vllm")),
            "prometheus-parse now reads ':' names; it could replace the hand-written parser"
        );
    }
}
