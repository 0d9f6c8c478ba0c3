//! The decoder on byte fixtures shaped exactly like vLLM 0.32's messages (built with rmp-serde as msgspec
//! writes them), on the array-like shape of older versions, and on garbage.

use serde::Serialize;

use super::*;

/// An event as vLLM 0.32 sent it (measured): a map with `type` first, every field present.
#[derive(Serialize)]
struct Stored032 {
    #[serde(rename = "type")]
    kind: &'static str,
    block_hashes: Vec<u64>,
    parent_block_hash: Option<u64>,
    token_ids: Vec<u32>,
    block_size: usize,
    lora_id: Option<u64>,
    lora_name: Option<String>,
    medium: &'static str,
    extra_keys: Vec<Option<()>>,
    group_idx: u32,
    kv_cache_spec_kind: &'static str,
}

fn measured(blocks: usize) -> Stored032 {
    Stored032 {
        kind: "BlockStored",
        block_hashes: (0..blocks as u64)
            .map(|i| 0xdead_beef_0000_0000 + i)
            .collect(),
        parent_block_hash: None,
        token_ids: (0..(blocks * 128) as u32).collect(),
        block_size: 128,
        lora_id: None,
        lora_name: None,
        medium: "GPU",
        extra_keys: vec![None; blocks],
        group_idx: 0,
        kv_cache_spec_kind: "full_attention",
    }
}

/// The three frames of one message: topic, seq as 8 bytes big-endian, `[ts, [events], dp_rank]`.
fn frames<E: Serialize>(seq: u64, events: &[E]) -> Vec<Vec<u8>> {
    let payload =
        rmp_serde::to_vec_named(&(1_764_633_600.25_f64, events, Option::<u32>::None)).unwrap();
    vec![b"kv".to_vec(), seq.to_be_bytes().to_vec(), payload]
}

fn decode(f: &[Vec<u8>]) -> (u64, Vec<Result<Event, DecodeError>>) {
    let refs: Vec<&[u8]> = f.iter().map(Vec::as_slice).collect();
    let (seq, payload) = split_frames(&refs).unwrap();
    (seq, decode_batch(payload).unwrap())
}

#[test]
fn the_measured_vllm_032_message_decodes() {
    // 900-token prompt: 7 whole blocks of 128 (896 ids); the partial last block is not stored.
    let f = frames(0, &[measured(7)]);
    let (seq, events) = decode(&f);
    assert_eq!(seq, 0);
    let [Ok(Event::Stored(s))] = events.as_slice() else {
        panic!("{events:?}")
    };
    assert_eq!(s.hashes.len(), 7);
    assert_eq!(s.token_ids.len(), 896);
    assert_eq!((s.block_size, s.parent, s.tracked), (128, None, true));
    assert_eq!(s.salts, vec![0; 7]);
}

#[test]
fn removed_and_cleared_decode_as_maps_and_a_map_batch_too() {
    #[derive(Serialize)]
    struct Removed {
        #[serde(rename = "type")]
        kind: &'static str,
        block_hashes: Vec<u64>,
        medium: &'static str,
    }
    #[derive(Serialize)]
    struct Cleared {
        #[serde(rename = "type")]
        kind: &'static str,
    }
    #[derive(Serialize)]
    struct MapBatch<A, B> {
        ts: f64,
        events: (A, B),
    }
    let payload = rmp_serde::to_vec_named(&MapBatch {
        ts: 1.0,
        events: (
            Removed {
                kind: "BlockRemoved",
                block_hashes: vec![1, 2],
                medium: "GPU",
            },
            Cleared {
                kind: "AllBlocksCleared",
            },
        ),
    })
    .unwrap();
    let events = decode_batch(&payload).unwrap();
    assert_eq!(
        events,
        vec![
            Ok(Event::Removed {
                hashes: vec![1, 2],
                tracked: true
            }),
            Ok(Event::Cleared)
        ]
    );
}

#[test]
fn array_like_tagged_events_decode_by_field_order() {
    // msgspec `array_like=True, tag=True`: [tag, block_hashes, parent, token_ids, block_size, lora_id, medium].
    let stored = (
        "BlockStored",
        vec![5u64, 6],
        Some(4u64),
        (0..8u32).collect::<Vec<_>>(),
        4usize,
        Option::<u64>::None,
        "GPU",
    );
    let removed = ("BlockRemoved", vec![5u64], "CPU");
    let payload = rmp_serde::to_vec(&(0.5f64, (stored, removed), 0u32)).unwrap();
    let events = decode_batch(&payload).unwrap();
    let Ok(Event::Stored(s)) = &events[0] else {
        panic!("{events:?}")
    };
    assert_eq!((s.parent, s.block_size, s.token_ids.len()), (Some(4), 4, 8));
    // Offloaded to CPU: counted, not what placement reads.
    assert_eq!(
        events[1],
        Ok(Event::Removed {
            hashes: vec![5],
            tracked: false
        })
    );
}

#[test]
fn lora_and_extra_keys_salt_blocks_and_bytes_hashes_fold() {
    let mut e = measured(2);
    e.lora_name = Some("adapter".into());
    let (_, events) = decode(&frames(3, &[e]));
    let Ok(Event::Stored(s)) = &events[0] else {
        panic!()
    };
    assert!(s.salts.iter().all(|&x| x != 0));
    assert_eq!(
        hash(&Value::Binary(vec![1, 2, 3])),
        hash(&Value::Binary(vec![1, 2, 3]))
    );
    assert_ne!(
        hash(&Value::Binary(vec![1, 2, 3])),
        hash(&Value::Binary(vec![1, 2, 4]))
    );
    assert_eq!(hash(&Value::from(-1i64)), Ok(u64::MAX));
}

#[test]
fn garbage_is_an_error_never_a_panic() {
    assert!(split_frames(&[b"kv", b"short", b""]).is_err());
    assert!(split_frames(&[b"kv"]).is_err());
    assert!(decode_batch(b"").is_err());
    assert!(decode_batch(&[0xc1]).is_err(), "reserved msgpack byte");
    assert!(decode_batch(&rmp_serde::to_vec(&"a string").unwrap()).is_err());
    // A good batch with one bad event: the bad one is an Err beside the good one.
    let mut bad = measured(2);
    bad.token_ids.pop();
    let (_, events) = decode(&frames(1, &[bad, measured(1)]));
    assert!(events[0].is_err() && events[1].is_ok(), "{events:?}");
    // Unknown event types are Other.
    #[derive(Serialize)]
    struct Unknown {
        #[serde(rename = "type")]
        kind: &'static str,
    }
    let (_, events) = decode(&frames(2, &[Unknown { kind: "BlockMoved" }]));
    assert_eq!(events, vec![Ok(Event::Other)]);
    // Random bytes never panic.
    let mut rng = fastrand::Rng::with_seed(9);
    for _ in 0..2000 {
        let n = rng.usize(0..64);
        let bytes: Vec<u8> = (0..n).map(|_| rng.u8(..)).collect();
        let _ = decode_batch(&bytes);
    }
    // Truncations of a real message never panic.
    let f = frames(0, &[measured(3)]);
    for cut in 0..f[2].len() {
        let _ = decode_batch(&f[2][..cut]);
    }
}
