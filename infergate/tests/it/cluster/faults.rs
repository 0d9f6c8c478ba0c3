//! Replicas under faults: Redis going away and coming back costs no request and sharing resumes; a replica killed
//! mid-run loses no session binding (a served turn's binding is in the store before its answer reaches the
//! client); Redis stopped or killed under concurrent session traffic costs at most 1% of the requests while it is
//! away, none once it is back; a single stall of the store is no outage.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turns_binding_is_in_the_store_before_its_answer_reaches_the_client() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    let engines = engines(2, SimConfig::default()).await;
    let a = replica(&urls(&engines), &sessions_yaml(1000), &redis, "a").await;
    wait_state(&[&a], "connected", Duration::from_secs(10)).await;
    // Non-streaming turns: headers and body come at once, and the client can send its next turn at once.
    for i in 0..20 {
        let session = format!("quick-{i}");
        let (status, ep) = try_turn(&a.url(), &session, 500, false).await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(
            redis.binding(&a, &session).await.as_deref(),
            Some(format!("http://{ep}").as_str()),
            "turn {i}: the binding was not in the store when the answer arrived"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_run_loses_no_session_binding() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    let engines = engines(3, SimConfig::default()).await;
    let urls = urls(&engines);
    let extra = sessions_yaml(1000);
    let mut a = ProcessReplica::start(&format!(
        "{}{}",
        pool_yaml("load_aware", &urls, &extra),
        cluster_yaml(&redis, "a")
    ))
    .await;
    wait_metrics(a.metrics, "A connected, its engines healthy", |m| {
        metric_sum(m, "infergate_cluster_state", &["state=\"connected\""]) == 1.0
            && metric_sum(m, "infergate_endpoint_healthy", &[]) == 3.0
    })
    .await;
    let b = replica(&urls, &extra, &redis, "b").await;
    let c = replica(&urls, &extra, &redis, "c").await;
    wait_state(&[&b, &c], "connected", Duration::from_secs(10)).await;

    // Twelve sessions turn through A until it dies; each remembers the engine of its last whole turn.
    let last: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let served = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for s in 0..12 {
        let (base, last, served) = (a.url(), last.clone(), served.clone());
        tasks.push(tokio::spawn(async move {
            let session = format!("agent-{s}");
            for k in 0..200 {
                let Ok((200, ep)) = try_turn(&base, &session, 1_000 + 200 * k, true).await else {
                    return;
                };
                last.lock().insert(session.clone(), ep);
                served.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }));
    }
    let start = Instant::now();
    while served.load(Ordering::Relaxed) < 60 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "A served its sessions"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A new session's first turn, answered whole: A dies the moment the client has it (mid-turn for the others).
    let (status, ep) = try_turn(&a.url(), "last-words", 1_000, false)
        .await
        .unwrap();
    a.sigkill();
    assert_eq!(status, 200);
    for t in tasks {
        t.await.unwrap();
    }
    let mut last = last.lock().clone();
    assert_eq!(last.len(), 12, "every session was served before the kill");
    last.insert("last-words".into(), ep);
    eprintln!(
        "A served {} turns before SIGKILL",
        served.load(Ordering::Relaxed)
    );
    // The sessions continue through B and C, each on the engine A last served it on.
    for (session, ep) in &last {
        for (k, r) in [&b, &c, &b].into_iter().enumerate() {
            let (status, got) = try_turn(&r.url(), session, 50_000 + 100 * k, true)
                .await
                .unwrap();
            assert_eq!(status, 200);
            assert_eq!(&got, ep, "{session}: its binding was lost with A");
        }
    }
    for r in [&b, &c] {
        let m = r.metrics_text().await;
        assert_eq!(
            metric_sum(
                &m,
                "infergate_placements_total",
                &["reason=\"new_session\""]
            ),
            0.0,
            "no session started over"
        );
    }
}

/// Per phase of the outage test: requests, failures, and the first few failures' reasons.
type Counts = [(u32, u32, Vec<String>); 3];

/// Phases of the outage test: requests count against the phase they started in, or a later one they overlap.
const BEFORE: usize = 0;
const AWAY: usize = 1;
const BACK: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_or_killed_under_load_costs_at_most_one_percent_and_nothing_once_back() {
    let Some(mut redis) = Redis::start().await else {
        return;
    };
    let (_engines, a, b) = session_replicas(&redis, 3).await;

    let phase = Arc::new(AtomicUsize::new(BEFORE));
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Arc<Mutex<Counts>> = Arc::default();
    let bases = [a.url(), b.url()];
    let mut workers = Vec::new();
    for w in 0..6 {
        let (phase, stop, counts, bases) =
            (phase.clone(), stop.clone(), counts.clone(), bases.clone());
        workers.push(tokio::spawn(async move {
            // Sessions of three turns, alternating replicas; every other turn non-streaming.
            for k in 0..10_000usize {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let started = phase.load(Ordering::Relaxed);
                let session = format!("w{w}-s{}", k / 3);
                let got =
                    try_turn(&bases[k % 2], &session, 1_000 + 300 * (k % 3), k % 2 == 0).await;
                let p = started.max(phase.load(Ordering::Relaxed));
                let mut c = counts.lock();
                c[p].0 += 1;
                match got {
                    Ok((200, _)) => {}
                    other => {
                        c[p].1 += 1;
                        if c[p].2.len() < 5 {
                            c[p].2.push(format!("{other:?}"));
                        }
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Stopped: connections hang (nothing refuses them); the replicas notice within a publish timeout.
    phase.store(AWAY, Ordering::Relaxed);
    redis.signal("STOP");
    wait_state(&[&a, &b], "down", Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    redis.signal("CONT");
    wait_state(&[&a, &b], "connected", Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Killed: connections refused; then a new, empty Redis on the same port.
    redis.kill();
    wait_state(&[&a, &b], "down", Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    redis.spawn().await;
    wait_state(&[&a, &b], "connected", Duration::from_secs(10)).await;
    phase.store(BACK, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let counts = counts.lock().clone();
    eprintln!("requests, failures per phase (before, away, back): {counts:?}");
    let [before, away, back] = counts;
    assert!(
        before.0 >= 20 && away.0 >= 50 && back.0 >= 20,
        "load ran in every phase"
    );
    assert_eq!(before.1, 0, "{before:?}");
    assert!(
        f64::from(away.1) <= f64::from(away.0) * 0.01,
        "more than 1% failed while Redis was away: {away:?}"
    );
    assert_eq!(back.1, 0, "failures once Redis was back: {back:?}");
    for r in [&a, &b] {
        r.wait_idle().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_going_away_fails_no_request_and_sharing_resumes_when_it_is_back() {
    let Some(mut redis) = Redis::start().await else {
        return;
    };
    let (_engines, a, b) = session_replicas(&redis, 3).await;
    let (_, first) = turn(&a, "before", 2_000).await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(turn(&b, "before", 2_500).await.1, first, "shared while up");

    redis.kill();
    // Requests right away (before the replicas noticed) and after: none fails.
    for i in 0..20 {
        let r = if i % 2 == 0 { &a } else { &b };
        let (status, _) = turn(r, &format!("outage-{}", i % 4), 2_000 + 100 * i).await;
        assert_eq!(status, 200, "request {i} during the outage");
    }
    wait_state(&[&a, &b], "down", Duration::from_secs(5)).await;
    // The peers' last figures stay for one key lifetime (500 ms here), then each replica is on its own.
    let start = Instant::now();
    for r in [&a, &b] {
        while r.metric_sum("infergate_cluster_peers", &[]).await != 0.0 {
            assert!(start.elapsed() < Duration::from_secs(3), "peers forgotten");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for m in [a.metrics_text().await, b.metrics_text().await] {
        assert_eq!(
            metric_sum(&m, "infergate_cluster_state", &["state=\"connected\""]),
            0.0
        );
        assert_eq!(metric_sum(&m, "infergate_cluster_peers", &[]), 0.0);
        assert!(metric_sum(&m, "infergate_cluster_errors_total", &["op=\"publish\""]) >= 1.0);
    }
    // A session served only by A while Redis is down.
    let (status, lonely) = turn(&a, "lonely", 2_000).await;
    assert_eq!(status, 200);

    redis.spawn().await;
    wait_state(&[&a, &b], "connected", Duration::from_secs(10)).await;
    // Catch-up: A wrote the binding it made during the outage, so B places that session's next turn with it.
    redis
        .wait_binding(
            &a,
            "lonely",
            "A's catch-up write of the outage binding lands",
            |_| true,
        )
        .await;
    let from_store = |m: &str| {
        metric_sum(
            m,
            "infergate_cluster_binding_lookups_total",
            &["source=\"store\""],
        )
    };
    let before = from_store(&b.metrics_text().await);
    assert_eq!(turn(&b, "lonely", 2_500).await.1, lonely, "caught up");
    assert_eq!(
        from_store(&b.metrics_text().await),
        before + 1.0,
        "B took the binding A wrote on the way back up"
    );
    // And new sessions are shared again.
    let (_, fresh) = turn(&b, "after", 2_000).await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(turn(&a, "after", 2_500).await.1, fresh, "shared again");
    let m = a.metrics_text().await;
    assert!(
        metric_sum(
            &m,
            "infergate_cluster_binding_lookups_total",
            &["source=\"store\""]
        ) >= 1.0
    );
    assert!(
        metric_sum(
            &m,
            "infergate_cluster_binding_lookups_total",
            &["source=\"unavailable\""]
        ) >= 1.0
    );
}

/// Redis stopped for 1.3 s: the publish in flight misses its 1 s deadline, the next one (sent as the stop ends) does
/// not. One late publish is counted and is no outage: the replicas never read `down` (before, they dropped the
/// connection and stayed down until the stop ended), and a session shared before the stall is still shared after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_late_publish_is_counted_but_the_store_stays_connected() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    let (_engines, a, b) = session_replicas(&redis, 2).await;
    let (_, first) = turn(&a, "stall", 2_000).await;
    let before = (late(&a).await, late(&b).await);
    redis.signal("STOP");
    let stopped = Instant::now();
    let mut resumed = false;
    let mut seen_down = Vec::new();
    while stopped.elapsed() < Duration::from_millis(2500) {
        if !resumed && stopped.elapsed() >= Duration::from_millis(1300) {
            redis.signal("CONT");
            resumed = true;
        }
        for (name, r) in [("a", &a), ("b", &b)] {
            if state_is(r, "down").await {
                seen_down.push(format!("{name} at {:?}", stopped.elapsed()));
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        seen_down.is_empty(),
        "the store read down after one late publish: {seen_down:?}; the cluster series:{}",
        cluster_series(&[&a, &b]).await
    );
    let after = (late(&a).await, late(&b).await);
    assert!(
        after.0 > before.0 && after.1 > before.1,
        "each replica counted its late publish: {before:?} -> {after:?}"
    );
    wait_state(&[&a, &b], "connected", Duration::from_secs(1)).await;
    assert_eq!(turn(&b, "stall", 2_500).await.1, first, "still shared");
}

/// Publishes that failed or missed their deadline, counted by `r`.
async fn late(r: &TestRouter) -> f64 {
    r.metric_sum("infergate_cluster_errors_total", &["op=\"publish\""])
        .await
}
