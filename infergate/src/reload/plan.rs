//! The reload plan: the file against the configuration in effect, row by row of the table, into the next
//! configuration and what it applies and does not.

use super::table::{
    Part, Row, Rule, Value, ENGINE_STATS, POOL, PREFIX, QUEUE, SESSIONS, TLS, TOP, WHY_OTHER,
    WHY_POLICY, WHY_POOLS, WHY_PREDICTED_PREFIX, WHY_QUEUE, WHY_SESSIONS, WHY_STATS, WHY_TLS,
};
use super::{Applied, NotApplied, Plan};
use crate::config::{Config, PolicyConfig, PoolConfig};

/// The longest value shown in a message (`old → new`); longer ones are only named.
const SHOWN: usize = 60;

/// What the plan found so far.
struct Diff {
    applied: Vec<Applied>,
    not_applied: Vec<NotApplied>,
    pool: Option<String>,
    /// The pool being compared runs predicted_ttft (`Rule::UnlessPredicted`).
    predicted: bool,
}

impl Diff {
    /// ` (old → new)` when they differ, with the values when both are short; None when equal.
    fn values(old: &dyn Value, new: &dyn Value) -> Option<String> {
        let (old, new) = (format!("{old:?}"), format!("{new:?}"));
        if old == new {
            return None;
        }
        let shown = old.len() <= SHOWN && new.len() <= SHOWN;
        Some(if shown {
            format!(" ({old} → {new})")
        } else {
            String::new()
        })
    }

    /// One setting: `next` holds the new value; when it differs from `running`, record it as applied, or as not
    /// applied and put the running value back.
    fn setting(&mut self, key: &str, running: &dyn Value, next: &mut dyn Value, rule: Rule) {
        let why = match rule {
            Rule::Elsewhere => return,
            Rule::InPlace => None,
            Rule::UnlessPredicted => self.predicted.then_some(WHY_PREDICTED_PREFIX),
            Rule::AtStart(why) | Rule::AtStartUnshown(why) => Some(why),
        };
        let Some(mut values) = Self::values(running, next) else {
            return;
        };
        if matches!(rule, Rule::AtStartUnshown(_)) {
            values.clear();
        }
        match why {
            None => self.applied.push(Applied {
                pool: self.pool.clone(),
                key: key.to_string(),
                values,
            }),
            Some(why) => {
                self.skip(key, values, why);
                next.take(running);
            }
        }
    }

    fn skip(&mut self, key: &str, values: String, why: &'static str) {
        self.not_applied.push(NotApplied {
            pool: self.pool.clone(),
            key: key.to_string(),
            values,
            why,
        });
    }

    /// Every key row of a part; `next` starts as the file's. `running` is copied for the rows to borrow.
    fn rows<C: Clone>(&mut self, rows: &[Row<C>], running: &C, next: &mut C) {
        self.rows_and_parts(rows, running, next, |_, _, _, _| {});
    }

    /// Every row of a part, its parts compared by `part`.
    fn rows_and_parts<C: Clone>(
        &mut self,
        rows: &[Row<C>],
        running: &C,
        next: &mut C,
        part: impl Fn(&mut Diff, Part, &C, &mut C),
    ) {
        let mut r = running.clone();
        for row in rows {
            match row {
                Row::Key(key, rule, field) => self.setting(key, field(&mut r), field(next), *rule),
                Row::Part(_, p) => part(self, *p, running, next),
            }
        }
    }

    /// An optional section: its rows when it is there before and after; else turning it on or off, which cannot
    /// change in place (named `on → off` when `on_off`, else by its values).
    fn optional<C: Clone + std::fmt::Debug + 'static>(
        &mut self,
        key: &str,
        rows: &[Row<C>],
        old: &Option<C>,
        next: &mut Option<C>,
        why: &'static str,
        on_off: bool,
    ) {
        match (old, next) {
            (Some(o), Some(n)) => self.rows(rows, o, n),
            (o, n) if on_off => {
                let on = |s: &Option<C>| if s.is_some() { "on" } else { "off" };
                if o.is_some() != n.is_some() {
                    self.skip(key, format!(" ({} → {})", on(o), on(n)), why);
                    n.clone_from(o);
                }
            }
            (o, n) => self.setting(key, o, n, Rule::AtStart(why)),
        }
    }
}

/// Compare `new` with the configuration in effect (`running`) and build the next one.
pub fn plan(running: &Config, new: &Config) -> Plan {
    let mut d = Diff {
        applied: Vec::new(),
        not_applied: Vec::new(),
        pool: None,
        predicted: false,
    };
    let mut next = new.clone();
    d.rows(TOP, running, &mut next);
    d.optional("tls", TLS, &running.tls, &mut next.tls, WHY_TLS, true);
    let r = running;
    for pc in &new.pools {
        if !r.pools.iter().any(|p| p.name == pc.name) {
            d.skip("pools", format!(" (`{}` added)", pc.name), WHY_POOLS);
        }
    }
    // The running pools in their order (the path screen and the metrics refer to them by position).
    next.pools = r
        .pools
        .iter()
        .map(|p| match new.pools.iter().find(|pc| pc.name == p.name) {
            None => {
                d.skip("pools", format!(" (`{}` removed)", p.name), WHY_POOLS);
                p.clone()
            }
            Some(pc) => {
                let mut next = pc.clone();
                d.pool = Some(p.name.clone());
                d.predicted = matches!(p.policy, PolicyConfig::PredictedTtft { .. });
                d.rows_and_parts(POOL, p, &mut next, pool_part);
                d.pool = None;
                next
            }
        })
        .collect();
    let names = |c: &Config| c.pools.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
    let (mut old_names, mut new_names) = (names(r), names(new));
    if old_names != new_names {
        old_names.sort();
        new_names.sort();
        if old_names == new_names {
            d.skip("pools", " (order)".to_string(), WHY_POOLS);
        }
    }
    if d.not_applied.is_empty() && unlisted_change(r, new) {
        d.skip(
            "settings without a reload check of their own",
            String::new(),
            WHY_OTHER,
        );
    }
    Plan {
        effective: next,
        applied: d.applied,
        not_applied: d.not_applied,
    }
}

/// Take every setting of the table from `new` into `into`.
fn take_listed<C: Clone>(rows: &[Row<C>], into: &mut C, new: &C) {
    let mut n = new.clone();
    for row in rows {
        let (Row::Key(_, _, field) | Row::Part(field, _)) = row;
        field(into).take(field(&mut n));
    }
}

/// Whether `new` differs from `running` in something the table does not list (a setting added to the
/// configuration without a row): `running` with every listed value taken from `new` must equal `new`.
pub(super) fn unlisted_change(running: &Config, new: &Config) -> bool {
    let mut r = running.clone();
    take_listed(TOP, &mut r, new);
    if r.pools.len() == new.pools.len() {
        for (p, n) in r.pools.iter_mut().zip(&new.pools) {
            take_listed(POOL, p, n);
        }
    } else {
        r.pools.clone_from(&new.pools);
    }
    format!("{r:?}") != format!("{new:?}")
}

/// A pool's parts with rules of their own (`table::Part`).
fn pool_part(d: &mut Diff, part: Part, old: &PoolConfig, next: &mut PoolConfig) {
    match part {
        Part::Policy => policy_settings(d, &old.policy, &mut next.policy),
        Part::EngineStats => d.optional(
            "engine_stats",
            ENGINE_STATS,
            &old.engine_stats,
            &mut next.engine_stats,
            WHY_STATS,
            false,
        ),
        Part::Queue => d.optional(
            "queue",
            QUEUE,
            &old.queue,
            &mut next.queue,
            WHY_QUEUE,
            false,
        ),
    }
}

/// A pool's policy: its kind and whether it keeps sessions are fixed; its parameters change in place.
fn policy_settings(d: &mut Diff, old: &PolicyConfig, next: &mut PolicyConfig) {
    if old.kind() != next.kind() {
        let (from, to) = (old.kind().as_str(), next.kind().as_str());
        d.skip("policy", format!(" ({from} → {to})"), WHY_POLICY);
        *next = old.clone();
        return;
    }
    match (old, next) {
        (PolicyConfig::LoadAware { sessions: s0 }, PolicyConfig::LoadAware { sessions: s1 }) => {
            d.optional("sessions", SESSIONS, s0, s1, WHY_SESSIONS, true)
        }
        (
            PolicyConfig::PredictedTtft {
                sessions: s0,
                prefix: p0,
            },
            PolicyConfig::PredictedTtft {
                sessions: s1,
                prefix: p1,
            },
        ) => {
            d.optional("sessions", SESSIONS, s0, s1, WHY_SESSIONS, true);
            d.rows(PREFIX, p0, p1);
        }
        (PolicyConfig::PrefixAware { prefix: p0 }, PolicyConfig::PrefixAware { prefix: p1 }) => {
            d.rows(PREFIX, p0, p1)
        }
        // Round robin and least request have no parameters.
        (old, next) => d.setting("policy settings", old, next, Rule::AtStart(WHY_OTHER)),
    }
}
