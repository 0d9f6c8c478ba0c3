//! Unit tests of session bindings: shared fixtures; the tests themselves are in `decisions` and `bookkeeping`.

use super::super::EngineLoad;
use super::*;

const TTL: Duration = Duration::from_secs(3600);
const LIN_A: u64 = 0xA;
const LIN_B: u64 = 0xB;

fn cand(requests: u64, prefill: u64) -> Candidate {
    Candidate {
        eligible: true,
        requests,
        prefill_tokens: prefill,
        ..Default::default()
    }
}

/// A candidate whose fresh engine stats show a queue (has_queue): `load - 1` running + 1 waiting, all ours, so
/// its request_load() is `load`.
fn queued(load: u64) -> Candidate {
    Candidate {
        engine: Some(EngineLoad {
            running: load - 1,
            waiting: 1,
            kv_usage: 0.5,
            own_at_sample: load,
        }),
        ..cand(load, 0)
    }
}

fn kv_full(mut c: Candidate) -> Candidate {
    c.engine = Some(EngineLoad {
        running: c.requests,
        waiting: 0,
        kv_usage: 0.99,
        own_at_sample: c.requests,
    });
    c
}

fn at_limit(requests: u64) -> Candidate {
    Candidate {
        max_in_flight: Some(requests),
        ..cand(requests, 0)
    }
}

fn req(key: &[u8], lineage: u64, body: u64) -> SessionRequest<'_> {
    SessionRequest {
        key,
        lineage,
        body_bytes: body,
        bytes_per_token: 4.0,
    }
}

struct Fixture {
    table: SessionTable,
    rng: fastrand::Rng,
    t0: Instant,
}

impl Fixture {
    fn new() -> Self {
        Fixture {
            table: SessionTable::new(1000, TTL),
            rng: fastrand::Rng::with_seed(7),
            t0: Instant::now(),
        }
    }

    fn place(&mut self, r: &SessionRequest, cands: &[Candidate], ids: &[u64]) -> SessionPlacement {
        self.table
            .place(r, cands, ids, self.t0, &mut self.rng)
            .expect("an eligible candidate")
    }

    /// Place and commit (the request was served); returns the placement.
    fn serve(&mut self, r: &SessionRequest, cands: &[Candidate], ids: &[u64]) -> SessionPlacement {
        let p = self.place(r, cands, ids);
        self.table.commit(&p.commit, self.t0);
        p
    }

    /// Bind `key` to `ids[index]` with lineage `lineage` at `body` bytes.
    fn bind(&mut self, key: &[u8], lineage: u64, body: u64, ids: &[u64], index: usize) {
        let mut cands = vec![cand(5, 0); ids.len()];
        cands[index] = cand(0, 0);
        let p = self.serve(&req(key, lineage, body), &cands, ids);
        assert_eq!((p.index, p.reason), (index, Reason::NewSession));
    }
}

const IDS: [u64; 3] = [100, 200, 300];

mod bookkeeping;
mod decisions;
