//! The metrics port guarded by a token (`metrics_auth`): every path but `/health` needs it (curl, reqwest), a
//! browser opens the status page with it as the basic-auth password (headless Chromium), Prometheus scrapes with
//! the shipped scrape config (a real Prometheus), SIGHUP re-reads the token file, and a metrics port beyond
//! loopback without a token stops the start before any port is bound.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

const TOKEN: &str = "mt-0123456789abcdef0123456789abcdef";
const OTHER: &str = "mt-fedcba9876543210fedcba9876543210";

/// A fresh directory for one test's files.
fn test_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "infergate-metrics-auth-{tag}-{}-{}",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `path` holding `token` and a newline, as `openssl rand -hex 32 > FILE` writes it.
fn write_token(path: &Path, token: &str) {
    std::fs::write(path, format!("{token}\n")).unwrap();
}

/// A router over one engine whose metrics port needs the token in `token_file`.
async fn guarded_router(token_file: &Path) -> (infergate_sim::EngineHandle, TestRouter) {
    let engine = engine(Default::default()).await;
    let yaml = pool_yaml("round_robin", &[engine.url()], "")
        + &format!("metrics_auth:\n  token_file: {}\n", token_file.display());
    let router = start_router(&yaml).await;
    router.all_healthy().await;
    (engine, router)
}

/// GET `url` with an optional `Authorization` value: status, `www-authenticate` values, body.
async fn get(url: &str, authorization: Option<&str>) -> (u16, Vec<String>, String) {
    let mut req = client().get(url);
    if let Some(a) = authorization {
        req = req.header("authorization", a);
    }
    let r = req.send().await.unwrap();
    let challenges = r
        .headers()
        .get_all("www-authenticate")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    (r.status().as_u16(), challenges, r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_path_but_health_needs_the_token_as_bearer_or_basic_password() {
    let dir = test_dir("paths");
    let file = dir.join("token");
    write_token(&file, TOKEN);
    let (_engine, router) = guarded_router(&file).await;
    let base = format!("http://{}", router.metrics_addr);
    let bearer = format!("Bearer {TOKEN}");

    for path in ["/metrics", "/status", "/status.json", "/nothing"] {
        let url = format!("{base}{path}");
        for wrong in [
            None,
            Some(format!("Bearer {OTHER}")),
            Some(TOKEN.to_string()),
        ] {
            let (status, challenges, body) = get(&url, wrong.as_deref()).await;
            assert_eq!(status, 401, "{path} with {wrong:?}: {body}");
            assert_eq!(
                challenges,
                [
                    "Bearer realm=\"infergate metrics\"",
                    "Basic realm=\"infergate metrics\", charset=\"UTF-8\""
                ],
                "{path}"
            );
            assert!(body.contains("metrics_auth.token_file"), "{body}");
            assert!(!body.contains(TOKEN), "{body}");
        }
    }
    let (status, _, metrics) = get(&format!("{base}/metrics"), Some(&bearer)).await;
    assert_eq!(status, 200);
    assert!(metrics.contains("# TYPE infergate_requests_total counter"));
    let (status, _, json) = get(&format!("{base}/status.json"), Some(&bearer)).await;
    assert_eq!(status, 200);
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["pools"][0]["name"], "default");
    let (status, _, _) = get(&format!("{base}/nothing"), Some(&bearer)).await;
    assert_eq!(status, 404, "past the token, an unknown path is not found");
    // /health is for load balancers and probes: open.
    let (status, _, health) = get(&format!("{base}/health"), None).await;
    assert_eq!(status, 200, "{health}");

    // curl, as an operator would: --oauth2-bearer sends `Bearer`, -u the basic credentials.
    let curl = tool("curl").expect("curl");
    let code = |args: &[&str], path: &str| {
        run(
            Command::new(&curl)
                .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
                .args(args)
                .arg(format!("{base}{path}")),
            30,
        )
    };
    assert_eq!(code(&["--oauth2-bearer", TOKEN], "/metrics"), "200");
    assert_eq!(
        code(&["-u", &format!("admin:{TOKEN}")], "/status.json"),
        "200"
    );
    assert_eq!(code(&["-u", &format!("admin:{OTHER}")], "/status"), "401");
    assert_eq!(code(&[], "/metrics"), "401");
    assert_eq!(code(&[], "/health"), "200");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_opens_the_status_page_with_the_token_as_its_password() {
    let Some(chrome) = tool("chromium") else {
        return;
    };
    let dir = test_dir("chromium");
    let file = dir.join("token");
    write_token(&file, TOKEN);
    let (_engine, router) = guarded_router(&file).await;
    let addr = router.metrics_addr;
    let ep = router.state.pools.pools[0].endpoints()[0].label.clone();
    let dump = |url: String| {
        let chrome = chrome.clone();
        tokio::task::spawn_blocking(move || chromium(&chrome, &url, &["--dump-dom"]))
    };

    // Credentials in the URL stand for what a person types into the browser's login prompt; the page's own
    // fetch of /status.json then carries them too (it renders `live` only from that fetch).
    let dom = dump(format!("http://admin:{TOKEN}@{addr}/status"))
        .await
        .unwrap();
    assert!(
        dom.contains(&format!("<tr data-endpoint=\"{ep}\">")),
        "{ep} not rendered:\n{dom}"
    );
    assert!(
        dom.contains("data-source=\"live\""),
        "the page did not refresh from /status.json with the credentials:\n{dom}"
    );
    // A wrong password or none: not the page (headless Chromium shows nothing where a browser would prompt).
    for url in [
        format!("http://admin:{OTHER}@{addr}/status"),
        format!("http://{addr}/status"),
    ] {
        let dom = dump(url.clone()).await.unwrap();
        assert!(
            !dom.contains("infergate status") && !dom.contains("data-endpoint"),
            "{url} shows the page:\n{dom}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Prometheus's view of its targets: (job, health, lastError) of each active one.
async fn prometheus_targets(web: &str) -> Vec<(String, String, String)> {
    let Ok(r) = client()
        .get(format!("{web}/api/v1/targets?state=active"))
        .send()
        .await
    else {
        return vec![];
    };
    let v: serde_json::Value = r.json().await.unwrap_or_default();
    v["data"]["activeTargets"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            let s = |k: &str| t[k].as_str().unwrap_or_default().to_string();
            (
                t["labels"]["job"].as_str().unwrap_or_default().to_string(),
                s("health"),
                s("lastError"),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_with_the_shipped_config_and_a_wrong_token_is_refused() {
    let (Some(promtool), Some(prometheus)) = (tool("promtool"), tool("prometheus")) else {
        return;
    };
    let dir = test_dir("prometheus");
    let file = dir.join("token");
    write_token(&file, TOKEN);
    let (_engine, router) = guarded_router(&file).await;

    // The shipped file with only the credentials file, the target and the interval changed, and a second job
    // like it with another token.
    let shipped = std::fs::read_to_string(repo().join("conf/prometheus/prometheus.yml")).unwrap();
    for s in [
        "credentials_file: /etc/prometheus/infergate-metrics-token",
        "targets: [\"gpu-node-1:9090\"]",
        "scrape_interval: 15s",
        "type: Bearer",
    ] {
        assert!(
            shipped.contains(s),
            "conf/prometheus/prometheus.yml lacks `{s}`"
        );
    }
    let creds = dir.join("prometheus-token");
    write_token(&creds, TOKEN);
    let wrong = dir.join("wrong-token");
    write_token(&wrong, OTHER);
    let target = format!("targets: [\"{}\"]", router.metrics_addr);
    let mut conf = shipped
        .replace(
            "/etc/prometheus/infergate-metrics-token",
            creds.to_str().unwrap(),
        )
        .replace("targets: [\"gpu-node-1:9090\"]", &target)
        .replace("scrape_interval: 15s", "scrape_interval: 1s");
    conf.push_str(&format!(
        "  - job_name: wrong-token\n    authorization: {{ type: Bearer, credentials_file: {} }}\n    \
         static_configs: [{{ {target} }}]\n",
        wrong.display()
    ));
    std::fs::write(dir.join("prometheus.yml"), conf).unwrap();
    std::fs::copy(
        repo().join("conf/prometheus/infergate-alerts.yml"),
        dir.join("infergate-alerts.yml"),
    )
    .unwrap();
    let checked = run(
        Command::new(&promtool)
            .args(["check", "config", "prometheus.yml"])
            .current_dir(&dir),
        60,
    );
    assert!(checked.contains("SUCCESS"), "{checked}");

    let web = format!("127.0.0.1:{}", free_port());
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let _prometheus = KillOnDrop(
        Command::new(&prometheus)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let web = format!("http://{web}");
    let start = Instant::now();
    let targets = loop {
        let t = prometheus_targets(&web).await;
        let health = |job: &str| t.iter().find(|x| x.0 == job).map(|x| x.1.clone());
        if health("infergate").as_deref() == Some("up")
            && health("wrong-token").as_deref() == Some("down")
        {
            break t;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "Prometheus did not scrape as expected: {t:?}\n{}",
            std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let refused = targets.iter().find(|t| t.0 == "wrong-token").unwrap();
    assert!(refused.2.contains("401"), "{refused:?}");
    drop(_prometheus);
    let _ = std::fs::remove_dir_all(dir);
}

/// A router config over `engine` with metrics on `metrics` (files in `dir`) and `extra` at the top level.
fn binary_conf(dir: &Path, listen: &str, metrics: &str, engine: &str, extra: &str) -> String {
    format!(
        "listen: \"{listen}\"\nmetrics_listen: \"{metrics}\"\n{extra}\
         server: {{ grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 1, pid_file: {d}/pid, \
         upgrade_sock: {d}/sock }}\n\
         pools:\n  - name: default\n    endpoints: [\"{engine}\"]\n",
        d = dir.display()
    )
}

/// Poll until `url` answers `want` to `Bearer token`, at most 20 s.
async fn until_status(url: &str, token: &str, want: u16, what: &str) {
    let start = Instant::now();
    loop {
        let got = client().get(url).bearer_auth(token).send().await;
        if got.as_ref().map(|r| r.status().as_u16()).ok() == Some(want) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rereads_the_token_file_and_a_bad_one_keeps_the_running_token() {
    let engine = engine(Default::default()).await;
    let dir = test_dir("sighup");
    let file = dir.join("token");
    write_token(&file, TOKEN);
    let (listen, metrics) = (free_port(), free_port());
    let extra = format!("metrics_auth: {{ token_file: {} }}\n", file.display());
    let conf = binary_conf(
        &dir,
        &format!("127.0.0.1:{listen}"),
        &format!("127.0.0.1:{metrics}"),
        &engine.url(),
        &extra,
    );
    std::fs::write(dir.join("infergate.yaml"), conf).unwrap();
    let router = spawn_router(&dir, &[]);
    let url = format!("http://127.0.0.1:{metrics}/metrics");
    until_status(&url, TOKEN, 200, "the first token served").await;
    assert_eq!(get(&url, Some(&format!("Bearer {OTHER}"))).await.0, 401);
    let hup = || {
        let _ = Command::new("kill")
            .args(["-HUP", &router.0.id().to_string()])
            .status();
    };

    write_token(&file, OTHER);
    hup();
    until_status(&url, OTHER, 200, "the new token after SIGHUP").await;
    assert_eq!(get(&url, Some(&format!("Bearer {TOKEN}"))).await.0, 401);

    // A token too short to keep: the reload is rejected whole and the running token stays.
    std::fs::write(&file, "tok-xyz\n").unwrap();
    hup();
    let log = || std::fs::read_to_string(dir.join("stderr")).unwrap_or_default();
    let start = Instant::now();
    while !log().contains("reload rejected") {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no rejection:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(get(&url, Some(&format!("Bearer {OTHER}"))).await.0, 200);
    let log = log();
    assert!(
        log.contains("metrics token re-read from")
            && log.contains("(changed: the old one is refused"),
        "{log}"
    );
    assert!(
        log.contains("metrics_auth.token_file: the token in"),
        "{log}"
    );
    for secret in [TOKEN, OTHER, "tok-xyz"] {
        assert!(!log.contains(secret), "a token in the log: {secret}\n{log}");
    }
    drop(router);
    let _ = std::fs::remove_dir_all(dir);
}

/// A SIGHUP sent the moment the metrics port first answers reloads the router; it must not find the signal's
/// default action (terminate) still in place. Several starts, each signalled as early as a client can.
#[test]
fn a_sighup_as_soon_as_the_metrics_port_answers_does_not_stop_the_router() {
    use std::io::{Read, Write};
    let dir = test_dir("early-hup");
    for start in 0..6 {
        let (listen, metrics) = (free_port(), free_port());
        let conf = binary_conf(
            &dir,
            &format!("127.0.0.1:{listen}"),
            &format!("127.0.0.1:{metrics}"),
            "http://127.0.0.1:9",
            "",
        );
        std::fs::write(dir.join("infergate.yaml"), conf).unwrap();
        let mut router = spawn_router(&dir, &[]);
        let began = Instant::now();
        // As fast as a client can: the first bytes of an answer, then the signal at once.
        loop {
            let answered = std::net::TcpStream::connect(("127.0.0.1", metrics))
                .and_then(|mut s| {
                    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n")?;
                    let mut b = [0u8; 16];
                    s.read(&mut b)
                })
                .is_ok_and(|n| n > 0);
            if answered {
                break;
            }
            assert!(
                began.elapsed() < Duration::from_secs(20),
                "start {start}: the metrics port never answered"
            );
        }
        let _ = Command::new("kill")
            .args(["-HUP", &router.0.id().to_string()])
            .status();
        std::thread::sleep(Duration::from_millis(300));
        let exited = router.0.try_wait().ok().flatten();
        let log = std::fs::read_to_string(dir.join("stderr")).unwrap_or_default();
        assert!(
            exited.is_none(),
            "start {start}: a SIGHUP as the metrics port first answered ended the router ({exited:?})\n{log}"
        );
        drop(router);
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_metrics_port_beyond_loopback_without_a_token_stops_the_start_before_any_port_is_bound() {
    let dir = test_dir("open");
    // Hold the metrics port on every address: a router that got as far as binding would fail on it instead.
    let held = TcpListener::bind("0.0.0.0:0").unwrap();
    let metrics = format!("0.0.0.0:{}", held.local_addr().unwrap().port());
    let listen = format!("127.0.0.1:{}", free_port());
    let run_with = |extra: &str, args: &[&str]| {
        let conf = binary_conf(&dir, &listen, &metrics, "http://127.0.0.1:9", extra);
        std::fs::write(dir.join("infergate.yaml"), conf).unwrap();
        let mut child = spawn_router(&dir, args);
        let status = child.0.wait().unwrap();
        let stderr = std::fs::read_to_string(dir.join("stderr")).unwrap();
        (status.code(), stderr)
    };
    for args in [&["-t"][..], &[]] {
        let (code, stderr) = run_with("", args);
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("infergate: configuration error:")
                && stderr.contains(&format!(
                    "infergate.yaml: metrics_listen: `{metrics}` is reachable beyond"
                ))
                && stderr.contains("metrics_auth.allow_unauthenticated: true")
                && stderr.contains("metrics_auth.token_file"),
            "{args:?}: {stderr}"
        );
    }
    // Said explicitly, the file is valid, and the start goes on to the ports (and fails on the held one).
    let allow = "metrics_auth: { allow_unauthenticated: true }\n";
    let (code, stderr) = run_with(allow, &["-t"]);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stderr) = run_with(allow, &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on {metrics}")),
        "{stderr}"
    );
    drop(held);
    let _ = std::fs::remove_dir_all(dir);
}
