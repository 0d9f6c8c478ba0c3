//! One engine's server side: shared engine state, the accept loop and the per-connection request loop.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use super::api;
use super::config::SimConfig;
use super::control::{ConnEntry, Control};
use super::http::{self, ConnIo, ConnShared, InBuf, ReadError};
use super::scheduler::{SchedRequest, SchedShared};
use super::store::ResponseStore;
use super::tokenize::fnv64;
use super::{EngineTotals, RecordedRequest};

/// Bodies above this size are hashed and parsed on the blocking pool, off the runtime's workers.
pub(crate) const BIG_BODY: usize = 256 * 1024;

pub(crate) struct Engine {
    pub cfg: SimConfig,
    pub control: Arc<Control>,
    pub sched_tx: mpsc::UnboundedSender<SchedRequest>,
    pub sched: Arc<SchedShared>,
    pub recorded: Mutex<VecDeque<RecordedRequest>>,
    pub http_requests: AtomicU64,
    pub received: AtomicU64,
    pub gen_requests: AtomicU64,
    pub rejected: AtomicU64,
    pub refused_injected: AtomicU64,
    pub refused_queue_full: AtomicU64,
    pub next_id: AtomicU64,
    pub next_record: AtomicU64,
    /// Stored Responses API responses; stays empty unless `cfg.responses_store`.
    pub responses: Arc<ResponseStore>,
}

/// Why a generation request was answered with an error instead of being scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The injected `fail_status`.
    Injected,
    /// `max_waiting` requests were already waiting.
    QueueFull,
    /// Invalid or too long.
    Invalid,
}

impl Engine {
    pub fn totals(&self) -> EngineTotals {
        let c = self.sched.snapshot();
        EngineTotals {
            model: self.cfg.model.clone(),
            http_requests: self.http_requests.load(Ordering::Relaxed),
            received: self.received.load(Ordering::Relaxed),
            requests: self.gen_requests.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            refused_injected: self.refused_injected.load(Ordering::Relaxed),
            refused_queue_full: self.refused_queue_full.load(Ordering::Relaxed),
            finished: c.finished,
            aborted: c.aborted,
            prompt_tokens: c.prompt_tokens,
            computed_prompt_tokens: c.computed_prompt_tokens,
            cached_prompt_tokens: c.cached_prompt_tokens,
            generation_tokens: c.generation_tokens,
            prefix_cache_queries: c.prefix_cache_queries,
            prefix_cache_hits: c.prefix_cache_hits,
            running: c.running as u64,
            waiting: c.waiting as u64,
            kv_cache_usage: (c.kv_tokens as f64 / self.cfg.kv_capacity_tokens.max(1) as f64)
                .min(1.0),
            cached_blocks: c.cached_blocks as u64,
            steps: c.steps,
            busy_seconds: c.busy.as_secs_f64(),
        }
    }

    /// Counts a generation request answered with `status` instead of being scheduled, and marks its record.
    pub fn refuse(&self, seq: u64, why: Refusal, status: u16) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
        let by_cause = match why {
            Refusal::Injected => Some(&self.refused_injected),
            Refusal::QueueFull => Some(&self.refused_queue_full),
            Refusal::Invalid => None,
        };
        if let Some(n) = by_cause {
            n.fetch_add(1, Ordering::Relaxed);
        }
        // Refusals come right after arrival, so the record is near the back (unless already dropped).
        if let Some(r) = self
            .recorded
            .lock()
            .unwrap()
            .iter_mut()
            .rev()
            .find(|r| r.seq == seq)
        {
            r.refused = Some(status);
        }
    }

    /// Records the request; returns its arrival number.
    async fn record(&self, req: &mut http::Request) -> u64 {
        self.http_requests.fetch_add(1, Ordering::Relaxed);
        let seq = self.next_record.fetch_add(1, Ordering::Relaxed);
        let body_fnv64 = if req.body.len() > BIG_BODY {
            let body = std::mem::take(&mut req.body);
            let (h, body) = tokio::task::spawn_blocking(move || (fnv64(&body), body))
                .await
                .expect("hash task");
            req.body = body;
            h
        } else {
            fnv64(&req.body)
        };
        let r = RecordedRequest {
            method: req.method.clone(),
            path: req.path.clone(),
            headers: req.headers.clone(),
            body_len: req.body.len(),
            body_fnv64,
            received_at: req.received_at,
            seq,
            refused: None,
        };
        let mut g = self.recorded.lock().unwrap();
        if g.len() >= self.cfg.max_recorded_requests {
            g.pop_front();
        }
        g.push_back(r);
        seq
    }
}

/// Accepts connections until the engine stops.
pub(crate) async fn accept_loop(eng: Arc<Engine>) {
    loop {
        match poll_fn(|cx| eng.control.net.poll_accept(cx)).await {
            None => return,
            Some(Ok((stream, _peer))) => {
                let _ = stream.set_nodelay(true);
                let id = eng.control.net.next_conn_id();
                let shared = Arc::new(ConnShared::new(id, stream));
                eng.control.net.conns.lock().unwrap().insert(
                    id,
                    ConnEntry {
                        shared: shared.clone(),
                        abort: None,
                    },
                );
                let task = tokio::spawn(serve_conn(eng.clone(), shared));
                if let Some(e) = eng.control.net.conns.lock().unwrap().get_mut(&id) {
                    e.abort = Some(task.abort_handle());
                }
                if eng.control.net.is_stopped() {
                    task.abort();
                }
            }
            Some(Err(e)) => {
                log::warn!("engine-sim {}: accept failed: {e}", eng.control.net.addr);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Removes the connection from the registry however its task ends.
struct Registered(Arc<Control>, u64);

impl Drop for Registered {
    fn drop(&mut self) {
        self.0.net.conns.lock().unwrap().remove(&self.1);
    }
}

async fn serve_conn(eng: Arc<Engine>, conn: Arc<ConnShared>) {
    let _registered = Registered(eng.control.clone(), conn.id);
    let mut io = ConnIo(conn.clone());
    let mut rb = InBuf::default();
    loop {
        if rb.is_empty() {
            // Idle keep-alive connection: wait for the next request's first bytes.
            conn.set_idle();
            let read = rb.fill(&mut io);
            let r = match eng.cfg.keep_alive_timeout {
                Some(t) => match tokio::time::timeout(t, read).await {
                    Ok(r) => r,
                    Err(_) => {
                        conn.close();
                        return;
                    }
                },
                None => read.await,
            };
            if !matches!(r, Ok(n) if n > 0) {
                conn.close();
                return;
            }
        }
        if conn.poisoned.swap(false, Ordering::SeqCst) {
            conn.reset();
            return;
        }
        let mut req = match http::read_request(&mut io, &mut rb, eng.cfg.max_body_bytes).await {
            Ok(r) => r,
            Err(ReadError::Io) => {
                conn.close();
                return;
            }
            Err(ReadError::Status(status, msg)) => {
                let body = api::openai_error_body(status, msg);
                let mut out =
                    http::head(status, "application/json", Some(body.len()), false, false)
                        .into_bytes();
                out.extend_from_slice(&body);
                let _ = io.write(&out, false).await;
                conn.close();
                return;
            }
        };
        let seq = eng.record(&mut req).await;
        log::debug!(
            "engine-sim {}: {} {} ({} body bytes)",
            eng.control.net.addr,
            req.method,
            req.path,
            req.body.len()
        );
        let keep = api::handle(&eng, req, seq, &mut io, &mut rb).await;
        if !keep {
            conn.close();
            return;
        }
    }
}
