//! Session plans: when each agent session arrives, how long its first prompt is, and what each later turn
//! appends after how much think time. Everything is drawn from the run seed, so a plan is reproducible.

use std::fmt;
use std::time::Duration;

/// An inclusive range of integers given on the command line as `MIN-MAX` (or one value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub min: u64,
    pub max: u64,
}

impl Range {
    pub const fn new(min: u64, max: u64) -> Self {
        Range { min, max }
    }

    pub fn draw(&self, rng: &mut fastrand::Rng) -> u64 {
        if self.max <= self.min {
            self.min
        } else {
            rng.u64(self.min..=self.max)
        }
    }
}

/// `MIN-MAX`, or one value when both are equal (what the command line accepts).
impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{}-{}", self.min, self.max)
        }
    }
}

/// A range of seconds, `MIN-MAX`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SecRange {
    pub min: f64,
    pub max: f64,
}

impl SecRange {
    pub fn draw(&self, rng: &mut fastrand::Rng) -> f64 {
        if self.max <= self.min {
            self.min
        } else {
            self.min + rng.f64() * (self.max - self.min)
        }
    }
}

impl fmt::Display for SecRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{}-{}", self.min, self.max)
        }
    }
}

/// How session arrivals are spread.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrival {
    /// Exponential gaps with this mean rate (sessions per simulated second).
    Poisson { rate: f64 },
    /// Every session within this window (seconds), evenly spaced.
    Burst { window: f64 },
}

/// The shape of agent traffic. Token counts are before `size_scale`; times are simulated seconds (multiplied by
/// `time_scale` to get wall-clock time).
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// Share of first turns of 1k–5k tokens (the rest: `long_share` of 50k–140k, the remainder in between).
    pub short_share: f64,
    pub long_share: f64,
    pub short_tokens: Range,
    pub long_tokens: Range,
    /// Number of later turns per session.
    pub later_turns: Range,
    /// Tokens each later turn appends.
    pub append_tokens: Range,
    /// Think time before each later turn.
    pub think: SecRange,
    /// `max_tokens` of each request.
    pub output_tokens: Range,
    /// Multiplies every prompt size (small values make quick tests).
    pub size_scale: f64,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            short_share: 0.64,
            long_share: 0.16,
            short_tokens: Range::new(1_000, 5_000),
            long_tokens: Range::new(50_000, 140_000),
            later_turns: Range::new(3, 8),
            append_tokens: Range::new(200, 3_000),
            think: SecRange { min: 0.5, max: 3.0 },
            output_tokens: Range::new(32, 256),
            size_scale: 1.0,
        }
    }
}

impl Shape {
    /// Tokens of a first turn: bimodal (short / long), log-uniform in between.
    pub fn first_turn_tokens(&self, rng: &mut fastrand::Rng) -> u64 {
        let u = rng.f64();
        let t = if u < self.short_share {
            self.short_tokens.draw(rng)
        } else if u < self.short_share + self.long_share {
            self.long_tokens.draw(rng)
        } else {
            let (lo, hi) = (
                self.short_tokens.max.max(1) as f64,
                self.long_tokens.min.max(1) as f64,
            );
            if hi <= lo {
                lo as u64
            } else {
                (lo * (hi / lo).powf(rng.f64())).round() as u64
            }
        };
        self.scaled(t)
    }

    fn scaled(&self, tokens: u64) -> u64 {
        ((tokens as f64 * self.size_scale).round() as u64).max(1)
    }
}

/// One request of a session.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnPlan {
    /// New user tokens this turn adds to the conversation.
    pub user_tokens: u64,
    /// Simulated seconds to wait after the previous turn's answer (0 for the first turn).
    pub think: f64,
    pub max_tokens: u64,
}

/// One agent session.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionPlan {
    pub id: u64,
    /// Simulated seconds after the start of the run.
    pub arrival: f64,
    /// Seed of the session's text.
    pub text_seed: u64,
    pub turns: Vec<TurnPlan>,
}

impl SessionPlan {
    /// Prompt tokens of the first turn.
    pub fn first_tokens(&self) -> u64 {
        self.turns.first().map_or(0, |t| t.user_tokens)
    }
}

/// SplitMix64: derives independent seeds from the run seed.
pub fn mix(seed: u64, salt: u64) -> u64 {
    let mut z = seed ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Plans `n` sessions. Session `i`'s content depends only on (seed, i); arrivals on (seed, arrival).
pub fn plan_sessions(seed: u64, n: usize, shape: &Shape, arrival: Arrival) -> Vec<SessionPlan> {
    let mut arrivals_rng = fastrand::Rng::with_seed(mix(seed, 0xA11));
    let mut t = 0.0;
    (0..n)
        .map(|i| {
            let at = match arrival {
                Arrival::Poisson { rate } => {
                    if i > 0 && rate > 0.0 {
                        // 1 - f64() is in (0, 1], so ln is finite.
                        t += -(1.0 - arrivals_rng.f64()).ln() / rate;
                    }
                    t
                }
                Arrival::Burst { window } => {
                    if n > 1 {
                        window * i as f64 / (n - 1) as f64
                    } else {
                        0.0
                    }
                }
            };
            let mut rng = fastrand::Rng::with_seed(mix(seed, 1_000 + i as u64));
            let mut turns = vec![TurnPlan {
                user_tokens: shape.first_turn_tokens(&mut rng),
                think: 0.0,
                max_tokens: shape.output_tokens.draw(&mut rng).max(1),
            }];
            for _ in 0..shape.later_turns.draw(&mut rng) {
                turns.push(TurnPlan {
                    user_tokens: shape.scaled(shape.append_tokens.draw(&mut rng)),
                    think: shape.think.draw(&mut rng),
                    max_tokens: shape.output_tokens.draw(&mut rng).max(1),
                });
            }
            SessionPlan {
                id: i as u64,
                arrival: at,
                text_seed: rng.u64(..),
                turns,
            }
        })
        .collect()
}

/// A duration of `sim_seconds` simulated seconds in wall-clock time.
pub fn wall(sim_seconds: f64, time_scale: f64) -> Duration {
    Duration::from_secs_f64((sim_seconds * time_scale).clamp(0.0, 1e7))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_turns_are_bimodal() {
        let shape = Shape::default();
        let plans = plan_sessions(42, 4000, &shape, Arrival::Poisson { rate: 1.0 });
        let short = plans.iter().filter(|p| p.first_tokens() <= 5_000).count() as f64 / 4000.0;
        let long = plans.iter().filter(|p| p.first_tokens() >= 50_000).count() as f64 / 4000.0;
        assert!((0.60..0.68).contains(&short), "{short}");
        assert!((0.13..0.19).contains(&long), "{long}");
        for p in &plans {
            assert!((4..=9).contains(&p.turns.len()));
            assert!(p.first_tokens() <= 140_000);
            for t in &p.turns[1..] {
                assert!((200..=3000).contains(&t.user_tokens));
                assert!((0.5..=3.0).contains(&t.think));
            }
        }
        // Poisson arrivals at 1/s: about 4000 s for 4000 sessions.
        let last = plans.last().unwrap().arrival;
        assert!((3600.0..4400.0).contains(&last), "{last}");
    }

    #[test]
    fn reproducible_and_burst() {
        let shape = Shape::default();
        let a = plan_sessions(1, 10, &shape, Arrival::Poisson { rate: 2.0 });
        assert_eq!(
            a,
            plan_sessions(1, 10, &shape, Arrival::Poisson { rate: 2.0 })
        );
        assert_ne!(
            a,
            plan_sessions(2, 10, &shape, Arrival::Poisson { rate: 2.0 })
        );
        let b = plan_sessions(1, 8, &shape, Arrival::Burst { window: 0.1 });
        assert_eq!(b[0].arrival, 0.0);
        assert!((b[7].arrival - 0.1).abs() < 1e-12);
        // Content does not depend on the arrival process.
        assert_eq!(
            a[3].turns,
            plan_sessions(1, 10, &shape, Arrival::Burst { window: 1.0 })[3].turns
        );
    }

    #[test]
    fn size_scale_shrinks_prompts() {
        let shape = Shape {
            size_scale: 0.01,
            ..Shape::default()
        };
        for p in plan_sessions(5, 200, &shape, Arrival::Poisson { rate: 1.0 }) {
            assert!(p.turns.iter().all(|t| (1..=1400).contains(&t.user_tokens)));
        }
    }
}
