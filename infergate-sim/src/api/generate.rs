//! A generation call on any API: parse, length and queue checks, scheduling, then the answer whole or streamed.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::parse::{parse, Parsed, Refused};
use super::reply::{now_secs, Reply};
use super::respond::{respond_error, respond_gen_error, respond_invalid, respond_json};
use super::responses;
use crate::engine::{Engine, Refusal};
use crate::http::{self, ConnIo, InBuf, Request};
use crate::kv_transfer::{self, Role};
use crate::scheduler::SchedRequest;
use crate::store::Turn;
use crate::tokenize::{ApiKind, BadRequest};

/// vLLM's length check before a request reaches the engine (`_validate_input` in its serving layer): the prompt
/// must leave room for at least one output token, and an explicit `max_tokens` must fit beside it. Returns the
/// error message and the `param` it names.
fn context_length_error(
    max_model_len: usize,
    prompt: usize,
    max_tokens: Option<usize>,
) -> Option<(String, &'static str)> {
    if prompt >= max_model_len {
        // vLLM 0.32 tokenises at most one token past the context, hence "at least".
        let seen = prompt.min(max_model_len + 1);
        return Some((
            format!(
                "This model's maximum context length is {max_model_len} tokens. However, your prompt contains at \
                 least {seen} input tokens, which exceeds this limit even without any output tokens. Please reduce \
                 the length of the input prompt. (parameter=input_tokens, value={seen})"
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

/// The request's part in a disaggregated prefill and decode: its role, the prompt tokens a decode leg pulls and
/// how long the pull takes (scaled); none without `kv_transfer`. Err: why its params are refused.
fn kv_leg(
    eng: &Engine,
    parsed: &crate::tokenize::GenRequest,
) -> Result<(Option<Role>, usize, std::time::Duration), String> {
    if !eng.cfg.kv_transfer {
        return Ok((None, 0, std::time::Duration::ZERO));
    }
    let role = kv_transfer::role(parsed.kv_transfer.as_ref())?;
    let Some(Role::Decode(remote)) = &role else {
        return Ok((role, 0, std::time::Duration::ZERO));
    };
    let tokens = kv_transfer::claim(remote, &parsed.prompt)?;
    eng.kv_pulled.fetch_add(1, Ordering::Relaxed);
    let secs = tokens as f64 / eng.cfg.kv_transfer_tokens_per_sec * eng.cfg.time_scale;
    Ok((role, tokens, std::time::Duration::from_secs_f64(secs)))
}

/// A generation call: optional injected delay / failure, parse, length and queue checks, schedule, then stream
/// or answer when done. Every refusal is answered at once (no simulated time), counted and marked in the
/// request's record.
pub(super) async fn generate(
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
    if let Some(m) = parsed
        .model
        .as_deref()
        .filter(|m| eng.cfg.only_served_model && *m != eng.cfg.model)
    {
        eng.refuse(seq, Refusal::Invalid, 404);
        let msg = format!("The model `{m}` does not exist.");
        return respond_gen_error(io, rb, &req, kind, 404, &msg, Some("model")).await;
    }
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
    // Disaggregated prefill and decode (kv_transfer): a prefill leg answers with params, a decode leg pulls
    // (once admitted: a refused request leaves the prefill's KV cache for another decode engine).
    let (role, external, transfer) = match kv_leg(eng, &parsed) {
        Ok(leg) => leg,
        Err(m) => {
            eng.sched.unreserve();
            eng.refuse(seq, Refusal::Invalid, 400);
            return respond_gen_error(io, rb, &req, kind, 400, &m, Some("kv_transfer_params"))
                .await;
        }
    };
    let issues_params = (role == Some(Role::Prefill)).then(|| parsed.prompt.clone());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let sched_req = SchedRequest {
        prompt: parsed.prompt,
        max_tokens,
        external_tokens: external,
        tx,
    };
    if !transfer.is_zero() {
        // The pull takes its time before the engine schedules the request (it waits, like vLLM's
        // WAITING_FOR_REMOTE_KVS); headers go out at once all the same.
        let sched_tx = eng.sched_tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(transfer).await;
            let _ = sched_tx.send(sched_req);
        });
    } else if eng.sched_tx.send(sched_req).is_err() {
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
        tokio::spawn(responses::run_background(
            eng.responses.clone(),
            reply,
            rx,
            cancel,
        ));
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
                let mut body = reply.full_body(cached);
                if let Some(prompt) = &issues_params {
                    let (id, bt) = (&eng.engine_id, eng.cfg.block_tokens);
                    body["kv_transfer_params"] =
                        kv_transfer::issue(id, eng.addr, &reply.id, prompt, bt);
                    eng.kv_issued.fetch_add(1, Ordering::Relaxed);
                }
                respond_json(io, rb, &req, 200, &body).await
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
    let drop_after = eng.control.drop_mid_stream_after();
    let error_after = eng.control.error_mid_stream_after();
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
    // The in-band error ends the stream as a finished one ends (the final chunk, kept alive).
    let error_end = || {
        let mut bytes: Vec<u8> = reply.error_events().iter().flat_map(|e| frame(e)).collect();
        if chunked {
            bytes.extend_from_slice(b"0\r\n\r\n");
        }
        bytes
    };
    if error_after == Some(0) {
        return io.write(&error_end(), keep && rb.is_empty()).await.is_ok() && keep;
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
            if error_after.is_some_and(|c| sent >= c) && !last {
                return io.write(&error_end(), keep && rb.is_empty()).await.is_ok() && keep;
            }
            if drop_after.is_some_and(|c| sent >= c) && !last {
                // Not kept alive: the connection closes with a FIN, mid-body.
                return false;
            }
        }
        if ev.finished {
            return keep;
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_must_leave_room_for_one_output_token() {
        let (msg, param) = context_length_error(100, 100, None).unwrap();
        assert_eq!(param, "input_tokens");
        assert_eq!(
            msg,
            "This model's maximum context length is 100 tokens. However, your prompt contains at least 100 \
             input tokens, which exceeds this limit even without any output tokens. Please reduce the length of \
             the input prompt. (parameter=input_tokens, value=100)"
        );
        assert!(context_length_error(100, 99, None).is_none());
    }

    #[test]
    fn an_explicit_max_tokens_must_fit_beside_the_prompt() {
        assert!(context_length_error(100, 60, Some(40)).is_none());
        let (msg, param) = context_length_error(100, 60, Some(41)).unwrap();
        assert_eq!(param, "max_tokens");
        assert_eq!(
            msg,
            "'max_tokens' or 'max_completion_tokens' is too large: 41. This model's maximum context \
             length is 100 tokens and your request has 60 input tokens (41 > 100 - 60)."
        );
        // No overflow on an absurd limit.
        assert_eq!(
            context_length_error(100, 60, Some(usize::MAX)).map(|e| e.1),
            Some("max_tokens")
        );
    }
}
