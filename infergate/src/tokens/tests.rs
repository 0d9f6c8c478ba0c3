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
