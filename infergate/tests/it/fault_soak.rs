//! The fault soak of issue 27 (about 80 s): the router binary with sessions and a Redis cluster store over four
//! engines under steady session and chat traffic, while a fault every few seconds, drawn from the whole set, hits
//! one of three engines (it hangs, drops streams, resets them, dies and returns, answers 500, 503 or 429), Redis
//! (stops and returns) or the router itself (SIGHUP, a graceful upgrade). The first engine is never touched.
//!
//! Every client request that no fault destroyed must succeed: a failure is excused only when an engine fault was
//! on while it ran and it was on that engine (or never learned its engine); every gauge ends at 0; the router's
//! resident memory ends within 10% of where it was after the warm-up. It prints what it injected and counted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use crate::common::*;
use infergate_sim::EngineHandle;

const BIN: &str = env!("CARGO_BIN_EXE_infergate");
const WORKERS: usize = 8;
const WARM_UP: Duration = Duration::from_secs(10);
/// One fault lasts this long, then the next one starts after `GAP`.
const FAULT: Duration = Duration::from_millis(2500);
const GAP: Duration = Duration::from_millis(1500);
/// A client gives up after this long (a hung engine's requests end here).
const PATIENCE: Duration = Duration::from_secs(12);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    Hang,
    DropStreams,
    ResetStreams,
    Dies,
    Answers500,
    Answers503,
    Answers429,
    RedisStops,
    Sighup,
    Upgrade,
}

impl Fault {
    fn on_engine(self) -> bool {
        !matches!(self, Fault::RedisStops | Fault::Sighup | Fault::Upgrade)
    }
}

/// The schedule: every kind at least once, the upgrade in the middle so the new instance meets faults too.
const SCHEDULE: [(Fault, usize); 16] = [
    (Fault::Hang, 1),
    (Fault::Answers503, 2),
    (Fault::DropStreams, 3),
    (Fault::RedisStops, 0),
    (Fault::ResetStreams, 1),
    (Fault::Sighup, 0),
    (Fault::Answers429, 2),
    (Fault::Upgrade, 0),
    (Fault::Dies, 3),
    (Fault::Answers500, 1),
    (Fault::Hang, 2),
    (Fault::DropStreams, 1),
    (Fault::RedisStops, 0),
    (Fault::ResetStreams, 3),
    (Fault::Answers503, 1),
    (Fault::Dies, 2),
];

/// An engine fault's window: what, on which engine, from when to when.
#[derive(Debug, Clone)]
struct Window {
    fault: Fault,
    engine: String,
    from: Instant,
    to: Instant,
}

/// One client request's outcome.
#[derive(Debug)]
struct Outcome {
    start: Instant,
    end: Instant,
    endpoint: Option<String>,
    /// None: a whole answer; else what went wrong.
    failure: Option<String>,
}

/// A redis-server on a fixed port that can be stopped and started again.
struct Redis {
    child: Option<Child>,
}

impl Redis {
    async fn start(port: u16) -> Redis {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server runs (scripts/ensure-test-tools.sh installs it)");
        wait_listening(format!("127.0.0.1:{port}").parse().unwrap()).await;
        Redis { child: Some(child) }
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The router processes of the run (the first, then the one a graceful upgrade started), killed on drop.
struct Routers {
    dir: PathBuf,
    children: Vec<Child>,
}

impl Routers {
    fn spawn(&mut self, args: &[&str], log: &str) -> u32 {
        let log = std::fs::File::create(self.dir.join(log)).unwrap();
        let conf = self.dir.join("infergate.yaml");
        let child = Command::new(BIN)
            .args(args)
            .args(["-c", conf.to_str().unwrap()])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the router binary runs");
        let pid = child.id();
        self.children.push(child);
        pid
    }

    fn log(&self) -> String {
        ["router-1.log", "router-2.log"]
            .iter()
            .map(|n| std::fs::read_to_string(self.dir.join(n)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Routers {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status();
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn conf(
    dir: &Path,
    listen: u16,
    metrics: u16,
    redis: u16,
    engines: &[String],
    retries: u32,
) -> String {
    let eps: String = engines
        .iter()
        .map(|u| format!("      - url: {u}\n"))
        .collect();
    format!(
        "listen: \"127.0.0.1:{listen}\"\nmetrics_listen: \"127.0.0.1:{metrics}\"\n\
         max_retries: {retries}\n\
         timeouts: {{ connect: 500ms, response_header: 30s, stream_idle: 10s }}\n\
         server:\n  pid_file: {dir}/infergate.pid\n  upgrade_sock: {dir}/upgrade.sock\n  \
         grace_period_seconds: 5\n  graceful_shutdown_timeout_seconds: 5\n\
         cluster: {{ redis: \"redis://127.0.0.1:{redis}\", replica: soak, publish_interval: 100ms, read_timeout: 50ms }}\n\
         pools:\n  - name: default\n    policy: load_aware\n    sessions: {{ header: x-session-id }}\n    endpoints:\n{eps}\
         \x20   health_check: {{ interval: 200ms, timeout: 500ms, healthy_after: 1, unhealthy_after: 2 }}\n\
         \x20   outlier_detection: {{ stream_headers_within: 1s, base_ejection: 2s }}\n",
        dir = dir.display()
    )
}

/// One request: a streamed session turn (two in three) or a non-streaming chat without a session.
async fn one(url: &str, worker: usize, turn: usize) -> Outcome {
    let start = Instant::now();
    let session = turn % 3 != 0;
    let mut req = post_json(&client(), url, CHAT)
        .timeout(PATIENCE)
        .body(chat_body(1_500 + (turn % 6) * 1_000, session, 6));
    if session {
        // A worker's five conversations in turn, 20 turns each: the session table reaches its size in the warm-up.
        req = req.header(SESSION_HEADER, format!("soak-{worker}-{}", (turn / 20) % 5));
    }
    let (endpoint, failure) = match req.send().await {
        Err(e) if e.is_timeout() => (None, Some("timeout".to_string())),
        Err(e) => (None, Some(format!("no answer: {e:?}"))),
        Ok(resp) => {
            let status = resp.status().as_u16();
            let endpoint = served_by(&resp);
            let mut body = resp.bytes_stream();
            let mut text = Vec::new();
            let mut broken = None;
            while let Some(c) = body.next().await {
                match c {
                    Ok(b) => text.extend_from_slice(&b),
                    Err(e) => {
                        broken = Some(if e.is_timeout() { "timeout" } else { "cut" });
                        break;
                    }
                }
            }
            let complete = !session || text.windows(12).any(|w| w == b"data: [DONE]");
            let failure = if status != 200 {
                Some(format!("status {status}"))
            } else if let Some(b) = broken {
                Some(b.to_string())
            } else if !complete {
                Some("cut".to_string())
            } else {
                None
            };
            (endpoint, failure)
        }
    };
    Outcome {
        start,
        end: Instant::now(),
        endpoint,
        failure,
    }
}

/// Apply `fault` to engine `e` (on) or take it away (off).
fn engine_fault(e: &EngineHandle, fault: Fault, on: bool) {
    let c = &e.control;
    if !on {
        c.reset();
        let _ = c.refuse_connections(false);
        return;
    }
    match fault {
        Fault::Hang => c.set_slow_headers(Duration::from_secs(60)),
        Fault::DropStreams => c.set_drop_mid_stream_after(Some(1)),
        Fault::ResetStreams => c.set_close_mid_stream_after(Some(1)),
        Fault::Dies => {
            c.set_close_mid_stream_after(Some(0));
            let _ = c.refuse_connections(true);
            c.drop_idle_connections();
        }
        Fault::Answers500 => c.set_fail_status(Some(500)),
        Fault::Answers503 => c.set_fail_status(Some(503)),
        Fault::Answers429 => c.set_fail_status(Some(429)),
        _ => {}
    }
}

/// Whether a failed request is excused: an engine fault that ends a request this way was on while it ran, and it
/// ran there (or its engine is unknown: no headers came back). A request the router left without an answer, or
/// answered with its own error, is never excused: the router retries refusals elsewhere and answers every failure.
fn destroyed_by_a_fault(o: &Outcome, windows: &[Window]) -> bool {
    let Some(why) = o.failure.as_deref() else {
        return false;
    };
    let causes: &[Fault] = match why {
        "timeout" => &[Fault::Hang],
        "cut" => &[Fault::DropStreams, Fault::ResetStreams, Fault::Dies],
        "status 500" => &[Fault::Answers500],
        "status 502" => &[Fault::Dies, Fault::ResetStreams, Fault::DropStreams],
        _ => &[],
    };
    windows.iter().any(|w| {
        causes.contains(&w.fault)
            && o.start < w.to
            && o.end > w.from
            && o.endpoint.as_deref().is_none_or(|ep| ep == w.engine)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_no_fault_destroyed_succeeds_and_nothing_leaks() {
    let eng = engines(4, time_scaled(0.05)).await;
    let urls = urls(&eng);
    let labels: Vec<String> = urls
        .iter()
        .map(|u| u.trim_start_matches("http://").to_string())
        .collect();
    let (listen, metrics, redis_port) = (free_port(), free_port(), free_port());
    let mut redis = Redis::start(redis_port).await;
    let dir = std::env::temp_dir().join(format!("infergate-fault-soak-{listen}"));
    std::fs::create_dir_all(&dir).unwrap();
    let write_conf = |retries| {
        let text = conf(&dir, listen, metrics, redis_port, &urls, retries);
        std::fs::write(dir.join("infergate.yaml"), text).unwrap();
    };
    write_conf(2);
    let mut routers = Routers {
        dir: dir.clone(),
        children: vec![],
    };
    let mut pid = routers.spawn(&[], "router-1.log");
    wait_metrics(metrics, "the router", |m| {
        metric_sum(m, "infergate_endpoint_healthy", &[]) == 4.0
    })
    .await;
    // The metrics port starts before the client port.
    wait_listening(([127, 0, 0, 1], listen).into()).await;

    let stop = Arc::new(AtomicBool::new(false));
    let outcomes = Arc::new(Mutex::new(Vec::<Outcome>::new()));
    let url = format!("http://127.0.0.1:{listen}");
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..WORKERS {
        let (stop, outcomes, url) = (stop.clone(), outcomes.clone(), url.clone());
        workers.spawn(async move {
            let mut turn = 0;
            while !stop.load(Ordering::Relaxed) {
                let o = one(&url, w, turn).await;
                outcomes.lock().unwrap().push(o);
                turn += 1;
            }
        });
    }
    tokio::time::sleep(WARM_UP).await;
    let rss_start = rss_kib(pid).expect("the router's RSS");

    let mut rss_before_upgrade = None;
    let mut windows = Vec::new();
    let mut log = Vec::new();
    let mut injected: BTreeMap<Fault, usize> = BTreeMap::new();
    let run_start = Instant::now();
    for (fault, engine) in SCHEDULE {
        *injected.entry(fault).or_default() += 1;
        let from = Instant::now();
        match fault {
            f if f.on_engine() => engine_fault(&eng[engine], f, true),
            Fault::RedisStops => redis.stop(),
            Fault::Sighup => {
                write_conf(3);
                signal(pid, "HUP");
            }
            Fault::Upgrade => {
                let new = routers.spawn(&["-u"], "router-2.log");
                // The new instance asks for the sockets until the old one sends them on SIGQUIT.
                tokio::time::sleep(Duration::from_millis(500)).await;
                rss_before_upgrade = rss_kib(pid);
                signal(pid, "QUIT");
                pid = new;
            }
            _ => {}
        }
        tokio::time::sleep(FAULT).await;
        match fault {
            f if f.on_engine() => {
                engine_fault(&eng[engine], f, false);
                windows.push(Window {
                    fault,
                    engine: labels[engine].clone(),
                    from,
                    to: Instant::now(),
                });
            }
            Fault::RedisStops => redis = Redis::start(redis_port).await,
            Fault::Sighup => write_conf(2),
            _ => {}
        }
        log.push((fault, from, Instant::now()));
        tokio::time::sleep(GAP).await;
    }
    // A hung engine's last requests end at the clients' patience; let them, then stop.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    while workers.join_next().await.is_some() {}
    let faults_took = run_start.elapsed();

    let outcomes = std::mem::take(&mut *outcomes.lock().unwrap());
    let sent = outcomes.len();
    let mut excused: BTreeMap<String, usize> = BTreeMap::new();
    let mut unexplained = Vec::new();
    for o in &outcomes {
        let Some(why) = &o.failure else { continue };
        if destroyed_by_a_fault(o, &windows) {
            *excused.entry(why.clone()).or_default() += 1;
        } else {
            let during: Vec<_> = log
                .iter()
                .filter(|(_, from, to)| o.start < *to && o.end > *from)
                .map(|(f, from, _)| (f, from.saturating_duration_since(run_start)))
                .collect();
            unexplained.push(format!(
                "{why} on {:?} at {:?} after the first fault; faults then: {during:?}",
                o.endpoint,
                o.start.saturating_duration_since(run_start)
            ));
        }
    }
    let ok = outcomes.iter().filter(|o| o.failure.is_none()).count();

    // Gauges at 0 on the instance now serving.
    let m = {
        let start = Instant::now();
        loop {
            let m = try_metrics(&format!("http://127.0.0.1:{metrics}/metrics"))
                .await
                .unwrap_or_default();
            let idle = metric_sum(&m, "infergate_endpoint_requests_in_flight", &[]) == 0.0
                && metric_sum(&m, "infergate_endpoint_prefill_tokens", &[]) == 0.0;
            if idle || start.elapsed() > Duration::from_secs(20) {
                break m;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let rss_end = rss_kib(pid).expect("the router's RSS at the end");
    println!(
        "fault soak: {} faults in {faults_took:?} ({injected:?}); {sent} requests: {ok} whole, {} destroyed by \
         a fault ({excused:?}), {} unexplained; router RSS {rss_start} KiB after warm-up, {rss_before_upgrade:?} KiB \
         before the upgrade, {rss_end} KiB at the end (the new instance)",
        SCHEDULE.len(),
        excused.values().sum::<usize>(),
        unexplained.len()
    );
    assert!(
        unexplained.is_empty(),
        "requests that failed without a fault to blame:\n{}\n{}",
        unexplained.join("\n"),
        routers.log()
    );
    assert!(ok > sent / 2, "{ok} of {sent} whole");
    assert_load_gauges_at_zero(&m);
    assert!(
        (rss_end as f64) <= rss_start as f64 * 1.1,
        "RSS grew from {rss_start} to {rss_end} KiB"
    );
    signal(pid, "TERM");
    drop(routers);
    drop(redis);
}
