//! A stream's decode, timed as its chunks pass: from the first output on, the count of chunks, when the last one
//! came, and the sequences running on its endpoint at each (our requests in flight there). The per-chunk step is a
//! clock read, an atomic load and three additions; the sample is made once, when the request has ended well.

use std::time::Instant;

use crate::pool::DecodeSample;

/// Fewer chunks after the first output than this teach nothing about decode speed: two or three gaps are
/// mostly scheduling noise and network jitter.
const MIN_GAPS: u32 = 4;

#[derive(Debug, Default, Clone, Copy)]
pub(super) struct StreamTiming {
    first: Option<Instant>,
    last: Option<Instant>,
    /// Chunks after the first output.
    gaps: u32,
    /// Sum over those chunks of the endpoint's requests in flight.
    running_sum: u64,
}

impl StreamTiming {
    /// The first output chunk.
    pub(super) fn first_output(&mut self, now: Instant) {
        self.first = Some(now);
    }

    /// A later chunk, with `running` requests in flight on the endpoint now.
    pub(super) fn chunk(&mut self, now: Instant, running: u64) {
        if self.first.is_some() {
            self.last = Some(now);
            self.gaps += 1;
            self.running_sum += running;
        }
    }

    /// The sample, with `elsewhere` sequences on the endpoint that our count does not see (our cluster peers'
    /// and other routers' requests, as last known). None for a stream too short to time.
    pub(super) fn sample(&self, elsewhere: u64) -> Option<DecodeSample> {
        let (first, last) = (self.first?, self.last?);
        if self.gaps < MIN_GAPS {
            return None;
        }
        let gaps = f64::from(self.gaps);
        Some(DecodeSample {
            running: (self.running_sum as f64 / gaps + elsewhere as f64).max(1.0),
            seconds_per_token: last.saturating_duration_since(first).as_secs_f64() / gaps,
            chunks: u64::from(self.gaps) + 1,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn chunks_after_the_first_output_are_timed() {
        let t0 = Instant::now();
        let mut t = StreamTiming::default();
        // Chunks before the first output (a preamble) count for nothing.
        t.chunk(t0, 9);
        assert_eq!(t.sample(0), None);
        t.first_output(t0);
        for i in 1..=3 {
            t.chunk(t0 + Duration::from_millis(20 * i), 3);
        }
        assert_eq!(t.sample(0), None, "three gaps are too few");
        t.chunk(t0 + Duration::from_millis(100), 5);
        let s = t.sample(2).unwrap();
        assert_eq!(s.chunks, 5);
        assert!((s.seconds_per_token - 0.025).abs() < 1e-9, "{s:?}");
        assert!((s.running - (3.5 + 2.0)).abs() < 1e-9, "{s:?}");
    }
}
