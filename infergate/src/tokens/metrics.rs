//! The series counting produces: its time per pool and the fallbacks to bytes by reason. Defined here with the
//! `prometheus` crate and registered by the router that counts (`Tokenizing::collectors`).

use prometheus::core::Collector;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts};

use super::Fallback;

/// 100 µs to 2.5 s: a chat turn of a few hundred tokens to a 500k-token prompt on a busy machine.
const BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

#[derive(Clone)]
pub(super) struct TokenMetrics {
    pub(super) seconds: HistogramVec,
    pub(super) fallbacks: IntCounterVec,
    pub(super) reused: IntCounterVec,
}

impl TokenMetrics {
    pub(super) fn new() -> TokenMetrics {
        TokenMetrics {
            seconds: HistogramVec::new(
                HistogramOpts::new(
                    "infergate_tokenizer_seconds",
                    "Time a request waited for its exact prompt token count (rendering its chat template and \
                     tokenising, on a blocking thread, plus the wait for one), per pool with a tokenizer.",
                )
                .buckets(BUCKETS.to_vec()),
                &["pool"],
            )
            .expect("static metric definition"),
            fallbacks: IntCounterVec::new(
                Opts::new(
                    "infergate_tokenizer_fallbacks_total",
                    "Requests of a pool with a tokenizer whose prompt tokens were estimated from bytes instead, by \
                     reason (body, media, unsupported, template, encode, too_large, busy).",
                ),
                &["pool", "reason"],
            )
            .expect("static metric definition"),
            reused: IntCounterVec::new(
                Opts::new(
                    "infergate_tokenizer_reused_tokens_total",
                    "Prompt tokens of a chat taken from an earlier turn's count instead of tokenised again (the \
                     turn's prompt starts with that turn's, up to a special token), per pool with a tokenizer.",
                ),
                &["pool"],
            )
            .expect("static metric definition"),
        }
    }

    pub(super) fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.seconds.clone()),
            Box::new(self.fallbacks.clone()),
            Box::new(self.reused.clone()),
        ]
    }

    /// Create pool `name`'s series at 0.
    pub(super) fn add_pool(&self, name: &str) {
        self.seconds.with_label_values(&[name]);
        self.reused.with_label_values(&[name]);
        for r in Fallback::ALL {
            self.fallbacks.with_label_values(&[name, r.as_str()]);
        }
    }

    pub(super) fn fallback(&self, pool: &str, reason: Fallback) {
        self.fallbacks
            .with_label_values(&[pool, reason.as_str()])
            .inc();
    }
}
