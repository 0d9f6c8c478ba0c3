//! loadgen: replays agent-session traffic against any OpenAI-compatible base URL (a router or engines) and
//! reports TTFT, slow-request decode speed, per-engine work shares and router overhead. The `loadgen` binary is
//! a thin CLI over [`run`]; see `loadgen --help` ([`cli::Cli`]).
//!
//! Scenarios ([`Scenario`]):
//! - `agent`: sessions arrive as a Poisson process (or a burst); each sends a bimodal first turn and 3–8 later
//!   turns that append to the same conversation after a think time; streamed; per-session text is unique.
//! - `burst`: long-running background streams first, then a chatty warm-up session, then 8 new long sessions
//!   within 100 ms; reports how the new sessions split over the engines.
//! - `shared-prefix`: `agent` whose sessions all open with one shared system prompt and tool list
//!   (`--system-prompt-tokens`, 16k unless given), so cross-session prefix-cache locality matters.
//! - `mixed`: `agent` plus single-turn chats without the session header (Poisson, `--chat-rate`).
//! - `overhead`: tiny non-streaming requests at fixed concurrency, straight to an engine and through the router
//!   in the same run: added latency, requests/s and the router's CPU time.
//!
//! Layout: `text` (pseudo-English with exact token counts), `workload` (session plans), `client` (one request
//! and its timings), `stats` (percentiles, CV, engine totals, /proc CPU), `report` (JSON + table), `agent`,
//! `burst`, `overhead` (the scenarios), `cli` (argument parsing, clap). Talks HTTP only: nothing of the router's
//! internals is used.

mod agent;
mod burst;
pub mod cli;
pub mod client;
pub mod mixed;
mod overhead;
pub mod report;
pub mod stats;
pub mod text;
pub mod workload;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use client::FieldOrder;
pub use report::Report;
pub use workload::{Arrival, Range, SecRange, Shape};

use client::{Live, Outcome};

/// Which traffic to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    Agent,
    SharedPrefix,
    Mixed,
    Burst,
    Overhead,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Agent => "agent",
            Scenario::SharedPrefix => "shared-prefix",
            Scenario::Mixed => "mixed",
            Scenario::Burst => "burst",
            Scenario::Overhead => "overhead",
        }
    }
}

/// Everything a run needs; [`cli::parse_args`] builds one from the command line.
#[derive(Debug, Clone)]
pub struct Config {
    pub scenario: Scenario,
    /// Base URLs requests go to (a router, or engines: sessions are then spread over them round-robin).
    pub urls: Vec<String>,
    /// Overhead scenario: an engine's base URL, measured without the router.
    pub direct_url: Option<String>,
    /// Base URLs of the simulated engines whose `/sim/stats` give per-engine shares.
    pub engine_stats_urls: Vec<String>,
    pub model: String,
    pub seed: u64,
    /// Agent: number of sessions.
    pub sessions: usize,
    pub arrival: Arrival,
    pub shape: Shape,
    /// Header carrying the session id (None: no header).
    pub session_header: Option<String>,
    /// Agent: each turn goes to a random URL of `urls` (seeded by the session), not all to the session's one.
    pub spread_turns: bool,
    /// Tokens of a system prompt shared by every session (0: none).
    pub system_prompt_tokens: u64,
    pub stream: bool,
    /// Key order of every request body (default: openai-python's, `messages` first).
    pub field_order: FieldOrder,
    /// Multiplies think times and arrival gaps (match the engines' `--time-scale`).
    pub time_scale: f64,
    /// Hard limit on the whole run (wall-clock seconds).
    pub max_seconds: f64,
    /// Limit on one request (wall-clock seconds).
    pub request_timeout: f64,
    pub json: Option<PathBuf>,
    /// One JSON line per finished request (timings, tokens, serving endpoint), for analysing a run.
    pub trace: Option<PathBuf>,
    pub label: String,
    /// Progress line on stderr once per second.
    pub progress: bool,
    /// Burst: new sessions, window, and their first-turn tokens (before `shape.size_scale`).
    pub burst_sessions: usize,
    pub burst_window_ms: f64,
    pub burst_tokens: Range,
    /// Burst: long-running background streams (default 2 per engine stats URL).
    pub background_streams: Option<usize>,
    pub background_tokens: u64,
    pub background_max_tokens: u64,
    /// Burst: short turns of one warm-up session sent before the burst (builds a request history).
    pub warm_turns: usize,
    /// Overhead: workers, requests per target, and rounds (targets alternate each round).
    pub concurrency: usize,
    pub requests: usize,
    pub rounds: usize,
    /// Overhead: the router process (its CPU time is read from /proc before and after).
    pub router_pid: Option<u32>,
    /// Mixed: single-turn chats without the session header, their arrival rate (per simulated second) and
    /// prompt tokens (before `shape.size_scale`).
    pub chat_requests: usize,
    pub chat_rate: f64,
    pub chat_tokens: Range,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            scenario: Scenario::Agent,
            urls: Vec::new(),
            direct_url: None,
            engine_stats_urls: Vec::new(),
            model: "sim-model".into(),
            seed: 1,
            sessions: 50,
            arrival: Arrival::Poisson { rate: 1.0 },
            shape: Shape::default(),
            session_header: Some("x-session-id".into()),
            spread_turns: false,
            system_prompt_tokens: 0,
            stream: true,
            field_order: FieldOrder::default(),
            time_scale: 1.0,
            max_seconds: 600.0,
            request_timeout: 600.0,
            json: None,
            trace: None,
            label: String::new(),
            progress: true,
            burst_sessions: 8,
            burst_window_ms: 100.0,
            burst_tokens: Range::new(60_000, 100_000),
            background_streams: None,
            background_tokens: 2_000,
            background_max_tokens: 1_000_000,
            warm_turns: 12,
            concurrency: 8,
            requests: 2_000,
            rounds: 2,
            router_pid: None,
            chat_requests: 100,
            chat_rate: 1.0,
            chat_tokens: Range::new(100, 2_000),
        }
    }
}

impl Config {
    pub fn validate(&self) -> Result<(), String> {
        if self.urls.is_empty() {
            return Err("no target: give --url".into());
        }
        for u in self
            .urls
            .iter()
            .chain(&self.direct_url)
            .chain(&self.engine_stats_urls)
        {
            if !u.starts_with("http://") {
                return Err(format!("{u}: only http:// URLs are supported"));
            }
        }
        if !(self.time_scale.is_finite() && self.time_scale >= 0.0) {
            return Err("--time-scale must be >= 0".into());
        }
        if !(self.max_seconds.is_finite() && self.max_seconds > 0.0) {
            return Err("--max-seconds must be > 0".into());
        }
        if !(self.request_timeout.is_finite() && self.request_timeout > 0.0) {
            return Err("--request-timeout must be > 0".into());
        }
        if let Arrival::Poisson { rate } = self.arrival {
            if !(rate.is_finite() && rate > 0.0) {
                return Err("--rate must be > 0".into());
            }
        }
        if !(self.shape.size_scale.is_finite() && self.shape.size_scale > 0.0) {
            return Err("--size-scale must be > 0".into());
        }
        match self.scenario {
            Scenario::Agent | Scenario::SharedPrefix | Scenario::Mixed if self.sessions == 0 => {
                Err("--sessions must be >= 1".into())
            }
            Scenario::Mixed if !(self.chat_rate.is_finite() && self.chat_rate > 0.0) => {
                Err("--chat-rate must be > 0".into())
            }
            Scenario::Burst if self.engine_stats_urls.is_empty() => {
                Err("burst needs --engine-stats-url for every engine (the split is read from /sim/stats)".into())
            }
            Scenario::Burst if self.burst_sessions == 0 => Err("--burst-sessions must be >= 1".into()),
            Scenario::Overhead if self.concurrency == 0 || self.requests == 0 || self.rounds == 0 => {
                Err("--concurrency, --requests and --rounds must be >= 1".into())
            }
            _ => Ok(()),
        }
    }
}

/// Runs the configured scenario and returns its report (also written to `cfg.json` when set).
pub async fn run(cfg: &Config) -> Result<Report, String> {
    cfg.validate()?;
    let mut report = match cfg.scenario {
        Scenario::Agent => agent::run(cfg).await?,
        Scenario::SharedPrefix => agent::run(&mixed::shared_prefix_config(cfg)).await?,
        Scenario::Mixed => mixed::run(cfg).await?,
        Scenario::Burst => burst::run(cfg).await?,
        Scenario::Overhead => overhead::run(cfg).await?,
    };
    report.scenario = cfg.scenario.name().into();
    report.label = cfg.label.clone();
    report.seed = cfg.seed;
    report.time_scale = cfg.time_scale;
    report.field_order = cfg.field_order.name().into();
    if let Some(path) = &cfg.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(report)
}

/// What is kept of one finished request.
#[derive(Debug, Clone)]
struct Rec {
    error: Option<String>,
    headers_ms: Option<f64>,
    ttft_ms: Option<f64>,
    total_ms: f64,
    decode: Option<f64>,
    chunks: u64,
    usage_prompt: Option<u64>,
    usage_cached: Option<u64>,
    /// Turn of its session (0: a first turn or a request outside any session).
    turn: usize,
    /// Seconds from the run's start to sending.
    sent_s: Option<f64>,
    endpoint: Option<String>,
    /// The session's id (None outside any session).
    session: Option<String>,
}

impl Rec {
    fn of(o: &Outcome) -> Rec {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        Rec {
            error: o.error.clone(),
            headers_ms: o.headers_at.map(ms),
            ttft_ms: o.first_token_at.map(ms),
            total_ms: ms(o.total),
            decode: o.decode_rate(),
            chunks: o.chunks,
            usage_prompt: o.usage_prompt_tokens,
            usage_cached: o.usage_cached_tokens,
            turn: 0,
            sent_s: None,
            endpoint: o.endpoint.clone(),
            session: None,
        }
    }

    fn trace_line(&self) -> serde_json::Value {
        serde_json::json!({
            "session": self.session, "turn": self.turn, "sent_s": self.sent_s, "ttft_ms": self.ttft_ms,
            "decode_tok_s": self.decode, "chunks": self.chunks, "prompt_tokens": self.usage_prompt,
            "cached_tokens": self.usage_cached, "endpoint": self.endpoint, "error": self.error,
        })
    }
}

/// State shared by the tasks of one run.
struct Run {
    client: reqwest::Client,
    live: Live,
    recs: Mutex<Vec<Rec>>,
    started: Instant,
    started_unix: u64,
    deadline: tokio::time::Instant,
    request_timeout: Duration,
    sessions_completed: std::sync::atomic::AtomicU64,
    sessions_failed: std::sync::atomic::AtomicU64,
}

impl Run {
    fn new(cfg: &Config, pool_per_host: usize) -> Arc<Run> {
        Arc::new(Run {
            client: client::http_client(pool_per_host),
            live: Live::default(),
            recs: Mutex::new(Vec::new()),
            started: Instant::now(),
            started_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            deadline: tokio::time::Instant::now() + Duration::from_secs_f64(cfg.max_seconds),
            request_timeout: Duration::from_secs_f64(cfg.request_timeout),
            sessions_completed: Default::default(),
            sessions_failed: Default::default(),
        })
    }

    fn rec(&self, o: &Outcome) -> Rec {
        let sent_s = o
            .sent_at
            .map(|t| t.saturating_duration_since(self.started).as_secs_f64());
        Rec {
            sent_s,
            ..Rec::of(o)
        }
    }

    fn record(&self, o: &Outcome) {
        let r = self.rec(o);
        self.recs.lock().unwrap().push(r);
    }

    /// `record`, for turn `turn` of session `session` (follow-up turns get their own TTFT figure).
    fn record_turn(&self, o: &Outcome, turn: usize, session: Option<&str>) {
        let r = Rec {
            turn,
            session: session.map(str::to_owned),
            ..self.rec(o)
        };
        self.recs.lock().unwrap().push(r);
    }

    /// Writes every recorded request as one JSON line to `path`.
    fn write_trace(&self, path: &std::path::Path) -> Result<(), String> {
        let mut text = String::new();
        for r in self.recs.lock().unwrap().iter() {
            text.push_str(&r.trace_line().to_string());
            text.push('\n');
        }
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The request-level part of the report, from every recorded request.
    fn fill(&self, r: &mut Report) {
        let recs = self.recs.lock().unwrap();
        r.started_unix = self.started_unix;
        r.wall_seconds = self.started.elapsed().as_secs_f64();
        r.ok = recs.iter().filter(|x| x.error.is_none()).count() as u64;
        r.errors = recs.len() as u64 - r.ok;
        r.unfinished = self.live.in_flight();
        r.requests = recs.len() as u64 + r.unfinished;
        let mut kinds = BTreeMap::new();
        for e in recs.iter().filter_map(|x| x.error.as_ref()) {
            *kinds.entry(e.clone()).or_insert(0) += 1;
        }
        r.error_kinds = kinds;
        let ok = || recs.iter().filter(|x| x.error.is_none());
        r.ttft_ms = stats::summarize(&ok().filter_map(|x| x.ttft_ms).collect::<Vec<_>>());
        r.ttft_followup_ms = stats::summarize(
            &ok()
                .filter(|x| x.turn > 0)
                .filter_map(|x| x.ttft_ms)
                .collect::<Vec<_>>(),
        );
        r.headers_ms = stats::summarize(&ok().filter_map(|x| x.headers_ms).collect::<Vec<_>>());
        r.decode = stats::decode_stats(&ok().filter_map(|x| x.decode).collect::<Vec<_>>());
        r.output_tokens = recs.iter().map(|x| x.chunks).sum();
        r.usage_prompt_tokens = recs.iter().filter_map(|x| x.usage_prompt).sum();
        r.usage_cached_tokens = recs.iter().filter_map(|x| x.usage_cached).sum();
        r.sessions.completed = self.sessions_completed.load(Ordering::Relaxed);
        r.sessions.failed = self.sessions_failed.load(Ordering::Relaxed);
        r.sessions.started = self.live.sessions_started.load(Ordering::Relaxed);
    }

    /// Prints a progress line to stderr once per second until the returned handle is aborted.
    fn progress(
        self: &Arc<Self>,
        enabled: bool,
        planned: u64,
    ) -> Option<tokio::task::JoinHandle<()>> {
        if !enabled {
            return None;
        }
        let run = self.clone();
        Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            let mut last_chunks = 0;
            // Bounded: at most one line per second for the longest allowed run (the caller aborts it earlier).
            for _ in 0..1_000_000u32 {
                tick.tick().await;
                let l = &run.live;
                let chunks = l.chunks.load(Ordering::Relaxed);
                let (p50, p95) = {
                    let recs = run.recs.lock().unwrap();
                    let mut t: Vec<f64> = recs
                        .iter()
                        .filter_map(|x| x.ttft_ms.or(Some(x.total_ms)))
                        .collect();
                    t.sort_by(f64::total_cmp);
                    (stats::percentile(&t, 50.0), stats::percentile(&t, 95.0))
                };
                let sessions = if planned > 0 {
                    format!(
                        "sessions {}/{} done {} | ",
                        l.sessions_started.load(Ordering::Relaxed),
                        planned,
                        l.sessions_done.load(Ordering::Relaxed)
                    )
                } else {
                    String::new()
                };
                let line = format!(
                    "[{:>5.0}s] {sessions}requests {} ok {} err {} in flight {} | TTFT p50 {:.0} ms p95 {:.0} ms | {} tok/s\n",
                    run.started.elapsed().as_secs_f64(),
                    l.sent.load(Ordering::Relaxed),
                    l.ok.load(Ordering::Relaxed),
                    l.errors.load(Ordering::Relaxed),
                    l.in_flight(),
                    p50,
                    p95,
                    chunks - last_chunks
                );
                last_chunks = chunks;
                let _ = std::io::stderr().write_all(line.as_bytes());
            }
        }))
    }
}

/// The end of a scenario's run (after its drive ended or timed out): stop what still runs, fill the report and the
/// engines' figures between `before` and now.
async fn finish<T: 'static>(
    run: &Run,
    cfg: &Config,
    mut report: Report,
    before: Result<Vec<stats::EngineTotals>, String>,
    mut set: tokio::task::JoinSet<T>,
    progress: Option<tokio::task::JoinHandle<()>>,
) -> Report {
    set.abort_all();
    while set.join_next().await.is_some() {}
    if let Some(p) = progress {
        p.abort();
    }
    run.fill(&mut report);
    if let Some(path) = &cfg.trace {
        if let Err(e) = run.write_trace(path) {
            eprintln!("loadgen: --trace: {e}");
        }
    }
    match (before, snapshot(run, &cfg.engine_stats_urls).await) {
        (Ok(b), Ok(a)) => {
            report.engines = Some(stats::engine_report(&cfg.engine_stats_urls, &b, &a))
        }
        (Err(e), _) | (_, Err(e)) => {
            if !cfg.engine_stats_urls.is_empty() {
                report.engine_stats_error = Some(e);
            }
        }
    }
    report
}

/// Per-engine totals now, or the reason they cannot be read.
async fn snapshot(run: &Run, urls: &[String]) -> Result<Vec<stats::EngineTotals>, String> {
    if urls.is_empty() {
        return Err("no --engine-stats-url given".into());
    }
    stats::fetch_all(&run.client, urls).await
}

/// Request headers for a session.
fn session_headers(cfg: &Config, id: &str) -> Vec<(String, String)> {
    cfg.session_header
        .iter()
        .map(|h| (h.clone(), id.to_string()))
        .collect()
}
