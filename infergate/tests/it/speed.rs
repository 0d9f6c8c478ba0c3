//! Learned decode speeds and speed outliers end to end with engine-sim: each endpoint's decode line is learned
//! from the streams it serves; an engine that slows to a third mid-run becomes a speed outlier (metric, status
//! page) and gets less new work, and leaves once it is back at speed. A stream's decode is timed by the tokens
//! it carries, on every API.

use std::time::Duration;

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

/// Events of one named type: `event: <name>` and its data.
fn event(name: &str, data: &str) -> String {
    format!("event: {name}\ndata: {{\"type\":\"{name}\"{data}}}\n\n")
}

/// A short answer in the shape of `head`'s API: 8 events of `x-tokens-per-event` tokens each (1 by default) at 5 ms
/// a token, 4 of reasoning and 4 of text, the events that open and close each part 1 ms after the token before
/// them, and the usage the engine reports at the end. With `x-events-per-write: n` the token events are written n
/// at a time (one read of several events), and a chat stream reports no usage (as without `include_usage`).
fn paced_answer(head: &[u8]) -> Vec<(Duration, String)> {
    let ms = Duration::from_millis;
    let api = if head.starts_with(b"POST /v1/responses") {
        "responses"
    } else if head.starts_with(b"POST /v1/messages") {
        "messages"
    } else {
        "chat"
    };
    let per_event: u64 = head
        .split(|&b| b == b'\n')
        .find_map(|l| l.strip_prefix(b"x-tokens-per-event: "))
        .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse().ok())
        .unwrap_or(1);
    let per_write: u64 = head
        .split(|&b| b == b'\n')
        .find_map(|l| l.strip_prefix(b"x-events-per-write: "))
        .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse().ok())
        .unwrap_or(1);
    let usage = 8 * per_event;
    let delta = |part: usize| match (api, part) {
        ("responses", 0) => event("response.reasoning_text.delta", ",\"delta\":\"r\""),
        ("responses", _) => event("response.output_text.delta", ",\"delta\":\"t\""),
        ("messages", _) => event("content_block_delta", ",\"delta\":{\"text\":\"t\"}"),
        _ => "data: {\"choices\":[{\"delta\":{\"content\":\"t\"}}]}\n\n".to_string(),
    };
    let (open, between, close): (&[&str], &[&str], &[&str]) = match api {
        "responses" => (
            &[
                "response.output_item.added",
                "response.reasoning_part.added",
            ],
            &[
                "response.reasoning_text.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
            ],
            &[
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ],
        ),
        "messages" => (
            &["message_start", "content_block_start", "ping"],
            &["content_block_stop", "content_block_start"],
            &["content_block_stop", "message_delta", "message_stop"],
        ),
        _ => (&[], &[], &[]),
    };
    let mut out = Vec::new();
    if api == "responses" {
        out.push((
            ms(0),
            event("response.created", "") + &event("response.in_progress", ""),
        ));
    }
    // The first output 20 ms in, its opening events 1 ms apart, then a token every 5 ms.
    let mut at = ms(20);
    for name in open {
        out.push((at, event(name, "")));
        at += ms(1);
    }
    let mut written = String::new();
    for i in 0..8 {
        let token_at = ms(20 + open.len() as u64 + 5 * per_event * i);
        if i == 4 {
            for (k, name) in between.iter().enumerate() {
                out.push((token_at - ms(4) + ms(k as u64), event(name, "")));
            }
        }
        written += &delta(i as usize / 4);
        if (i + 1) % per_write == 0 || i == 7 {
            out.push((token_at, std::mem::take(&mut written)));
        }
        at = token_at;
    }
    for name in close {
        at += ms(1);
        let data = match *name {
            "response.completed" => {
                format!(
                    ",\"response\":{{\"usage\":{{\"input_tokens\":2,\"output_tokens\":{usage}}}}}"
                )
            }
            "message_delta" => format!(",\"usage\":{{\"output_tokens\":{usage}}}"),
            _ => String::new(),
        };
        out.push((at, event(name, &data)));
    }
    if api == "chat" && per_write > 1 {
        out.push((at, "data: [DONE]\n\n".to_string()));
    } else if api == "chat" {
        let usage = format!(
            "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":2,\"completion_tokens\":{usage}}}}}\n\n"
        );
        out.push((at, usage + "data: [DONE]\n\n"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streams_decode_is_timed_by_its_tokens_on_every_api() {
    // Responses and Messages answers open and close their parts with events that carry no token, here 1 ms after
    // the token before them: timed as tokens, they made a short answer's decode read about 1 ms a token, not 5.
    // And an event may carry several tokens (vLLM's API server behind its engine): the engine's reported count
    // scales the timing, which read 15 ms a token and an answer of 8 for 24 tokens at 3 an event. And a read may
    // carry several events: a chat stream without usage was counted a token a read, 10 ms a token at 2 a read.
    let engine = paced_engine(paced_answer).await;
    let mut learned = Vec::new();
    for (per_event, per_write) in [(1u64, 1u64), (3, 1), (1, 2)] {
        for path in ["/v1/chat/completions", "/v1/responses", "/v1/messages"] {
            let router =
                start_router(&pool_yaml("load_aware", std::slice::from_ref(&engine), "")).await;
            router.all_healthy().await;
            let c = client();
            let body = serde_json::json!({"model": "m", "stream": true, "max_tokens": 8,
                                          "messages": [{"role": "user", "content": "hi"}], "input": "hi"});
            for _ in 0..4 {
                let r = post_json(&c, &router.url(), path)
                    .header("x-tokens-per-event", per_event.to_string())
                    .header("x-events-per-write", per_write.to_string())
                    .body(body.to_string())
                    .send()
                    .await
                    .unwrap();
                assert_eq!(finish(r).await, 200, "{path}");
            }
            let m = router
                .metrics_when(|m| {
                    metric_value(m, "infergate_endpoint_decode_seconds_per_token", &[]).is_some()
                })
                .await;
            learned.push((
                path,
                (per_event, per_write),
                // NaN: nothing learned (too few reads counted to time).
                metric_value(&m, "infergate_endpoint_decode_seconds_per_token", &[])
                    .unwrap_or(f64::NAN),
                metric_value(&m, "infergate_pool_typical_answer_tokens", &[]),
            ));
            router.wait_idle().await;
        }
    }
    for (path, (per_event, per_write), step, answer) in &learned {
        assert!(
            (step / 0.005 - 1.0).abs() < 0.3,
            "{path} at {per_event} an event, {per_write} a read, taught {step} s a token, not 5 ms: {learned:?}"
        );
        let tokens = 8.0 * *per_event as f64;
        assert!(
            answer.is_some_and(|a| (tokens..=tokens + 1.0).contains(&a)),
            "{path} at {per_event} an event, {per_write} a read: {learned:?}"
        );
    }
}
