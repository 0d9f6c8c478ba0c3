//! Learned decode speeds and speed outliers end to end with engine-sim: each endpoint's decode line is learned
//! from the streams it serves; an engine that slows to a third mid-run becomes a speed outlier (metric, status
//! page) and gets less new work, and leaves once it is back at speed.

use crate::common::*;

/// A streamed chat request of `n`, with 32 output tokens.
fn body(n: usize) -> String {
    serde_json::json!({
        "model": "sim-model", "stream": true, "max_tokens": 32,
        "messages": [{"role": "user", "content": format!("request {n}: {}", "a few words of text ".repeat(40))}],
    })
    .to_string()
}

/// Send `rounds` rounds of `width` concurrent streams; how many each engine received meanwhile.
async fn rounds(
    url: &str,
    eng: &[infergate_sim::EngineHandle],
    rounds: usize,
    width: usize,
) -> Vec<usize> {
    let before: Vec<usize> = eng.iter().map(chat_requests).collect();
    for r in 0..rounds {
        let sends = (0..width).map(|i| post_chat(url, body(r * width + i)));
        for status in futures_util::future::join_all(sends).await {
            assert_eq!(status, 200);
        }
    }
    eng.iter()
        .zip(before)
        .map(|(e, b)| chat_requests(e) - b)
        .collect()
}

fn outlier(m: &str, e: &infergate_sim::EngineHandle) -> Option<f64> {
    let ep = format!("endpoint=\"{}\"", e.addr);
    metric_value(m, "infergate_endpoint_speed_outlier", &[&ep])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_slows_to_a_third_gets_less_work_until_it_recovers() {
    let eng = engines(2, time_scaled(0.25)).await;
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), "")).await;
    router.all_healthy().await;
    let url = router.url();
    // Both engines at speed: their decode lines are learned, neither is an outlier.
    let even = rounds(&url, &eng, 12, 2).await;
    let m = router
        .metrics_when(|m| {
            eng.iter().all(|e| {
                let ep = format!("endpoint=\"{}\"", e.addr);
                metric_value(m, "infergate_endpoint_decode_seconds_per_token", &[&ep])
                    .is_some_and(|s| s > 0.0)
            })
        })
        .await;
    assert!(even.iter().all(|&n| n >= 6), "{even:?}");
    assert!(eng.iter().all(|e| outlier(&m, e) == Some(0.0)), "{m}");
    assert!(
        metric_value(
            &m,
            "infergate_pool_typical_answer_tokens",
            &["pool=\"default\""]
        )
        .is_some_and(|t| (20.0..=40.0).contains(&t)),
        "{m}"
    );
    // Engine 1 slows to a third: within a few of its streams it is a speed outlier.
    eng[1].control.set_speed(1.0 / 3.0);
    let mut entered = None;
    for _ in 0..20 {
        rounds(&url, &eng, 1, 2).await;
        let m = router.metrics_text().await;
        if outlier(&m, &eng[1]) == Some(1.0) {
            entered = Some(m);
            break;
        }
    }
    let m = entered.expect("engine 1 never became a speed outlier");
    assert_eq!(outlier(&m, &eng[0]), Some(0.0), "{m}");
    let ep1 = format!("endpoint=\"{}\"", eng[1].addr);
    let relative = metric_value(&m, "infergate_endpoint_relative_speed", &[&ep1]).unwrap();
    assert!(relative < 0.4, "{relative}");
    let status = get_json(&format!("http://{}", router.metrics_addr), "/status.json").await;
    let shown = status["pools"][0]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["endpoint"] == eng[1].addr.to_string())
        .cloned()
        .unwrap();
    assert_eq!(shown["speed_outlier"], true, "{shown}");
    assert!(
        shown["decode_seconds_per_token"].as_f64().is_some(),
        "{shown}"
    );
    // It gets less new work (weighted, not cut off).
    let slow = rounds(&url, &eng, 8, 3).await;
    assert!(slow[1] < slow[0], "{slow:?}");
    // Back at speed: its streams are faster than its lines now say, and it leaves.
    eng[1].control.set_speed(1.0);
    let mut left = false;
    for _ in 0..40 {
        rounds(&url, &eng, 1, 3).await;
        if outlier(&router.metrics_text().await, &eng[1]) == Some(0.0) {
            left = true;
            break;
        }
    }
    assert!(left, "engine 1 stayed a speed outlier after it recovered");
    router.wait_idle().await;
}
