//! Command-line parsing for the `loadgen` binary (clap derive). Every default comes from [`Config::default`]
//! and [`Shape::default`], so the help cannot drift from the library.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser, ValueEnum};

use super::client::FieldOrder;
use super::workload::{Arrival, Range, SecRange, Shape};
use super::{Config, Scenario};

const COMMON: &str = "Common";
const AGENT: &str = "Agent (multi-turn sessions)";
const BURST: &str = "Burst (needs one --engine-stats-url per engine)";
const OVERHEAD: &str = "Overhead (tiny non-streaming requests, max_tokens 1)";
const MIXED: &str = "Mixed (agent sessions plus single-turn chats without the session header)";

/// How agent sessions arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ArrivalKind {
    Poisson,
    Burst,
}

/// `MIN-MAX` or a single value.
fn range(v: &str) -> Result<Range, String> {
    let (a, b) = v.split_once('-').unwrap_or((v, v));
    let num = |x: &str| {
        x.trim()
            .parse::<u64>()
            .map_err(|_| format!("expected MIN-MAX or one value (whole numbers), got '{v}'"))
    };
    let r = Range::new(num(a)?, num(b)?);
    if r.min > r.max {
        return Err(format!("MIN above MAX in '{v}'"));
    }
    Ok(r)
}

/// `MIN-MAX` seconds (or a single value), 0 <= MIN <= MAX.
fn sec_range(v: &str) -> Result<SecRange, String> {
    let (a, b) = v.split_once('-').unwrap_or((v, v));
    let num = |x: &str| {
        x.trim()
            .parse::<f64>()
            .map_err(|_| format!("expected MIN-MAX or one value (seconds), got '{v}'"))
    };
    let r = SecRange {
        min: num(a)?,
        max: num(b)?,
    };
    if !(r.min.is_finite() && r.max.is_finite() && 0.0 <= r.min && r.min <= r.max) {
        return Err(format!("expected 0 <= MIN <= MAX, got '{v}'"));
    }
    Ok(r)
}

/// The `loadgen` command line.
#[derive(Debug, Parser)]
#[command(
    name = "loadgen",
    about = "loadgen: replays agent-session traffic against an OpenAI-compatible base URL (router or engines)",
    override_usage = "loadgen --scenario agent --url http://127.0.0.1:8000 [--engine-stats-url URL ...] [OPTIONS]\n       \
                      loadgen --scenario burst --url ROUTER --engine-stats-url E1 --engine-stats-url E2 [OPTIONS]\n       \
                      loadgen --scenario overhead --url ROUTER --direct-url ENGINE [--router-pid PID] [OPTIONS]",
    next_line_help = true
)]
pub struct Cli {
    /// Which traffic to send: multi-turn agent sessions (agent; shared-prefix: all opening with one shared
    /// system prompt and tool list; mixed: plus single-turn chats without the session header), a burst of new
    /// long sessions on busy engines, or
    /// router overhead
    #[arg(long, value_enum, default_value_t = Config::default().scenario, help_heading = COMMON)]
    pub scenario: Scenario,
    /// Base URL requests go to (repeatable: sessions are spread over several URLs round-robin, e.g. engines
    /// without a router)
    #[arg(long = "url", value_name = "URL", help_heading = COMMON)]
    pub urls: Vec<String>,
    /// A simulated engine's base URL (repeatable); its GET /sim/stats before and after the run gives
    /// per-engine request and computed-token shares
    #[arg(long = "engine-stats-url", value_name = "URL", help_heading = COMMON)]
    pub engine_stats_urls: Vec<String>,
    /// "model" of every request
    #[arg(long, value_name = "NAME", default_value_t = Config::default().model, help_heading = COMMON)]
    pub model: String,
    /// Seed of every random choice and text
    #[arg(long, value_name = "N", default_value_t = Config::default().seed, help_heading = COMMON)]
    pub seed: u64,
    /// Multiply think times and arrival gaps (match engine-sim --time-scale). Reported times are wall-clock
    #[arg(long, value_name = "F", allow_negative_numbers = true, default_value_t = Config::default().time_scale,
          help_heading = COMMON)]
    pub time_scale: f64,
    /// Hard limit on the whole run, seconds
    #[arg(long, value_name = "S", allow_negative_numbers = true, default_value_t = Config::default().max_seconds,
          help_heading = COMMON)]
    pub max_seconds: f64,
    /// Limit on one request, seconds
    #[arg(long, value_name = "S", allow_negative_numbers = true,
          default_value_t = Config::default().request_timeout, help_heading = COMMON)]
    pub request_timeout: f64,
    /// Also write the report as JSON
    #[arg(long, value_name = "FILE", help_heading = COMMON)]
    pub json: Option<PathBuf>,
    /// Also write one JSON line per finished request (sent time, TTFT, decode rate, tokens, serving endpoint)
    #[arg(long, value_name = "FILE", help_heading = COMMON)]
    pub trace: Option<PathBuf>,
    /// Key order of request bodies: messages-first is what openai-python 1.x sends (messages, model, ...);
    /// model-first is what infergate's tools sent before
    #[arg(long, value_enum, default_value_t = Config::default().field_order, help_heading = COMMON)]
    pub field_order: FieldOrder,
    /// Name of the run in the report
    #[arg(long, value_name = "TEXT", default_value = "", hide_default_value = true, help_heading = COMMON)]
    pub label: String,
    /// No progress line on stderr
    #[arg(long, help_heading = COMMON)]
    pub quiet: bool,

    /// Sessions
    #[arg(long, value_name = "N", default_value_t = Config::default().sessions, help_heading = AGENT)]
    pub sessions: usize,
    /// Poisson arrivals: R new sessions per simulated second
    #[arg(long, value_name = "R", allow_negative_numbers = true, default_value_t = 1.0, help_heading = AGENT)]
    pub rate: f64,
    /// poisson: exponential gaps at --rate; burst: every session within --burst-window-ms
    #[arg(long, value_enum, default_value_t = ArrivalKind::Poisson, help_heading = AGENT)]
    pub arrival: ArrivalKind,
    /// Send each turn of a session to a random --url (seeded), not every turn to the session's one: router
    /// replicas behind a balancer without affinity
    #[arg(long, help_heading = AGENT)]
    pub spread_turns: bool,
    /// Header carrying the session id (the later of this and --no-session-header wins)
    #[arg(long, value_name = "NAME", default_value = "x-session-id", overrides_with = "no_session_header",
          help_heading = AGENT)]
    pub session_header: String,
    /// Send no session header
    #[arg(long, overrides_with = "session_header", help_heading = AGENT)]
    pub no_session_header: bool,
    /// A system prompt of N tokens shared by every session [shared-prefix: 16000 unless given]
    #[arg(long, value_name = "N", default_value_t = Config::default().system_prompt_tokens, help_heading = AGENT)]
    pub system_prompt_tokens: u64,
    /// Non-streaming requests (TTFT = whole response)
    #[arg(long, help_heading = AGENT)]
    pub no_stream: bool,
    /// Multiply every prompt size (tests use e.g. 0.01)
    #[arg(long, value_name = "F", allow_negative_numbers = true, default_value_t = Shape::default().size_scale,
          help_heading = AGENT)]
    pub size_scale: f64,
    /// Short first turns, tokens; a share --short-share of the sessions
    #[arg(long, value_name = "MIN-MAX", value_parser = range, default_value_t = Shape::default().short_tokens,
          help_heading = AGENT)]
    pub first_short: Range,
    /// Long first turns, tokens; a share --long-share of the sessions. The rest are log-uniform in between
    #[arg(long, value_name = "MIN-MAX", value_parser = range, default_value_t = Shape::default().long_tokens,
          help_heading = AGENT)]
    pub first_long: Range,
    /// Share of short first turns
    #[arg(long, value_name = "F", allow_negative_numbers = true, default_value_t = Shape::default().short_share,
          help_heading = AGENT)]
    pub short_share: f64,
    /// Share of long first turns
    #[arg(long, value_name = "F", allow_negative_numbers = true, default_value_t = Shape::default().long_share,
          help_heading = AGENT)]
    pub long_share: f64,
    /// Later turns per session
    #[arg(long, value_name = "MIN-MAX", value_parser = range, default_value_t = Shape::default().later_turns,
          help_heading = AGENT)]
    pub turns: Range,
    /// Tokens each later turn appends
    #[arg(long, value_name = "MIN-MAX", value_parser = range, default_value_t = Shape::default().append_tokens,
          help_heading = AGENT)]
    pub append_tokens: Range,
    /// Think time before each later turn, simulated seconds
    #[arg(long, value_name = "MIN-MAX", value_parser = sec_range, default_value_t = Shape::default().think,
          help_heading = AGENT)]
    pub think_seconds: SecRange,
    /// max_tokens of each request
    #[arg(long, value_name = "MIN-MAX", value_parser = range, default_value_t = Shape::default().output_tokens,
          help_heading = AGENT)]
    pub output_tokens: Range,

    /// New sessions
    #[arg(long, value_name = "N", default_value_t = Config::default().burst_sessions, help_heading = BURST)]
    pub burst_sessions: usize,
    /// Window they arrive in (also the window of --arrival burst)
    #[arg(long, value_name = "MS", allow_negative_numbers = true,
          default_value_t = Config::default().burst_window_ms, help_heading = BURST)]
    pub burst_window_ms: f64,
    /// Their first-turn tokens
    #[arg(long, value_name = "MIN-MAX", value_parser = range, default_value_t = Config::default().burst_tokens,
          help_heading = BURST)]
    pub burst_tokens: Range,
    /// Long-running streams started first [default: 2 per engine]
    #[arg(long, value_name = "N", help_heading = BURST)]
    pub background: Option<usize>,
    /// Their prompt tokens
    #[arg(long, value_name = "N", default_value_t = Config::default().background_tokens, help_heading = BURST)]
    pub background_tokens: u64,
    /// Their max_tokens (the default makes them run the whole time)
    #[arg(long, value_name = "N", default_value_t = Config::default().background_max_tokens,
          help_heading = BURST)]
    pub background_max_tokens: u64,
    /// Short turns of one warm-up session before the burst
    #[arg(long, value_name = "N", default_value_t = Config::default().warm_turns, help_heading = BURST)]
    pub warm_turns: usize,

    /// An engine measured without the router
    #[arg(long, value_name = "URL", help_heading = OVERHEAD)]
    pub direct_url: Option<String>,
    /// Concurrent workers
    #[arg(long, value_name = "N", default_value_t = Config::default().concurrency, help_heading = OVERHEAD)]
    pub concurrency: usize,
    /// Requests per target, split over --rounds
    #[arg(long, value_name = "N", default_value_t = Config::default().requests, help_heading = OVERHEAD)]
    pub requests: usize,
    /// Direct and router phases alternate this many times
    #[arg(long, value_name = "N", default_value_t = Config::default().rounds, help_heading = OVERHEAD)]
    pub rounds: usize,
    /// Read the router's CPU time (process tree) from /proc
    #[arg(long, value_name = "PID", help_heading = OVERHEAD)]
    pub router_pid: Option<u32>,

    /// Single-turn chats
    #[arg(long, value_name = "N", default_value_t = Config::default().chat_requests, help_heading = MIXED)]
    pub chat_requests: usize,
    /// Their Poisson arrival rate, per simulated second
    #[arg(long, value_name = "R", allow_negative_numbers = true, default_value_t = Config::default().chat_rate,
          help_heading = MIXED)]
    pub chat_rate: f64,
    /// Their prompt tokens
    #[arg(long, value_name = "MIN-MAX", value_parser = range, default_value_t = Config::default().chat_tokens,
          help_heading = MIXED)]
    pub chat_tokens: Range,
}

impl Cli {
    /// The run configuration, checked (the message names the flag at fault).
    pub fn into_config(self) -> Result<Config, String> {
        if !(0.0..=1.0).contains(&self.short_share)
            || !(0.0..=1.0).contains(&self.long_share)
            || self.short_share + self.long_share > 1.0
        {
            return Err(
                "--short-share and --long-share must be in 0..1 and add up to at most 1".into(),
            );
        }
        if !(self.burst_window_ms.is_finite() && self.burst_window_ms >= 0.0) {
            return Err("--burst-window-ms must be >= 0".into());
        }
        let c = Config {
            scenario: self.scenario,
            urls: self.urls,
            direct_url: self.direct_url,
            engine_stats_urls: self.engine_stats_urls,
            model: self.model,
            seed: self.seed,
            sessions: self.sessions,
            arrival: match self.arrival {
                ArrivalKind::Poisson => Arrival::Poisson { rate: self.rate },
                ArrivalKind::Burst => Arrival::Burst {
                    window: self.burst_window_ms / 1e3,
                },
            },
            shape: Shape {
                short_share: self.short_share,
                long_share: self.long_share,
                short_tokens: self.first_short,
                long_tokens: self.first_long,
                later_turns: self.turns,
                append_tokens: self.append_tokens,
                think: self.think_seconds,
                output_tokens: self.output_tokens,
                size_scale: self.size_scale,
            },
            session_header: (!self.no_session_header).then_some(self.session_header),
            spread_turns: self.spread_turns,
            system_prompt_tokens: self.system_prompt_tokens,
            stream: !self.no_stream,
            field_order: self.field_order,
            time_scale: self.time_scale,
            max_seconds: self.max_seconds,
            request_timeout: self.request_timeout,
            json: self.json,
            trace: self.trace,
            label: self.label,
            progress: !self.quiet,
            burst_sessions: self.burst_sessions,
            burst_window_ms: self.burst_window_ms,
            burst_tokens: self.burst_tokens,
            background_streams: self.background,
            background_tokens: self.background_tokens,
            background_max_tokens: self.background_max_tokens,
            warm_turns: self.warm_turns,
            concurrency: self.concurrency,
            requests: self.requests,
            rounds: self.rounds,
            router_pid: self.router_pid,
            chat_requests: self.chat_requests,
            chat_rate: self.chat_rate,
            chat_tokens: self.chat_tokens,
        };
        c.validate()?;
        Ok(c)
    }
}

/// Parses a command line (program name first) into a checked [`Config`]. `--help` comes back as an error of
/// kind `DisplayHelp`; `clap::Error::exit` prints it to stdout with status 0 (usage errors: stderr, status 2).
pub fn parse_args<I, T>(args: I) -> Result<Config, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = Cli::try_parse_from(args)?;
    cli.into_config()
        .map_err(|e| Cli::command().error(ErrorKind::ValueValidation, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Config, clap::Error> {
        parse_args(std::iter::once("loadgen").chain(s.split_whitespace()))
    }

    #[test]
    fn agent_flags() {
        let c = parse(
            "--url http://127.0.0.1:8000 --sessions 20 --rate=2.5 --seed 9 --turns 1-2 --think-seconds 0.1-0.2 \
             --no-session-header --engine-stats-url http://127.0.0.1:8101 --engine-stats-url http://127.0.0.1:8102 \
             --time-scale 0.1 --json /tmp/x.json --output-tokens 16",
        )
        .unwrap();
        assert_eq!(c.scenario, Scenario::Agent);
        assert_eq!(c.sessions, 20);
        assert_eq!(c.arrival, Arrival::Poisson { rate: 2.5 });
        assert_eq!(c.shape.later_turns, Range::new(1, 2));
        assert_eq!(c.shape.output_tokens, Range::new(16, 16));
        assert_eq!(c.shape.think, SecRange { min: 0.1, max: 0.2 });
        assert!(c.session_header.is_none());
        assert_eq!(c.engine_stats_urls.len(), 2);
        assert_eq!(c.time_scale, 0.1);
        assert!(!c.spread_turns);
        let spread =
            parse("--url http://127.0.0.1:8000 --url http://127.0.0.1:8001 --spread-turns")
                .unwrap();
        assert!(spread.spread_turns);
        assert_eq!(spread.urls.len(), 2);
    }

    #[test]
    fn errors_and_help() {
        assert_eq!(parse("--help").unwrap_err().kind(), ErrorKind::DisplayHelp);
        assert!(parse("").is_err(), "a target is required");
        assert!(parse("--url http://x --bogus").is_err());
        assert!(parse("--url http://x --turns 5-2").is_err());
        assert!(parse("--url https://x").is_err());
        assert!(parse("--url http://x --rate 0").is_err());
        assert!(parse("--url http://x --rate -1").is_err());
        assert!(
            parse("--url http://x --scenario burst").is_err(),
            "burst needs engine stats"
        );
        assert!(parse("--url http://x --scenario nope").is_err());
        assert!(parse("--url http://x --short-share 0.9 --long-share 0.2").is_err());
        let c = parse("--url http://x --scenario overhead --direct-url http://y --router-pid 12 --concurrency 4")
            .unwrap();
        assert_eq!(
            (c.scenario, c.router_pid, c.concurrency),
            (Scenario::Overhead, Some(12), 4)
        );
        let c = parse("--url http://x --arrival burst --burst-window-ms 50").unwrap();
        assert_eq!(c.arrival, Arrival::Burst { window: 0.05 });
    }

    #[test]
    fn defaults_and_last_session_header_flag_wins() {
        let c = parse("--url http://x").unwrap();
        let d = Config::default();
        assert_eq!(c.shape, d.shape);
        assert_eq!(c.arrival, d.arrival);
        assert_eq!(c.session_header.as_deref(), Some("x-session-id"));
        assert_eq!(
            (c.sessions, c.seed, c.model.as_str(), c.stream, c.progress),
            (d.sessions, d.seed, d.model.as_str(), d.stream, d.progress)
        );
        assert_eq!(
            (
                c.burst_sessions,
                c.burst_tokens,
                c.background_streams,
                c.warm_turns
            ),
            (
                d.burst_sessions,
                d.burst_tokens,
                d.background_streams,
                d.warm_turns
            )
        );
        assert_eq!(
            (
                c.concurrency,
                c.requests,
                c.rounds,
                c.max_seconds,
                c.request_timeout
            ),
            (
                d.concurrency,
                d.requests,
                d.rounds,
                d.max_seconds,
                d.request_timeout
            )
        );
        assert_eq!(c.field_order, FieldOrder::MessagesFirst);
        let c = parse("--url http://x --field-order model-first").unwrap();
        assert_eq!(c.field_order, FieldOrder::ModelFirst);
        assert!(parse("--url http://x --field-order random").is_err());
        let c = parse("--url http://x --no-session-header --session-header s").unwrap();
        assert_eq!(c.session_header.as_deref(), Some("s"));
        let c = parse("--url http://x --session-header s --no-session-header").unwrap();
        assert_eq!(c.session_header, None);
        let c = parse("--url http://x --no-stream --quiet --first-long 100-200 --label L").unwrap();
        assert!(!c.stream && !c.progress);
        assert_eq!(c.shape.long_tokens, Range::new(100, 200));
        assert_eq!(c.label, "L");
        let help = Cli::command().render_help().to_string();
        assert!(help.contains("[default: 1000-5000]"), "{help}");
        assert!(help.contains("[default: 0.5-3]"), "{help}");
    }

    #[test]
    fn command_is_consistent() {
        Cli::command().debug_assert();
    }
}
