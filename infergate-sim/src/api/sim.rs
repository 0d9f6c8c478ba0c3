//! The simulator's own `/sim/*` routes: totals for benchmarks, recorded requests and runtime control for scripts.

use std::time::Duration;

use serde_json::{json, Value};

use super::respond::{respond_error, respond_json};
use crate::engine::Engine;
use crate::http::{ConnIo, InBuf, Request};

pub(super) async fn stats(eng: &Engine, req: &Request, io: &mut ConnIo, rb: &InBuf) -> bool {
    let v = serde_json::to_value(eng.totals()).unwrap();
    respond_json(io, rb, req, 200, &v).await
}

/// The recorded requests, oldest first, as scripts see them (tests in-process use `requests()`).
pub(super) async fn requests(eng: &Engine, req: &Request, io: &mut ConnIo, rb: &InBuf) -> bool {
    let v: Vec<Value> = eng
        .recorded
        .lock()
        .unwrap()
        .iter()
        .map(|r| {
            json!({"method": r.method, "path": r.path, "headers": r.headers,
                   "body_len": r.body_len, "body_fnv64": format!("{:016x}", r.body_fnv64)})
        })
        .collect();
    respond_json(io, rb, req, 200, &Value::Array(v)).await
}

pub(super) async fn control(eng: &Engine, req: &Request, io: &mut ConnIo, rb: &InBuf) -> bool {
    respond_json(io, rb, req, 200, &eng.control.to_json()).await
}

/// Applies a JSON body of knobs; `refuse_connections_ms` closes the listener and reopens it after that long.
pub(super) async fn set_control(eng: &Engine, req: &Request, io: &mut ConnIo, rb: &InBuf) -> bool {
    let v: Value = match serde_json::from_slice(&req.body) {
        Ok(v) => v,
        Err(e) => {
            return respond_error(io, rb, req, None, 400, &format!("invalid JSON body: {e}")).await
        }
    };
    if let Err(e) = eng.control.apply_json(&v) {
        return respond_error(io, rb, req, None, 400, &e).await;
    }
    if let Some(ms) = v.get("refuse_connections_ms").and_then(Value::as_u64) {
        if let Err(e) = eng.control.refuse_connections(true) {
            return respond_error(io, rb, req, None, 500, &e.to_string()).await;
        }
        let control = eng.control.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            if let Err(e) = control.refuse_connections(false) {
                log::error!(
                    "engine-sim: cannot listen again on {}: {e}",
                    control.net.addr
                );
            }
        });
    }
    respond_json(io, rb, req, 200, &eng.control.to_json()).await
}
