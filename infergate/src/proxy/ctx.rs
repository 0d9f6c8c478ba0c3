//! The request context: what one request carries through the hooks, and the part that belongs to one forwarding
//! attempt.

use std::sync::Arc;
use std::time::Instant;

use super::body::HeldBody;
use super::first_output;
use crate::errors::ApiError;
use crate::exposure::Screened;
use crate::ledger::{Hold, ReleaseCause};
use crate::placement::policy::{Placement, Ticket};
use crate::pool::{Endpoint, Pool};
use crate::request::{self, CallKind};
use crate::tokens::PromptTokens;

/// Per-request state. `Default` is the state before `request_filter`.
#[derive(Default)]
pub struct Ctx {
    pub(super) kind: CallKind,
    /// The screened request: its normalised target and how it is allowed.
    pub(super) target: Option<Screened>,
    pub(super) pool: Option<Arc<Pool>>,
    /// The whole request body, held for routing and for every forwarding attempt.
    pub(super) body: Option<HeldBody>,
    pub(super) scan: request::BodyScan,
    /// The prompt's exact tokens, when the pool has a tokenizer and the body could be counted (filled before
    /// placement; None: estimated from bytes). Placement also reads what each engine holds of its ids by the
    /// engine's KV-cache events.
    pub(super) prompt_tokens: Option<Arc<PromptTokens>>,
    pub(super) session_key: Option<Vec<u8>>,
    /// The engine holding the stored response this request needs (stored_responses): it goes there or nowhere.
    pub(super) pinned: Option<Pinned>,
    /// This request may create a stored response: learn its id from the answer (stored_responses).
    pub(super) stores_response: bool,
    /// Endpoints this request already failed on (ids): later attempts go elsewhere.
    pub(super) tried: Vec<u64>,
    pub(super) endpoint: Option<Arc<Endpoint>>,
    /// The endpoint of the last attempt, kept after a failure so the request is counted against it.
    pub(super) last_endpoint: Option<Arc<Endpoint>>,
    pub(super) placement: Option<Placement>,
    /// Retry this endpoint over a fresh connection (its pooled one went stale), keeping the placement.
    pub(super) fresh_retry: Option<u64>,
    pub(super) fresh_retry_used: bool,
    pub(super) hold: Option<Hold>,
    /// What the current forwarding attempt has seen; a new attempt starts afresh.
    pub(super) attempt: Attempt,
    /// The current attempt was refused (429/503) and is being retried elsewhere.
    pub(super) refused: bool,
    /// An error the router answers with in `fail_to_proxy`.
    pub(super) error: Option<ApiError>,
    /// The status the router answered with itself (counted instead of the absent upstream status).
    pub(super) answered: Option<u16>,
    /// A disaggregated request's prefill leg, once it has served (prefill_leg): the decode leg follows.
    pub(super) prefill: Option<super::prefill_leg::PrefillDone>,
    /// A prefill engine's own error answer (status, body), passed to the client as the engine gave it.
    pub(super) relay: Option<(u16, bytes::Bytes)>,
    /// The request's TTFT budget, in a pool with `ttft_budget` (a generate request that has one).
    pub(super) budget: Option<super::budget::Budget>,
    /// The client key and its concurrency slot (given back when the context drops).
    pub(super) admission: crate::admission::Pass,
    /// Timing and client facts for the access log; its `start` also times `infergate_request_duration_seconds`.
    pub(super) log: crate::access_log::RequestLog,
    /// The request's spans (`tracing` on).
    pub(super) trace: Option<Box<crate::traces::RequestTrace>>,
}

/// The part of the request context that belongs to one forwarding attempt: `upstream_peer` replaces it whole, so
/// nothing of a failed attempt leaks into the next.
#[derive(Debug, Default)]
pub(super) struct Attempt {
    /// The held body was handed to this attempt.
    pub(super) body_sent: bool,
    pub(super) upstream_status: Option<u16>,
    pub(super) dispatched_at: Option<Instant>,
    pub(super) first_byte_seen: bool,
    /// The stream opened with the events an engine sends before its prefill (first_output).
    pub(super) preamble: first_output::Preamble,
    pub(super) first_output_seen: bool,
    /// When the first output passed (a successful answer's), for the measured time to first token.
    pub(super) first_output_at: Option<Instant>,
    /// The id of a stored response this answer creates (stored_responses).
    pub(super) id_capture: crate::stored_responses::IdCapture,
    /// A background Responses request (answered at once, generated afterwards): its hold outlives the answer until
    /// this estimated prefill end.
    pub(super) background_until: Option<Instant>,
    /// A failure the engine owns was counted against this attempt (once per attempt).
    pub(super) failed: bool,
    /// What the first output taught, applied when the request ends without the engine failing it.
    pub(super) learned: Option<Learned>,
    /// A successful stream's chunks from its first output on: its decode speed, learned if it ends well.
    pub(super) timing: super::stream_timing::StreamTiming,
    /// Which of a stream's chunks carry tokens (the timing's weights).
    pub(super) tokens: super::token_events::TokenEvents,
    /// The engine's own count of the stream's output tokens (the timing's scale when events carry several).
    pub(super) reported: super::reported_tokens::ReportedTokens,
    /// A 2xx stream read for an error event the engine owns (stream_error).
    pub(super) stream_errors: super::stream_error::StreamErrors,
    /// The engine ended this 2xx stream with its own error event.
    pub(super) in_band_error: bool,
}

/// A successful stream's prefill as measured at its first output: learned only once the request has ended well
/// (a stream cut after its first chunk teaches nothing).
#[derive(Debug)]
pub(super) struct Learned {
    pub(super) tokens: u64,
    pub(super) ttft: std::time::Duration,
    /// `predicted_ttft`'s prediction and the tokens that were ahead at dispatch.
    pub(super) prediction: Option<(Option<f64>, u64)>,
}

impl Ctx {
    pub(super) fn release_prefill(&self, cause: ReleaseCause) {
        if let Some(h) = &self.hold {
            h.release_prefill(cause);
        }
    }

    pub(super) fn finish_hold(&mut self) {
        if let Some(mut h) = self.hold.take() {
            h.finish();
        }
    }

    pub(super) fn is_stream(&self) -> bool {
        self.scan.stream == Some(true)
    }

    /// The held body's size as its prefill estimate counts it: inline attachments at `prefill.tokens_per_image`.
    pub(super) fn prompt_bytes(&self, prefill: &crate::config::PrefillConfig) -> u64 {
        let body = self.body.as_ref().map_or(0, |b| b.bytes.len() as u64);
        let media = (self.scan.media_bytes, self.scan.media_items);
        crate::placement::prompt_bytes(
            body,
            media,
            prefill.bytes_per_token,
            prefill.tokens_per_image,
        )
    }

    pub(super) fn ticket(&self) -> &Ticket {
        static NONE: Ticket = Ticket::NONE;
        self.placement.as_ref().map_or(&NONE, |p| &p.ticket)
    }
}

/// A request bound to the endpoint holding a stored response.
pub(crate) struct Pinned {
    pub(super) response_id: String,
    pub(super) endpoint: String,
}
