//! Command-line parsing for the `loadgen` binary.

use std::path::PathBuf;

use super::workload::{Arrival, Range, SecRange};
use super::{Config, Scenario};

pub const HELP: &str = "\
loadgen: replays agent-session traffic against an OpenAI-compatible base URL (router or engines)

USAGE:
    loadgen --scenario agent --url http://127.0.0.1:8000 [--engine-stats-url URL ...] [OPTIONS]
    loadgen --scenario burst --url ROUTER --engine-stats-url E1 --engine-stats-url E2 [OPTIONS]
    loadgen --scenario overhead --url ROUTER --direct-url ENGINE [--router-pid PID] [OPTIONS]

COMMON:
    --scenario agent|burst|overhead   (default agent)
    --url URL                      base URL requests go to (repeatable: sessions are spread over several
                                   URLs round-robin, e.g. engines without a router)
    --engine-stats-url URL         a simulated engine's base URL (repeatable); its GET /sim/stats before and
                                   after the run gives per-engine request and computed-token shares
    --model NAME                   \"model\" of every request (default sim-model)
    --seed N                       seed of every random choice and text (default 1)
    --time-scale F                 multiply think times and arrival gaps (match engine-sim --time-scale;
                                   default 1). Reported times are wall-clock.
    --max-seconds S                hard limit on the whole run (default 600)
    --request-timeout S            limit on one request (default 600)
    --json FILE                    also write the report as JSON
    --label TEXT                   name of the run in the report
    --quiet                        no progress line on stderr

AGENT (multi-turn sessions):
    --sessions N                   sessions (default 50)
    --rate R                       Poisson arrivals, R new sessions per simulated second (default 1)
    --arrival poisson|burst        burst: all sessions within --burst-window-ms (default poisson)
    --session-header NAME          header carrying the session id (default x-session-id)
    --no-session-header            send no session header
    --system-prompt-tokens N       a system prompt of N tokens shared by every session (default 0)
    --no-stream                    non-streaming requests (TTFT = whole response)
    --size-scale F                 multiply every prompt size (default 1; tests use e.g. 0.01)
    --first-short MIN-MAX          short first turns, tokens (default 1000-5000), share --short-share (0.64)
    --first-long MIN-MAX           long first turns, tokens (default 50000-140000), share --long-share (0.16);
                                   the rest are log-uniform in between
    --short-share F  --long-share F
    --turns MIN-MAX                later turns per session (default 3-8)
    --append-tokens MIN-MAX        tokens each later turn appends (default 200-3000)
    --think-seconds MIN-MAX        think time before each later turn (default 0.5-3)
    --output-tokens MIN-MAX        max_tokens of each request (default 32-256)

BURST (needs one --engine-stats-url per engine):
    --burst-sessions N             new sessions (default 8)
    --burst-window-ms MS           window they arrive in (default 100)
    --burst-tokens MIN-MAX         their first-turn tokens (default 60000-100000)
    --background N                 long-running streams started first (default 2 per engine)
    --background-tokens N          their prompt tokens (default 2000)
    --background-max-tokens N      their max_tokens (default 1000000: they run the whole time)
    --warm-turns N                 short turns of one warm-up session before the burst (default 12)

OVERHEAD (tiny non-streaming requests, max_tokens 1):
    --direct-url URL               an engine measured without the router
    --concurrency N                concurrent workers (default 8)
    --requests N                   requests per target (default 2000), split over --rounds
    --rounds N                     direct and router phases alternate this many times (default 2)
    --router-pid PID               read the router's CPU time (process tree) from /proc

    -h, --help                     this help
";

fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.trim()
        .parse()
        .map_err(|_| format!("{flag}: invalid value '{v}'"))
}

/// `MIN-MAX` or a single value.
fn range(flag: &str, v: &str) -> Result<Range, String> {
    let (a, b) = v.split_once('-').unwrap_or((v, v));
    let r = Range::new(num(flag, a)?, num(flag, b)?);
    if r.min > r.max {
        return Err(format!("{flag}: MIN above MAX in '{v}'"));
    }
    Ok(r)
}

fn sec_range(flag: &str, v: &str) -> Result<SecRange, String> {
    let (a, b) = v.split_once('-').unwrap_or((v, v));
    let r = SecRange {
        min: num(flag, a)?,
        max: num(flag, b)?,
    };
    if !(r.min.is_finite() && r.max.is_finite() && 0.0 <= r.min && r.min <= r.max) {
        return Err(format!("{flag}: expected 0 <= MIN <= MAX, got '{v}'"));
    }
    Ok(r)
}

/// Parses the arguments (without the program name). `Ok(None)` means `--help`.
pub fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Option<Config>, String> {
    let mut c = Config::default();
    let mut rate = 1.0;
    let mut burst_arrival = false;
    while let Some(arg) = it.next() {
        if arg == "-h" || arg == "--help" {
            return Ok(None);
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--scenario" => {
                c.scenario = match value()?.as_str() {
                    "agent" => Scenario::Agent,
                    "burst" => Scenario::Burst,
                    "overhead" => Scenario::Overhead,
                    other => {
                        return Err(format!(
                            "--scenario: unknown '{other}' (agent, burst, overhead)"
                        ))
                    }
                }
            }
            "--url" => c.urls.push(value()?),
            "--direct-url" => c.direct_url = Some(value()?),
            "--engine-stats-url" => c.engine_stats_urls.push(value()?),
            "--model" => c.model = value()?,
            "--seed" => c.seed = num(&flag, &value()?)?,
            "--time-scale" => c.time_scale = num(&flag, &value()?)?,
            "--max-seconds" => c.max_seconds = num(&flag, &value()?)?,
            "--request-timeout" => c.request_timeout = num(&flag, &value()?)?,
            "--json" => c.json = Some(PathBuf::from(value()?)),
            "--label" => c.label = value()?,
            "--quiet" => c.progress = false,
            "--sessions" => c.sessions = num(&flag, &value()?)?,
            "--rate" => rate = num(&flag, &value()?)?,
            "--arrival" => {
                burst_arrival = match value()?.as_str() {
                    "poisson" => false,
                    "burst" => true,
                    other => return Err(format!("--arrival: unknown '{other}' (poisson, burst)")),
                }
            }
            "--session-header" => c.session_header = Some(value()?),
            "--no-session-header" => c.session_header = None,
            "--system-prompt-tokens" => c.system_prompt_tokens = num(&flag, &value()?)?,
            "--no-stream" => c.stream = false,
            "--size-scale" => c.shape.size_scale = num(&flag, &value()?)?,
            "--first-short" => c.shape.short_tokens = range(&flag, &value()?)?,
            "--first-long" => c.shape.long_tokens = range(&flag, &value()?)?,
            "--short-share" => c.shape.short_share = num(&flag, &value()?)?,
            "--long-share" => c.shape.long_share = num(&flag, &value()?)?,
            "--turns" => c.shape.later_turns = range(&flag, &value()?)?,
            "--append-tokens" => c.shape.append_tokens = range(&flag, &value()?)?,
            "--think-seconds" => c.shape.think = sec_range(&flag, &value()?)?,
            "--output-tokens" => c.shape.output_tokens = range(&flag, &value()?)?,
            "--burst-sessions" => c.burst_sessions = num(&flag, &value()?)?,
            "--burst-window-ms" => c.burst_window_ms = num(&flag, &value()?)?,
            "--burst-tokens" => c.burst_tokens = range(&flag, &value()?)?,
            "--background" => c.background_streams = Some(num(&flag, &value()?)?),
            "--background-tokens" => c.background_tokens = num(&flag, &value()?)?,
            "--background-max-tokens" => c.background_max_tokens = num(&flag, &value()?)?,
            "--warm-turns" => c.warm_turns = num(&flag, &value()?)?,
            "--concurrency" => c.concurrency = num(&flag, &value()?)?,
            "--requests" => c.requests = num(&flag, &value()?)?,
            "--rounds" => c.rounds = num(&flag, &value()?)?,
            "--router-pid" => c.router_pid = Some(num(&flag, &value()?)?),
            other => return Err(format!("unknown argument '{other}' (see --help)")),
        }
    }
    let s = &c.shape;
    if !(0.0..=1.0).contains(&s.short_share)
        || !(0.0..=1.0).contains(&s.long_share)
        || s.short_share + s.long_share > 1.0
    {
        return Err(
            "--short-share and --long-share must be in 0..1 and add up to at most 1".into(),
        );
    }
    if !(c.burst_window_ms.is_finite() && c.burst_window_ms >= 0.0) {
        return Err("--burst-window-ms must be >= 0".into());
    }
    c.arrival = if burst_arrival {
        Arrival::Burst {
            window: c.burst_window_ms / 1e3,
        }
    } else {
        Arrival::Poisson { rate }
    };
    c.validate()?;
    Ok(Some(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Option<Config>, String> {
        parse_args(s.split_whitespace().map(str::to_string))
    }

    #[test]
    fn agent_flags() {
        let c = parse(
            "--url http://127.0.0.1:8000 --sessions 20 --rate=2.5 --seed 9 --turns 1-2 --think-seconds 0.1-0.2 \
             --no-session-header --engine-stats-url http://127.0.0.1:8101 --engine-stats-url http://127.0.0.1:8102 \
             --time-scale 0.1 --json /tmp/x.json --output-tokens 16",
        )
        .unwrap()
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
    }

    #[test]
    fn errors_and_help() {
        assert!(parse("--help").unwrap().is_none());
        assert!(parse("").is_err(), "a target is required");
        assert!(parse("--url http://x --bogus").is_err());
        assert!(parse("--url http://x --turns 5-2").is_err());
        assert!(parse("--url https://x").is_err());
        assert!(parse("--url http://x --rate 0").is_err());
        assert!(
            parse("--url http://x --scenario burst").is_err(),
            "burst needs engine stats"
        );
        assert!(parse("--url http://x --short-share 0.9 --long-share 0.2").is_err());
        let c = parse("--url http://x --scenario overhead --direct-url http://y --router-pid 12 --concurrency 4")
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.scenario, c.router_pid, c.concurrency),
            (Scenario::Overhead, Some(12), 4)
        );
        let c = parse("--url http://x --arrival burst --burst-window-ms 50")
            .unwrap()
            .unwrap();
        assert_eq!(c.arrival, Arrival::Burst { window: 0.05 });
    }
}
