use super::testing::model_dir;
use super::*;

#[test]
fn a_chat_request_counts_the_rendered_template_without_adding_bos_again() {
    let m = load(&model_dir("chat")).unwrap();
    let body = serde_json::json!({"model": "m", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello world"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "  world  "},
    ]});
    let t = m.count(Api::Chat, body.to_string().as_bytes()).unwrap();
    // <s> <|system|> Be brief . </s> <|user|> hello world </s> <|assistant|> hello </s> <|user|> world </s>
    // <|assistant|>: "Be" is not in the vocabulary (case-sensitive), so [UNK].
    assert_eq!(
        t.ids,
        [1, 3, 0, 9, 10, 2, 4, 6, 7, 2, 5, 6, 2, 4, 7, 2, 5],
        "BOS comes from the template only"
    );
    assert_eq!(t.count, 17);
}

#[test]
fn a_completion_prompt_gets_bos_and_token_ids_are_taken_as_sent() {
    let m = load(&model_dir("completion")).unwrap();
    let t = m
        .count(
            Api::Completions,
            br#"{"model":"m","prompt":"hello world ."}"#,
        )
        .unwrap();
    assert_eq!(t.ids, [1, 6, 7, 10]);
    let t = m
        .count(Api::Completions, br#"{"prompt":[5,6,7,8,9]}"#)
        .unwrap();
    assert_eq!(t.count, 5);
}

#[test]
fn a_template_error_at_request_time_is_a_fallback() {
    let dir = model_dir("raises");
    std::fs::write(
        dir.join(TEMPLATE_FILE),
        "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}{% endif %}{{ m.content }}{% endfor %}",
    )
    .unwrap();
    let m = load(&dir).unwrap();
    let body = br#"{"messages":[{"role":"system","content":"x"}]}"#;
    assert_eq!(m.count(Api::Chat, body), Err(Fallback::Template));
    // chat_template.jinja took precedence over tokenizer_config.json's template.
    let body = br#"{"messages":[{"role":"user","content":"hello"}]}"#;
    assert_eq!(m.count(Api::Chat, body).unwrap().ids, [6]);
}

#[test]
fn missing_files_bad_json_and_bad_templates_name_the_file() {
    let dir = model_dir("bad");
    std::fs::remove_file(dir.join(TOKENIZER_FILE)).unwrap();
    let e = load(&dir).unwrap_err();
    assert_eq!(
        (e.file.file_name().unwrap(), e.reason.as_str()),
        (std::ffi::OsStr::new(TOKENIZER_FILE), "not found")
    );
    std::fs::write(dir.join(TOKENIZER_FILE), "{not json").unwrap();
    let e = load(&dir).unwrap_err();
    assert!(
        e.to_string()
            .contains("tokenizer.json: not a Hugging Face tokenizer"),
        "{e}"
    );

    let dir = model_dir("badconfig");
    std::fs::write(dir.join(CONFIG_FILE), "[1,").unwrap();
    let e = load(&dir).unwrap_err();
    assert!(
        e.to_string()
            .contains("tokenizer_config.json: not valid JSON"),
        "{e}"
    );

    let dir = model_dir("badtemplate");
    std::fs::write(dir.join(TEMPLATE_FILE), "{% for m in messages %}").unwrap();
    let e = load(&dir).unwrap_err();
    assert!(
        e.to_string()
            .contains("chat_template.jinja: the chat template does not compile"),
        "{e}"
    );

    // Compiles, but calls what MiniJinja does not have: found by the probe render at load.
    std::fs::write(
        dir.join(TEMPLATE_FILE),
        "{{ messages[0].content | no_such_filter }}",
    )
    .unwrap();
    let e = load(&dir).unwrap_err();
    assert!(
        e.reason.contains("does not compile") || e.reason.contains("cannot render"),
        "{e}"
    );

    let e = load(&dir.join("absent")).unwrap_err();
    assert!(e.reason.contains("is not a directory"), "{e}");
}

#[test]
fn the_debug_text_changes_with_the_files_and_never_shows_them() {
    let dir = model_dir("debug");
    let a = format!("{:?}", load(&dir).unwrap());
    assert!(
        !a.contains("hello") && a.contains("chat_template: true"),
        "{a}"
    );
    std::fs::write(dir.join(TEMPLATE_FILE), "{{ messages[0].content }}").unwrap();
    assert_ne!(a, format!("{:?}", load(&dir).unwrap()));
}

/// Process CPU seconds so far (utime + stime of /proc/self/stat, in clock ticks of 1/100 s).
fn process_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// A measurement, not a check: the CPU and the added latency of counting a ~100k-token chat prompt, and the
/// longest stall a ticking async task sees meanwhile. Run with a real model directory:
/// `INFERGATE_BENCH_MODEL_DIR=DIR cargo test -p infergate --release --lib tokens::tests::measure -- --ignored --nocapture`
#[test]
#[ignore]
fn measure_a_100k_token_prompt() {
    let dir = match std::env::var("INFERGATE_BENCH_MODEL_DIR") {
        Ok(d) => std::path::PathBuf::from(d),
        Err(_) => model_dir("bench"),
    };
    let model = std::sync::Arc::new(load(&dir).unwrap());
    let words = [
        "the", "router", "places", "each", "request", "on", "an", "engine", "whose", "prefill",
        "queue", "is", "short", "and", "cache", "holds", "prompt", "tokens", "hello", "world",
        "be", "brief", ".", ",",
    ];
    let mut rng = fastrand::Rng::with_seed(1);
    let mut text = String::new();
    while text.len() < 520_000 {
        text.push_str(words[rng.usize(..words.len())]);
        text.push(' ');
    }
    // Each count a prompt of its own (a system prompt per run), so that none reuses another's prefix.
    let body_of = |run: u32| {
        serde_json::json!({"model": "m", "messages": [
            {"role": "system", "content": format!("You are helpful assistant {run}.")},
            {"role": "user", "content": text},
        ]})
        .to_string()
    };
    let body = body_of(0);
    let tokens = model.count(Api::Chat, body.as_bytes()).unwrap().count;
    const RUNS: u32 = 10;
    let bodies: Vec<String> = (1..=RUNS).map(body_of).collect();
    let (cpu0, wall0) = (process_cpu_seconds(), std::time::Instant::now());
    for b in &bodies {
        std::hint::black_box(model.count(Api::Chat, b.as_bytes()).unwrap());
    }
    let cpu = (process_cpu_seconds() - cpu0) / f64::from(RUNS);
    let wall = wall0.elapsed().as_secs_f64() / f64::from(RUNS);
    let render = {
        let t = std::time::Instant::now();
        let Prompt::Chat(c) = prompt::prompt(Api::Chat, body.as_bytes()).unwrap() else {
            unreachable!()
        };
        let parsed = t.elapsed().as_secs_f64();
        let rendered = model.render(&c).unwrap();
        let r = t.elapsed().as_secs_f64() - parsed;
        drop(rendered);
        (parsed, r)
    };

    // The proxy's path: the count on the blocking pool while a task on the async threads ticks every ms.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (latency, stall) = rt.block_on(async {
        let t = Tokenizing::new(None);
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ticker = {
            let done = done.clone();
            tokio::spawn(async move {
                let mut worst = std::time::Duration::ZERO;
                let mut last = std::time::Instant::now();
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                    worst = worst.max(last.elapsed());
                    last = std::time::Instant::now();
                }
                worst
            })
        };
        let mut latency = 0.0;
        for run in 0..RUNS {
            let bytes = bytes::Bytes::from(body_of(RUNS + 1 + run));
            let s = std::time::Instant::now();
            let got = t
                .count(
                    "p",
                    model.clone(),
                    Some(Api::Chat),
                    bytes.clone(),
                    DEFAULT_MAX_BYTES,
                )
                .await;
            latency += s.elapsed().as_secs_f64();
            assert!(got.is_some());
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        (latency / f64::from(RUNS), ticker.await.unwrap())
    });
    // The next turn of the first conversation: its reply and a new user message of ~2k tokens.
    let next = {
        let mut more = String::new();
        while more.len() < 10_000 {
            more.push_str(words[rng.usize(..words.len())]);
            more.push(' ');
        }
        serde_json::json!({"model": "m", "messages": [
            {"role": "system", "content": "You are helpful assistant 1."},
            {"role": "user", "content": text},
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": more},
        ]})
        .to_string()
    };
    let (cpu1, wall1) = (process_cpu_seconds(), std::time::Instant::now());
    let t = model.count(Api::Chat, next.as_bytes()).unwrap();
    let (next_cpu, next_wall) = (process_cpu_seconds() - cpu1, wall1.elapsed().as_secs_f64());
    println!(
        "next turn: {} tokens, {} of them reused: {:.1} ms CPU, {:.1} ms wall",
        t.count,
        t.reused,
        next_cpu * 1e3,
        next_wall * 1e3
    );
    println!(
        "model {}: {} bytes of body, {tokens} tokens; per count: {:.1} ms CPU, {:.1} ms wall \
         (parse {:.1} ms, render {:.1} ms); through Tokenizing::count: {:.1} ms added latency; longest \
         async tick gap meanwhile {:.1} ms",
        dir.display(),
        body.len(),
        cpu * 1e3,
        wall * 1e3,
        render.0 * 1e3,
        render.1 * 1e3,
        latency * 1e3,
        stall.as_secs_f64() * 1e3
    );
}

/// A check by hand against vLLM: each line of `INFERGATE_COMPARE_FILE` is `{"api", "body", "ids"}` (the body as
/// JSON text, so its key order is the client's) with the ids a real vLLM's `/tokenize` gave for the model in
/// `INFERGATE_BENCH_MODEL_DIR` (`scripts/vllm/tokenize_cases.py` writes them).
#[test]
#[ignore]
fn compare_with_vllm() {
    let (Ok(dir), Ok(file)) = (
        std::env::var("INFERGATE_BENCH_MODEL_DIR"),
        std::env::var("INFERGATE_COMPARE_FILE"),
    ) else {
        println!("set INFERGATE_BENCH_MODEL_DIR and INFERGATE_COMPARE_FILE");
        return;
    };
    let model = load(std::path::Path::new(&dir)).unwrap();
    let text = std::fs::read_to_string(file).unwrap();
    for (i, line) in text.lines().enumerate() {
        let case: serde_json::Value = serde_json::from_str(line).unwrap();
        let api = match case["api"].as_str() {
            Some("chat") => Api::Chat,
            _ => Api::Completions,
        };
        let body = case["body"].as_str().unwrap().to_string();
        let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        let got = model.count(api, body.as_bytes()).unwrap();
        assert_eq!(got.ids, want, "case {i}");
        println!("case {i}: {} tokens, the same ids as vLLM", got.count);
    }
}

#[test]
fn a_growing_chat_reuses_its_earlier_turns_and_gives_the_same_ids_as_a_whole_encode() {
    let m = load(&model_dir("reuse")).unwrap();
    let mut messages =
        vec![serde_json::json!({"role": "system", "content": "be brief . ".repeat(500)})];
    for turn in 0..6 {
        messages.push(
            serde_json::json!({"role": "user", "content": "hello world . ".repeat(50 + turn)}),
        );
        let body = serde_json::json!({"model": "m", "messages": messages});
        let t = m.count(Api::Chat, body.to_string().as_bytes()).unwrap();
        let conv = match prompt::prompt(Api::Chat, body.to_string().as_bytes()).unwrap() {
            Prompt::Chat(c) => c,
            _ => unreachable!(),
        };
        let whole = m.encode(&m.render(&conv).unwrap(), false).unwrap();
        assert_eq!(t.ids, whole, "turn {turn}");
        if turn > 0 {
            // Everything up to the previous turn's last `</s>` came from its count.
            assert!(
                t.reused > 1_000 && t.reused < t.count,
                "turn {turn}: {} of {}",
                t.reused,
                t.count
            );
        } else {
            assert_eq!(t.reused, 0);
        }
        messages.push(serde_json::json!({"role": "assistant", "content": "hello . ".repeat(20)}));
    }
}
