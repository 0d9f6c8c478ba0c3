//! Decode legs of a disaggregated pool: what the decode set's placement adds to its policy. A decode engine takes
//! a whole prompt's KV cache at once; one whose cache is full (fresh engine stats) would preempt what it runs to
//! make room, so it takes no decode leg while another engine has room.

use super::{Candidate, KV_FULL};

/// Mark ineligible the candidates whose fresh KV usage is at `KV_FULL` or above, when an eligible one below it is
/// left (unknown usage counts as room: no stats is no evidence of a full cache).
pub fn spare_full_kv(cands: &mut [Candidate]) {
    let full = |c: &Candidate| c.engine.is_some_and(|e| e.kv_usage >= KV_FULL);
    if cands.iter().any(|c| c.eligible && !full(c)) {
        for c in cands.iter_mut().filter(|c| full(c)) {
            c.eligible = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::EngineLoad;

    fn cand(kv: Option<f64>) -> Candidate {
        Candidate {
            eligible: true,
            engine: kv.map(|kv_usage| EngineLoad {
                kv_usage,
                ..EngineLoad::default()
            }),
            ..Candidate::default()
        }
    }

    #[test]
    fn a_full_kv_cache_takes_no_decode_while_another_has_room() {
        let mut c = [cand(Some(0.99)), cand(Some(0.5)), cand(None)];
        spare_full_kv(&mut c);
        assert_eq!(c.map(|c| c.eligible), [false, true, true]);
        // Every one full: the policy still chooses among them (a preemption beats a refusal).
        let mut c = [cand(Some(0.99)), cand(Some(0.985))];
        spare_full_kv(&mut c);
        assert_eq!(c.map(|c| c.eligible), [true, true]);
        // Room only on an endpoint that is not eligible anyway: nothing changes.
        let mut c = [
            cand(Some(0.99)),
            Candidate {
                eligible: false,
                ..cand(Some(0.1))
            },
        ];
        spare_full_kv(&mut c);
        assert_eq!(c.map(|c| c.eligible), [true, false]);
    }
}
