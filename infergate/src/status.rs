//! The status page on the metrics listener: `GET /status` serves one self-contained HTML page (inline CSS and
//! JavaScript, no external assets) that renders the data it was served with and then re-fetches
//! `GET /status.json` every 2 s; `/status.json` is the same data for scripts.
//!
//! The data: every pool (policy, models, sessions held, wait-queue length where a queue exists) and its endpoints
//! (health, ejection, engine-stats state and last sample, requests and estimated prefill tokens in flight with
//! their peak over the last 2 s, learned prefill and decode speeds, speed outliers), the pool's placements by reason over the last minute and its latest placements
//! (`RecentPlacements`, bounded).

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::ledger::PEAK_WINDOW;
use crate::metrics::{Metrics, COMMIT, VERSION};
use crate::placement::policy::PlacementPolicy;
use crate::placement::Reason;
use crate::pool::{Health, Pool, Pools};

/// `/status.json`.
#[derive(Debug, Serialize)]
pub struct Status {
    pub version: &'static str,
    pub commit: &'static str,
    pub uptime_seconds: f64,
    /// When this snapshot was taken (Unix time, milliseconds).
    pub time_unix_ms: u64,
    /// The window of every endpoint's `prefill_tokens_peak`.
    pub prefill_peak_window_seconds: f64,
    pub pools: Vec<PoolStatus>,
}

#[derive(Debug, Serialize)]
pub struct PoolStatus {
    pub name: String,
    pub policy: String,
    pub models: Vec<String>,
    /// Session bindings held; null for a pool without sessions.
    pub sessions: Option<u64>,
    /// Requests waiting in the pool's wait queue; null where the router has no wait queue.
    pub queue_length: Option<u64>,
    pub max_in_flight_per_endpoint: Option<u64>,
    /// Every endpoint fails its health check and the pool places across those whose engine answers it
    /// (`health_check.route_when_all_unhealthy`).
    pub health_panic: bool,
    /// A disaggregated pool's part: null for a pool that is not disaggregated.
    pub disaggregation: Option<DisaggStatus>,
    pub endpoints: Vec<EndpointStatus>,
    /// Placements by reason over the last minute: every reason the pool's policy can give, then any other seen.
    pub placements_last_minute: Vec<ReasonCount>,
    /// The latest placements, newest first (at most `RECENT_PLACEMENTS`).
    pub recent_placements: Vec<RecentPlacement>,
}

/// Which set of a disaggregated pool a pool is.
#[derive(Debug, Serialize)]
pub struct DisaggStatus {
    /// `decode` (the pool clients name: its endpoints stream the answers) or `prefill` (its prefill set).
    pub role: &'static str,
    /// The other set's pool name.
    pub other: String,
    /// The protocol between the legs (`nixl`); null on the prefill set.
    pub connector: Option<&'static str>,
}

fn disagg_status(cfg: &crate::config::PoolConfig) -> Option<DisaggStatus> {
    if let Some(d) = &cfg.disaggregation {
        return Some(DisaggStatus {
            role: "decode",
            other: d.prefill_pool.clone(),
            connector: Some(d.connector.as_str()),
        });
    }
    cfg.prefill_of.as_ref().map(|of| DisaggStatus {
        role: "prefill",
        other: of.clone(),
        connector: None,
    })
}

#[derive(Debug, Serialize)]
pub struct EndpointStatus {
    pub endpoint: String,
    /// healthy, unhealthy, unknown (not checked yet).
    pub health: &'static str,
    /// Kept out of placement by outlier detection.
    pub ejected: bool,
    /// A stream got no headers in time: set aside while others can take the work (outlier detection).
    pub hung: bool,
    /// Failed requests that still weigh on it in placement until it serves one.
    pub failed_requests_weighing: u64,
    /// May take work: healthy (or failing during the pool's health panic) and not ejected.
    pub available: bool,
    pub engine_stats: EngineStatsStatus,
    pub requests_in_flight: u64,
    pub prefill_tokens: u64,
    /// The most prefill tokens in flight at any moment of the last `prefill_peak_window_seconds` (a prefill
    /// rarely lasts long enough to be caught by a sample of `prefill_tokens`).
    pub prefill_tokens_peak: u64,
    /// Learned prefill speed (estimated tokens per second); null until learned.
    pub prefill_tokens_per_second: Option<f64>,
    /// Learned time per streamed token with one sequence running; null until learned.
    pub decode_seconds_per_token: Option<f64>,
    /// Its speed against its own recent history or the pool's median (1: as usual); null until judged.
    pub relative_speed: Option<f64>,
    /// Far below that: it gets less new work until it recovers.
    pub speed_outlier: bool,
}

#[derive(Debug, Serialize)]
pub struct EngineStatsStatus {
    /// fresh, stale, missing, down, off.
    pub state: &'static str,
    /// Age of the last good sample, if any.
    pub age_seconds: Option<f64>,
    pub running: Option<u64>,
    pub waiting: Option<u64>,
    pub kv_usage: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct ReasonCount {
    pub reason: &'static str,
    pub count: u64,
}

#[derive(Debug, Serialize)]
pub struct RecentPlacement {
    pub age_seconds: f64,
    /// The endpoint's label, or null if it has left the pool since.
    pub endpoint: Option<String>,
    pub reason: &'static str,
}

/// The policy's name, marked when it keeps sessions.
fn policy_name(policy: &dyn PlacementPolicy) -> String {
    match policy.sessions() {
        Some(_) => format!("{} (sessions)", policy.name()),
        None => policy.name().to_string(),
    }
}

fn pool_status(pool: &Pool, queue_length: Option<u64>, now: Instant) -> PoolStatus {
    let endpoints = pool.endpoints();
    let gate = pool.health_gate(&endpoints);
    let decode = pool.decode_lines_now();
    let eps = endpoints
        .iter()
        .zip(decode)
        .map(|(e, decode)| {
            let (speed_outlier, relative_speed) = e.drift.state();
            let (state, sample) = e.stats.sample(now);
            let age = sample.map(|(at, _)| now.saturating_duration_since(at).as_secs_f64());
            let load = sample.map(|(_, l)| l);
            EndpointStatus {
                endpoint: e.label.clone(),
                health: match e.health.get() {
                    Health::Healthy => "healthy",
                    Health::Unhealthy => "unhealthy",
                    Health::Unknown => "unknown",
                },
                ejected: e.outlier.is_ejected(),
                hung: e.outlier.is_hung(now),
                failed_requests_weighing: e.outlier.debt(now).0,
                available: gate.available(e),
                engine_stats: EngineStatsStatus {
                    state: state.as_str(),
                    age_seconds: age,
                    running: load.map(|l| l.running),
                    waiting: load.map(|l| l.waiting),
                    kv_usage: load.map(|l| l.kv_usage),
                },
                requests_in_flight: e.load.requests(),
                prefill_tokens: e.load.prefill_tokens(),
                prefill_tokens_peak: e.load.prefill_tokens_peak(now),
                prefill_tokens_per_second: e.prefill_speed.tokens_per_sec(),
                decode_seconds_per_token: decode.map(|l| l.at(1.0)),
                relative_speed,
                speed_outlier,
            }
        })
        .collect();
    let counts = pool.recent.last_minute(now);
    let own = pool.reasons();
    let placements_last_minute = own
        .iter()
        .copied()
        .chain(
            Reason::ALL
                .iter()
                .copied()
                .filter(|r| !own.contains(r) && counts[r.index()] > 0),
        )
        .map(|r| ReasonCount {
            reason: r.as_str(),
            count: counts[r.index()],
        })
        .collect();
    let recent_placements = pool
        .recent
        .latest()
        .into_iter()
        .map(|(at, id, reason)| RecentPlacement {
            age_seconds: now.saturating_duration_since(at).as_secs_f64(),
            endpoint: endpoints
                .iter()
                .find(|e| e.id == id)
                .map(|e| e.label.clone()),
            reason: reason.as_str(),
        })
        .collect();
    PoolStatus {
        name: pool.name.to_string(),
        policy: policy_name(&*pool.policy),
        models: pool.cfg().models.clone(),
        sessions: pool.policy.sessions().map(|s| s.session_count() as u64),
        queue_length,
        max_in_flight_per_endpoint: pool.cfg().max_in_flight_per_endpoint,
        health_panic: gate.panic,
        disaggregation: disagg_status(&pool.cfg()),
        endpoints: eps,
        placements_last_minute,
        recent_placements,
    }
}

/// A snapshot of every pool.
pub fn snapshot(pools: &Pools, metrics: &Metrics) -> Status {
    let now = Instant::now();
    // The wait queue's gauge, where the router has one.
    let queues = metrics.gauge_by_pool("infergate_queue_length");
    Status {
        version: VERSION,
        commit: COMMIT,
        uptime_seconds: now.saturating_duration_since(metrics.started).as_secs_f64(),
        time_unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        prefill_peak_window_seconds: PEAK_WINDOW.as_secs_f64(),
        pools: pools
            .pools
            .iter()
            .map(|p| {
                let q = queues
                    .as_ref()
                    .and_then(|q| q.get(&*p.name))
                    .map(|v| *v as u64);
                pool_status(p, q, now)
            })
            .collect(),
    }
}

/// The page, with `/*STATUS*/null` standing for the data it is served with.
const PAGE: &str = include_str!("status.html");

/// JSON that is safe inside an HTML `<script>` element (no `</script>`, no `<!--`).
fn script_json(s: &Status) -> String {
    serde_json::to_string(s)
        .unwrap_or_else(|_| "null".into())
        .replace('<', "\\u003c")
}

/// The answer to `path` on the metrics listener if it is a status path: (status, content type, body).
pub fn respond(
    path: &str,
    pools: &Pools,
    metrics: &Metrics,
) -> Option<(u16, &'static str, Vec<u8>)> {
    match path {
        "/status" => {
            let page = PAGE.replacen("/*STATUS*/null", &script_json(&snapshot(pools, metrics)), 1);
            Some((200, "text/html; charset=utf-8", page.into_bytes()))
        }
        "/status.json" => {
            let body = serde_json::to_vec(&snapshot(pools, metrics)).unwrap_or_default();
            Some((200, "application/json", body))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_json_cannot_close_the_script() {
        let s = Status {
            version: "1",
            commit: "</script><script>alert(1)</script>",
            uptime_seconds: 0.0,
            time_unix_ms: 0,
            prefill_peak_window_seconds: 2.0,
            pools: vec![],
        };
        let j = script_json(&s);
        assert!(!j.contains('<'), "{j}");
        let back: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(back["commit"], s.commit);
    }

    #[test]
    fn the_page_has_its_placeholder_and_no_external_assets() {
        assert_eq!(PAGE.matches("/*STATUS*/null").count(), 1);
        for needle in [
            "http://", "https://", "//cdn", "@import", "src=\"/", "href=\"/",
        ] {
            assert!(!PAGE.contains(needle), "external reference {needle}");
        }
    }
}
