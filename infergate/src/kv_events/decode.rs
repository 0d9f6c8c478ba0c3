//! vLLM's KV-event messages: three ZMQ frames (topic, an 8-byte big-endian sequence number, a msgpack
//! `KVEventBatch`). msgspec writes the batch as `[ts, [event, ...], data_parallel_rank]` (`array_like`) or as a
//! map `{ts, events, data_parallel_rank}`, and each event (`tag=True`) as a map with a `type` key (vLLM 0.32,
//! measured) or, with `array_like`, as `[type, field, ...]` in the struct's field order; all four are read.
//! `omit_defaults` leaves out fields at their default, so every field after the required ones is optional.

use rmpv::Value;

/// One KV-cache event, reduced to what the index keeps.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Stored(Stored),
    Removed {
        hashes: Vec<u64>,
        /// On a medium or KV group the index does not track (see [`Stored::tracked`]).
        tracked: bool,
    },
    Cleared,
    /// An event type this router does not know (counted, skipped).
    Other,
}

/// `BlockStored`: whole blocks, `token_ids` is `block_size` × `hashes.len()` ids.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    /// vLLM's block hashes (ints, or bytes folded to 64 bits): seed-dependent, used only to find blocks again.
    pub hashes: Vec<u64>,
    pub parent: Option<u64>,
    pub token_ids: Vec<u32>,
    pub block_size: usize,
    /// Per block: 0, or a salt when the block's vLLM hash took more than its tokens (a LoRA adapter, extra keys
    /// such as multimodal inputs or a cache salt). Such blocks never match a key computed from token ids alone.
    pub salts: Vec<u64>,
    /// On the GPU medium (vLLM says "GPU" on its CPU build too) and in KV group 0: what placement reads. Blocks
    /// offloaded elsewhere or of another attention group are counted but not indexed.
    pub tracked: bool,
}

/// Why a message or an event was skipped. Never holds token ids or prompt text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn bad<T>(why: impl Into<String>) -> Result<T, DecodeError> {
    Err(DecodeError(why.into()))
}

/// A message's frames: topic, sequence number, payload. The sequence number and the payload's bytes.
pub fn split_frames<'a>(frames: &[&'a [u8]]) -> Result<(u64, &'a [u8]), DecodeError> {
    let [_topic, seq, payload] = frames else {
        return bad(format!("{} frames, expected 3", frames.len()));
    };
    let seq: [u8; 8] = match (*seq).try_into() {
        Ok(s) => s,
        Err(_) => return bad(format!("sequence frame of {} bytes, expected 8", seq.len())),
    };
    Ok((u64::from_be_bytes(seq), payload))
}

/// A batch's events, each decoded on its own: a bad event is an `Err` beside the good ones.
pub fn decode_batch(payload: &[u8]) -> Result<Vec<Result<Event, DecodeError>>, DecodeError> {
    let mut rd = payload;
    let v = match rmpv::decode::read_value(&mut rd) {
        Ok(v) => v,
        Err(e) => return bad(format!("not msgpack: {e}")),
    };
    if !rd.is_empty() {
        return bad(format!("{} bytes after the batch", rd.len()));
    }
    let events = match &v {
        Value::Array(a) => match a.get(1) {
            Some(Value::Array(ev)) => ev,
            _ => return bad("batch array without an events array at position 1"),
        },
        Value::Map(_) => match get(&v, "events") {
            Some(Value::Array(ev)) => ev,
            _ => return bad("batch map without an `events` array"),
        },
        _ => return bad("batch is neither an array nor a map"),
    };
    Ok(events.iter().map(decode_event).collect())
}

fn get<'a>(map: &'a Value, key: &str) -> Option<&'a Value> {
    match map {
        Value::Map(m) => m
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v),
        _ => None,
    }
}

/// Field order of the array-like structs (after the tag), from vLLM's definitions.
const STORED_FIELDS: [&str; 10] = [
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
];
const REMOVED_FIELDS: [&str; 3] = ["block_hashes", "medium", "group_idx"];

/// An event's fields by name, from either shape.
struct Fields<'a> {
    v: &'a Value,
    array_order: &'static [&'static str],
}

impl<'a> Fields<'a> {
    fn get(&self, name: &str) -> Option<&'a Value> {
        match self.v {
            Value::Array(a) => {
                let i = self.array_order.iter().position(|f| *f == name)?;
                a.get(i + 1)
            }
            map => get(map, name),
        }
    }
}

fn decode_event(v: &Value) -> Result<Event, DecodeError> {
    let tag = match v {
        Value::Array(a) => a.first().and_then(Value::as_str),
        map @ Value::Map(_) => get(map, "type").and_then(Value::as_str),
        _ => return bad("event is neither an array nor a map"),
    };
    let Some(tag) = tag else {
        return bad("event without a type tag");
    };
    match tag {
        "BlockStored" => stored(&Fields {
            v,
            array_order: &STORED_FIELDS,
        })
        .map(Event::Stored),
        "BlockRemoved" => {
            let f = Fields {
                v,
                array_order: &REMOVED_FIELDS,
            };
            Ok(Event::Removed {
                hashes: hashes(f.get("block_hashes"))?,
                tracked: tracked(&f),
            })
        }
        "AllBlocksCleared" => Ok(Event::Cleared),
        _ => Ok(Event::Other),
    }
}

fn tracked(f: &Fields<'_>) -> bool {
    let medium_ok = f
        .get("medium")
        .is_none_or(|m| m.is_nil() || m.as_str().is_some_and(|s| s.eq_ignore_ascii_case("gpu")));
    let group_ok = f
        .get("group_idx")
        .is_none_or(|g| g.is_nil() || g.as_u64() == Some(0));
    medium_ok && group_ok
}

fn stored(f: &Fields<'_>) -> Result<Stored, DecodeError> {
    let hashes = hashes(f.get("block_hashes"))?;
    let parent = match f.get("parent_block_hash") {
        None | Some(Value::Nil) => None,
        Some(h) => Some(hash(h)?),
    };
    let Some(block_size) = f.get("block_size").and_then(Value::as_u64) else {
        return bad("BlockStored without an integer block_size");
    };
    let block_size = usize::try_from(block_size).unwrap_or(0);
    let token_ids = match f.get("token_ids") {
        Some(Value::Array(a)) => {
            let mut out = Vec::with_capacity(a.len());
            for t in a {
                match t.as_u64().and_then(|t| u32::try_from(t).ok()) {
                    Some(t) => out.push(t),
                    None => return bad("BlockStored token id is not a 32-bit unsigned integer"),
                }
            }
            out
        }
        _ => return bad("BlockStored without a token_ids array"),
    };
    if block_size == 0 || token_ids.len() != block_size.saturating_mul(hashes.len()) {
        return bad(format!(
            "BlockStored with {} token ids for {} blocks of {block_size}",
            token_ids.len(),
            hashes.len()
        ));
    }
    // A LoRA adapter salts every block; an extra key salts its own block.
    let lora = match (f.get("lora_name"), f.get("lora_id")) {
        (Some(Value::String(s)), _) => fold(s.as_bytes()) | 1,
        (_, Some(id)) if !id.is_nil() => id.as_u64().unwrap_or(1).wrapping_mul(0x9E37_79B9) | 1,
        _ => 0,
    };
    let extra: Vec<bool> = match f.get("extra_keys") {
        Some(Value::Array(a)) => (0..hashes.len())
            .map(|i| a.get(i).is_some_and(|k| !k.is_nil()))
            .collect(),
        _ => vec![false; hashes.len()],
    };
    let salts = extra
        .iter()
        .enumerate()
        .map(|(i, &e)| {
            if e {
                (lora ^ (0xE7_0000 + i as u64)) | 1
            } else {
                lora
            }
        })
        .collect();
    Ok(Stored {
        hashes,
        parent,
        token_ids,
        block_size,
        salts,
        tracked: tracked(f),
    })
}

fn hashes(v: Option<&Value>) -> Result<Vec<u64>, DecodeError> {
    match v {
        Some(Value::Array(a)) => a.iter().map(hash).collect(),
        _ => bad("event without a block_hashes array"),
    }
}

/// vLLM's `ExternalBlockHash` is an int (signed or not) or bytes (a digest): the bytes are folded to 64 bits.
fn hash(v: &Value) -> Result<u64, DecodeError> {
    match v {
        Value::Integer(i) => match (i.as_u64(), i.as_i64()) {
            (Some(u), _) => Ok(u),
            (None, Some(s)) => Ok(s as u64),
            _ => bad("block hash out of range"),
        },
        Value::Binary(b) => Ok(fold(b)),
        _ => bad("block hash is neither an integer nor bytes"),
    }
}

/// FNV-1a over bytes, finished with `super::mix`.
fn fold(bytes: &[u8]) -> u64 {
    super::mix(crate::fnv::fnv1a(crate::fnv::OFFSET, bytes))
}

#[cfg(test)]
mod tests;
