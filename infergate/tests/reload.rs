//! SIGHUP re-reads the endpoint lists of the running binary: a departed endpoint's series disappear, a bad file
//! leaves the running configuration alone.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, try_metrics};

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

async fn wait_metrics(port: u16, what: &str, f: impl Fn(&str) -> bool) {
    let start = Instant::now();
    loop {
        if let Some(m) = metrics(port).await {
            if f(&m) {
                return;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    tokio::time::sleep(Duration::from_millis(300)).await;
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
