//! A store that refuses this replica or cannot be reached: `-t` says which it is, and a running replica logs why it
//! serves without the cluster.

use super::*;

/// A pool of one (unreachable) endpoint and a cluster section on `redis_line` (`redis: …` and any other keys).
fn t_conf(name: &str, redis_line: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("infergate-cluster-t-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            "listen: \"127.0.0.1:{}\"\npools:\n  - name: a\n    endpoints:\n      - url: http://127.0.0.1:9\n\
             cluster: {{ {redis_line} }}\n",
            free_port()
        ),
    )
    .unwrap();
    path
}

/// `infergate -t -c path`: (exit code, stdout and stderr).
fn test_config(path: &std::path::Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .args(["-t", "-c", path.to_str().unwrap()])
        .env("RUST_LOG", "error")
        .output()
        .expect("runs");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minus_t_refuses_credentials_the_store_refuses_and_warns_of_one_it_cannot_reach() {
    let Some(redis) = Redis::start_with(&["--requirepass", "right-pw"]).await else {
        return;
    };
    let port = redis.port;
    let pw_file = std::env::temp_dir().join(format!("infergate-cluster-pw-{}", std::process::id()));
    std::fs::write(&pw_file, "wrong-from-file\n").unwrap();
    let cases = [
        (
            "wrong_in_url.yaml",
            format!("redis: \"redis://:wrong-in-url@127.0.0.1:{port}\""),
            1,
            "cluster.redis: Redis at redis://:***@127.0.0.1",
        ),
        (
            "wrong_in_file.yaml",
            format!(
                "redis: \"redis://127.0.0.1:{port}\", password_file: {}",
                pw_file.display()
            ),
            1,
            "cluster.password_file: Redis at redis://127.0.0.1",
        ),
        (
            "none_given.yaml",
            format!("redis: \"redis://127.0.0.1:{port}\""),
            1,
            "cluster.redis: Redis at redis://127.0.0.1",
        ),
        (
            "right.yaml",
            format!("redis: \"redis://:right-pw@127.0.0.1:{port}\""),
            0,
            "is valid",
        ),
        (
            "no_such_db.yaml",
            format!("redis: \"redis://:right-pw@127.0.0.1:{port}/99\""),
            1,
            "cluster.redis: Redis at",
        ),
        (
            "unreachable.yaml",
            format!("redis: \"redis://127.0.0.1:{}\"", free_port()),
            0,
            "warning: ",
        ),
    ];
    for (name, line, code, says) in cases {
        let (got, out) = test_config(&t_conf(name, &line));
        assert_eq!(got, code, "{name}: {out}");
        assert!(out.contains(says), "{name}: {out}");
        for secret in ["right-pw", "wrong-in-url", "wrong-from-file"] {
            assert!(!out.contains(secret), "{name} shows a password: {out}");
        }
        if code == 1 {
            assert!(out.contains("refused this replica"), "{name}: {out}");
        }
    }
    let (_, out) = test_config(&t_conf(
        "unreachable2.yaml",
        &format!("redis: \"redis://127.0.0.1:{}\"", free_port()),
    ));
    assert!(
        out.contains("cannot reach Redis") && out.contains("is valid"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_refused_by_the_store_says_why_at_once_and_serves_on_its_own() {
    let Some(redis) = Redis::start_with(&["--requirepass", "right-pw"]).await else {
        return;
    };
    let engines = engines(1, SimConfig::default()).await;
    let yaml = format!(
        "{}cluster: {{ redis: \"redis://:wrong-pw@127.0.0.1:{}\", replica: lonely }}\n",
        pool_yaml("load_aware", &urls(&engines), ""),
        redis.port
    );
    let r = ProcessReplica::start(&yaml).await;
    let start = Instant::now();
    while !r.log().contains("cluster: cannot use Redis") {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no line says why: {}",
            r.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = r.log();
    assert!(
        log.contains("redis://:***@127.0.0.1") && log.contains("as replica lonely"),
        "{log}"
    );
    assert!(
        log.contains("authentication failed") && log.contains("cluster.password_file"),
        "the reason and where the password is set: {log}"
    );
    assert!(!log.contains("wrong-pw"), "the password is never logged");
    assert_eq!(
        r.metric("infergate_cluster_state", &["state=\"down\""])
            .await,
        1.0
    );
    wait_metrics(r.metrics, "the endpoint healthy", |m| {
        metric_sum(m, "infergate_endpoint_healthy", &[]) == 1.0
    })
    .await;
    assert_eq!(post_chat(&r.url(), chat_body(100, true, 2)).await, 200);
    // Attempts go on every 500 ms; the reason is said once (then once a minute), not per attempt.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(r.log().matches("cluster: cannot use Redis").count(), 1);
    assert!(!r.log().contains("still unavailable"));
}
