//! The index: keys from token ids, stored / removed / cleared, the bound, and when it is trusted.

use std::time::{Duration, Instant};

use super::decode::{Event, Stored};
use super::*;

fn sub(block_size: usize, max_blocks: usize) -> KvSubscription {
    KvSubscription {
        endpoint: "tcp://127.0.0.1:1".into(),
        bind: false,
        topic: "kv".into(),
        replay: None,
        stale_after: Duration::from_secs(10),
        block_size,
        max_blocks,
    }
}

/// An index in step with a connected publisher (seq 0 seen).
fn live(block_size: usize, max_blocks: usize, t0: Instant) -> KvIndex {
    let ix = KvIndex::new("p", "e:1");
    ix.configure(Some(sub(block_size, max_blocks)));
    ix.peer_connected();
    assert_eq!(ix.sequence(0, t0), Applied::InOrder);
    ix
}

fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32], bs: usize) -> Event {
    Event::Stored(Stored {
        hashes: hashes.to_vec(),
        parent,
        token_ids: tokens.to_vec(),
        block_size: bs,
        salts: vec![0; hashes.len()],
        tracked: true,
    })
}

#[test]
fn block_keys_cover_whole_blocks_and_chain() {
    let t: Vec<u32> = (0..10).collect();
    assert_eq!(block_keys(&t, 4).len(), 2, "the partial block has no key");
    assert_eq!(block_keys(&t, 0), Vec::<u64>::new());
    // The same block after another parent has another key.
    let a = block_keys(&[1, 2, 3, 4, 5, 6, 7, 8], 4);
    let b = block_keys(&[9, 9, 9, 9, 5, 6, 7, 8], 4);
    assert_ne!(a[1], b[1]);
    assert_eq!(a, block_keys(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 4));
}

#[test]
fn held_tokens_are_the_leading_blocks_keyed_from_the_events_token_ids() {
    let t0 = Instant::now();
    let ix = live(4, 100, t0);
    let prompt: Vec<u32> = (100..114).collect(); // 3 whole blocks + 2
                                                 // Stored in two events, the second chained on the first by vLLM's (seed-dependent) hash.
    ix.apply(&stored(&[0xaa, 0xbb], None, &prompt[..8], 4));
    ix.apply(&stored(&[0xcc], Some(0xbb), &prompt[8..12], 4));
    assert_eq!(ix.blocks(), 3);
    let keys = block_keys(&prompt, 4);
    assert_eq!(ix.held_tokens(&keys, t0), Some(12));
    // A request sharing the first block only.
    let mut other = prompt.clone();
    other[5] = 7;
    assert_eq!(ix.held_tokens(&block_keys(&other, 4), t0), Some(4));
    // Nothing in common: holds nothing, known (Some(0), not None).
    assert_eq!(ix.held_tokens(&block_keys(&[1, 1, 1, 1], 4), t0), Some(0));
    // BlockRemoved carries only vLLM's hashes; the middle block goes, so only the first leads.
    ix.apply(&Event::Removed {
        hashes: vec![0xbb],
        tracked: true,
    });
    assert_eq!(ix.held_tokens(&keys, t0), Some(4));
    ix.apply(&Event::Cleared);
    assert_eq!((ix.blocks(), ix.held_tokens(&keys, t0)), (0, Some(0)));
}

#[test]
fn orphans_other_block_sizes_and_untracked_media_are_skipped() {
    let t0 = Instant::now();
    let ix = live(4, 100, t0);
    ix.apply(&stored(&[1], Some(0x999), &[1, 2, 3, 4], 4));
    assert_eq!(ix.counters.orphans.load(Ordering::Relaxed), 1);
    ix.apply(&stored(&[2], None, &[1, 2, 3, 4, 5, 6, 7, 8], 8));
    assert_eq!(
        ix.counters.events[4].load(Ordering::Relaxed),
        1,
        "block size 8 ≠ 4"
    );
    let Event::Stored(mut s) = stored(&[3], None, &[1, 2, 3, 4], 4) else {
        unreachable!()
    };
    s.tracked = false;
    ix.apply(&Event::Stored(s));
    assert_eq!(ix.blocks(), 0);
    // A salted block (LoRA) is held but never matches plain token ids.
    let Event::Stored(mut s) = stored(&[4], None, &[1, 2, 3, 4], 4) else {
        unreachable!()
    };
    s.salts = vec![77];
    ix.apply(&Event::Stored(s));
    assert_eq!(ix.blocks(), 1);
    assert_eq!(ix.held_tokens(&block_keys(&[1, 2, 3, 4], 4), t0), Some(0));
}

#[test]
fn the_bound_evicts_the_oldest_and_counts_it() {
    let t0 = Instant::now();
    let ix = live(1, 3, t0);
    ix.apply(&stored(&[1, 2, 3], None, &[10, 11, 12], 1));
    ix.apply(&stored(&[4], Some(3), &[13], 1));
    assert_eq!(ix.blocks(), 3);
    assert_eq!(ix.counters.evicted.load(Ordering::Relaxed), 1);
    // The head went first: the chain no longer leads from the root.
    assert_eq!(
        ix.held_tokens(&block_keys(&[10, 11, 12, 13], 1), t0),
        Some(0)
    );
    // Stored again: refreshed, not counted twice.
    ix.apply(&stored(&[4], Some(3), &[13], 1));
    assert_eq!(ix.blocks(), 3);
}

#[test]
fn untrusted_until_connected_then_a_gap_untrusted_for_stale_after() {
    let t0 = Instant::now();
    let ix = KvIndex::new("p", "e:1");
    let keys = block_keys(&[1, 2, 3, 4], 4);
    assert_eq!(ix.held_tokens(&keys, t0), None, "not configured");
    ix.configure(Some(sub(4, 10)));
    assert_eq!(ix.stale_reason(t0), Some("no publisher connected"));
    ix.peer_connected();
    assert_eq!(ix.stale_reason(t0), Some("no message yet"));
    // The first message is seq 3: the publisher ran before we joined; trusted from here, no gap.
    assert_eq!(ix.sequence(3, t0), Applied::Joined { at: 3 });
    assert_eq!(ix.held_tokens(&keys, t0), Some(0));
    assert_eq!(ix.sequence(7, t0), Applied::Gap { from: 4, to: 7 });
    ix.gap(t0);
    assert_eq!(ix.held_tokens(&keys, t0), None);
    let later = t0 + Duration::from_secs(10);
    assert_eq!(
        ix.held_tokens(&keys, later),
        Some(0),
        "trusted again after stale_after"
    );
    assert_eq!(ix.sequence(8, later), Applied::InOrder);
    assert_eq!(ix.sequence(8, later), Applied::Duplicate);
    assert_eq!(ix.sequence(9, later), Applied::InOrder);
    // Backwards: a restarted engine, whose cache is empty.
    ix.apply(&stored(&[1], None, &[1, 2, 3, 4], 4));
    assert_eq!(ix.sequence(0, later), Applied::Restarted);
    assert_eq!(ix.blocks(), 0);
    // A vanished publisher.
    ix.peer_gone();
    assert_eq!(ix.held_tokens(&keys, later), None);
}

#[test]
fn silence_after_a_dispatch_is_stale_but_an_idle_engine_is_not() {
    let t0 = Instant::now();
    let ix = live(4, 10, t0);
    let keys = block_keys(&[1, 2, 3, 4], 4);
    let much_later = t0 + Duration::from_secs(3600);
    assert_eq!(
        ix.held_tokens(&keys, much_later),
        Some(0),
        "idle: nothing to publish"
    );
    ix.note_dispatch(much_later);
    assert_eq!(
        ix.held_tokens(&keys, much_later + Duration::from_secs(9)),
        Some(0)
    );
    let silent = much_later + Duration::from_secs(10);
    assert_eq!(ix.stale_reason(silent), Some("silent publisher"));
    assert_eq!(ix.held_tokens(&keys, silent), None);
    // A message ends the silence.
    ix.sequence(1, silent);
    assert!(ix.is_fresh(silent));
}
