//! `SimConfig`: every knob of one simulated engine, with defaults calibrated against a vLLM pod.

use std::time::Duration;

/// Configuration of one simulated engine. Every duration is multiplied by `time_scale` when the scheduler sleeps.
///
/// Calibration of the defaults (see the `calibration_*` unit tests in `scheduler.rs`):
/// - one cold 140,000-token prefill alone: 18 steps of at most 8,192 tokens, 18 x 18 ms of overhead plus
///   140,000 / 44,000 s of compute = 3.51 s to the first token;
/// - decode: 18 ms + 0.25 ms per decoding sequence per step, i.e. ~55 tok/s for one sequence, ~38 tok/s per
///   sequence at a batch of 32 and ~29 tok/s at 64.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Served model name, listed in `/v1/models` and in the `model_name` metric label.
    pub model: String,
    /// Token budget of one scheduler step (vLLM `max_num_batched_tokens`).
    pub step_token_budget: usize,
    /// Most requests running at once (vLLM `max_num_seqs`); the rest wait in FIFO order.
    pub max_num_seqs: usize,
    /// Fixed cost of every step.
    pub step_overhead: Duration,
    /// Prefill throughput: each prefill token in a step costs `1 / prefill_tokens_per_sec` seconds.
    pub prefill_tokens_per_sec: f64,
    /// Extra step cost per decoding sequence in the step (so big batches decode slower).
    pub decode_step_cost_per_seq: Duration,
    /// Attention in prefill: a prompt token at context position `p` costs `1 + p / K` tokens' worth, so a cold
    /// prefill of `L` tokens grows as `L + L² / 2K` and a follow-up's new tokens cost more the longer the cached
    /// context before them. `None`: every prefill token costs the same, as in the calibration above. Real vLLM
    /// 0.32 on this project's CPU test model measured K ≈ 1,000 tokens (BENCHMARKS.md, "Real vLLM's prefill is
    /// not a line"); a dense 8B model on a GPU is about 30,000 by its FLOPs (2 × parameters per token against
    /// 4 × layers × model width per earlier token), a 70B one about 53,000.
    pub attention_context_tokens: Option<f64>,
    /// KV cache capacity in tokens: prefix-cache size (LRU over blocks) and the denominator of `kv_cache_usage_perc`.
    pub kv_capacity_tokens: usize,
    /// Tokens per KV block; the prefix cache matches whole blocks only.
    pub block_tokens: usize,
    /// Output tokens generated when the request gives no `max_tokens` / `max_completion_tokens`.
    pub default_max_tokens: usize,
    /// Context length (vLLM `max_model_len`). A prompt of this many tokens or more, or an explicit `max_tokens`
    /// that does not fit beside the prompt, gets vLLM's 400 at once; without `max_tokens` the output is capped
    /// to fit.
    pub max_model_len: usize,
    /// Multiplies every simulated duration (1.0 = real time; tests use e.g. 0.1).
    pub time_scale: f64,
    /// Prefix of every metric name (`vllm:`); a wrong one (`vllm_`) simulates a mis-prefixed engine.
    pub metric_prefix: String,
    /// Number of `engine="i"` label values each series is split over (vLLM data parallel); readers must sum.
    pub engine_label_count: usize,
    /// Close a keep-alive connection after this long without a new request (uvicorn / vLLM default is 5 s);
    /// `None` keeps idle connections open forever.
    pub keep_alive_timeout: Option<Duration>,
    /// Most requests kept by `EngineHandle::requests()` (oldest dropped first).
    pub max_recorded_requests: usize,
    /// Largest accepted request body in bytes; larger gets 413.
    pub max_body_bytes: usize,
    /// A generation request that arrives while this many requests already wait (admission queue plus requests
    /// not yet taken by the scheduler) is refused at once with 429 and `Retry-After: 1`. `None`: no limit,
    /// like vLLM today (vLLM PR #49330 proposes `--max-waiting-queue-length` with the same 429).
    pub max_waiting: Option<usize>,
    /// The model ends every answer (end of sequence: `stop`, `end_turn`, `completed`) after this many tokens when
    /// the request allows more; `None`: answers run to their `max_tokens`, as the benchmarks want. Real agents ask
    /// for 32,000 tokens and expect an answer to end on its own.
    pub stop_after: Option<usize>,
    /// Store Responses API responses, as vLLM does with `VLLM_ENABLE_RESPONSES_API_STORE=1`: `previous_response_id`,
    /// `GET /v1/responses/{id}`, `background` and cancel then work (the newest
    /// [`MAX_STORED_RESPONSES`](crate::MAX_STORED_RESPONSES) are kept).
    /// Off (vLLM's default): `store` is ignored, `background` is refused and every stored id is unknown.
    pub responses_store: bool,
    /// Refuse a generation for any model but `model` with vLLM's 404 (`NotFoundError`). Off by default: the
    /// router's tests send many model names to one simulated engine.
    pub only_served_model: bool,
    /// Publish KV-cache events in vLLM's wire format on this ZMQ address (`tcp://*:P` binds, `tcp://HOST:P`
    /// connects, as vLLM's `--kv-events-config` endpoint); topic `kv`. None: no events (vLLM's default).
    pub kv_events: Option<String>,
    /// Play both roles of vLLM's NixlConnector (`--kv-transfer-config '{"kv_connector":"NixlConnector",
    /// "kv_role":"kv_both"}'`): answer a prefill leg with `kv_transfer_params`, pull a decode leg's KV cache from
    /// the engine that issued its params (`kv_transfer`). Off: the params are ignored, as vLLM does without a
    /// connector.
    pub kv_transfer: bool,
    /// KV-cache transfer speed of a decode leg's pull, in prompt tokens per second.
    pub kv_transfer_tokens_per_sec: f64,
    /// How fast this engine runs against the calibrated defaults: every step takes `1 / speed` as long (0.5: a
    /// GPU of half the speed). The control API (`{"speed": F}`) changes it at run time.
    pub speed: f64,
    /// The engine's speed becomes `.1` this long (simulated, so scaled by `time_scale`) after it first had work: a
    /// GPU that throttles, or a neighbour saturating the node, mid-run.
    pub speed_change: Option<(Duration, f64)>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            model: "sim-model".to_string(),
            step_token_budget: 8192,
            max_num_seqs: 64,
            step_overhead: Duration::from_millis(18),
            prefill_tokens_per_sec: 44_000.0,
            decode_step_cost_per_seq: Duration::from_micros(250),
            attention_context_tokens: None,
            kv_capacity_tokens: 2_000_000,
            block_tokens: 16,
            default_max_tokens: 16,
            max_model_len: 10_000_000,
            time_scale: 1.0,
            metric_prefix: "vllm:".to_string(),
            engine_label_count: 1,
            keep_alive_timeout: None,
            max_recorded_requests: 100_000,
            max_body_bytes: 64 << 20,
            max_waiting: None,
            stop_after: None,
            responses_store: false,
            only_served_model: false,
            kv_events: None,
            kv_transfer: false,
            kv_transfer_tokens_per_sec: 200_000.0,
            speed: 1.0,
            speed_change: None,
        }
    }
}

impl SimConfig {
    /// Clamp nonsensical values (zero budgets, zero block size, ...) so the scheduler always makes progress.
    pub(crate) fn sanitized(mut self) -> Self {
        self.step_token_budget = self.step_token_budget.max(1);
        self.max_num_seqs = self.max_num_seqs.max(1);
        self.block_tokens = self.block_tokens.max(1);
        self.kv_capacity_tokens = self.kv_capacity_tokens.max(self.block_tokens);
        self.default_max_tokens = self.default_max_tokens.max(1);
        self.engine_label_count = self.engine_label_count.max(1);
        self.max_recorded_requests = self.max_recorded_requests.max(1);
        if !(self.prefill_tokens_per_sec.is_finite() && self.prefill_tokens_per_sec > 0.0) {
            self.prefill_tokens_per_sec = 44_000.0;
        }
        if !(self.kv_transfer_tokens_per_sec.is_finite() && self.kv_transfer_tokens_per_sec > 0.0) {
            self.kv_transfer_tokens_per_sec = 200_000.0;
        }
        if !(self.time_scale.is_finite() && self.time_scale >= 0.0) {
            self.time_scale = 1.0;
        }
        if !valid_speed(self.speed) {
            self.speed = 1.0;
        }
        self.speed_change = self.speed_change.filter(|(_, f)| valid_speed(*f));
        self.attention_context_tokens = self
            .attention_context_tokens
            .filter(|k| k.is_finite() && *k > 0.0);
        self
    }

    /// What a prefill chunk of `n` tokens starting at context position `at` costs, in tokens' worth of
    /// `prefill_tokens_per_sec`: `n` without attention, `n (1 + (at + (n - 1) / 2) / K)` with it (each token's
    /// position, averaged over the chunk).
    pub fn prefill_work(&self, at: usize, n: usize) -> f64 {
        let n_f = n as f64;
        match self.attention_context_tokens {
            Some(k) if n > 0 => n_f * (1.0 + (at as f64 + (n_f - 1.0) / 2.0) / k),
            _ => n_f,
        }
    }

    /// Unscaled duration of one step with `prefill_work` tokens' worth of prefill ([`Self::prefill_work`]) and
    /// `decoding` decoding sequences.
    pub fn step_duration(&self, prefill_work: f64, decoding: usize) -> Duration {
        self.step_overhead
            + Duration::from_secs_f64(prefill_work / self.prefill_tokens_per_sec)
            + self.decode_step_cost_per_seq * decoding as u32
    }
}

/// A speed factor the scheduler can divide by.
pub(crate) fn valid_speed(f: f64) -> bool {
    f.is_finite() && f > 0.0
}
