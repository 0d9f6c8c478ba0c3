//! The HTTP routes of a simulated engine: vLLM's OpenAI-compatible surface (the Responses API included), Anthropic
//! messages, metrics and the `/sim/*` endpoints (stats for benchmarks, control for scripts).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use super::engine::{Engine, Refusal, BIG_BODY};
use super::errors::{anthropic_error_body, error_body, typed_error_body, vllm_error_body};
use super::http::{self, ConnIo, InBuf, Request};
use super::metrics;
use super::scheduler::{SchedRequest, TokenEvent};
use super::store::{Cancel, ResponseStore, Turn};
use super::tokenize::{self, output_token, ApiKind, BadRequest, GenRequest, StoreFields};

/// vLLM's length check before a request reaches the engine (`_validate_input` in its serving layer): the prompt
/// must leave room for at least one output token, and an explicit `max_tokens` must fit beside it. Returns the
/// error message and the `param` it names.
fn context_length_error(
    max_model_len: usize,
    prompt: usize,
    max_tokens: Option<usize>,
) -> Option<(String, &'static str)> {
    if prompt >= max_model_len {
        return Some((
            format!(
                "This model's maximum context length is {max_model_len} tokens. However, your request has \
                 {prompt} input tokens. Please reduce the length of the input messages."
            ),
            "input_tokens",
        ));
    }
    let m = max_tokens?;
    (prompt.saturating_add(m) > max_model_len).then(|| {
        (
            format!(
                "'max_tokens' or 'max_completion_tokens' is too large: {m}. This model's maximum context \
                 length is {max_model_len} tokens and your request has {prompt} input tokens \
                 ({m} > {max_model_len} - {prompt})."
            ),
            "max_tokens",
        )
    })
}

/// Writes a complete response with a Content-Length body; returns whether the connection stays open.
async fn respond(
    io: &mut ConnIo,
    rb: &InBuf,
    req: &Request,
    status: u16,
    ctype: &str,
    body: &[u8],
) -> bool {
    respond_with(io, rb, req, status, ctype, &[], body).await
}

/// [`respond`] with extra response headers.
async fn respond_with(
    io: &mut ConnIo,
    rb: &InBuf,
    req: &Request,
    status: u16,
    ctype: &str,
    extra_headers: &[(&str, &str)],
    body: &[u8],
) -> bool {
    let keep = req.keep_alive;
    let mut head = http::head(status, ctype, Some(body.len()), keep, req.http10);
    if !extra_headers.is_empty() {
        // Insert before the blank line that ends the head.
        head.truncate(head.len() - 2);
        for (name, value) in extra_headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
    }
    let mut out = head.into_bytes();
    if req.method != "HEAD" {
        out.extend_from_slice(body);
    }
    io.write(&out, keep && rb.is_empty()).await.is_ok() && keep
}

async fn respond_json(io: &mut ConnIo, rb: &InBuf, req: &Request, status: u16, v: &Value) -> bool {
    respond(
        io,
        rb,
        req,
        status,
        "application/json",
        &serde_json::to_vec(v).unwrap(),
    )
    .await
}

async fn respond_error(
    io: &mut ConnIo,
    rb: &InBuf,
    req: &Request,
    kind: Option<ApiKind>,
    status: u16,
    msg: &str,
) -> bool {
    respond(
        io,
        rb,
        req,
        status,
        "application/json",
        &error_body(kind, status, msg),
    )
    .await
}

/// vLLM's `invalid_request_error` answer of the Responses API store (unknown id, refused background, cancel).
async fn respond_invalid(
    io: &mut ConnIo,
    rb: &InBuf,
    req: &Request,
    status: u16,
    msg: &str,
    param: &str,
) -> bool {
    let body = typed_error_body(status, "invalid_request_error", msg, Some(param));
    respond(io, rb, req, status, "application/json", &body).await
}

/// vLLM's message for an id its response store does not hold (retrieve, cancel, `previous_response_id`).
fn unknown_response(id: &str) -> String {
    format!("Response with id '{id}' not found.")
}

async fn respond_no_route(io: &mut ConnIo, rb: &InBuf, req: &Request) -> bool {
    let msg = format!("Not Found: {} {}", req.method, req.path);
    respond_error(io, rb, req, None, 404, &msg).await
}

/// An error answer of a generation route: vLLM's body for the OpenAI routes, Anthropic's for `/v1/messages`.
/// 429 and 503 carry `Retry-After: 1`, so clients and routers may try again (or elsewhere) a second later.
async fn respond_gen_error(
    io: &mut ConnIo,
    rb: &InBuf,
    req: &Request,
    kind: ApiKind,
    status: u16,
    msg: &str,
    param: Option<&str>,
) -> bool {
    let body = match kind {
        ApiKind::Messages => anthropic_error_body(status, msg),
        ApiKind::Chat | ApiKind::Completion | ApiKind::Responses => {
            vllm_error_body(status, msg, param)
        }
    };
    let extra: &[(&str, &str)] = if matches!(status, 429 | 503) {
        &[("retry-after", "1")]
    } else {
        &[]
    };
    respond_with(io, rb, req, status, "application/json", extra, &body).await
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Serves one request; returns whether the connection stays open for the next one.
pub(crate) async fn handle(
    eng: &Arc<Engine>,
    req: Request,
    seq: u64,
    io: &mut ConnIo,
    rb: &mut InBuf,
) -> bool {
    let method = req.method.as_str();
    let get = method == "GET" || method == "HEAD";
    let post = method == "POST";
    match req.path.as_str() {
        "/health" if get => {
            let status = eng.control.health_status();
            respond(io, rb, &req, status, "", b"").await
        }
        "/v1/models" if get => {
            let m = &eng.cfg.model;
            let v = json!({"object": "list", "data": [{
                "id": m, "object": "model", "created": now_secs(), "owned_by": "engine-sim", "root": m,
                "parent": null, "max_model_len": eng.cfg.max_model_len, "permission": []
            }]});
            respond_json(io, rb, &req, 200, &v).await
        }
        "/version" if get => {
            respond_json(io, rb, &req, 200, &json!({"version": "engine-sim"})).await
        }
        "/metrics" if get => {
            let c = eng.sched.snapshot();
            let text = metrics::render(
                &eng.cfg,
                &c,
                eng.control.extra_running(),
                eng.control.extra_waiting(),
            );
            respond(
                io,
                rb,
                &req,
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                text.as_bytes(),
            )
            .await
        }
        "/sim/stats" if get => {
            let v = serde_json::to_value(eng.totals()).unwrap();
            respond_json(io, rb, &req, 200, &v).await
        }
        "/sim/requests" if get => {
            // The recorded requests, oldest first, as scripts see them (tests in-process use `requests()`).
            let v: Vec<Value> = eng
                .recorded
                .lock()
                .unwrap()
                .iter()
                .map(|r| {
                    json!({"method": r.method, "path": r.path, "headers": r.headers,
                           "body_len": r.body_len, "body_fnv64": format!("{:016x}", r.body_fnv64)})
                })
                .collect();
            respond_json(io, rb, &req, 200, &Value::Array(v)).await
        }
        "/sim/control" if get => respond_json(io, rb, &req, 200, &eng.control.to_json()).await,
        "/sim/control" if post => {
            let v: Value = match serde_json::from_slice(&req.body) {
                Ok(v) => v,
                Err(e) => {
                    return respond_error(
                        io,
                        rb,
                        &req,
                        None,
                        400,
                        &format!("invalid JSON body: {e}"),
                    )
                    .await
                }
            };
            if let Err(e) = eng.control.apply_json(&v) {
                return respond_error(io, rb, &req, None, 400, &e).await;
            }
            if let Some(ms) = v.get("refuse_connections_ms").and_then(Value::as_u64) {
                if let Err(e) = eng.control.refuse_connections(true) {
                    return respond_error(io, rb, &req, None, 500, &e.to_string()).await;
                }
                let control = eng.control.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    if let Err(e) = control.refuse_connections(false) {
                        log::error!(
                            "engine-sim: cannot listen again on {}: {e}",
                            control.net.addr
                        );
                    }
                });
            }
            respond_json(io, rb, &req, 200, &eng.control.to_json()).await
        }
        "/v1/messages/count_tokens" if post => {
            let v: Value = match serde_json::from_slice(&req.body) {
                Ok(v) => v,
                Err(e) => {
                    let msg = format!("invalid JSON body: {e}");
                    return respond_error(io, rb, &req, Some(ApiKind::Messages), 400, &msg).await;
                }
            };
            match tokenize::prompt_of(ApiKind::Messages, &v, eng.cfg.block_tokens, false) {
                Ok(p) => respond_json(io, rb, &req, 200, &json!({"input_tokens": p.len})).await,
                Err(BadRequest(m)) => {
                    respond_error(io, rb, &req, Some(ApiKind::Messages), 400, &m).await
                }
            }
        }
        "/tokenize" if post => {
            let v: Value = match serde_json::from_slice(&req.body) {
                Ok(v) => v,
                Err(e) => {
                    return respond_error(
                        io,
                        rb,
                        &req,
                        None,
                        400,
                        &format!("invalid JSON body: {e}"),
                    )
                    .await
                }
            };
            let kind = if v.get("messages").is_some() {
                ApiKind::Chat
            } else {
                ApiKind::Completion
            };
            match tokenize::prompt_of(kind, &v, eng.cfg.block_tokens, true) {
                Ok(p) => {
                    let body = json!({"count": p.len, "max_model_len": eng.cfg.max_model_len, "tokens": p.ids});
                    respond_json(io, rb, &req, 200, &body).await
                }
                Err(BadRequest(m)) => respond_error(io, rb, &req, None, 400, &m).await,
            }
        }
        "/v1/chat/completions" if post => generate(eng, ApiKind::Chat, req, seq, io, rb).await,
        "/v1/completions" if post => generate(eng, ApiKind::Completion, req, seq, io, rb).await,
        "/v1/messages" if post => generate(eng, ApiKind::Messages, req, seq, io, rb).await,
        "/v1/responses" if post => generate(eng, ApiKind::Responses, req, seq, io, rb).await,
        p if p.starts_with("/v1/responses/") => stored_response(eng, &req, io, rb).await,
        "/health"
        | "/v1/models"
        | "/version"
        | "/metrics"
        | "/sim/stats"
        | "/sim/requests"
        | "/sim/control"
        | "/tokenize"
        | "/v1/messages/count_tokens"
        | "/v1/chat/completions"
        | "/v1/completions"
        | "/v1/messages"
        | "/v1/responses" => respond_error(io, rb, &req, None, 405, "Method Not Allowed").await,
        _ => respond_no_route(io, rb, &req).await,
    }
}

/// vLLM's routes of its response store: `GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel` (a
/// `?stream=true` retrieval of a background stream is not simulated: the query is ignored). Without
/// `responses_store` the store is empty, so every id is unknown, as on vLLM.
async fn stored_response(eng: &Engine, req: &Request, io: &mut ConnIo, rb: &InBuf) -> bool {
    let rest = req.path.strip_prefix("/v1/responses/").unwrap_or_default();
    let (id, cancel) = match rest.strip_suffix("/cancel") {
        Some(id) => (id, true),
        None => (rest, false),
    };
    if id.is_empty() || id.contains('/') {
        return respond_no_route(io, rb, req).await;
    }
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

/// Response shapes of one generation request.
struct Reply {
    kind: ApiKind,
    id: String,
    created: u64,
    model: String,
    prompt_tokens: usize,
    max_tokens: usize,
    /// The answer ends at end of sequence (`--stop-after`), not at the request's limit.
    ended_itself: bool,
    include_usage: bool,
    /// A Responses API request with `background` (echoed in its response object).
    background: bool,
}

impl Reply {
    fn usage(&self, completion: usize, cached: usize) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        })
    }

    fn anthropic_usage(&self, output: usize, cached: usize) -> Value {
        json!({"input_tokens": self.prompt_tokens, "output_tokens": output, "cache_read_input_tokens": cached,
               "cache_creation_input_tokens": 0})
    }

    fn openai_object(&self, stream: bool) -> &'static str {
        match (self.kind, stream) {
            (ApiKind::Completion, _) => "text_completion",
            (_, true) => "chat.completion.chunk",
            (_, false) => "chat.completion",
        }
    }

    fn data(v: &Value) -> Vec<u8> {
        format!("data: {v}\n\n").into_bytes()
    }

    fn event(name: &str, v: &Value) -> Vec<u8> {
        format!("event: {name}\ndata: {v}\n\n").into_bytes()
    }

    /// OpenAI's `finish_reason`: `stop` at end of sequence, `length` at the request's limit.
    fn finish_reason(&self) -> &'static str {
        if self.ended_itself {
            "stop"
        } else {
            "length"
        }
    }

    /// Anthropic's `stop_reason`: `end_turn` at end of sequence, `max_tokens` at the request's limit.
    fn stop_reason(&self) -> &'static str {
        if self.ended_itself {
            "end_turn"
        } else {
            "max_tokens"
        }
    }

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
    fn queued_object(&self) -> Value {
        let mut r = self.response_object(None);
        r["status"] = json!("queued");
        r
    }

    /// The whole generated text.
    fn output_text(&self) -> String {
        (0..self.max_tokens).map(output_token).collect()
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

    /// SSE events sent as the stream opens, before any token: vLLM's Responses API announces the response
    /// (`response.created`, `response.in_progress`) before its prefill has run.
    fn preamble_events(&self) -> Vec<Vec<u8>> {
        match self.kind {
            ApiKind::Responses => {
                let r = self.response_object(None);
                vec![
                    Self::response_event("response.created", 0, json!({"response": r})),
                    Self::response_event("response.in_progress", 1, json!({"response": r})),
                ]
            }
            _ => Vec::new(),
        }
    }

    fn anthropic_message(&self, content: Value, stop: Value, usage: Value) -> Value {
        json!({"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
               "stop_reason": stop, "stop_sequence": null, "usage": usage})
    }

    /// The SSE events that carry one generated token.
    fn token_events(&self, ev: &TokenEvent) -> Vec<Vec<u8>> {
        let tok = output_token(ev.index);
        let finish = if ev.finished {
            json!(self.finish_reason())
        } else {
            Value::Null
        };
        match self.kind {
            ApiKind::Messages => {
                let mut out = Vec::new();
                if ev.index == 0 {
                    let start = self.anthropic_message(
                        json!([]),
                        Value::Null,
                        self.anthropic_usage(0, ev.cached_tokens),
                    );
                    out.push(Self::event(
                        "message_start",
                        &json!({"type": "message_start", "message": start}),
                    ));
                    out.push(Self::event(
                        "content_block_start",
                        &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                    ));
                }
                out.push(Self::event(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": tok}}),
                ));
                out
            }
            ApiKind::Responses => {
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
            ApiKind::Chat | ApiKind::Completion => {
                let choice = if self.kind == ApiKind::Chat {
                    let delta = if ev.index == 0 {
                        json!({"role": "assistant", "content": tok})
                    } else {
                        json!({"content": tok})
                    };
                    json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
                } else {
                    json!({"index": 0, "text": tok, "logprobs": null, "finish_reason": finish, "stop_reason": null})
                };
                let mut chunk = json!({"id": self.id, "object": self.openai_object(true), "created": self.created,
                                       "model": self.model, "choices": [choice]});
                if ev.finished && !self.include_usage {
                    // Not vLLM (it sends usage only with stream_options.include_usage): convenient for clients.
                    chunk["usage"] = self.usage(ev.index + 1, ev.cached_tokens);
                }
                vec![Self::data(&chunk)]
            }
        }
    }

    /// The SSE events after the last token.
    fn tail_events(&self, cached: usize) -> Vec<Vec<u8>> {
        match self.kind {
            ApiKind::Responses => {
                let text = self.output_text();
                let (item, seq) = (self.message_id(), 4 + self.max_tokens);
                let part = json!({"type": "output_text", "text": text, "annotations": []});
                let done = self
                    .response_object(Some((&text, self.responses_usage(self.max_tokens, cached))));
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
            ApiKind::Messages => vec![
                Self::event(
                    "content_block_stop",
                    &json!({"type": "content_block_stop", "index": 0}),
                ),
                Self::event(
                    "message_delta",
                    &json!({"type": "message_delta", "delta": {"stop_reason": self.stop_reason(), "stop_sequence": null},
                            "usage": {"output_tokens": self.max_tokens}}),
                ),
                Self::event("message_stop", &json!({"type": "message_stop"})),
            ],
            ApiKind::Chat | ApiKind::Completion => {
                let mut out = Vec::new();
                if self.include_usage {
                    out.push(Self::data(
                        &json!({"id": self.id, "object": self.openai_object(true),
                        "created": self.created, "model": self.model, "choices": [],
                        "usage": self.usage(self.max_tokens, cached)}),
                    ));
                }
                out.push(b"data: [DONE]\n\n".to_vec());
                out
            }
        }
    }

    fn full_body(&self, cached: usize) -> Value {
        let text = self.output_text();
        match self.kind {
            ApiKind::Responses => {
                self.response_object(Some((&text, self.responses_usage(self.max_tokens, cached))))
            }
            ApiKind::Messages => self.anthropic_message(
                json!([{"type": "text", "text": text}]),
                json!(self.stop_reason()),
                self.anthropic_usage(self.max_tokens, cached),
            ),
            ApiKind::Chat => json!({
                "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                             "logprobs": null, "finish_reason": self.finish_reason(), "stop_reason": null}],
                "usage": self.usage(self.max_tokens, cached),
            }),
            ApiKind::Completion => json!({
                "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": self.finish_reason(),
                             "stop_reason": null}],
                "usage": self.usage(self.max_tokens, cached),
            }),
        }
    }
}

/// A generation request as parsed, with what the Responses API store needs of it.
struct Parsed {
    gen: GenRequest,
    /// `store` here is whether to store: false without `responses_store` (vLLM then ignores the field).
    fields: StoreFields,
    /// The stored conversation its `previous_response_id` continues.
    parent: Option<Arc<Turn>>,
}

/// Why a generation request is answered at once instead of being parsed into one to schedule.
enum Refused {
    /// A malformed request: 400 in the route's own error shape.
    Bad(BadRequest),
    /// vLLM's `invalid_request_error` of the Responses API store: status, message and the `param` it names.
    Store(u16, String, &'static str),
}

const BACKGROUND_NEEDS_STORE: &str =
    "This vLLM engine does not support `store=True` and therefore does not \
    support the background mode. To enable these features, set the environment variable \
    `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.";

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

async fn parse(eng: &Engine, kind: ApiKind, body: Vec<u8>) -> Result<Parsed, Refused> {
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

/// Follows a background response's generation and keeps its stored object current: `in_progress` from the first
/// token (its prefill done), then the final object. A cancel, or the response leaving the store, ends this task;
/// dropping `rx` then aborts the request in the scheduler, as vLLM cancels its background task.
async fn run_background(
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

/// A generation call: optional injected delay / failure, parse, length and queue checks, schedule, then stream
/// or answer when done. Every refusal is answered at once (no simulated time), counted and marked in the
/// request's record.
async fn generate(
    eng: &Arc<Engine>,
    kind: ApiKind,
    mut req: Request,
    seq: u64,
    io: &mut ConnIo,
    rb: &mut InBuf,
) -> bool {
    eng.received.fetch_add(1, Ordering::Relaxed);
    let slow = eng.control.slow_headers();
    if !slow.is_zero()
        && http::watch(io, rb, tokio::time::sleep(slow))
            .await
            .is_none()
    {
        return false;
    }
    if let Some(status) = eng.control.fail_status() {
        eng.refuse(seq, Refusal::Injected, status);
        let msg = format!("simulated failure (status {status})");
        return respond_gen_error(io, rb, &req, kind, status, &msg, None).await;
    }
    let body = std::mem::take(&mut req.body);
    let Parsed {
        gen: parsed,
        fields,
        parent,
    } = match parse(eng, kind, body).await {
        Ok(p) => p,
        Err(Refused::Bad(BadRequest(m))) => {
            eng.refuse(seq, Refusal::Invalid, 400);
            return respond_error(io, rb, &req, Some(kind), 400, &m).await;
        }
        Err(Refused::Store(status, m, param)) => {
            eng.refuse(seq, Refusal::Invalid, status);
            return respond_invalid(io, rb, &req, status, &m, param).await;
        }
    };
    let requested = match parsed.max_tokens {
        None => None,
        Some(n) if n >= 1 => Some(n as usize),
        Some(n) => {
            eng.refuse(seq, Refusal::Invalid, 400);
            let msg = format!("max_tokens must be at least 1, got {n}.");
            return respond_error(io, rb, &req, Some(kind), 400, &msg).await;
        }
    };
    let prompt_tokens = parsed.prompt.len;
    // Checked on arrival, before the scheduler sees the request: no simulated time passes.
    if let Some((msg, param)) =
        context_length_error(eng.cfg.max_model_len, prompt_tokens, requested)
    {
        eng.refuse(seq, Refusal::Invalid, 400);
        return respond_gen_error(io, rb, &req, kind, 400, &msg, Some(param)).await;
    }
    // Without max_tokens vLLM generates up to the context length; the simulator stops at its default.
    let allowed = requested.unwrap_or_else(|| {
        eng.cfg
            .default_max_tokens
            .min(eng.cfg.max_model_len - prompt_tokens)
    });
    // A model that ends its answer on its own (end of sequence) before the request's limit.
    let ends_itself = eng.cfg.stop_after.filter(|&n| n < allowed);
    let max_tokens = ends_itself.unwrap_or(allowed);

    if !eng.sched.try_reserve(eng.cfg.max_waiting) {
        eng.refuse(seq, Refusal::QueueFull, 429);
        let msg = format!(
            "The engine's waiting queue is full ({} requests waiting). Please retry later.",
            eng.cfg.max_waiting.unwrap_or(0)
        );
        return respond_gen_error(io, rb, &req, kind, 429, &msg, None).await;
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    if eng
        .sched_tx
        .send(SchedRequest {
            prompt: parsed.prompt,
            max_tokens,
            tx,
        })
        .is_err()
    {
        eng.sched.unreserve();
        let msg = "engine is shutting down";
        return respond_gen_error(io, rb, &req, kind, 503, msg, None).await;
    }
    eng.gen_requests.fetch_add(1, Ordering::Relaxed);

    let seq = eng.next_id.fetch_add(1, Ordering::Relaxed);
    let prefix = match kind {
        ApiKind::Chat => "chatcmpl-",
        ApiKind::Completion => "cmpl-",
        ApiKind::Messages => "msg_",
        ApiKind::Responses => "resp_",
    };
    let reply = Reply {
        kind,
        id: format!("{prefix}{seq:08x}{:016x}", fastrand::u64(..)),
        created: now_secs(),
        model: parsed
            .model
            .clone()
            .unwrap_or_else(|| eng.cfg.model.clone()),
        prompt_tokens,
        max_tokens,
        ended_itself: ends_itself.is_some(),
        include_usage: parsed.include_usage,
        background: fields.background,
    };

    if fields.background {
        // Answered at once; the generation runs on without the client. Stored before the answer, so a retrieval
        // right after it finds the response.
        let queued = reply.queued_object();
        let turn = Turn::new(parent, parsed.input);
        let cancel = eng
            .responses
            .put_background(reply.id.clone(), queued.clone(), turn);
        tokio::spawn(run_background(eng.responses.clone(), reply, rx, cancel));
        return respond_json(io, rb, &req, 200, &queued).await;
    }
    // Stored once finished, before the last bytes go out (vLLM stores the object `response.completed` carries).
    let mut to_store = fields.store.then(|| Turn::new(parent, parsed.input));
    let mut store_final = |cached: usize| {
        if let Some(turn) = to_store.take() {
            let turn = turn.answered(&reply.output_text());
            eng.responses
                .put(reply.id.clone(), reply.full_body(cached), turn);
        }
    };

    if !parsed.stream {
        let done = http::watch(io, rb, async {
            while let Some(ev) = rx.recv().await {
                if ev.finished {
                    return Some(ev.cached_tokens);
                }
            }
            None
        })
        .await;
        return match done {
            // Client went away: dropping `rx` aborts the request in the scheduler.
            None => false,
            Some(None) => respond_gen_error(io, rb, &req, kind, 503, "engine stopped", None).await,
            Some(Some(cached)) => {
                store_final(cached);
                respond_json(io, rb, &req, 200, &reply.full_body(cached)).await
            }
        };
    }

    // Streaming: headers now, nothing more until the first token.
    let chunked = !req.http10;
    let keep = req.keep_alive && chunked;
    let head = http::head(
        200,
        "text/event-stream; charset=utf-8",
        None,
        keep,
        req.http10,
    );
    if io.write(head.as_bytes(), false).await.is_err() {
        return false;
    }
    let close_after = eng.control.close_mid_stream_after();
    let mut sent = 0usize;
    let frame = |e: &[u8]| if chunked { http::chunk(e) } else { e.to_vec() };
    if close_after == Some(0) {
        io.0.reset();
        return false;
    }
    for e in reply.preamble_events() {
        if io.write(&frame(&e), false).await.is_err() {
            return false;
        }
    }
    loop {
        let ev = match http::watch(io, rb, rx.recv()).await {
            None => return false,
            Some(None) => {
                // The scheduler stopped (engine shutdown): end the stream abruptly.
                io.0.reset();
                return false;
            }
            Some(Some(ev)) => ev,
        };
        let mut events = reply.token_events(&ev);
        if ev.finished {
            store_final(ev.cached_tokens);
            events.extend(reply.tail_events(ev.cached_tokens));
        }
        let n = events.len();
        for (i, e) in events.into_iter().enumerate() {
            let last = ev.finished && i + 1 == n;
            let mut bytes = frame(&e);
            if last && chunked {
                bytes.extend_from_slice(b"0\r\n\r\n");
            }
            if io
                .write(&bytes, last && keep && rb.is_empty())
                .await
                .is_err()
            {
                return false;
            }
            sent += 1;
            if close_after.is_some_and(|c| sent >= c) && !last {
                io.0.reset();
                return false;
            }
        }
        if ev.finished {
            return keep;
        }
    }
}
