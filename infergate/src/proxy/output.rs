//! The answer's body as it streams: the first byte, a stored response's id, the first output and what it teaches,
//! the chunks after it (decode timing).

use std::time::{Duration, Instant};

use bytes::Bytes;
use pingora_error::Result;

use super::ctx::Learned;
use super::Ctx;
use super::Router;
use crate::ledger::ReleaseCause;

impl Router {
    pub(super) fn on_body_chunk(
        &self,
        body: &mut Option<Bytes>,
        ctx: &mut Ctx,
    ) -> Result<Option<Duration>> {
        let chunk = body.as_deref().unwrap_or_default();
        ctx.log.body_chunk(chunk.len());
        if chunk.is_empty() {
            return Ok(None);
        }
        let mut success = ctx
            .attempt
            .upstream_status
            .is_some_and(|s| (200..300).contains(&s));
        if success
            && ctx.is_stream()
            && !ctx.attempt.failed
            && ctx.attempt.stream_errors.feed(chunk)
        {
            // The engine failed the stream after its headers (stream_error): its failure, no output, nothing
            // learned. The client gets the error event as sent.
            if let (Some(pool), Some(ep)) = (&ctx.pool, &ctx.endpoint) {
                log::warn!(
                    "pool {} endpoint {}: a stream ended with the engine's error event; counted as a failure",
                    pool.name,
                    ep.label
                );
            }
            ctx.attempt.in_band_error = true;
            if let Some(t) = &mut ctx.trace {
                t.attempt_failed("the engine ended the stream with an error event");
            }
            self.record_failure(ctx, "stream_error");
            ctx.release_prefill(ReleaseCause::Aborted);
            success = false;
        }
        // Read once for the first byte and the first output, which usually arrive in the same chunk.
        let mut clock = None;
        if !ctx.attempt.first_byte_seen {
            ctx.attempt.first_byte_seen = true;
            if let (Some(t0), Some(ep), true) = (ctx.attempt.dispatched_at, &ctx.endpoint, success)
            {
                let now = *clock.get_or_insert_with(Instant::now);
                self.metrics
                    .observe_ttfb(ep.series(), now.saturating_duration_since(t0));
            }
        }
        if success && ctx.stores_response {
            if let Some(id) = ctx.attempt.id_capture.feed(chunk) {
                self.remember_response(ctx, id);
            }
        }
        // An error body has no preamble: its first byte ends the hold. A background answer precedes the work.
        let work_follows = success && ctx.attempt.background_until.is_some();
        let timed = success && ctx.is_stream();
        let tokens = if timed {
            ctx.attempt.reported.feed(chunk);
            ctx.attempt.tokens.tokens_in(chunk)
        } else {
            0
        };
        if ctx.attempt.first_output_seen {
            if let (true, Some(ep)) = (timed && tokens > 0, &ctx.endpoint) {
                ctx.attempt
                    .timing
                    .chunk(Instant::now(), ep.load.requests(), tokens);
            }
        } else if !work_follows && (!success || ctx.attempt.preamble.output_in(chunk)) {
            ctx.attempt.first_output_seen = true;
            if success {
                let now = *clock.get_or_insert_with(Instant::now);
                ctx.attempt.first_output_at = Some(now);
                if ctx.is_stream() {
                    ctx.attempt.timing.first_output(now, tokens);
                }
            }
            if let (Some(_), Some(pool), Some(t0), true) = (
                &ctx.prefill,
                &ctx.pool,
                ctx.attempt.dispatched_at,
                success && ctx.is_stream(),
            ) {
                // A decode leg's first output: the KV cache arrived and the first token was decoded.
                self.disagg.observe_transfer(&pool.name, t0.elapsed());
            }
            if let Some(h) = &ctx.hold {
                // A successful stream's first output marks the end of prefill: what it teaches is applied once
                // the request has ended well (`settle`).
                if h.release_prefill(ReleaseCause::FirstByte) && success && ctx.is_stream() {
                    let prediction = ctx.placement.as_ref().and_then(|p| p.ticket.prediction());
                    ctx.attempt.learned = Some(Learned {
                        tokens: h.estimate(),
                        ttft: h.age(),
                        prediction,
                    });
                }
            }
        }
        Ok(None)
    }
}
