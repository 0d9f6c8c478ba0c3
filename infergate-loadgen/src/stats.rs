//! Numbers: percentiles, the slowest-5% decode speed, coefficients of variation, per-engine totals read from
//! the simulated engines' `GET /sim/stats`, and a process's CPU time from `/proc`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Summary of a sample (milliseconds or tokens/s, as the field name says).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Pct {
    pub count: usize,
    pub mean: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

/// Nearest-rank percentile of an ascending slice (`p` in 0..=100).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn summarize(values: &[f64]) -> Option<Pct> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    Some(Pct {
        count: v.len(),
        mean: v.iter().sum::<f64>() / v.len() as f64,
        p50: percentile(&v, 50.0),
        p95: percentile(&v, 95.0),
        p99: percentile(&v, 99.0),
        max: v[v.len() - 1],
    })
}

/// Decode speed of the slowest requests.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DecodeStats {
    /// Requests with a measurable rate (at least two token chunks apart in time).
    pub measured: usize,
    pub median_tok_s: f64,
    /// 5th percentile of per-request decode rates.
    pub p5_tok_s: f64,
    /// Mean rate of the slowest 5% of requests (at least one request).
    pub slowest5_mean_tok_s: f64,
    pub slowest5_count: usize,
}

pub fn decode_stats(rates: &[f64]) -> Option<DecodeStats> {
    if rates.is_empty() {
        return None;
    }
    let mut v = rates.to_vec();
    v.sort_by(f64::total_cmp);
    let k = ((v.len() as f64) * 0.05).ceil().max(1.0) as usize;
    Some(DecodeStats {
        measured: v.len(),
        median_tok_s: percentile(&v, 50.0),
        p5_tok_s: percentile(&v, 5.0),
        slowest5_mean_tok_s: v[..k].iter().sum::<f64>() / k as f64,
        slowest5_count: k,
    })
}

/// Coefficient of variation (population standard deviation / mean); 0 when the mean is 0.
pub fn cv(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    if mean == 0.0 {
        return 0.0;
    }
    let var = values.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    var.sqrt() / mean
}

/// The fields of a simulated engine's `/sim/stats` the load generator reads.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct EngineTotals {
    pub requests: u64,
    pub finished: u64,
    pub aborted: u64,
    pub prompt_tokens: u64,
    pub computed_prompt_tokens: u64,
    pub cached_prompt_tokens: u64,
    pub generation_tokens: u64,
    pub running: u64,
    pub waiting: u64,
}

impl EngineTotals {
    /// Counters of `self` minus those of `before` (gauges are taken from `self`).
    pub fn since(&self, before: &EngineTotals) -> EngineTotals {
        EngineTotals {
            requests: self.requests.saturating_sub(before.requests),
            finished: self.finished.saturating_sub(before.finished),
            aborted: self.aborted.saturating_sub(before.aborted),
            prompt_tokens: self.prompt_tokens.saturating_sub(before.prompt_tokens),
            computed_prompt_tokens: self
                .computed_prompt_tokens
                .saturating_sub(before.computed_prompt_tokens),
            cached_prompt_tokens: self
                .cached_prompt_tokens
                .saturating_sub(before.cached_prompt_tokens),
            generation_tokens: self
                .generation_tokens
                .saturating_sub(before.generation_tokens),
            running: self.running,
            waiting: self.waiting,
        }
    }
}

/// `url` + `/sim/stats` unless it already names a path.
pub fn stats_url(url: &str) -> String {
    let u = url.trim_end_matches('/');
    if u.ends_with("/sim/stats") {
        u.to_string()
    } else {
        format!("{u}/sim/stats")
    }
}

pub async fn fetch_totals(client: &reqwest::Client, url: &str) -> Result<EngineTotals, String> {
    let u = stats_url(url);
    let resp = client
        .get(&u)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .map_err(|e| format!("{u}: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("{u}: HTTP {}", resp.status()));
    }
    resp.json::<EngineTotals>()
        .await
        .map_err(|e| format!("{u}: {e}"))
}

/// Totals of every engine, in order; an engine that cannot be read is an error.
pub async fn fetch_all(
    client: &reqwest::Client,
    urls: &[String],
) -> Result<Vec<EngineTotals>, String> {
    let futs = urls.iter().map(|u| fetch_totals(client, u));
    futures_util::future::join_all(futs)
        .await
        .into_iter()
        .collect()
}

/// One engine's part of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EngineShare {
    pub url: String,
    pub requests: u64,
    pub prompt_tokens: u64,
    pub computed_prompt_tokens: u64,
    pub cached_prompt_tokens: u64,
    pub generation_tokens: u64,
    pub request_share: f64,
    pub computed_share: f64,
}

/// How a run's work spread over the engines.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EngineReport {
    pub engines: Vec<EngineShare>,
    /// Coefficient of variation of the per-engine request counts.
    pub request_cv: f64,
    /// Coefficient of variation of the per-engine computed (uncached) prompt tokens.
    pub computed_cv: f64,
    /// Cached / prompt tokens over all engines.
    pub cache_hit_share: f64,
}

pub fn engine_report(
    urls: &[String],
    before: &[EngineTotals],
    after: &[EngineTotals],
) -> EngineReport {
    let deltas: Vec<EngineTotals> = after.iter().zip(before).map(|(a, b)| a.since(b)).collect();
    let req_total: u64 = deltas.iter().map(|d| d.requests).sum();
    let comp_total: u64 = deltas.iter().map(|d| d.computed_prompt_tokens).sum();
    let prompt_total: u64 = deltas.iter().map(|d| d.prompt_tokens).sum();
    let cached_total: u64 = deltas.iter().map(|d| d.cached_prompt_tokens).sum();
    let share = |x: u64, t: u64| if t == 0 { 0.0 } else { x as f64 / t as f64 };
    let engines = urls
        .iter()
        .zip(&deltas)
        .map(|(u, d)| EngineShare {
            url: u.clone(),
            requests: d.requests,
            prompt_tokens: d.prompt_tokens,
            computed_prompt_tokens: d.computed_prompt_tokens,
            cached_prompt_tokens: d.cached_prompt_tokens,
            generation_tokens: d.generation_tokens,
            request_share: share(d.requests, req_total),
            computed_share: share(d.computed_prompt_tokens, comp_total),
        })
        .collect();
    let reqs: Vec<f64> = deltas.iter().map(|d| d.requests as f64).collect();
    let comps: Vec<f64> = deltas
        .iter()
        .map(|d| d.computed_prompt_tokens as f64)
        .collect();
    EngineReport {
        engines,
        request_cv: cv(&reqs),
        computed_cv: cv(&comps),
        cache_hit_share: share(cached_total, prompt_total),
    }
}

/// Clock ticks per second for `/proc/*/stat` times (`getconf CLK_TCK`, else the Linux default 100).
pub fn clk_tck() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// (ppid, utime + stime in ticks) from the text of `/proc/PID/stat`.
fn parse_stat(text: &str) -> Option<(u32, u64)> {
    // The command name (field 2) may hold spaces or parentheses: fields start after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] is field 3 (state), so field N is f[N - 3].
    let ppid = f.get(1)?.parse().ok()?;
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((ppid, utime + stime))
}

/// CPU seconds (user + system) used so far by process `pid` and all its live descendants.
pub fn process_tree_cpu_seconds(pid: u32) -> Result<f64, String> {
    let own = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("/proc/{pid}/stat: {e}"))?;
    let (_, own_ticks) = parse_stat(&own).ok_or_else(|| format!("/proc/{pid}/stat: unreadable"))?;
    let mut procs: Vec<(u32, u32, u64)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if p == pid {
                continue;
            }
            if let Some((pp, t)) = std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .as_deref()
                .and_then(parse_stat)
            {
                procs.push((p, pp, t));
            }
        }
    }
    let mut total = own_ticks;
    let mut frontier = vec![pid];
    let mut seen = std::collections::HashSet::from([pid]);
    while let Some(parent) = frontier.pop() {
        for &(p, pp, t) in &procs {
            if pp == parent && seen.insert(p) {
                total += t;
                frontier.push(p);
            }
        }
    }
    Ok(total as f64 / clk_tck())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 95.0), 95.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
        let s = summarize(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.count, s.p50, s.max, s.mean), (3, 2.0, 3.0, 2.0));
        assert!(summarize(&[]).is_none());
    }

    #[test]
    fn slowest_five_percent() {
        let rates: Vec<f64> = (1..=40).map(f64::from).collect();
        let d = decode_stats(&rates).unwrap();
        // ceil(40 * 0.05) = 2 slowest: 1 and 2.
        assert_eq!(
            (d.slowest5_count, d.slowest5_mean_tok_s, d.p5_tok_s),
            (2, 1.5, 2.0)
        );
    }

    #[test]
    fn coefficient_of_variation() {
        assert_eq!(cv(&[5.0, 5.0]), 0.0);
        assert!((cv(&[1.0, 3.0]) - 0.5).abs() < 1e-12);
        assert_eq!(cv(&[0.0, 0.0]), 0.0);
    }

    #[test]
    fn engine_shares() {
        let before = vec![
            EngineTotals::default(),
            EngineTotals {
                requests: 10,
                ..Default::default()
            },
        ];
        let after = vec![
            EngineTotals {
                requests: 3,
                computed_prompt_tokens: 300,
                prompt_tokens: 400,
                cached_prompt_tokens: 100,
                ..Default::default()
            },
            EngineTotals {
                requests: 11,
                computed_prompt_tokens: 100,
                prompt_tokens: 100,
                ..Default::default()
            },
        ];
        let r = engine_report(&["a".into(), "b".into()], &before, &after);
        assert_eq!(r.engines[1].requests, 1);
        assert_eq!(r.engines[0].request_share, 0.75);
        assert_eq!(r.engines[0].computed_share, 0.75);
        assert!((r.request_cv - 0.5).abs() < 1e-12);
        assert!((r.cache_hit_share - 0.2).abs() < 1e-12);
        assert_eq!(stats_url("http://x:1/"), "http://x:1/sim/stats");
    }

    #[test]
    fn proc_stat() {
        let line =
            "1234 (my (odd) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0 100 0 0";
        assert_eq!(parse_stat(line), Some((1, 300)));
        let me = process_tree_cpu_seconds(std::process::id()).unwrap();
        assert!(me >= 0.0);
    }
}
