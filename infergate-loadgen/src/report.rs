//! The run report: one JSON document (`--json FILE`) and a plain-text table for stdout.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::stats::{DecodeStats, EngineReport, Pct};

/// Sessions of an agent or burst run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SessionCounts {
    pub planned: u64,
    pub started: u64,
    /// Every turn answered.
    pub completed: u64,
    /// Stopped at a failed turn.
    pub failed: u64,
}

/// How the burst's new sessions (and the background streams before them) landed on the engines.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BurstReport {
    pub new_sessions: u64,
    pub window_ms: f64,
    pub background_streams: u64,
    /// Requests of the warm-up session (short turns before the burst).
    pub warm_requests: u64,
    /// Per engine (in `--engine-stats-url` order): background streams placed there.
    pub background_split: Vec<u64>,
    /// Per engine: warm-up requests placed there.
    pub warm_split: Vec<u64>,
    /// Per engine: new burst sessions placed there (from `/sim/stats` request-count deltas).
    pub burst_split: Vec<u64>,
    /// `burst_split` as text, e.g. "4/4".
    pub split: String,
    /// Largest engine share of the burst (0.5 is even on 2 engines).
    pub max_share: f64,
    /// TTFT of the burst's first turns.
    pub burst_ttft_ms: Option<Pct>,
}

/// One target of the overhead scenario.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LatencyRun {
    pub url: String,
    pub requests: u64,
    pub errors: u64,
    pub seconds: f64,
    pub requests_per_s: f64,
    pub latency_ms: Option<Pct>,
}

/// Router overhead: the same tiny requests straight to an engine and through the router.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct OverheadReport {
    pub concurrency: u64,
    pub direct: Option<LatencyRun>,
    pub router: LatencyRun,
    /// Router p50 minus direct p50 (ms).
    pub added_p50_ms: Option<f64>,
    pub added_p99_ms: Option<f64>,
    /// Router requests/s divided by direct requests/s.
    pub rps_ratio: Option<f64>,
    /// CPU seconds the router process tree used during the router phase.
    pub router_cpu_seconds: Option<f64>,
    pub router_cpu_us_per_request: Option<f64>,
    /// Router CPU seconds per wall second (1.0 = one core busy).
    pub router_cpu_cores: Option<f64>,
}

/// Everything a run measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Report {
    pub scenario: String,
    pub label: String,
    pub targets: Vec<String>,
    pub seed: u64,
    pub time_scale: f64,
    /// Key order of the request bodies (`messages-first` or `model-first`).
    pub field_order: String,
    pub started_unix: u64,
    pub wall_seconds: f64,
    /// The run hit `--max-seconds` before all its work finished.
    pub timed_out: bool,
    pub sessions: SessionCounts,
    /// Foreground requests sent (background streams of the burst scenario not included).
    pub requests: u64,
    pub ok: u64,
    pub errors: u64,
    /// Requests still in flight when the run stopped.
    pub unfinished: u64,
    pub error_kinds: BTreeMap<String, u64>,
    /// Send to first token chunk, in wall-clock ms.
    pub ttft_ms: Option<Pct>,
    /// TTFT of sessions' follow-up turns only (turn 2 on), in wall-clock ms.
    pub ttft_followup_ms: Option<Pct>,
    /// Send to response headers, in wall-clock ms.
    pub headers_ms: Option<Pct>,
    /// Per-request decode rates, in wall-clock tokens/s.
    pub decode: Option<DecodeStats>,
    pub output_tokens: u64,
    /// Sum of `usage.prompt_tokens` / cached tokens the server reported.
    pub usage_prompt_tokens: u64,
    pub usage_cached_tokens: u64,
    pub engines: Option<EngineReport>,
    /// Why per-engine shares are missing, if they are.
    pub engine_stats_error: Option<String>,
    pub burst: Option<BurstReport>,
    pub overhead: Option<OverheadReport>,
    /// Warnings (something could not be measured).
    pub notes: Vec<String>,
}

fn ms(p: &Option<Pct>, f: impl Fn(&Pct) -> f64) -> String {
    p.as_ref().map_or("-".into(), |p| format!("{:.1}", f(p)))
}

impl Report {
    /// The human-readable summary printed to stdout.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "== loadgen {} {}(seed {}, time scale {}, {:.1} s{})",
            self.scenario,
            if self.label.is_empty() {
                String::new()
            } else {
                format!("[{}] ", self.label)
            },
            self.seed,
            self.time_scale,
            self.wall_seconds,
            if self.timed_out {
                ", STOPPED AT --max-seconds"
            } else {
                ""
            }
        );
        let _ = writeln!(s, "targets: {}", self.targets.join(" "));
        if self.sessions.planned > 0 {
            let c = &self.sessions;
            let _ = writeln!(
                s,
                "sessions: planned {} started {} completed {} failed {}",
                c.planned, c.started, c.completed, c.failed
            );
        }
        if self.requests > 0 || self.overhead.is_none() {
            let _ = writeln!(
                s,
                "requests: {} ok {} errors {} unfinished {}{}",
                self.requests,
                self.ok,
                self.errors,
                self.unfinished,
                if self.error_kinds.is_empty() {
                    String::new()
                } else {
                    format!(" {:?}", self.error_kinds)
                }
            );
            let _ = writeln!(
                s,
                "{:<22}{:>10}{:>10}{:>10}{:>10}{:>10}",
                "", "p50", "p95", "p99", "mean", "max"
            );
            for (name, p) in [
                ("TTFT ms", &self.ttft_ms),
                ("follow-up TTFT ms", &self.ttft_followup_ms),
                ("headers ms", &self.headers_ms),
            ] {
                let _ = writeln!(
                    s,
                    "{:<22}{:>10}{:>10}{:>10}{:>10}{:>10}",
                    name,
                    ms(p, |p| p.p50),
                    ms(p, |p| p.p95),
                    ms(p, |p| p.p99),
                    ms(p, |p| p.mean),
                    ms(p, |p| p.max)
                );
            }
            if let Some(d) = &self.decode {
                let _ = writeln!(
                    s,
                    "decode tok/s: slowest 5% mean {:.1} (n={}), p5 {:.1}, median {:.1} ({} requests measured)",
                    d.slowest5_mean_tok_s, d.slowest5_count, d.p5_tok_s, d.median_tok_s, d.measured
                );
            }
            let _ = writeln!(
                s,
                "tokens: output {} | server-reported prompt {} cached {}",
                self.output_tokens, self.usage_prompt_tokens, self.usage_cached_tokens
            );
        }
        if let Some(e) = &self.engines {
            let _ = writeln!(
                s,
                "{:<28}{:>10}{:>9}{:>14}{:>9}{:>14}",
                "engine", "requests", "share", "computed tok", "share", "cached tok"
            );
            for x in &e.engines {
                let _ = writeln!(
                    s,
                    "{:<28}{:>10}{:>8.1}%{:>14}{:>8.1}%{:>14}",
                    x.url,
                    x.requests,
                    x.request_share * 100.0,
                    x.computed_prompt_tokens,
                    x.computed_share * 100.0,
                    x.cached_prompt_tokens
                );
            }
            let _ = writeln!(
                s,
                "request-share CV {:.3} | computed-token-share CV {:.3} | cache hit share {:.1}%",
                e.request_cv,
                e.computed_cv,
                e.cache_hit_share * 100.0
            );
        }
        if let Some(err) = &self.engine_stats_error {
            let _ = writeln!(s, "engine stats: {err}");
        }
        for n in &self.notes {
            let _ = writeln!(s, "note: {n}");
        }
        if let Some(b) = &self.burst {
            let _ = writeln!(
                s,
                "burst: {} new sessions within {:.0} ms split {} (max share {:.2}); background {} streams split {:?}; \
                 warm-up {} requests split {:?}; burst TTFT p50 {} ms max {} ms",
                b.new_sessions,
                b.window_ms,
                b.split,
                b.max_share,
                b.background_streams,
                b.background_split,
                b.warm_requests,
                b.warm_split,
                ms(&b.burst_ttft_ms, |p| p.p50),
                ms(&b.burst_ttft_ms, |p| p.max)
            );
        }
        if let Some(o) = &self.overhead {
            let _ = writeln!(s, "overhead at concurrency {}:", o.concurrency);
            let _ = writeln!(
                s,
                "{:<10}{:<28}{:>9}{:>7}{:>10}{:>10}{:>10}{:>10}",
                "target", "url", "requests", "errors", "req/s", "p50 ms", "p99 ms", "mean ms"
            );
            for (name, r) in [("direct", o.direct.as_ref()), ("router", Some(&o.router))] {
                if let Some(r) = r {
                    let _ = writeln!(
                        s,
                        "{:<10}{:<28}{:>9}{:>7}{:>10.0}{:>10.3}{:>10.3}{:>10.3}",
                        name,
                        r.url,
                        r.requests,
                        r.errors,
                        r.requests_per_s,
                        r.latency_ms.as_ref().map_or(0.0, |p| p.p50),
                        r.latency_ms.as_ref().map_or(0.0, |p| p.p99),
                        r.latency_ms.as_ref().map_or(0.0, |p| p.mean)
                    );
                }
            }
            let f = |x: Option<f64>, d: usize| x.map_or("-".to_string(), |v| format!("{v:.d$}"));
            let _ = writeln!(
                s,
                "added p50 {} ms, p99 {} ms; router/direct req/s {}; router CPU {} s ({} us/request, {} cores)",
                f(o.added_p50_ms, 3),
                f(o.added_p99_ms, 3),
                f(o.rps_ratio, 3),
                f(o.router_cpu_seconds, 2),
                f(o.router_cpu_us_per_request, 1),
                f(o.router_cpu_cores, 2)
            );
        }
        s
    }
}
