//! A stream's decode, timed as its chunks pass: from the first output on, the gaps between tokens in a small
//! fixed histogram, and the sequences running on its endpoint at each (our requests in flight there). The
//! per-chunk step is a clock read, an atomic load, a bucket index and two additions (no lock, no allocation; a
//! chunk's lines are also read for their `data:` lines or event names); the sample is made once, when the
//! request has ended well.
//!
//! The sample's time per token is the mean of the gaps within 2.8× of the median (`NEAR_MEDIAN`), not of all
//! gaps: a step that carries a chunk of another request's long prefill is ten times a decode step, and a handful
//! of those would read as a slow engine (twin engines learned decode lines 2× apart on the agent benchmark). Nor
//! is it the median alone: an engine whose steps are not a whole number of its clock's ticks sends one token or
//! two a tick, and the median of that mix is either, up to 30% off. What a prefill does to the streams beside it
//! is priced separately (the cost model's stall term); the decode line is the engine's own step time.
//!
//! Only tokens are timed (token_events): the events that structure a Responses or Messages answer are not. Tokens
//! that arrive together (one read of several events: an engine's write of two tokens, a token held up behind
//! another, or a stream's last token and its usage) are one arrival, and the gap before it is shared among them:
//! they were made during it. Timed one by one, their microsecond gaps made a short stream's median read decode 50
//! times too fast, and an endpoint that served short streams looked far faster than its twin. A stream's last
//! arrival is not timed (its closing chunks). When the engine reports its own output token count and it is more
//! than the events counted (events of several tokens each), the time per token is scaled by it.

use std::time::Instant;

use crate::pool::DecodeSample;

/// Fewer chunks after the first output than this teach nothing about decode speed: two or three gaps are
/// mostly scheduling noise and network jitter.
const MIN_GAPS: u32 = 4;

/// An engine's reported token count more than this many times the tokens counted is not believed.
const MAX_TOKENS_AN_EVENT: u64 = 16;

/// Chunks closer than this are one arrival: far below any engine's decode step (milliseconds on a GPU).
const SAME_ARRIVAL_MICROS: u64 = 100;

/// Histogram buckets per doubling of the gap (about 19% wide each).
const PER_OCTAVE: u32 = 4;
/// Buckets either side of the median's that the time per token averages: 1.5 octaves, 2.8×.
const NEAR_MEDIAN: usize = 6;
/// Gaps from 2^FIRST_OCTAVE µs (16 µs) up to 2^(FIRST_OCTAVE + OCTAVES) µs (16 s); beyond, the end buckets.
const FIRST_OCTAVE: u32 = 4;
const OCTAVES: u32 = 20;
const BUCKETS: usize = (OCTAVES * PER_OCTAVE) as usize;

#[derive(Debug, Clone, Copy)]
pub(super) struct StreamTiming {
    /// When the current arrival began.
    last: Option<Instant>,
    /// The gap before the current arrival, in µs (none for the first tokens).
    before: Option<u64>,
    /// Tokens of the current arrival so far: they share `before` once the next arrival shows it complete.
    together: u32,
    /// Tokens timed.
    gaps: u32,
    /// Sum over those tokens of the endpoint's requests in flight.
    running_sum: u64,
    /// Tokens from the first output on, timed or not: the answer's length.
    tokens: u32,
    /// Gaps by size, log-spaced.
    hist: [u16; BUCKETS],
}

impl Default for StreamTiming {
    fn default() -> Self {
        StreamTiming {
            last: None,
            before: None,
            together: 0,
            gaps: 0,
            running_sum: 0,
            tokens: 0,
            hist: [0; BUCKETS],
        }
    }
}

/// The bucket of a gap of `micros` µs.
fn bucket(micros: u64) -> usize {
    let m = micros.max(1);
    let octave = 63 - m.leading_zeros();
    // The two bits after the leading one: where in the octave.
    let frac = if octave >= 2 {
        (m >> (octave - 2)) & 3
    } else {
        (m << (2 - octave)) & 3
    } as u32;
    let i = (octave.saturating_sub(FIRST_OCTAVE) * PER_OCTAVE + frac) as usize;
    if octave < FIRST_OCTAVE {
        0
    } else {
        i.min(BUCKETS - 1)
    }
}

/// The middle of bucket `i`, in seconds.
fn bucket_seconds(i: usize) -> f64 {
    let octave = FIRST_OCTAVE + i as u32 / PER_OCTAVE;
    let frac = (i as u32 % PER_OCTAVE) as f64 + 0.5;
    (1u64 << octave) as f64 * (1.0 + frac / PER_OCTAVE as f64) / 1e6
}

impl StreamTiming {
    /// The first output chunk, carrying `tokens` (none when it only opens the answer).
    pub(super) fn first_output(&mut self, now: Instant, tokens: u32) {
        self.last = Some(now);
        self.together = tokens;
        self.tokens = tokens;
    }

    /// A later chunk carrying `tokens`, with `running` requests in flight on the endpoint now. A chunk without
    /// tokens (an event that only structures the answer) is not timed.
    pub(super) fn chunk(&mut self, now: Instant, running: u64, tokens: u32) {
        let Some(last) = self.last else { return };
        if tokens == 0 {
            return;
        }
        self.tokens = self.tokens.saturating_add(tokens);
        let gap = now.saturating_duration_since(last).as_micros() as u64;
        if gap < SAME_ARRIVAL_MICROS {
            self.together = self.together.saturating_add(tokens);
            return;
        }
        // The current arrival is complete: its tokens share the gap before it.
        if let (Some(before), n @ 1..) = (self.before, self.together) {
            let b = &mut self.hist[bucket(before / u64::from(n))];
            *b = b.saturating_add(n.min(u32::from(u16::MAX)) as u16);
            self.gaps = self.gaps.saturating_add(n);
            self.running_sum += running * u64::from(n);
        }
        // After an opening without tokens, the first tokens' gap is not a decode step.
        self.before = (self.together > 0).then_some(gap);
        self.together = tokens;
        self.last = Some(now);
    }

    /// The sample, with `elsewhere` sequences on the endpoint that our count does not see (our cluster peers'
    /// and other routers' requests, as last known), and the engine's own count of the output tokens when it
    /// reported one (`reported_tokens`). None for a stream too short to time.
    pub(super) fn sample(&self, elsewhere: u64, reported: Option<u64>) -> Option<DecodeSample> {
        if self.gaps < MIN_GAPS {
            return None;
        }
        let counted: u32 = self.hist.iter().map(|&n| u32::from(n)).sum();
        let mut seen = 0;
        let median = self.hist.iter().position(|&n| {
            seen += u32::from(n);
            2 * seen >= counted
        })?;
        let near = median.saturating_sub(NEAR_MEDIAN)..=(median + NEAR_MEDIAN).min(BUCKETS - 1);
        let (n, sum) =
            self.hist[near.clone()]
                .iter()
                .zip(near)
                .fold((0.0, 0.0), |(n, sum), (&c, i)| {
                    let c = f64::from(c);
                    (n + c, sum + c * bucket_seconds(i))
                });
        let gaps = f64::from(self.gaps);
        // The engine's count, unless it is far from ours (a count of something else). Events that carried
        // several tokens each make every gap several steps: the time per token is scaled by how many more
        // tokens there were than counted. Fewer (a chat stream's role or usage chunk counted) scale nothing.
        let counted = u64::from(self.tokens);
        let reported = reported.filter(|&r| 2 * r >= counted && r <= counted * MAX_TOKENS_AN_EVENT);
        let per_event = reported.map_or(1.0, |r| (r as f64 / counted as f64).max(1.0));
        Some(DecodeSample {
            running: (self.running_sum as f64 / gaps + elsewhere as f64).max(1.0),
            seconds_per_token: sum / n / per_event,
            tokens: reported.unwrap_or(counted),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn buckets_are_log_spaced_and_bounded() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(16), 0);
        assert_eq!(bucket(32), 4);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        for us in [100u64, 3_600, 20_000, 250_000] {
            let mid = bucket_seconds(bucket(us)) * 1e6;
            assert!((mid / us as f64 - 1.0).abs() < 0.1, "{us} µs read as {mid}");
        }
    }

    #[test]
    fn the_gaps_near_the_median_are_the_decode_step_and_a_prefill_stall_is_not() {
        let t0 = Instant::now();
        let mut t = StreamTiming::default();
        // Before the first output nothing is timed.
        t.chunk(t0, 9, 1);
        assert_eq!(t.sample(0, None), None);
        t.first_output(t0, 1);
        let mut at = t0;
        for _ in 0..3 {
            at += Duration::from_millis(20);
            t.chunk(at, 3, 1);
        }
        assert_eq!(t.sample(0, None), None, "three gaps are too few");
        // 20 ms steps, two of them stretched to 200 ms by another request's prefill.
        for gap in [20, 200, 20, 20, 200, 20] {
            at += Duration::from_millis(gap);
            t.chunk(at, 5, 1);
        }
        let s = t.sample(2, None).unwrap();
        assert_eq!(s.tokens, 10);
        assert!((s.seconds_per_token / 0.020 - 1.0).abs() < 0.1, "{s:?}");
        assert!((s.running - (36.0 / 8.0 + 2.0)).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn chunks_that_arrive_together_share_the_gap_before_them() {
        // 10 ms steps, each read carrying two events 5 µs apart, then the last token with usage and [DONE].
        let t0 = Instant::now();
        let mut t = StreamTiming::default();
        t.first_output(t0, 1);
        let mut at = t0;
        for step in 0..6 {
            at += Duration::from_millis(10);
            t.chunk(at, 1, 1);
            at += Duration::from_micros(5);
            t.chunk(at, 1, 1);
            if step == 5 {
                for _ in 0..2 {
                    at += Duration::from_micros(5);
                    t.chunk(at, 1, 1);
                }
            }
        }
        let s = t.sample(0, None).unwrap();
        // Timed one by one, half the gaps were 5 µs and the median read 18 µs a token.
        assert!((s.seconds_per_token / 0.005 - 1.0).abs() < 0.1, "{s:?}");
        // The last arrival (with the closing chunks) is not timed: 10 tokens shared 5 gaps; the answer had 15.
        assert_eq!(s.tokens, 15);
        assert!((s.running - 1.0).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn one_token_or_two_a_tick_reads_their_mean() {
        // 0.9 ms steps sent on a 1.15 ms tick: one token a tick, or two after a tick that skipped.
        let t0 = Instant::now();
        let mut t = StreamTiming::default();
        t.first_output(t0, 1);
        let mut at = t0;
        for tokens in [1, 1, 2, 1, 2, 1, 1, 2, 1, 1, 1, 2, 1] {
            at += Duration::from_micros(1150);
            t.chunk(at, 1, tokens);
        }
        let s = t.sample(0, None).unwrap();
        // The median alone read 0.58 ms; the timed ticks carried 16 tokens in 13.8 ms: 0.86 ms a token.
        assert!((s.seconds_per_token / 0.00086 - 1.0).abs() < 0.1, "{s:?}");
    }

    #[test]
    fn a_token_held_up_behind_another_shares_the_gap_it_was_made_in() {
        // 10 ms steps; the third token is held up and arrives with the fourth.
        let t0 = Instant::now();
        let mut t = StreamTiming::default();
        t.first_output(t0, 1);
        for (ms, tokens) in [
            (10, 1),
            (20, 1),
            (40, 2),
            (50, 1),
            (60, 1),
            (70, 1),
            (80, 1),
        ] {
            t.chunk(t0 + Duration::from_millis(ms), 1, tokens);
        }
        // Every timed token read one step: the late pair shares the two steps before it, not the one after.
        let step = bucket(10_000);
        let timed: Vec<_> = (0..BUCKETS).filter(|&i| t.hist[i] > 0).collect();
        assert_eq!(timed, [step], "{:?}", t.hist);
        assert_eq!(t.hist[step], 7);
        assert_eq!(t.sample(0, None).unwrap().tokens, 9);
    }

    #[test]
    fn chunks_without_tokens_are_not_timed() {
        // A Responses stream: its first output opens the answer, then a content part opens 300 µs later, then
        // 10 ms steps, each token followed 200 µs later by an event that carries none.
        let t0 = Instant::now();
        let mut t = StreamTiming::default();
        t.first_output(t0, 0);
        let mut at = t0 + Duration::from_micros(300);
        t.chunk(at, 1, 0);
        for _ in 0..6 {
            at += Duration::from_millis(10);
            t.chunk(at, 1, 1);
            t.chunk(at + Duration::from_micros(200), 1, 0);
        }
        let s = t.sample(0, None).unwrap();
        assert!((s.seconds_per_token / 0.010 - 1.0).abs() < 0.1, "{s:?}");
        assert_eq!(s.tokens, 6);
        // Two tokens in one chunk share its gap.
        let mut t = StreamTiming::default();
        t.first_output(t0, 1);
        let mut at = t0;
        for _ in 0..5 {
            at += Duration::from_millis(10);
            t.chunk(at, 1, 2);
        }
        let s = t.sample(0, None).unwrap();
        assert!((s.seconds_per_token / 0.005 - 1.0).abs() < 0.1, "{s:?}");
        assert_eq!(s.tokens, 11);
    }

    #[test]
    fn the_engines_count_scales_events_that_carried_several_tokens() {
        // Eight events 15 ms apart, each of three tokens (vLLM's API server behind its engine): 5 ms a token.
        let t0 = Instant::now();
        let mut t = StreamTiming::default();
        t.first_output(t0, 1);
        for i in 1..8 {
            t.chunk(t0 + Duration::from_millis(15 * i), 4, 1);
        }
        let per_event = t.sample(0, None).unwrap();
        assert!((per_event.seconds_per_token / 0.015 - 1.0).abs() < 0.1);
        let s = t.sample(0, Some(24)).unwrap();
        assert!((s.seconds_per_token / 0.005 - 1.0).abs() < 0.1, "{s:?}");
        assert_eq!((s.tokens, s.running), (24, 4.0));
        // Fewer than counted (a role or usage chunk counted as a token): the length is the engine's, the time
        // per token ours.
        let s = t.sample(0, Some(7)).unwrap();
        assert_eq!(s.tokens, 7);
        assert_eq!(s.seconds_per_token, per_event.seconds_per_token);
        // A count far from ours is of something else.
        for wrong in [0, 3, 8 * 16 + 1] {
            assert_eq!(t.sample(0, Some(wrong)), Some(per_event), "{wrong}");
        }
    }
}
