//! Router replicas sharing live load and session bindings through a real `redis-server` started on a free loopback
//! port: a session whose turns alternate between replicas stays on one engine, a prefill held by one replica steers
//! the other, and Redis going away and coming back costs no request. Submodules: `sharing` (what the replicas
//! share), `store` (a store that refuses, cannot be reached or holds garbage), `bursts` (new sessions spread over
//! replicas), `faults` (Redis going away, a replica killed, Redis stopped under load).
//!
//! Without `redis-server` on the PATH these tests say so loudly and pass, unless `CI` is set: then they fail
//! (`scripts/ensure-test-tools.sh` installs it).

mod bursts;
mod faults;
mod sharing;
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

    /// Whether the store holds `key`.
    async fn exists(&self, key: &str) -> bool {
        let n: i64 = redis::cmd("EXISTS")
            .arg(key)
            .query_async(&mut self.conn().await)
            .await
            .expect("EXISTS");
        n == 1
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
            if start.elapsed() >= Duration::from_secs(5) {
                let seen = cluster_series(&[r]).await;
                panic!("timed out waiting for: {what}; the replica's cluster series:{seen}");
            }
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
        ProcessReplica::start_with_grace(yaml, 0).await
    }

    /// [`ProcessReplica::start`] with a graceful stop's grace period of `grace` seconds.
    async fn start_with_grace(yaml: &str, grace: u32) -> ProcessReplica {
        let (listen, metrics) = (free_port(), free_port());
        let dir = std::env::temp_dir().join(format!("infergate-cluster-{listen}"));
        std::fs::create_dir_all(&dir).unwrap();
        let text = format!(
            "{}\nserver:\n  threads: 2\n  grace_period_seconds: {grace}\n  graceful_shutdown_timeout_seconds: 1\n  \
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

/// Each router's cluster series (state, failed store operations by kind, publish, read and write counts and
/// seconds), for a failed wait to show.
async fn cluster_series(routers: &[&TestRouter]) -> String {
    let mut seen = String::new();
    for (i, r) in routers.iter().enumerate() {
        seen.push_str(&format!("\nrouter {i}:\n"));
        for l in r
            .metrics_text()
            .await
            .lines()
            .filter(|l| l.starts_with("infergate_cluster_") && !l.contains("_bucket{"))
        {
            seen.push_str(&format!("  {l}\n"));
        }
    }
    seen
}

/// Wait until every router reports `state` (at most `limit`); on failure, shows each router's cluster series
/// (state, failed store operations by kind, publish and read counts and total seconds).
async fn wait_state(routers: &[&TestRouter], state: &str, limit: Duration) {
    let start = Instant::now();
    for r in routers {
        while !state_is(r, state).await {
            if start.elapsed() >= limit {
                let seen = cluster_series(routers).await;
                panic!("replica not `{state}` within {limit:?}; the cluster series:{seen}");
            }
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
