//! Unit tests of the request scan: classification, each API's body, cache keys, attachments, truncation, bounds.

use super::*;

#[test]
fn classifies_calls() {
    assert_eq!(classify("POST", "/v1/chat/completions"), CallKind::Generate);
    assert_eq!(classify("POST", "/v1/completions?x=1"), CallKind::Generate);
    assert_eq!(classify("POST", "/v1/messages"), CallKind::Generate);
    assert_eq!(
        classify("POST", "/v1/messages/count_tokens"),
        CallKind::Passive
    );
    assert_eq!(classify("POST", "/tokenize"), CallKind::Passive);
    assert_eq!(classify("GET", "/v1/models"), CallKind::RouterModels);
    assert_eq!(classify("GET", "/health"), CallKind::RouterHealth);
    assert_eq!(classify("GET", "/v1/models/x"), CallKind::Passive);
}

#[test]
fn scans_chat_body() {
    let b = br#"{"model":"m\/1","stream":true,"messages":[{"role":"system","content":"be brief"},
            {"role":"user","content":[{"type":"text","text":"hello"},{"type":"image_url","image_url":{"url":"x"}}]}],
            "max_tokens":5}"#;
    let s = scan(b, 1 << 20);
    assert_eq!(s.model.as_deref(), Some("m/1"));
    assert_eq!(s.stream, Some(true));
    assert_eq!(s.prompt, b"be brief\x1ehello");
    assert!(s.complete);
}

#[test]
fn scans_completion_prompt_and_anthropic_system() {
    let s = scan(br#"{"prompt":["a","b"],"model":"x"}"#, 100);
    assert_eq!(
        (s.model.as_deref(), s.prompt.as_slice()),
        (Some("x"), &b"a\x1eb"[..])
    );
    let s = scan(
        br#"{"system":"sys","messages":[{"role":"user","content":"hi"}],"model":"c"}"#,
        100,
    );
    assert_eq!(s.prompt, b"sys\x1ehi");
}

#[test]
fn the_system_prompt_goes_first_wherever_the_body_has_it() {
    // The anthropic SDK: `system` (here cache-controlled blocks) after `messages`.
    let s = scan(
        br#"{"max_tokens":4,"messages":[{"role":"user","content":"hi"}],"model":"c",
                "system":[{"type":"text","text":"sys1","cache_control":{"type":"ephemeral"}},{"type":"text","text":"sys2"}]}"#,
        100,
    );
    assert_eq!(s.prompt, b"sys1\x1esys2\x1ehi");
    // Claude Code's attribution block is not prompt text (vLLM drops it; its hashes change per request).
    let with_billing = |cch: &str| {
        let body = format!(
            r#"{{"model":"c","messages":[{{"role":"user","content":"hi"}}],"system":[
                    {{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.119.af2; cc_entrypoint=cli; cch={cch};"}},
                    {{"type":"text","text":"You are Claude Code.","cache_control":{{"type":"ephemeral"}}}}]}}"#
        );
        scan(body.as_bytes(), 1000)
    };
    let (a, b) = (with_billing("97bd6"), with_billing("24c2d"));
    assert_eq!(a.prompt, b"You are Claude Code.\x1ehi");
    assert_eq!((a.prompt, a.conversation_at), (b.prompt, b.conversation_at));
    // The openai SDK's responses.create: `instructions` after `input`.
    let s = scan(
        br#"{"input":"hello","instructions":"be brief","model":"r"}"#,
        100,
    );
    assert_eq!(
        (s.model.as_deref(), s.prompt.as_slice()),
        (Some("r"), &b"be brief\x1ehello"[..])
    );
    assert_eq!(&s.prompt[s.conversation_at..], b"hello");
    let s = scan(br#"{"system":"only","model":"c"}"#, 100);
    assert_eq!((s.prompt.as_slice(), s.conversation_at), (&b"only"[..], 0));
    assert_eq!(
        scan(br#"{"messages":[{"content":"x"}]}"#, 100).conversation_at,
        0
    );
    // The bound holds for the whole, the system prompt first.
    let s = scan(
        br#"{"messages":[{"content":"0123456789"}],"system":"abcdef"}"#,
        8,
    );
    assert_eq!(s.prompt, b"abcdef\x1e0");
    // A body cut inside the system prompt keeps what was seen of it, first.
    let s = scan(br#"{"messages":[{"content":"hi"}],"system":"abcdef"#, 100);
    assert_eq!(s.prompt, b"abcdef\x1ehi");
}

#[test]
fn scans_responses_api_input_items() {
    let s = scan(
        br#"{"input":[{"role":"user","content":[{"type":"input_text","text":"fix it"}]},
                {"type":"function_call","call_id":"c","name":"f","arguments":"{}"},
                {"type":"function_call_output","call_id":"c","output":"done"},
                {"role":"user","content":"thanks"}],"instructions":"sys","model":"r","stream":true}"#,
        100,
    );
    assert_eq!(s.prompt, b"sys\x1efix it\x1edone\x1ethanks");
    assert_eq!((s.model.as_deref(), s.stream), (Some("r"), Some(true)));
    assert_eq!(classify("POST", "/v1/responses"), CallKind::Generate);
    assert_eq!((s.store, s.previous_response_id), (None, None));
}

#[test]
fn reads_the_stored_response_a_turn_continues() {
    let s = scan(
        br#"{"input":"and then?","model":"r","previous_response_id":"resp_1a","store":false,
                "metadata":{"previous_response_id":"resp_nested","store":true}}"#,
        100,
    );
    assert_eq!(s.previous_response_id.as_deref(), Some("resp_1a"));
    assert_eq!((s.store, s.background), (Some(false), None));
    assert_eq!(scan(br#"{"background":true}"#, 10).background, Some(true));
    // Retrieval and cancel by id hold no prefill.
    assert_eq!(classify("GET", "/v1/responses/resp_1a"), CallKind::Passive);
    assert_eq!(
        classify("POST", "/v1/responses/resp_1a/cancel"),
        CallKind::Passive
    );
}

#[test]
fn reads_the_answer_length_a_request_allows() {
    let max = |b: &[u8]| scan(b, 100).max_tokens;
    assert_eq!(
        max(br#"{"messages":[],"max_tokens":160,"stream":true}"#),
        Some(160)
    );
    assert_eq!(max(br#"{"max_completion_tokens": 32000}"#), Some(32000));
    assert_eq!(max(br#"{"input":"hi","max_output_tokens":5}"#), Some(5));
    // Nested, absent, not a whole number, or cut by the prefix end: unknown.
    assert_eq!(max(br#"{"tool":{"max_tokens":9}}"#), None);
    assert_eq!(max(br#"{"max_tokens":null}"#), None);
    assert_eq!(max(br#"{"max_tokens":1.5}"#), None);
    assert_eq!(max(br#"{"max_tokens":12"#), None);
}

#[test]
fn reads_the_prompt_cache_key_wherever_it_sits_at_the_top() {
    let last = scan(
        br#"{"messages":[{"role":"user","content":"hi","prompt_cache_key":"nested"}],
                "metadata":{"prompt_cache_key":"meta"},"model":"m","prompt_cache_key":"thread-\u0031"}"#,
        100,
    );
    assert_eq!(last.prompt_cache_key.as_deref(), Some("thread-1"));
    let first = scan(br#"{"prompt_cache_key":"k","input":"hi"}"#, 100);
    assert_eq!(first.prompt_cache_key.as_deref(), Some("k"));
    assert_eq!(
        scan(br#"{"prompt_cache_key":7}"#, 10).prompt_cache_key,
        None
    );
}

#[test]
fn counts_inline_attachments_apart_from_the_prompt() {
    let img = "iVBORw0KGgo".repeat(100);
    let chat = format!(
        r#"{{"messages":[{{"role":"user","content":[{{"type":"text","text":"what is this"}},
                {{"type":"image_url","image_url":{{"url":"data:image/png;base64,{img}"}}}}]}}],"model":"v"}}"#
    );
    let s = scan(chat.as_bytes(), 1 << 20);
    let url_len = "data:image/png;base64,".len() + img.len() + 2;
    assert_eq!((s.media_bytes, s.media_items), (url_len as u64, 1));
    assert_eq!(s.prompt, b"what is this");
    // Anthropic: base64 `source.data`, also inside a tool result; a URL source is no attachment.
    let anthropic = format!(
        r#"{{"messages":[{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"t","content":[
                {{"type":"image","source":{{"type":"base64","media_type":"image/png","data":"{img}"}}}}]}},
                {{"type":"image","source":{{"type":"url","url":"https://x/y.png"}}}}]}}],"model":"c"}}"#
    );
    let s = scan(anthropic.as_bytes(), 1 << 20);
    assert_eq!((s.media_bytes, s.media_items), (img.len() as u64 + 2, 1));
    // A tool call's arguments that happen to hold `source.data` are no attachment.
    let tool_input = format!(
        r#"{{"messages":[{{"role":"assistant","content":[{{"type":"tool_use","id":"t","name":"f",
                "input":{{"source":{{"data":"{img}"}}}}}}]}}],"model":"c"}}"#
    );
    assert_eq!(scan(tool_input.as_bytes(), 1 << 20).media_items, 0);
    // Responses API input_image; a body cut inside the attachment counts what arrived.
    let responses = format!(
        r#"{{"input":[{{"role":"user","content":[{{"type":"input_image","image_url":"data:image/jpeg;base64,{img}"}}]}}]}}"#
    );
    let s = scan(responses.as_bytes(), 1 << 20);
    assert_eq!(s.media_items, 1);
    let cut = scan(&responses.as_bytes()[..responses.len() / 2], 1 << 20);
    assert_eq!(cut.media_items, 1);
    assert!(cut.media_bytes > 400, "{}", cut.media_bytes);
    // Text that merely mentions a data URL later in the string is prompt text.
    let s = scan(
        br#"{"prompt":"see data:image/png;base64,AAAA","model":"x"}"#,
        100,
    );
    assert_eq!(s.media_items, 0);
}

#[test]
fn tolerates_truncation_everywhere() {
    let full = br#"{"model":"llama","messages":[{"role":"user","content":"0123456789abcdef"}],"stream":false}"#;
    for cut in 0..full.len() {
        let s = scan(&full[..cut], 1 << 20);
        assert!(!s.complete || cut == full.len());
        if cut > 17 {
            assert_eq!(s.model.as_deref(), Some("llama"), "cut {cut}");
        }
    }
    let s = scan(&full[..60], 1 << 20);
    assert!(s.prompt.is_empty() || b"0123456789abcdef".starts_with(&s.prompt));
    // A system prompt after the conversation, cut anywhere, with a bound that cuts too.
    let late_system = br#"{"input":[{"role":"user","content":[{"type":"input_text","text":"abcdef"}]}],"instructions":"sys prompt","model":"r"}"#;
    for cut in 0..=late_system.len() {
        for max in [4, 12, 1 << 20] {
            let s = scan(&late_system[..cut], max);
            assert!(s.prompt.len() <= max, "cut {cut}, max {max}");
            assert!(s.conversation_at <= s.prompt.len(), "cut {cut}, max {max}");
            if s.conversation_at > 0 {
                assert_eq!(
                    s.prompt[s.conversation_at - 1],
                    0x1e,
                    "cut {cut}, max {max}"
                );
            }
        }
    }
}

#[test]
fn garbage_and_deep_nesting_do_not_panic() {
    for g in [
        &b""[..],
        b"null",
        b"{",
        b"{\"model\":",
        b"[[[[",
        b"{\"a\":}",
        b"\xff\xfe{\"model\":1}",
    ] {
        let _ = scan(g, 10);
    }
    let deep = format!("{{\"messages\":{}", "[".repeat(10_000));
    let s = scan(deep.as_bytes(), 10);
    assert!(!s.complete);
}

#[test]
fn prompt_is_bounded() {
    let s = scan(br#"{"prompt":"aaaaaaaaaaaaaaaaaaaa"}"#, 8);
    assert_eq!(s.prompt.len(), 8);
}

#[test]
fn escapes_anywhere_in_a_string() {
    // An escaped quote and backslash at offsets 10 to 19 of a value, whole and cut at every byte.
    for pad in 10..20 {
        let name = format!("{}\\\"x\\\\y", "a".repeat(pad));
        let body = format!(r#"{{"model":"{name}","prompt":"p"}}"#);
        let s = scan(body.as_bytes(), 1 << 20);
        assert_eq!(
            s.model,
            Some(format!("{}\"x\\y", "a".repeat(pad))),
            "pad {pad}"
        );
        assert_eq!(s.prompt, b"p", "pad {pad}");
        assert!(s.complete);
        for cut in 0..body.len() {
            let s = scan(&body.as_bytes()[..cut], 1 << 20);
            assert!(!s.complete, "pad {pad} cut {cut}");
            assert!(
                s.model.is_none() || cut > 9 + name.len(),
                "pad {pad} cut {cut}"
            );
        }
    }
}
