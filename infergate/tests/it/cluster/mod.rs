//! Router replicas sharing live load and session bindings through a real `redis-server` started on a free loopback
//! port: a session whose turns alternate between replicas stays on one engine, a prefill held by one replica steers
//! the other, and Redis going away and coming back costs no request. Submodules: `store` (a store that refuses,
//! cannot be reached or holds garbage), `bursts` (new sessions spread over replicas), `faults` (a replica killed,
//! Redis stopped under load).
//!
//! Without `redis-server` on the PATH these tests say so loudly and pass, unless `CI` is set: then they fail
//! (`scripts/ensure-test-tools.sh` installs it).

mod bursts;
mod faults;
mod store;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use infergate::cluster::wire::{BindingRecord, Keys};
use infergate::placement::sessions::session_hash;
use infergate_sim::SimConfig;

/// A `redis-server` child on a loopback port, persistence off; killed on drop.
struct Redis {
    port: u16,
    child: Option<Child>,
    args: Vec<String>,
}

impl Redis {
    /// Start one, or None (after a loud message) when the binary is absent outside CI.
    async fn start() -> Option<Redis> {
        Redis::start_with(&[]).await
    }

    /// Start one with extra `redis-server` arguments (e.g. `--requirepass`).
    async fn start_with(args: &[&str]) -> Option<Redis> {
        let found = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok();
        if !found {
            if std::env::var_os("CI").is_some() {
                panic!(
                    "redis-server is not installed; CI must run scripts/ensure-test-tools.sh first"
                );
            }
            eprintln!(
                "\n*** SKIPPED: redis-server is not installed (scripts/ensure-test-tools.sh installs it); \
                 the cluster tests did not run ***\n"
            );
            return None;
        }
        let mut r = Redis {
            port: free_port(),
            child: None,
            args: args.iter().map(|a| a.to_string()).collect(),
        };
        r.spawn().await;
        Some(r)
    }

    async fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        wait_listening(format!("127.0.0.1:{}", self.port).parse().unwrap()).await;
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stop (`STOP`: connections hang, nothing is refused) or continue (`CONT`) the server.
    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let done = Command::new("kill")
                .args([&format!("-{sig}"), &c.id().to_string()])
                .status();
            assert!(done.is_ok_and(|s| s.success()), "kill -{sig}");
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A connection of the test's own (the server needs no password).
    async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("the test reaches redis")
    }

    /// The endpoint URL the store binds `session` of pool `default` to, under replica `r`'s key prefix; None while
    /// the store holds no such binding (or does not answer).
    async fn binding(&self, r: &TestRouter, session: &str) -> Option<String> {
        let prefix = &r.state.cfg.cluster.as_ref()?.key_prefix;
        let key = Keys::new(prefix).session("default", session_hash(session.as_bytes()));
        let client = redis::Client::open(self.url()).ok()?;
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        let value: Option<Vec<u8>> = redis::cmd("GET")
            .arg(key)
            .query_async(&mut conn)
            .await
            .ok()?;
        BindingRecord::decode(&value?).map(|b| b.endpoint)
    }

    /// Wait until the store binds `session` to an endpoint for which `f` holds (a replica's binding write, queued
    /// and not awaited by the request, has landed), polling every 20 ms; panics naming `what` after 5 s.
    async fn wait_binding(
        &self,
        r: &TestRouter,
        session: &str,
        what: &str,
        f: impl Fn(&str) -> bool,
    ) {
        let start = Instant::now();
        while !self.binding(r, session).await.is_some_and(|ep| f(&ep)) {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "timed out waiting for: {what}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.signal("CONT");
        self.kill();
    }
}

/// A replica running as the router binary in its own process, so that a test can SIGKILL it or read its log;
/// killed on drop.
struct ProcessReplica {
    child: KillOnDrop,
    listen: u16,
    metrics: u16,
    log: PathBuf,
}

impl ProcessReplica {
    /// Start the binary on `yaml` (with `{listen}` and `{metrics}` placeholders) at RUST_LOG=info; returns once its
    /// metrics answer.
    async fn start(yaml: &str) -> ProcessReplica {
        let (listen, metrics) = (free_port(), free_port());
        let dir = std::env::temp_dir().join(format!("infergate-cluster-{listen}"));
        std::fs::create_dir_all(&dir).unwrap();
        let text = format!(
            "{}\nserver:\n  threads: 2\n  grace_period_seconds: 0\n  graceful_shutdown_timeout_seconds: 1\n  \
             pid_file: {dir}/pid\n  upgrade_sock: {dir}/sock\n",
            yaml.replace("{listen}", &format!("127.0.0.1:{listen}"))
                .replace("{metrics}", &format!("127.0.0.1:{metrics}")),
            dir = dir.display()
        );
        let path = dir.join("infergate.yaml");
        std::fs::write(&path, text).unwrap();
        let log = dir.join("stderr.log");
        let child = KillOnDrop(
            Command::new(env!("CARGO_BIN_EXE_infergate"))
                .args(["-c", path.to_str().unwrap()])
                .env("RUST_LOG", "info")
                .stdout(Stdio::null())
                .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
                .spawn()
                .unwrap(),
        );
        wait_metrics(metrics, "the replica's metrics", |_| true).await;
        ProcessReplica {
            child,
            listen,
            metrics,
            log,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.listen)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        let m = try_metrics(&format!("http://127.0.0.1:{}/metrics", self.metrics)).await;
        metric_sum(&m.unwrap_or_default(), name, labels)
    }

    fn sigkill(&mut self) {
        let _ = self.child.0.kill();
        let _ = self.child.0.wait();
    }
}

/// The `cluster` section of a replica. The request-path timeout is 50 ms, not the default 5 ms: a 2-core test
/// machine running other builds can stall a store answer longer, and these tests check sharing, not speed.
fn cluster_yaml(redis: &Redis, replica: &str) -> String {
    format!(
        "cluster: {{ redis: \"{}\", replica: {replica}, publish_interval: 100ms, read_timeout: 50ms }}\n",
        redis.url()
    )
}

async fn replica(urls: &[String], extra: &str, redis: &Redis, name: &str) -> TestRouter {
    let yaml = format!(
        "{}{}",
        pool_yaml("load_aware", urls, extra),
        cluster_yaml(redis, name)
    );
    let r = start_router(&yaml).await;
    r.all_healthy().await;
    r
}

/// `n` default engines and two replicas, `a` and `b`, keeping sessions over them; returns once both are connected.
async fn session_replicas(
    redis: &Redis,
    n: usize,
) -> (Vec<infergate_sim::EngineHandle>, TestRouter, TestRouter) {
    let engines = engines(n, SimConfig::default()).await;
    let urls = urls(&engines);
    let a = replica(&urls, &sessions_yaml(1000), redis, "a").await;
    let b = replica(&urls, &sessions_yaml(1000), redis, "b").await;
    wait_state(&[&a, &b], "connected", Duration::from_secs(10)).await;
    (engines, a, b)
}

async fn state_is(r: &TestRouter, state: &str) -> bool {
    r.metric_sum("infergate_cluster_state", &[&format!("state=\"{state}\"")])
        .await
        == 1.0
}

/// Wait until every router reports `state` (at most `limit`).
async fn wait_state(routers: &[&TestRouter], state: &str, limit: Duration) {
    let start = Instant::now();
    for r in routers {
        while !state_is(r, state).await {
            assert!(
                start.elapsed() < limit,
                "replica not `{state}` within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// One session turn at `base`, tolerating failure: Ok((status, endpoint)) when the answer came whole (a stream to its
/// `[DONE]`), Err(what went wrong) otherwise.
async fn try_turn(
    base: &str,
    session: &str,
    bytes: usize,
    stream: bool,
) -> Result<(u16, String), String> {
    let resp = post_json(&client(), base, CHAT)
        .header(SESSION_HEADER, session)
        .body(chat_body(bytes, stream, 4))
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .map_err(|e| format!("send: {e}"))?;
    let ep = served_by(&resp).unwrap_or_default();
    let status = resp.status().as_u16();
    let body = resp.bytes().await.map_err(|e| format!("body: {e}"))?;
    if stream && status == 200 && !body.windows(6).any(|w| w == b"[DONE]") {
        return Err("a stream cut before [DONE]".into());
    }
    Ok((status, ep))
}

/// One session turn: (status, the endpoint that served it).
async fn turn(r: &TestRouter, session: &str, bytes: usize) -> (u16, String) {
    let resp = post_json(&client(), &r.url(), CHAT)
        .header(SESSION_HEADER, session)
        .body(chat_body(bytes, true, 4))
        .send()
        .await
        .expect("response");
    let ep = served_by(&resp).unwrap_or_default();
    (finish(resp).await, ep)
}

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
