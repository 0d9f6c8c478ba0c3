//! The `overhead` scenario: the same tiny non-streaming requests at fixed concurrency, straight to an engine
//! (`--direct-url`) and through the router (`--url`), alternating in rounds so both see the same machine state.
//! Reports added latency, requests/s and the router's CPU time (from /proc of `--router-pid`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::client::{self, Call, ChatBody, Msg};
use super::report::{LatencyRun, OverheadReport};
use super::stats;
use super::{Config, Report, Run};

/// One timed phase against one URL: (latencies in ms, errors, seconds).
async fn phase(
    run: &Arc<Run>,
    url: &str,
    body: &Arc<Vec<u8>>,
    n: usize,
    concurrency: usize,
) -> (Vec<f64>, u64, f64) {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..concurrency.min(n) {
        let (run, url, body, next) = (run.clone(), url.to_string(), body.clone(), next.clone());
        set.spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0u64;
            while next.fetch_add(1, Ordering::Relaxed) < n {
                let call = Call {
                    url: &url,
                    headers: &[],
                    body: body.as_ref().clone(),
                    stream: false,
                    timeout: run.request_timeout,
                };
                let out = client::chat(&run.client, call, &run.live, None).await;
                if out.ok() {
                    lat.push(out.total.as_secs_f64() * 1e3);
                } else {
                    errors += 1;
                }
            }
            (lat, errors)
        });
    }
    let mut lat = Vec::with_capacity(n);
    let mut errors = 0;
    while let Some(r) = set.join_next().await {
        if let Ok((l, e)) = r {
            lat.extend(l);
            errors += e;
        }
    }
    (lat, errors, start.elapsed().as_secs_f64())
}

#[derive(Default)]
struct Acc {
    lat: Vec<f64>,
    errors: u64,
    seconds: f64,
}

impl Acc {
    fn finish(self, url: &str) -> LatencyRun {
        let requests = self.lat.len() as u64 + self.errors;
        LatencyRun {
            url: url.to_string(),
            requests,
            errors: self.errors,
            seconds: self.seconds,
            requests_per_s: if self.seconds > 0.0 {
                self.lat.len() as f64 / self.seconds
            } else {
                0.0
            },
            latency_ms: stats::summarize(&self.lat),
        }
    }
}

pub(super) async fn run(cfg: &Config) -> Result<Report, String> {
    let run = Run::new(cfg, cfg.concurrency * 2);
    let router = client::chat_url(&cfg.urls[0]);
    let direct = cfg.direct_url.as_deref().map(client::chat_url);
    let mut report = Report {
        targets: cfg.urls.iter().chain(&cfg.direct_url).cloned().collect(),
        ..Report::default()
    };
    let messages = [Msg {
        role: "user",
        content: "Say hello to the benchmark, briefly.".into(),
    }];
    let body = Arc::new(
        ChatBody {
            model: &cfg.model,
            messages: &messages,
            max_tokens: 1,
            stream: false,
            ignore_eos: true,
            temperature: 0.0,
            field_order: cfg.field_order,
        }
        .to_vec(),
    );
    let progress = run.progress(cfg.progress, 0);
    let per_round = cfg.requests.div_ceil(cfg.rounds);
    let warm = (cfg.concurrency * 4).min(200);
    let mut acc_direct = Acc::default();
    let mut acc_router = Acc::default();
    let mut cpu_seconds = 0.0;
    let mut cpu_error = None;
    let work = async {
        for _ in 0..cfg.rounds {
            if let Some(d) = &direct {
                phase(&run, d, &body, warm, cfg.concurrency).await;
                let (l, e, s) = phase(&run, d, &body, per_round, cfg.concurrency).await;
                acc_direct.lat.extend(l);
                acc_direct.errors += e;
                acc_direct.seconds += s;
            }
            phase(&run, &router, &body, warm, cfg.concurrency).await;
            let cpu0 = cfg.router_pid.map(stats::process_tree_cpu_seconds);
            let (l, e, s) = phase(&run, &router, &body, per_round, cfg.concurrency).await;
            let cpu1 = cfg.router_pid.map(stats::process_tree_cpu_seconds);
            match (cpu0, cpu1) {
                (Some(Ok(a)), Some(Ok(b))) => cpu_seconds += (b - a).max(0.0),
                (Some(Err(e)), _) | (_, Some(Err(e))) => cpu_error = Some(e),
                _ => {}
            }
            acc_router.lat.extend(l);
            acc_router.errors += e;
            acc_router.seconds += s;
        }
    };
    report.timed_out = tokio::time::timeout_at(run.deadline, work).await.is_err();
    if let Some(p) = progress {
        p.abort();
    }
    run.fill(&mut report);
    // The warm-up requests are not part of the measurement.
    report.ttft_ms = None;
    report.headers_ms = None;
    report.decode = None;
    let router_run = acc_router.finish(&cfg.urls[0]);
    let direct_run = cfg.direct_url.as_deref().map(|u| acc_direct.finish(u));
    let p = |r: &LatencyRun, f: fn(&stats::Pct) -> f64| r.latency_ms.as_ref().map(f);
    let diff = |f: fn(&stats::Pct) -> f64| match &direct_run {
        Some(d) => Some(p(&router_run, f)? - p(d, f)?),
        None => None,
    };
    let measured = cfg.router_pid.is_some() && cpu_error.is_none() && router_run.seconds > 0.0;
    report.overhead = Some(OverheadReport {
        concurrency: cfg.concurrency as u64,
        added_p50_ms: diff(|x| x.p50),
        added_p99_ms: diff(|x| x.p99),
        rps_ratio: direct_run
            .as_ref()
            .filter(|d| d.requests_per_s > 0.0)
            .map(|d| router_run.requests_per_s / d.requests_per_s),
        router_cpu_seconds: measured.then_some(cpu_seconds),
        router_cpu_us_per_request: (measured && router_run.requests > 0)
            .then(|| cpu_seconds * 1e6 / router_run.requests as f64),
        router_cpu_cores: measured.then(|| cpu_seconds / router_run.seconds),
        direct: direct_run,
        router: router_run,
    });
    if let Some(e) = cpu_error {
        report.notes.push(format!("router CPU not measured: {e}"));
    }
    Ok(report)
}
