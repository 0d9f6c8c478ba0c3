//! Unit tests of the tokeniser: FNV values, the token rule, prefix-stable prompts, request parsing, stored turns.

use super::*;

const PROSE: &str = "It was the best of times, it was the worst of times, it was the age of wisdom, it was the \
    age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, \
    it was the season of Darkness. The scheduler runs steps while work exists; each step has a token budget, \
    first one token per decoding request, then prefill chunks of running requests in arrival order. \
    Internationalization and characterization are longer words than most.\n\nA new paragraph starts here.";

#[test]
fn fnv_known_values() {
    assert_eq!(fnv64(b""), 0xcbf29ce484222325);
    assert_eq!(fnv64(b"a"), 0xaf63dc4c8601ec8c);
}

#[test]
fn prose_differs_from_bytes_over_four() {
    let n = count_tokens(PROSE) as f64;
    let est = PROSE.len() as f64 / 4.0;
    let ratio = n / est;
    assert!(
        (0.70..=0.90).contains(&ratio),
        "tokens {n}, bytes/4 {est}, ratio {ratio}"
    );
}

#[test]
fn rule_examples() {
    assert_eq!(count_tokens("hello world"), 2);
    assert_eq!(count_tokens("hello, world!"), 4);
    assert_eq!(count_tokens("internationalization"), 3); // 20 chars -> 8 + 8 + 4
    assert_eq!(count_tokens("a\n\n\nb"), 3);
    assert_eq!(count_tokens("héllo"), 3); // "h", "é", "llo"
    assert_eq!(count_tokens(""), 0);
    assert_eq!(count_tokens("<|im_start|>user\nhi<|im_end|>"), 5);
    assert_eq!(count_tokens("a <| b |> c"), 7);
}

#[test]
fn chat_prompt_is_prefix_stable() {
    let t1 = serde_json::json!({"messages":[{"role":"user","content":PROSE}]});
    let t2 = serde_json::json!({"messages":[{"role":"user","content":PROSE},
        {"role":"assistant","content":"ok"},{"role":"user","content":[{"type":"text","text":"more"}]}]});
    let a = prompt_of(ApiKind::Chat, &t1, 16, false).unwrap();
    let b = prompt_of(ApiKind::Chat, &t2, 16, false).unwrap();
    assert!(b.len > a.len);
    // All full blocks of turn 1 except possibly the last (which holds the generation prompt) match.
    let common = a.block_hashes.len().saturating_sub(1);
    assert!(common > 3);
    assert_eq!(a.block_hashes[..common], b.block_hashes[..common]);
}

#[test]
fn claude_codes_attribution_block_is_not_rendered() {
    let turn = |cch: &str| {
        serde_json::json!({"messages": [{"role": "user", "content": PROSE}], "system": [
            {"type": "text", "text": format!("x-anthropic-billing-header: cc_version=2.1.119.af2; cch={cch};")},
            {"type": "text", "text": PROSE}]})
    };
    let a = prompt_of(ApiKind::Messages, &turn("97bd6"), 16, false).unwrap();
    let b = prompt_of(ApiKind::Messages, &turn("24c2d"), 16, false).unwrap();
    assert_eq!(a.block_hashes, b.block_hashes);
    assert_eq!(a.len, b.len);
}

fn parse_gen_request(
    kind: ApiKind,
    body: &[u8],
    block_tokens: usize,
) -> Result<GenRequest, BadRequest> {
    gen_request(kind, &parse_body(body)?, block_tokens, &[])
}

#[test]
fn a_continued_response_renders_its_history_first() {
    let t1 = serde_json::json!({"input": PROSE, "instructions": "be brief"});
    let a = gen_request(ApiKind::Responses, &t1, 16, &[]).unwrap();
    assert_eq!(
        a.input,
        [serde_json::json!({"role": "user", "content": PROSE})]
    );
    let answer = serde_json::json!({"role": "assistant", "content": "ok"});
    let history: Vec<&Value> = a.input.iter().chain([&answer]).collect();
    let t2 = serde_json::json!({"input": [{"role": "user", "content": "more"}]});
    let b = gen_request(ApiKind::Responses, &t2, 16, &history).unwrap();
    // The same prompt as a client resending the conversation itself.
    let resent = serde_json::json!({"input": [{"role": "user", "content": PROSE}, answer,
                                              {"role": "user", "content": "more"}]});
    let c = gen_request(ApiKind::Responses, &resent, 16, &[]).unwrap();
    assert_eq!(
        (b.prompt.len, &b.prompt.block_hashes),
        (c.prompt.len, &c.prompt.block_hashes)
    );
    assert_eq!(b.input.len(), 1);
    let f =
        store_fields(&serde_json::json!({"previous_response_id": "resp_1", "background": true}))
            .unwrap();
    assert_eq!(
        f,
        StoreFields {
            store: true,
            background: true,
            previous_response_id: Some("resp_1".into())
        }
    );
    assert!(store_fields(&serde_json::json!({"store": "yes"})).is_err());
    assert!(store_fields(&serde_json::json!({"previous_response_id": 7})).is_err());
}

#[test]
fn parse_fields() {
    let r = parse_gen_request(
        ApiKind::Chat,
        br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":7,"stream":true,
                "stream_options":{"include_usage":true}}"#,
        16,
    )
    .unwrap();
    assert_eq!(r.max_tokens, Some(7));
    assert!(r.stream && r.include_usage);
    assert_eq!(r.model.as_deref(), Some("m"));
    assert!(parse_gen_request(ApiKind::Chat, b"{not json", 16).is_err());
    let c = parse_gen_request(
        ApiKind::Completion,
        br#"{"prompt":"one two three","max_tokens":3}"#,
        16,
    )
    .unwrap();
    assert_eq!(c.prompt.len, 3);
    assert!(!c.stream);
}
