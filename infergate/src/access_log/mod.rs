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
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;
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
    /// The time to first token `predicted_ttft` predicted for the endpoint at placement.
    pub predicted_ttft: Option<Duration>,
    /// Arrival to the first response body byte sent.
    pub ttfb: Option<Duration>,
    /// The final attempt's dispatch to its first output (a successful answer's): the measured time to first token.
    pub ttft: Option<Duration>,
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
    /// The request's trace (32 hex digits), when it was traced (`tracing`).
    pub trace_id: Option<&'a str>,
    /// Why the request failed, when it did (Pingora's error type: `ConnectRefused`, `ReadTimedout`, ...).
    pub error: Option<&'a str>,
    /// The client's `User-Agent` (which SDK or agent, and its version).
    pub user_agent: Option<&'a str>,
    /// A disaggregated pool's request: the endpoint that ran its prefill leg (`endpoint` ran the decode leg).
    pub prefill_endpoint: Option<&'a str>,
    /// The prefill leg's time, its first dispatch to its answer.
    pub prefill: Option<Duration>,
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
        put("predicted_ttft_ms", self.predicted_ttft.map(ms).as_deref());
        put("ttfb_ms", self.ttfb.map(ms).as_deref());
        put("ttft_ms", self.ttft.map(ms).as_deref());
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
        put("trace_id", self.trace_id);
        put("error", self.error);
        put(
            "user_agent",
            self.user_agent
                .map(|u| bounded(u, MAX_VALUE_BYTES))
                .as_deref(),
        );
        put("prefill_endpoint", self.prefill_endpoint);
        put("prefill_ms", self.prefill.map(ms).as_deref());
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
            predicted_ttft_ms: self.predicted_ttft.map(ms),
            ttfb_ms: self.ttfb.map(ms),
            ttft_ms: self.ttft.map(ms),
            duration_ms: ms(self.duration),
            bytes_in: self.bytes_in,
            bytes_out: self.bytes_out,
            retries: self.retries,
            client_key: self.client_key,
            session: self.session.map(session_hex),
            request_id: bounded(self.request_id, MAX_VALUE_BYTES),
            trace_id: self.trace_id,
            error: self.error,
            user_agent: self.user_agent.map(|u| bounded(u, MAX_VALUE_BYTES)),
            prefill_endpoint: self.prefill_endpoint,
            prefill_ms: self.prefill.map(ms),
        };
        // Strings, numbers and options only: serialisation cannot fail.
        escape_forging(serde_json::to_string(&line).unwrap_or_default())
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
    predicted_ttft_ms: Option<f64>,
    ttfb_ms: Option<f64>,
    ttft_ms: Option<f64>,
    duration_ms: f64,
    bytes_in: u64,
    bytes_out: u64,
    retries: u32,
    client_key: Option<&'a str>,
    session: Option<String>,
    request_id: Cow<'a, str>,
    trace_id: Option<&'a str>,
    error: Option<&'a str>,
    user_agent: Option<Cow<'a, str>>,
    prefill_endpoint: Option<&'a str>,
    prefill_ms: Option<f64>,
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

/// Characters a line splitter or a terminal may honour as a line break or a change of direction, beyond the ASCII
/// controls: NEL, the Unicode line and paragraph separators, and the bidirectional marks, embeddings, overrides and
/// isolates. Written escaped in both formats, so a client's text cannot forge or disguise a line.
fn forging(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{061c}' | '\u{200e}' | '\u{200f}'
        )
        || ('\u{202a}'..='\u{202e}').contains(&c)
        || ('\u{2066}'..='\u{2069}').contains(&c)
}

/// A JSON line with every [`forging`] character as a `\uXXXX` escape (serde_json escapes only the ASCII controls;
/// the others can only stand inside strings, where the escape means the same character).
fn escape_forging(line: String) -> String {
    if !line.chars().any(forging) {
        return line;
    }
    let mut out = String::with_capacity(line.len() + 16);
    for c in line.chars() {
        if forging(c) {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

fn push_logfmt(out: &mut String, v: Option<&str>) {
    let Some(v) = v else {
        out.push('-');
        return;
    };
    let plain = !v.is_empty()
        && v != "-"
        && v.chars()
            .all(|c| !forging(c) && !c.is_whitespace() && !matches!(c, '"' | '=' | '\\'));
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
            c if forging(c) => out.push_str(&format!("\\u{{{:04x}}}", u32::from(c))),
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
    progress: Arc<Progress>,
    format: LogFormat,
    queue_full: IntCounter,
    writer: parking_lot::Mutex<Option<Writer>>,
    started: AtomicBool,
}

/// What the writer thread takes when it starts.
struct Writer {
    rx: Receiver<String>,
    progress: Arc<Progress>,
    out: Box<dyn Write + Send>,
    errors: IntCounter,
    /// The file to open again on [`request_reopen`]; None for stderr.
    path: Option<std::path::PathBuf>,
}

/// Lines queued, and lines the writer has handled (written and flushed, or failed): [`LogSync`] waits for the
/// second to reach the first.
#[derive(Default)]
struct Progress {
    queued: AtomicU64,
    handled: AtomicU64,
}

/// Waits for an access log to write what is queued (the graceful shutdown, before the process exits).
#[derive(Clone)]
pub struct LogSync(Arc<Progress>);

impl LogSync {
    /// Block until every line queued so far is written and flushed, at most `within`; false if it was not.
    pub fn wait(&self, within: Duration) -> bool {
        let target = self.0.queued.load(Ordering::Acquire);
        let start = Instant::now();
        while self.0.handled.load(Ordering::Acquire) < target {
            if start.elapsed() >= within {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }
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
        let progress = Arc::new(Progress::default());
        Ok(AccessLog {
            tx,
            progress: progress.clone(),
            format: cfg.format,
            queue_full,
            writer: parking_lot::Mutex::new(Some(Writer {
                rx,
                progress,
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

    /// A handle that waits for this log to write what is queued.
    pub fn sync_handle(&self) -> LogSync {
        LogSync(self.progress.clone())
    }

    /// Queue one line; a full queue drops it (counted). Never blocks (beyond the first line's thread start).
    pub fn write(&self, line: &Line<'_>) {
        self.start_writer();
        let mut text = line.render(self.format);
        text.push('\n');
        // Counted before the send, so that the writer never handles more than was queued.
        self.progress.queued.fetch_add(1, Ordering::AcqRel);
        match self.tx.try_send(text) {
            Ok(()) => {}
            Err(_) => {
                // Full, or the writer is gone (it never exits while a sender lives, unless it panicked).
                self.progress.queued.fetch_sub(1, Ordering::AcqRel);
                self.queue_full.inc();
            }
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
        progress,
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
        let mut lines = 0;
        while let Some(line) = next {
            if let Err(e) = out.write_all(line.as_bytes()) {
                errors.inc();
                warn(e);
            }
            lines += 1;
            next = rx.try_recv().ok();
        }
        if let Err(e) = out.flush() {
            warn(e);
        }
        progress.handled.fetch_add(lines, Ordering::AcqRel);
    }
    let _ = out.flush();
}

#[cfg(test)]
mod tests;
