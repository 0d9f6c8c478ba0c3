//! A store that refuses this replica, cannot be reached, or holds garbage under the prefix: `-t` says which it is,
//! a running replica logs why it serves without the cluster, and garbage is replaced or pruned, never a reason to
//! stay down.

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
    // Garbage under the prefix: valid, with a warning that the replicas replace it.
    let mut c = redis::Client::open(format!("redis://:right-pw@127.0.0.1:{port}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("infergate:replicas")
        .arg("junk")
        .query_async(&mut c)
        .await
        .unwrap();
    let (got, out) = test_config(&t_conf(
        "garbage.yaml",
        &format!("redis: \"redis://:right-pw@127.0.0.1:{port}\""),
    ));
    assert_eq!(got, 0, "{out}");
    assert!(
        out.contains("`infergate:replicas` is a string") && out.contains("replace it"),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_the_wrong_type_under_the_prefix_are_replaced_and_junk_replica_names_pruned() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    let mut c = redis.conn().await;
    let typed = Keys::new("infergate").session("default", session_hash(b"typed"));
    let _: () = redis::pipe()
        .cmd("SET")
        .arg("infergate:replicas")
        .arg("junk")
        .cmd("SET")
        .arg("infergate:reserved:a")
        .arg("junk")
        .cmd("HSET")
        .arg(&typed)
        .arg("f")
        .arg("v")
        .query_async(&mut c)
        .await
        .unwrap();
    // Today's failure: a string where the replica set goes kept every replica down.
    let (_engines, a, b) = session_replicas(&redis, 2).await;
    let kind = |key: &'static str| {
        let mut c = c.clone();
        async move {
            redis::cmd("TYPE")
                .arg(key)
                .query_async::<String>(&mut c)
                .await
                .unwrap()
        }
    };
    assert_eq!(kind("infergate:replicas").await, "zset");
    // A session key of another type is no binding (not a failed lookup) and the turn's binding replaces it.
    assert_eq!(turn(&a, "typed", 1_000).await.0, 200);
    redis
        .wait_binding(&a, "typed", "the binding replaces the hash", |_| true)
        .await;
    let m = a.metrics_text().await;
    let lookups = |s: &str| {
        let label = format!("source=\"{s}\"");
        metric_sum(&m, "infergate_cluster_binding_lookups_total", &[&label])
    };
    assert_eq!((lookups("miss"), lookups("unavailable")), (1.0, 0.0));
    // A's reservations key held a string: replaced once a write met it.
    let start = Instant::now();
    while kind("infergate:reserved:a").await != "hash" {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "A's reservations key is still not a hash"
        );
        assert_eq!(post_chat(&a.url(), chat_body(100, true, 2)).await, 200);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // 20,000 junk names (recent scores, as a runaway script leaves them) and 100 far in the future.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let mut zadd = redis::cmd("ZADD");
    zadd.arg("infergate:replicas");
    for i in 0..20_000u64 {
        zadd.arg(now_ms - 1_000 - i).arg(format!("junk-{i}"));
    }
    for i in 0..100u64 {
        zadd.arg(1e15 as u64 + i).arg(format!("future-{i}"));
    }
    let _: () = zadd.query_async(&mut c).await.unwrap();
    // Each tick reads at most MAX_REPLICAS_READ names and drops those without a load record.
    let start = Instant::now();
    loop {
        let left: u64 = redis::cmd("ZCARD")
            .arg("infergate:replicas")
            .query_async(&mut c)
            .await
            .unwrap();
        if left == 2 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{left} names left after 30 s"
        );
        for r in [&a, &b] {
            assert_eq!(
                r.metric_sum("infergate_cluster_peers", &[]).await,
                1.0,
                "junk is no peer"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("20,100 junk names pruned in {:?}", start.elapsed());
    // Pruning never took the store down (one late publish on a starved host would not either).
    wait_state(&[&a, &b], "connected", Duration::from_secs(1)).await;
    assert_eq!(turn(&b, "typed", 1_500).await.0, 200);
}

/// A replica (the binary, grace period 30 s) in front of one engine, named `name`, with a non-streamed request of
/// `max_tokens` in flight through it (18 ms a decode step); the engines stay up while they are held.
async fn replica_serving(
    redis: &Redis,
    name: &str,
    max_tokens: u32,
) -> (
    ProcessReplica,
    tokio::task::JoinHandle<u16>,
    Vec<infergate_sim::EngineHandle>,
) {
    let engines = engines(1, SimConfig::default()).await;
    let yaml = format!(
        "{}{}",
        pool_yaml("load_aware", &urls(&engines), ""),
        cluster_yaml(redis, name)
    );
    let r = ProcessReplica::start_with_grace(&yaml, 30).await;
    wait_metrics(r.metrics, "the endpoint healthy", |m| {
        metric_sum(m, "infergate_endpoint_healthy", &[]) == 1.0
    })
    .await;
    let in_flight = tokio::spawn({
        let url = r.url();
        async move { post_chat(&url, chat_body(64, false, max_tokens)).await }
    });
    wait_metrics(r.metrics, "the request in flight", |m| {
        metric_sum(m, "infergate_endpoint_requests_in_flight", &[]) == 1.0
    })
    .await;
    (r, in_flight, engines)
}

/// A replica stopped gracefully keeps publishing its load while the requests it dispatched are still running on
/// the engines (its peers must go on counting them), and removes its key once they ended, before it exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_replica_publishes_its_load_until_its_last_request_ends() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    // An answer of nearly 2 s.
    let (r, in_flight, _engines) = replica_serving(&redis, "leaving", 100).await;
    let key = Keys::new("infergate").load("leaving");
    assert!(redis.exists(&key).await, "published while serving");
    signal(r.child.0.id(), "TERM");
    // Past the key's lifetime (5 publish intervals of 100 ms, at least 500 ms): still there, so still published.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        redis.exists(&key).await,
        "the load of a request still running is published during the stop: {}",
        r.log()
    );
    assert_eq!(in_flight.await.unwrap(), 200, "answered after SIGTERM");
    let status = exit_status(r.child).await;
    assert!(status.success(), "{status:?}");
    assert!(!redis.exists(&key).await, "removed before the exit");
}

/// In a graceful upgrade the new instance publishes under the replica's name from its start, and the old one,
/// from SIGQUIT on, publishes the requests it still serves under that name with its process id: the peers count
/// both, and the old one removes only its own keys when its last request has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrades_old_instance_publishes_apart_from_the_new_one() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    // An answer of about 5.5 s, past the 5-s hand-over.
    let (old, in_flight, _engines) = replica_serving(&redis, "up", 300).await;
    let conf = std::env::temp_dir()
        .join(format!("infergate-cluster-{}", old.listen))
        .join("infergate.yaml");
    let new_log = conf.with_file_name("new.log");
    let _new = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_infergate"))
            .args(["-u", "-c", conf.to_str().unwrap()])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&new_log).unwrap()))
            .spawn()
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = old.child.0.id();
    signal(pid, "QUIT");
    let keys = Keys::new("infergate");
    let (shared, apart) = (keys.load("up"), keys.load(&format!("up~{pid}")));
    let start = Instant::now();
    while !redis.exists(&apart).await {
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "the old instance does not publish apart after SIGQUIT: {}",
            old.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        redis.exists(&shared).await,
        "the new instance publishes under the replica's name: {}",
        std::fs::read_to_string(&new_log).unwrap_or_default()
    );
    assert_eq!(
        in_flight.await.unwrap(),
        200,
        "answered by the old instance"
    );
    let status = exit_status(old.child).await;
    assert!(status.success(), "{status:?}");
    assert!(!redis.exists(&apart).await, "the old one removed its keys");
    assert!(redis.exists(&shared).await, "and left the new one's alone");
}
