//! `Control`: the runtime failure knobs of one engine (settable from tests at any time) and its listener and
//! connection registry, which `refuse_connections` / `drop_idle_connections` act on synchronously.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

use super::http::ConnShared;

/// Runtime knobs of one engine. Every setter takes effect for the next request (or, for the network knobs,
/// before it returns).
pub struct Control {
    fail_status: AtomicU32,
    health_status: AtomicU32,
    slow_headers_us: AtomicU64,
    close_mid_stream_after: AtomicUsize,
    drop_mid_stream_after: AtomicUsize,
    error_mid_stream_after: AtomicUsize,
    extra_waiting: AtomicU64,
    extra_running: AtomicU64,
    /// The engine's speed factor (an f64's bits; see `SimConfig::speed`).
    speed: AtomicU64,
    /// The configured speed, which `reset` restores.
    base_speed: f64,
    pub(crate) net: Net,
}

const NONE: usize = usize::MAX;

impl Control {
    pub(crate) fn new(net: Net, speed: f64) -> Self {
        Control {
            fail_status: AtomicU32::new(0),
            health_status: AtomicU32::new(200),
            slow_headers_us: AtomicU64::new(0),
            close_mid_stream_after: AtomicUsize::new(NONE),
            drop_mid_stream_after: AtomicUsize::new(NONE),
            error_mid_stream_after: AtomicUsize::new(NONE),
            extra_waiting: AtomicU64::new(0),
            extra_running: AtomicU64::new(0),
            speed: AtomicU64::new(speed.to_bits()),
            base_speed: speed,
            net,
        }
    }

    /// Generation endpoints answer this status with an OpenAI-style JSON error body (None: serve normally).
    pub fn set_fail_status(&self, status: Option<u16>) {
        self.fail_status
            .store(status.map_or(0, u32::from), Ordering::SeqCst);
    }

    pub fn fail_status(&self) -> Option<u16> {
        match self.fail_status.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s as u16),
        }
    }

    /// What `GET /health` answers (default 200).
    pub fn set_health_status(&self, status: u16) {
        self.health_status.store(status.into(), Ordering::SeqCst);
    }

    pub fn health_status(&self) -> u16 {
        self.health_status.load(Ordering::SeqCst) as u16
    }

    /// Delay before generation calls send their response headers (and before they reach the scheduler).
    pub fn set_slow_headers(&self, d: Duration) {
        self.slow_headers_us
            .store(d.as_micros().min(u64::MAX as u128) as u64, Ordering::SeqCst);
    }

    pub fn slow_headers(&self) -> Duration {
        Duration::from_micros(self.slow_headers_us.load(Ordering::SeqCst))
    }

    /// Streaming responses reset the TCP connection right after this many SSE events (`[DONE]` counts as one).
    pub fn set_close_mid_stream_after(&self, n: Option<usize>) {
        self.close_mid_stream_after
            .store(n.unwrap_or(NONE), Ordering::SeqCst);
    }

    pub fn close_mid_stream_after(&self) -> Option<usize> {
        match self.close_mid_stream_after.load(Ordering::SeqCst) {
            NONE => None,
            n => Some(n),
        }
    }

    /// Streaming responses end the connection cleanly (FIN, without the final chunk or `[DONE]`) right after this
    /// many SSE events: a stream cut short with no reset.
    pub fn set_drop_mid_stream_after(&self, n: Option<usize>) {
        self.drop_mid_stream_after
            .store(n.unwrap_or(NONE), Ordering::SeqCst);
    }

    pub fn drop_mid_stream_after(&self) -> Option<usize> {
        match self.drop_mid_stream_after.load(Ordering::SeqCst) {
            NONE => None,
            n => Some(n),
        }
    }

    /// Streaming responses end with vLLM's in-band error after this many SSE events of output (0: before any):
    /// an error event (`data: {"error": {... "code": 500}}`; Anthropic messages: `event: error`, type
    /// `internal_error`), then `[DONE]` where the API has one, and the stream's normal end. What vLLM sends when
    /// its engine core dies or a generation fails after the headers went out.
    pub fn set_error_mid_stream_after(&self, n: Option<usize>) {
        self.error_mid_stream_after
            .store(n.unwrap_or(NONE), Ordering::SeqCst);
    }

    pub fn error_mid_stream_after(&self) -> Option<usize> {
        match self.error_mid_stream_after.load(Ordering::SeqCst) {
            NONE => None,
            n => Some(n),
        }
    }

    /// Added to the reported `num_requests_waiting` (to fake a queue).
    pub fn set_extra_waiting(&self, n: u64) {
        self.extra_waiting.store(n, Ordering::SeqCst);
    }

    pub fn extra_waiting(&self) -> u64 {
        self.extra_waiting.load(Ordering::SeqCst)
    }

    /// Added to the reported `num_requests_running`.
    pub fn set_extra_running(&self, n: u64) {
        self.extra_running.store(n, Ordering::SeqCst);
    }

    pub fn extra_running(&self) -> u64 {
        self.extra_running.load(Ordering::SeqCst)
    }

    /// Every step from now on takes `1 / speed` as long as the calibrated one (ignored unless finite and > 0).
    pub fn set_speed(&self, speed: f64) {
        if crate::config::valid_speed(speed) {
            self.speed.store(speed.to_bits(), Ordering::SeqCst);
        }
    }

    pub fn speed(&self) -> f64 {
        f64::from_bits(self.speed.load(Ordering::SeqCst))
    }

    /// Restores every request knob to its default (does not touch the listener).
    pub fn reset(&self) {
        self.set_fail_status(None);
        self.set_health_status(200);
        self.set_slow_headers(Duration::ZERO);
        self.set_close_mid_stream_after(None);
        self.set_drop_mid_stream_after(None);
        self.set_error_mid_stream_after(None);
        self.set_extra_waiting(0);
        self.set_extra_running(0);
        self.set_speed(self.base_speed);
    }

    /// `true`: close the listening socket now, so new connects are refused (RST); established connections
    /// stay open. `false`: bind the same address again and serve. Errors only if that rebind fails.
    pub fn refuse_connections(&self, refuse: bool) -> io::Result<()> {
        self.net.set_refusing(refuse)
    }

    pub fn is_refusing(&self) -> bool {
        self.net.listener.lock().unwrap().is_none()
    }

    /// Closes every idle keep-alive connection now (FIN), without reading; returns how many. A client that
    /// reuses one before noticing the close gets a reset or EOF.
    pub fn drop_idle_connections(&self) -> usize {
        let aborts: Vec<Option<AbortHandle>> = self
            .net
            .conns
            .lock()
            .unwrap()
            .values()
            .filter(|c| c.shared.close_if_idle())
            .map(|c| c.abort.clone())
            .collect();
        // Abort the closed connections' tasks (they wait on a socket that no longer exists) outside the lock.
        for a in aborts.iter().flatten() {
            a.abort();
        }
        aborts.len()
    }

    /// Leaves every idle connection open but answers the next request on it with a TCP reset, reading
    /// nothing: a stale pooled connection that the client cannot detect in advance. Returns how many.
    pub fn poison_idle_connections(&self) -> usize {
        self.net
            .conns
            .lock()
            .unwrap()
            .values()
            .filter(|c| c.shared.poison_if_idle())
            .count()
    }

    /// Connections currently open.
    pub fn open_connections(&self) -> usize {
        self.net.conns.lock().unwrap().len()
    }

    /// The request knobs as JSON (what `/sim/control` returns).
    pub fn to_json(&self) -> Value {
        json!({
            "fail_status": self.fail_status(),
            "health_status": self.health_status(),
            "slow_headers_ms": self.slow_headers().as_secs_f64() * 1000.0,
            "close_mid_stream_after": self.close_mid_stream_after(),
            "drop_mid_stream_after": self.drop_mid_stream_after(),
            "error_mid_stream_after": self.error_mid_stream_after(),
            "extra_waiting": self.extra_waiting(),
            "extra_running": self.extra_running(),
            "speed": self.speed(),
            "refusing_connections": self.is_refusing(),
            "open_connections": self.open_connections(),
        })
    }

    /// Applies a `/sim/control` JSON object; unknown keys are an error.
    pub(crate) fn apply_json(&self, v: &Value) -> Result<(), String> {
        let Some(obj) = v.as_object() else {
            return Err("body must be a JSON object".into());
        };
        if obj.get("reset").and_then(Value::as_bool) == Some(true) {
            self.reset();
        }
        let num = |k: &str, x: &Value| {
            x.as_u64()
                .ok_or_else(|| format!("{k} must be a non-negative integer or null"))
        };
        for (k, x) in obj {
            match k.as_str() {
                "reset"
                | "drop_idle_connections"
                | "poison_idle_connections"
                | "refuse_connections_ms" => {}
                "fail_status" if x.is_null() => self.set_fail_status(None),
                "fail_status" => self.set_fail_status(Some(num(k, x)?.clamp(100, 999) as u16)),
                "health_status" => self.set_health_status(num(k, x)?.clamp(100, 999) as u16),
                "slow_headers_ms" => {
                    let ms = x
                        .as_f64()
                        .filter(|m| *m >= 0.0)
                        .ok_or("slow_headers_ms must be a number >= 0")?;
                    self.set_slow_headers(Duration::from_secs_f64(ms / 1000.0));
                }
                "close_mid_stream_after" if x.is_null() => self.set_close_mid_stream_after(None),
                "close_mid_stream_after" => {
                    self.set_close_mid_stream_after(Some(num(k, x)? as usize))
                }
                "drop_mid_stream_after" if x.is_null() => self.set_drop_mid_stream_after(None),
                "drop_mid_stream_after" => {
                    self.set_drop_mid_stream_after(Some(num(k, x)? as usize))
                }
                "error_mid_stream_after" if x.is_null() => self.set_error_mid_stream_after(None),
                "error_mid_stream_after" => {
                    self.set_error_mid_stream_after(Some(num(k, x)? as usize))
                }
                "extra_waiting" => self.set_extra_waiting(num(k, x)?),
                "extra_running" => self.set_extra_running(num(k, x)?),
                "speed" => {
                    let f = x
                        .as_f64()
                        .filter(|f| crate::config::valid_speed(*f))
                        .ok_or("speed must be a number > 0")?;
                    self.set_speed(f);
                }
                other => return Err(format!("unknown control key '{other}'")),
            }
        }
        if obj.get("drop_idle_connections").and_then(Value::as_bool) == Some(true) {
            self.drop_idle_connections();
        }
        if obj.get("poison_idle_connections").and_then(Value::as_bool) == Some(true) {
            self.poison_idle_connections();
        }
        Ok(())
    }
}

pub(crate) struct ConnEntry {
    pub shared: Arc<ConnShared>,
    pub abort: Option<AbortHandle>,
}

/// The listening socket (None while refusing) and the open connections.
pub(crate) struct Net {
    pub addr: SocketAddr,
    listener: Mutex<Option<TcpListener>>,
    accept_waker: Mutex<Option<Waker>>,
    stopped: AtomicBool,
    pub conns: Mutex<HashMap<u64, ConnEntry>>,
    next_conn: AtomicU64,
    runtime: tokio::runtime::Handle,
}

fn bind(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    // std sets SO_REUSEADDR on Unix, so rebinding works while old connections sit in TIME_WAIT.
    let l = std::net::TcpListener::bind(addr)?;
    l.set_nonblocking(true)?;
    Ok(l)
}

impl Net {
    /// Binds `addr`; must be called inside a tokio runtime.
    pub fn bind(addr: SocketAddr) -> io::Result<Net> {
        let std_l = bind(addr)?;
        let addr = std_l.local_addr()?;
        let l = TcpListener::from_std(std_l)?;
        Ok(Net {
            addr,
            listener: Mutex::new(Some(l)),
            accept_waker: Mutex::new(None),
            stopped: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            runtime: tokio::runtime::Handle::current(),
        })
    }

    fn wake_acceptor(&self) {
        if let Some(w) = self.accept_waker.lock().unwrap().take() {
            w.wake();
        }
    }

    fn set_refusing(&self, refuse: bool) -> io::Result<()> {
        if self.stopped.load(Ordering::SeqCst) {
            return Ok(());
        }
        let mut g = self.listener.lock().unwrap();
        if refuse {
            // Dropping the tokio listener closes the socket now.
            g.take();
        } else if g.is_none() {
            let _enter = self.runtime.enter();
            *g = Some(TcpListener::from_std(bind(self.addr)?)?);
        }
        drop(g);
        self.wake_acceptor();
        Ok(())
    }

    /// Accepts the next connection; None once stopped. Pending while refusing.
    pub fn poll_accept(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<io::Result<(TcpStream, SocketAddr)>>> {
        if self.stopped.load(Ordering::SeqCst) {
            return Poll::Ready(None);
        }
        *self.accept_waker.lock().unwrap() = Some(cx.waker().clone());
        match self.listener.lock().unwrap().as_ref() {
            Some(l) => l.poll_accept(cx).map(Some),
            None => Poll::Pending,
        }
    }

    pub fn next_conn_id(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    /// Stops for good: closes the listener and every connection, aborts the connection tasks.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.listener.lock().unwrap().take();
        self.wake_acceptor();
        let conns: Vec<ConnEntry> = self.conns.lock().unwrap().drain().map(|(_, c)| c).collect();
        for c in conns {
            c.shared.close();
            if let Some(a) = c.abort {
                a.abort();
            }
        }
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }
}
