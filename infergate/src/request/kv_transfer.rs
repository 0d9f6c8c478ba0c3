//! The two legs of a disaggregated request in vLLM's `kv_transfer_params` protocol (NixlConnector): the body the
//! prefill engine gets, the params its answer carries, and the body the decode engine gets.
//!
//! The prefill leg is the client's request asking one token, not streamed, with `kv_transfer_params:
//! {"do_remote_decode": true, ...}` (vLLM's own proxies send the same: `tests/v1/kv_connector/nixl_integration/
//! toy_proxy_server.py`); the decode leg is the client's request as sent, plus the params of the prefill's answer.
//! What the protocol cannot carry is refused with a clear 400 before any engine sees the request.

use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::errors::ApiError;

/// The generation APIs a disaggregated pool serves: all four carry `kv_transfer_params` in vLLM 0.32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LegApi {
    Chat,
    Completions,
    Responses,
    Messages,
}

impl LegApi {
    /// The API of a normalised request path; None for a path with no generation to split.
    pub fn of_path(path: &str) -> Option<LegApi> {
        match path {
            "/v1/chat/completions" => Some(LegApi::Chat),
            "/v1/completions" => Some(LegApi::Completions),
            "/v1/responses" => Some(LegApi::Responses),
            "/v1/messages" => Some(LegApi::Messages),
            _ => None,
        }
    }
}

/// A request split into its two legs.
#[derive(Debug, Clone)]
pub struct Legs {
    /// The prefill leg's body.
    pub prefill: Bytes,
    /// The client's request, to which the decode leg adds the prefill's params.
    client: Map<String, Value>,
}

fn refuse(message: impl Into<String>) -> ApiError {
    ApiError::new(
        400,
        "invalid_request_error",
        "unsupported_by_disaggregation",
        message,
    )
}

impl Legs {
    /// Split the client's request on `api`; a 400 for what the protocol cannot carry.
    pub fn split(api: LegApi, body: &[u8]) -> Result<Legs, ApiError> {
        let client = match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(m)) => m,
            Ok(_) => {
                return Err(ApiError::new(
                    400,
                    "invalid_request_error",
                    "invalid_body",
                    "the request body must be a JSON object",
                ))
            }
            Err(e) => {
                return Err(ApiError::new(
                    400,
                    "invalid_request_error",
                    "invalid_body",
                    format!("the request body is not valid JSON: {e}"),
                ))
            }
        };
        if client
            .get("kv_transfer_params")
            .is_some_and(|v| !v.is_null())
        {
            // The decode engine would pull from wherever the params say: only the router sets them.
            return Err(refuse(
                "`kv_transfer_params` is set by the router in a disaggregated pool; leave it out",
            ));
        }
        if client
            .get("n")
            .and_then(Value::as_u64)
            .is_some_and(|n| n > 1)
        {
            return Err(refuse(
                "`n` above 1 is not served by a disaggregated pool: one prefill's KV cache goes to one decode; \
                 send n requests",
            ));
        }
        if api == LegApi::Responses
            && client
                .get("previous_response_id")
                .is_some_and(|v| !v.is_null())
        {
            return Err(refuse(
                "`previous_response_id` is not served by a disaggregated pool: the prefill engine does not hold \
                 the stored conversation; send the whole conversation in `input`",
            ));
        }
        if api == LegApi::Completions {
            if let Some(Value::Array(items)) = client.get("prompt") {
                // One prompt as token ids is a list of numbers; several prompts are a list of lists or strings.
                let several = items.len() > 1 && items.iter().all(|i| !i.is_number());
                if several {
                    return Err(refuse(
                        "a list of several prompts is not served by a disaggregated pool: send one prompt per \
                         request",
                    ));
                }
            }
        }
        let mut p = client.clone();
        p.insert(
            "kv_transfer_params".into(),
            json!({
                "do_remote_decode": true,
                "do_remote_prefill": false,
                "remote_engine_id": null,
                "remote_block_ids": null,
                "remote_host": null,
                "remote_port": null,
            }),
        );
        p.insert("stream".into(), Value::Bool(false));
        for k in ["stream_options", "min_tokens", "min_completion_tokens", "n"] {
            p.remove(k);
        }
        let one = || Value::from(1);
        match api {
            LegApi::Chat => {
                p.insert("max_tokens".into(), one());
                if p.contains_key("max_completion_tokens") {
                    p.insert("max_completion_tokens".into(), one());
                }
            }
            LegApi::Completions | LegApi::Messages => {
                p.insert("max_tokens".into(), one());
            }
            LegApi::Responses => {
                p.insert("max_output_tokens".into(), one());
                // The prefill's answer is the router's, not a response anyone may continue or fetch.
                p.insert("store".into(), Value::Bool(false));
                p.remove("background");
            }
        }
        Ok(Legs {
            prefill: Bytes::from(Value::Object(p).to_string()),
            client,
        })
    }

    /// The decode leg's body: the client's request with the prefill's params.
    pub fn decode(&self, params: &Value) -> Bytes {
        let mut d = self.client.clone();
        d.insert("kv_transfer_params".into(), params.clone());
        Bytes::from(Value::Object(d).to_string())
    }
}

/// The `kv_transfer_params` of a prefill engine's answer; Err names what is wrong (the answer reached no client).
pub fn params_of(answer: &[u8]) -> Result<Value, &'static str> {
    let v: Value =
        serde_json::from_slice(answer).map_err(|_| "the prefill engine's answer is not JSON")?;
    match v.get("kv_transfer_params") {
        Some(p @ Value::Object(m)) if !m.is_empty() => Ok(p.clone()),
        _ => Err(
            "the prefill engine's answer carries no kv_transfer_params: is it started with a KV connector \
             (--kv-transfer-config '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"}')?",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(b: &Bytes) -> Value {
        serde_json::from_slice(b).unwrap()
    }

    #[test]
    fn the_prefill_leg_asks_one_token_unstreamed_with_do_remote_decode() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,
            "stream_options":{"include_usage":true},"max_completion_tokens":300,"min_tokens":5,"temperature":0.5}"#;
        let legs = Legs::split(LegApi::Chat, body).unwrap();
        let p = obj(&legs.prefill);
        assert_eq!(p["stream"], false);
        assert_eq!(p["max_tokens"], 1);
        assert_eq!(p["max_completion_tokens"], 1);
        assert!(p.get("stream_options").is_none() && p.get("min_tokens").is_none());
        assert_eq!(p["kv_transfer_params"]["do_remote_decode"], true);
        assert_eq!(p["kv_transfer_params"]["do_remote_prefill"], false);
        assert_eq!(p["temperature"], 0.5);
        assert_eq!(p["messages"][0]["content"], "hi");
        // The decode leg: the client's request as sent, plus the prefill's params.
        let params = json!({"do_remote_prefill": true, "remote_engine_id": "e", "remote_block_ids": [[1, 2]]});
        let d = obj(&legs.decode(&params));
        let mut expected: Value = serde_json::from_slice(body).unwrap();
        expected["kv_transfer_params"] = params;
        assert_eq!(d, expected);
    }

    #[test]
    fn each_api_names_its_own_limit() {
        let p = obj(
            &Legs::split(LegApi::Completions, br#"{"prompt":"x","max_tokens":9}"#)
                .unwrap()
                .prefill,
        );
        assert_eq!(p["max_tokens"], 1);
        let p = obj(&Legs::split(
            LegApi::Messages,
            br#"{"messages":[],"max_tokens":9,"stream":true}"#,
        )
        .unwrap()
        .prefill);
        assert_eq!(
            (p["max_tokens"].clone(), p["stream"].clone()),
            (json!(1), json!(false))
        );
        let r = br#"{"input":"x","max_output_tokens":9,"background":true}"#;
        let p = obj(&Legs::split(LegApi::Responses, r).unwrap().prefill);
        assert_eq!(p["max_output_tokens"], 1);
        assert_eq!(p["store"], false);
        assert!(p.get("background").is_none());
        assert_eq!(LegApi::of_path("/v1/responses"), Some(LegApi::Responses));
        assert_eq!(LegApi::of_path("/v1/embeddings"), None);
    }

    #[test]
    fn what_the_protocol_cannot_carry_is_a_400() {
        let cases: [(LegApi, &[u8], &str); 7] = [
            (
                LegApi::Chat,
                br#"{"messages":[],"kv_transfer_params":{"do_remote_prefill":true}}"#,
                "set by the router",
            ),
            (LegApi::Chat, br#"{"messages":[],"n":2}"#, "`n` above 1"),
            (
                LegApi::Responses,
                br#"{"input":"x","previous_response_id":"resp_1"}"#,
                "previous_response_id",
            ),
            (
                LegApi::Completions,
                br#"{"prompt":["a","b"]}"#,
                "several prompts",
            ),
            (
                LegApi::Completions,
                br#"{"prompt":[[1,2],[3]]}"#,
                "several prompts",
            ),
            (LegApi::Chat, br#"[1]"#, "JSON object"),
            (LegApi::Chat, br#"{"messages":"#, "not valid JSON"),
        ];
        for (api, body, needle) in cases {
            let e = Legs::split(api, body).unwrap_err();
            assert_eq!(e.status, 400);
            assert!(
                e.message.contains(needle),
                "{}: {}",
                String::from_utf8_lossy(body),
                e.message
            );
        }
        // One prompt as token ids, n = 1 and null params are fine.
        assert!(Legs::split(
            LegApi::Completions,
            br#"{"prompt":[1,2,3],"n":1,"kv_transfer_params":null}"#
        )
        .is_ok());
    }

    #[test]
    fn the_params_come_from_the_answer() {
        let ok =
            br#"{"id":"x","kv_transfer_params":{"remote_engine_id":"e","remote_request_id":"r"}}"#;
        assert_eq!(params_of(ok).unwrap()["remote_request_id"], "r");
        for bad in [
            &br#"{"id":"x"}"#[..],
            br#"{"kv_transfer_params":null}"#,
            br#"{"kv_transfer_params":{}}"#,
        ] {
            assert!(params_of(bad)
                .unwrap_err()
                .contains("no kv_transfer_params"));
        }
        assert!(params_of(b"<html>").unwrap_err().contains("not JSON"));
    }
}
