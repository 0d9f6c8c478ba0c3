//! Sessions across a graceful upgrade, with the real binary and Pingora's own order of events: the new instance
//! (`-u`) starts first and waits for the listening sockets; the old one gets SIGQUIT, hands them over, keeps
//! serving for Pingora's 5 s close timeout, and only then (its shutdown watch) writes its last bindings. The new
//! instance has already loaded the file by then, so it must adopt the later write: the next turn is `sticky` on
//! the engine the old instance bound the session to.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

fn conf(listen: u16, metrics: u16, state: &Path, engines: &[String]) -> String {
    let eps: String = engines
        .iter()
        .map(|u| format!("      - \"{u}\"\n"))
        .collect();
    format!(
        "listen: \"127.0.0.1:{listen}\"\nmetrics_listen: \"127.0.0.1:{metrics}\"\n\
         server: {{ grace_period_seconds: 1, graceful_shutdown_timeout_seconds: 1, \
         pid_file: /tmp/infergate-upgrade-{listen}.pid, upgrade_sock: /tmp/infergate-upgrade-{listen}.sock }}\n\
         state_file: {{ path: \"{}\", interval: 1h }}\n\
         pools:\n  - name: default\n    endpoints:\n{eps}\
         \x20   sessions: {{ header: x-session-id }}\n\
         \x20   health_check: {{ interval: 200ms, timeout: 500ms, healthy_after: 1, unhealthy_after: 1 }}\n",
        state.display()
    )
}

fn spawn(conf: &Path, log: &Path, upgrade: bool) -> Router {
    let mut args = vec!["-c", conf.to_str().unwrap()];
    if upgrade {
        args.push("-u");
    }
    Router(
        Command::new(env!("CARGO_BIN_EXE_infergate"))
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(log).unwrap()))
            .spawn()
            .unwrap(),
    )
}

fn signal(child: &Child, sig: &str) {
    let _ = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status();
}

/// Wait for `f`, polling every 50 ms; false after `limit`.
async fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while !f() {
        if start.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

/// A router process, stopped (SIGINT, then SIGKILL after 10 s) when dropped, also when the test fails.
struct Router(Child);

impl Drop for Router {
    fn drop(&mut self) {
        signal(&self.0, "-INT");
        let start = Instant::now();
        while self.0.try_wait().ok().flatten().is_none() {
            if start.elapsed() > Duration::from_secs(10) {
                let _ = self.0.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.wait();
    }
}

fn conversation(turns: usize) -> String {
    let messages: Vec<serde_json::Value> = (0..turns)
        .map(|t| serde_json::json!({"role": "user", "content": format!("turn {t}: {}", "context ".repeat(200))}))
        .collect();
    serde_json::json!({"model": "sim-model", "stream": true, "max_tokens": 2, "messages": messages})
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_new_instance_adopts_the_old_ones_last_bindings() {
    let eng = engines(3, time_scaled(0.1)).await;
    let (listen, metrics) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("infergate-upgrade-{listen}"));
    std::fs::create_dir_all(&dir).unwrap();
    let (cfg, state) = (dir.join("infergate.yaml"), dir.join("sessions.state"));
    std::fs::write(&cfg, conf(listen, metrics, &state, &urls(&eng))).unwrap();
    let (old_log, new_log) = (dir.join("old.log"), dir.join("new.log"));
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let base = format!("http://127.0.0.1:{listen}");

    let old = spawn(&cfg, &old_log, false);
    let healthy = eventually(Duration::from_secs(20), || {
        read(&old_log).contains(" starting with ")
            && std::net::TcpStream::connect(("127.0.0.1", listen)).is_ok()
    })
    .await;
    assert!(healthy, "old instance never listened:\n{}", read(&old_log));
    // Every endpoint healthy (a fresh instance starts them unknown).
    let metrics_url = format!("http://127.0.0.1:{metrics}/metrics");
    let start = Instant::now();
    while metric_sum(
        &try_metrics(&metrics_url).await.unwrap_or_default(),
        "infergate_endpoint_healthy",
        &[],
    ) < 3.0
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "endpoints never healthy"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for turns in 1..=2 {
        assert_eq!(
            post_chat_in_session(&base, "agent-upgrade", conversation(turns)).await,
            200
        );
    }
    let bound = eng
        .iter()
        .position(|e| chat_requests(e) == 2)
        .expect("two sticky turns on one engine");
    assert!(!state.exists(), "nothing written yet (interval 1h)");

    // Pingora's order: the new instance first, then SIGQUIT to the old one.
    let new = spawn(&cfg, &new_log, true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    signal(&old.0, "-QUIT");
    let mut old = old;
    let written = eventually(Duration::from_secs(20), || state.exists()).await;
    assert!(
        written,
        "the old instance wrote nothing:\n{}",
        read(&old_log)
    );
    let adopted = eventually(Duration::from_secs(10), || {
        read(&new_log).contains("adopted 1 session bindings")
    })
    .await;
    assert!(
        adopted,
        "the new instance did not adopt:\n{}",
        read(&new_log)
    );
    let exited = eventually(Duration::from_secs(15), || {
        old.0.try_wait().ok().flatten().is_some()
    })
    .await;
    assert!(exited, "the old instance did not exit");

    assert_eq!(
        post_chat_in_session(&base, "agent-upgrade", conversation(3)).await,
        200
    );
    let counts: Vec<usize> = eng.iter().map(chat_requests).collect();
    assert_eq!(counts[bound], 3, "the turn after the upgrade: {counts:?}");
    let m = try_metrics(&metrics_url).await.unwrap_or_default();
    assert_eq!(
        metric_sum(&m, "infergate_placements_total", &["reason=\"sticky\""]),
        1.0,
        "served by the new instance, sticky:\n{m}"
    );
    let old_text = read(&old_log);
    assert!(old_text.contains("wrote 1 session bindings"), "{old_text}");
    drop(new);
    let _ = std::fs::remove_dir_all(&dir);
}
