//! A tiny model directory for tests: a word-level tokenizer (whitespace pre-tokenizer, BOS added by its
//! post-processor) and a chat template in tokenizer_config.json.

use std::path::PathBuf;

/// The ids of the fixture's vocabulary; any other word is `[UNK]` (0).
pub(crate) const VOCAB: &[(&str, u32)] = &[
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

pub(crate) const TEMPLATE: &str = "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] | trim }} {{ eos_token }} {% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";

/// tokenizer.json of the fixture.
pub(crate) fn tokenizer_json() -> String {
    let added: Vec<String> = VOCAB[..6]
        .iter()
        .map(|(t, id)| {
            format!(
                r#"{{"id":{id},"content":"{t}","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}}"#
            )
        })
        .collect();
    let vocab: Vec<String> = VOCAB
        .iter()
        .map(|(t, id)| format!(r#""{t}":{id}"#))
        .collect();
    format!(
        r#"{{"version":"1.0","truncation":null,"padding":null,"added_tokens":[{}],"normalizer":null,
"pre_tokenizer":{{"type":"Whitespace"}},
"post_processor":{{"type":"TemplateProcessing","single":[{{"SpecialToken":{{"id":"<s>","type_id":0}}}},{{"Sequence":{{"id":"A","type_id":0}}}}],
"pair":[{{"Sequence":{{"id":"A","type_id":0}}}},{{"Sequence":{{"id":"B","type_id":1}}}}],
"special_tokens":{{"<s>":{{"id":"<s>","ids":[1],"tokens":["<s>"]}}}}}},
"decoder":null,"model":{{"type":"WordLevel","vocab":{{{}}},"unk_token":"[UNK]"}}}}"#,
        added.join(","),
        vocab.join(",")
    )
}

/// A fresh model directory named after `name` under the temp dir, with the fixture's files.
pub(crate) fn model_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "infergate-tokens-{name}-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json()).expect("write");
    let config = serde_json::json!({
        "bos_token": "<s>",
        "eos_token": {"content": "</s>", "special": true},
        "chat_template": TEMPLATE,
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).expect("write");
    dir
}
