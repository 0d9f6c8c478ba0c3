//! Exact prompt tokens on real sockets: a pool with a `tokenizer` (a tiny model directory the test writes) holds
//! the exact count of a chat and of a completion request on the ledger, and charges it to the key's token limit; a
//! body that cannot be counted is estimated from bytes and counted as a fallback; a missing or bad tokenizer stops
//! the binary before it binds a port, naming the key.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use infergate_sim::{self as sim, SimConfig};

use crate::common::*;

/// Word-level vocabulary of the fixture (whitespace pre-tokenizer; anything else is `[UNK]`, id 0).
const VOCAB: &[(&str, u32)] = &[
    ("[UNK]", 0),
    ("<s>", 1),
    ("</s>", 2),
    ("<|system|>", 3),
    ("<|user|>", 4),
    ("<|assistant|>", 5),
    ("hello", 6),
    ("world", 7),
    ("be", 8),
    ("brief", 9),
    (".", 10),
];

const TEMPLATE: &str = "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] | trim }} {{ eos_token }} {% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";

/// A model directory with tokenizer.json (BOS added by its post-processor) and tokenizer_config.json.
fn model_dir(tag: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("infergate-it-tokens-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let added: Vec<serde_json::Value> = VOCAB[..6]
        .iter()
        .map(|(t, id)| {
            serde_json::json!({"id": id, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let vocab: serde_json::Map<String, serde_json::Value> = VOCAB
        .iter()
        .map(|(t, id)| (t.to_string(), (*id).into()))
        .collect();
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let config =
        serde_json::json!({"bos_token": "<s>", "eos_token": "</s>", "chat_template": TEMPLATE});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    dir
}

fn tokenizer_yaml(dir: &Path) -> String {
    format!("    tokenizer: {{ path: \"{}\" }}\n", dir.display())
}

/// Send `body` to `path` while the engine holds its headers, and return the prefill tokens the ledger held for it.
async fn held_tokens(
    router: &TestRouter,
    eng: &sim::EngineHandle,
    path: &str,
    body: String,
) -> u64 {
    eng.control.set_slow_headers(Duration::from_millis(600));
    let url = format!("{}{path}", router.url());
    let sent = tokio::spawn(async move {
        client()
            .post(url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    router
        .wait_for("the request held", Duration::from_secs(5), |r| {
            r.totals().1 == 1
        })
        .await;
    let held = router.totals().0;
    assert_eq!(sent.await.unwrap().unwrap(), 200);
    eng.control.set_slow_headers(Duration::ZERO);
    router.wait_idle().await;
    held
}

const CHAT: &str = r#"{"model":"m","max_tokens":1,"messages":[{"role":"system","content":"be brief ."},{"role":"user","content":"hello world"}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_holds_the_exact_prompt_tokens_of_chat_and_completions() {
    let eng = engine(SimConfig::default()).await;
    let dir = model_dir("held");
    let router = start_router(&pool_yaml(
        "load_aware",
        &[eng.url()],
        &tokenizer_yaml(&dir),
    ))
    .await;
    router.ready().await;
    // <s> <|system|> be brief . </s> <|user|> hello world </s> <|assistant|>: 11 tokens (bytes / 4 would be 31).
    assert_eq!(
        held_tokens(&router, &eng, "/v1/chat/completions", CHAT.to_string()).await,
        11
    );
    // A completion prompt gets BOS: <s> hello world hello.
    let completion = r#"{"model":"m","max_tokens":1,"prompt":"hello world hello"}"#.to_string();
    assert_eq!(
        held_tokens(&router, &eng, "/v1/completions", completion).await,
        4
    );
    let text = router.metrics_text().await;
    assert_eq!(
        metric_sum(&text, "infergate_prefill_tokens_estimated_total", &[]),
        15.0,
        "the served estimates are the exact counts"
    );
    assert_eq!(
        metric_sum(
            &text,
            "infergate_tokenizer_seconds_count",
            &["pool=\"default\""]
        ),
        2.0
    );
    assert_eq!(
        metric_sum(&text, "infergate_tokenizer_fallbacks_total", &[]),
        0.0
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_cannot_be_counted_is_estimated_from_its_bytes() {
    let eng = engine(SimConfig::default()).await;
    let dir = model_dir("fallback");
    let router = start_router(&pool_yaml(
        "load_aware",
        &[eng.url()],
        &tokenizer_yaml(&dir),
    ))
    .await;
    router.ready().await;
    // `content` of a message must be a string or a list of parts: no chat request the template can render.
    let body =
        r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":{"text":"hello"}}]}"#;
    let bytes_estimate = (body.len() as f64 / 4.0).ceil() as u64;
    assert_eq!(
        held_tokens(&router, &eng, "/v1/chat/completions", body.to_string()).await,
        bytes_estimate
    );
    let fallbacks = router
        .metric_sum("infergate_tokenizer_fallbacks_total", &["reason=\"body\""])
        .await;
    assert_eq!(fallbacks, 1.0);
    // A pool without a tokenizer estimates every body from bytes and counts no fallback.
    let plain = start_router(&pool_yaml("load_aware", &[eng.url()], "")).await;
    plain.ready().await;
    assert_eq!(
        held_tokens(&plain, &eng, "/v1/chat/completions", CHAT.to_string()).await,
        (CHAT.len() as f64 / 4.0).ceil() as u64
    );
    assert!(!plain
        .metrics_text()
        .await
        .contains("infergate_tokenizer_fallbacks_total{"));
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_charged_the_exact_prompt_tokens() {
    let eng = engine(SimConfig::default()).await;
    let dir = model_dir("limits");
    let keys =
        std::env::temp_dir().join(format!("infergate-it-tokens-keys-{}", std::process::id()));
    std::fs::write(&keys, "alice:sk-alice-0123456789abcdef\n").unwrap();
    // 2,000 bytes of one unknown word: 500 tokens by bytes, 2 exact (BOS and [UNK]). A full bucket lets one
    // request through whatever it costs; by bytes it is then 100 tokens short for the next one.
    let prompt = "x".repeat(2_000);
    let body = format!(r#"{{"model":"m","max_tokens":1,"prompt":"{prompt}"}}"#);
    let yaml = |extra: &str| {
        format!(
            "auth:\n  keys_file: {}\n  limits: {{ prompt_tokens_per_minute: 400 }}\n{}",
            keys.display(),
            pool_yaml("load_aware", &[eng.url()], extra)
        )
    };
    for (extra, want) in [
        (tokenizer_yaml(&dir), [200, 200]),
        (String::new(), [200, 429]),
    ] {
        let router = start_router(&yaml(&extra)).await;
        router.ready().await;
        for want in want {
            let status = client()
                .post(format!("{}/v1/completions", router.url()))
                .bearer_auth("sk-alice-0123456789abcdef")
                .body(body.clone())
                .send()
                .await
                .unwrap()
                .status()
                .as_u16();
            assert_eq!(status, want, "tokenizer: {}", !extra.is_empty());
        }
        router.wait_idle().await;
    }
    let _ = std::fs::remove_file(keys);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_missing_or_bad_tokenizer_stops_the_binary_before_it_binds_naming_the_key() {
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = held.local_addr().unwrap().to_string();
    let bad_template = model_dir("bad-template");
    std::fs::write(
        bad_template.join("chat_template.jinja"),
        "{% if messages %}",
    )
    .unwrap();
    let bad_json = model_dir("bad-json");
    std::fs::write(bad_json.join("tokenizer.json"), "{\"model\": ").unwrap();
    let missing = model_dir("missing");
    std::fs::remove_file(missing.join("tokenizer_config.json")).unwrap();
    let cases = [
        (
            bad_template.clone(),
            "chat_template.jinja: the chat template does not compile",
        ),
        (
            bad_json.clone(),
            "tokenizer.json: not a Hugging Face tokenizer",
        ),
        (missing.clone(), "tokenizer_config.json: not found"),
    ];
    for (i, (dir, reason)) in cases.iter().enumerate() {
        let conf = std::env::temp_dir().join(format!(
            "infergate-it-tokens-{}-{i}.yaml",
            std::process::id()
        ));
        let text = format!(
            "listen: \"{listen}\"\npools:\n  - name: a\n    endpoints: [\"http://127.0.0.1:9\"]\n{}",
            tokenizer_yaml(dir)
        );
        std::fs::write(&conf, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_infergate"))
            .args(["-c", conf.to_str().unwrap()])
            .env("RUST_LOG", "error")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{err}");
        assert!(err.contains("pools[0].tokenizer.path: "), "{err}");
        assert!(err.contains(reason), "{reason}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        let _ = std::fs::remove_file(conf);
    }
    for d in [bad_template, bad_json, missing] {
        let _ = std::fs::remove_dir_all(d);
    }
}
