//! Parsing a generation body in vLLM's order, with the Responses API's store checks, off the runtime when big.

use std::sync::Arc;

use serde_json::Value;

use crate::engine::{Engine, BIG_BODY};
use crate::store::{ResponseStore, Turn};
use crate::tokenize::{self, ApiKind, BadRequest, GenRequest, StoreFields};

/// A generation request as parsed, with what the Responses API store needs of it.
pub(super) struct Parsed {
    pub gen: GenRequest,
    /// `store` here is whether to store: false without `responses_store` (vLLM then ignores the field).
    pub fields: StoreFields,
    /// The stored conversation its `previous_response_id` continues.
    pub parent: Option<Arc<Turn>>,
}

/// Why a generation request is answered at once instead of being parsed into one to schedule.
pub(super) enum Refused {
    /// A malformed request: 400 in the route's own error shape.
    Bad(BadRequest),
    /// vLLM's `invalid_request_error` of the Responses API store: status, message and the `param` it names.
    Store(u16, String, &'static str),
}

const BACKGROUND_NEEDS_STORE: &str =
    "This vLLM engine does not support `store=True` and therefore does not \
    support the background mode. To enable these features, set the environment variable \
    `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.";

/// vLLM's message for an id its response store does not hold (retrieve, cancel, `previous_response_id`).
pub(super) fn unknown_response(id: &str) -> String {
    format!("Response with id '{id}' not found.")
}

/// Parses a body in vLLM's order: fields, the store checks, the `previous_response_id` look-up, then the prompt
/// (a continued response's conversation first, as if the client had resent it).
fn parse_sync(
    responses: &ResponseStore,
    store_on: bool,
    kind: ApiKind,
    body: &[u8],
    bt: usize,
) -> Result<Parsed, Refused> {
    let v = tokenize::parse_body(body).map_err(Refused::Bad)?;
    if kind != ApiKind::Responses {
        return Ok(Parsed {
            gen: tokenize::gen_request(kind, &v, bt, &[]).map_err(Refused::Bad)?,
            fields: StoreFields::default(),
            parent: None,
        });
    }
    let mut fields = tokenize::store_fields(&v).map_err(Refused::Bad)?;
    if fields.background && fields.store && !store_on {
        return Err(Refused::Store(
            400,
            BACKGROUND_NEEDS_STORE.into(),
            "background",
        ));
    }
    fields.store &= store_on;
    if fields.background {
        // vLLM runs `store: false` in the background too, but never completes the object it keeps: refused here.
        let why = if !fields.store {
            Some(("background mode requires `store` to be true.", "store"))
        } else if v.get("stream") == Some(&Value::Bool(true)) {
            Some((
                "background streaming is not supported by engine-sim.",
                "stream",
            ))
        } else {
            None
        };
        if let Some((msg, param)) = why {
            return Err(Refused::Store(400, msg.into(), param));
        }
    }
    let parent = match &fields.previous_response_id {
        None => None,
        Some(id) => Some(
            responses
                .turn(id)
                .ok_or_else(|| Refused::Store(404, unknown_response(id), "response_id"))?,
        ),
    };
    let history = parent
        .as_deref()
        .map(Turn::conversation)
        .unwrap_or_default();
    let gen = tokenize::gen_request(kind, &v, bt, &history).map_err(Refused::Bad)?;
    Ok(Parsed {
        gen,
        fields,
        parent,
    })
}

pub(super) async fn parse(eng: &Engine, kind: ApiKind, body: Vec<u8>) -> Result<Parsed, Refused> {
    let bt = eng.cfg.block_tokens;
    let store_on = eng.cfg.responses_store;
    // A continued response re-tokenises its whole conversation, which a small body does not announce.
    if body.len() > BIG_BODY || (store_on && kind == ApiKind::Responses) {
        let responses = eng.responses.clone();
        tokio::task::spawn_blocking(move || parse_sync(&responses, store_on, kind, &body, bt))
            .await
            .unwrap_or_else(|_| Err(Refused::Bad(BadRequest("parser failed".into()))))
    } else {
        parse_sync(&eng.responses, store_on, kind, &body, bt)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A Responses API body parsed with 16-token blocks.
    fn responses(store: &ResponseStore, store_on: bool, v: &Value) -> Result<Parsed, Refused> {
        parse_sync(
            store,
            store_on,
            ApiKind::Responses,
            v.to_string().as_bytes(),
            16,
        )
    }
    /// The status, message and param of a store refusal; panics on anything else.
    fn store_refusal(r: Result<Parsed, Refused>) -> (u16, String, &'static str) {
        match r {
            Err(Refused::Store(status, msg, param)) => (status, msg, param),
            Err(Refused::Bad(b)) => panic!("a bad request: {}", b.0),
            Ok(_) => panic!("parsed"),
        }
    }
    fn parsed(r: Result<Parsed, Refused>) -> Parsed {
        match r {
            Ok(p) => p,
            Err(Refused::Bad(b)) => panic!("a bad request: {}", b.0),
            Err(Refused::Store(status, msg, _)) => panic!("{status}: {msg}"),
        }
    }
    #[test]
    fn background_needs_the_store_and_neither_store_false_nor_a_stream() {
        let store = ResponseStore::new(8);
        let bg = json!({"input": "x", "background": true});
        assert_eq!(
            store_refusal(responses(&store, false, &bg)),
            (400, BACKGROUND_NEEDS_STORE.to_string(), "background")
        );
        let unstored = json!({"input": "x", "background": true, "store": false});
        assert_eq!(store_refusal(responses(&store, true, &unstored)).2, "store");
        let streamed = json!({"input": "x", "background": true, "stream": true});
        assert_eq!(
            store_refusal(responses(&store, true, &streamed)).2,
            "stream"
        );
        let p = parsed(responses(&store, true, &bg));
        assert!(p.fields.background && p.fields.store);
    }
    #[test]
    fn store_is_ignored_without_the_store_and_bad_fields_are_400s() {
        let store = ResponseStore::new(8);
        let p = parsed(responses(&store, false, &json!({"input": "x"})));
        assert!(!p.fields.store);
        assert!(p.parent.is_none());
        let p = parsed(responses(&store, true, &json!({"input": "x"})));
        assert!(p.fields.store);
        assert!(matches!(
            responses(&store, true, &json!({"input": "x", "store": "yes"})),
            Err(Refused::Bad(_))
        ));
    }
    #[test]
    fn a_previous_response_is_looked_up_and_its_conversation_comes_first() {
        let store = ResponseStore::new(8);
        let next = json!({"input": "more", "previous_response_id": "resp_1"});
        assert_eq!(
            store_refusal(responses(&store, true, &next)),
            (404, unknown_response("resp_1"), "response_id")
        );
        let first = parsed(responses(&store, true, &json!({"input": "hi there"})));
        let turn = Turn::new(None, first.gen.input).answered(" The engine");
        store.put("resp_1".into(), json!({}), turn);
        let alone = parsed(responses(&store, true, &json!({"input": "more"})));
        let continued = parsed(responses(&store, true, &next));
        assert!(continued.parent.is_some());
        assert!(
            continued.gen.prompt.len > alone.gen.prompt.len,
            "{} vs {}",
            continued.gen.prompt.len,
            alone.gen.prompt.len
        );
    }
    #[test]
    fn only_responses_bodies_reach_the_store_checks() {
        let store = ResponseStore::new(8);
        let body = br#"{"messages": [{"role": "user", "content": "hi"}], "background": true}"#;
        let Ok(p) = parse_sync(&store, false, ApiKind::Chat, body, 16) else {
            panic!("a chat body with `background` is refused");
        };
        assert_eq!(p.fields, StoreFields::default());
        assert!(p.parent.is_none());
        let body = br#"{"input": "x", "background": true}"#;
        assert!(matches!(
            parse_sync(&store, false, ApiKind::Responses, body, 16),
            Err(Refused::Store(400, _, "background"))
        ));
        for bad in [&b"{not json"[..], b"[1, 2]"] {
            assert!(matches!(
                parse_sync(&store, false, ApiKind::Completion, bad, 16),
                Err(Refused::Bad(_))
            ));
        }
    }
}
