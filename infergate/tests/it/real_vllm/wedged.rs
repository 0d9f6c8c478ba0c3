//! A real vLLM whose engine core is wedged (its process stopped): the API server still answers `/health`,
//! `/metrics` and a stream's headers at once, and nothing follows (a request not streamed gets nothing at all). A
//! session bound there must move once two of its turns go unanswered, streamed or not, with the router's default
//! outlier settings.

use std::time::Duration;

use super::*;
use serde_json::json;

/// What the session's clients wait for a turn: past `outlier_detection.stream_headers_within` (3 s by default)
/// with room for a loaded machine, as an impatient agent gives up.
const PATIENCE: Duration = Duration::from_secs(6);

/// An engine core stopped (SIGSTOP) for as long as this lives; continued on drop, also when the test panics.
struct Stopped(u32);

impl Stopped {
    fn new(pid: u32) -> Stopped {
        assert!(signal(pid, "STOP"), "SIGSTOP {pid}");
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal(self.0, "CONT");
    }
}

/// One turn of session `s` from a client that gives up after [`PATIENCE`]: its status (0: gave up) and the endpoint
/// that served it.
async fn turn(base: &str, s: &str, body: String, stream: bool) -> (u16, Option<String>) {
    let req = post_json(&client(), base, CHAT)
        .header(SESSION_HEADER, s)
        .body(body);
    let answer = tokio::time::timeout(PATIENCE, async {
        let resp = req.send().await.ok()?;
        let (status, by) = (resp.status().as_u16(), served_by(&resp));
        let text = resp.text().await.ok()?;
        // A stream that ended with its `[DONE]`, not one cut off; an answer not streamed, whole.
        let whole = if stream {
            text.contains("[DONE]")
        } else {
            serde_json::from_str::<serde_json::Value>(&text)
                .is_ok_and(|v| v["choices"][0]["message"].is_object())
        };
        (status != 200 || whole).then_some((status, by))
    })
    .await;
    answer.ok().flatten().unwrap_or((0, None))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM engines: scripts/real-vllm.sh runs it"]
async fn a_session_leaves_an_engine_whose_core_is_wedged() {
    leaves_a_wedged_engine("real-wedged-1", true).await;
}

/// The same with turns not streamed: no stream's headers can be late, only the clients' leaving tells.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM engines: scripts/real-vllm.sh runs it"]
async fn a_session_of_turns_not_streamed_leaves_an_engine_whose_core_is_wedged() {
    leaves_a_wedged_engine("real-wedged-2", false).await;
}

async fn leaves_a_wedged_engine(session: &str, stream: bool) {
    let f = fleet();
    let router = start_router(&fleet_yaml(&f, "predicted_ttft", &sessions_yaml(1000))).await;
    router.all_healthy().await;
    let mut messages = vec![json!({"role": "user", "content": cold_text(400)})];
    let (status, first) = turn(
        &router.url(),
        session,
        chat(&f, json!(messages), stream, 4),
        stream,
    )
    .await;
    assert_eq!(status, 200, "the first turn");
    let first = first.expect("served by an engine");
    let home = f
        .urls
        .iter()
        .position(|u| u.ends_with(&first))
        .expect("a fleet engine");
    let core = engine_core(f.pids[home]);
    let wedged = Stopped::new(core);
    // What the router can see of it: healthy, and a stream's headers at once.
    let health = reqwest::get(format!("{}/health", f.urls[home]))
        .await
        .expect("/health");
    assert_eq!(health.status(), 200, "a wedged engine's /health");

    let mut turns = Vec::new();
    for i in 0..6 {
        messages.push(json!({"role": "user", "content": format!("turn {i}: {}", cold_text(100))}));
        turns.push(
            turn(
                &router.url(),
                session,
                chat(&f, json!(messages), stream, 4),
                stream,
            )
            .await,
        );
    }
    let metrics = router.metrics_text().await;
    let status = get_json(&format!("http://{}", router.metrics_addr), "/status.json").await;
    drop(wedged);
    eprintln!("turns after the wedge (status, engine; streamed: {stream}): {turns:?}");
    // Two unanswered turns set the engine aside; a loaded machine may lose a third (as in the engine-sim test), not
    // the tail, which the other engine serves.
    let lost = turns.iter().filter(|(s, _)| *s != 200).count();
    assert!(
        lost <= 3
            && turns[3..]
                .iter()
                .all(|(s, by)| *s == 200 && by.as_deref() != Some(&*first)),
        "streamed {stream}: {turns:?} {}",
        status["pools"][0]["endpoints"][home]
    );
    assert_eq!(
        metric_sum(
            &metrics,
            "infergate_endpoint_failures_total",
            &["kind=\"unanswered\"", &format!("endpoint=\"{first}\"")]
        ),
        1.0,
        "{metrics}"
    );
    // The engine works again once continued: the requests it was given are dropped (their clients left).
    for what in ["vllm:num_requests_running", "vllm:num_requests_waiting"] {
        wait_engine_metric(&f.urls[home], what, Duration::from_secs(30), |v| v == 0.0).await;
    }
    let (status, _) = turn(
        &f.urls[home],
        session,
        chat(&f, user(&cold_text(100)), true, 4),
        true,
    )
    .await;
    assert_eq!(status, 200, "the engine after SIGCONT");
    router.wait_idle().await;
}
