//! The client connection's stream: the request-header deadline on its reads, and its place in the cap's
//! eviction order.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use pingora_core::protocols::http::ServerSession;
use pingora_core::protocols::raw_connect::ProxyDigest;
use pingora_core::protocols::tls::{SslDigest, TlsRef};
use pingora_core::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType, ALPN,
};
use pingora_proxy::Session;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::{ClientStats, EVICT_MIN_WAIT};
use crate::config::DEFAULT_CLIENT_IDLE;

pub(super) const ARMED: u8 = 0;
pub(super) const IDLE: u8 = 1;
pub(super) const OFF: u8 = 2;
/// Idle, its deadline not yet set: the first read sets it (the hook that begins the wait cannot reach the timer).
pub(super) const IDLE_NEW: u8 = 3;

/// What a gate shares with its connections' streams.
pub(super) struct Shared {
    pub(super) stats: ClientStats,
    pub(super) waiting: Mutex<Waiting>,
}

/// Connections that may be closed to make room, in the order they began to wait: queued when accepted and again
/// each time they go idle between requests. Only a connection's latest entry counts (its `wait` number); older
/// entries, entries of closed connections and of connections busy with a request are dropped when met.
#[derive(Default)]
pub(super) struct Waiting {
    pub(super) queue: VecDeque<(Weak<Conn>, u64, Instant)>,
    /// Numbers the entries.
    pub(super) next: u64,
    /// Drop stale entries when the queue reaches this length.
    pub(super) prune_at: usize,
}

impl Shared {
    /// `conn` begins to wait (for its first request, or idle for its next one).
    pub(super) fn queue(&self, conn: &Arc<Conn>) {
        let mut w = self.waiting.lock();
        w.next += 1;
        let n = w.next;
        conn.wait.store(n, Ordering::Release);
        w.queue.push_back((Arc::downgrade(conn), n, Instant::now()));
        if w.queue.len() >= w.prune_at {
            w.queue
                .retain(|(c, n, _)| c.upgrade().is_some_and(|c| c.waiting(*n)));
            w.prune_at = (w.queue.len() * 2).max(1024);
        }
    }

    /// Close the connection that has waited longest, if it has waited at least [`EVICT_MIN_WAIT`].
    pub(super) fn evict_longest_waiting(&self) -> bool {
        let mut w = self.waiting.lock();
        while let Some((conn, n, since)) = w.queue.front() {
            let Some(conn) = conn.upgrade().filter(|c| c.waiting(*n)) else {
                w.queue.pop_front();
                continue;
            };
            if since.elapsed() < EVICT_MIN_WAIT {
                return false;
            }
            w.queue.pop_front();
            if !conn.evicted.swap(true, Ordering::AcqRel) {
                drop(w);
                if let Some(waker) = conn.waker.lock().take() {
                    waker.wake();
                }
                return true;
            }
        }
        false
    }
}

/// One connection's state, shared by its stream, the proxy hooks and the gate's queue of waiting connections.
#[derive(Default)]
pub(super) struct Conn {
    /// `ARMED` (a request header is being read against the deadline), `IDLE` / `IDLE_NEW` (between keep-alive
    /// requests, against `idle_ms`; the first byte read arms the header deadline), `OFF` (the header is in; the
    /// body and the response have their own timeouts).
    pub(super) phase: AtomicU8,
    /// `timeouts.client_idle` in milliseconds, as the configuration had it when the last request header arrived.
    pub(super) idle_ms: AtomicU64,
    /// Closed to make room: reads fail while the connection waits (not during a request).
    pub(super) evicted: AtomicBool,
    /// The number of its latest entry in the gate's queue of waiting connections.
    pub(super) wait: AtomicU64,
    /// The task reading the connection, woken when it is evicted.
    pub(super) waker: Mutex<Option<Waker>>,
}

impl Conn {
    /// Still waiting since its queue entry `n`: no request began (or ran) since.
    pub(super) fn waiting(&self, n: u64) -> bool {
        self.wait.load(Ordering::Acquire) == n && self.phase.load(Ordering::Acquire) != OFF
    }
}

/// A client connection's stream whose reads fail once a request header is overdue, end once the connection has
/// been idle too long between requests, and fail once it is closed to make room while it waits.
pub struct GuardedStream {
    inner: Stream,
    conn: Arc<Conn>,
    header_timeout: Duration,
    /// When the header being read is overdue (`ARMED`).
    header_due: tokio::time::Instant,
    /// The one timer: the end of the idle wait (`IDLE`), or `header_due` once a header read has had to wait.
    /// A header that arrives in one read never touches it, so a request costs it no more than one extension.
    deadline: Pin<Box<tokio::time::Sleep>>,
    expired: bool,
    shared: Arc<Shared>,
}

impl GuardedStream {
    pub(super) fn new(
        inner: Stream,
        header_timeout: Duration,
        shared: Arc<Shared>,
    ) -> GuardedStream {
        let conn = Arc::new(Conn::default());
        shared.queue(&conn);
        let due = tokio::time::Instant::now() + header_timeout;
        GuardedStream {
            inner,
            conn,
            header_timeout,
            header_due: due,
            deadline: Box::pin(tokio::time::sleep_until(due)),
            expired: false,
            shared,
        }
    }

    pub(super) fn of(stream: &Stream) -> Option<&GuardedStream> {
        (**stream).as_any().downcast_ref::<GuardedStream>()
    }

    /// While the connection waits: remember whom to wake if it is evicted; the error to fail the read with if it
    /// has been.
    pub(super) fn check_evicted(&self, cx: &Context<'_>) -> Option<io::Error> {
        {
            let mut w = self.conn.waker.lock();
            if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *w = Some(cx.waker().clone());
            }
        }
        self.conn.evicted.load(Ordering::Acquire).then(|| {
            io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed to make room for a new client connection (max_client_connections)",
            )
        })
    }

    /// The header missed `header_due`: fail this read and every later one, counted once.
    fn overdue(&mut self) -> Poll<io::Result<()>> {
        if !self.expired {
            self.expired = true;
            self.shared.stats.header_timeouts.inc();
        }
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "request header not received within {:?} (timeouts.request_header)",
                self.header_timeout
            ),
        )))
    }
}

impl std::fmt::Debug for GuardedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedStream")
            .field("inner", &self.inner)
            .field("phase", &self.conn.phase.load(Ordering::Relaxed))
            .finish()
    }
}

/// `early_request_filter`: the request header is in, so its deadline is off; and the connection, if it is kept
/// alive, waits at most `idle` for its next request (Pingora keeps HTTP/1.1 connections forever by default); a write
/// to the client that makes no progress for `write` fails the request (Pingora sets no write timeout by default).
///
/// A guarded connection times its idle wait on its own deadline, the timer its header deadline already uses:
/// Pingora's keep-alive timeout would register a timer of its own for every wait.
pub fn header_received(session: &mut Session, idle: Duration, write: Duration) {
    let downstream = session.as_downstream_mut();
    downstream.set_write_timeout(Some(write));
    if let ServerSession::H1(h1) = &*downstream {
        if let Some(g) = GuardedStream::of(h1.stream()) {
            g.conn.phase.store(OFF, Ordering::Release);
            let ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
            g.conn.idle_ms.store(ms, Ordering::Relaxed);
            return;
        }
    }
    if downstream.get_keepalive().is_some() {
        downstream.set_keepalive(Some(idle.as_secs().max(1)));
    }
}

/// `persist_connection_context`: the connection will wait for another request, whose header gets the deadline
/// again from its first byte; meanwhile it may be closed to make room at the cap.
pub fn awaiting_next_request(session: &Session) {
    if let ServerSession::H1(h1) = session.as_downstream() {
        if let Some(g) = GuardedStream::of(h1.stream()) {
            g.conn.phase.store(IDLE_NEW, Ordering::Release);
            g.shared.queue(&g.conn);
        }
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.conn.phase.load(Ordering::Acquire) {
            OFF => Pin::new(&mut this.inner).poll_read(cx, buf),
            phase @ (IDLE | IDLE_NEW) => {
                if let Some(e) = this.check_evicted(cx) {
                    return Poll::Ready(Err(e));
                }
                if phase == IDLE_NEW {
                    let idle = match this.conn.idle_ms.load(Ordering::Relaxed) {
                        0 => DEFAULT_CLIENT_IDLE,
                        ms => Duration::from_millis(ms),
                    };
                    this.deadline
                        .as_mut()
                        .reset(tokio::time::Instant::now() + idle);
                    this.conn.phase.store(IDLE, Ordering::Release);
                }
                let before = buf.filled().len();
                let read = Pin::new(&mut this.inner).poll_read(cx, buf);
                match read {
                    Poll::Ready(Ok(())) if buf.filled().len() > before => {
                        // The next request has begun: its header now has header_timeout.
                        this.header_due = tokio::time::Instant::now() + this.header_timeout;
                        this.conn.phase.store(ARMED, Ordering::Release);
                    }
                    // Idle past timeouts.client_idle: end of stream, which Pingora takes as the client closing
                    // between requests and closes quietly (as when its own keep-alive timeout expires).
                    Poll::Pending if this.deadline.as_mut().poll(cx).is_ready() => {
                        log::debug!("client connection idle past timeouts.client_idle: closing it");
                        return Poll::Ready(Ok(()));
                    }
                    _ => {}
                }
                read
            }
            _ => {
                if let Some(e) = this.check_evicted(cx) {
                    return Poll::Ready(Err(e));
                }
                // Checked on every read, not only by the timer: a client trickling a byte at a time never waits.
                if this.expired || tokio::time::Instant::now() >= this.header_due {
                    return this.overdue();
                }
                let read = Pin::new(&mut this.inner).poll_read(cx, buf);
                if read.is_pending() {
                    if this.deadline.deadline() != this.header_due {
                        this.deadline.as_mut().reset(this.header_due);
                    }
                    if this.deadline.as_mut().poll(cx).is_ready() {
                        return this.overdue();
                    }
                }
                read
            }
        }
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[async_trait]
impl Shutdown for GuardedStream {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await
    }
}

impl UniqueID for GuardedStream {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for GuardedStream {
    fn get_ssl(&self) -> Option<&TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for GuardedStream {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for GuardedStream {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }

    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest)
    }
}

impl GetSocketDigest for GuardedStream {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }

    fn set_socket_digest(&mut self, digest: SocketDigest) {
        self.inner.set_socket_digest(digest)
    }
}

#[async_trait]
impl Peek for GuardedStream {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}
