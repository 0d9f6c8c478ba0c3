//! What the replicas share: a session whose turns alternate between replicas stays on one engine, a replica
//! follows a move another made, a stored response made through one is continued through the other, a prefill
//! held by one replica steers the other; without `cluster` nothing waits for a store.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_turns_alternate_between_two_replicas_stays_sticky_on_one_engine() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    let (engines, a, b) = session_replicas(&redis, 3).await;

    let mut served = Vec::new();
    for i in 0..8 {
        let r = if i % 2 == 0 { &a } else { &b };
        let (status, ep) = turn(r, "alternating", 2_000 + 500 * i).await;
        assert_eq!(status, 200, "turn {i}");
        served.push(ep);
        // An agent's think time; the binding write is queued, not awaited, by the replica that served.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(
        served.iter().all(|e| *e == served[0]),
        "one engine: {served:?}"
    );
    let counts: Vec<usize> = engines.iter().map(generate_requests).collect();
    assert_eq!(counts.iter().filter(|&&n| n > 0).count(), 1, "{counts:?}");

    let (ma, mb) = (a.metrics_text().await, b.metrics_text().await);
    let reasons = |m: &str, r: &str| {
        metric_sum(
            m,
            "infergate_placements_total",
            &[&format!("reason=\"{r}\"")],
        )
    };
    assert_eq!(reasons(&ma, "new_session"), 1.0);
    assert_eq!(reasons(&ma, "sticky"), 3.0);
    assert_eq!(reasons(&mb, "new_session"), 0.0, "B found A's binding");
    assert_eq!(reasons(&mb, "sticky"), 4.0);
    let lookups = |m: &str, s: &str| {
        metric_sum(
            m,
            "infergate_cluster_binding_lookups_total",
            &[&format!("source=\"{s}\"")],
        )
    };
    // B's first turn took A's binding; later ones found B's own, or A's turns' record of the same engine.
    assert!(lookups(&mb, "store") >= 1.0, "B read A's binding");
    assert_eq!(lookups(&mb, "store") + lookups(&mb, "local"), 4.0);
    assert_eq!(
        lookups(&ma, "miss"),
        1.0,
        "A's first turn was a new session"
    );
    assert_eq!(metric_sum(&ma, "infergate_cluster_peers", &[]), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_follows_a_move_another_replica_made() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    let engines = engines(2, time_scaled(0.1)).await;
    let urls = urls(&engines);
    let extra = format!("{}{ENGINE_STATS}", sessions_yaml(1000));
    let a = replica(&urls, &extra, &redis, "a").await;
    let b = replica(&urls, &extra, &redis, "b").await;
    wait_state(&[&a, &b], "connected", Duration::from_secs(10)).await;
    let index = |ep: &str| {
        urls.iter()
            .position(|u| u.ends_with(ep))
            .expect("a known endpoint")
    };

    // A binds the session; B follows the binding through the store.
    let (status, first) = turn(&a, "mover", 2_000).await;
    assert_eq!(status, 200);
    redis
        .wait_binding(&a, "mover", "A's binding write lands", |_| true)
        .await;
    assert_eq!(turn(&b, "mover", 2_500).await, (200, first.clone()));
    // The bound engine gets a queue: B moves the session on its next turn.
    let home = index(&first);
    engines[home].control.set_extra_running(6);
    engines[home].control.set_extra_waiting(2);
    b.wait_engine_stats(home, "B's scrapes see the queue", |running, waiting| {
        running >= 6 && waiting >= 2
    })
    .await;
    let (status, moved_to) = turn(&b, "mover", 3_000).await;
    assert_eq!(status, 200);
    assert_ne!(
        moved_to, first,
        "B did not move the session off the queued engine"
    );
    // The queue is gone; the next turn reaches A, whose own table still binds the old engine.
    engines[home].control.set_extra_running(0);
    engines[home].control.set_extra_waiting(0);
    a.wait_engine_stats(home, "A's scrapes see no queue", |running, waiting| {
        (running, waiting) == (0, 0)
    })
    .await;
    redis
        .wait_binding(&a, "mover", "B's write of the move lands", |ep| {
            ep.ends_with(&moved_to)
        })
        .await;
    let (status, followed) = turn(&a, "mover", 3_500).await;
    assert_eq!(status, 200);
    assert_eq!(
        followed, moved_to,
        "A sent the turn back to the engine B moved the session away from"
    );
    let lookups = |m: &str, s: &str| {
        let label = format!("source=\"{s}\"");
        metric_sum(m, "infergate_cluster_binding_lookups_total", &[&label])
    };
    assert_eq!(
        lookups(&a.metrics_text().await, "store"),
        1.0,
        "A took B's newer binding"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_response_made_through_one_replica_is_continued_and_read_through_the_other() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    let storing = SimConfig {
        responses_store: true,
        ..SimConfig::default()
    };
    let engines = engines(2, storing).await;
    let urls = urls(&engines);
    let a = replica(&urls, "", &redis, "a").await;
    let b = replica(&urls, "", &redis, "b").await;
    wait_state(&[&a, &b], "connected", Duration::from_secs(10)).await;
    // One conversation chained by previous_response_id, its turns alternating between the replicas.
    let mut previous: Option<String> = None;
    let mut served = Vec::new();
    for i in 0..8 {
        let r = if i % 2 == 0 { &a } else { &b };
        let mut body = serde_json::json!({"input": format!("turn {i}"), "max_output_tokens": 4, "model": "sim-model"});
        if let Some(p) = &previous {
            body["previous_response_id"] = serde_json::json!(p);
        }
        let resp = post_json(&client(), &r.url(), "/v1/responses")
            .body(body.to_string())
            .send()
            .await
            .expect("response");
        let status = resp.status().as_u16();
        let ep = served_by(&resp).unwrap_or_default();
        let v: serde_json::Value = resp.json().await.expect("JSON");
        assert_eq!(status, 200, "turn {i}: {v}");
        let id = v["id"].as_str().expect("an id").to_string();
        served.push(ep);
        // The other replica retrieves it (the write is queued, not awaited: give it a moment).
        tokio::time::sleep(Duration::from_millis(50)).await;
        let other = if i % 2 == 0 { &b } else { &a };
        let got = client()
            .get(format!("{}/v1/responses/{id}", other.url()))
            .send()
            .await
            .expect("response");
        assert_eq!(
            got.status(),
            200,
            "turn {i}: the other replica knows the holder"
        );
        previous = Some(id);
    }
    assert!(
        served.iter().all(|e| *e == served[0]),
        "one engine: {served:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_held_by_one_replica_sends_the_other_replicas_work_elsewhere() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    // 25k tokens/s: a 100k-token prompt holds its engine about four seconds.
    let engines = engines(2, slow_prefill()).await;
    let urls = urls(&engines);
    let a = replica(&urls, "", &redis, "a").await;
    let b = replica(&urls, "", &redis, "b").await;
    wait_state(&[&a, &b], "connected", Duration::from_secs(10)).await;

    let big = tokio::spawn({
        let base = a.url();
        async move { post_chat(&base, chat_body(400_000, true, 4)).await }
    });
    a.wait_for("A holds the big prefill", Duration::from_secs(5), |r| {
        r.totals().0 >= 90_000
    })
    .await;
    let held = (0..2).find(|&i| a.endpoint_load(i).0 >= 90_000).unwrap();
    let other = 1 - held;
    // B sees A's hold within a publish interval or two (100 ms each); 2 s is a generous bound.
    let seen = Instant::now();
    b.wait_for("B sees A's hold", Duration::from_secs(2), |r| {
        r.state.pools.pools[0].endpoints()[held].peers.get().1 >= 90_000
    })
    .await;
    eprintln!("B saw A's hold after {:?}", seen.elapsed());
    let before = generate_requests(&engines[other]);
    for _ in 0..6 {
        assert_eq!(post_chat(&b.url(), chat_body(1_000, true, 4)).await, 200);
    }
    assert_eq!(
        generate_requests(&engines[other]) - before,
        6,
        "every small request went around the held engine"
    );
    assert_eq!(generate_requests(&engines[held]), 1, "only the big one");
    assert_eq!(big.await.unwrap(), 200);
    // The hold ends: B's view of A's load on that engine drops back.
    b.wait_for("A's hold gone from B's view", Duration::from_secs(3), |r| {
        r.state.pools.pools[0].endpoints()[held].peers.get() == (0, 0)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_cluster_the_state_is_off_and_no_replica_waits_for_a_store() {
    let engines = engines(1, SimConfig::default()).await;
    let r = start_router(&pool_yaml(
        "load_aware",
        &urls(&engines),
        &sessions_yaml(10),
    ))
    .await;
    r.all_healthy().await;
    assert_eq!(
        post_chat_in_session(&r.url(), "s", chat_body(100, true, 2)).await,
        200
    );
    let m = r.metrics_text().await;
    assert_eq!(
        metric_sum(&m, "infergate_cluster_state", &["state=\"off\""]),
        1.0
    );
    assert_eq!(
        metric_sum(&m, "infergate_cluster_binding_lookups_total", &[]),
        0.0
    );
}
