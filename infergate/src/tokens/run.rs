//! Counting off the proxy's threads: each count runs on tokio's blocking pool, at most `permits` at once (half
//! the cores: the rest keep proxying), with a bound on the requests waiting for one and on the body size; past
//! either bound the request falls back to bytes at once instead of waiting.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use prometheus::core::Collector;
use tokio::sync::Semaphore;

use super::metrics::TokenMetrics;
use super::{Api, Fallback, ModelTokenizer, PromptTokens};

/// `tokenizer.max_bytes`' default: 4 MiB of body, about a million tokens of English (a few hundred ms of CPU).
pub const DEFAULT_MAX_BYTES: usize = 4 << 20;

/// Requests that may wait for a count, per permit, before more fall back as `busy`.
const WAITING_PER_PERMIT: usize = 8;

/// The router's counting: shared by every pool.
pub struct Tokenizing {
    permits: Arc<Semaphore>,
    /// Requests counting or waiting to.
    waiting: AtomicUsize,
    max_waiting: usize,
    metrics: TokenMetrics,
}

/// Takes a request out of `waiting` when its count ends, however it ends.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Tokenizing {
    /// Counting with `permits` tokenisations at once (None: half the cores, at least one).
    pub fn new(permits: Option<usize>) -> Tokenizing {
        let permits = permits
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() / 2))
            .max(1);
        Tokenizing {
            permits: Arc::new(Semaphore::new(permits)),
            waiting: AtomicUsize::new(0),
            max_waiting: permits * WAITING_PER_PERMIT,
            metrics: TokenMetrics::new(),
        }
    }

    /// The series to register in the router's registry.
    pub fn collectors(&self) -> Vec<Box<dyn Collector>> {
        self.metrics.collectors()
    }

    /// Create pool `name`'s series at 0 (a pool with a tokenizer).
    pub fn add_pool(&self, name: &str) {
        self.metrics.add_pool(name);
    }

    /// The exact prompt tokens of `body` sent to `api` (None: not an API with an exact rule), counted with
    /// `model` on a blocking thread; None, counted as a fallback of pool `pool`, when they cannot be had.
    pub async fn count(
        &self,
        pool: &str,
        model: Arc<ModelTokenizer>,
        api: Option<Api>,
        body: Bytes,
        max_bytes: usize,
    ) -> Option<Arc<PromptTokens>> {
        match self.try_count(pool, model, api, body, max_bytes).await {
            Ok(t) => Some(Arc::new(t)),
            Err(reason) => {
                self.metrics.fallback(pool, reason);
                None
            }
        }
    }

    async fn try_count(
        &self,
        pool: &str,
        model: Arc<ModelTokenizer>,
        api: Option<Api>,
        body: Bytes,
        max_bytes: usize,
    ) -> Result<PromptTokens, Fallback> {
        let api = api.ok_or(Fallback::Unsupported)?;
        if body.len() > max_bytes {
            return Err(Fallback::TooLarge);
        }
        let started = Instant::now();
        if self.waiting.fetch_add(1, Ordering::Relaxed) >= self.max_waiting {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            return Err(Fallback::Busy);
        }
        let _waiting = Waiting(&self.waiting);
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Fallback::Busy)?;
        let counted = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            model.count(api, &body)
        })
        .await
        // The blocking task panicked: the tokenizer failed.
        .unwrap_or(Err(Fallback::Encode));
        self.metrics
            .seconds
            .with_label_values(&[pool])
            .observe(started.elapsed().as_secs_f64());
        if let Ok(t) = &counted {
            self.metrics
                .reused
                .with_label_values(&[pool])
                .inc_by(t.reused);
        }
        counted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::testing::model_dir;

    fn fallbacks(t: &Tokenizing, reason: &str) -> u64 {
        t.metrics.fallbacks.with_label_values(&["p", reason]).get()
    }

    #[tokio::test]
    async fn counts_off_the_async_threads_and_falls_back_past_its_bounds() {
        let t = Tokenizing::new(Some(1));
        t.add_pool("p");
        let model = Arc::new(crate::tokens::load(&model_dir("run")).unwrap());
        let body = Bytes::from_static(br#"{"prompt":"hello world"}"#);
        let got = t
            .count(
                "p",
                model.clone(),
                Some(Api::Completions),
                body.clone(),
                1 << 20,
            )
            .await;
        assert_eq!(got.map(|p| p.ids.clone()), Some(vec![1, 6, 7]));
        assert_eq!(
            t.metrics
                .seconds
                .with_label_values(&["p"])
                .get_sample_count(),
            1
        );

        assert!(t
            .count("p", model.clone(), Some(Api::Completions), body.clone(), 8)
            .await
            .is_none());
        assert_eq!(fallbacks(&t, "too_large"), 1);
        assert!(t
            .count("p", model.clone(), None, body.clone(), 1 << 20)
            .await
            .is_none());
        assert_eq!(fallbacks(&t, "unsupported"), 1);
        let bad = Bytes::from_static(b"{\"messages\": 1}");
        assert!(t
            .count("p", model.clone(), Some(Api::Chat), bad, 1 << 20)
            .await
            .is_none());
        assert_eq!(fallbacks(&t, "body"), 1);

        // Every waiting place taken: the next request does not wait.
        t.waiting.store(t.max_waiting, Ordering::Relaxed);
        assert!(t
            .count("p", model, Some(Api::Completions), body, 1 << 20)
            .await
            .is_none());
        assert_eq!(fallbacks(&t, "busy"), 1);
        assert_eq!(t.waiting.load(Ordering::Relaxed), t.max_waiting);
    }
}
