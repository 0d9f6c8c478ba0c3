//! The `agent` scenario: multi-turn sessions arriving as a Poisson process (or a burst).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::task::JoinSet;

use super::client::{self, Call, ChatBody, Msg};
use super::text::TextGen;
use super::workload::{mix, plan_sessions, wall, SessionPlan};
use super::{finish, session_headers, snapshot, Config, Report, Run};

/// Salt of the shared system prompt's text seed.
const SYSTEM_SALT: u64 = 0x0051_57E4;

/// The shared system prompt of a run (None when `system_prompt_tokens` is 0).
pub(super) fn system_prompt(cfg: &Config) -> Option<String> {
    (cfg.system_prompt_tokens > 0).then(|| {
        let mut s = String::from("You are a coding agent.");
        let mut g = TextGen::new(mix(cfg.seed, SYSTEM_SALT));
        g.push_tokens(&mut s, cfg.system_prompt_tokens.saturating_sub(6) as usize);
        s
    })
}

/// Salt of the random choice of URL per turn (`spread_turns`).
const SPREAD_SALT: u64 = 0x5B4E_AD00;

/// Plays one session: every turn appends new user text to the conversation and the assistant's answer after
/// it. A failed turn ends the session. Turn `i` goes to `urls[0]`, or with several URLs to one picked at
/// random per turn (seeded by the session's text seed, so a run replays).
pub(super) async fn play_session(
    run: Arc<Run>,
    cfg: Arc<Config>,
    system: Option<Arc<String>>,
    plan: SessionPlan,
    urls: Arc<[String]>,
    id: String,
) -> Vec<client::Outcome> {
    let mut pick = fastrand::Rng::with_seed(mix(plan.text_seed, SPREAD_SALT));
    run.live.sessions_started.fetch_add(1, Ordering::Relaxed);
    let headers = session_headers(&cfg, &id);
    let mut text = TextGen::new(plan.text_seed);
    let mut messages: Vec<Msg> = Vec::with_capacity(plan.turns.len() * 2 + 1);
    if let Some(s) = &system {
        messages.push(Msg {
            role: "system",
            content: s.as_str().to_owned(),
        });
    }
    let mut outcomes = Vec::with_capacity(plan.turns.len());
    let mut failed = false;
    for (i, turn) in plan.turns.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(wall(turn.think, cfg.time_scale)).await;
        }
        messages.push(Msg {
            role: "user",
            content: text.text(turn.user_tokens as usize),
        });
        let body = ChatBody {
            model: &cfg.model,
            messages: &messages,
            max_tokens: turn.max_tokens,
            stream: cfg.stream,
            ignore_eos: true,
            temperature: 0.0,
            field_order: cfg.field_order,
        }
        .to_vec();
        let url = &urls[pick.usize(..urls.len())];
        let call = Call {
            url,
            headers: &headers,
            body,
            stream: cfg.stream,
            timeout: run.request_timeout,
        };
        let out = client::chat(&run.client, call, &run.live, None).await;
        run.record_turn(&out, i, Some(&id));
        let ok = out.ok();
        let content = if out.content.is_empty() {
            "ok".to_string()
        } else {
            out.content.clone()
        };
        outcomes.push(out);
        if !ok {
            failed = true;
            break;
        }
        messages.push(Msg {
            role: "assistant",
            content,
        });
    }
    if failed {
        run.sessions_failed.fetch_add(1, Ordering::Relaxed);
    } else {
        run.sessions_completed.fetch_add(1, Ordering::Relaxed);
    }
    run.live.sessions_done.fetch_add(1, Ordering::Relaxed);
    outcomes
}

pub(super) async fn run(cfg: &Config) -> Result<Report, String> {
    let run = Run::new(cfg, 256);
    let cfg_arc = Arc::new(cfg.clone());
    let mut report = Report {
        targets: cfg.urls.clone(),
        ..Report::default()
    };
    let before = snapshot(&run, &cfg.engine_stats_urls).await;
    let plans = plan_sessions(cfg.seed, cfg.sessions, &cfg.shape, cfg.arrival);
    report.sessions.planned = plans.len() as u64;
    let system = system_prompt(cfg).map(Arc::new);
    let urls: Vec<String> = cfg.urls.iter().map(|u| client::chat_url(u)).collect();
    let all: Arc<[String]> = Arc::from(urls.clone());
    let progress = run.progress(cfg.progress, plans.len() as u64);

    let mut set = JoinSet::new();
    let start = tokio::time::Instant::now();
    let drive = async {
        for plan in plans {
            tokio::time::sleep_until(start + wall(plan.arrival, cfg.time_scale)).await;
            let targets = if cfg.spread_turns {
                all.clone()
            } else {
                Arc::from([urls[plan.id as usize % urls.len()].clone()])
            };
            let id = format!("s{}-{}", cfg.seed, plan.id);
            set.spawn(play_session(
                run.clone(),
                cfg_arc.clone(),
                system.clone(),
                plan,
                targets,
                id,
            ));
        }
        while set.join_next().await.is_some() {}
    };
    report.timed_out = tokio::time::timeout_at(run.deadline, drive).await.is_err();
    Ok(finish(&run, cfg, report, before, set, progress).await)
}
