//! Sessions across a restart (`state_file`): a router stopped gracefully writes its bindings, the next one loads
//! them, and the next turn of a conversation is `sticky` on the engine that holds its KV cache, counting only the
//! conversation's growth.

use std::path::{Path, PathBuf};

use crate::common::*;
use infergate::placement::estimate_tokens;

fn conversation(turns: usize) -> String {
    let mut messages =
        vec![serde_json::json!({"role": "system", "content": "You are a coding agent."})];
    for t in 0..turns {
        let words = "fn main() { println!(\"turn\"); } ".repeat(40 + t * 25);
        messages.push(serde_json::json!({"role": "user", "content": format!("turn {t}: {words}")}));
        messages.push(serde_json::json!({"role": "assistant", "content": format!("ok {t}")}));
    }
    serde_json::json!({"model": "sim-model", "stream": true, "max_tokens": 2, "messages": messages})
        .to_string()
}

fn state_path(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!(
        "infergate-session-state-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&p);
    p
}

/// Three engines, sessions on, the state file at `path` (written only at shutdown within the test), and a grace
/// period of one second: the graceful path's write runs at its start.
fn yaml(urls: &[String], path: &Path, tag: &str) -> String {
    format!(
        "{}state_file: {{ path: \"{}\", interval: 1h }}\n\
         server:\n  threads: 2\n  grace_period_seconds: 1\n  graceful_shutdown_timeout_seconds: 1\n  \
         pid_file: /tmp/infergate-state-{tag}.pid\n  upgrade_sock: /tmp/infergate-state-{tag}.sock\n",
        pool_yaml("load_aware", urls, &sessions_yaml(100)),
        path.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_stays_sticky_on_its_engine_across_a_graceful_restart() {
    let eng = engines(3, time_scaled(0.1)).await;
    let path = state_path("restart");
    let tag = format!("{}-restart", std::process::id());
    let bodies: Vec<String> = (1..=3).map(conversation).collect();

    let first = start_router(&yaml(&urls(&eng), &path, &tag)).await;
    first.all_healthy().await;
    for b in &bodies[..2] {
        assert_eq!(
            post_chat_in_session(&first.url(), "agent-7", b.clone()).await,
            200
        );
    }
    let counts: Vec<usize> = eng.iter().map(chat_requests).collect();
    let bound = counts
        .iter()
        .position(|&c| c == 2)
        .unwrap_or_else(|| panic!("not sticky before the restart: {counts:?}"));
    assert!(
        !path.exists(),
        "nothing written before the shutdown (interval 1h)"
    );
    first.stop_gracefully().await;
    let text = std::fs::read_to_string(&path).expect("the graceful shutdown wrote the state file");
    assert!(text.contains(&eng[bound].url()), "{text}");
    assert!(
        !text.contains("agent-7"),
        "the session id itself is never written"
    );

    let second = start_router(&yaml(&urls(&eng), &path, &tag)).await;
    second.all_healthy().await;
    assert_eq!(
        post_chat_in_session(&second.url(), "agent-7", bodies[2].clone()).await,
        200
    );
    let after: Vec<usize> = eng.iter().map(chat_requests).collect();
    assert_eq!(
        after[bound], 3,
        "the third turn went to the bound engine: {after:?}"
    );
    second.wait_idle().await;
    let m = second.metrics_text().await;
    let reason = |r: &str| {
        metric_sum(
            &m,
            "infergate_placements_total",
            &[&format!("reason=\"{r}\"")],
        )
    };
    assert_eq!((reason("sticky"), reason("new_session")), (1.0, 0.0));
    // The lineage size came along: only the conversation's growth counts.
    assert_eq!(
        metric_sum(&m, "infergate_prefill_tokens_estimated_total", &[]),
        estimate_tokens((bodies[2].len() - bodies[1].len()) as u64, 4.0, 262_144) as f64
    );
    drop(second);
    let _ = std::fs::remove_file(&path);
}

/// A non-streamed turn commits its binding only when its answer comes, which for one in flight at SIGTERM is after
/// the state file's write at the stop's start: the binary writes again once the clients are gone, so the next
/// instance knows the session. Real signals to the real binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_answered_during_a_graceful_stop_is_in_the_state_file() {
    // About 100 decode steps of 18 ms: a non-streamed answer of nearly 2 s.
    let eng = engines(2, infergate_sim::SimConfig::default()).await;
    let (listen, metrics) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("infergate-state-stop-{listen}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sessions.state");
    let pool = pool_yaml("load_aware", &urls(&eng), &sessions_yaml(100));
    let extra = format!(
        "state_file: {{ path: \"{}\", interval: 1h }}\n",
        path.display()
    );
    let child = serving_binary(&dir, (listen, metrics), &pool, &extra, 30).await;
    let url = format!("http://127.0.0.1:{listen}");
    let in_flight = tokio::spawn({
        let url = url.clone();
        async move { post_chat_in_session(&url, "agent-9", chat_body(64, false, 100)).await }
    });
    wait_metrics(metrics, "the turn in flight", |m| {
        metric_sum(m, "infergate_endpoint_requests_in_flight", &[]) == 1.0
    })
    .await;
    signal(child.id(), "TERM");
    assert_eq!(in_flight.await.unwrap(), 200, "answered after SIGTERM");
    let status = exit_status(child).await;
    assert!(status.success(), "{status:?}");
    let log = std::fs::read_to_string(dir.join("stderr")).unwrap_or_default();
    let text = std::fs::read_to_string(&path).expect("the state file");
    let served: Vec<usize> = eng.iter().map(chat_requests).collect();
    let bound = served
        .iter()
        .position(|&n| n == 1)
        .expect("one engine served it");
    assert!(
        text.contains(&eng[bound].url()) && text.lines().count() == 4,
        "header, pool, the one binding, end: {text}\n{log}"
    );
    assert!(
        log.contains("wrote 1 session bindings once the clients were gone"),
        "{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
