//! The route receipt (`route_receipt`): the `x-infergate-route` header tells a trusted client where its request
//! went and why (pool, endpoint, placement reason, predicted time to first token, tokens held, attempts), the
//! access log says the same; nobody gets it by default, and with `auth` only the keys named.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::common::*;
use infergate_sim::SimConfig;
use serde_json::Value;

fn scratch(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("infergate-receipt-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// The receipt's `key=value` pairs.
fn receipt(resp: &reqwest::Response) -> Option<HashMap<String, String>> {
    let v = header(resp, "x-infergate-route")?;
    Some(
        v.split("; ")
            .map(|kv| {
                let (k, v) = kv.split_once('=').expect("key=value");
                (k.to_string(), v.to_string())
            })
            .collect(),
    )
}

/// The access log's JSON lines once there are `n`.
async fn json_lines(path: &PathBuf, n: usize) -> Vec<Value> {
    for _ in 0..250 {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if lines.len() >= n {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("fewer than {n} access-log lines in {}", path.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_client_sees_where_its_request_went_and_the_log_says_the_same() {
    let eng = engines(1, SimConfig::default()).await;
    let log = scratch("all.log");
    let yaml = format!(
        "{}route_receipt: true\naccess_log: {{ format: json, path: \"{}\" }}\n",
        pool_yaml("load_aware", &urls(&eng), ""),
        log.display()
    );
    let router = start_router(&yaml).await;
    router.ready().await;
    let resp = send_chat(&router.url(), chat_body(4000, true, 4)).await;
    assert_eq!(resp.status(), 200);
    let r = receipt(&resp).expect("the receipt");
    assert_eq!(r["pool"], "default");
    assert_eq!(Some(&r["endpoint"]), served_by(&resp).as_ref());
    assert!(!r["reason"].is_empty(), "{r:?}");
    let tokens: u64 = r["tokens"].parse().unwrap();
    assert!(tokens > 0, "{r:?}");
    assert_eq!(r["attempts"], "1");
    assert!(
        !r.contains_key("predicted_ttft_ms"),
        "load_aware predicts nothing"
    );
    drain(resp).await.unwrap();

    let line = &json_lines(&log, 1).await[0];
    assert_eq!(line["pool"], "default");
    assert_eq!(line["endpoint"].as_str(), Some(r["endpoint"].as_str()));
    assert_eq!(line["reason"].as_str(), Some(r["reason"].as_str()));
    assert_eq!(line["tokens"].as_u64(), Some(tokens));
    assert_eq!(line["retries"], 0);
    assert!(line["ttft_ms"].as_f64().unwrap() > 0.0, "{line}");
    assert_eq!(line["trace_id"], Value::Null, "not traced");
    drop(router);

    // The same request to a router with the defaults: no receipt.
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), "")).await;
    router.ready().await;
    let resp = send_chat(&router.url(), chat_body(4000, true, 4)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-infergate-route"), None);
    assert!(served_by(&resp).is_some());
    drain(resp).await.unwrap();
    let _ = std::fs::remove_file(&log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_only_the_keys_named_get_the_receipt() {
    const ALICE: &str = "sk-receipt-alice-0123456789";
    const BOB: &str = "sk-receipt-bob-0123456789ab";
    let eng = engines(1, SimConfig::default()).await;
    let keys = scratch("keys");
    std::fs::write(&keys, format!("alice:{ALICE}\nbob:{BOB}\n")).unwrap();
    let yaml = format!(
        "auth:\n  keys_file: {}\nroute_receipt: [alice]\n{}",
        keys.display(),
        pool_yaml("load_aware", &urls(&eng), "")
    );
    let router = start_router(&yaml).await;
    router.ready().await;
    let send = |key: &'static str| {
        post_json(&client(), &router.url(), CHAT)
            .bearer_auth(key)
            .body(chat_body(800, false, 2))
            .send()
    };
    let resp = send(ALICE).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(receipt(&resp).expect("alice's receipt")["pool"], "default");
    drain(resp).await.unwrap();
    let resp = send(BOB).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-infergate-route"), None, "bob is not named");
    drain(resp).await.unwrap();
    let _ = std::fs::remove_file(&keys);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receipt_counts_attempts_and_names_the_predicted_time_to_first_token() {
    let eng = engines(2, slow_prefill()).await;
    let log = scratch("predicted.log");
    let yaml = format!(
        "{}route_receipt: true\naccess_log: {{ format: json, path: \"{}\" }}\n",
        pool_yaml("predicted_ttft", &urls(&eng), ENGINE_STATS),
        log.display()
    );
    let router = start_router(&yaml).await;
    router.all_healthy().await;
    router.learn_both_throughputs().await;
    let resp = send_chat(&router.url(), chat_body(6000, true, 4)).await;
    assert_eq!(resp.status(), 200);
    let r = receipt(&resp).expect("the receipt");
    let predicted: u64 = r["predicted_ttft_ms"].parse().unwrap();
    assert_eq!(r["attempts"], "1");
    drain(resp).await.unwrap();
    let lines = json_lines(&log, 3).await;
    let line = lines.last().unwrap();
    let logged = line["predicted_ttft_ms"].as_f64().unwrap();
    assert_eq!(logged.floor() as u64, predicted, "{line}");

    // An engine that refuses: the request is retried elsewhere, and the receipt says it took two attempts.
    // The engine that served the last request refuses the next one (the policy tends to pick it again, or picks
    // at random between idle ones): within a dozen requests one starts on it and is retried on the other.
    let label = |i: usize| eng[i].url().trim_start_matches("http://").to_string();
    let mut last = r["endpoint"].clone();
    let mut retried = None;
    for i in 0..12 {
        let bad = usize::from(label(1) == last);
        eng[bad].control.set_fail_status(Some(503));
        eng[1 - bad].control.set_fail_status(None);
        let resp = send_chat(&router.url(), chat_body(500 + i, false, 2)).await;
        assert_eq!(resp.status(), 200);
        let r = receipt(&resp).unwrap();
        drain(resp).await.unwrap();
        assert_eq!(r["endpoint"], label(1 - bad), "{r:?}");
        last = r["endpoint"].clone();
        if r["attempts"] == "2" {
            retried = Some(r);
            break;
        }
    }
    assert!(retried.is_some(), "one request was refused and retried");
    let _ = std::fs::remove_file(&log);
}
