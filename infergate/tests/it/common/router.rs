//! A router running in-process on ephemeral loopback ports, its waits, and the configuration snippets the tests
//! start it from.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::time::{Duration, Instant};

use infergate::config::Config;
use infergate::server::{build_server, run_with_channel, RouterState};
use pingora_core::server::configuration::Opt;
use pingora_core::server::ShutdownSignal;

/// Ports `free_port` hands out: below Linux's ephemeral range (32768-60999), which the kernel draws from for
/// every `bind(0)` (the simulated engines) and every outgoing connection. A port taken with `bind(0)` and
/// released could be handed to another test's engine before the router binds it (a chat request through the
/// "router" then answered 404 by that engine); these ports are never handed out by the kernel.
const PORTS: std::ops::Range<u32> = 20_000..32_000;

/// A free loopback port for a listener a test starts later: the next port of this process's share of [`PORTS`]
/// that binds now (each port is handed out once per process; the start depends on the pid, so that two test
/// processes rarely walk the same ports).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let span = PORTS.end - PORTS.start;
    let base = std::process::id().wrapping_mul(2_654_435_761) % span;
    for _ in 0..span {
        let port = (PORTS.start + (base + NEXT.fetch_add(1, Ordering::Relaxed)) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {PORTS:?}")
}

/// A router running in-process on its own thread; stopped on drop.
pub struct TestRouter {
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub state: RouterState,
    /// The configuration it started from, its addresses filled in (a test's reload edits it).
    pub config_text: String,
    stop: Option<tokio::sync::mpsc::Sender<ShutdownSignal>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestRouter {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Sum of every endpoint's prefill tokens and requests in flight, read from the live counters.
    pub fn totals(&self) -> (u64, u64) {
        let mut t = (0, 0);
        for p in &self.state.pools.pools {
            for e in p.endpoints().iter() {
                t.0 += e.load.prefill_tokens();
                t.1 += e.load.requests();
            }
        }
        t
    }

    /// (prefill tokens, requests in flight) of pool 0's endpoint `i`.
    pub fn endpoint_load(&self, i: usize) -> (u64, u64) {
        let eps = self.state.pools.pools[0].endpoints();
        (eps[i].load.prefill_tokens(), eps[i].load.requests())
    }

    /// Wait until `f` holds, polling; panics with `what` after `limit`.
    pub async fn wait_for(
        &self,
        what: &str,
        limit: Duration,
        mut f: impl FnMut(&TestRouter) -> bool,
    ) {
        let start = Instant::now();
        while !f(self) {
            assert!(start.elapsed() < limit, "timed out waiting for: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Wait (5 s at most) until the engine stats of pool 0's endpoint `i` are fresh and `f(running, waiting)` holds
    /// on them: a scrape taken after the engine's queue changed has landed.
    pub async fn wait_engine_stats(&self, i: usize, what: &str, f: impl Fn(u64, u64) -> bool) {
        self.wait_for(what, Duration::from_secs(5), |r| {
            r.state.pools.pools[0].endpoints()[i]
                .stats
                .fresh(Instant::now())
                .is_some_and(|l| f(l.running, l.waiting))
        })
        .await;
    }

    /// Wait (20 s at most) until every endpoint holds no tokens and no request.
    pub async fn wait_idle(&self) {
        self.wait_for("every gauge back to 0", Duration::from_secs(20), |r| {
            r.totals() == (0, 0)
        })
        .await;
    }

    /// Wait (10 s at most) until some endpoint of some pool is healthy.
    pub async fn ready(&self) {
        self.wait_for("an endpoint healthy", Duration::from_secs(10), |r| {
            r.state.pools.any_healthy()
        })
        .await;
    }

    /// Wait (10 s at most) until every endpoint of every pool is healthy.
    pub async fn all_healthy(&self) {
        self.wait_for("every endpoint healthy", Duration::from_secs(10), |r| {
            r.state
                .pools
                .pools
                .iter()
                .all(|p| p.endpoints().iter().all(|e| e.health.is_healthy()))
        })
        .await;
    }
}

impl TestRouter {
    /// Apply `yaml` (a whole configuration, e.g. an edit of `config_text`) as SIGHUP applies a re-read file.
    pub fn reload(&self, yaml: &str) {
        let cfg = Config::parse(Path::new("test.yaml"), yaml)
            .unwrap_or_else(|e| panic!("reloaded test config: {e}\n{yaml}"));
        infergate::reload::apply(&self.state, &cfg);
    }

    /// Teaches a two-endpoint `predicted_ttft` pool both prefill throughputs and returns once both are learned:
    /// two long requests at once, the second placed while the first holds its prefill, so it goes to the other
    /// endpoint (sequential first requests on idle endpoints go either way).
    pub async fn learn_both_throughputs(&self) {
        let url = self.url();
        let long = || super::chat_body(100_000, true, 4);
        let (a, b) = tokio::join!(
            super::post_chat(&url, long()),
            super::post_chat(&url, long())
        );
        assert_eq!((a, b), (200, 200));
        self.wait_for("both throughputs learned", Duration::from_secs(10), |r| {
            r.state.pools.pools[0]
                .endpoints()
                .iter()
                .all(|e| e.prefill_speed.throughput().is_some())
        })
        .await;
    }

    /// Stop as SIGTERM would (`GracefulTerminate`: Pingora's shutdown watch fires, background services run their
    /// shutdown path, then the grace period and the runtimes' shutdown) and wait, at most 30 s, for the router's
    /// thread to end. Dropping a `TestRouter` is a fast shutdown, which skips the graceful path.
    pub async fn stop_gracefully(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(ShutdownSignal::GracefulTerminate).await;
        }
        if let Some(t) = self.thread.take() {
            let joined = tokio::time::timeout(
                Duration::from_secs(30),
                tokio::task::spawn_blocking(move || t.join()),
            )
            .await;
            assert!(joined.is_ok(), "the router did not stop within 30 s");
        }
    }
}

impl Drop for TestRouter {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.try_send(ShutdownSignal::FastShutdown);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Start a router from YAML. `{listen}` and `{metrics}` are replaced with free loopback addresses; the
/// server section is added (fast shutdown, temp pid/socket files) unless present.
pub async fn start_router(yaml: &str) -> TestRouter {
    start_router_with(yaml, || {}).await
}

/// [`start_router`], with `before_build` run after the configuration is read and before the router is built
/// from it (a file it names changes in between).
pub async fn start_router_with(yaml: &str, before_build: impl FnOnce()) -> TestRouter {
    let listen: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut text = yaml
        .replace("{listen}", &listen.to_string())
        .replace("{metrics}", &metrics.to_string());
    if !text.contains("\nserver:") && !text.starts_with("server:") {
        let tag = listen.port();
        text.push_str(&format!(
            "\nserver:\n  threads: 2\n  grace_period_seconds: 0\n  graceful_shutdown_timeout_seconds: 1\n  \
             pid_file: /tmp/infergate-test-{tag}.pid\n  upgrade_sock: /tmp/infergate-test-{tag}.sock\n"
        ));
    }
    let cfg = Config::parse(Path::new("test.yaml"), &text)
        .unwrap_or_else(|e| panic!("test config: {e}\n{text}"));
    before_build();
    let (server, state) = build_server(cfg, Opt::default()).expect("server builds");
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let thread = std::thread::spawn(move || run_with_channel(server, rx));
    let router = TestRouter {
        addr: listen,
        metrics_addr: metrics,
        state,
        config_text: text,
        stop: Some(tx),
        thread: Some(thread),
    };
    wait_listening(router.addr).await;
    router
}

/// The complete lines of a file the router writes (its access log) once there are at least `n` of them, waiting
/// 5 s at most (the logging hook runs just after the response).
pub async fn log_lines(path: &Path, n: usize) -> Vec<String> {
    let mut got = Vec::new();
    for _ in 0..250 {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        got = text
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .map(|l| l.trim_end().to_string())
            .collect();
        if got.len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(got.len() >= n, "{} of {n} lines: {got:?}", got.len());
    got
}

/// Poll until something accepts on `addr`.
pub async fn wait_listening(addr: SocketAddr) {
    let start = Instant::now();
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "nothing listens on {addr}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A pool YAML over the given engine URLs: one pool `default` serving every model, health checked every 200 ms;
/// `extra` is appended to the pool (indented four spaces).
pub fn pool_yaml(policy: &str, urls: &[String], extra: &str) -> String {
    let eps: String = urls
        .iter()
        .map(|u| format!("      - url: \"{u}\"\n"))
        .collect();
    format!(
        "listen: \"{{listen}}\"\nmetrics_listen: \"{{metrics}}\"\n\
         timeouts: {{ connect: 1s, response_header: 30s, stream_idle: 30s }}\n\
         pools:\n  - name: default\n    models: [\"*\"]\n    policy: {policy}\n    endpoints:\n{eps}\
         \x20   health_check: {{ path: /health, interval: 200ms, timeout: 500ms, healthy_after: 1, unhealthy_after: 1 }}\n{extra}"
    )
}

/// A `pool_yaml` whose health checks run once a minute: an endpoint that starts failing still looks healthy.
pub fn slow_health_checks(pool_yaml: &str) -> String {
    pool_yaml.replace("interval: 200ms", "interval: 60s")
}

/// Two load_aware pools of one endpoint each: `p1` serves model `m1` on `e1`, `p2` serves `m2` on `e2`.
pub fn two_pools_yaml(e1: &str, e2: &str) -> String {
    format!(
        "listen: \"{{listen}}\"\nmetrics_listen: \"{{metrics}}\"\n\
         timeouts: {{ connect: 1s, response_header: 30s, stream_idle: 30s }}\n\
         pools:\n\
         \x20 - name: p1\n    models: [m1]\n    policy: load_aware\n    endpoints: [{{url: \"{e1}\"}}]\n\
         \x20   health_check: {{ path: /health, interval: 200ms, timeout: 500ms }}\n\
         \x20 - name: p2\n    models: [m2]\n    policy: load_aware\n    endpoints: [{{url: \"{e2}\"}}]\n\
         \x20   health_check: {{ path: /health, interval: 200ms, timeout: 500ms }}\n"
    )
}

/// Pool `extra`: sessions keyed by the `x-session-id` header (`requests::SESSION_HEADER`), for an hour.
pub fn sessions_yaml(max_sessions: usize) -> String {
    format!("    sessions: {{ header: x-session-id, ttl: 1h, max_sessions: {max_sessions} }}\n")
}

/// Pool `extra`: scrape the engines' `/metrics` every 100 ms.
pub const ENGINE_STATS: &str = "    engine_stats: { path: /metrics, interval: 100ms }\n";

/// The router binary on `dir/infergate.yaml`, its stderr in `dir/stderr`.
pub fn spawn_router(dir: &Path, args: &[&str]) -> KillOnDrop {
    let log = std::fs::File::create(dir.join("stderr")).unwrap();
    KillOnDrop(
        std::process::Command::new(env!("CARGO_BIN_EXE_infergate"))
            .args(args)
            .args(["-c", dir.join("infergate.yaml").to_str().unwrap()])
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

/// The router binary in `dir` on `pool` (a [`pool_yaml`] with its `{listen}` and `{metrics}` placeholders) plus
/// `extra` top-level keys, with a graceful stop's grace period of `grace` seconds; returns once its client port
/// serves.
pub async fn serving_binary(
    dir: &Path,
    (listen, metrics): (u16, u16),
    pool: &str,
    extra: &str,
    grace: u32,
) -> KillOnDrop {
    std::fs::write(
        dir.join("infergate.yaml"),
        format!(
            "{}{extra}server:\n  grace_period_seconds: {grace}\n  graceful_shutdown_timeout_seconds: 1\n  \
             pid_file: {d}/infergate.pid\n  upgrade_sock: {d}/upgrade.sock\n",
            pool.replace("{listen}", &format!("127.0.0.1:{listen}"))
                .replace("{metrics}", &format!("127.0.0.1:{metrics}")),
            d = dir.display(),
        ),
    )
    .unwrap();
    let child = spawn_router(dir, &[]);
    super::wait_serving(listen, Duration::from_secs(15)).await;
    child
}

/// Send `sig` (`TERM`, `QUIT`, ...) to `pid` with kill(1).
pub fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -{sig} {pid}");
}

/// The exit status of `child`, waited for off the async runtime.
pub async fn exit_status(mut child: KillOnDrop) -> std::process::ExitStatus {
    tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("the wait")
        .expect("the child's status")
}

/// A child process (the router binary) killed and reaped when dropped, so that a failed assertion does not leave
/// it running and holding its ports.
pub struct KillOnDrop(pub std::process::Child);

impl std::ops::Deref for KillOnDrop {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Pool `extra`: prefix_aware's index on small blocks, least_inflight when nothing matches.
pub const PREFIX: &str = "    prefix: { block_bytes: 64, min_match_bytes: 256, capacity_tokens_per_endpoint: 100000, fallback: least_inflight }\n";
