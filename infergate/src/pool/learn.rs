//! What a finished stream teaches its pool: the endpoint's prefill and decode speeds, the pool's typical answer
//! length, the drift of its speed from what was predicted, and whether that makes it a speed outlier (judged
//! against its own recent history and the pool's median, logged on entering and leaving).
//!
//! A judgement needs evidence of the endpoint itself: only its own stream judges it (another endpoint's stream
//! judging it again would count one old sample as several), and its prefill is compared with the pool's only
//! once it has served a prompt its prefill line is learned from (`PrefillSpeed::MIN_OWN_TOKENS`): a line from
//! short prompts alone is mostly overhead, and extrapolated to the reference size it read twin engine-sim
//! engines 3 to 7 times apart after a single 23-token prompt. Nor is a prompt far smaller or larger than those a
//! prefill line was learned on held against it (`PREDICTION_RANGE`).

use std::time::{Duration, Instant};

use super::drift::{against_pool, Turn, DECODE_NOISE, PREFILL_NOISE};
use super::{decode_lines, ttft_lines, Endpoint, Pool};

/// Prefill work the pool's endpoints are compared on (tokens).
const REF_PREFILL_TOKENS: f64 = 8_192.0;

/// Batch size the pool's decode speeds are compared at (sequences).
const REF_RUNNING: f64 = 8.0;

/// A prefill line's prediction is held against a sample only within this factor of the mean prompt size it was
/// learned on: a line through the origin learned on 16k-token prompts predicts 27 µs for a 32-token prompt that
/// takes the fixed ~2 ms every answer takes, a drift of 100× that says nothing about the engine's speed.
const PREDICTION_RANGE: f64 = 8.0;

/// A stream's first output, measured.
#[derive(Debug, Clone, Copy)]
pub struct PrefillSample {
    /// The request's own estimated prefill tokens.
    pub tokens: u64,
    /// Prefill tokens ahead of it at dispatch, when the policy counted them (`predicted_ttft`).
    pub ahead: Option<u64>,
    pub ttft: Duration,
}

/// A stream's decode, measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeSample {
    /// Sequences running beside it on average, itself included.
    pub running: f64,
    pub seconds_per_token: f64,
    /// Its answer length: tokens from the first output on (a chat or completions stream's chunks).
    pub tokens: u64,
}

impl Pool {
    /// Learn from a stream that ended without the engine failing it (`decode` only when it ended well).
    pub fn learn_stream(
        &self,
        ep: &Endpoint,
        prefill: Option<PrefillSample>,
        decode: Option<DecodeSample>,
        now: Instant,
    ) {
        log::debug!(
            "pool {} endpoint {}: stream learned: prefill {prefill:?}, decode {decode:?}",
            self.name,
            ep.label
        );
        if let Some(p) = prefill {
            let ttft = p.ttft.as_secs_f64();
            // Against the endpoint's own line before it learns from this sample, within the sizes it was learned on.
            let (size, predicted, learned_on) = match p.ahead {
                Some(ahead) => {
                    let size = ahead.saturating_add(p.tokens) as f64;
                    let fit = ep.prefill_speed.throughput_fit();
                    (
                        size,
                        fit.fitted().map(|f| f.seconds(size)),
                        fit.mean_tokens(),
                    )
                }
                None => (
                    p.tokens as f64,
                    ep.prefill_speed.estimate(p.tokens).map(|d| d.as_secs_f64()),
                    ep.prefill_speed.own_mean_tokens(),
                ),
            };
            let within = learned_on
                .is_some_and(|m| size * PREDICTION_RANGE >= m && size <= m * PREDICTION_RANGE);
            if let Some(predicted) = predicted.filter(|_| within) {
                ep.drift.observe_prefill(ttft, predicted, now);
            }
            ep.prefill_speed.observe(p.tokens, p.ttft);
            if let Some(ahead) = p.ahead {
                ep.prefill_speed
                    .observe_throughput(ahead.saturating_add(p.tokens), p.ttft);
            }
        }
        if let Some(d) = decode {
            if let Some(line) = ep.decode_speed.fit().line() {
                ep.drift
                    .observe_decode(d.seconds_per_token, line.at(d.running), now);
            }
            ep.decode_speed.observe(d.running, d.seconds_per_token);
            self.answers.observe(d.tokens);
        }
        self.judge_speed(ep, now);
    }

    /// Judge `judged`'s speed against its own recent history and the pool's median; log if it entered or left
    /// the speed outliers.
    fn judge_speed(&self, judged: &Endpoint, now: Instant) {
        let endpoints = self.endpoints();
        let corrections: Vec<_> = endpoints.iter().map(|e| e.drift.current(now)).collect();
        let prefill: Vec<Option<f64>> = ttft_lines(&endpoints)
            .iter()
            .zip(endpoints.iter())
            .zip(&corrections)
            .map(|((line, e), c)| {
                let own = || {
                    e.prefill_speed
                        .estimate(REF_PREFILL_TOKENS as u64)
                        .map(|d| d.as_secs_f64())
                };
                line.map(|l| l.seconds(REF_PREFILL_TOKENS))
                    .or_else(own)
                    .map(|t| t * c.prefill)
                    // Only with a prompt of its own behind it: a line from short prompts alone is overhead.
                    .filter(|_| e.prefill_speed.tokens_per_sec().is_some())
            })
            .collect();
        let decode: Vec<Option<f64>> = decode_lines(&endpoints)
            .iter()
            .zip(&corrections)
            .map(|(line, c)| line.map(|l| l.at(REF_RUNNING) * c.decode))
            .collect();
        let (p, d) = (
            against_pool(&prefill, PREFILL_NOISE),
            against_pool(&decode, DECODE_NOISE),
        );
        for (i, e) in endpoints.iter().enumerate() {
            if !std::ptr::eq(&**e, judged) {
                continue;
            }
            let lately = e.drift.lately(now);
            let relative = lately.min(p[i]).min(d[i]);
            log::debug!(
                "pool {} endpoint {}: speed judged at {relative:.2} (own recent {lately:.2}, pool prefill {:.2}, pool decode {:.2})",
                self.name,
                e.label,
                p[i],
                d[i]
            );
            match e.drift.judge(relative) {
                Some(Turn::Entered(r)) => log::warn!(
                    "pool {} endpoint {}: speed outlier, at {:.0}% of its recent speed or the pool's; it gets less new work until it recovers",
                    self.name,
                    e.label,
                    r * 100.0
                ),
                Some(Turn::Left(r)) => log::info!(
                    "pool {} endpoint {}: no longer a speed outlier ({:.0}% of its recent speed or the pool's)",
                    self.name,
                    e.label,
                    r * 100.0
                ),
                None => {}
            }
        }
    }
}
