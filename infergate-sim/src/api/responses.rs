//! OpenAI's Responses API as vLLM serves it: stream events and objects, background runs, retrieve and cancel.

use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use super::parse::unknown_response;
use super::reply::Reply;
use super::respond::{respond_error, respond_invalid, respond_json, respond_no_route};
use crate::engine::Engine;
use crate::http::{ConnIo, InBuf, Request};
use crate::scheduler::TokenEvent;
use crate::store::{Cancel, ResponseStore};
use crate::tokenize::output_token;

/// Follows a background response's generation and keeps its stored object current: `in_progress` from the first
/// token (its prefill done), then the final object. A cancel, or the response leaving the store, ends this task;
/// dropping `rx` then aborts the request in the scheduler, as vLLM cancels its background task.
pub(super) async fn run_background(
    responses: Arc<ResponseStore>,
    reply: Reply,
    mut rx: mpsc::UnboundedReceiver<TokenEvent>,
    mut cancel: oneshot::Receiver<()>,
) {
    loop {
        let ev = tokio::select! {
            _ = &mut cancel => return,
            ev = rx.recv() => ev,
        };
        let Some(ev) = ev else {
            // The scheduler stopped (engine shutdown).
            responses.advance(&reply.id, "failed");
            return;
        };
        if ev.finished {
            let done = reply.full_body(ev.cached_tokens);
            responses.finish(&reply.id, done, &reply.output_text());
            return;
        }
        if ev.index == 0 {
            responses.advance(&reply.id, "in_progress");
        }
    }
}

/// The id a path under `/v1/responses/` names, and whether it asks to cancel; None for any other shape.
fn stored_path(path: &str) -> Option<(&str, bool)> {
    let rest = path.strip_prefix("/v1/responses/").unwrap_or_default();
    let (id, cancel) = match rest.strip_suffix("/cancel") {
        Some(id) => (id, true),
        None => (rest, false),
    };
    (!id.is_empty() && !id.contains('/')).then_some((id, cancel))
}

/// vLLM's routes of its response store: `GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel` (a
/// `?stream=true` retrieval of a background stream is not simulated: the query is ignored). Without
/// `responses_store` the store is empty, so every id is unknown, as on vLLM.
pub(super) async fn stored_response(
    eng: &Engine,
    req: &Request,
    io: &mut ConnIo,
    rb: &InBuf,
) -> bool {
    let Some((id, cancel)) = stored_path(&req.path) else {
        return respond_no_route(io, rb, req).await;
    };
    let get = req.method == "GET" || req.method == "HEAD";
    match (cancel, get, req.method == "POST") {
        (false, true, _) => match eng.responses.object(id) {
            Some(v) => respond_json(io, rb, req, 200, &v).await,
            None => respond_invalid(io, rb, req, 404, &unknown_response(id), "response_id").await,
        },
        (true, _, true) => match eng.responses.cancel(id) {
            Cancel::Done(v) => respond_json(io, rb, req, 200, &v).await,
            Cancel::Unknown => {
                respond_invalid(io, rb, req, 404, &unknown_response(id), "response_id").await
            }
            Cancel::Synchronous => {
                let msg = "Cannot cancel a synchronous response.";
                respond_invalid(io, rb, req, 400, msg, "response_id").await
            }
        },
        _ => respond_error(io, rb, req, None, 405, "Method Not Allowed").await,
    }
}

impl Reply {
    fn responses_usage(&self, output: usize, cached: usize) -> Value {
        json!({"input_tokens": self.prompt_tokens, "input_tokens_details": {"cached_tokens": cached},
               "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
               "total_tokens": self.prompt_tokens + output})
    }

    /// The Responses API's response object: in progress (no output yet) or done (`completed` when the answer
    /// ended itself; stopped at max_output_tokens, which vLLM reports as `incomplete`).
    fn response_object(&self, done: Option<(&str, Value)>) -> Value {
        let (status, output, incomplete, usage) = match done {
            None => ("in_progress", json!([]), Value::Null, Value::Null),
            Some((text, usage)) if self.ended_itself => (
                "completed",
                json!([self.response_message(text, "completed")]),
                Value::Null,
                usage,
            ),
            Some((text, usage)) => (
                "incomplete",
                json!([self.response_message(text, "completed")]),
                json!({"reason": "max_output_tokens"}),
                usage,
            ),
        };
        json!({"id": self.id, "object": "response", "created_at": self.created, "model": self.model,
               "status": status, "output": output, "incomplete_details": incomplete, "error": null,
               "parallel_tool_calls": true, "tool_choice": "auto", "tools": [], "usage": usage,
               "background": self.background})
    }

    /// A background response as first answered and stored: `queued`, no output yet.
    pub(super) fn queued_object(&self) -> Value {
        let mut r = self.response_object(None);
        r["status"] = json!("queued");
        r
    }

    fn response_message(&self, text: &str, status: &str) -> Value {
        let content = if status == "in_progress" {
            json!([])
        } else {
            json!([{"type": "output_text", "text": text, "annotations": [], "logprobs": []}])
        };
        json!({"type": "message", "id": self.message_id(), "status": status, "role": "assistant",
               "content": content})
    }

    fn message_id(&self) -> String {
        format!("msg_{}", self.id.trim_start_matches("resp_"))
    }

    /// A Responses API stream event; `seq` is its sequence number.
    fn response_event(kind: &str, seq: usize, mut v: Value) -> Vec<u8> {
        v["type"] = json!(kind);
        v["sequence_number"] = json!(seq);
        Self::event(kind, &v)
    }

    /// `response.created` and `response.in_progress`, both with the response object still without output.
    pub(super) fn responses_preamble_events(&self) -> Vec<Vec<u8>> {
        let r = self.response_object(None);
        vec![
            Self::response_event("response.created", 0, json!({"response": r})),
            Self::response_event("response.in_progress", 1, json!({"response": r})),
        ]
    }

    /// The output item and its content part open before the first token, then one text delta per token.
    pub(super) fn responses_token_events(&self, ev: &TokenEvent) -> Vec<Vec<u8>> {
        let tok = output_token(ev.index);
        let mut out = Vec::new();
        let item = self.message_id();
        if ev.index == 0 {
            out.push(Self::response_event(
                "response.output_item.added",
                2,
                json!({"output_index": 0, "item": self.response_message("", "in_progress")}),
            ));
            out.push(Self::response_event(
                "response.content_part.added",
                3,
                json!({"item_id": item, "output_index": 0, "content_index": 0,
                       "part": {"type": "output_text", "text": "", "annotations": []}}),
            ));
        }
        out.push(Self::response_event(
            "response.output_text.delta",
            4 + ev.index,
            json!({"item_id": item, "output_index": 0, "content_index": 0, "delta": tok, "logprobs": []}),
        ));
        out
    }

    /// The text, content part and output item closed, then `response.completed` with the final object.
    pub(super) fn responses_tail_events(&self, cached: usize) -> Vec<Vec<u8>> {
        let text = self.output_text();
        let (item, seq) = (self.message_id(), 4 + self.max_tokens);
        let part = json!({"type": "output_text", "text": text, "annotations": []});
        let done =
            self.response_object(Some((&text, self.responses_usage(self.max_tokens, cached))));
        vec![
            Self::response_event(
                "response.output_text.done",
                seq,
                json!({"item_id": item, "output_index": 0, "content_index": 0, "text": text,
                       "logprobs": []}),
            ),
            Self::response_event(
                "response.content_part.done",
                seq + 1,
                json!({"item_id": item, "output_index": 0, "content_index": 0, "part": part}),
            ),
            Self::response_event(
                "response.output_item.done",
                seq + 2,
                json!({"output_index": 0, "item": self.response_message(&text, "completed")}),
            ),
            Self::response_event("response.completed", seq + 3, json!({"response": done})),
        ]
    }

    pub(super) fn responses_full_body(&self, cached: usize) -> Value {
        let text = self.output_text();
        self.response_object(Some((&text, self.responses_usage(self.max_tokens, cached))))
    }
}
#[cfg(test)]
mod tests {
    use super::super::reply::testing::{names, reply, sse, token};
    use super::*;
    use crate::tokenize::ApiKind;

    #[test]
    fn stored_paths_name_one_id_and_maybe_a_cancel() {
        assert_eq!(stored_path("/v1/responses/resp_1"), Some(("resp_1", false)));
        assert_eq!(
            stored_path("/v1/responses/resp_1/cancel"),
            Some(("resp_1", true))
        );
        for other in [
            "/v1/responses/",
            "/v1/responses//cancel",
            "/v1/responses/resp_1/input_items",
            "/v1/responses/resp_1/cancel/now",
        ] {
            assert_eq!(stored_path(other), None, "{other}");
        }
    }

    #[test]
    fn the_stream_is_numbered_from_the_announcement_to_completed() {
        let r = reply(ApiKind::Responses, 2, false);
        let mut events = r.responses_preamble_events();
        events.extend(r.responses_token_events(&token(0, false)));
        events.extend(r.responses_token_events(&token(1, true)));
        events.extend(r.responses_tail_events(4));
        assert_eq!(
            names(&events),
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed"
            ]
        );
        for (i, e) in events.iter().enumerate() {
            let (name, v) = sse(e);
            assert_eq!(v["sequence_number"], i, "{name:?}");
            assert_eq!(Some(v["type"].as_str().unwrap().to_string()), name);
        }
        let (_, created) = sse(&events[0]);
        assert_eq!(created["response"]["status"], "in_progress");
        assert_eq!(created["response"]["output"], json!([]));
        let (_, added) = sse(&events[2]);
        assert_eq!(added["item"]["id"], "msg_0001");
        assert_eq!(added["item"]["content"], json!([]));
        let (_, done) = sse(&events[6]);
        assert_eq!(done["text"], " The engine");
    }

    #[test]
    fn the_final_object_is_completed_or_incomplete_and_a_background_one_starts_queued() {
        let r = reply(ApiKind::Responses, 2, false);
        let v = r.full_body(4);
        assert_eq!(
            (&v["status"], &v["incomplete_details"]),
            (
                &json!("incomplete"),
                &json!({"reason": "max_output_tokens"})
            )
        );
        assert_eq!(
            v["usage"],
            json!({"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 2,
                   "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 12})
        );
        assert_eq!(v["output"][0]["content"][0]["text"], " The engine");
        let v = reply(ApiKind::Responses, 2, true).full_body(0);
        assert_eq!(
            (&v["status"], &v["incomplete_details"]),
            (&json!("completed"), &Value::Null)
        );
        let mut r = reply(ApiKind::Responses, 2, false);
        r.background = true;
        let q = r.queued_object();
        assert_eq!(
            (&q["status"], &q["output"], &q["usage"], &q["background"]),
            (&json!("queued"), &json!([]), &Value::Null, &json!(true))
        );
    }
}
