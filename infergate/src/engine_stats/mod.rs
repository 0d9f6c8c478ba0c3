//! Engine stats: scraping and parsing each endpoint's Prometheus `/metrics` into running / waiting / KV usage,
//! and judging them fresh, stale, missing or down. Unknown is never reported as idle.

use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use crate::config::{EngineKind, EngineStatsConfig};
use crate::placement::EngineLoad;

/// The state of one endpoint's engine stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsState {
    /// Scraping is not configured for this pool.
    Off,
    /// A good sample younger than 3 intervals.
    Fresh,
    /// The last good sample is older than 3 intervals.
    Stale,
    /// The scrape works but the required metric names are absent (e.g. a mis-prefixed engine).
    Missing,
    /// The scrape fails (connect, HTTP status, timeout) and no fresh sample exists.
    Down,
}

impl StatsState {
    pub fn as_str(self) -> &'static str {
        match self {
            StatsState::Off => "off",
            StatsState::Fresh => "fresh",
            StatsState::Stale => "stale",
            StatsState::Missing => "missing",
            StatsState::Down => "down",
        }
    }
}

#[derive(Debug, Default)]
struct CellInner {
    enabled: bool,
    interval: Duration,
    last_good: Option<(Instant, EngineLoad)>,
    /// Outcome of the newest scrape attempt that was not good.
    last_bad: Option<(Instant, StatsState)>,
}

/// The latest stats of one endpoint, written by its scraper and read by placement.
#[derive(Debug, Default)]
pub struct StatsCell {
    inner: Mutex<CellInner>,
}

impl StatsCell {
    fn lock(&self) -> parking_lot::MutexGuard<'_, CellInner> {
        self.inner.lock()
    }

    /// Turn scraping on for this endpoint (state becomes Down until the first good sample).
    pub fn enable(&self, interval: Duration) {
        let mut c = self.lock();
        c.enabled = true;
        c.interval = interval;
    }

    pub fn record_good(&self, at: Instant, load: EngineLoad) {
        let mut c = self.lock();
        c.last_good = Some((at, load));
        c.last_bad = None;
    }

    pub fn record_bad(&self, at: Instant, state: StatsState) {
        self.lock().last_bad = Some((at, state));
    }

    /// Stats usable for placement: only when fresh.
    pub fn fresh(&self, now: Instant) -> Option<EngineLoad> {
        let c = self.lock();
        Self::state_of(&c, now)
            .eq(&StatsState::Fresh)
            .then(|| c.last_good.map(|(_, l)| l))
            .flatten()
    }

    pub fn state(&self, now: Instant) -> StatsState {
        Self::state_of(&self.lock(), now)
    }

    fn state_of(c: &CellInner, now: Instant) -> StatsState {
        if !c.enabled {
            return StatsState::Off;
        }
        // The newest bad outcome wins over an older good sample: a missing metric must not read as the old value.
        if let Some((bad_at, st)) = c.last_bad {
            if c.last_good.is_none_or(|(good_at, _)| bad_at >= good_at) && st == StatsState::Missing
            {
                return StatsState::Missing;
            }
        }
        match c.last_good {
            Some((at, _)) if now.saturating_duration_since(at) <= c.interval * 3 => {
                StatsState::Fresh
            }
            Some(_) => match c.last_bad {
                Some((_, st)) => st,
                None => StatsState::Stale,
            },
            None => c.last_bad.map(|(_, st)| st).unwrap_or(StatsState::Down),
        }
    }
}

impl StatsCell {
    /// Record one scrape outcome: a good sample, or Missing / Down.
    pub fn record_outcome(&self, at: Instant, outcome: &ScrapeOutcome) {
        match outcome {
            ScrapeOutcome::Good(load) => self.record_good(at, *load),
            other => self.record_bad(at, other.state()),
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------------------------------
//
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

// ---------------------------------------------------------------------------------------------------------------
// Scraping
// ---------------------------------------------------------------------------------------------------------------

/// The result of one scrape.
#[derive(Debug, Clone, PartialEq)]
pub enum ScrapeOutcome {
    Good(EngineLoad),
    /// The endpoint answered with metrics, but not the required ones.
    Missing {
        close: Vec<String>,
    },
    /// Connect error, timeout, HTTP error status, oversized or unparsable body. The reason never holds a key.
    Down(String),
}

impl ScrapeOutcome {
    /// The state this outcome puts a `StatsCell` in (`Fresh` for a good sample).
    pub fn state(&self) -> StatsState {
        match self {
            ScrapeOutcome::Good(_) => StatsState::Fresh,
            ScrapeOutcome::Missing { .. } => StatsState::Missing,
            ScrapeOutcome::Down(_) => StatsState::Down,
        }
    }
}

/// Where scrape outcomes go (typically `move |o| endpoint.stats.record_outcome(Instant::now(), &o)`).
pub type OutcomeSink = Arc<dyn Fn(ScrapeOutcome) + Send + Sync>;

/// One endpoint to scrape. Independent of `crate::pool` (which depends on this module).
#[derive(Clone)]
pub struct ScrapeTarget {
    pub pool: String,
    /// The endpoint label ("host:port"), for logs.
    pub endpoint: String,
    /// Full URL: "http://host:port" + the configured path.
    pub url: String,
    /// Sent as `Authorization: Bearer …`; never logged.
    pub api_key: Option<String>,
    pub cfg: EngineStatsConfig,
    pub cell: OutcomeSink,
}

impl std::fmt::Debug for ScrapeTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScrapeTarget")
            .field("pool", &self.pool)
            .field("endpoint", &self.endpoint)
            .field("url", &self.url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("cfg", &self.cfg)
            .finish()
    }
}

/// Largest metrics body accepted (a vLLM dump is tens of KiB).
pub const MAX_METRICS_BYTES: usize = 16 << 20;

/// The one HTTP client all scrapers share (connection pooling; no proxies: engines are on the private network).
pub fn shared_client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap_or_else(|_| reqwest::Client::new())
    })
}

/// Scrape once: GET the URL (bearer key if any, whole-request timeout) and parse the body.
pub async fn scrape_once(
    client: &reqwest::Client,
    url: &str,
    api_key: Option<&str>,
    timeout: Duration,
    kind: EngineKind,
    prefix: &str,
) -> ScrapeOutcome {
    let mut req = client
        .get(url)
        .timeout(timeout)
        .header("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1");
    if let Some(key) = api_key {
        req = req.bearer_auth(key);
    }
    let mut resp = match req.send().await {
        Ok(r) => r,
        Err(e) => return ScrapeOutcome::Down(describe(&e, timeout)),
    };
    let status = resp.status();
    if !status.is_success() {
        let hint = if matches!(status.as_u16(), 401 | 403) {
            " (check the endpoint's api key)"
        } else {
            ""
        };
        return ScrapeOutcome::Down(format!("HTTP {}{hint}", status.as_u16()));
    }
    let mut body = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > MAX_METRICS_BYTES {
                    return ScrapeOutcome::Down(format!(
                        "metrics body larger than {MAX_METRICS_BYTES} bytes"
                    ));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(e) => return ScrapeOutcome::Down(describe(&e, timeout)),
        }
    }
    match parse(&String::from_utf8_lossy(&body), kind, prefix) {
        Ok(load) => ScrapeOutcome::Good(load),
        Err(ParseError::Missing { close }) => ScrapeOutcome::Missing { close },
        Err(e @ ParseError::Garbage(_)) => ScrapeOutcome::Down(e.to_string()),
    }
}

/// A short error description without the URL (the caller logs the endpoint label) and never a header.
fn describe(e: &reqwest::Error, timeout: Duration) -> String {
    if e.is_timeout() {
        return format!("timed out after {timeout:?}");
    }
    let mut msg = if e.is_connect() {
        "connect failed".to_string()
    } else {
        "request failed".to_string()
    };
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

/// What the log gate says about a new outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogNote {
    /// Newly missing metrics (one warning until it recovers).
    Missing,
    /// Newly down (one warning until it recovers).
    Down,
    /// Good again after Missing/Down.
    Recovered,
}

/// Debounces scrape logs: one line per change of condition, not one per interval.
#[derive(Debug, Default)]
struct LogGate {
    broken: Option<StatsState>,
}

impl LogGate {
    fn observe(&mut self, outcome: &ScrapeOutcome) -> Option<LogNote> {
        let now = match outcome {
            ScrapeOutcome::Good(_) => None,
            other => Some(other.state()),
        };
        let prev = std::mem::replace(&mut self.broken, now);
        match (prev, now) {
            (a, b) if a == b => None,
            (Some(_), None) => Some(LogNote::Recovered),
            (_, Some(StatsState::Missing)) => Some(LogNote::Missing),
            (_, Some(_)) => Some(LogNote::Down),
            (None, None) => None,
        }
    }
}

/// Scrape `target` every `cfg.interval` (timeout = interval) until `stop` becomes true or its sender is dropped,
/// passing each outcome to `target.cell`. Logs once per change of condition: a Missing endpoint warns once,
/// naming the wanted and the similarly named metrics it found, and again only after it recovered and broke again.
pub async fn scrape_loop(target: ScrapeTarget, mut stop: tokio::sync::watch::Receiver<bool>) {
    let interval = target.cfg.interval.max(Duration::from_millis(10));
    let client = shared_client();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut gate = LogGate::default();
    loop {
        if *stop.borrow_and_update() {
            return;
        }
        tokio::select! {
            _ = ticker.tick() => {}
            r = stop.changed() => { if r.is_err() { return; } continue; }
        }
        let scrape = scrape_once(
            client,
            &target.url,
            target.api_key.as_deref(),
            interval,
            target.cfg.kind,
            &target.cfg.metric_prefix,
        );
        let outcome = tokio::select! {
            o = scrape => o,
            r = stop.changed() => { if r.is_err() { return; } continue; }
        };
        if let Some(note) = gate.observe(&outcome) {
            log_note(&target, note, &outcome);
        }
        (target.cell)(outcome);
    }
}

fn log_note(t: &ScrapeTarget, note: LogNote, outcome: &ScrapeOutcome) {
    let who = format!("pool {} endpoint {}", t.pool, t.endpoint);
    match (note, outcome) {
        (LogNote::Missing, ScrapeOutcome::Missing { close }) => {
            let wanted = required_names(t.cfg.kind, &t.cfg.metric_prefix).join(", ");
            let found = if close.is_empty() {
                "none with a similar name".to_string()
            } else {
                format!("similarly named: {}", close.join(", "))
            };
            log::warn!(
                "{who}: engine stats missing from {}: wanted {wanted} (kind {}, metric_prefix \"{}\"); found {found}. \
                 Placement uses infergate's own in-flight counts for this endpoint until they appear",
                t.url,
                t.cfg.kind.as_str(),
                t.cfg.metric_prefix,
            );
        }
        (LogNote::Down, ScrapeOutcome::Down(why)) => {
            log::warn!("{who}: engine stats scrape of {} failed: {why}", t.url);
        }
        (LogNote::Recovered, _) => log::info!("{who}: engine stats available again"),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trimmed but real-shaped vLLM V1 (0.10+) dump: process/python metrics, HELP/TYPE lines, counters with
    /// `_created`, a histogram, info gauges whose label values hold commas, and two data-parallel engines.
    const VLLM_V1: &str = r#"# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 14894.0
python_gc_objects_collected_total{generation="1"} 1638.0
# HELP python_info Python platform information
# TYPE python_info gauge
python_info{implementation="CPython",major="3",minor="12",patchlevel="11",version="3.12.11"} 1.0
# HELP process_virtual_memory_bytes Virtual memory size in bytes.
# TYPE process_virtual_memory_bytes gauge
process_virtual_memory_bytes 1.2345678e+10
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-8B"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 4.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-8B"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-8B"} 0.25
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-8B"} 123456.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="Qwen/Qwen3-8B"} 1.7563e+09
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen3-8B"} 12.5
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-8B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.005",model_name="Qwen/Qwen3-8B"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-8B"} 40.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-8B"} 40.0
# HELP vllm:time_to_first_token_seconds_created Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds_created gauge
vllm:time_to_first_token_seconds_created{engine="0",model_name="Qwen/Qwen3-8B"} 1.7563e+09
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27306"} 1.0
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="1",running_lora_adapters="",waiting_lora_adapters="a,b=c"} 1.7563e+09
# HELP http_request_size_bytes Content length of incoming requests by handler.
# TYPE http_request_size_bytes summary
http_request_size_bytes_count{handler="/v1/chat/completions"} 40.0
http_request_size_bytes_sum{handler="/v1/chat/completions"} 12345.0
"#;

    /// vLLM V0 (and early V1): `gpu_cache_usage_perc`, one engine, no engine label.
    const VLLM_V0: &str = r#"# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.875
# HELP vllm:cpu_cache_usage_perc CPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:cpu_cache_usage_perc gauge
vllm:cpu_cache_usage_perc{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
"#;

    const SGLANG: &str = r#"# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="Qwen/Qwen3-8B",tp_rank="0",dp_rank="0"} 6.0
sglang:num_running_reqs{model_name="Qwen/Qwen3-8B",tp_rank="0",dp_rank="1"} 2.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="Qwen/Qwen3-8B",tp_rank="0",dp_rank="0"} 3.0
sglang:num_queue_reqs{model_name="Qwen/Qwen3-8B",tp_rank="0",dp_rank="1"} 1.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="Qwen/Qwen3-8B",tp_rank="0",dp_rank="0"} 0.3
sglang:token_usage{model_name="Qwen/Qwen3-8B",tp_rank="0",dp_rank="1"} 0.1
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="Qwen/Qwen3-8B",tp_rank="0",dp_rank="0"} 1024.5
"#;

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

    #[test]
    fn cell_state_transitions() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let load = EngineLoad {
            running: 2,
            waiting: 1,
            kv_usage: 0.5,
        };
        let cell = StatsCell::default();
        assert_eq!(cell.state(t0), StatsState::Off);
        cell.record_good(t0, load);
        assert_eq!(
            cell.state(t0),
            StatsState::Off,
            "not enabled: off regardless"
        );
        assert_eq!(cell.fresh(t0), None);

        let cell = StatsCell::default();
        cell.enable(s);
        assert_eq!(cell.state(t0), StatsState::Down, "enabled, no sample yet");
        cell.record_outcome(t0, &ScrapeOutcome::Good(load));
        assert_eq!(cell.state(t0 + 3 * s), StatsState::Fresh);
        assert_eq!(cell.fresh(t0 + 3 * s), Some(load));
        assert_eq!(
            cell.state(t0 + 3 * s + Duration::from_millis(1)),
            StatsState::Stale
        );
        assert_eq!(cell.fresh(t0 + 4 * s), None, "stale stats are not used");

        // A failed scrape right after a good one: the sample stays fresh until it ages out, then Down.
        cell.record_good(t0 + 10 * s, load);
        cell.record_outcome(t0 + 11 * s, &ScrapeOutcome::Down("timed out".into()));
        assert_eq!(cell.state(t0 + 12 * s), StatsState::Fresh);
        assert_eq!(cell.state(t0 + 14 * s), StatsState::Down);
        assert_eq!(cell.fresh(t0 + 14 * s), None);

        // Missing wins immediately over an older good sample: never the old value, never zeros.
        cell.record_good(t0 + 20 * s, load);
        cell.record_outcome(
            t0 + 21 * s,
            &ScrapeOutcome::Missing {
                close: vec!["vllm_num_requests_running".into()],
            },
        );
        assert_eq!(cell.state(t0 + 21 * s), StatsState::Missing);
        assert_eq!(cell.fresh(t0 + 21 * s), None);
        cell.record_outcome(t0 + 22 * s, &ScrapeOutcome::Good(load));
        assert_eq!(cell.state(t0 + 22 * s), StatsState::Fresh);
    }

    #[test]
    fn log_gate_warns_once_per_breakage() {
        let good = ScrapeOutcome::Good(EngineLoad::default());
        let missing = ScrapeOutcome::Missing { close: vec![] };
        let down = ScrapeOutcome::Down("x".into());
        let mut g = LogGate::default();
        let notes: Vec<_> = [
            &good, &missing, &missing, &missing, &good, &good, &missing, &down, &down, &good,
        ]
        .iter()
        .map(|o| g.observe(o))
        .collect();
        assert_eq!(
            notes,
            vec![
                None,
                Some(LogNote::Missing),
                None,
                None,
                Some(LogNote::Recovered),
                None,
                Some(LogNote::Missing),
                Some(LogNote::Down),
                None,
                Some(LogNote::Recovered),
            ]
        );
    }

    // --- scraping against a loopback HTTP server ---

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::mpsc;

    /// Serve `status` + `body` to every connection; send each request head to `heads`.
    async fn serve(
        status: &'static str,
        body: String,
    ) -> (String, mpsc::UnboundedReceiver<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                let tx = tx.clone();
                let body = body.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let _ = tx.send(String::from_utf8_lossy(&head).into_owned());
                    let resp = format!(
                        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\
                         Connection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = sock.write_all(resp.as_bytes()).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        (format!("http://{addr}/metrics"), rx)
    }

    fn target(
        url: String,
        key: Option<&str>,
        prefix: &str,
    ) -> (ScrapeTarget, mpsc::UnboundedReceiver<ScrapeOutcome>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let t = ScrapeTarget {
            pool: "p".into(),
            endpoint: "e:1".into(),
            url,
            api_key: key.map(str::to_string),
            cfg: EngineStatsConfig {
                kind: EngineKind::Vllm,
                path: "/metrics".into(),
                interval: Duration::from_millis(50),
                metric_prefix: prefix.into(),
            },
            cell: Arc::new(move |o| {
                let _ = tx.send(o);
            }),
        };
        (t, rx)
    }

    async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> T {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("in time")
            .expect("open")
    }

    #[tokio::test]
    async fn scrape_loop_reads_a_live_endpoint_with_the_key_and_stops() {
        let (url, mut heads) = serve("200 OK", VLLM_V1.to_string()).await;
        let (t, mut outcomes) = target(url, Some("s3cret"), "vllm:");
        assert!(!format!("{t:?}").contains("s3cret"));
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(scrape_loop(t, stop_rx));
        match next(&mut outcomes).await {
            ScrapeOutcome::Good(l) => assert_eq!((l.running, l.waiting), (5, 4)),
            other => panic!("{other:?}"),
        }
        let head = next(&mut heads).await.to_ascii_lowercase();
        assert!(head.starts_with("get /metrics http/1.1\r\n"), "{head}");
        assert!(head.contains("authorization: bearer s3cret\r\n"), "{head}");
        // Keeps scraping every interval.
        assert!(matches!(next(&mut outcomes).await, ScrapeOutcome::Good(_)));
        stop_tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("stops promptly")
            .unwrap();
    }

    #[tokio::test]
    async fn scrape_reports_missing_down_and_http_errors() {
        let client = shared_client();
        let t = Duration::from_secs(2);
        let (url, _h) = serve("200 OK", VLLM_V1.replace("vllm:", "vllm_")).await;
        match scrape_once(client, &url, None, t, EngineKind::Vllm, "vllm:").await {
            ScrapeOutcome::Missing { close } => {
                assert!(close.contains(&"vllm_num_requests_running".to_string()))
            }
            other => panic!("{other:?}"),
        }
        let (url, _h) = serve("401 Unauthorized", String::new()).await;
        match scrape_once(client, &url, Some("k3y"), t, EngineKind::Vllm, "vllm:").await {
            ScrapeOutcome::Down(why) => {
                assert!(why.contains("401") && !why.contains("k3y"), "{why}")
            }
            other => panic!("{other:?}"),
        }
        let (url, _h) = serve("200 OK", "<html>oops</html>".into()).await;
        assert!(matches!(
            scrape_once(client, &url, None, t, EngineKind::Vllm, "vllm:").await,
            ScrapeOutcome::Down(_)
        ));
        // Nothing listening.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/metrics", l.local_addr().unwrap());
        drop(l);
        match scrape_once(client, &url, Some("k3y"), t, EngineKind::Vllm, "vllm:").await {
            ScrapeOutcome::Down(why) => assert!(!why.contains("k3y"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn scrape_times_out_after_the_interval() {
        // Accepts and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/metrics", listener.local_addr().unwrap());
        let hold = tokio::spawn(async move {
            let mut socks = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                socks.push(s);
            }
        });
        let start = std::time::Instant::now();
        let o = scrape_once(
            shared_client(),
            &url,
            None,
            Duration::from_millis(200),
            EngineKind::Vllm,
            "vllm:",
        )
        .await;
        assert!(
            matches!(&o, ScrapeOutcome::Down(why) if why.contains("timed out")),
            "{o:?}"
        );
        assert!(start.elapsed() < Duration::from_secs(3));
        hold.abort();
    }

    #[tokio::test]
    async fn dropped_stop_sender_ends_the_loop() {
        let (url, _h) = serve("200 OK", VLLM_V0.to_string()).await;
        let (t, mut outcomes) = target(url, None, "vllm:");
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(scrape_loop(t, stop_rx));
        assert!(matches!(next(&mut outcomes).await, ScrapeOutcome::Good(_)));
        drop(stop_tx);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("stops")
            .unwrap();
    }
}
