//! One engine's server side: the accept loop and the per-connection request loop.

use std::future::poll_fn;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::api;
use super::control::{ConnEntry, Control};
use super::engine::Engine;
use super::errors::openai_error_body;
use super::http::{self, ConnIo, ConnShared, InBuf, ReadError};

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
                let body = openai_error_body(status, msg);
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
