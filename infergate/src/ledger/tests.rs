//! Unit tests of the ledger: holds count and release once, growth, the janitor, prefill ends, peaks, concurrency.

use super::*;
use std::sync::atomic::AtomicU64;

fn counting_hook() -> (ReleaseHook, Arc<AtomicU64>) {
    let released = Arc::new(AtomicU64::new(0));
    let r = released.clone();
    (
        Arc::new(move |tokens, _served, _cause| {
            r.fetch_add(tokens, Ordering::Relaxed);
        }),
        released,
    )
}

#[test]
fn a_request_that_finished_during_a_stats_scrape_is_not_read_as_foreign_load() {
    let ledger = Ledger::new();
    let load = Arc::new(EndpointLoad::default());
    let (hook, _) = counting_hook();
    let mut a = ledger.hold(load.clone(), 0, hook.clone());
    let mut b = ledger.hold(load.clone(), 0, hook.clone());
    load.mark_requests(); // the scrape is sent; the engine counts our two
    a.finish();
    b.finish(); // ... both finish before its answer arrives
    let sample = crate::placement::EngineLoad {
        running: 2,
        own_at_sample: load.requests_since_mark(),
        ..Default::default()
    };
    assert_eq!(sample.foreign(), 0, "a phantom foreign request");
    // One dispatched while the scrape is under way counts as ours too; the next scrape starts afresh.
    let c = ledger.hold(load.clone(), 0, hook.clone());
    assert_eq!(load.requests_since_mark(), 2);
    load.mark_requests();
    assert_eq!(load.requests_since_mark(), 1);
    drop(c);
    assert_eq!(load.requests_since_mark(), 1);
    load.mark_requests();
    assert_eq!(load.requests_since_mark(), 0);
}

#[test]
fn hold_counts_and_releases_once() {
    let ledger = Ledger::new();
    let load = Arc::new(EndpointLoad::default());
    let (hook, released) = counting_hook();
    let mut h = ledger.hold(load.clone(), 1000, hook);
    assert_eq!((load.requests(), load.prefill_tokens()), (1, 1000));
    assert!(h.release_prefill(ReleaseCause::FirstByte));
    assert!(!h.release_prefill(ReleaseCause::FirstByte));
    assert_eq!((load.requests(), load.prefill_tokens()), (1, 0));
    h.finish();
    h.finish();
    drop(h);
    assert_eq!((load.requests(), load.prefill_tokens()), (0, 0));
    assert_eq!(released.load(Ordering::Relaxed), 1000);
    assert_eq!(ledger.outstanding(), 0);
}

#[test]
fn finishing_calls_the_finish_hook_once_after_the_slot_is_free() {
    let ledger = Ledger::new();
    let load = Arc::new(EndpointLoad::default());
    let (hook, _) = counting_hook();
    let calls = Arc::new(AtomicU64::new(0));
    let mut h = ledger.hold(load.clone(), 5, hook);
    let (c, l) = (calls.clone(), load.clone());
    h.on_finish(Arc::new(move || {
        assert_eq!(l.requests(), 0, "the slot is free when the hook runs");
        c.fetch_add(1, Ordering::Relaxed);
    }));
    h.finish();
    drop(h);
    assert_eq!(calls.load(Ordering::Relaxed), 1);
}

#[test]
fn drop_releases_everything() {
    let ledger = Ledger::new();
    let load = Arc::new(EndpointLoad::default());
    let (hook, _) = counting_hook();
    {
        let _h = ledger.hold(load.clone(), 77, hook);
    }
    assert_eq!((load.requests(), load.prefill_tokens()), (0, 0));
}

#[test]
fn panic_while_holding_still_releases() {
    let ledger = Ledger::new();
    let load = Arc::new(EndpointLoad::default());
    let (hook, _) = counting_hook();
    let l2 = load.clone();
    let lg = ledger.clone();
    let r = std::thread::spawn(move || {
        let _h = lg.hold(l2, 500, hook);
        panic!("filter panicked");
    })
    .join();
    assert!(r.is_err());
    assert_eq!((load.requests(), load.prefill_tokens()), (0, 0));
}

#[test]
fn growth_adds_until_released() {
    let ledger = Ledger::new();
    let load = Arc::new(EndpointLoad::default());
    let (hook, released) = counting_hook();
    let h = ledger.hold(load.clone(), 10, hook);
    h.grow_to(50);
    h.grow_to(40); // never shrinks
    assert_eq!(load.prefill_tokens(), 50);
    h.release_prefill(ReleaseCause::FirstByte);
    h.grow_to(90);
    assert_eq!(load.prefill_tokens(), 0);
    drop(h);
    assert_eq!(released.load(Ordering::Relaxed), 50);
}

#[test]
fn janitor_releases_old_holds_only_once() {
    let ledger = Ledger::new();
    let load = Arc::new(EndpointLoad::default());
    let (hook, released) = counting_hook();
    let h_old = ledger.hold(load.clone(), 100, hook.clone());
    let now = Instant::now() + Duration::from_secs(10);
    let h_new_tokens = 5;
    let expired = ledger.expire(Duration::from_secs(5), now);
    assert_eq!(expired, 1);
    assert_eq!(load.prefill_tokens(), 0);
    assert_eq!(
        load.requests(),
        1,
        "the request slot stays until the hold ends"
    );
    let h_new = ledger.hold(load.clone(), h_new_tokens, hook);
    assert_eq!(ledger.expire(Duration::from_secs(5), Instant::now()), 0);
    assert!(!h_old.release_prefill(ReleaseCause::FirstByte));
    drop(h_old);
    drop(h_new);
    assert_eq!((load.requests(), load.prefill_tokens()), (0, 0));
    assert_eq!(released.load(Ordering::Relaxed), 105);
}

#[test]
fn estimated_prefill_end_releases_before_the_first_byte() {
    let ledger = Ledger::new();
    let load = Arc::new(EndpointLoad::default());
    let (hook, released) = counting_hook();
    let h = ledger.hold(load.clone(), 300, hook.clone());
    let other = ledger.hold(load.clone(), 5, hook);
    let now = Instant::now();
    h.release_at(now + Duration::from_millis(100));
    assert_eq!(ledger.release_due(now), 0);
    assert_eq!(ledger.release_due(now + Duration::from_millis(100)), 1);
    assert_eq!(load.prefill_tokens(), 5, "only the due hold released");
    assert!(!h.release_prefill(ReleaseCause::FirstByte));
    drop((h, other));
    assert_eq!(released.load(Ordering::Relaxed), 305);
}

#[test]
fn peak_covers_a_released_prefill_for_the_window_then_forgets_it() {
    let ledger = Ledger::new();
    let load = Arc::new(EndpointLoad::default());
    let (hook, _) = counting_hook();
    let t0 = Instant::now();
    let a = ledger.hold(load.clone(), 3000, hook.clone());
    let b = ledger.hold(load.clone(), 500, hook);
    drop(a);
    assert_eq!(load.prefill_tokens(), 500);
    // Read twice, by two readers: reading changes nothing.
    assert_eq!(load.prefill_tokens_peak(Instant::now()), 3500);
    assert_eq!(load.prefill_tokens_peak(Instant::now()), 3500);
    // Past the window the released peak is gone, but a level still held counts.
    let later = t0 + PEAK_WINDOW + PEAK_SLOT * 3;
    assert_eq!(load.prefill_tokens_peak(later), 500);
    drop(b);
    assert_eq!(load.prefill_tokens_peak(later + PEAK_WINDOW * 2), 0);
}

#[test]
fn peak_window_keeps_the_level_held_before_a_decrease_and_reuses_old_slots() {
    let w = PeakWindow::default();
    let t0 = *PEAK_EPOCH + Duration::from_secs(100);
    // A level reached long ago and released now: the release records it, so the window sees it.
    w.record(7000, t0);
    assert_eq!(
        w.max_over(PEAK_WINDOW, t0 + Duration::from_millis(50)),
        7000
    );
    assert_eq!(w.max_over(PEAK_WINDOW, t0 + PEAK_WINDOW), 7000);
    assert_eq!(w.max_over(PEAK_WINDOW, t0 + PEAK_WINDOW + PEAK_SLOT), 0);
    // The same slot one lap later: the newer stamp wins even with a lower level.
    let lap = t0 + PEAK_SLOT * PEAK_SLOTS as u32;
    w.record(10, lap);
    assert_eq!(w.max_over(PEAK_WINDOW, lap), 10);
    // A slot in the future (clock read before a concurrent writer's) is not counted yet.
    w.record(99, lap + PEAK_SLOT);
    assert_eq!(w.max_over(PEAK_WINDOW, lap), 10);
    assert_eq!(w.max_over(PEAK_WINDOW, lap + PEAK_SLOT), 99);
    // Levels saturate instead of spilling into the stamp.
    w.record(u64::MAX, lap + PEAK_SLOT * 2);
    assert_eq!(
        w.max_over(PEAK_WINDOW, lap + PEAK_SLOT * 2),
        u64::from(u32::MAX)
    );
}

#[test]
fn concurrent_holds_end_at_zero() {
    let ledger = Ledger::new();
    let load = Arc::new(EndpointLoad::default());
    let (hook, _) = counting_hook();
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (lg, l, hk) = (ledger.clone(), load.clone(), hook.clone());
            std::thread::spawn(move || {
                for i in 0..1000u64 {
                    let h = lg.hold(l.clone(), i, hk.clone());
                    if i % 3 == 0 {
                        h.release_prefill(ReleaseCause::FirstByte);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!((load.requests(), load.prefill_tokens()), (0, 0));
    assert_eq!(ledger.outstanding(), 0);
}

#[test]
fn overdue_headers_are_reported_once_and_never_after_the_headers_came() {
    let ledger = Ledger::new();
    let load = Arc::new(EndpointLoad::default());
    let (hook, _) = counting_hook();
    let late = Arc::new(AtomicU64::new(0));
    let counted = late.clone();
    let on_late: LateHook = Arc::new(move |tokens| {
        counted.fetch_add(tokens, Ordering::SeqCst);
    });
    let t0 = Instant::now();
    let a = ledger.hold(load.clone(), 100, hook.clone());
    a.headers_due(t0 + Duration::from_secs(3), on_late.clone());
    let b = ledger.hold(load.clone(), 7, hook.clone());
    b.headers_due(t0 + Duration::from_secs(3), on_late.clone());
    b.mark_served();
    let _c = ledger.hold(load, 9, hook);
    assert_eq!(ledger.report_late_headers(t0 + Duration::from_secs(2)), 0);
    assert_eq!(ledger.report_late_headers(t0 + Duration::from_secs(4)), 1);
    assert_eq!(ledger.report_late_headers(t0 + Duration::from_secs(5)), 0);
    assert_eq!(late.load(Ordering::SeqCst), 100);
    assert!(a.was_late() && !b.was_late());
}

#[test]
fn a_request_prefills_until_its_first_output_and_decodes_after() {
    let ledger = Ledger::new();
    let load = Arc::new(EndpointLoad::default());
    let (hook, _) = counting_hook();
    let a = ledger.hold(load.clone(), 100, hook.clone());
    let mut b = ledger.hold(load.clone(), 0, hook.clone());
    assert_eq!((load.requests(), load.prefilling()), (2, 2));
    a.release_prefill(ReleaseCause::FirstByte);
    a.release_prefill(ReleaseCause::Aborted);
    assert_eq!(
        (load.requests(), load.prefilling()),
        (2, 1),
        "released once"
    );
    b.finish();
    assert_eq!((load.requests(), load.prefilling()), (1, 0));
    drop(a);
    assert_eq!((load.requests(), load.prefilling()), (0, 0));
}

#[test]
fn the_head_prefill_is_timed_from_the_first_token_in_flight_or_the_last_release() {
    let ledger = Ledger::new();
    let load = Arc::new(EndpointLoad::default());
    let (hook, _) = counting_hook();
    let later = Instant::now() + Duration::from_secs(10);
    assert_eq!(
        load.prefill_busy(later),
        Duration::ZERO,
        "nothing in flight"
    );
    let a = ledger.hold(load.clone(), 100_000, hook.clone());
    let from_a = load.prefill_busy(later);
    assert!(from_a > Duration::from_secs(9), "{from_a:?}");
    // Queued behind it, a second prompt and a cached turn do not restart the head's clock.
    std::thread::sleep(Duration::from_millis(5));
    let b = ledger.hold(load.clone(), 2_000, hook.clone());
    let c = ledger.hold(load.clone(), 0, hook.clone());
    drop(c);
    assert_eq!(load.prefill_busy(later), from_a);
    // The head's first byte: the next in line starts now.
    assert!(a.release_prefill(ReleaseCause::FirstByte));
    let from_b = load.prefill_busy(later);
    assert!(from_b < from_a, "{from_b:?} {from_a:?}");
    assert!(b.release_prefill(ReleaseCause::FirstByte));
    assert_eq!(load.prefill_busy(later), Duration::ZERO);
}
