//! A burst of new sessions after load placed around the router: the issue-13 split tests of prefix_aware and
//! predicted_ttft share it.

use std::time::Duration;

use super::*;

fn burst_body(system: &str, user: &str, max_tokens: u32) -> String {
    serde_json::json!({
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "model": "sim-model", "stream": true, "max_tokens": max_tokens,
    })
    .to_string()
}

/// Eight new sessions at once through `policy` (prefix_aware, or predicted_ttft once it has learned both
/// throughputs) with engine stats, after `foreign[i]` long streams were sent straight to engine `i` (not through
/// the router); the burst's split per engine.
pub async fn burst_after_foreign_load(policy: &str, foreign: [usize; 2]) -> Vec<usize> {
    let eng = engines(2, slow_prefill()).await;
    // Scrapes 1 s apart, so that the burst lands inside one interval (a scrape in the middle of it can see a
    // request the router counts as sent but the engine has not received yet, and read one foreign request less).
    let stats = ENGINE_STATS.replace("interval: 100ms", "interval: 1s");
    let predicted = policy == "predicted_ttft";
    let extra = if predicted {
        format!("{}{stats}", sessions_yaml(1000))
    } else {
        format!("{PREFIX}{stats}")
    };
    let router = start_router(&pool_yaml(policy, &urls(&eng), &extra)).await;
    router.all_healthy().await;
    if predicted {
        router.learn_both_throughputs().await;
    }
    // Load placed elsewhere: long streams sent to the engines directly, kept open through the burst.
    let c = client();
    let mut streams = Vec::new();
    for (i, &n) in foreign.iter().enumerate() {
        for k in 0..n {
            let r = post_json(&c, &eng[i].url(), CHAT)
                .body(burst_body("foreign", &format!("elsewhere {i} {k}"), 3000))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            streams.push(r);
        }
    }
    router
        .wait_for(
            "the router's engine stats see the foreign load",
            Duration::from_secs(10),
            |r| {
                let now = std::time::Instant::now();
                let eps = r.state.pools.pools[0].endpoints();
                eps.iter().zip(foreign).all(|(e, n)| {
                    e.stats
                        .fresh(now)
                        .is_some_and(|l| l.running + l.waiting == n as u64)
                })
            },
        )
        .await;
    // The burst: 8 new sessions with distinct ~10k-token prompts, all sent at once (inside one scrape interval).
    let mut tasks = tokio::task::JoinSet::new();
    for s in 0..8 {
        let prompt = format!("burst session {s}: ") + &"a long task description; ".repeat(1600);
        let req = post_json(&c, &router.url(), CHAT)
            .header("x-test", format!("burst-{s}"))
            .header(SESSION_HEADER, format!("burst-{s}"))
            .body(burst_body("agent", &prompt, 20));
        tasks.spawn(async move { Ok::<u16, reqwest::Error>(finish(req.send().await?).await) });
    }
    while let Some(r) = tasks.join_next().await {
        assert_eq!(r.unwrap().unwrap(), 200);
    }
    drop(streams);
    if predicted {
        let m = router.metrics_text().await;
        let placed = |r: &str| {
            metric_sum(
                &m,
                "infergate_placements_total",
                &[&format!("reason=\"{r}\"")],
            )
        };
        assert_eq!(
            placed("new_session"),
            8.0,
            "the burst was placed by prediction\n{m}"
        );
    }
    eng.iter().map(|e| tagged(e, "burst")).collect()
}

/// Three bursts on two engines each running two streams from elsewhere: every one splits 4/4.
pub async fn assert_bursts_split_evenly(policy: &str) {
    for _ in 0..3 {
        let split = burst_after_foreign_load(policy, [2, 2]).await;
        assert_eq!(split, vec![4, 4], "{policy}");
    }
}

/// Two bursts with four streams from elsewhere on engine 0 and none on engine 1: the balanced end state is 2/6,
/// the bar at least 5 of 8 on the idle engine.
pub async fn assert_bursts_prefer_the_idle_engine(policy: &str) {
    for _ in 0..2 {
        let split = burst_after_foreign_load(policy, [4, 0]).await;
        assert_eq!(split.iter().sum::<usize>(), 8);
        assert!(
            split[1] >= 5,
            "{policy}: the idle engine got too few: {split:?}"
        );
    }
}
