//! A real vLLM whose engine core dies mid-stream (killed): its API server keeps the 200 stream and ends it with an
//! error event and `[DONE]`, then answers `/health` with 503 and exits. The router must take that stream as the
//! engine's failure, not a success, and once its health check fails the session's next turns go to the other
//! engine. The engine is the spare
//! `scripts/real-vllm.sh` starts for this test alone (it does not come back).

use std::time::Duration;

use futures_util::StreamExt;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM engines: scripts/real-vllm.sh runs it"]
async fn a_stream_whose_engine_core_dies_is_the_engines_failure() {
    let f = fleet();
    let spare = var("INFERGATE_VLLM_SPARE");
    let api: u32 = var("INFERGATE_VLLM_SPARE_PID")
        .parse()
        .expect("INFERGATE_VLLM_SPARE_PID: a process id");
    let urls = [spare.clone(), f.urls[0].clone()];
    let router = start_router(&pool_yaml("predicted_ttft", &urls, &sessions_yaml(1000))).await;
    router.all_healthy().await;
    let (dying, other) = (
        spare.trim_start_matches("http://"),
        f.urls[0].trim_start_matches("http://"),
    );
    // A session whose long answer the spare streams (placement breaks a tie between idle engines at random: a
    // client whose answer comes from the other engine leaves, and the next session tries).
    let mut on_spare = None;
    for i in 0..20 {
        let s = format!("real-dead-{i}");
        let resp = post_json(&client(), &router.url(), CHAT)
            .header(SESSION_HEADER, &s)
            .body(chat(&f, user(&cold_text(200)), true, 4000))
            .send()
            .await
            .expect("a response");
        assert_eq!(resp.status(), 200);
        if served_by(&resp).as_deref() == Some(dying) {
            on_spare = Some((s, resp));
            break;
        }
    }
    let (session, resp) = on_spare.expect("a session on the spare engine");
    // Its engine core is killed once the answer's first chunk is in.
    let mut stream = resp.bytes_stream();
    let mut text = stream
        .next()
        .await
        .expect("a first chunk")
        .expect("bytes")
        .to_vec();
    assert!(signal(engine_core(api), "KILL"), "SIGKILL the engine core");
    let rest = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(chunk) = stream.next().await {
            text.extend_from_slice(&chunk.expect("the stream ends cleanly"));
        }
        text
    })
    .await
    .expect("the stream ends");
    let text = String::from_utf8_lossy(&rest);
    assert!(
        text.contains("\"error\"") && text.trim_end().ends_with("data: [DONE]"),
        "{text}"
    );
    let metrics = router.metrics_text().await;
    let ep = format!("endpoint=\"{dying}\"");
    assert_eq!(
        metric_sum(
            &metrics,
            "infergate_endpoint_failures_total",
            &["kind=\"stream_error\"", &ep]
        ),
        1.0,
        "{metrics}"
    );
    eprintln!(
        "the stream's end: {}",
        &text[text.len().saturating_sub(300)..]
    );

    // Its API server answers /health 503 within about a second (then exits); meanwhile it answers new requests
    // 500 (EngineDeadError), which go back to their clients: a 500 may come after the work started, and a
    // generation is never run twice. Once the health check has seen it, the session's turns go elsewhere.
    router
        .wait_for("the spare engine unhealthy", Duration::from_secs(15), |r| {
            r.state.pools.pools[0]
                .endpoints()
                .iter()
                .any(|e| e.label == dying && !e.health.is_healthy())
        })
        .await;
    for turn in 0..3 {
        let resp = post_json(&client(), &router.url(), CHAT)
            .header(SESSION_HEADER, &session)
            .body(chat(&f, user(&cold_text(100)), true, 2))
            .send()
            .await
            .expect("a response");
        assert_eq!(resp.status(), 200, "turn {turn}");
        assert_eq!(served_by(&resp).as_deref(), Some(other), "turn {turn}");
        drain(resp).await.expect("a whole stream");
    }
    router.wait_idle().await;
}
