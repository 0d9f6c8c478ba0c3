//! KV-cache events in vLLM's wire format (`vllm/distributed/kv_events.py`, as vLLM 0.32 sends them): a ZMQ PUB
//! socket, each message three frames (topic, an 8-byte big-endian sequence number from 0, a msgpack batch
//! `[ts, [event, ...], data_parallel_rank]` whose events are maps with a `type` key). Like vLLM, the socket binds
//! when the address holds `*` and connects otherwise.
//!
//! The token ids of a stored block are stand-ins derived from the block's chained hash (the same prefix gives the
//! same ids, so a subscriber's keys chain as they would over real ids); the simulator's requests do not carry
//! their token ids to the scheduler.

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::mpsc;
use zeromq::{Socket, SocketSend, ZmqMessage};

/// One cache change, as the scheduler saw it.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        block_size: usize,
    },
    Removed {
        hashes: Vec<u64>,
    },
    Cleared,
}

/// The stand-in token ids of the block whose chained hash is `hash`.
pub fn block_token_ids(hash: u64, block_size: usize) -> Vec<u32> {
    let mut z = hash;
    (0..block_size)
        .map(|_| {
            // splitmix64 steps, folded into a 151,936-entry vocabulary like the tokenizer's ids.
            z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((x ^ (x >> 31)) % 151_936) as u32
        })
        .collect()
}

#[derive(Serialize)]
#[serde(tag = "type")]
enum Wire {
    BlockStored {
        block_hashes: Vec<u64>,
        parent_block_hash: Option<u64>,
        token_ids: Vec<u32>,
        block_size: usize,
        lora_id: Option<u64>,
        medium: &'static str,
        lora_name: Option<String>,
        extra_keys: Vec<Option<()>>,
        group_idx: u32,
        kv_cache_spec_kind: &'static str,
    },
    BlockRemoved {
        block_hashes: Vec<u64>,
        medium: &'static str,
        group_idx: u32,
    },
    AllBlocksCleared {},
}

/// One batch's msgpack bytes, as msgspec writes a `KVEventBatch`.
pub fn encode_batch(ts: f64, events: &[KvEvent]) -> Vec<u8> {
    let wire: Vec<Wire> = events
        .iter()
        .map(|e| match e {
            KvEvent::Stored {
                hashes,
                parent,
                block_size,
            } => Wire::BlockStored {
                token_ids: hashes
                    .iter()
                    .flat_map(|h| block_token_ids(*h, *block_size))
                    .collect(),
                extra_keys: vec![None; hashes.len()],
                block_hashes: hashes.clone(),
                parent_block_hash: *parent,
                block_size: *block_size,
                lora_id: None,
                medium: "GPU",
                lora_name: None,
                group_idx: 0,
                kv_cache_spec_kind: "full_attention",
            },
            KvEvent::Removed { hashes } => Wire::BlockRemoved {
                block_hashes: hashes.clone(),
                medium: "GPU",
                group_idx: 0,
            },
            KvEvent::Cleared => Wire::AllBlocksCleared {},
        })
        .collect();
    // A tuple is an array (msgspec's array_like batch); structs are maps (to_vec_named).
    rmp_serde::to_vec_named(&(ts, wire, Some(0u32))).unwrap_or_default()
}

/// Publish every batch from `rx` on `endpoint` until the channel closes.
pub async fn publish_loop(
    endpoint: String,
    topic: String,
    mut rx: mpsc::UnboundedReceiver<Vec<KvEvent>>,
) {
    let mut socket = zeromq::PubSocket::new();
    let opened = if endpoint.contains('*') {
        socket.bind(&endpoint).await.map(drop)
    } else {
        socket.connect(&endpoint).await
    };
    if let Err(e) = opened {
        log::warn!("KV events: cannot open {endpoint}: {e}");
    }
    let mut seq: u64 = 0;
    while let Some(events) = rx.recv().await {
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let frames = vec![
            Bytes::from(topic.clone().into_bytes()),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            Bytes::from(encode_batch(ts, &events)),
        ];
        if let Ok(msg) = ZmqMessage::try_from(frames) {
            if let Err(e) = socket.send(msg).await {
                log::debug!("KV events: send failed: {e}");
            }
        }
        seq += 1;
    }
}
