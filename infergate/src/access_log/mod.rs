//! The access log: one line per request, text (logfmt) or JSON, written by a thread of its own.
//!
//! The proxy's `logging` hook renders a [`Line`] and hands it to a bounded queue ([`AccessLog::write`] never
//! blocks and never fails the request); the writer thread drains the queue into stderr or a file, flushing
//! whenever the queue runs empty. A slow or full disk therefore costs lines, never a worker: a line that finds
//! the queue full is dropped and counted in `infergate_access_log_dropped_total{cause="queue_full"}`, a line the
//! writer could not write in `{cause="write_error"}`.
//!
//! What a line holds is fixed here and nothing else: no header other than the request id, no body, no query
//! string (a client may put a key there), the session id only as a hash. Values the client chose (model, request
//! id, an unnormalisable path) are bounded in length and escaped.

use std::borrow::Cow;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::time::{Duration, Instant, SystemTime};

use prometheus::{IntCounter, IntCounterVec, Opts};

use crate::config::{AccessLogConfig, LogFormat, LogTarget};
use crate::metrics::Metrics;

/// Longest client-chosen value written (bytes); longer ones end in `...`.
pub const MAX_VALUE_BYTES: usize = 256;

/// Longest path written (bytes).
pub const MAX_PATH_BYTES: usize = 1024;

/// Per-request facts only the request path sees, kept in the proxy's context.
#[derive(Debug, Clone)]
pub struct RequestLog {
    /// When the request head had been read (the context is created then).
    pub start: Instant,
    pub start_wall: SystemTime,
    /// The first response body byte passed to the client.
    pub first_byte: Option<Instant>,
    /// Why the last failed attempt failed (Pingora's error type), for a request that then got the router's answer.
    pub upstream_error: Option<&'static str>,
    /// The code of the error the router answered a failed request with (`no_healthy_endpoint`, ...).
    pub router_error: Option<&'static str>,
}

impl Default for RequestLog {
    fn default() -> Self {
        RequestLog {
            start: Instant::now(),
            start_wall: SystemTime::now(),
            first_byte: None,
            upstream_error: None,
            router_error: None,
        }
    }
}

impl RequestLog {
    /// Note a response body chunk on its way to the client.
    pub fn body_chunk(&mut self, len: usize) {
        if self.first_byte.is_none() && len > 0 {
            self.first_byte = Some(Instant::now());
        }
    }
}

/// One access-log line. `None` renders as `-` (text) or `null` (JSON).
#[derive(Debug, Clone, Default)]
pub struct Line<'a> {
    /// When the request arrived (its head had been read).
    pub time: Option<SystemTime>,
    /// The TCP peer.
    pub client: Option<SocketAddr>,
    pub method: &'a str,
    /// The normalised path, no query string.
    pub path: &'a str,
    pub model: Option<&'a str>,
    pub pool: Option<&'a str>,
    /// `host:port` of the endpoint that served (or last failed) the request.
    pub endpoint: Option<&'a str>,
    /// Placement reason (`sticky`, `new_session`, ...).
    pub reason: Option<&'a str>,
    /// Status sent to the client; 0 when none was.
    pub status: u16,
    /// Estimated prefill tokens of the final attempt.
    pub tokens: Option<u64>,
    /// Arrival to the first response body byte sent.
    pub ttfb: Option<Duration>,
    /// Arrival to the end of the request.
    pub duration: Duration,
    /// Request body bytes received.
    pub bytes_in: u64,
    /// Response body bytes sent.
    pub bytes_out: u64,
    /// Attempts after the first (another endpoint, or a fresh connection to the same one).
    pub retries: u32,
    /// The client key's name (not the key).
    pub client_key: Option<&'a str>,
    /// Hash of the session header value (the session table's key), never the value.
    pub session: Option<u64>,
    pub request_id: &'a str,
    /// Why the request failed, when it did (Pingora's error type: `ConnectRefused`, `ReadTimedout`, ...).
    pub error: Option<&'a str>,
    /// The client's `User-Agent` (which SDK or agent, and its version).
    pub user_agent: Option<&'a str>,
}

impl Line<'_> {
    /// The line in `format`, without the trailing newline.
    pub fn render(&self, format: LogFormat) -> String {
        match format {
            LogFormat::Text => self.text(),
            LogFormat::Json => self.json(),
        }
    }

    fn time_text(&self) -> Option<String> {
        self.time
            .map(|t| humantime::format_rfc3339_millis(t).to_string())
    }

    /// logfmt: `key=value` separated by spaces; a value with a space, quote, `=`, backslash or control character is
    /// quoted and escaped; absent values are `-`.
    pub fn text(&self) -> String {
        let mut out = String::with_capacity(384);
        let mut put = |k: &str, v: Option<&str>| {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(k);
            out.push('=');
            push_logfmt(&mut out, v);
        };
        let ms = |d: Duration| format!("{:.3}", d.as_secs_f64() * 1000.0);
        put("time", self.time_text().as_deref());
        put("client", self.client.map(|a| a.to_string()).as_deref());
        put("method", Some(&bounded(self.method, MAX_VALUE_BYTES)));
        put("path", Some(&bounded(self.path, MAX_PATH_BYTES)));
        put(
            "model",
            self.model.map(|m| bounded(m, MAX_VALUE_BYTES)).as_deref(),
        );
        put("pool", self.pool);
        put("endpoint", self.endpoint);
        put("reason", self.reason);
        put("status", Some(&self.status.to_string()));
        put("tokens", self.tokens.map(|t| t.to_string()).as_deref());
        put("ttfb_ms", self.ttfb.map(ms).as_deref());
        put("duration_ms", Some(&ms(self.duration)));
        put("bytes_in", Some(&self.bytes_in.to_string()));
        put("bytes_out", Some(&self.bytes_out.to_string()));
        put("retries", Some(&self.retries.to_string()));
        put("client_key", self.client_key);
        put("session", self.session.map(session_hex).as_deref());
        put(
            "request_id",
            Some(&bounded(self.request_id, MAX_VALUE_BYTES)),
        );
        put("error", self.error);
        put(
            "user_agent",
            self.user_agent
                .map(|u| bounded(u, MAX_VALUE_BYTES))
                .as_deref(),
        );
        out
    }

    /// One JSON object with the same keys, in the same order, as the text form; absent values are `null`, numbers
    /// are numbers.
    pub fn json(&self) -> String {
        let ms = |d: Duration| (d.as_secs_f64() * 1_000_000.0).round() / 1000.0;
        let line = JsonLine {
            time: self.time_text(),
            client: self.client.map(|a| a.to_string()),
            method: bounded(self.method, MAX_VALUE_BYTES),
            path: bounded(self.path, MAX_PATH_BYTES),
            model: self.model.map(|m| bounded(m, MAX_VALUE_BYTES)),
            pool: self.pool,
            endpoint: self.endpoint,
            reason: self.reason,
            status: self.status,
            tokens: self.tokens,
            ttfb_ms: self.ttfb.map(ms),
            duration_ms: ms(self.duration),
            bytes_in: self.bytes_in,
            bytes_out: self.bytes_out,
            retries: self.retries,
            client_key: self.client_key,
            session: self.session.map(session_hex),
            request_id: bounded(self.request_id, MAX_VALUE_BYTES),
            error: self.error,
            user_agent: self.user_agent.map(|u| bounded(u, MAX_VALUE_BYTES)),
        };
        // Strings, numbers and options only: serialisation cannot fail.
        serde_json::to_string(&line).unwrap_or_default()
    }
}

/// The JSON form's fields, in the text form's order.
#[derive(serde::Serialize)]
struct JsonLine<'a> {
    time: Option<String>,
    client: Option<String>,
    method: Cow<'a, str>,
    path: Cow<'a, str>,
    model: Option<Cow<'a, str>>,
    pool: Option<&'a str>,
    endpoint: Option<&'a str>,
    reason: Option<&'a str>,
    status: u16,
    tokens: Option<u64>,
    ttfb_ms: Option<f64>,
    duration_ms: f64,
    bytes_in: u64,
    bytes_out: u64,
    retries: u32,
    client_key: Option<&'a str>,
    session: Option<String>,
    request_id: Cow<'a, str>,
    error: Option<&'a str>,
    user_agent: Option<Cow<'a, str>>,
}

/// A session hash as 16 hex digits.
pub fn session_hex(h: u64) -> String {
    format!("{h:016x}")
}

/// `s` cut to at most `max` bytes at a character boundary, `...` marking a cut.
fn bounded(s: &str, max: usize) -> Cow<'_, str> {
    if s.len() <= max {
        return s.into();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end]).into()
}

fn push_logfmt(out: &mut String, v: Option<&str>) {
    let Some(v) = v else {
        out.push('-');
        return;
    };
    let plain = !v.is_empty()
        && v != "-"
        && v.chars()
            .all(|c| !c.is_control() && !c.is_whitespace() && !matches!(c, '"' | '=' | '\\'));
    if plain {
        out.push_str(v);
        return;
    }
    out.push('"');
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:04x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The access log of one router: a bounded queue to the writer thread.
///
/// The thread starts with the first line, not when the log is opened: the router is built before Pingora
/// daemonizes (`-d` forks, and a thread does not survive a fork), the file is opened before (so before a change
/// of directory or user).
pub struct AccessLog {
    tx: SyncSender<String>,
    format: LogFormat,
    queue_full: IntCounter,
    writer: parking_lot::Mutex<Option<Writer>>,
    started: AtomicBool,
}

/// What the writer thread takes when it starts.
struct Writer {
    rx: Receiver<String>,
    out: Box<dyn Write + Send>,
    errors: IntCounter,
    /// The file to open again on [`request_reopen`]; None for stderr.
    path: Option<std::path::PathBuf>,
}

/// Bumped by [`request_reopen`]; each writer reopens its file when it sees a new value.
static REOPEN_GENERATION: AtomicU64 = AtomicU64::new(0);

/// Log rotation (SIGHUP): every access log file is opened again at its path before its next line, so that lines go
/// to the new file once the old one was renamed away. Lines already queued may still go to the old file.
pub fn request_reopen() {
    REOPEN_GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// Open (create, append, mode 0640) the access log file at `path`.
fn open_file(path: &std::path::Path) -> std::io::Result<Box<dyn Write + Send>> {
    let mut opts = std::fs::OpenOptions::new();
    opts.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o640);
    let file = opts.open(path)?;
    Ok(Box::new(std::io::BufWriter::with_capacity(64 * 1024, file)))
}

impl AccessLog {
    /// Open the target (a file is created if missing and appended to) and start the writer thread. The dropped
    /// counters are registered on `metrics`, both causes at 0.
    pub fn open(cfg: &AccessLogConfig, metrics: &Metrics) -> Result<AccessLog, String> {
        let (out, path): (Box<dyn Write + Send>, _) = match &cfg.target {
            LogTarget::Stderr => (Box::new(StderrLines), None),
            LogTarget::File(path) => (
                open_file(path)
                    .map_err(|e| format!("access_log.path: cannot open {}: {e}", path.display()))?,
                Some(path.clone()),
            ),
        };
        let dropped = IntCounterVec::new(
            Opts::new(
                "infergate_access_log_dropped_total",
                "Access-log lines lost: the writer's queue was full (slow disk) or the write failed.",
            ),
            &["cause"],
        )
        .map_err(|e| format!("access log metric: {e}"))?;
        let queue_full = dropped.with_label_values(&["queue_full"]);
        let write_error = dropped.with_label_values(&["write_error"]);
        metrics.register(Box::new(dropped));
        let (tx, rx) = std::sync::mpsc::sync_channel(cfg.buffer_lines.max(1));
        Ok(AccessLog {
            tx,
            format: cfg.format,
            queue_full,
            writer: parking_lot::Mutex::new(Some(Writer {
                rx,
                out,
                errors: write_error,
                path,
            })),
            started: AtomicBool::new(false),
        })
    }

    /// Start the writer thread, once.
    fn start_writer(&self) {
        if self.started.load(Ordering::Acquire) {
            return;
        }
        let Some(w) = self.writer.lock().take() else {
            return;
        };
        self.started.store(true, Ordering::Release);
        let started = std::thread::Builder::new()
            .name("infergate-access-log".into())
            .spawn(move || write_lines(w));
        if let Err(e) = started {
            log::error!("cannot start the access log writer, access-log lines are dropped: {e}");
        }
    }

    /// Queue one line; a full queue drops it (counted). Never blocks (beyond the first line's thread start).
    pub fn write(&self, line: &Line<'_>) {
        self.start_writer();
        let mut text = line.render(self.format);
        text.push('\n');
        match self.tx.try_send(text) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.queue_full.inc(),
            // The writer is gone (it never exits while a sender lives, unless it panicked).
            Err(TrySendError::Disconnected(_)) => self.queue_full.inc(),
        }
    }
}

/// Stderr, one `write` per line (unbuffered, so lines interleave whole with the diagnostic log).
struct StderrLines;

impl Write for StderrLines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::io::stderr().lock().write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// The writer thread: drain the queue, flush when it runs empty, end when every sender is gone; reopen the file
/// before a batch when [`request_reopen`] was called.
fn write_lines(w: Writer) {
    let Writer {
        rx,
        mut out,
        errors,
        path,
    } = w;
    let mut generation = REOPEN_GENERATION.load(Ordering::Acquire);
    let mut last_warning: Option<Instant> = None;
    let mut warn = |e: std::io::Error| {
        if last_warning.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
            last_warning = Some(Instant::now());
            log::warn!("access log: write failed, lines are being dropped: {e}");
        }
    };
    while let Ok(first) = rx.recv() {
        let wanted = REOPEN_GENERATION.load(Ordering::Acquire);
        if let (true, Some(path)) = (wanted != generation, &path) {
            generation = wanted;
            let _ = out.flush();
            match open_file(path) {
                Ok(file) => out = file,
                // Keep writing to the old file rather than losing lines.
                Err(e) => log::warn!(
                    "access log: cannot reopen {}: {e}; writing on to the file open before",
                    path.display()
                ),
            }
        }
        let mut next = Some(first);
        while let Some(line) = next {
            if let Err(e) = out.write_all(line.as_bytes()) {
                errors.inc();
                warn(e);
            }
            next = rx.try_recv().ok();
        }
        if let Err(e) = out.flush() {
            warn(e);
        }
    }
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Line<'static> {
        Line {
            time: Some(SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123)),
            client: Some("127.0.0.1:5555".parse().unwrap()),
            method: "POST",
            path: "/v1/chat/completions",
            model: Some("llama 3 \"70b\""),
            pool: Some("default"),
            endpoint: Some("10.0.0.5:8000"),
            reason: Some("sticky"),
            status: 200,
            tokens: Some(1234),
            ttfb: Some(Duration::from_micros(12_345)),
            duration: Duration::from_micros(1_500_250),
            bytes_in: 4096,
            bytes_out: 777,
            retries: 1,
            client_key: None,
            session: Some(0xab),
            request_id: "req-1",
            error: None,
            user_agent: Some("OpenAI/Python 1.109.1"),
        }
    }

    #[test]
    fn text_is_logfmt_with_quoting_and_dashes() {
        assert_eq!(
            sample().text(),
            "time=2023-11-14T22:13:20.123Z client=127.0.0.1:5555 method=POST path=/v1/chat/completions \
             model=\"llama 3 \\\"70b\\\"\" pool=default endpoint=10.0.0.5:8000 reason=sticky status=200 tokens=1234 \
             ttfb_ms=12.345 duration_ms=1500.250 bytes_in=4096 bytes_out=777 retries=1 client_key=- \
             session=00000000000000ab request_id=req-1 error=- user_agent=\"OpenAI/Python 1.109.1\""
        );
        let mut l = sample();
        l.model = Some("a\nb=c\u{7}");
        l.request_id = "-";
        let t = l.text();
        assert!(t.contains(r#"model="a\nb=c\u{0007}""#), "{t}");
        assert!(
            t.contains(r#"request_id="-""#),
            "a real `-` is not an absent value: {t}"
        );
        assert_eq!(t.lines().count(), 1);
    }

    #[test]
    fn json_has_the_same_keys_numbers_and_nulls() {
        let v: serde_json::Value = serde_json::from_str(&sample().json()).unwrap();
        assert_eq!(v["time"], "2023-11-14T22:13:20.123Z");
        assert_eq!(v["model"], "llama 3 \"70b\"");
        assert_eq!(v["status"], 200);
        assert_eq!(v["ttfb_ms"], 12.345);
        assert_eq!(v["duration_ms"], 1500.25);
        assert_eq!(v["client_key"], serde_json::Value::Null);
        assert_eq!(v["session"], "00000000000000ab");
        assert_eq!(v["user_agent"], "OpenAI/Python 1.109.1");
        assert_eq!(v.as_object().unwrap().len(), 20);
        // Same keys in the same order (values without spaces, so the text splits on spaces).
        let mut l = sample();
        l.model = Some("m");
        l.user_agent = Some("curl/8.0");
        let (text, json) = (l.text(), l.json());
        let keys: Vec<&str> = text
            .split(' ')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, _)| k)
            .collect();
        assert_eq!(keys.len(), 20);
        let at: Vec<usize> = keys
            .iter()
            .map(|k| {
                json.find(&format!("\"{k}\":"))
                    .unwrap_or_else(|| panic!("{k} in {json}"))
            })
            .collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{json}");
    }

    #[test]
    fn client_values_are_bounded() {
        let long = "m".repeat(10_000);
        let mut l = sample();
        l.model = Some(&long);
        l.user_agent = Some(&long);
        let v: serde_json::Value = serde_json::from_str(&l.json()).unwrap();
        assert_eq!(v["model"].as_str().unwrap().len(), MAX_VALUE_BYTES + 3);
        assert_eq!(v["user_agent"].as_str().unwrap().len(), MAX_VALUE_BYTES + 3);
        assert_eq!(bounded("ééé", 3), "é...");
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_blocking() {
        let metrics = Metrics::new();
        let path = std::env::temp_dir().join(format!(
            "infergate-access-log-test-{}.log",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let cfg = AccessLogConfig {
            format: LogFormat::Json,
            target: LogTarget::File(path.clone()),
            buffer_lines: 1,
        };
        let log = AccessLog::open(&cfg, &metrics).unwrap();
        let text = String::from_utf8(metrics.render()).unwrap();
        assert!(text.contains("infergate_access_log_dropped_total{cause=\"queue_full\"} 0"));
        assert!(text.contains("infergate_access_log_dropped_total{cause=\"write_error\"} 0"));
        let start = Instant::now();
        for _ in 0..10_000 {
            log.write(&sample());
        }
        assert!(start.elapsed() < Duration::from_secs(5));
        drop(log);
        // The writer drains what was queued and exits once the sender is gone.
        let dropped = {
            let text = String::from_utf8(metrics.render()).unwrap();
            text.lines()
                .find(|l| l.starts_with("infergate_access_log_dropped_total{cause=\"queue_full\"}"))
                .and_then(|l| l.rsplit(' ').next()?.parse::<usize>().ok())
                .unwrap()
        };
        let mut written = 0;
        for _ in 0..500 {
            written = std::fs::read_to_string(&path).unwrap().lines().count();
            if written + dropped >= 10_000 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(written + dropped, 10_000, "every line written or counted");
        assert!(written >= 1, "some lines were written");
        for l in std::fs::read_to_string(&path).unwrap().lines() {
            serde_json::from_str::<serde_json::Value>(l).unwrap();
        }
        let _ = std::fs::remove_file(&path);
    }
}
