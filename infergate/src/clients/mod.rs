//! Slow and idle clients: a deadline for each request header, an idle limit between keep-alive requests, and a
//! cap on open client connections, around Pingora's HTTP proxy on the `listen` addresses.
//!
//! What Pingora 0.9.1 offers and what is added here:
//!
//! - **Idle keep-alive connections** (Pingora's default keeps HTTP/1.1 connections forever) wait at most
//!   `timeouts.client_idle` for their next request: [`GuardedStream`] times the wait on the same timer as its
//!   header deadline and then ends the stream, which Pingora takes as the client closing between requests and
//!   closes quietly. (Pingora's own keep-alive timeout would do the same with a timer registered per wait; it is
//!   what a connection that is not guarded gets.)
//! - **The request header** has no whole-header deadline in Pingora: its read timeouts (`read_timeout`, the
//!   keep-alive timeout) apply to each read, so a client sending one byte a second never times out. The
//!   connection's stream is wrapped in a [`GuardedStream`] whose reads fail once `timeouts.request_header` has
//!   passed, counted from the accept for a connection's first request and from the first byte of each later
//!   one. [`header_received`] (called from `early_request_filter`, the first hook after the header is parsed)
//!   switches the deadline off; [`awaiting_next_request`] (from `persist_connection_context`, which Pingora calls
//!   exactly when the connection will be reused) switches it on again for the next request.
//! - **The connection cap** is a Pingora [`ServerApp`] wrapped around the proxy ([`ClientGate`]): Pingora calls
//!   `process_new` once per accepted connection and it returns when the connection is closed, so it holds one
//!   slot for exactly the connection's life. (Pingora's `connection_filter` feature can refuse a connection at
//!   accept time but never learns when one closes, so it cannot count open connections; it would also need the
//!   whole Pingora tree rebuilt with the feature.) At the cap, a new connection makes room by closing the
//!   connection that has waited longest (at least [`EVICT_MIN_WAIT`]) for its request header or, idle, for its
//!   next request, as nginx closes idle keep-alive connections when it runs out; so a flood of slow or idle
//!   connections cannot lock out a client that sends its request at once. Only when every slot holds a request
//!   in progress (or a connection younger than that) is the new connection closed unanswered.
//!
//! The request body has its own whole-body deadline (`timeouts.request_body`, 408, see `proxy::body`).
//!
//! The cap keeps file descriptors for what must keep working when clients flood the proxy: each client
//! connection may hold an engine connection too, and health checks, engine-stats scrapes, the metrics listener
//! (a separate Pingora service that this cap does not count) and logs need their own. [`effective_max`] lowers a
//! configured cap that the process's open-files limit could not hold.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use pingora_core::apps::ServerApp;
use pingora_core::listeners::{L4BufferSettings, ListenerConfig};
use pingora_core::protocols::Stream;
use pingora_core::server::ShutdownWatch;
use prometheus::{IntCounter, IntGauge};

use crate::config::{Config, DEFAULT_MAX_CLIENT_CONNECTIONS};
use crate::metrics::Metrics;

mod stream;
pub use stream::{awaiting_next_request, header_received, GuardedStream};
use stream::{Shared, Waiting};

/// File descriptors kept out of the client cap, at most: health checks, engine-stats scrapes, pooled engine
/// connections beyond those of in-flight requests, the metrics listener and its clients, logs, the runtime.
pub const FD_RESERVE: u64 = 1024;

/// How often the "cap reached" warning may repeat.
const REFUSED_LOG_EVERY: Duration = Duration::from_secs(10);

/// Read buffer of a client connection. Pingora's default is 64 KiB per connection, allocated (zeroed) at accept,
/// so a flood of waiting connections costs 64 KiB each; request headers and small bodies fit in a quarter of that,
/// and reads of larger bodies (64 KiB at a time) bypass the buffer anyway.
pub const CLIENT_READ_BUFFER: usize = 16 * 1024;

/// The client-facing listener on `addr`, with [`CLIENT_READ_BUFFER`].
pub fn listener(addr: &str) -> ListenerConfig {
    ListenerConfig::tcp(addr).l4_buffer(L4BufferSettings::default().read(CLIENT_READ_BUFFER))
}

/// At the cap, a connection waiting this long for a request header, or idle between requests, may be closed to
/// make room for a new one (a younger one is left alone: its client may still be about to send).
pub const EVICT_MIN_WAIT: Duration = Duration::from_secs(1);

/// Client connections an open-files limit can hold: every client connection may hold an engine connection
/// too (two descriptors), after a reserve of a quarter of the limit, at most [`FD_RESERVE`].
pub fn connections_for_fd_limit(nofile: u64) -> usize {
    let reserve = (nofile / 4).min(FD_RESERVE);
    usize::try_from(nofile.saturating_sub(reserve) / 2).unwrap_or(usize::MAX)
}

/// This process's soft limit on open files (Linux `/proc/self/limits`); None when unlimited or unknown.
pub fn open_files_limit() -> Option<u64> {
    soft_open_files(&std::fs::read_to_string("/proc/self/limits").ok()?)
}

/// The soft "Max open files" value of a `/proc/<pid>/limits` text.
fn soft_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The cap to enforce: `configured`, lowered to what the open-files limit `nofile` holds.
pub fn effective_max(configured: usize, nofile: Option<u64>) -> usize {
    let Some(nofile) = nofile else {
        return configured;
    };
    let fits = connections_for_fd_limit(nofile).max(1);
    if configured <= fits {
        return configured;
    }
    let msg = format!(
        "max_client_connections {configured} lowered to {fits}: the open-files limit is {nofile}, and each client \
         connection may hold an engine connection too, besides {} descriptors kept for health checks, scrapes and \
         metrics (raise LimitNOFILE / ulimit -n to at least {})",
        (nofile / 4).min(FD_RESERVE),
        configured as u64 * 2 + FD_RESERVE
    );
    if configured as u64 == DEFAULT_MAX_CLIENT_CONNECTIONS {
        log::info!("{msg}");
    } else {
        log::warn!("{msg}");
    }
    fits
}

/// What `GET /health` answers (status, JSON body): the proxy port's answer, also served on the metrics listener,
/// which stays reachable when the proxy port is at `max_client_connections`.
pub fn health(pools: &crate::pool::Pools) -> (u16, &'static str) {
    if pools.any_healthy() {
        (200, r#"{"status":"ok"}"#)
    } else {
        (
            503,
            r#"{"status":"unavailable","reason":"no healthy endpoint in any pool"}"#,
        )
    }
}

/// Counters of the client limits.
struct ClientStats {
    open: IntGauge,
    refused: IntCounter,
    evicted: IntCounter,
    header_timeouts: IntCounter,
}

impl ClientStats {
    fn new(metrics: &Metrics) -> ClientStats {
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("static metric definition");
            metrics.register(Box::new(g.clone()));
            g
        };
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("static metric definition");
            metrics.register(Box::new(c.clone()));
            c
        };
        ClientStats {
            open: gauge(
                "infergate_client_connections",
                "Client connections open on the listen addresses.",
            ),
            refused: counter(
                "infergate_client_connections_refused_total",
                "Client connections closed on accept: max_client_connections were open, none of them waiting.",
            ),
            evicted: counter(
                "infergate_client_connections_evicted_total",
                "Client connections closed to make room at max_client_connections: the one waiting longest for a \
                 request header or, idle, for its next request.",
            ),
            header_timeouts: counter(
                "infergate_client_header_timeouts_total",
                "Client connections closed because a request header did not arrive within timeouts.request_header.",
            ),
        }
    }
}

/// The proxy's [`ServerApp`] behind a connection cap, with every connection's stream guarded by the
/// request-header deadline.
pub struct ClientGate<A> {
    app: Arc<A>,
    header_timeout: Duration,
    max: usize,
    open: Arc<AtomicUsize>,
    shared: Arc<Shared>,
    started: Instant,
    /// Milliseconds after `started` of the last "cap reached" warning (0 = none yet).
    last_refused_log: AtomicU64,
}

impl<A> ClientGate<A> {
    /// Wrap `app` with the configured limits; `max` is the cap to enforce (see [`effective_max`]).
    pub fn new(app: A, cfg: &Config, max: usize, metrics: &Metrics) -> ClientGate<A> {
        ClientGate {
            app: Arc::new(app),
            header_timeout: cfg.timeouts.request_header,
            max,
            open: Arc::new(AtomicUsize::new(0)),
            shared: Arc::new(Shared {
                stats: ClientStats::new(metrics),
                waiting: Mutex::new(Waiting::default()),
            }),
            started: Instant::now(),
            last_refused_log: AtomicU64::new(0),
        }
    }

    /// How many client connections are open, read on demand (the graceful shutdown's exit waits for none).
    pub fn open_connections(&self) -> impl Fn() -> usize + Send + Sync + 'static {
        let open = self.open.clone();
        move || open.load(Ordering::Acquire)
    }

    /// A slot for a new connection: a free one, or the one of a waiting connection closed to make room (taken
    /// at once: the count is over the cap until that connection's task has ended, a moment later).
    fn take_slot(&self) -> Option<Slot<'_, A>> {
        let mut n = self.open.load(Ordering::Relaxed);
        loop {
            if n >= self.max {
                if !self.shared.evict_longest_waiting() {
                    return None;
                }
                self.shared.stats.evicted.inc();
                self.open.fetch_add(1, Ordering::AcqRel);
                break;
            }
            match self
                .open
                .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => n = now,
            }
        }
        self.shared.stats.open.inc();
        Some(Slot(self))
    }

    fn refuse(&self) {
        let stats = &self.shared.stats;
        stats.refused.inc();
        let now = (self.started.elapsed().as_millis() as u64).max(1);
        let last = self.last_refused_log.load(Ordering::Relaxed);
        if (last == 0 || now.saturating_sub(last) >= REFUSED_LOG_EVERY.as_millis() as u64)
            && self
                .last_refused_log
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            log::warn!(
                "{} client connections open (max_client_connections), none of them waiting: closing new ones \
                 ({} so far)",
                self.max,
                stats.refused.get()
            );
        }
    }
}

/// One open client connection's place under the cap.
struct Slot<'a, A>(&'a ClientGate<A>);

impl<A> Drop for Slot<'_, A> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
        self.0.shared.stats.open.dec();
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for ClientGate<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let Some(_slot) = self.take_slot() else {
            self.refuse();
            return None; // dropping the stream closes the connection
        };
        let mut next: Option<Stream> = Some(Box::new(GuardedStream::new(
            stream,
            self.header_timeout,
            self.shared.clone(),
        )));
        // Pingora's HTTP app serves every request of the connection before it returns; loop anyway, so that a
        // stream handed back for reuse stays under this slot.
        while let Some(s) = next {
            next = self.app.process_new(s, shutdown).await;
        }
        None
    }

    async fn cleanup(&self) {
        self.app.cleanup().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_fits_the_open_files_limit() {
        assert_eq!(connections_for_fd_limit(262_144), (262_144 - 1024) / 2);
        assert_eq!(connections_for_fd_limit(20_000), (20_000 - 1024) / 2);
        assert_eq!(connections_for_fd_limit(1024), (1024 - 256) / 2);
        assert_eq!(connections_for_fd_limit(0), 0);
        assert_eq!(effective_max(10_000, Some(262_144)), 10_000);
        assert_eq!(effective_max(10_000, Some(20_000)), 9_488);
        assert_eq!(effective_max(10_000, None), 10_000);
        assert_eq!(effective_max(10, Some(3)), 1);
    }

    #[test]
    fn open_files_limit_is_the_soft_value() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                    Max processes             unlimited            unlimited            processes \n\
                    Max open files            20000                524288               files     \n";
        assert_eq!(soft_open_files(text), Some(20_000));
        let unlimited = text.replace("20000   ", "unlimited");
        assert_eq!(soft_open_files(&unlimited), None);
        assert_eq!(soft_open_files(""), None);
    }
}
