//! A small HTTP/1.1 server connection layer (keep-alive, Content-Length and chunked request bodies, chunked
//! responses flushed event by event), with the hooks the failure knobs need: closing idle connections from
//! outside, resetting a connection, and noticing a client that went away while its response is pending.

mod request;
mod response;

use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::TcpStream;

pub use request::{read_request, ReadError, Request};
pub use response::{chunk, head, reason};

/// One accepted connection, shared between its task and the engine's registry (which may close it any time).
pub struct ConnShared {
    pub id: u64,
    stream: Mutex<Option<TcpStream>>,
    /// True from the first byte of a request until the last byte of its response is written. Changed only with
    /// `stream` locked, so `close_if_idle` never races a request that has started arriving.
    busy: AtomicBool,
    /// Set by `Control::poison_idle_connections`: the next request on this connection is answered with a reset.
    pub poisoned: AtomicBool,
}

impl ConnShared {
    pub fn new(id: u64, stream: TcpStream) -> Self {
        ConnShared {
            id,
            stream: Mutex::new(Some(stream)),
            busy: AtomicBool::new(false),
            poisoned: AtomicBool::new(false),
        }
    }

    /// Closes the connection (FIN) at once if no request is in progress on it. Returns whether it closed.
    pub fn close_if_idle(&self) -> bool {
        let mut g = self.stream.lock().unwrap();
        if g.is_some() && !self.busy.load(Ordering::SeqCst) {
            *g = None;
            true
        } else {
            false
        }
    }

    /// Marks the connection poisoned if it is idle now. Returns whether it did.
    pub fn poison_if_idle(&self) -> bool {
        let g = self.stream.lock().unwrap();
        if g.is_some() && !self.busy.load(Ordering::SeqCst) {
            self.poisoned.store(true, Ordering::SeqCst);
            true
        } else {
            false
        }
    }

    /// Closes the connection now (FIN, or RST if unread data is pending).
    pub fn close(&self) {
        self.stream.lock().unwrap().take();
    }

    /// Closes the connection abruptly with a TCP reset (SO_LINGER 0).
    pub fn reset(&self) {
        if let Some(s) = self.stream.lock().unwrap().take() {
            let _ = s.set_zero_linger();
        }
    }

    pub fn set_idle(&self) {
        let _g = self.stream.lock().unwrap();
        self.busy.store(false, Ordering::SeqCst);
    }
}

fn gone() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "connection closed by the simulator",
    )
}

/// Reading and writing through the shared slot.
#[derive(Clone)]
pub struct ConnIo(pub Arc<ConnShared>);

impl AsyncRead for ConnIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let shared = &self.0;
        let mut g = shared.stream.lock().unwrap();
        let Some(s) = g.as_mut() else {
            return Poll::Ready(Err(gone()));
        };
        let before = buf.filled().len();
        let r = Pin::new(s).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            shared.busy.store(true, Ordering::SeqCst);
        }
        r
    }
}

impl ConnIo {
    /// Writes all of `data`; with `mark_idle` the connection becomes idle in the same critical section as the
    /// write of the last byte, so a client that has read the whole response always finds it idle.
    pub async fn write(&self, data: &[u8], mark_idle: bool) -> io::Result<()> {
        let mut off = 0;
        poll_fn(|cx| {
            let mut g = self.0.stream.lock().unwrap();
            let Some(s) = g.as_mut() else {
                return Poll::Ready(Err(gone()));
            };
            while off < data.len() {
                match tokio::io::AsyncWrite::poll_write(Pin::new(&mut *s), cx, &data[off..]) {
                    Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                    Poll::Ready(Ok(n)) => off += n,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
            }
            if mark_idle {
                self.0.busy.store(false, Ordering::SeqCst);
            }
            Poll::Ready(Ok(()))
        })
        .await
    }
}

/// Bytes read from the connection and not yet consumed.
#[derive(Default)]
pub struct InBuf {
    buf: Vec<u8>,
    pos: usize,
}

impl InBuf {
    pub fn data(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    pub fn is_empty(&self) -> bool {
        self.pos == self.buf.len()
    }

    fn consume(&mut self, n: usize) {
        self.pos += n;
        if self.pos >= self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
    }

    /// Reads more bytes; Ok(0) on EOF. Cancel safe.
    pub async fn fill(&mut self, io: &mut ConnIo) -> io::Result<usize> {
        if self.pos > 0 && self.pos * 2 >= self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.reserve(64 * 1024);
        io.read_buf(&mut self.buf).await
    }
}

/// Runs `fut` while watching the connection: None if the client closed it (EOF or error) first. Bytes the
/// client sends meanwhile (a pipelined request) are kept in `rb`.
pub async fn watch<F: Future>(io: &mut ConnIo, rb: &mut InBuf, fut: F) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    let mut can_read = true;
    loop {
        tokio::select! {
            biased;
            out = &mut fut => return Some(out),
            r = rb.fill(io), if can_read => match r {
                Ok(0) | Err(_) => return None,
                Ok(_) => {
                    // Stop watching once a lot is buffered; the write side will still notice a dead peer.
                    can_read = rb.data().len() < 1 << 20;
                }
            },
        }
    }
}
