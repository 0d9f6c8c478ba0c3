//! A pool's `ttft_budget`: the longest time to first token placement may predict for a request it dispatches,
//! and what happens to a request no endpoint can serve within it. The pool's budget, the client key's
//! (`auth.limits.ttft_budget`) and the request's `x-infergate-ttft-budget-ms` header: the tightest applies.

use std::time::Duration;

use super::walk::read_keys;
use super::walk::Node;
use super::ConfigError;
use crate::config::Policy;

/// What a request whose budget no endpoint's predicted time to first token fits gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverBudget {
    /// 429 at once, with `Retry-After` from the prediction (when the best endpoint's queue will have drained).
    Reject,
    /// Wait at the router until a prediction fits, up to `max_wait`; then 429.
    Wait,
    /// Place it anyway, where it costs least: the budget is an objective placement ranks by, never a refusal.
    Place,
}

impl OverBudget {
    pub fn as_str(self) -> &'static str {
        match self {
            OverBudget::Reject => "reject",
            OverBudget::Wait => "wait",
            OverBudget::Place => "place",
        }
    }
}

/// The section (absent: no budgets in this pool; the keys' budgets and the header are ignored there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TtftBudgetConfig {
    /// The pool's own budget (None: only the keys' and the header's apply).
    pub default: Option<Duration>,
    pub when_over: OverBudget,
    /// The longest a request waits with `when_over: wait`.
    pub max_wait: Duration,
}

impl Default for TtftBudgetConfig {
    fn default() -> Self {
        TtftBudgetConfig {
            default: None,
            when_over: OverBudget::Reject,
            max_wait: Duration::from_secs(10),
        }
    }
}

impl TtftBudgetConfig {
    pub(super) fn read(n: Node<'_>, policy: Policy) -> Result<TtftBudgetConfig, ConfigError> {
        read_keys!(n; default, when_over, max_wait);
        if policy != Policy::PredictedTtft {
            return Err(n.err(format!(
                "needs policy predicted_ttft, whose cost model predicts each endpoint's time to first token (this pool's policy is {})",
                policy.as_str()
            )));
        }
        let d = TtftBudgetConfig::default();
        let when_over = match when_over.value() {
            None => d.when_over,
            Some(_) => match when_over.string()?.trim() {
                "reject" => OverBudget::Reject,
                "wait" => OverBudget::Wait,
                "place" => OverBudget::Place,
                other => {
                    return Err(when_over.err(format!(
                        "unknown value `{other}`; expected one of reject, wait, place"
                    )))
                }
            },
        };
        let default = match default.value() {
            None | Some(serde_norway::Value::Null) => None,
            // A zero duration is refused by the duration reader itself.
            Some(_) => Some(default.duration_or(Duration::ZERO)?),
        };
        let max_wait = max_wait.duration_or(d.max_wait)?;
        Ok(TtftBudgetConfig {
            default,
            when_over,
            max_wait,
        })
    }
}

/// The budget a request gets: the tightest of the pool's, its key's and its header's; None without any.
pub fn effective(
    pool: Option<Duration>,
    key: Option<Duration>,
    header: Option<Duration>,
) -> Option<Duration> {
    [pool, key, header].into_iter().flatten().min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::*;

    const PREDICTED: &str = "    policy: predicted_ttft\n";

    #[test]
    fn defaults_values_and_errors() {
        let c = parse(&pool_with(&format!("{PREDICTED}    ttft_budget: {{}}\n"))).unwrap();
        assert_eq!(c.pools[0].ttft_budget, Some(TtftBudgetConfig::default()));
        assert_eq!(parse(POOL).unwrap().pools[0].ttft_budget, None);
        let c = parse(&pool_with(&format!(
            "{PREDICTED}    ttft_budget: {{ default: 800ms, when_over: wait, max_wait: 3s }}\n"
        )))
        .unwrap();
        assert_eq!(
            c.pools[0].ttft_budget,
            Some(TtftBudgetConfig {
                default: Some(Duration::from_millis(800)),
                when_over: OverBudget::Wait,
                max_wait: Duration::from_secs(3),
            })
        );
        let c = parse(&pool_with(&format!(
            "{PREDICTED}    ttft_budget: {{ default: 400ms, when_over: place }}\n"
        )))
        .unwrap();
        assert_eq!(
            c.pools[0].ttft_budget.map(|b| b.when_over),
            Some(OverBudget::Place)
        );
        assert_err(
            &pool_with("    ttft_budget: { default: 1s }\n"),
            "pools[0].ttft_budget",
            &["needs policy predicted_ttft", "load_aware"],
        );
        assert_err(
            &pool_with(&format!(
                "{PREDICTED}    ttft_budget: {{ when_over: queue }}\n"
            )),
            "pools[0].ttft_budget.when_over",
            &["expected one of reject, wait, place"],
        );
        assert_err(
            &pool_with(&format!("{PREDICTED}    ttft_budget: {{ default: 0s }}\n")),
            "pools[0].ttft_budget.default",
            &["greater than zero"],
        );
        assert_err(
            &pool_with(&format!("{PREDICTED}    ttft_budget: {{ default: 2 }}\n")),
            "pools[0].ttft_budget.default",
            &[],
        );
        assert_err(
            &pool_with(&format!("{PREDICTED}    ttft_budget: {{ max_wiat: 1s }}\n")),
            "pools[0].ttft_budget.max_wiat",
            &["did you mean `max_wait`?"],
        );
    }

    #[test]
    fn the_tightest_budget_applies() {
        let ms = |n| Some(Duration::from_millis(n));
        assert_eq!(effective(None, None, None), None);
        assert_eq!(effective(ms(2000), None, None), ms(2000));
        assert_eq!(effective(ms(2000), ms(5000), None), ms(2000));
        assert_eq!(effective(ms(2000), ms(500), ms(900)), ms(500));
        assert_eq!(effective(None, None, ms(900)), ms(900));
    }
}
