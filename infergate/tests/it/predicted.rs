//! predicted_ttft end to end with engine-sim: it learns each endpoint's prefill throughput, then places by
//! predicted time to first token, keeps sessions where their cache is, and exports how far off its predictions
//! were.

use std::time::Duration;

use crate::common::*;
use infergate_sim::{EngineHandle, SimConfig};

fn body(system: &str, user: &str, max_tokens: u32) -> String {
    serde_json::json!({
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "model": "sim-model", "stream": true, "max_tokens": max_tokens,
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_stay_with_their_cache_and_predictions_are_measured() {
    let eng = engines(2, slow_prefill()).await;
    let extra = format!("{}{ENGINE_STATS}", sessions_yaml(1000));
    let router = start_router(&pool_yaml("predicted_ttft", &urls(&eng), &extra)).await;
    router.all_healthy().await;
    router.learn_both_throughputs().await;
    let learned = |m: &str| {
        eng.iter().all(|e| {
            let ep = format!("endpoint=\"{}\"", e.addr);
            metric_value(
                m,
                "infergate_endpoint_ttft_throughput_tokens_per_second",
                &[&ep],
            )
            .is_some_and(|t| t > 0.0)
        })
    };
    router.metrics_when(learned).await;
    let system = "You are a coding agent with these tools: read, write, run. ".repeat(200);
    // Six sessions of three turns, one after another, every one placed by prediction.
    for s in 0..6 {
        let mut history = format!("session {s}: ") + &"the task at hand in detail; ".repeat(150);
        for turn in 0..3 {
            history.push_str(&format!(" turn {turn} adds more words to the conversation"));
            let status =
                post_chat_in_session(&router.url(), &format!("s{s}"), body(&system, &history, 4))
                    .await;
            assert_eq!(status, 200);
        }
    }
    // A prediction's error is observed when its request ends (`logging`), which can come just after the client
    // has the whole answer: wait for all 18 rather than reading the count once.
    let m = router
        .metrics_when(|m| {
            metric_sum(m, "infergate_placements_total", &[]) >= 20.0
                && metric_sum(m, "infergate_ttft_prediction_error_seconds_count", &[]) >= 18.0
        })
        .await;
    let reason = |r: &str| {
        metric_sum(
            &m,
            "infergate_placements_total",
            &[&format!("reason=\"{r}\"")],
        )
    };
    assert_eq!(reason("new_session"), 6.0, "{m}");
    assert_eq!(
        reason("sticky"),
        12.0,
        "idle engines: no session moves\n{m}"
    );
    // Once both throughputs were learned, placements were predicted and their error observed.
    let predicted = metric_sum(&m, "infergate_ttft_prediction_error_seconds_count", &[]);
    assert!(predicted >= 18.0, "{m}");
    // With sequential traffic the prediction is a prefill time: off by well under a second either way.
    let sum = metric_sum(&m, "infergate_ttft_prediction_error_seconds_sum", &[]);
    assert!(
        (sum / predicted).abs() < 1.0,
        "mean error {}",
        sum / predicted
    );
    // The line it predicts with, per endpoint: a throughput and a non-negative overhead.
    for e in &eng {
        let ep = format!("endpoint=\"{}\"", e.addr);
        let tps = metric_value(
            &m,
            "infergate_endpoint_ttft_throughput_tokens_per_second",
            &[&ep],
        );
        assert!(tps.is_some_and(|t| t > 0.0), "{m}");
        let overhead = metric_value(&m, "infergate_endpoint_ttft_overhead_seconds", &[&ep]);
        assert!(overhead.is_some_and(|o| (0.0..10.0).contains(&o)), "{m}");
    }
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prediction_error_series_exist_from_start() {
    let eng = engines(2, time_scaled(0.1)).await;
    let router = start_router(&pool_yaml("predicted_ttft", &urls(&eng), "")).await;
    router.all_healthy().await;
    let m = router.metrics_text().await;
    for e in &eng {
        let ep = format!("endpoint=\"{}\"", e.addr);
        assert_eq!(
            metric_value(&m, "infergate_ttft_prediction_error_seconds_count", &[&ep]),
            Some(0.0),
            "{m}"
        );
        // Nothing learned yet: no line to show (not a zero that reads as an infinitely slow engine); no engine
        // stats: no load placed elsewhere to show (unknown, not zero).
        for name in [
            "infergate_endpoint_ttft_throughput_tokens_per_second",
            "infergate_endpoint_ttft_overhead_seconds",
            "infergate_endpoint_foreign_requests",
        ] {
            assert_eq!(metric_value(&m, name, &[&ep]), None, "{name}");
        }
        for r in ["predicted", "load_aware"] {
            assert_eq!(
                metric_value(
                    &m,
                    "infergate_placements_total",
                    &[&ep, &format!("reason=\"{r}\"")]
                ),
                Some(0.0)
            );
        }
    }
    // Without sessions, before throughputs are learned: placed as load_aware.
    assert_eq!(
        post_chat(&router.url(), chat_body(2000, true, 4)).await,
        200
    );
    let m = router
        .metrics_when(|m| metric_sum(m, "infergate_placements_total", &[]) >= 1.0)
        .await;
    assert_eq!(
        metric_sum(&m, "infergate_placements_total", &["reason=\"load_aware\""]),
        1.0
    );
}

/// A session bound to one of two engines (two running sequences each, engine stats on) whose engine another tenant
/// floods: five ~25k-token requests sent straight to it, two running and three waiting where the router's engine
/// stats see them.
struct Flooded {
    router: TestRouter,
    eng: Vec<EngineHandle>,
    bound: usize,
    flood: tokio::task::JoinSet<Result<(), reqwest::Error>>,
    system: String,
    history: String,
}

impl Flooded {
    async fn start(sessions: &str) -> Flooded {
        let cfg = SimConfig {
            max_num_seqs: 2,
            ..slow_prefill()
        };
        let eng = engines(2, cfg).await;
        let extra = format!("{sessions}{ENGINE_STATS}");
        let router = start_router(&pool_yaml("predicted_ttft", &urls(&eng), &extra)).await;
        router.all_healthy().await;
        router.learn_both_throughputs().await;
        let mut f = Flooded {
            router,
            eng,
            bound: 0,
            flood: tokio::task::JoinSet::new(),
            system: "You are a coding agent with these tools: read, write, run. ".repeat(200),
            history: "the task at hand in detail; ".repeat(150),
        };
        let before = f.chat_requests();
        assert_eq!(f.turn().await, 200);
        let after = f.chat_requests();
        f.bound = (0..2).find(|&i| after[i] > before[i]).unwrap();
        let c = client();
        for k in 0..5 {
            let req = post_json(&c, &f.eng[f.bound].url(), CHAT).body(body(
                "another tenant",
                &(format!("flood {k} ") + &"words from elsewhere ".repeat(5000)),
                2000,
            ));
            f.flood.spawn(async move {
                finish(req.send().await?).await;
                Ok(())
            });
        }
        let bound = f.bound;
        f.router
            .wait_for(
                "the router's engine stats see the queue",
                Duration::from_secs(10),
                |r| {
                    let now = std::time::Instant::now();
                    r.state.pools.pools[0].endpoints()[bound]
                        .stats
                        .fresh(now)
                        .is_some_and(|l| l.waiting >= 2)
                },
            )
            .await;
        // The next turn grows the conversation a little.
        f.history.push_str(" one more turn");
        f
    }

    fn chat_requests(&self) -> Vec<usize> {
        self.eng.iter().map(chat_requests).collect()
    }

    fn turn(&self) -> impl std::future::Future<Output = u16> + Send + 'static {
        let (url, body) = (self.router.url(), body(&self.system, &self.history, 4));
        async move { post_chat_in_session(&url, "s", body).await }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_leaves_an_engine_another_tenant_floods() {
    let mut f = Flooded::start(&sessions_yaml(1000)).await;
    let bound = f.bound;
    // The load placed elsewhere is exported per endpoint.
    let bound_ep = format!("endpoint=\"{}\"", f.eng[bound].addr);
    f.router
        .metrics_when(|m| {
            metric_value(m, "infergate_endpoint_foreign_requests", &[&bound_ep])
                .is_some_and(|n| n >= 4.0)
        })
        .await;
    // The next turn would wait behind the flood's prefill: it moves, and its conversation is recomputed there.
    let before = f.chat_requests();
    assert_eq!(f.turn().await, 200);
    assert_eq!(chat_requests(&f.eng[1 - bound]), before[1 - bound] + 1);
    let m = f.router.metrics_text().await;
    assert_eq!(
        metric_sum(&m, "infergate_placements_total", &["reason=\"migrate\""]),
        1.0,
        "{m}"
    );
    f.flood.abort_all();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_move_margin_1_a_session_waits_out_the_flood_on_its_engine() {
    let sessions = "    sessions: { header: x-session-id, ttl: 1h, move_margin: 1 }\n";
    let mut f = Flooded::start(sessions).await;
    let bound = f.bound;
    let before = f.chat_requests();
    let turn = tokio::spawn(f.turn());
    // The turn stays with its cache, queued behind the flood.
    let total = |v: Vec<usize>| v.iter().sum::<usize>();
    f.router
        .wait_for(
            "the turn reaches an engine",
            Duration::from_secs(10),
            |_| total(f.chat_requests()) > total(before.clone()),
        )
        .await;
    assert_eq!(chat_requests(&f.eng[bound]), before[bound] + 1);
    let m = f.router.metrics_text().await;
    // Neither kind of move, and both series exist (at zero) for every endpoint.
    for e in &f.eng {
        let ep = format!("endpoint=\"{}\"", e.addr);
        for moved in ["reason=\"migrate\"", "reason=\"rescue\""] {
            assert_eq!(
                metric_value(&m, "infergate_placements_total", &[&ep, moved]),
                Some(0.0),
                "{moved} {m}"
            );
        }
    }
    assert_eq!(chat_requests(&f.eng[1 - bound]), before[1 - bound]);
    // The flood's clients give up; the engine frees their slots and serves the turn.
    f.flood.abort_all();
    assert_eq!(turn.await.unwrap(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predicted_ttft_splits_a_burst_on_equally_busy_engines_evenly() {
    assert_bursts_split_evenly("predicted_ttft").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predicted_ttft_sends_a_burst_to_the_engine_idle_of_load_placed_elsewhere() {
    // 4/4 before load placed elsewhere counted as prefill ahead: the streams were decoding.
    assert_bursts_prefer_the_idle_engine("predicted_ttft").await;
}
