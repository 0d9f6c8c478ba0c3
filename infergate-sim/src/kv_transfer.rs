//! vLLM's NixlConnector `kv_transfer_params` round trip, simulated between the engines of one process.
//!
//! With `kv_transfer` on, an engine plays both roles (vLLM's `kv_role: kv_both`). A request whose params say
//! `do_remote_decode` is a prefill leg: it runs as usual (the router asks one token) and its answer carries the
//! params a decode engine needs (`remote_engine_id`, `remote_request_id`, `remote_block_ids`, `remote_host`,
//! `remote_port`, `remote_num_tokens`, ...), recorded here as issued. A request whose params say
//! `do_remote_prefill` is a decode leg: the params must be ones a prefill engine of this process issued for the
//! same prompt, and unused (a pull consumes them, as NIXL frees the prefill's blocks once read); the engine then
//! waits the transfer (tokens / `kv_transfer_tokens_per_sec`) and decodes without computing those tokens.
//! Anything else is refused with vLLM's 400 shape. Without `kv_transfer` the params are ignored, as vLLM does
//! without a connector (and the answer carries none).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{LazyLock, Mutex};

use serde_json::{json, Value};

use crate::tokenize::PromptTokens;

/// Issued params kept at most (oldest forgotten first): a decode leg that never came leaves no leak.
const MAX_ISSUED: usize = 100_000;

/// What a request's `kv_transfer_params` ask of the engine.
#[derive(Debug, Clone, PartialEq)]
pub enum Role {
    /// A prefill leg: answer with params for a decode engine.
    Prefill,
    /// A decode leg: pull the prompt's KV cache from the prefill engine named in the params.
    Decode(Remote),
}

/// The prefill engine's side of a decode leg's params.
#[derive(Debug, Clone, PartialEq)]
pub struct Remote {
    pub engine_id: String,
    pub request_id: String,
    pub host: String,
    pub port: u64,
    pub block_ids: Vec<u64>,
}

/// The role the params give the request; None without params or with neither flag (then they are ignored).
pub fn role(params: Option<&Value>) -> Result<Option<Role>, String> {
    let Some(p) = params.filter(|p| !p.is_null()) else {
        return Ok(None);
    };
    let Some(p) = p.as_object() else {
        return Err("kv_transfer_params must be an object".into());
    };
    let flag = |k: &str| p.get(k).and_then(Value::as_bool).unwrap_or(false);
    if flag("do_remote_decode") {
        return Ok(Some(Role::Prefill));
    }
    if !flag("do_remote_prefill") {
        return Ok(None);
    }
    let text = |k: &str| p.get(k).and_then(Value::as_str).map(str::to_string);
    let missing = |k: &str| format!("kv_transfer_params.{k} is missing for a remote prefill");
    let block_ids = match p.get("remote_block_ids") {
        // vLLM lists one group of block ids per KV-cache group.
        Some(Value::Array(groups)) => groups
            .iter()
            .flat_map(|g| match g {
                Value::Array(ids) => ids.iter().filter_map(Value::as_u64).collect::<Vec<_>>(),
                other => other.as_u64().into_iter().collect(),
            })
            .collect(),
        _ => return Err(missing("remote_block_ids")),
    };
    Ok(Some(Role::Decode(Remote {
        engine_id: text("remote_engine_id").ok_or_else(|| missing("remote_engine_id"))?,
        request_id: text("remote_request_id").ok_or_else(|| missing("remote_request_id"))?,
        host: text("remote_host").ok_or_else(|| missing("remote_host"))?,
        port: p
            .get("remote_port")
            .and_then(Value::as_u64)
            .ok_or_else(|| missing("remote_port"))?,
        block_ids,
    })))
}

/// One prefill's KV cache waiting to be pulled.
struct Issued {
    addr: SocketAddr,
    block_ids: Vec<u64>,
    /// The prompt it was computed for: its length and block hashes.
    len: usize,
    block_hashes: Vec<u64>,
}

#[derive(Default)]
struct Registry {
    issued: HashMap<(String, String), Issued>,
    order: VecDeque<(String, String)>,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);
static NEXT_BLOCK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Record a finished prefill of `prompt` by engine `engine_id` at `addr` and return the params its answer carries.
pub fn issue(
    engine_id: &str,
    addr: SocketAddr,
    request_id: &str,
    prompt: &PromptTokens,
    block_tokens: usize,
) -> Value {
    let blocks = prompt.len.div_ceil(block_tokens.max(1)) as u64;
    let first = NEXT_BLOCK.fetch_add(blocks.max(1), std::sync::atomic::Ordering::Relaxed);
    let block_ids: Vec<u64> = (first..first + blocks).collect();
    let key = (engine_id.to_string(), request_id.to_string());
    let mut r = REGISTRY.lock().unwrap();
    while r.order.len() >= MAX_ISSUED {
        if let Some(old) = r.order.pop_front() {
            r.issued.remove(&old);
        }
    }
    r.order.push_back(key.clone());
    r.issued.insert(
        key,
        Issued {
            addr,
            block_ids: block_ids.clone(),
            len: prompt.len,
            block_hashes: prompt.block_hashes.clone(),
        },
    );
    json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_block_ids": [block_ids],
        "remote_engine_id": engine_id,
        "remote_request_id": request_id,
        "remote_host": addr.ip().to_string(),
        "remote_port": addr.port(),
        "tp_size": 1,
        "remote_num_tokens": prompt.len,
        "transfer_mode": "read",
    })
}

/// Pull what `remote` names for a decode of `prompt`: the tokens whose KV arrives, or why the params are refused.
/// The params are consumed either way once found (a second pull of the same blocks fails, as in NIXL).
pub fn claim(remote: &Remote, prompt: &PromptTokens) -> Result<usize, String> {
    let key = (remote.engine_id.clone(), remote.request_id.clone());
    let issued = {
        let mut r = REGISTRY.lock().unwrap();
        let found = r.issued.remove(&key);
        if found.is_some() {
            r.order.retain(|k| *k != key);
        }
        found
    };
    let Some(issued) = issued else {
        return Err(format!(
            "kv_transfer_params were not issued by a prefill engine, or were used already: no KV cache of \
             request `{}` at engine `{}`",
            remote.request_id, remote.engine_id
        ));
    };
    let at = (remote.host.as_str(), remote.port);
    if at
        != (
            issued.addr.ip().to_string().as_str(),
            u64::from(issued.addr.port()),
        )
    {
        return Err(format!(
            "kv_transfer_params name {}:{}, but engine `{}` listens on {}",
            remote.host, remote.port, remote.engine_id, issued.addr
        ));
    }
    if remote.block_ids != issued.block_ids {
        return Err(
            "kv_transfer_params.remote_block_ids are not the blocks the prefill engine holds"
                .into(),
        );
    }
    // The same prompt, block for block: another prompt's KV cache is no use.
    if issued.len > prompt.len || !prompt.block_hashes.starts_with(&issued.block_hashes) {
        return Err(format!(
            "kv_transfer_params are for another prompt ({} tokens); this request's prompt has {}",
            issued.len, prompt.len
        ));
    }
    Ok(issued.len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::BlockHasher;

    fn prompt(text: &str) -> PromptTokens {
        let mut h = BlockHasher::new(4);
        h.push_text(text);
        h.finish()
    }

    fn remote(params: &Value) -> Remote {
        match role(Some(params)) {
            Ok(Some(Role::Decode(r))) => r,
            other => panic!("not a decode leg: {other:?}"),
        }
    }

    #[test]
    fn the_flags_give_the_role() {
        assert_eq!(role(None), Ok(None));
        assert_eq!(role(Some(&Value::Null)), Ok(None));
        assert_eq!(
            role(Some(&json!({"do_remote_decode": true}))),
            Ok(Some(Role::Prefill))
        );
        assert_eq!(role(Some(&json!({"do_remote_decode": false}))), Ok(None));
        assert!(role(Some(&json!([1]))).is_err());
        let e = role(Some(
            &json!({"do_remote_prefill": true, "remote_block_ids": [[1]]}),
        ))
        .unwrap_err();
        assert!(e.contains("remote_engine_id"), "{e}");
    }

    #[test]
    fn a_decode_takes_only_what_a_prefill_issued_for_its_prompt_and_only_once() {
        let addr: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let p = prompt("one two three four five six seven eight nine ten");
        let params = issue("sim-a", addr, "req-1", &p, 4);
        let r = remote(&params);
        assert_eq!(r.block_ids.len(), p.len.div_ceil(4));
        // Another prompt: refused (and the params are spent).
        let other = prompt("ten nine eight seven six five four three two one");
        assert!(claim(&r, &other).unwrap_err().contains("another prompt"));
        let params = issue("sim-a", addr, "req-2", &p, 4);
        let r = remote(&params);
        assert_eq!(claim(&r, &p), Ok(p.len));
        assert!(claim(&r, &p).unwrap_err().contains("not issued"));
        // Forged: an engine id or request id nobody issued, or blocks it does not hold.
        let params = issue("sim-a", addr, "req-3", &p, 4);
        let mut forged = remote(&params);
        forged.engine_id = "sim-b".into();
        assert!(claim(&forged, &p).unwrap_err().contains("not issued"));
        let mut wrong_blocks = remote(&params);
        wrong_blocks.block_ids.push(999_999_999);
        assert!(claim(&wrong_blocks, &p)
            .unwrap_err()
            .contains("remote_block_ids"));
        let params = issue("sim-a", addr, "req-4", &p, 4);
        let mut moved = remote(&params);
        moved.port = 5001;
        assert!(claim(&moved, &p).unwrap_err().contains("listens on"));
    }
}
