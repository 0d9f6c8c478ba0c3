//! TTFT budgets on the request path: the budget a request gets (the tightest of its pool's, its key's and its
//! `x-infergate-ttft-budget-ms` header's, in a pool with `ttft_budget`), and what becomes of a request that no
//! endpoint's predicted time to first token fits: 429 with `Retry-After` from the prediction, a wait at the
//! router (it joins no engine queue) until a prediction fits, bounded, or placement as without a budget; counted
//! per pool and key.

use std::time::{Duration, Instant};

use pingora_http::RequestHeader;
use prometheus::{IntCounterVec, Opts};

use crate::config::{OverBudget, TtftBudgetConfig};
use crate::errors::ApiError;
use crate::metrics::Metrics;

/// The request header that can tighten a request's budget (whole milliseconds, at least 1).
pub const BUDGET_HEADER: &str = "x-infergate-ttft-budget-ms";

/// How often a request waiting for its budget looks again.
pub(super) const RECHECK: Duration = Duration::from_millis(50);

/// What became of a budgeted request: the `outcome` label of `infergate_ttft_budget_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Placed where its predicted time to first token fits, at once.
    Met,
    /// Placed where it fits after waiting at the router.
    Waited,
    /// Answered 429 at once (`when_over: reject`).
    Rejected,
    /// Answered 429 after waiting `max_wait` (`when_over: wait`).
    TimedOut,
    /// Placed before the pool's speeds were learned: nothing predicted, nothing enforced.
    Unpredicted,
    /// Placed where it costs least although no endpoint's prediction fits (`when_over: place`).
    Over,
}

impl Outcome {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Outcome::Met => "met",
            Outcome::Waited => "waited",
            Outcome::Rejected => "rejected",
            Outcome::TimedOut => "timed_out",
            Outcome::Unpredicted => "unpredicted",
            Outcome::Over => "over",
        }
    }
}

/// `infergate_ttft_budget_total{pool, key, outcome}`.
pub(super) fn counter(metrics: &Metrics) -> IntCounterVec {
    metrics.add(IntCounterVec::new(
        Opts::new(
            "infergate_ttft_budget_total",
            "Requests with a TTFT budget, by what became of them: met, waited (placed within it after waiting at the router), rejected (429 at once), timed_out (429 after the longest wait), unpredicted (placed before the pool's speeds were learned), over (placed although no prediction fits, when_over: place).",
        ),
        &["pool", "key", "outcome"],
    ))
}

/// A request's budget state, carried in its context from its first attempt.
#[derive(Debug, Clone, Copy)]
pub(super) struct Budget {
    pub(super) limit: Duration,
    pub(super) when_over: OverBudget,
    pub(super) max_wait: Duration,
    /// When the request first looked for an endpoint.
    pub(super) since: Instant,
    /// It has waited at least once.
    pub(super) waited: bool,
}

/// The header's budget: None when absent; an error when not a whole number of milliseconds of at least 1.
pub(super) fn header_budget(req: &RequestHeader) -> Result<Option<Duration>, ApiError> {
    let Some(v) = req.headers.get(BUDGET_HEADER) else {
        return Ok(None);
    };
    match v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()) {
        Some(ms) if ms >= 1 => Ok(Some(Duration::from_millis(ms))),
        _ => Err(ApiError::new(
            400,
            "invalid_request_error",
            "invalid_ttft_budget",
            format!("{BUDGET_HEADER} must be a whole number of milliseconds, at least 1"),
        )),
    }
}

/// The budget of a request in a pool with `cfg`, its key's budget and its header's.
pub(super) fn budget_of(
    cfg: &TtftBudgetConfig,
    key: Option<Duration>,
    header: Option<Duration>,
    now: Instant,
) -> Option<Budget> {
    let limit = crate::config::effective_ttft_budget(cfg.default, key, header)?;
    Some(Budget {
        limit,
        when_over: cfg.when_over,
        max_wait: cfg.max_wait,
        since: now,
        waited: false,
    })
}

/// What to do with a placement whose least predicted time to first token, `least` seconds, misses the budget.
#[derive(Debug)]
pub(super) enum Miss {
    /// Go ahead (`when_over: place`).
    Place,
    /// Wait and place again.
    Wait,
    /// Answer this 429.
    Refuse(Outcome, ApiError),
}

impl Budget {
    pub(super) fn seconds(&self) -> f64 {
        self.limit.as_secs_f64()
    }

    /// `beyond`: not even an idle endpoint would fit it (its own prefill takes longer): refused at once unless
    /// `when_over` is `place`, and without `Retry-After` (retrying will not help).
    pub(super) fn miss(&self, pool: &str, least: f64, beyond: bool, now: Instant) -> Miss {
        if self.when_over == OverBudget::Place {
            return Miss::Place;
        }
        if beyond {
            return Miss::Refuse(
                Outcome::Rejected,
                ApiError::new(
                    429,
                    "requests",
                    "ttft_budget_exceeded",
                    format!(
                        "the request's prefill alone is predicted to take longer than its time-to-first-token budget of {} ms on every endpoint of pool `{pool}`; shorten the prompt or raise the budget",
                        self.limit.as_millis()
                    ),
                ),
            );
        }
        let outcome = match self.when_over {
            OverBudget::Wait
                if now.saturating_duration_since(self.since) + RECHECK <= self.max_wait =>
            {
                return Miss::Wait
            }
            OverBudget::Wait => Outcome::TimedOut,
            OverBudget::Reject | OverBudget::Place => Outcome::Rejected,
        };
        // The best endpoint's queue will have drained by about the excess.
        let retry = (least - self.seconds()).ceil().clamp(1.0, 3600.0) as u32;
        let mut e = ApiError::new(
            429,
            "requests",
            "ttft_budget_exceeded",
            format!(
                "no endpoint of pool `{pool}` is predicted to answer within the request's time-to-first-token budget of {} ms (the soonest in {} ms); retry later",
                self.limit.as_millis(),
                (least * 1000.0).round() as u64
            ),
        );
        e.retry_after = Some(retry);
        Miss::Refuse(outcome, e)
    }

    /// The outcome of a placement that went ahead (`predicted`: it was made with a prediction).
    pub(super) fn placed(&self, predicted: bool) -> Outcome {
        match (predicted, self.waited) {
            (false, _) => Outcome::Unpredicted,
            (true, false) => Outcome::Met,
            (true, true) => Outcome::Waited,
        }
    }
}

impl super::Router {
    /// Set the request's budget in a pool with `ttft_budget` (generate calls only); Ok(false) when the router has
    /// answered a malformed budget header.
    pub(super) async fn read_budget(
        &self,
        session: &mut pingora_proxy::Session,
        ctx: &mut super::Ctx,
        pool: &crate::pool::Pool,
    ) -> pingora_error::Result<bool> {
        let Some(cfg) = pool.cfg().ttft_budget else {
            return Ok(true);
        };
        if ctx.kind != crate::request::CallKind::Generate {
            return Ok(true);
        }
        let header = match header_budget(session.req_header()) {
            Ok(h) => h,
            Err(e) => {
                self.respond_error(session, &e).await?;
                return Ok(false);
            }
        };
        ctx.budget = budget_of(&cfg, ctx.admission.ttft_budget(), header, Instant::now());
        Ok(true)
    }

    /// Count what became of a budgeted request.
    pub(super) fn count_budget(&self, pool: &str, key: &str, outcome: Outcome) {
        self.budgets
            .with_label_values(&[pool, key, outcome.as_str()])
            .inc();
    }
    /// Whether `placement` may go ahead under the request's budget (a request without one always may); Ok(false):
    /// wait and place again; an error: the router answers 429. Counts the outcome once.
    pub(super) fn within_budget(
        &self,
        pool: &crate::pool::Pool,
        ctx: &mut super::Ctx,
        placement: &crate::placement::policy::Placement,
        now: Instant,
    ) -> pingora_error::Result<bool> {
        let Some(b) = ctx.budget.as_mut() else {
            return Ok(true);
        };
        let predicted = placement.ticket.predicted;
        if let Some((least, beyond)) =
            predicted.and_then(|p| Some((p.over_budget?, p.beyond_budget)))
        {
            match b.miss(&pool.name, least, beyond, now) {
                Miss::Place => {
                    ctx.budget = None;
                    self.count_budget(&pool.name, ctx.admission.key(), Outcome::Over);
                    return Ok(true);
                }
                Miss::Wait => {
                    b.waited = true;
                    return Ok(false);
                }
                Miss::Refuse(outcome, e) => {
                    ctx.budget = None;
                    self.count_budget(&pool.name, ctx.admission.key(), outcome);
                    let status = e.status;
                    ctx.error = Some(e);
                    return pingora_error::Error::e_explain(
                        pingora_error::ErrorType::HTTPStatus(status),
                        "TTFT budget",
                    );
                }
            }
        }
        let outcome = b.placed(predicted.is_some_and(|p| p.ttft.is_some()));
        // Counted once: a retry elsewhere places without the budget's accounting.
        ctx.budget = None;
        self.count_budget(&pool.name, ctx.admission.key(), outcome);
        Ok(true)
    }

    /// Wait a little for the budget (or until the client leaves).
    pub(super) async fn budget_nap(
        &self,
        session: &mut pingora_proxy::Session,
    ) -> pingora_error::Result<()> {
        tokio::select! {
            biased;
            e = super::admit::client_closed(session) => Err(e),
            _ = tokio::time::sleep(RECHECK) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(v: Option<&str>) -> RequestHeader {
        let mut r = RequestHeader::build("POST", b"/v1/chat/completions", None).unwrap();
        if let Some(v) = v {
            r.insert_header(BUDGET_HEADER, v).unwrap();
        }
        r
    }

    #[test]
    fn the_header_is_whole_milliseconds() {
        assert_eq!(header_budget(&req(None)), Ok(None));
        assert_eq!(
            header_budget(&req(Some(" 800 "))),
            Ok(Some(Duration::from_millis(800)))
        );
        for bad in ["0", "-5", "1.5", "2s", ""] {
            let e = header_budget(&req(Some(bad))).unwrap_err();
            assert_eq!((e.status, e.code), (400, "invalid_ttft_budget"), "{bad}");
        }
    }

    #[test]
    fn a_miss_waits_until_the_longest_wait_then_refuses_with_the_prediction() {
        let t0 = Instant::now();
        let cfg = TtftBudgetConfig {
            default: Some(Duration::from_secs(2)),
            when_over: OverBudget::Wait,
            max_wait: Duration::from_secs(1),
        };
        // The key's 500 ms is tighter than the pool's 2 s; the header may tighten further, never loosen.
        let b = budget_of(&cfg, Some(Duration::from_millis(500)), None, t0).unwrap();
        assert_eq!(b.limit, Duration::from_millis(500));
        let b2 = budget_of(&cfg, None, Some(Duration::from_secs(9)), t0).unwrap();
        assert_eq!(b2.limit, Duration::from_secs(2));
        assert!(matches!(b.miss("p", 3.2, false, t0), Miss::Wait));
        match b.miss("p", 3.2, false, t0 + Duration::from_secs(1)) {
            Miss::Refuse(Outcome::TimedOut, e) => {
                assert_eq!((e.status, e.retry_after), (429, Some(3)));
                assert!(
                    e.message.contains("500 ms") && e.message.contains("3200 ms"),
                    "{}",
                    e.message
                );
            }
            _ => panic!("refused after the longest wait"),
        }
        let reject = TtftBudgetConfig {
            when_over: OverBudget::Reject,
            ..cfg
        };
        let b = budget_of(&reject, None, None, t0).unwrap();
        assert!(matches!(
            b.miss("p", 2.1, false, t0),
            Miss::Refuse(
                Outcome::Rejected,
                ApiError {
                    retry_after: Some(1),
                    ..
                }
            )
        ));
        // Its own prefill alone misses it: refused at once even when the pool waits, with no Retry-After.
        let wait = budget_of(&cfg, None, None, t0).unwrap();
        assert!(matches!(
            wait.miss("p", 2.5, true, t0),
            Miss::Refuse(
                Outcome::Rejected,
                ApiError {
                    retry_after: None,
                    ..
                }
            )
        ));
        // `when_over: place`: an objective, never a refusal, even when the prefill alone misses it.
        let place = TtftBudgetConfig {
            when_over: OverBudget::Place,
            ..cfg
        };
        let b = budget_of(&place, None, None, t0).unwrap();
        assert!(matches!(b.miss("p", 2.5, true, t0), Miss::Place));
        assert!(matches!(
            b.miss("p", 9.0, false, t0 + Duration::from_secs(60)),
            Miss::Place
        ));
        // No budget anywhere: none.
        let open = TtftBudgetConfig {
            default: None,
            ..cfg
        };
        assert!(budget_of(&open, None, None, t0).is_none());
        assert_eq!(b.placed(false), Outcome::Unpredicted);
        assert_eq!(b.placed(true), Outcome::Met);
    }
}
