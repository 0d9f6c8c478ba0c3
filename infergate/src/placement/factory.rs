//! The policy factory: the one place that names every policy, building a pool's policy from its config.

use super::least_request::LeastRequest;
use super::load_aware::LoadAware;
use super::policy::PlacementPolicy;
use super::predicted_ttft::PredictedTtft;
use super::prefix_aware::PrefixAware;
use super::round_robin::RoundRobin;
use crate::config::{PolicyConfig, PoolConfig};

/// Build a pool's policy from its config: one arm per policy.
pub fn build(cfg: &PoolConfig) -> Box<dyn PlacementPolicy> {
    let bytes_per_token = cfg.prefill.bytes_per_token;
    match &cfg.policy {
        PolicyConfig::RoundRobin => Box::new(RoundRobin::default()),
        PolicyConfig::LeastRequest => Box::new(LeastRequest),
        PolicyConfig::LoadAware { sessions } => {
            Box::new(LoadAware::new(sessions.as_ref(), bytes_per_token))
        }
        PolicyConfig::PrefixAware { prefix } => Box::new(PrefixAware::new(prefix, bytes_per_token)),
        PolicyConfig::PredictedTtft { sessions, prefix } => Box::new(PredictedTtft::new(
            sessions.as_ref(),
            prefix,
            bytes_per_token,
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    use super::*;
    use crate::placement::policy::{PlaceRequest, Placement, Snapshot, Ticket, CANNOT_RECONFIGURE};
    use crate::placement::{Candidate, Reason};

    /// A new policy is this much code: round robin that passes over endpoints at their in-flight limit. Shipping it
    /// adds this type in its own file, its `PolicyConfig` variant and one arm in `build`; the proxy, metrics,
    /// status page, reload and state file read it through the trait.
    #[derive(Default)]
    struct BelowLimit {
        next: AtomicUsize,
    }

    impl PlacementPolicy for BelowLimit {
        fn name(&self) -> &'static str {
            "round_robin_below_limit"
        }

        fn reasons(&self) -> &'static [Reason] {
            &[Reason::RoundRobin]
        }

        fn place(
            &self,
            req: &PlaceRequest,
            snap: &Snapshot,
            _: &mut fastrand::Rng,
        ) -> Option<Placement> {
            let (n, start) = (snap.cands.len(), self.next.fetch_add(1, Ordering::Relaxed));
            let open = |&i: &usize| snap.cands[i].eligible && !snap.cands[i].at_limit();
            let index = (0..n).map(|k| (start + k) % n).find(open)?;
            Some(Placement::whole(index, Reason::RoundRobin, req))
        }
    }

    #[test]
    fn a_policy_is_one_type_behind_the_trait() {
        let p: Box<dyn PlacementPolicy> = Box::new(BelowLimit::default());
        let mut cands = [Candidate {
            eligible: true,
            max_in_flight: Some(1),
            ..Candidate::default()
        }; 3];
        cands[1].requests = 1;
        let snap = Snapshot {
            cands: &cands,
            ids: &[1, 2, 3],
            now: Instant::now(),
        };
        let req = PlaceRequest::default();
        let mut rng = fastrand::Rng::with_seed(1);
        let picks: Vec<usize> = (0..4)
            .filter_map(|_| p.place(&req, &snap, &mut rng).map(|d| d.index))
            .collect();
        assert_eq!(picks, [0, 2, 2, 0]);
        // Everything else has a default that keeps no state.
        assert_eq!(
            (p.name(), p.reasons()),
            ("round_robin_below_limit", &[Reason::RoundRobin][..])
        );
        assert!(p.sessions().is_none() && p.counts_tokens());
        p.served(1, &Ticket::NONE, snap.now);
        assert_eq!(p.expire(snap.now), (0, 0));
        let cfg = crate::config::Config::parse(
            std::path::Path::new("t.yaml"),
            "pools:\n  - name: a\n    endpoints: [\"http://127.0.0.1:9\"]\n",
        )
        .expect("valid");
        assert_eq!(
            p.reconfigure(&cfg.pools[0], snap.now),
            Err(CANNOT_RECONFIGURE)
        );
    }

    #[test]
    fn every_configured_policy_is_built_under_its_own_name() {
        for policy in crate::config::Policy::ALL {
            let text = format!(
                "pools:\n  - name: a\n    endpoints: [\"http://127.0.0.1:9\"]\n    policy: {}\n",
                policy.as_str()
            );
            let cfg =
                crate::config::Config::parse(std::path::Path::new("t.yaml"), &text).expect("valid");
            let built = build(&cfg.pools[0]);
            assert_eq!(built.name(), policy.as_str());
            assert!(!built.reasons().is_empty());
        }
    }
}
