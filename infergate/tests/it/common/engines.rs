//! Simulated engines (infergate-sim, in-process) and what they received.

use infergate_sim::{self as sim, EngineHandle, RecordedRequest, SimConfig};

/// Start one engine.
pub async fn engine(cfg: SimConfig) -> EngineHandle {
    sim::spawn_engine(cfg).await.expect("engine starts")
}

/// Start `n` engines with the same configuration.
pub async fn engines(n: usize, cfg: SimConfig) -> Vec<EngineHandle> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(engine(cfg.clone()).await);
    }
    v
}

pub fn urls(e: &[EngineHandle]) -> Vec<String> {
    e.iter().map(|e| e.url()).collect()
}

/// Engines whose prefill of a ~100 KB prompt takes long enough to observe (about a second).
pub fn slow_prefill() -> SimConfig {
    SimConfig {
        prefill_tokens_per_sec: 25_000.0,
        ..SimConfig::default()
    }
}

/// Default engines running `time_scale` times their simulated durations.
pub fn time_scaled(time_scale: f64) -> SimConfig {
    SimConfig {
        time_scale,
        ..SimConfig::default()
    }
}

/// A request the router forwarded for generation: a `POST /v1/...` (the router's own `GET /v1/models`
/// discovery, health checks and stats scrapes are not).
pub fn is_generate(r: &RecordedRequest) -> bool {
    r.method == "POST" && r.path.starts_with("/v1/")
}

/// How many generate requests (`is_generate`) `e` received.
pub fn generate_requests(e: &EngineHandle) -> usize {
    e.requests().iter().filter(|r| is_generate(r)).count()
}

/// How many `POST /v1/chat/completions` `e` received (not count_tokens, which is a generate request too).
pub fn chat_requests(e: &EngineHandle) -> usize {
    e.requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path == "/v1/chat/completions")
        .count()
}

/// The last generate request `e` received.
pub fn last_generate(e: &EngineHandle) -> Option<RecordedRequest> {
    e.requests().into_iter().rev().find(is_generate)
}

/// How many requests `e` received tagged `x-test: {tag}...`.
pub fn tagged(e: &EngineHandle, tag: &str) -> usize {
    e.requests()
        .iter()
        .filter(|r| {
            r.headers
                .iter()
                .any(|(k, v)| k == "x-test" && v.starts_with(tag))
        })
        .count()
}

/// The bytes read from `s` up to the end of a request head (and any that came with it); None if it closed first.
async fn read_head(s: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 64 * 1024];
    let mut seen = Vec::new();
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf).await {
            Ok(n) if n > 0 => seen.extend_from_slice(&buf[..n]),
            _ => return None,
        }
    }
    Some(seen)
}

/// What a [`raw_engine`] writes for one request: after `wait`, `bytes`; then it closes the connection at once
/// (`close`) or holds it open for 2 s.
pub struct RawAnswer {
    pub wait: std::time::Duration,
    pub bytes: Vec<u8>,
    pub close: bool,
}

/// An engine that speaks raw bytes, for answers no real engine gives: its health check (`GET /health`) passes, and
/// every other request gets what `answer` makes of the bytes received up to the end of the head.
pub async fn raw_engine(answer: impl Fn(&[u8]) -> RawAnswer + Send + Sync + 'static) -> String {
    use tokio::io::AsyncWriteExt;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let answer = std::sync::Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let Some(seen) = read_head(&mut s).await else {
                    return;
                };
                let a = if seen.starts_with(b"GET /health") {
                    RawAnswer {
                        wait: std::time::Duration::ZERO,
                        bytes: b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".to_vec(),
                        close: false,
                    }
                } else {
                    answer(&seen)
                };
                tokio::time::sleep(a.wait).await;
                let _ = s.write_all(&a.bytes).await;
                if !a.close {
                    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                }
            });
        }
    });
    format!("http://{addr}")
}

/// An engine that streams a scripted answer on a fixed clock: its health check passes, and every other request
/// gets a chunked `text/event-stream` whose pieces `script` makes of the request head, each written at its offset
/// from the head's arrival; then the connection closes.
pub async fn paced_engine(
    script: impl Fn(&[u8]) -> Vec<(std::time::Duration, String)> + Send + Sync + 'static,
) -> String {
    use tokio::io::AsyncWriteExt;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let script = std::sync::Arc::new(script);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let script = script.clone();
            tokio::spawn(async move {
                let Some(seen) = read_head(&mut s).await else {
                    return;
                };
                let start = tokio::time::Instant::now();
                if seen.starts_with(b"GET /health") {
                    let _ = s
                        .write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                        )
                        .await;
                    return;
                }
                let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
                            Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
                if s.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                for (at, piece) in script(&seen) {
                    tokio::time::sleep_until(start + at).await;
                    let chunk = format!("{:x}\r\n{piece}\r\n", piece.len());
                    if s.write_all(chunk.as_bytes()).await.is_err() {
                        return;
                    }
                }
                let _ = s.write_all(b"0\r\n\r\n").await;
            });
        }
    });
    format!("http://{addr}")
}
