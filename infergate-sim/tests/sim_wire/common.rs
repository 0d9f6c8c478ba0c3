//! Shared helpers of the wire tests: engine configs, request bodies, HTTP calls and a raw HTTP/1.1 reader.

use std::time::{Duration, Instant};

use infergate_sim::{EngineHandle, SimConfig};
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

pub fn scaled(time_scale: f64) -> SimConfig {
    SimConfig {
        time_scale,
        ..SimConfig::default()
    }
}

/// `n` distinct words, one token each by the simulator's rule: `salt` and `i` in letters (digits are a token each).
pub fn words(n: usize, salt: &str) -> String {
    let mut s = String::with_capacity(n * 8);
    for i in 0..n {
        s.push_str(salt);
        let mut x = i;
        loop {
            s.push((b'a' + (x % 26) as u8) as char);
            x /= 26;
            if x == 0 {
                break;
            }
        }
        s.push(' ');
    }
    s
}

pub fn chat(content: &str, max_tokens: usize, stream: bool) -> Value {
    json!({"model": "sim-model", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
           "stream": stream})
}

pub async fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sums every sample of `name` in a Prometheus text body.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b'{') | Some(b' '))
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// POSTs `body` as JSON to `path` on engine `e`; the answer's JSON.
pub async fn post_value(c: &reqwest::Client, e: &EngineHandle, path: &str, body: &Value) -> Value {
    c.post(format!("{}{path}", e.url()))
        .json(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The `event:` names of an SSE body, in order.
pub fn event_names(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect()
}

/// The whole answer's text to a JSON POST of `body` to `path` on `e`.
pub async fn post_text(e: &EngineHandle, path: &str, body: &Value) -> String {
    reqwest::Client::new()
        .post(format!("{}{path}", e.url()))
        .json(body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

pub async fn metrics(e: &EngineHandle) -> String {
    reqwest::get(format!("{}/metrics", e.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

pub async fn fill(s: &mut TcpStream, rest: &mut Vec<u8>, need: usize) -> std::io::Result<()> {
    while rest.len() < need {
        let mut tmp = [0u8; 65536];
        let n = s.read(&mut tmp).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        rest.extend_from_slice(&tmp[..n]);
    }
    Ok(())
}

/// Minimal HTTP/1.1 response reader for raw-socket tests: (status, lower-case headers, de-chunked body).
pub async fn read_response(
    s: &mut TcpStream,
) -> std::io::Result<(u16, Vec<(String, String)>, Vec<u8>)> {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        let mut tmp = [0u8; 4096];
        let n = s.read(&mut tmp).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8(buf[..head_end].to_vec()).unwrap();
    let mut rest = buf[head_end + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap();
            (n.to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let body = if let Some(cl) = get("content-length") {
        let cl: usize = cl.parse().unwrap();
        fill(s, &mut rest, cl).await?;
        rest.truncate(cl);
        rest
    } else if get("transfer-encoding").as_deref() == Some("chunked") {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(p) = rest.windows(2).position(|w| w == b"\r\n") {
                    break p;
                }
                let need = rest.len() + 1;
                fill(s, &mut rest, need).await?;
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap(), 16).unwrap();
            rest.drain(..line_end + 2);
            fill(s, &mut rest, size + 2).await?;
            body.extend_from_slice(&rest[..size]);
            rest.drain(..size + 2);
            if size == 0 {
                break;
            }
        }
        body
    } else {
        Vec::new()
    };
    Ok((status, headers, body))
}
