//! `cluster` over TLS (`rediss://`) with a real `redis-server --tls-port` that asks for client certificates
//! (its default): two replicas with the CA file and a client certificate connect and share a session binding; a
//! replica trusting another CA never connects and keeps serving on its own.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::*;
use infergate_sim::SimConfig;

/// A `redis-server` listening on TLS only, on a loopback port; killed on drop.
struct TlsRedis {
    port: u16,
    child: Child,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl TlsRedis {
    async fn start(dir: &Path, ca: &TestCa) -> Option<TlsRedis> {
        let redis = tool("redis-server")?;
        let server = ca.issue("redis", &["localhost", "127.0.0.1"]);
        let (cert, key) = (
            write(dir, "redis.pem", &server.cert),
            write(dir, "redis.key", &server.key),
        );
        let ca_file = write(dir, "redis-ca.pem", &ca.pem());
        let port = free_port();
        let child = Command::new(redis)
            .args(["--port", "0", "--tls-port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--tls-cert-file")
            .arg(&cert)
            .arg("--tls-key-file")
            .arg(&key)
            .arg("--tls-ca-cert-file")
            .arg(&ca_file)
            .args(["--tls-auth-clients", "yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        wait_listening(format!("127.0.0.1:{port}").parse().unwrap()).await;
        Some(TlsRedis { port, child })
    }
}

/// The `cluster` section of a replica over TLS: `ca` is the CA file it trusts, `cert`/`key` its client certificate.
fn cluster_yaml(redis: &TlsRedis, replica: &str, ca: &Path, cert: &Path, key: &Path) -> String {
    format!(
        "cluster: {{ redis: \"rediss://127.0.0.1:{}\", ca_file: \"{}\", cert_file: \"{}\", key_file: \"{}\", \
         replica: {replica}, publish_interval: 100ms, read_timeout: 50ms }}\n",
        redis.port,
        ca.display(),
        cert.display(),
        key.display()
    )
}

async fn state_is(r: &TestRouter, state: &str) -> bool {
    r.metric_sum("infergate_cluster_state", &[&format!("state=\"{state}\"")])
        .await
        == 1.0
}

/// One session turn on `r`: (status, the endpoint that served it).
async fn turn(r: &TestRouter, session: &str) -> (u16, String) {
    let resp = post_json(&client(), &r.url(), CHAT)
        .header(SESSION_HEADER, session)
        .body(chat_body(3_000, true, 4))
        .send()
        .await
        .expect("response");
    let ep = served_by(&resp).unwrap_or_default();
    (finish(resp).await, ep)
}

fn client_cert(dir: &Path, ca: &TestCa, name: &str) -> (PathBuf, PathBuf) {
    let issued = ca.issue(name, &["localhost"]);
    (
        write(dir, &format!("{name}.pem"), &issued.cert),
        write(dir, &format!("{name}.key"), &issued.key),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_sessions_through_redis_over_tls_and_one_trusting_another_ca_stays_alone() {
    let dir = tls_dir("cluster");
    let ca = TestCa::new("redis CA");
    let Some(redis) = TlsRedis::start(&dir, &ca).await else {
        return;
    };
    let ca_file = write(&dir, "ca.pem", &ca.pem());
    let engines = engines(3, SimConfig::default()).await;
    let urls = urls(&engines);
    let replica = |name: &'static str, trusted: PathBuf| {
        let (cert, key) = client_cert(&dir, &ca, name);
        let yaml = format!(
            "{}{}",
            pool_yaml("load_aware", &urls, &sessions_yaml(1000)),
            cluster_yaml(&redis, name, &trusted, &cert, &key)
        );
        async move {
            let r = start_router(&yaml).await;
            r.all_healthy().await;
            r
        }
    };
    let a = replica("a", ca_file.clone()).await;
    let b = replica("b", ca_file.clone()).await;
    for r in [&a, &b] {
        let start = std::time::Instant::now();
        while !state_is(r, "connected").await {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "a replica did not connect to Redis over TLS"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Turns alternating between the replicas stay on the engine the first one chose.
    let mut served = Vec::new();
    for i in 0..6 {
        let r = if i % 2 == 0 { &a } else { &b };
        let (status, ep) = turn(r, "over-tls").await;
        assert_eq!(status, 200, "turn {i}");
        served.push(ep);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(served.iter().all(|e| *e == served[0]), "{served:?}");

    // A replica that trusts another CA: Redis's certificate does not verify, it never connects, and serves alone.
    let other = TestCa::new("another CA");
    let other_file = write(&dir, "other-ca.pem", &other.pem());
    let c = replica("c", other_file).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        state_is(&c, "down").await,
        "connected without trusting Redis's CA"
    );
    assert_eq!(turn(&c, "alone").await.0, 200);
    drop((a, b, c, redis));
    let _ = std::fs::remove_dir_all(dir);
}

/// What the configuration check accepts is what the router uses: every TLS file of the Redis store (CA, client
/// certificate, key) and the engines' CA is opened once while the configuration is read.
#[test]
fn each_tls_file_is_read_once_with_the_configuration() {
    let Some(strace) = strace() else {
        return;
    };
    let dir = tls_dir("read-once");
    let ca = TestCa::new("redis CA");
    let redis_ca = write(&dir, "redis-ca.pem", &ca.pem());
    let (cert, key) = client_cert(&dir, &ca, "replica");
    let engine_ca = write(&dir, "engine-ca.pem", &ca.pem());
    let conf = write(
        &dir,
        "infergate.yaml",
        &format!(
            "listen: \"127.0.0.1:0\"\n\
             cluster: {{ redis: \"rediss://127.0.0.1:9\", ca_file: \"{}\", cert_file: \"{}\", key_file: \"{}\" }}\n\
             pools:\n  - name: a\n    tls: {{ ca_file: \"{}\", server_name: engine.internal }}\n    \
             endpoints:\n      - url: https://127.0.0.1:9\n",
            redis_ca.display(),
            cert.display(),
            key.display(),
            engine_ca.display()
        ),
    );
    let trace = dir.join("opens.trace");
    // Bounded, and failing with the router's output when the configuration is refused.
    run(
        Command::new(strace)
            .args(["-f", "-e", "trace=open,openat,openat2", "-o"])
            .arg(&trace)
            .arg(env!("CARGO_BIN_EXE_infergate"))
            .arg("-t")
            .arg("-c")
            .arg(&conf),
        60,
    );
    let opens = std::fs::read_to_string(&trace).unwrap();
    for file in [&redis_ca, &cert, &key, &engine_ca] {
        let quoted = format!("\"{}\"", file.display());
        let n = opens.lines().filter(|l| l.contains(&quoted)).count();
        assert_eq!(n, 1, "{} opened {n} times:\n{opens}", file.display());
    }
}
