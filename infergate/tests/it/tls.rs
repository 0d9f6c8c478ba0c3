//! TLS on the client listener, with certificates each test makes (rcgen): curl gets answers over TLS 1.2 and 1.3
//! with ALPN http/1.1, older TLS, plain HTTP and a client that does not trust the issuer are refused; SIGHUP on the
//! real binary hands a renewed certificate to new connections while a connection opened before keeps working on
//! the old one, and a broken certificate file leaves the served one alone.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::client::TlsStream;

use crate::common::*;
use infergate_sim::SimConfig;

const CHAT_BODY: &str =
    r#"{"model":"m","messages":[{"role":"user","content":"hello over tls"}],"max_tokens":3}"#;

fn tls_yaml(cert: &Path, key: &Path) -> String {
    format!(
        "tls: {{ cert_file: \"{}\", key_file: \"{}\" }}\n",
        cert.display(),
        key.display()
    )
}

/// curl against `url` with `args`; (exit code, stdout).
fn curl(args: &[&str]) -> (i32, String) {
    let curl = tool("curl").expect("curl");
    let out = Command::new("timeout")
        .arg("20")
        .arg(curl)
        .args(["-sS", "--max-time", "15"])
        .args(args)
        .output()
        .expect("curl runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_is_served_over_tls_1_2_and_1_3_and_plain_old_or_untrusting_clients_are_refused() {
    if tool("curl").is_none() {
        return;
    }
    let dir = tls_dir("curl");
    let ca = TestCa::new("infergate test CA");
    let issued = ca.issue("router-one", &["localhost", "127.0.0.1"]);
    let ca_file = write(&dir, "ca.pem", &ca.pem());
    let (cert, key) = (
        write(&dir, "cert.pem", &issued.cert),
        write(&dir, "key.pem", &issued.key),
    );
    let engines = engines(1, SimConfig::default()).await;
    let yaml = pool_yaml("load_aware", &urls(&engines), "") + &tls_yaml(&cert, &key);
    let r = start_router(&yaml).await;
    r.ready().await;
    let port = r.addr.port();
    let url = format!("https://localhost:{port}/v1/chat/completions");
    let cafile = ca_file.to_str().unwrap();
    let post = |extra: &[&str]| {
        let mut args = vec![
            "--cacert",
            cafile,
            "-H",
            "content-type: application/json",
            "-d",
            CHAT_BODY,
            "-w",
            "\n%{http_code} %{http_version} %{ssl_verify_result}",
        ];
        args.extend_from_slice(extra);
        args.push(&url);
        curl(&args)
    };

    // TLS 1.3 by default; curl offers h2 and http/1.1 and gets http/1.1.
    let (rc, out) = post(&["--http2"]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.ends_with("\n200 1.1 0"), "{out}");
    assert!(out.contains("chat.completion"), "{out}");
    // TLS 1.2 only.
    let (rc, out) = post(&["--tlsv1.2", "--tls-max", "1.2"]);
    assert_eq!((rc, out.ends_with("\n200 1.1 0")), (0, true), "{out}");
    // The address as the certificate names it too.
    let (rc, out) = curl(&[
        "--cacert",
        cafile,
        "-w",
        "%{http_code}",
        "-o",
        "/dev/null",
        &format!("https://127.0.0.1:{port}/health"),
    ]);
    assert_eq!((rc, out.as_str()), (0, "200"));

    // TLS 1.1 at most: no protocol in common (curl 35, a handshake failure).
    let (rc, _) = post(&["--tlsv1", "--tls-max", "1.1"]);
    assert_ne!(rc, 0, "TLS 1.1 must be refused");
    // A client that trusts another CA: curl 60, certificate not verified.
    let other = TestCa::new("another CA");
    let other_file = write(&dir, "other-ca.pem", &other.pem());
    let (rc, _) = curl(&["--cacert", other_file.to_str().unwrap(), &url]);
    assert_eq!(
        rc, 60,
        "a certificate from an untrusted issuer must not verify"
    );
    // Plain HTTP on the TLS port: no HTTP answer.
    let (rc, out) = curl(&[
        "-w",
        "%{http_code}",
        &format!("http://127.0.0.1:{port}/health"),
    ]);
    assert_ne!(rc, 0, "plain HTTP on the TLS port must fail: {out}");

    // The router still serves after the refused handshakes.
    let (rc, out) = post(&[]);
    assert_eq!((rc, out.ends_with("\n200 1.1 0")), (0, true), "{out}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A TLS connection to `port` trusting `ca`, with the common name of the certificate it was served.
async fn connect(port: u16, ca: &str) -> (TlsStream<tokio::net::TcpStream>, String) {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let connector = tokio_rustls::TlsConnector::from(client_trusting(ca));
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = connector.connect(name, tcp).await.expect("TLS handshake");
    let cn = {
        let (_, conn) = tls.get_ref();
        assert_eq!(conn.alpn_protocol(), Some(&b"http/1.1"[..]));
        common_name(conn.peer_certificates().expect("a certificate")[0].as_ref())
    };
    (tls, cn)
}

/// One keep-alive `GET /health` on an open connection; the status.
async fn health_on(conn: &mut TlsStream<tokio::net::TcpStream>) -> u16 {
    conn.write_all(b"GET /health HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .expect("write");
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    // The answer is small: read until its body (`{...}`) has arrived.
    while !(head.ends_with(b"}") && head.windows(4).any(|w| w == b"\r\n\r\n")) {
        assert!(Instant::now() < deadline, "no answer on the old connection");
        let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf))
            .await
            .expect("read in time")
            .expect("read");
        assert!(n > 0, "the old connection was closed");
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head);
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// SIGHUP to `pid`, then wait until its metrics on `mport` count one reload with `result`.
async fn reload(pid: u32, mport: u16, result: &str) {
    let _ = Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status();
    let label = format!("result=\"{result}\"");
    wait_metrics(mport, &format!("a reload {result}"), |m| {
        metric_value(m, "infergate_config_reloads_total", &[&label]) == Some(1.0)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_serves_a_renewed_certificate_to_new_connections_and_old_ones_keep_working() {
    let dir = tls_dir("rotate");
    let ca = TestCa::new("infergate rotation CA");
    let ca_pem = ca.pem();
    let first = ca.issue("first", &["localhost"]);
    let (cert, key) = (
        write(&dir, "cert.pem", &first.cert),
        write(&dir, "key.pem", &first.key),
    );
    let engine = engine(SimConfig::default()).await;
    let (listen, mport) = (free_port(), free_port());
    let conf = format!(
        "listen: \"127.0.0.1:{listen}\"\nmetrics_listen: \"127.0.0.1:{mport}\"\n\
         server: {{ grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 1, \
         pid_file: {d}/infergate.pid, upgrade_sock: {d}/upgrade.sock }}\n{tls}\
         pools:\n  - name: default\n    endpoints: [\"{url}\"]\n    health_check: {{ interval: 200ms, timeout: 500ms }}\n",
        d = dir.display(),
        tls = tls_yaml(&cert, &key),
        url = engine.url(),
    );
    let path = write(&dir, "infergate.yaml", &conf);
    let child = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .args(["-c", path.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id();
    let _child = KillOnDrop(child);
    wait_metrics(mport, "the endpoint healthy", |m| {
        metric_sum(m, "infergate_endpoint_healthy", &[]) == 1.0
    })
    .await;
    // The metrics listener can answer before the client listener binds (the proxy starts after the first health
    // round): a healthy endpoint on the metrics port is not yet a listening client port.
    wait_listening(([127, 0, 0, 1], listen).into()).await;

    let (mut old, cn) = connect(listen, &ca_pem).await;
    assert_eq!(cn, "first");
    assert_eq!(health_on(&mut old).await, 200);

    // Renewed in place, as certbot or cert-manager do, then SIGHUP.
    let second = ca.issue("second", &["localhost"]);
    std::fs::write(&cert, &second.cert).unwrap();
    std::fs::write(&key, &second.key).unwrap();
    reload(pid, mport, "applied").await;
    let (mut new, cn) = connect(listen, &ca_pem).await;
    assert_eq!(
        cn, "second",
        "a new connection gets the renewed certificate"
    );
    assert_eq!(health_on(&mut new).await, 200);
    // The connection opened before the reload is still served, twice.
    assert_eq!(health_on(&mut old).await, 200);
    assert_eq!(health_on(&mut old).await, 200);

    // A half-written renewal (the key of another certificate): the reload is rejected, the renewed one stays.
    let third = ca.issue("third", &["localhost"]);
    std::fs::write(&key, &third.key).unwrap();
    reload(pid, mport, "failed").await;
    let (mut after, cn) = connect(listen, &ca_pem).await;
    assert_eq!(cn, "second");
    assert_eq!(health_on(&mut after).await, 200);
    assert_eq!(health_on(&mut old).await, 200);
    drop((old, new, after));

    // Plain HTTP on the TLS port, 12 times: each a failed handshake Pingora logs at error, the router at warn
    // (a client's doing, unless there are many), alike but for the client's port, so rate-limited.
    for _ in 0..12 {
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", listen))
            .await
            .unwrap();
        tcp.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 64];
        let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf)).await;
    }
    let log = || std::fs::read_to_string(dir.join("stderr")).unwrap_or_default();
    let start = std::time::Instant::now();
    while !log().contains("InvalidContentType") {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no handshake line:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("Downstream handshake error"))
        .collect();
    assert!(
        lines.iter().all(|l| l.contains(" WARN ")),
        "handshake failures at warn:\n{log}"
    );
    // Written 5 times in a window (logging::BURST), then counted: 12 plain-HTTP clients, at most 5 lines of theirs.
    let plain = lines
        .iter()
        .filter(|l| l.contains("InvalidContentType"))
        .count();
    assert!((1..=5).contains(&plain), "rate-limited:\n{log}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `infergate -t` (and a start) with a key that is not the certificate's: exit 1, the message names the file, the
/// key and the reason, and no port is bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_does_not_match_stops_the_start_naming_file_and_key() {
    let dir = tls_dir("mismatch");
    let ca = TestCa::new("mismatch CA");
    let (a, b) = (ca.issue("a", &["localhost"]), ca.issue("b", &["localhost"]));
    let cert = write(&dir, "cert.pem", &a.cert);
    let key = write(&dir, "key.pem", &b.key);
    let listen = free_port();
    let conf = format!(
        "listen: \"127.0.0.1:{listen}\"\n{}pools:\n  - name: default\n    endpoints: [\"http://127.0.0.1:9\"]\n",
        tls_yaml(&cert, &key)
    );
    let path = write(&dir, "infergate.yaml", &conf);
    for test_only in [true, false] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_infergate"));
        cmd.args(["-c", path.to_str().unwrap()]);
        if test_only {
            cmd.arg("-t");
        }
        let out = Command::new("timeout")
            .arg("20")
            .arg(cmd.get_program())
            .args(cmd.get_args())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        let want = format!(
            "{}: tls.key_file: the key in `{}`",
            path.display(),
            key.display()
        );
        assert!(err.contains(&want), "{err}");
        assert!(
            err.contains("does not belong to the first certificate"),
            "{err}"
        );
        assert!(
            std::net::TcpListener::bind(("127.0.0.1", listen)).is_ok(),
            "no port may be bound"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}
