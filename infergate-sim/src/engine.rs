//! An engine's shared state (config, control, scheduler handle, counters, recorded requests) and the kinds
//! the routes and the connection loop both use: what is recorded per request, the totals, why a request is refused.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::config::SimConfig;
use super::control::Control;
use super::http;
use super::scheduler::{SchedRequest, SchedShared};
use super::store::ResponseStore;
use super::tokenize::fnv64;

/// One request as the engine received it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub method: String,
    /// Path without the query string.
    pub path: String,
    /// Header names in lower case, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body_len: usize,
    /// [`fnv64`] of the (de-chunked) body.
    pub body_fnv64: u64,
    /// When the request head had been read.
    pub received_at: Instant,
    /// Arrival number on this engine (1, 2, ...; every path counts).
    pub seq: u64,
    /// For a generation request the engine answered with an error instead of scheduling it (injected
    /// `fail_status`, full waiting queue, invalid or too long request): that status. None otherwise.
    pub refused: Option<u16>,
}

impl RecordedRequest {
    /// First value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Totals of one engine, as `GET /sim/stats` returns them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineTotals {
    pub model: String,
    /// Every HTTP request received (any path).
    pub http_requests: u64,
    /// Generation requests received (every POST to a generation route, whatever came of it).
    pub received: u64,
    /// Generation requests handed to the scheduler.
    pub requests: u64,
    /// Generation requests answered with an error instead of being scheduled (injected failures, full waiting
    /// queue, 400s); each is also marked in [`RecordedRequest::refused`].
    pub rejected: u64,
    /// Of `rejected`: answered with the injected `fail_status`.
    pub refused_injected: u64,
    /// Of `rejected`: answered 429 because `max_waiting` requests were already waiting.
    pub refused_queue_full: u64,
    pub finished: u64,
    /// Requests aborted because the client went away.
    pub aborted: u64,
    /// Prompt tokens of completed prefills (= computed + cached).
    pub prompt_tokens: u64,
    /// Prompt tokens actually prefilled (`source="local_compute"`).
    pub computed_prompt_tokens: u64,
    /// Prompt tokens whose KV cache a prefill engine sent (`source="external_kv_transfer"`).
    pub external_prompt_tokens: u64,
    /// Prompt tokens served from the prefix cache (`source="local_cache_hit"`).
    pub cached_prompt_tokens: u64,
    pub generation_tokens: u64,
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    /// Currently running (no `extra_running` added).
    pub running: u64,
    /// Currently waiting (no `extra_waiting` added).
    pub waiting: u64,
    /// KV tokens of running requests / capacity, 0..1.
    pub kv_cache_usage: f64,
    pub cached_blocks: u64,
    pub steps: u64,
    /// Simulated (scaled) time spent in steps.
    pub busy_seconds: f64,
    /// Prefill legs answered with `kv_transfer_params` (`kv_transfer`).
    pub kv_params_issued: u64,
    /// Decode legs that pulled a prefill engine's KV cache (`kv_transfer`).
    pub kv_pulls: u64,
}

/// Bodies above this size are hashed and parsed on the blocking pool, off the runtime's workers.
pub(crate) const BIG_BODY: usize = 256 * 1024;

pub(crate) struct Engine {
    pub cfg: SimConfig,
    pub control: Arc<Control>,
    pub sched_tx: mpsc::UnboundedSender<SchedRequest>,
    pub sched: Arc<SchedShared>,
    pub recorded: Mutex<VecDeque<RecordedRequest>>,
    pub http_requests: AtomicU64,
    pub received: AtomicU64,
    pub gen_requests: AtomicU64,
    pub rejected: AtomicU64,
    pub refused_injected: AtomicU64,
    pub refused_queue_full: AtomicU64,
    pub next_id: AtomicU64,
    pub next_record: AtomicU64,
    /// This engine's id in the `kv_transfer_params` it issues (`kv_transfer`) and its address.
    pub engine_id: String,
    pub addr: std::net::SocketAddr,
    pub kv_issued: AtomicU64,
    pub kv_pulled: AtomicU64,
    /// Stored Responses API responses; stays empty unless `cfg.responses_store`.
    pub responses: Arc<ResponseStore>,
}

/// Why a generation request was answered with an error instead of being scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The injected `fail_status`.
    Injected,
    /// `max_waiting` requests were already waiting.
    QueueFull,
    /// Invalid or too long.
    Invalid,
}

impl Engine {
    pub fn totals(&self) -> EngineTotals {
        let c = self.sched.snapshot();
        EngineTotals {
            model: self.cfg.model.clone(),
            http_requests: self.http_requests.load(Ordering::Relaxed),
            received: self.received.load(Ordering::Relaxed),
            requests: self.gen_requests.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            refused_injected: self.refused_injected.load(Ordering::Relaxed),
            refused_queue_full: self.refused_queue_full.load(Ordering::Relaxed),
            finished: c.finished,
            aborted: c.aborted,
            prompt_tokens: c.prompt_tokens,
            computed_prompt_tokens: c.computed_prompt_tokens,
            external_prompt_tokens: c.external_prompt_tokens,
            cached_prompt_tokens: c.cached_prompt_tokens,
            generation_tokens: c.generation_tokens,
            prefix_cache_queries: c.prefix_cache_queries,
            prefix_cache_hits: c.prefix_cache_hits,
            running: c.running as u64,
            waiting: c.waiting as u64,
            kv_cache_usage: (c.kv_tokens as f64 / self.cfg.kv_capacity_tokens.max(1) as f64)
                .min(1.0),
            cached_blocks: c.cached_blocks as u64,
            steps: c.steps,
            busy_seconds: c.busy.as_secs_f64(),
            kv_params_issued: self.kv_issued.load(Ordering::Relaxed),
            kv_pulls: self.kv_pulled.load(Ordering::Relaxed),
        }
    }

    /// Counts a generation request answered with `status` instead of being scheduled, and marks its record.
    pub fn refuse(&self, seq: u64, why: Refusal, status: u16) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
        let by_cause = match why {
            Refusal::Injected => Some(&self.refused_injected),
            Refusal::QueueFull => Some(&self.refused_queue_full),
            Refusal::Invalid => None,
        };
        if let Some(n) = by_cause {
            n.fetch_add(1, Ordering::Relaxed);
        }
        // Refusals come right after arrival, so the record is near the back (unless already dropped).
        if let Some(r) = self
            .recorded
            .lock()
            .unwrap()
            .iter_mut()
            .rev()
            .find(|r| r.seq == seq)
        {
            r.refused = Some(status);
        }
    }

    /// Records the request; returns its arrival number.
    pub async fn record(&self, req: &mut http::Request) -> u64 {
        self.http_requests.fetch_add(1, Ordering::Relaxed);
        let seq = self.next_record.fetch_add(1, Ordering::Relaxed);
        let body_fnv64 = if req.body.len() > BIG_BODY {
            let body = std::mem::take(&mut req.body);
            let (h, body) = tokio::task::spawn_blocking(move || (fnv64(&body), body))
                .await
                .expect("hash task");
            req.body = body;
            h
        } else {
            fnv64(&req.body)
        };
        let r = RecordedRequest {
            method: req.method.clone(),
            path: req.path.clone(),
            headers: req.headers.clone(),
            body_len: req.body.len(),
            body_fnv64,
            received_at: req.received_at,
            seq,
            refused: None,
        };
        let mut g = self.recorded.lock().unwrap();
        if g.len() >= self.cfg.max_recorded_requests {
            g.pop_front();
        }
        g.push_back(r);
        seq
    }
}
