//! An outage must not flood the log (issue 27): the same error line for every refused request is written a few
//! times, then counted, and the count is written once its window has passed.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_writes_a_few_error_lines_and_a_count_not_one_per_request() {
    let (listen, metrics, dead) = (free_port(), free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("infergate-log-flood-{listen}"));
    std::fs::create_dir_all(&dir).unwrap();
    // The only engine is not there: every request gets no_healthy_endpoint.
    std::fs::write(
        dir.join("infergate.yaml"),
        format!(
            "listen: \"127.0.0.1:{listen}\"\nmetrics_listen: \"127.0.0.1:{metrics}\"\n\
             server: {{ grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 1, pid_file: {d}/pid, \
             upgrade_sock: {d}/sock }}\n\
             pools:\n  - name: default\n    endpoints: [\"http://127.0.0.1:{dead}\"]\n    \
             health_check: {{ interval: 200ms, timeout: 200ms, route_when_all_unhealthy: false }}\n",
            d = dir.display()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("stderr")).unwrap();
    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_infergate"))
            .args(["-c", dir.join("infergate.yaml").to_str().unwrap()])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    wait_metrics(metrics, "the router", |_| true).await;
    // The metrics port starts before the client port: a request between the two is refused.
    wait_listening(([127, 0, 0, 1], listen).into()).await;
    let url = format!("http://127.0.0.1:{listen}");
    let sent = 200;
    for _ in 0..sent {
        let r = post_json(&client(), &url, CHAT)
            .body(chat_body(100, false, 1))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 503);
    }
    let read = || std::fs::read_to_string(dir.join("stderr")).unwrap_or_default();
    let refusals = |text: &str| {
        text.lines()
            .filter(|l| l.contains(" ERROR ") && l.contains("no endpoint available"))
            .filter(|l| !l.contains("more line(s) like this"))
            .count()
    };
    // The count comes once the 10 s window has passed, with no further request needed.
    let start = Instant::now();
    while !read().contains("more line(s) like this") {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no count:\n{}",
            read()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let text = read();
    let written = refusals(&text);
    assert!(
        (1..=infergate::logging::BURST as usize).contains(&written),
        "{written} error lines for {sent} refused requests:\n{text}"
    );
    let count_line = text
        .lines()
        .find(|l| l.contains("more line(s) like this"))
        .unwrap_or_default();
    assert!(
        count_line.contains(" ERROR ")
            && count_line.contains(&format!("{} more line(s)", sent - written)),
        "{count_line}"
    );
    let _ = child.0.kill();
    let _ = child.0.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
