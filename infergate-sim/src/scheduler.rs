//! The per-engine scheduler: vLLM V1-style continuous batching with chunked prefill and a prefix cache.
//!
//! Each step has a token budget (`step_token_budget`). Decoding requests (prefill done) take one token each
//! first; the rest goes to prefill chunks of running requests in arrival order; if budget remains and fewer than
//! `max_num_seqs` requests run, waiting requests are admitted in FIFO order (a prefix-cache lookup on admission)
//! and get a chunk in the same step. A step lasts `step_overhead + prefill work / prefill_tokens_per_sec +
//! decoding * decode_step_cost_per_seq` (times `time_scale`), the prefill work being its prefill tokens, each
//! weighed by its context position with `attention_context_tokens` (`SimConfig::prefill_work`); its effects
//! (tokens, prefill progress, cached blocks) apply when it ends. The step completing a prefill also samples the
//! first output token.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use super::cache::PrefixCache;
use super::config::SimConfig;
use super::tokenize::PromptTokens;

/// A request handed to the scheduler.
pub struct SchedRequest {
    pub prompt: PromptTokens,
    pub max_tokens: usize,
    /// Prompt tokens whose KV cache arrived from a prefill engine (a decode leg): not computed here.
    pub external_tokens: usize,
    /// Output tokens go here; dropping the receiver aborts the request (frees its slot), like vLLM on disconnect.
    pub tx: mpsc::UnboundedSender<TokenEvent>,
}

/// One generated token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenEvent {
    /// 0 for the first token (sent when prefill completes).
    pub index: usize,
    /// True on the request's last token.
    pub finished: bool,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

/// Counters and gauges of one engine, as published after every step.
#[derive(Debug, Clone, Default)]
pub struct SchedCounters {
    pub prompt_tokens: u64,
    pub computed_prompt_tokens: u64,
    pub cached_prompt_tokens: u64,
    /// Prompt tokens whose KV cache came from a prefill engine.
    pub external_prompt_tokens: u64,
    pub generation_tokens: u64,
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub finished: u64,
    pub aborted: u64,
    pub steps: u64,
    pub busy: Duration,
    pub running: usize,
    /// Admission queue length (not counting requests still in the channel).
    pub waiting: usize,
    pub kv_tokens: usize,
    pub cached_blocks: usize,
}

/// What the HTTP side reads: the published counters plus requests sent but not yet taken off the channel.
#[derive(Default)]
pub struct SchedShared {
    pub counters: Mutex<SchedCounters>,
    pub pending: AtomicUsize,
}

impl SchedShared {
    pub fn snapshot(&self) -> SchedCounters {
        let mut c = self.counters.lock().unwrap().clone();
        c.waiting += self.pending.load(Ordering::Relaxed);
        c
    }

    /// Counts a request about to be sent to the scheduler as pending, unless `limit` requests already wait
    /// (published waiting + pending); then returns false. Checked and counted under the counters lock, which
    /// `taken` holds too, so a request is always in one of the two counts and concurrent arrivals cannot
    /// overshoot the limit.
    pub fn try_reserve(&self, limit: Option<usize>) -> bool {
        let c = self.counters.lock().unwrap();
        if limit.is_some_and(|l| c.waiting + self.pending.load(Ordering::Relaxed) >= l) {
            return false;
        }
        self.pending.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Undoes `try_reserve` for a request that was not sent.
    pub fn unreserve(&self) {
        self.pending.fetch_sub(1, Ordering::Relaxed);
    }

    /// The scheduler took a pending request off the channel into its queue: it counts as waiting until the
    /// next publish replaces the counters with the queue's own.
    fn taken(&self) {
        let mut c = self.counters.lock().unwrap();
        c.waiting += 1;
        self.pending.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Seq {
    prompt: PromptTokens,
    max_tokens: usize,
    /// Prompt tokens whose KV cache a prefill engine sent.
    external: usize,
    /// Prompt tokens whose KV exists (cache hits included).
    computed: usize,
    cached: usize,
    generated: usize,
    /// Tokens scheduled in the current step.
    scheduled: usize,
    tx: mpsc::UnboundedSender<TokenEvent>,
}

impl Seq {
    fn prefill_done(&self) -> bool {
        self.computed >= self.prompt.len
    }
}

/// The scheduler's state machine, free of I/O and clocks (the driver sleeps between `schedule` and `apply`).
pub struct Core {
    cfg: SimConfig,
    cache: PrefixCache,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    pub counters: SchedCounters,
    /// KV-cache events since the last flush, when the engine publishes them.
    pub kv_events: Option<Vec<crate::kv_events::KvEvent>>,
}

/// Cache `hashes[from..to]` of a prompt, recording what was stored and evicted as KV events.
fn cache_blocks(
    cache: &mut PrefixCache,
    out: &mut Option<Vec<crate::kv_events::KvEvent>>,
    hashes: &[u64],
    from: usize,
    to: usize,
    block_size: usize,
) {
    use crate::kv_events::KvEvent;
    let t = cache.touch(&hashes[from..to]);
    let Some(out) = out else { return };
    if !t.evicted.is_empty() {
        out.push(KvEvent::Removed { hashes: t.evicted });
    }
    // One BlockStored per run of consecutive new blocks, its parent the block before the run.
    let mut i = 0;
    while i < t.stored.len() {
        let start = t.stored[i];
        let mut end = start + 1;
        while i + 1 < t.stored.len() && t.stored[i + 1] == end {
            i += 1;
            end += 1;
        }
        let at = from + start;
        out.push(KvEvent::Stored {
            hashes: hashes[at..from + end].to_vec(),
            parent: at.checked_sub(1).map(|p| hashes[p]),
            block_size,
        });
        i += 1;
    }
}

impl Core {
    pub fn new(cfg: SimConfig) -> Self {
        let blocks = cfg.kv_capacity_tokens / cfg.block_tokens.max(1);
        Core {
            cache: PrefixCache::new(blocks),
            cfg,
            waiting: VecDeque::new(),
            running: Vec::new(),
            counters: Default::default(),
            kv_events: None,
        }
    }

    pub fn enqueue(&mut self, r: SchedRequest) {
        self.waiting.push_back(Seq {
            prompt: r.prompt,
            max_tokens: r.max_tokens.max(1),
            external: r.external_tokens,
            computed: 0,
            cached: 0,
            generated: 0,
            scheduled: 0,
            tx: r.tx,
        });
        self.refresh_gauges();
    }

    /// Drops requests whose client went away.
    pub fn reap(&mut self) {
        let before = self.running.len() + self.waiting.len();
        self.running.retain(|s| !s.tx.is_closed());
        self.waiting.retain(|s| !s.tx.is_closed());
        self.counters.aborted += (before - self.running.len() - self.waiting.len()) as u64;
        self.refresh_gauges();
    }

    fn kv_used(&self) -> usize {
        self.running
            .iter()
            .map(|s| s.computed + s.scheduled + s.generated)
            .sum()
    }

    /// Plans the next step; returns its unscaled duration, or None when there is no work.
    pub fn schedule(&mut self) -> Option<Duration> {
        if self.running.is_empty() && self.waiting.is_empty() {
            return None;
        }
        let mut budget = self.cfg.step_token_budget;
        let mut decoding = 0;
        let mut prefill = 0;
        let mut work = 0.0;
        for s in self.running.iter_mut() {
            s.scheduled = 0;
            if s.prefill_done() && budget > 0 {
                s.scheduled = 1;
                budget -= 1;
                decoding += 1;
            }
        }
        for s in self.running.iter_mut() {
            if !s.prefill_done() {
                let n = (s.prompt.len - s.computed).min(budget);
                s.scheduled = n;
                budget -= n;
                prefill += n;
                work += self.cfg.prefill_work(s.computed, n);
            }
        }
        let bt = self.cfg.block_tokens;
        while budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let Some(front) = self.waiting.front() else {
                break;
            };
            if !self.running.is_empty()
                && self.kv_used() + front.prompt.len > self.cfg.kv_capacity_tokens
            {
                break;
            }
            let mut s = self.waiting.pop_front().unwrap();
            // Like vLLM, the last prompt token is always computed, so a full hit still leaves work.
            let hit_blocks = self
                .cache
                .match_len(&s.prompt.block_hashes)
                .min((s.prompt.len - 1) / bt);
            cache_blocks(
                &mut self.cache,
                &mut self.kv_events,
                &s.prompt.block_hashes,
                0,
                hit_blocks,
                bt,
            );
            s.cached = hit_blocks * bt;
            // What a prefill engine sent is there too, less the last token (computed here, as in vLLM).
            s.external = s.external.min(s.prompt.len - 1).saturating_sub(s.cached);
            s.computed = s.cached + s.external;
            self.counters.prefix_cache_queries += s.prompt.len as u64;
            self.counters.prefix_cache_hits += s.cached as u64;
            let n = (s.prompt.len - s.computed).min(budget);
            s.scheduled = n;
            budget -= n;
            prefill += n;
            work += self.cfg.prefill_work(s.computed, n);
            self.running.push(s);
        }
        self.refresh_gauges();
        if prefill == 0 && decoding == 0 {
            // Waiting requests blocked on KV with nothing running cannot happen (admission ignores KV then),
            // so this only occurs with a zero budget, which `sanitized` prevents.
            return None;
        }
        Some(self.cfg.step_duration(work, decoding))
    }

    /// Applies the planned step: prefill progress and cached blocks, one token per scheduled decode, finishes.
    pub fn apply(&mut self, step_time: Duration) {
        self.counters.steps += 1;
        self.counters.busy += step_time;
        let bt = self.cfg.block_tokens;
        let mut i = 0;
        while i < self.running.len() {
            let s = &mut self.running[i];
            let n = std::mem::take(&mut s.scheduled);
            let mut emit = false;
            if n > 0 {
                if !s.prefill_done() {
                    let before_blocks = s.computed / bt;
                    s.computed += n;
                    // vLLM caches each block as soon as it is full, so an aborted prefill still leaves its blocks.
                    let full = (s.computed / bt).min(s.prompt.block_hashes.len());
                    if full > before_blocks {
                        cache_blocks(
                            &mut self.cache,
                            &mut self.kv_events,
                            &s.prompt.block_hashes,
                            before_blocks,
                            full,
                            bt,
                        );
                    }
                    if s.prefill_done() {
                        // Once, at the end: the whole prompt becomes most recent, its head most of all.
                        let all = s.prompt.block_hashes.len();
                        cache_blocks(
                            &mut self.cache,
                            &mut self.kv_events,
                            &s.prompt.block_hashes,
                            0,
                            all,
                            bt,
                        );
                        self.counters.prompt_tokens += s.prompt.len as u64;
                        self.counters.cached_prompt_tokens += s.cached as u64;
                        self.counters.computed_prompt_tokens +=
                            (s.prompt.len - s.cached - s.external) as u64;
                        self.counters.external_prompt_tokens += s.external as u64;
                        emit = true;
                    }
                } else {
                    emit = true;
                }
            }
            let mut remove = false;
            if emit {
                let ev = TokenEvent {
                    index: s.generated,
                    finished: s.generated + 1 >= s.max_tokens,
                    cached_tokens: s.cached,
                };
                s.generated += 1;
                self.counters.generation_tokens += 1;
                if s.tx.send(ev).is_err() {
                    self.counters.aborted += 1;
                    remove = true;
                } else if ev.finished {
                    self.counters.finished += 1;
                    remove = true;
                }
            }
            if remove {
                self.running.remove(i);
            } else {
                i += 1;
            }
        }
        self.refresh_gauges();
    }

    fn refresh_gauges(&mut self) {
        self.counters.running = self.running.len();
        self.counters.waiting = self.waiting.len();
        self.counters.kv_tokens = self.kv_used();
        self.counters.cached_blocks = self.cache.len();
    }

    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }
}

/// The scheduler task of one engine: runs steps while work exists, sleeping (tokio time) through each step.
pub async fn run(
    cfg: SimConfig,
    mut rx: mpsc::UnboundedReceiver<SchedRequest>,
    shared: Arc<SchedShared>,
    kv_events: Option<mpsc::UnboundedSender<Vec<crate::kv_events::KvEvent>>>,
    control: Arc<crate::control::Control>,
) {
    let scale = cfg.time_scale;
    // The configured mid-run change of speed, due once the first request has been taken.
    let mut change = cfg.speed_change;
    let mut change_at: Option<tokio::time::Instant> = None;
    let mut core = Core::new(cfg);
    if kv_events.is_some() {
        core.kv_events = Some(Vec::new());
    }
    let flush = |core: &mut Core| {
        if let (Some(tx), Some(buf)) = (&kv_events, core.kv_events.as_mut()) {
            if !buf.is_empty() {
                let _ = tx.send(std::mem::take(buf));
            }
        }
    };
    // End of the previous step: steps are chained on this deadline so timer rounding does not accumulate.
    let mut last_deadline: Option<tokio::time::Instant> = None;
    let publish = |core: &Core| *shared.counters.lock().unwrap() = core.counters.clone();
    loop {
        while let Ok(r) = rx.try_recv() {
            shared.taken();
            core.enqueue(r);
        }
        core.reap();
        let scheduled = core.schedule();
        flush(&mut core);
        let Some(step) = scheduled else {
            publish(&core);
            last_deadline = None;
            match rx.recv().await {
                Some(r) => {
                    shared.taken();
                    core.enqueue(r);
                    continue;
                }
                None => return,
            }
        };
        publish(&core);
        let now = tokio::time::Instant::now();
        if let Some((after, speed)) = change {
            let at = *change_at.get_or_insert(now + after.mul_f64(scale));
            if now >= at {
                control.set_speed(speed);
                change = None;
            }
        }
        let scaled = step.mul_f64(scale / control.speed());
        let base = match last_deadline {
            Some(d) if now.saturating_duration_since(d) < Duration::from_millis(20) => d,
            _ => now,
        };
        let deadline = base + scaled;
        if scaled.is_zero() {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep_until(deadline).await;
        }
        last_deadline = Some(deadline);
        core.apply(scaled);
        flush(&mut core);
        publish(&core);
        debug_assert!(core.counters.running <= core.cfg.max_num_seqs || core.is_idle());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::BlockHasher;

    #[test]
    fn reserve_respects_the_waiting_limit() {
        let s = SchedShared::default();
        assert!(s.try_reserve(Some(2)) && s.try_reserve(Some(2)));
        assert!(!s.try_reserve(Some(2)));
        // Moved from the channel into the queue: still counted until the next publish.
        s.taken();
        assert!(!s.try_reserve(Some(2)));
        assert_eq!(s.snapshot().waiting, 2);
        s.unreserve();
        assert!(s.try_reserve(Some(2)));
        assert!(s.try_reserve(None), "no limit");
        assert_eq!(s.snapshot().waiting, 3);
    }

    fn prompt(len: usize, seed: u64, bt: usize) -> PromptTokens {
        let mut h = BlockHasher::new(bt);
        for i in 0..len {
            h.push(seed.wrapping_mul(1_000_003).wrapping_add(i as u64));
        }
        h.finish()
    }

    fn req(
        len: usize,
        seed: u64,
        max_tokens: usize,
    ) -> (SchedRequest, mpsc::UnboundedReceiver<TokenEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            SchedRequest {
                prompt: prompt(len, seed, 16),
                max_tokens,
                external_tokens: 0,
                tx,
            },
            rx,
        )
    }

    /// Runs the core on a virtual clock until every receiver saw its last token; returns (time of first token,
    /// time of last token) per request.
    fn simulate(
        core: &mut Core,
        rxs: &mut [mpsc::UnboundedReceiver<TokenEvent>],
    ) -> Vec<(Duration, Duration)> {
        let mut now = Duration::ZERO;
        let mut out = vec![(Duration::MAX, Duration::ZERO); rxs.len()];
        while let Some(d) = core.schedule() {
            now += d;
            core.apply(d);
            for (i, rx) in rxs.iter_mut().enumerate() {
                while let Ok(ev) = rx.try_recv() {
                    if ev.index == 0 {
                        out[i].0 = now;
                    }
                    if ev.finished {
                        out[i].1 = now;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn calibration_cold_140k_prefill_takes_about_3_5_s() {
        let mut core = Core::new(SimConfig::default());
        let (r, rx) = req(140_000, 1, 1);
        core.enqueue(r);
        let t = simulate(&mut core, &mut [rx]);
        let ttft = t[0].0.as_secs_f64();
        assert!((3.3..=3.7).contains(&ttft), "ttft {ttft}");
        assert_eq!(core.counters.steps, 18);
        assert_eq!(core.counters.computed_prompt_tokens, 140_000);
    }

    #[test]
    fn calibration_decode_rates() {
        for (batch, lo, hi) in [(1usize, 50.0, 60.0), (32, 33.0, 45.0), (64, 25.0, 35.0)] {
            let mut core = Core::new(SimConfig::default());
            let mut rxs = Vec::new();
            for i in 0..batch {
                let (r, rx) = req(100, i as u64, 201);
                core.enqueue(r);
                rxs.push(rx);
            }
            let t = simulate(&mut core, &mut rxs);
            // 200 decode tokens after the first.
            let rate = 200.0 / (t[0].1 - t[0].0).as_secs_f64();
            assert!((lo..=hi).contains(&rate), "batch {batch}: {rate} tok/s");
        }
    }

    /// Time to first token of each prompt, served alone and in order, on an engine with `k`.
    fn ttfts(k: Option<f64>, prompts: &[(usize, u64)]) -> Vec<f64> {
        let cfg = SimConfig {
            attention_context_tokens: k,
            step_overhead: Duration::ZERO,
            ..SimConfig::default()
        };
        let mut core = Core::new(cfg);
        let mut out = Vec::new();
        for &(len, seed) in prompts {
            let (r, mut rx) = req(len, seed, 1);
            core.enqueue(r);
            out.push(
                simulate(&mut core, std::slice::from_mut(&mut rx))[0]
                    .0
                    .as_secs_f64(),
            );
        }
        out
    }

    #[test]
    fn attention_makes_long_prompts_and_long_contexts_slower_per_token() {
        let close = |a: f64, b: f64| (a - b).abs() <= 0.01 * b;
        // Off: a line. A K that is not a positive number is off too.
        for k in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let cfg = SimConfig {
                attention_context_tokens: Some(k),
                ..SimConfig::default()
            };
            assert_eq!(cfg.sanitized().attention_context_tokens, None, "{k}");
        }
        let t = ttfts(None, &[(2_000, 1), (16_000, 2)]);
        assert!(close(t[1] / t[0], 8.0), "{t:?}");
        // K = 1,000: a cold prefill of L costs L + L²/2K tokens' worth: 4,000 for 2k, 144,000 for 16k (36x, not 8x).
        let t = ttfts(Some(1_000.0), &[(2_000, 1), (16_000, 2)]);
        assert!(close(t[0], 4_000.0 / 44_000.0), "{t:?}");
        assert!(close(t[1] / t[0], 36.0), "{t:?}");
        // A follow-up: 512 new tokens after 15,360 cached cost 512 (1 + (15,360 + 255.5) / 1,000) tokens' worth,
        // 16.6 times as much as the same 512 tokens opening a conversation: the new tokens attend to the context.
        let t = ttfts(Some(1_000.0), &[(15_360, 3), (15_872, 3), (512, 4)]);
        let follow = 512.0 * (1.0 + (15_360.0 + 255.5) / 1_000.0) / 44_000.0;
        assert!(close(t[1], follow), "{t:?} {follow}");
        assert!(
            close(
                t[1] / t[2],
                (1.0 + 15_615.5 / 1_000.0) / (1.0 + 255.5 / 1_000.0)
            ),
            "{t:?}"
        );
    }

    #[test]
    fn repeated_prompt_hits_cache() {
        let mut core = Core::new(SimConfig::default());
        let (r1, rx1) = req(10_000, 7, 2);
        core.enqueue(r1);
        simulate(&mut core, &mut [rx1]);
        let (r2, mut rx2) = req(10_000, 7, 2);
        core.enqueue(r2);
        let t = simulate(&mut core, std::slice::from_mut(&mut rx2));
        assert!(t[0].0 < Duration::from_millis(60), "warm ttft {:?}", t[0].0);
        let c = &core.counters;
        assert_eq!(c.prompt_tokens, 20_000);
        assert_eq!(c.cached_prompt_tokens, 9_984); // 624 blocks of 16; the last token is always computed
        assert_eq!(c.computed_prompt_tokens, 10_016);
        assert_eq!(c.prefix_cache_hits, 9_984);
        assert_eq!(c.prefix_cache_queries, 20_000);
        assert_eq!(c.finished, 2);
    }

    #[test]
    fn max_num_seqs_queues_and_budget_blocks_admission() {
        let cfg = SimConfig {
            max_num_seqs: 2,
            ..SimConfig::default()
        };
        let mut core = Core::new(cfg);
        let mut rxs = Vec::new();
        for i in 0..4 {
            let (r, rx) = req(10, i, 5);
            core.enqueue(r);
            rxs.push(rx);
        }
        core.schedule().unwrap();
        assert_eq!((core.counters.running, core.counters.waiting), (2, 2));
        // A long prefill consumes the whole budget: a later arrival stays waiting.
        let mut core = Core::new(SimConfig::default());
        let (r, _rx1) = req(100_000, 1, 1);
        core.enqueue(r);
        let (r, _rx2) = req(10, 2, 1);
        core.enqueue(r);
        core.schedule().unwrap();
        assert_eq!((core.counters.running, core.counters.waiting), (1, 1));
    }

    #[test]
    fn dropped_receiver_aborts() {
        let mut core = Core::new(SimConfig::default());
        let (r, rx) = req(1000, 1, 100);
        core.enqueue(r);
        core.schedule().unwrap();
        core.apply(Duration::ZERO);
        assert_eq!(core.counters.running, 1);
        drop(rx);
        core.reap();
        assert_eq!(core.counters.running, 0);
        assert_eq!(core.counters.aborted, 1);
        assert!(core.schedule().is_none());
    }
}
