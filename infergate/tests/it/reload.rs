//! SIGHUP on the running binary: endpoint lists (a departed endpoint's series disappear), client limits, session
//! and prefill settings and outlier detection change in place while a stream is in flight; what needs a graceful
//! upgrade is named, one line per setting; a bad file leaves the running configuration alone.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{
    chat_body, client, drain, engines, free_port, metric_sum, metric_value, try_metrics, urls,
    wait_metrics, CHAT, SESSION_HEADER,
};
use infergate_sim::SimConfig;

fn conf(listen: u16, metrics: u16, ports: &[u16]) -> String {
    let eps: String = ports
        .iter()
        .map(|p| format!("      - url: http://127.0.0.1:{p}\n"))
        .collect();
    format!(
        "listen: \"127.0.0.1:{listen}\"\nmetrics_listen: \"127.0.0.1:{metrics}\"\n\
         server: {{ grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 1, \
         pid_file: /tmp/infergate-reload-{listen}.pid, upgrade_sock: /tmp/infergate-reload-{listen}.sock }}\n\
         pools:\n  - name: default\n    endpoints:\n{eps}    health_check: {{ interval: 200ms, timeout: 200ms }}\n"
    )
}

/// A scrape of the router's metrics on `port`; None while it does not answer.
async fn metrics(port: u16) -> Option<String> {
    try_metrics(&format!("http://127.0.0.1:{port}/metrics")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_endpoints_and_deletes_departed_series() {
    let (listen, mport, a, b) = (free_port(), free_port(), free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("infergate-reload-{listen}"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("infergate.yaml");
    std::fs::write(&path, conf(listen, mport, &[a, b])).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .args(["-c", path.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ep_b = format!("endpoint=\"127.0.0.1:{b}\"");
    wait_metrics(mport, "both endpoints exported", |m| m.contains(&ep_b)).await;

    // A broken file is rejected and changes nothing.
    std::fs::write(&path, "pools: [oops").unwrap();
    let _ = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status();
    wait_metrics(mport, "the broken file rejected", |m| {
        metric_value(m, "infergate_config_reloads_total", &["result=\"failed\""]) == Some(1.0)
    })
    .await;
    assert!(metrics(mport).await.unwrap().contains(&ep_b));

    std::fs::write(&path, conf(listen, mport, &[a])).unwrap();
    let _ = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status();
    wait_metrics(mport, "departed endpoint's series deleted", |m| {
        !m.contains(&ep_b) && m.contains(&format!("endpoint=\"127.0.0.1:{a}\""))
    })
    .await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "SIGHUP must not terminate the router"
    );
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(dir);
}

const ALICE: &str = "sk-reload-alice-0123456789";
const BOB: &str = "sk-reload-bob-0123456789";

/// The router binary on its own config file, its log in a file.
struct Binary {
    dir: PathBuf,
    child: Child,
    listen: u16,
    metrics: u16,
}

impl Binary {
    /// Start the binary on `yaml` (`{listen}`, `{metrics}`, `{dir}` replaced) with a keys file, and wait for its
    /// metrics.
    async fn start(tag: &str, yaml: &str, keys: &str) -> Binary {
        let (listen, metrics) = (free_port(), free_port());
        let dir = std::env::temp_dir().join(format!("infergate-reload-{tag}-{listen}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("keys"), keys).unwrap();
        write_conf(&dir, listen, metrics, yaml);
        let log = std::fs::File::create(dir.join("stderr")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_infergate"))
            .args(["-c", dir.join("infergate.yaml").to_str().unwrap()])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        wait_metrics(metrics, "the router's metrics", |_| true).await;
        // The metrics port starts before the client port: a request between the two is refused.
        crate::common::wait_listening(([127, 0, 0, 1], listen).into()).await;
        Binary {
            dir,
            child,
            listen,
            metrics,
        }
    }

    fn write(&self, yaml: &str) {
        write_conf(&self.dir, self.listen, self.metrics, yaml);
    }

    fn hup(&self) {
        let _ = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status();
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr")).unwrap_or_default()
    }

    /// Wait until the log has `n` lines containing `what`.
    async fn wait_log(&self, what: &str, n: usize) {
        let start = Instant::now();
        while self.log().matches(what).count() < n {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no `{what}` in the log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn metrics(&self) -> String {
        metrics(self.metrics).await.unwrap_or_default()
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}{CHAT}", self.listen)
    }

    /// POST a chat body as `key` (in `session`, if any) and read it whole: the status and the body.
    async fn chat(&self, key: &str, session: Option<&str>, body: String) -> (u16, String) {
        let mut req = client().post(self.url()).bearer_auth(key).body(body);
        if let Some(s) = session {
            req = req.header(SESSION_HEADER, s);
        }
        match req.send().await {
            Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
            Err(_) => (0, String::new()),
        }
    }

    fn stop(self) {
        drop(self);
    }
}

/// A failed assertion must not leave the router running.
impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn write_conf(dir: &std::path::Path, listen: u16, metrics: u16, yaml: &str) {
    let text = yaml
        .replace("{listen}", &format!("127.0.0.1:{listen}"))
        .replace("{metrics}", &format!("127.0.0.1:{metrics}"))
        .replace("{dir}", dir.to_str().unwrap());
    std::fs::write(dir.join("infergate.yaml"), text).unwrap();
}

/// The router over `eps`: keys alice and bob (`limits` YAML under `auth`, indented by 2) and one pool with
/// `pool_extra` (indented by 4).
fn keyed_conf(eps: &[String], limits: &str, pool_extra: &str) -> String {
    format!(
        "listen: \"{{listen}}\"\nmetrics_listen: \"{{metrics}}\"\n\
         auth:\n  keys_file: {{dir}}/keys\n{limits}\
         server: {{ grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 1, \
         pid_file: {{dir}}/pid, upgrade_sock: {{dir}}/sock }}\n\
         pools:\n  - name: default\n    endpoints: [{}]\n    \
         health_check: {{ interval: 200ms, timeout: 500ms, healthy_after: 1 }}\n{pool_extra}",
        eps.iter()
            .map(|u| format!("\"{u}\""))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

async fn until_served(b: &Binary) {
    let start = Instant::now();
    while b.chat(BOB, None, chat_body(100, false, 1)).await.0 != 200 {
        assert!(start.elapsed() < Duration::from_secs(20), "{}", b.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Estimated prefill tokens served so far, once the count is stable after `before` (non-streaming holds are
/// released shortly after the answer).
async fn estimated_after(b: &Binary, before: f64) -> f64 {
    let start = Instant::now();
    loop {
        let n = metric_sum(
            &b.metrics().await,
            "infergate_prefill_tokens_estimated_total",
            &[],
        );
        if n > before {
            return n;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no estimate counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_limits_sessions_and_prefill_while_a_stream_is_in_flight() {
    let eng = engines(2, SimConfig::default()).await;
    let eps = urls(&eng);
    let before = keyed_conf(
        &eps,
        "",
        "    sessions: { ttl: 1h, max_sessions: 100 }\n    prefill: { bytes_per_token: 4 }\n",
    );
    let b = Binary::start("applied", &before, &format!("alice:{ALICE}\nbob:{BOB}\n")).await;
    until_served(&b).await;

    // Three sessions, and alice unlimited.
    for s in ["s1", "s2", "s3"] {
        assert_eq!(b.chat(BOB, Some(s), chat_body(200, false, 1)).await.0, 200);
    }
    for _ in 0..3 {
        assert_eq!(b.chat(ALICE, None, chat_body(100, false, 1)).await.0, 200);
    }
    let m = b.metrics().await;
    assert_eq!(
        metric_value(&m, "infergate_sessions", &[]),
        Some(3.0),
        "{m}"
    );
    // The estimate of one 8 KB prompt at 4 bytes per token.
    let body = chat_body(8000, false, 1);
    let n0 = metric_sum(&m, "infergate_prefill_tokens_estimated_total", &[]);
    assert_eq!(b.chat(BOB, None, body.clone()).await.0, 200);
    let n1 = estimated_after(&b, n0).await;

    // A stream of about 3 s in flight across the reload.
    let stream = client()
        .post(b.url())
        .bearer_auth(BOB)
        .header(SESSION_HEADER, "s3")
        .body(chat_body(200, true, 160))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let stream = tokio::spawn(async move {
        let t = Instant::now();
        (drain(stream).await, t.elapsed())
    });

    b.write(&keyed_conf(
        &eps,
        "  limits:\n    per_key: [ { name: alice, requests_per_minute: 1 } ]\n",
        "    sessions: { ttl: 1h, max_sessions: 1 }\n    prefill: { bytes_per_token: 1 }\n",
    ));
    b.hup();
    b.wait_log("applied prefill.bytes_per_token", 1).await;

    // The session table shrank to its most recently served binding; the others count as capacity evictions.
    let m = b.metrics().await;
    assert_eq!(
        metric_value(&m, "infergate_sessions", &[]),
        Some(1.0),
        "{m}"
    );
    let start = Instant::now();
    while metric_value(
        &b.metrics().await,
        "infergate_session_evictions_total",
        &["cause=\"capacity\""],
    ) != Some(2.0)
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "evictions not counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // alice's new limit: one request a minute (a new bucket starts full), then 429 with Retry-After.
    let mut codes = Vec::new();
    for _ in 0..2 {
        codes.push(b.chat(ALICE, None, chat_body(100, false, 1)).await.0);
    }
    assert_eq!(codes, [200, 429]);
    // One byte per token now: the same prompt is estimated four times higher.
    let n2 = metric_sum(
        &b.metrics().await,
        "infergate_prefill_tokens_estimated_total",
        &[],
    );
    assert_eq!(b.chat(BOB, None, body).await.0, 200);
    let n3 = estimated_after(&b, n2).await;
    let (old, new) = (n1 - n0, n3 - n2);
    assert!(
        (new / old - 4.0).abs() < 0.1,
        "estimate {old} tokens before, {new} after"
    );

    // The stream in flight finished whole.
    let (done, took) = stream.await.unwrap();
    assert!(done.is_ok(), "the stream broke: {done:?}");
    assert!(
        took > Duration::from_millis(500),
        "the stream took {took:?}"
    );

    let m = b.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "infergate_config_reloads_total",
            &["result=\"applied\""]
        ),
        Some(1.0),
        "{m}"
    );
    let log = b.log();
    let reload_lines: Vec<&str> = log.lines().filter(|l| l.contains("reload")).collect();
    println!(
        "{}\nstream across the reload: {took:?}",
        reload_lines.join("\n")
    );
    for line in [
        "applied sessions.max_sessions of pool `default` (100 → 1)",
        "pool `default`: 0 session binding(s) past the new ttl dropped, 2 beyond the new max_sessions evicted",
        "applied prefill.bytes_per_token of pool `default` (4.0 → 1.0)",
        "client keys reloaded",
    ] {
        assert!(log.contains(line), "no `{line}` in:\n{log}");
    }
    assert!(!log.contains("not applied"), "{log}");
    for key in [ALICE, BOB] {
        assert!(!log.contains(key), "a key was logged");
    }
    b.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_predicted_ttfts_session_settings() {
    let eng = engines(2, SimConfig::default()).await;
    let eps = urls(&eng);
    let pool = |sessions: &str| format!("    policy: predicted_ttft\n    sessions: {sessions}\n");
    let before = keyed_conf(&eps, "", &pool("{ ttl: 1h, max_sessions: 100 }"));
    let b = Binary::start("applied", &before, &format!("alice:{ALICE}\nbob:{BOB}\n")).await;
    until_served(&b).await;
    for s in ["s1", "s2", "s3"] {
        assert_eq!(b.chat(BOB, Some(s), chat_body(200, false, 1)).await.0, 200);
    }
    b.write(&keyed_conf(
        &eps,
        "",
        &pool("{ ttl: 1h, max_sessions: 1, move_margin: 1 }"),
    ));
    b.hup();
    b.wait_log("applied sessions.move_margin", 1).await;
    let m = b.metrics().await;
    assert_eq!(
        metric_value(&m, "infergate_sessions", &[]),
        Some(1.0),
        "{m}"
    );
    let log = b.log();
    for line in [
        "applied sessions.max_sessions of pool `default` (100 → 1)",
        "applied sessions.move_margin of pool `default` (0.1 → 1.0)",
        "pool `default`: 0 session binding(s) past the new ttl dropped, 2 beyond the new max_sessions evicted",
    ] {
        assert!(log.contains(line), "no `{line}` in:\n{log}");
    }
    assert!(!log.contains("not applied"), "{log}");
    b.stop();
}

/// Sessions bound to an endpoint a reload removes: the gauge counts only the bindings that can still be used, and
/// those sessions' next turns are placed afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_removing_an_endpoint_drops_its_session_bindings() {
    let eng = engines(2, SimConfig::default()).await;
    let eps = urls(&eng);
    let both = keyed_conf(&eps, "", "    sessions: {}\n");
    let b = Binary::start("sessions-removed", &both, &format!("bob:{BOB}\n")).await;
    // Sessions until both engines hold some (load_aware breaks ties at random: all 12 on one has odds of 1 in 2048).
    for i in 0..12 {
        let s = format!("s{i}");
        assert_eq!(b.chat(BOB, Some(&s), chat_body(200, false, 1)).await.0, 200);
    }
    let on_first = crate::common::generate_requests(&eng[0]);
    assert!(
        on_first > 0 && on_first < 12,
        "both engines hold sessions: {on_first} of 12"
    );
    let m = b.metrics().await;
    assert_eq!(metric_value(&m, "infergate_sessions", &[]), Some(12.0));

    b.write(&keyed_conf(&eps[1..], "", "    sessions: {}\n"));
    b.hup();
    let gone = format!("endpoint=\"{}\"", eps[0].trim_start_matches("http://"));
    wait_metrics(b.metrics, "the removed endpoint's series deleted", |m| {
        !m.contains(&gone)
    })
    .await;
    let m = b.metrics().await;
    assert_eq!(
        metric_value(&m, "infergate_sessions", &[]),
        Some((12 - on_first) as f64),
        "only bindings to the remaining endpoint count"
    );
    // Every session is served again, on the remaining engine.
    for i in 0..12 {
        let s = format!("s{i}");
        assert_eq!(b.chat(BOB, Some(&s), chat_body(200, false, 1)).await.0, 200);
    }
    assert_eq!(
        metric_value(&b.metrics().await, "infergate_sessions", &[]),
        Some(12.0)
    );
    b.stop();
}

/// A wrong health-check path (every check answered 404: the pool serves in its health panic) fixed by SIGHUP: the
/// next round of checks uses the new path, the endpoints turn healthy and the session bindings stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_fixes_a_wrong_health_check_path_in_place() {
    let eng = engines(2, SimConfig::default()).await;
    let eps = urls(&eng);
    let good = keyed_conf(&eps, "", "    sessions: {}\n");
    let wrong = good.replace(
        "health_check: { interval",
        "health_check: { path: /helth, interval",
    );
    let b = Binary::start("health-path", &wrong, &format!("bob:{BOB}\n")).await;
    b.wait_log("every endpoint fails its health check", 1).await;
    assert_eq!(
        b.chat(BOB, Some("s1"), chat_body(200, false, 1)).await.0,
        200
    );
    let m = b.metrics().await;
    assert_eq!(metric_sum(&m, "infergate_endpoint_healthy", &[]), 0.0);
    assert_eq!(metric_value(&m, "infergate_sessions", &[]), Some(1.0));

    b.write(&good);
    b.hup();
    b.wait_log(
        "applied health_check.path of pool `default` (\"/helth\" → \"/health\")",
        1,
    )
    .await;
    let start = Instant::now();
    while metric_sum(&b.metrics().await, "infergate_endpoint_healthy", &[]) < 2.0 {
        assert!(start.elapsed() < Duration::from_secs(10), "{}", b.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let m = b.metrics().await;
    assert_eq!(metric_sum(&m, "infergate_pool_health_panic", &[]), 0.0);
    assert_eq!(
        metric_value(&m, "infergate_sessions", &[]),
        Some(1.0),
        "bindings kept"
    );
    let log = b.log();
    assert!(
        log.contains("an endpoint passes its health check again"),
        "{log}"
    );
    assert!(!log.contains("not applied"), "{log}");
    b.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_outlier_detection_and_names_what_needs_an_upgrade() {
    let eng = engines(2, SimConfig::default()).await;
    // The first engine fails every request while its health check passes.
    eng[0].control.set_fail_status(Some(500));
    let eps = urls(&eng);
    let never = keyed_conf(
        &eps,
        "",
        "    outlier_detection: { consecutive_failures: 0, failure_percent: 0, failure_penalty: 0s }\n    \
         engine_stats: { interval: 1s }\n",
    );
    let b = Binary::start("partial", &never, &format!("bob:{BOB}\n")).await;
    until_served(&b).await;
    // Until the failing engine has answered twice (load_aware breaks ties at random): never ejected.
    let mut failed = 0;
    for i in 0..40 {
        failed += usize::from(b.chat(BOB, None, chat_body(100 + i, false, 1)).await.0 != 200);
        if failed == 2 {
            break;
        }
    }
    assert_eq!(failed, 2, "the failing engine got no traffic");
    let ejections = |m: &str| metric_sum(m, "infergate_endpoint_ejections_total", &[]);
    // Engine-stats scrapes of the healthy engine in the last second.
    let scrapes = || {
        eng[1]
            .requests()
            .iter()
            .filter(|r| r.path == "/metrics" && r.received_at.elapsed() < Duration::from_secs(1))
            .count()
    };
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let slow = scrapes();
    assert_eq!(ejections(&b.metrics().await), 0.0, "never ejects");
    let big = || chat_body(30_000, false, 1);
    assert_ne!(b.chat(BOB, None, big()).await.0, 413);

    // One failure ejects now; the policy, the header timeout and the listener need an upgrade.
    let text = keyed_conf(
        &eps,
        "",
        "    outlier_detection: { consecutive_failures: 1, failure_penalty: 0s }\n    \
         engine_stats: { interval: 100ms }\n    \
         policy: round_robin\n",
    )
    .replace(
        "auth:",
        "timeouts: { request_header: 3s }\nmax_body_bytes: 20000\nauth:",
    )
    .replace(
        "listen: \"{listen}\"",
        &format!("listen: \"127.0.0.1:{}\"", free_port()),
    );
    b.write(&text);
    b.hup();
    b.wait_log("setting(s) not applied", 1).await;
    let start = Instant::now();
    while ejections(&b.metrics().await) < 1.0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no ejection:\n{}",
            b.log()
        );
        let _ = b.chat(BOB, None, chat_body(100, false, 1)).await;
    }
    // Ejected for base_ejection (2 s).
    let m = b.metrics().await;
    assert_eq!(
        metric_sum(&m, "infergate_endpoint_ejected", &[]),
        1.0,
        "{m}"
    );
    // Scrape loops restart with the new interval within a second.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let fast = scrapes();
    assert!(
        slow <= 2 && fast >= 5,
        "scrapes a second: {slow} before, {fast} after"
    );
    println!("engine-stats scrapes a second: {slow} before the reload, {fast} after");
    // Read per request: a body over the new limit is refused.
    assert_eq!(b.chat(BOB, None, big()).await.0, 413);
    let m = b.metrics().await;
    // Still load_aware: no round_robin placements.
    assert_eq!(
        metric_sum(
            &m,
            "infergate_placements_total",
            &["reason=\"round_robin\""]
        ),
        0.0
    );
    assert_eq!(
        metric_value(
            &m,
            "infergate_config_reloads_total",
            &["result=\"partial\""]
        ),
        Some(1.0)
    );

    // A broken file: counted, nothing changes, the router keeps serving.
    b.write("pools: [oops");
    b.hup();
    b.wait_log("reload rejected", 1).await;
    let m = b.metrics().await;
    assert_eq!(
        metric_value(&m, "infergate_config_reloads_total", &["result=\"failed\""]),
        Some(1.0)
    );
    eng[0].control.set_fail_status(None);
    assert_eq!(b.chat(BOB, None, chat_body(100, false, 1)).await.0, 200);

    let log = b.log();
    let lines: Vec<&str> = log.lines().collect();
    let reload_lines: Vec<&&str> = lines.iter().filter(|l| l.contains("reload")).collect();
    println!("{reload_lines:#?}");
    let line = |what: &str| {
        let found: Vec<&&str> = lines.iter().filter(|l| l.contains(what)).collect();
        assert_eq!(found.len(), 1, "one line with `{what}` in:\n{log}");
        found[0].to_string()
    };
    assert!(
        line("applied outlier_detection.consecutive_failures of pool `default` (0 → 1)")
            .contains(" INFO ")
    );
    for (what, why) in [
        (
            "policy of pool `default` changed (load_aware → round_robin): not applied",
            "placement reasons",
        ),
        (
            "timeouts.request_header changed (10s → 3s): not applied",
            "client connection gate",
        ),
        ("listen changed", "listening sockets are bound at start"),
    ] {
        let l = line(what);
        assert!(l.contains(" WARN "), "{l}");
        assert!(
            l.contains("needs a restart or `systemctl reload` (graceful upgrade)"),
            "{l}"
        );
        assert!(l.contains(why), "{l}");
    }
    assert!(line("3 setting(s) not applied").contains(" WARN "));
    b.stop();
}

/// Log rotation: after the access log file is renamed away (logrotate's default, `create`), SIGHUP makes the router
/// write the next lines to a new file at the configured path; lines before the signal stay in the renamed file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reopens_the_access_log_for_log_rotation() {
    let eng = engines(1, SimConfig::default()).await;
    let yaml = format!(
        "{}access_log: {{ format: json, path: \"{{dir}}/access.log\" }}\n",
        keyed_conf(&urls(&eng), "", "")
    );
    let b = Binary::start("rotate", &yaml, &format!("bob:{BOB}\n")).await;
    until_served(&b).await;
    let (log, rotated) = (b.dir.join("access.log"), b.dir.join("access.log.1"));
    let lines = |p: &std::path::Path| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("/v1/chat/completions"))
            .count()
    };
    let start = Instant::now();
    while lines(&log) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no access-log line"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = lines(&log);
    std::fs::rename(&log, &rotated).unwrap();
    b.hup();
    b.wait_log("access log reopened", 1).await;
    assert_eq!(b.chat(BOB, None, chat_body(100, false, 1)).await.0, 200);
    let start = Instant::now();
    while lines(&log) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no line in the new access log; rotated file has {} lines\n{}",
            lines(&rotated),
            b.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(lines(&log), 1, "the new file has the line after the signal");
    assert_eq!(
        lines(&rotated),
        before,
        "the old file kept its lines and got no new one"
    );
    b.stop();
}
