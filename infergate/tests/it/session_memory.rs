//! Memory of the session table, measured (not computed): resident set growth for 100k bindings.
//! Run by scripts/bench.sh: `cargo test --release --test it session_memory:: -- --ignored --nocapture`.

use std::time::{Duration, Instant};

use infergate::placement::sessions::{lineage_of, SessionRequest, SessionTable};
use infergate::placement::Candidate;

fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[test]
#[ignore = "measurement for BENCHMARKS.md"]
fn hundred_thousand_sessions_fit_in_fifty_megabytes() {
    const N: usize = 100_000;
    let cands = [Candidate {
        eligible: true,
        ..Default::default()
    }; 4];
    let ids = [1u64, 2, 3, 4];
    let mut rng = fastrand::Rng::with_seed(7);
    let before = rss_bytes().expect("/proc/self/statm");
    let mut table = SessionTable::new(N, Duration::from_secs(7200));
    let now = Instant::now();
    for i in 0..N {
        let key = format!("session-{i:08}");
        let req = SessionRequest {
            key: key.as_bytes(),
            lineage: lineage_of(format!("system prompt {}", i % 3).as_bytes(), 0),
            body_bytes: 10_000 + i as u64,
            bytes_per_token: 4.0,
        };
        let p = table
            .place(&req, &cands, &ids, now, &mut rng)
            .expect("a placement");
        table.commit(&p.commit, now);
    }
    assert_eq!(table.len(), N);
    let grown = rss_bytes().unwrap().saturating_sub(before);
    println!(
        "session table: {N} sessions, RSS grew {:.1} MB ({} bytes/session; computed estimate {} bytes/session)",
        grown as f64 / 1e6,
        grown / N as u64,
        SessionTable::approx_bytes_per_session()
    );
    assert!(grown < 50_000_000, "100k sessions took {grown} bytes");
}
