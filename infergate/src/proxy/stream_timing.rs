//! A stream's decode, timed as its chunks pass: from the first output on, the gaps between chunks in a small
//! fixed histogram, and the sequences running on its endpoint at each (our requests in flight there). The
//! per-chunk step is a clock read, an atomic load, a bucket index and two additions (no lock, no allocation); the
//! sample is made once, when the request has ended well.
//!
//! The sample's time per token is the median gap, not the mean: a step that carries a chunk of another request's
//! long prefill is ten times a decode step, and a handful of those would read as a slow engine (twin engines
//! learned decode lines 2× apart on the agent benchmark). What a prefill does to the streams beside it is priced
//! separately (the cost model's stall term); the decode line is the engine's own step time.
//!
//! Chunks that arrive together (one read of several events: an engine's write of two tokens, or a stream's last
//! token, usage and `[DONE]`) are one arrival: the gap to the next is shared among its chunks. Timed one by one,
//! their microsecond gaps made a short stream's median read decode 50 times too fast, and an endpoint that served
//! short streams looked far faster than its twin.

use std::time::Instant;

use crate::pool::DecodeSample;

/// Fewer chunks after the first output than this teach nothing about decode speed: two or three gaps are
/// mostly scheduling noise and network jitter.
const MIN_GAPS: u32 = 4;

/// Chunks closer than this are one arrival: far below any engine's decode step (milliseconds on a GPU).
const SAME_ARRIVAL_MICROS: u64 = 100;

/// Histogram buckets per doubling of the gap (about 19% wide each).
const PER_OCTAVE: u32 = 4;
/// Gaps from 2^FIRST_OCTAVE µs (16 µs) up to 2^(FIRST_OCTAVE + OCTAVES) µs (16 s); beyond, the end buckets.
const FIRST_OCTAVE: u32 = 4;
const OCTAVES: u32 = 20;
const BUCKETS: usize = (OCTAVES * PER_OCTAVE) as usize;

#[derive(Debug, Clone, Copy)]
pub(super) struct StreamTiming {
    last: Option<Instant>,
    /// Chunks after the first output.
    gaps: u32,
    /// Sum over those chunks of the endpoint's requests in flight.
    running_sum: u64,
    /// Chunks that arrived with the last one, not yet timed.
    together: u32,
    /// Gaps by size, log-spaced.
    hist: [u16; BUCKETS],
}

impl Default for StreamTiming {
    fn default() -> Self {
        StreamTiming {
            last: None,
            gaps: 0,
            running_sum: 0,
            together: 0,
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
    /// The first output chunk.
    pub(super) fn first_output(&mut self, now: Instant) {
        self.last = Some(now);
    }

    /// A later chunk, with `running` requests in flight on the endpoint now.
    pub(super) fn chunk(&mut self, now: Instant, running: u64) {
        let Some(last) = self.last else { return };
        let gap = now.saturating_duration_since(last).as_micros() as u64;
        if gap < SAME_ARRIVAL_MICROS {
            // Timed with the next arrival; a stream's closing chunks never are.
            self.together += 1;
            return;
        }
        // This arrival's gap, shared among the chunks that came with the previous one.
        let chunks = self.together + 1;
        let b = &mut self.hist[bucket(gap / u64::from(chunks))];
        *b = b.saturating_add(chunks.min(u32::from(u16::MAX)) as u16);
        self.together = 0;
        self.last = Some(now);
        self.gaps += chunks;
        self.running_sum += running * u64::from(chunks);
    }

    /// The sample, with `elsewhere` sequences on the endpoint that our count does not see (our cluster peers'
    /// and other routers' requests, as last known). None for a stream too short to time.
    pub(super) fn sample(&self, elsewhere: u64) -> Option<DecodeSample> {
        if self.gaps < MIN_GAPS {
            return None;
        }
        let counted: u32 = self.hist.iter().map(|&n| u32::from(n)).sum();
        let mut seen = 0;
        let median = self.hist.iter().position(|&n| {
            seen += u32::from(n);
            2 * seen >= counted
        })?;
        let gaps = f64::from(self.gaps);
        Some(DecodeSample {
            running: (self.running_sum as f64 / gaps + elsewhere as f64).max(1.0),
            seconds_per_token: bucket_seconds(median),
            chunks: u64::from(self.gaps) + 1,
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
    fn the_median_gap_is_the_decode_step_and_a_prefill_stall_is_not() {
        let t0 = Instant::now();
        let mut t = StreamTiming::default();
        // Before the first output nothing is timed.
        t.chunk(t0, 9);
        assert_eq!(t.sample(0), None);
        t.first_output(t0);
        let mut at = t0;
        for _ in 0..3 {
            at += Duration::from_millis(20);
            t.chunk(at, 3);
        }
        assert_eq!(t.sample(0), None, "three gaps are too few");
        // 20 ms steps, two of them stretched to 200 ms by another request's prefill.
        for gap in [20, 200, 20, 20, 200, 20] {
            at += Duration::from_millis(gap);
            t.chunk(at, 5);
        }
        let s = t.sample(2).unwrap();
        assert_eq!(s.chunks, 10);
        assert!((s.seconds_per_token / 0.020 - 1.0).abs() < 0.1, "{s:?}");
        assert!((s.running - (39.0 / 9.0 + 2.0)).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn chunks_that_arrive_together_share_the_gap_to_the_next_arrival() {
        // 10 ms steps, each read carrying two events 5 µs apart, then the last token with usage and [DONE].
        let t0 = Instant::now();
        let mut t = StreamTiming::default();
        t.first_output(t0);
        let mut at = t0;
        for step in 0..6 {
            at += Duration::from_millis(10);
            t.chunk(at, 1);
            at += Duration::from_micros(5);
            t.chunk(at, 1);
            if step == 5 {
                for _ in 0..2 {
                    at += Duration::from_micros(5);
                    t.chunk(at, 1);
                }
            }
        }
        let s = t.sample(0).unwrap();
        // Timed one by one, half the gaps were 5 µs and the median read 18 µs a token.
        assert!((s.seconds_per_token / 0.005 - 1.0).abs() < 0.1, "{s:?}");
        // The closing chunks are not timed: 11 chunks shared 6 gaps.
        assert_eq!(s.chunks, 12);
        assert!((s.running - 1.0).abs() < 1e-9, "{s:?}");
    }
}
