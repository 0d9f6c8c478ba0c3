//! Unit tests of the access log: logfmt and JSON lines, bounded client values, a full queue drops and counts.

use super::*;

fn sample() -> Line<'static> {
    Line {
        time: Some(SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123)),
        client: Some("127.0.0.1:5555".parse().unwrap()),
        method: "POST",
        path: "/v1/chat/completions",
        model: Some("llama 3 \"70b\""),
        pool: Some("default"),
        endpoint: Some("10.0.0.5:8000"),
        reason: Some("sticky"),
        status: 200,
        tokens: Some(1234),
        predicted_ttft: Some(Duration::from_millis(40)),
        ttfb: Some(Duration::from_micros(12_345)),
        ttft: Some(Duration::from_micros(11_000)),
        duration: Duration::from_micros(1_500_250),
        bytes_in: 4096,
        bytes_out: 777,
        retries: 1,
        client_key: None,
        session: Some(0xab),
        request_id: "req-1",
        trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736"),
        error: None,
        user_agent: Some("OpenAI/Python 1.109.1"),
        prefill_endpoint: None,
        prefill: None,
    }
}

#[test]
fn text_is_logfmt_with_quoting_and_dashes() {
    assert_eq!(
        sample().text(),
        "time=2023-11-14T22:13:20.123Z client=127.0.0.1:5555 method=POST path=/v1/chat/completions \
         model=\"llama 3 \\\"70b\\\"\" pool=default endpoint=10.0.0.5:8000 reason=sticky status=200 tokens=1234 \
         predicted_ttft_ms=40.000 ttfb_ms=12.345 ttft_ms=11.000 duration_ms=1500.250 bytes_in=4096 bytes_out=777 \
         retries=1 client_key=- session=00000000000000ab request_id=req-1 \
         trace_id=4bf92f3577b34da6a3ce929d0e0e4736 error=- user_agent=\"OpenAI/Python 1.109.1\" \
         prefill_endpoint=- prefill_ms=-"
    );
    let mut l = sample();
    l.model = Some("a\nb=c\u{7}");
    l.request_id = "-";
    let t = l.text();
    assert!(t.contains(r#"model="a\nb=c\u{0007}""#), "{t}");
    assert!(
        t.contains(r#"request_id="-""#),
        "a real `-` is not an absent value: {t}"
    );
    assert_eq!(t.lines().count(), 1);
}

#[test]
fn json_has_the_same_keys_numbers_and_nulls() {
    let v: serde_json::Value = serde_json::from_str(&sample().json()).unwrap();
    assert_eq!(v["time"], "2023-11-14T22:13:20.123Z");
    assert_eq!(v["model"], "llama 3 \"70b\"");
    assert_eq!(v["status"], 200);
    assert_eq!(v["ttfb_ms"], 12.345);
    assert_eq!(v["predicted_ttft_ms"], 40.0);
    assert_eq!(v["ttft_ms"], 11.0);
    assert_eq!(v["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(v["duration_ms"], 1500.25);
    assert_eq!(v["client_key"], serde_json::Value::Null);
    assert_eq!(v["session"], "00000000000000ab");
    assert_eq!(v["user_agent"], "OpenAI/Python 1.109.1");
    assert_eq!(v.as_object().unwrap().len(), 25);
    // Same keys in the same order (values without spaces, so the text splits on spaces).
    let mut l = sample();
    l.model = Some("m");
    l.user_agent = Some("curl/8.0");
    let (text, json) = (l.text(), l.json());
    let keys: Vec<&str> = text
        .split(' ')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, _)| k)
        .collect();
    assert_eq!(keys.len(), 25);
    let at: Vec<usize> = keys
        .iter()
        .map(|k| {
            json.find(&format!("\"{k}\":"))
                .unwrap_or_else(|| panic!("{k} in {json}"))
        })
        .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{json}");
}

#[test]
fn client_values_are_bounded() {
    let long = "m".repeat(10_000);
    let mut l = sample();
    l.model = Some(&long);
    l.user_agent = Some(&long);
    let v: serde_json::Value = serde_json::from_str(&l.json()).unwrap();
    assert_eq!(v["model"].as_str().unwrap().len(), MAX_VALUE_BYTES + 3);
    assert_eq!(v["user_agent"].as_str().unwrap().len(), MAX_VALUE_BYTES + 3);
    assert_eq!(bounded("ééé", 3), "é...");
}

/// A JSON access log to a fresh file in the temporary directory, `name` in its file name: the log, its metrics
/// and the file's path.
fn file_log(
    name: &str,
    buffer_lines: usize,
) -> (AccessLog, std::sync::Arc<Metrics>, std::path::PathBuf) {
    let metrics = Metrics::new();
    let path = std::env::temp_dir().join(format!(
        "infergate-access-log-{name}-{}.log",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let cfg = AccessLogConfig {
        format: LogFormat::Json,
        target: LogTarget::File(path.clone()),
        buffer_lines,
    };
    (AccessLog::open(&cfg, &metrics).unwrap(), metrics, path)
}

#[test]
fn a_full_queue_drops_and_counts_instead_of_blocking() {
    let (log, metrics, path) = file_log("test", 1);
    let text = String::from_utf8(metrics.render()).unwrap();
    assert!(text.contains("infergate_access_log_dropped_total{cause=\"queue_full\"} 0"));
    assert!(text.contains("infergate_access_log_dropped_total{cause=\"write_error\"} 0"));
    let start = Instant::now();
    for _ in 0..10_000 {
        log.write(&sample());
    }
    assert!(start.elapsed() < Duration::from_secs(5));
    drop(log);
    // The writer drains what was queued and exits once the sender is gone.
    let dropped = {
        let text = String::from_utf8(metrics.render()).unwrap();
        text.lines()
            .find(|l| l.starts_with("infergate_access_log_dropped_total{cause=\"queue_full\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<usize>().ok())
            .unwrap()
    };
    let mut written = 0;
    for _ in 0..500 {
        written = std::fs::read_to_string(&path).unwrap().lines().count();
        if written + dropped >= 10_000 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(written + dropped, 10_000, "every line written or counted");
    assert!(written >= 1, "some lines were written");
    for l in std::fs::read_to_string(&path).unwrap().lines() {
        serde_json::from_str::<serde_json::Value>(l).unwrap();
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn line_separators_and_bidi_controls_are_escaped_in_both_formats() {
    let forged = "m\u{2028}time=x\u{2029}y\u{85}z\u{202e}txt.exe\u{2066}\u{200f}\u{7f}";
    let mut l = sample();
    l.model = Some(forged);
    l.path = "/v1/chat/completions\u{2028}injected";
    for line in [l.text(), l.json()] {
        for c in [
            '\u{2028}', '\u{2029}', '\u{85}', '\u{202e}', '\u{2066}', '\u{200f}', '\u{7f}',
        ] {
            assert!(!line.contains(c), "U+{:04X} raw in {line:?}", u32::from(c));
        }
    }
    // The JSON line still says exactly what the client sent.
    let v: serde_json::Value = serde_json::from_str(&l.json()).unwrap();
    assert_eq!(v["model"], forged);
    assert!(
        l.text().contains("model=\"m\\u{2028}time=x"),
        "{}",
        l.text()
    );
}

#[test]
fn a_sync_waits_until_every_queued_line_is_in_the_file() {
    let (log, _metrics, path) = file_log("sync", 100_000);
    let sync = log.sync_handle();
    assert!(sync.wait(Duration::ZERO), "nothing queued yet");
    for _ in 0..20_000 {
        log.write(&sample());
    }
    // The log stays open (a running router's does): the lines are in the file because of the wait, not a close.
    assert!(
        sync.wait(Duration::from_secs(20)),
        "written within the wait"
    );
    let lines = std::fs::read_to_string(&path).unwrap().lines().count();
    assert_eq!(lines, 20_000);
    drop(log);
    let _ = std::fs::remove_file(&path);
}
