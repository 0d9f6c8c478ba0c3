//! The `shared-prefix` and `mixed` scenarios: agent sessions that open with one shared system prompt and tool
//! list (so cross-session cache locality matters), and agent sessions plus short single-turn chats without the
//! session header.

use std::sync::Arc;

use tokio::task::JoinSet;

use super::agent::{play_session, system_prompt};
use super::client::{self, Call, ChatBody, Msg};
use super::text::TextGen;
use super::workload::{mix, plan_sessions, wall};
use super::{finish, snapshot, Config, Report, Run};

/// Tokens of the shared prefix when `--system-prompt-tokens` is not given for `shared-prefix` (coding agents
/// open with 10–30k tokens of system prompt and tool definitions).
pub const SHARED_PREFIX_TOKENS: u64 = 16_000;

/// Salt of the chat requests' seeds.
const CHAT_SALT: u64 = 0xC4A7;

/// The config a `shared-prefix` run plays: the agent scenario with a shared system prompt of at least
/// [`SHARED_PREFIX_TOKENS`] unless one was given.
pub(super) fn shared_prefix_config(cfg: &Config) -> Config {
    let mut c = cfg.clone();
    if c.system_prompt_tokens == 0 {
        c.system_prompt_tokens = SHARED_PREFIX_TOKENS;
    }
    c
}

/// One planned single-turn chat of the `mixed` scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatPlan {
    /// Simulated seconds after the start of the run.
    pub arrival: f64,
    pub prompt_tokens: u64,
    pub max_tokens: u64,
    pub text_seed: u64,
}

/// Plans `cfg.chat_requests` chats: Poisson arrivals at `cfg.chat_rate` per simulated second, prompt sizes
/// drawn from `cfg.chat_tokens` (times the size scale). Reproducible from the seed.
pub fn plan_chats(cfg: &Config) -> Vec<ChatPlan> {
    let mut rng = fastrand::Rng::with_seed(mix(cfg.seed, CHAT_SALT));
    let mut t = 0.0;
    (0..cfg.chat_requests)
        .map(|i| {
            if i > 0 && cfg.chat_rate > 0.0 {
                t += -(1.0 - rng.f64()).ln() / cfg.chat_rate;
            }
            let tokens = cfg.chat_tokens.draw(&mut rng) as f64 * cfg.shape.size_scale;
            ChatPlan {
                arrival: t,
                prompt_tokens: (tokens.round() as u64).max(1),
                max_tokens: cfg.shape.output_tokens.draw(&mut rng).max(1),
                text_seed: rng.u64(..),
            }
        })
        .collect()
}

/// Sends one chat (no session header) and records it as a first turn.
async fn play_chat(run: Arc<Run>, cfg: Arc<Config>, plan: ChatPlan, url: String) {
    let messages = [Msg {
        role: "user",
        content: TextGen::new(plan.text_seed).text(plan.prompt_tokens as usize),
    }];
    let body = ChatBody {
        model: &cfg.model,
        messages: &messages,
        max_tokens: plan.max_tokens,
        stream: cfg.stream,
        ignore_eos: true,
        temperature: 0.0,
        field_order: cfg.field_order,
    }
    .to_vec();
    let call = Call {
        url: &url,
        headers: &[],
        body,
        stream: cfg.stream,
        timeout: run.request_timeout,
    };
    let out = client::chat(&run.client, call, &run.live, None).await;
    run.record_turn(&out, 0, None);
}

/// The `mixed` scenario: the agent sessions of `agent` and, interleaved, the planned chats.
pub(super) async fn run(cfg: &Config) -> Result<Report, String> {
    let run = Run::new(cfg, 256);
    let cfg_arc = Arc::new(cfg.clone());
    let mut report = Report {
        targets: cfg.urls.clone(),
        ..Report::default()
    };
    let before = snapshot(&run, &cfg.engine_stats_urls).await;
    let plans = plan_sessions(cfg.seed, cfg.sessions, &cfg.shape, cfg.arrival);
    let chats = plan_chats(cfg);
    report.sessions.planned = plans.len() as u64;
    let system = system_prompt(cfg).map(Arc::new);
    let urls: Vec<String> = cfg.urls.iter().map(|u| client::chat_url(u)).collect();
    let all: Arc<[String]> = Arc::from(urls.clone());
    let progress = run.progress(cfg.progress, plans.len() as u64);

    // One timeline of both kinds of arrival, in order.
    enum Arrival {
        Session(super::workload::SessionPlan),
        Chat(ChatPlan),
    }
    let mut timeline: Vec<(f64, Arrival)> = plans
        .into_iter()
        .map(|p| (p.arrival, Arrival::Session(p)))
        .chain(chats.into_iter().map(|c| (c.arrival, Arrival::Chat(c))))
        .collect();
    timeline.sort_by(|a, b| a.0.total_cmp(&b.0));

    let mut set = JoinSet::new();
    let start = tokio::time::Instant::now();
    let drive = async {
        for (k, (at, item)) in timeline.into_iter().enumerate() {
            tokio::time::sleep_until(start + wall(at, cfg.time_scale)).await;
            match item {
                Arrival::Session(plan) => {
                    // As in the agent scenario: one URL per session, or each turn anywhere (`spread_turns`).
                    let targets: Arc<[String]> = if cfg.spread_turns {
                        all.clone()
                    } else {
                        Arc::from([urls[plan.id as usize % urls.len()].clone()])
                    };
                    let id = format!("s{}-{}", cfg.seed, plan.id);
                    let (run, cfg, system) = (run.clone(), cfg_arc.clone(), system.clone());
                    set.spawn(async move {
                        play_session(run, cfg, system, plan, targets, id).await;
                    });
                }
                Arrival::Chat(plan) => {
                    let url = urls[k % urls.len()].clone();
                    set.spawn(play_chat(run.clone(), cfg_arc.clone(), plan, url));
                }
            }
        }
        while set.join_next().await.is_some() {}
    };
    report.timed_out = tokio::time::timeout_at(run.deadline, drive).await.is_err();
    Ok(finish(&run, cfg, report, before, set, progress).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chats_are_reproducible_poisson_and_sized() {
        let cfg = Config {
            chat_requests: 2000,
            chat_rate: 2.0,
            ..Config::default()
        };
        let a = plan_chats(&cfg);
        assert_eq!(a, plan_chats(&cfg));
        assert_eq!(a.len(), 2000);
        let last = a.last().unwrap().arrival;
        assert!((900.0..1100.0).contains(&last), "{last}");
        assert!(a
            .iter()
            .all(|c| cfg.chat_tokens.min <= c.prompt_tokens
                && c.prompt_tokens <= cfg.chat_tokens.max));
        assert!(a.windows(2).all(|w| w[0].arrival <= w[1].arrival));
    }

    #[test]
    fn shared_prefix_defaults_its_system_prompt_and_keeps_a_given_one() {
        let c = shared_prefix_config(&Config::default());
        assert_eq!(c.system_prompt_tokens, SHARED_PREFIX_TOKENS);
        let given = Config {
            system_prompt_tokens: 25_000,
            ..Config::default()
        };
        assert_eq!(shared_prefix_config(&given).system_prompt_tokens, 25_000);
        let s = system_prompt(&c).unwrap();
        let n = crate::text::count_tokens(&s) as i64;
        assert!((n - SHARED_PREFIX_TOKENS as i64).abs() < 10, "{n}");
    }
}
