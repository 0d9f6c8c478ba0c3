//! The `burst` scenario: engines already hold long-running streams; one chatty warm-up session builds a request
//! history; then `burst_sessions` new long sessions arrive within `burst_window_ms`. Which engine served what is
//! read from the engines' `/sim/stats` request-count deltas around each phase. With several `--url`s (engines
//! without a router) request `i` of each phase goes to URL `i mod n`.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

use super::client::{self, Call, ChatBody, Msg};
use super::report::BurstReport;
use super::stats::{self, EngineTotals};
use super::text::TextGen;
use super::workload::{mix, Range};
use super::{session_headers, snapshot, Config, Report, Run};

fn body(cfg: &Config, messages: &[Msg], max_tokens: u64) -> Vec<u8> {
    ChatBody {
        model: &cfg.model,
        messages,
        max_tokens,
        stream: true,
        ignore_eos: true,
        temperature: 0.0,
        field_order: cfg.field_order,
    }
    .to_vec()
}

fn requests_delta(before: &[EngineTotals], after: &[EngineTotals]) -> Vec<u64> {
    after
        .iter()
        .zip(before)
        .map(|(a, b)| a.since(b).requests)
        .collect()
}

fn scaled(cfg: &Config, tokens: u64) -> usize {
    ((tokens as f64 * cfg.shape.size_scale).round() as usize).max(1)
}

/// Polls the engines until `want` new requests arrived since `before` (or `limit` passed); returns the deltas.
async fn wait_for_requests(
    run: &Run,
    urls: &[String],
    before: &[EngineTotals],
    want: u64,
    limit: Duration,
) -> Result<Vec<u64>, String> {
    let end = tokio::time::Instant::now() + limit;
    loop {
        let now = snapshot(run, urls).await?;
        let d = requests_delta(before, &now);
        if d.iter().sum::<u64>() >= want || tokio::time::Instant::now() >= end {
            return Ok(d);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(super) async fn run(cfg: &Config) -> Result<Report, String> {
    let run = Run::new(cfg, 64);
    let urls = &cfg.engine_stats_urls;
    let targets: Vec<String> = cfg.urls.iter().map(|u| client::chat_url(u)).collect();
    let mut report = Report {
        targets: cfg.urls.clone(),
        ..Report::default()
    };
    let progress = run.progress(cfg.progress, 0);
    let result = tokio::time::timeout_at(run.deadline, phases(&run, cfg, &targets)).await;
    if let Some(p) = progress {
        p.abort();
    }
    let (burst, before0, after) = match result {
        Ok(r) => r?,
        Err(_) => {
            return Err(format!(
                "burst did not finish within --max-seconds {}",
                cfg.max_seconds
            ))
        }
    };
    run.fill(&mut report);
    // Background streams are aborted on purpose: they are neither errors nor unfinished foreground requests.
    report.unfinished = 0;
    report.requests = report.ok + report.errors;
    report.engines = Some(stats::engine_report(urls, &before0, &after));
    report.sessions.planned = burst.new_sessions;
    report.burst = Some(burst);
    Ok(report)
}

/// Runs the three phases; returns the burst report and the engine totals before and after.
async fn phases(
    run: &Arc<Run>,
    cfg: &Config,
    targets: &[String],
) -> Result<(BurstReport, Vec<EngineTotals>, Vec<EngineTotals>), String> {
    let urls = &cfg.engine_stats_urls;
    let before0 = snapshot(run, urls).await?;

    // 1. Background streams, started one after the other (each placed before the next arrives), each running
    //    until the end of the run (huge max_tokens; aborted when the burst is done).
    let n_bg = cfg.background_streams.unwrap_or(2 * urls.len());
    let bg_live = Arc::new(client::Live::default());
    let mut background = JoinSet::new();
    let mut first_tokens = Vec::new();
    for i in 0..n_bg {
        let mut g = TextGen::new(mix(cfg.seed, 0xB6_0000 + i as u64));
        let messages = [Msg {
            role: "user",
            content: g.text(scaled(cfg, cfg.background_tokens)),
        }];
        let b = body(cfg, &messages, cfg.background_max_tokens);
        let headers = session_headers(cfg, &format!("bg{}-{i}", cfg.seed));
        let (tx, rx) = tokio::sync::oneshot::channel();
        first_tokens.push(rx);
        let (client, url, live) = (
            run.client.clone(),
            targets[i % targets.len()].clone(),
            bg_live.clone(),
        );
        let timeout = Duration::from_secs_f64(cfg.max_seconds);
        background.spawn(async move {
            let call = Call {
                url: &url,
                headers: &headers,
                body: b,
                stream: true,
                timeout,
            };
            client::chat(&client, call, &live, Some(tx)).await;
        });
        wait_for_requests(run, urls, &before0, i as u64 + 1, Duration::from_secs(10)).await?;
    }
    for rx in first_tokens {
        // A stream that failed drops its sender: go on; the split shows what happened.
        let _ = rx.await;
    }
    let after_bg = snapshot(run, urls).await?;
    let background_split = requests_delta(&before0, &after_bg);

    // 2. Warm-up: one session with many short turns (a request history on whichever engine it sticks to).
    let mut g = TextGen::new(mix(cfg.seed, 0x3A_2000));
    let warm_headers = session_headers(cfg, &format!("warm{}", cfg.seed));
    let mut messages = Vec::new();
    for t in 0..cfg.warm_turns {
        let tokens = if t == 0 {
            scaled(cfg, 1_000)
        } else {
            scaled(cfg, 100)
        };
        messages.push(Msg {
            role: "user",
            content: g.text(tokens),
        });
        let call = Call {
            url: &targets[0],
            headers: &warm_headers,
            body: body(cfg, &messages, 4),
            stream: true,
            timeout: run.request_timeout,
        };
        let out = client::chat(&run.client, call, &run.live, None).await;
        run.record(&out);
        messages.push(Msg {
            role: "assistant",
            content: out.content.clone(),
        });
    }
    let after_warm = snapshot(run, urls).await?;
    let warm_split = requests_delta(&after_bg, &after_warm);

    // 3. The burst: bodies built first so the window holds only the sends.
    let n = cfg.burst_sessions;
    let mut rng = fastrand::Rng::with_seed(mix(cfg.seed, 0xB0_0057));
    let tokens = Range::new(cfg.burst_tokens.min, cfg.burst_tokens.max);
    let mut bodies = Vec::with_capacity(n);
    for i in 0..n {
        let mut g = TextGen::new(mix(cfg.seed, 0xB0_1000 + i as u64));
        let messages = [Msg {
            role: "user",
            content: g.text(scaled(cfg, tokens.draw(&mut rng))),
        }];
        let max_tokens = cfg.shape.output_tokens.draw(&mut rng).max(1);
        bodies.push((
            body(cfg, &messages, max_tokens),
            session_headers(cfg, &format!("burst{}-{i}", cfg.seed)),
        ));
    }
    let before_burst = snapshot(run, urls).await?;
    let window = Duration::from_secs_f64(cfg.burst_window_ms.max(0.0) / 1e3);
    let start = tokio::time::Instant::now();
    let mut set = JoinSet::new();
    for (i, (b, headers)) in bodies.into_iter().enumerate() {
        let at = if n > 1 {
            window.mul_f64(i as f64 / (n - 1) as f64)
        } else {
            Duration::ZERO
        };
        tokio::time::sleep_until(start + at).await;
        let (run2, url) = (run.clone(), targets[i % targets.len()].clone());
        set.spawn(async move {
            run2.live
                .sessions_started
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let call = Call {
                url: &url,
                headers: &headers,
                body: b,
                stream: true,
                timeout: run2.request_timeout,
            };
            let out = client::chat(&run2.client, call, &run2.live, None).await;
            run2.record(&out);
            out
        });
    }
    let mut ttfts = Vec::new();
    let mut completed = 0;
    while let Some(r) = set.join_next().await {
        if let Ok(out) = r {
            if out.ok() {
                completed += 1;
            }
            ttfts.extend(out.first_token_at.map(|d| d.as_secs_f64() * 1e3));
        }
    }
    let burst_split =
        wait_for_requests(run, urls, &before_burst, n as u64, Duration::from_secs(5)).await?;
    let after = snapshot(run, urls).await?;
    background.abort_all();
    while background.join_next().await.is_some() {}

    run.sessions_completed
        .store(completed, std::sync::atomic::Ordering::Relaxed);
    let total: u64 = burst_split.iter().sum();
    let max_share = if total == 0 {
        0.0
    } else {
        *burst_split.iter().max().unwrap_or(&0) as f64 / total as f64
    };
    Ok((
        BurstReport {
            new_sessions: n as u64,
            window_ms: cfg.burst_window_ms,
            background_streams: n_bg as u64,
            warm_requests: cfg.warm_turns as u64,
            background_split,
            warm_split,
            split: burst_split
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join("/"),
            burst_split,
            max_share,
            burst_ttft_ms: stats::summarize(&ttfts),
        },
        before0,
        after,
    ))
}
