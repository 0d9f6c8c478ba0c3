//! A small HTTP/1.1 server connection layer (keep-alive, Content-Length and chunked request bodies, chunked
//! responses flushed event by event), with the hooks the failure knobs need: closing idle connections from
//! outside, resetting a connection, and noticing a client that went away while its response is pending.

use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::TcpStream;

/// Largest request head (request line + headers).
const MAX_HEAD: usize = 64 * 1024;

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

/// A complete request.
#[derive(Debug)]
pub struct Request {
    pub method: String,
    /// Path without the query string.
    pub path: String,
    pub http10: bool,
    /// Lower-case names.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub keep_alive: bool,
    pub received_at: Instant,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Why a request could not be read.
pub enum ReadError {
    /// The connection closed or failed: nothing to answer.
    Io,
    /// A malformed or oversized request: answer with this status and close.
    Status(u16, &'static str),
}

impl From<io::Error> for ReadError {
    fn from(_: io::Error) -> Self {
        ReadError::Io
    }
}

fn find_crlf2(hay: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| p + from)
}

/// Reads one request (head and whole body) from the connection.
pub async fn read_request(
    io: &mut ConnIo,
    rb: &mut InBuf,
    max_body: usize,
) -> Result<Request, ReadError> {
    // Head.
    let mut searched = 0;
    let head_end = loop {
        while rb.data().starts_with(b"\r\n") {
            rb.consume(2);
            searched = 0;
        }
        if let Some(p) = find_crlf2(rb.data(), searched) {
            break p;
        }
        searched = rb.data().len().saturating_sub(3);
        if rb.data().len() > MAX_HEAD {
            return Err(ReadError::Status(431, "request header fields too large"));
        }
        if rb.fill(io).await? == 0 {
            return Err(ReadError::Io);
        }
    };
    let received_at = Instant::now();
    let head = std::str::from_utf8(&rb.data()[..head_end])
        .map_err(|_| ReadError::Status(400, "request head is not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or("");
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ReadError::Status(400, "malformed request line"));
    };
    let http10 = match version {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        _ => return Err(ReadError::Status(505, "HTTP version not supported")),
    };
    if method.is_empty() || !target.starts_with('/') && target != "*" && !target.starts_with("http")
    {
        return Err(ReadError::Status(400, "malformed request line"));
    }
    let mut headers = Vec::new();
    for line in lines {
        let Some((n, v)) = line.split_once(':') else {
            return Err(ReadError::Status(400, "malformed header line"));
        };
        if n.is_empty() || n.contains([' ', '\t']) {
            return Err(ReadError::Status(400, "malformed header name"));
        }
        headers.push((n.to_ascii_lowercase(), v.trim().to_string()));
    }
    let method = method.to_string();
    let mut path = target.split('?').next().unwrap_or("/").to_string();
    if let Some(rest) = path
        .strip_prefix("http://")
        .or_else(|| path.strip_prefix("https://"))
    {
        // Absolute form: keep the path part.
        path = rest
            .find('/')
            .map(|i| rest[i..].to_string())
            .unwrap_or_else(|| "/".to_string());
    }
    rb.consume(head_end + 4);

    let conn_tokens: Vec<String> = headers
        .iter()
        .filter(|(n, _)| n == "connection")
        .flat_map(|(_, v)| {
            v.split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .collect();
    let keep_alive = if http10 {
        conn_tokens.iter().any(|t| t == "keep-alive")
    } else {
        !conn_tokens.iter().any(|t| t == "close")
    };
    let mut req = Request {
        method,
        path,
        http10,
        headers,
        body: Vec::new(),
        keep_alive,
        received_at,
    };

    // Body framing.
    let te: Vec<String> = req
        .headers
        .iter()
        .filter(|(n, _)| n == "transfer-encoding")
        .flat_map(|(_, v)| {
            v.split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .collect();
    let chunked = match te.last() {
        None => false,
        Some(t) if t == "chunked" => true,
        Some(_) => return Err(ReadError::Status(400, "unsupported transfer-encoding")),
    };
    let mut content_length = None;
    if !chunked {
        for (n, v) in &req.headers {
            if n == "content-length" {
                let cl: usize = v
                    .parse()
                    .map_err(|_| ReadError::Status(400, "invalid content-length"))?;
                if content_length.is_some_and(|c| c != cl) {
                    return Err(ReadError::Status(400, "conflicting content-length"));
                }
                content_length = Some(cl);
            }
        }
    }
    if content_length.is_some_and(|cl| cl > max_body) {
        return Err(ReadError::Status(413, "request body too large"));
    }
    let expects_body = chunked || content_length.unwrap_or(0) > 0;
    if expects_body
        && !req.http10
        && rb.is_empty()
        && req
            .header("expect")
            .is_some_and(|e| e.eq_ignore_ascii_case("100-continue"))
    {
        io.write(b"HTTP/1.1 100 Continue\r\n\r\n", false).await?;
    }

    if chunked {
        loop {
            let line = read_line(io, rb).await?;
            let size_str = line.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size_str, 16)
                .map_err(|_| ReadError::Status(400, "invalid chunk size"))?;
            if size == 0 {
                // Trailers until an empty line.
                while !read_line(io, rb).await?.is_empty() {}
                break;
            }
            if req.body.len() + size > max_body {
                return Err(ReadError::Status(413, "request body too large"));
            }
            read_exact_into(io, rb, &mut req.body, size).await?;
            if !read_line(io, rb).await?.is_empty() {
                return Err(ReadError::Status(400, "missing CRLF after chunk"));
            }
        }
    } else if let Some(cl) = content_length {
        req.body.reserve_exact(cl);
        read_exact_into(io, rb, &mut req.body, cl).await?;
    }
    Ok(req)
}

async fn read_exact_into(
    io: &mut ConnIo,
    rb: &mut InBuf,
    out: &mut Vec<u8>,
    mut need: usize,
) -> Result<(), ReadError> {
    while need > 0 {
        if rb.is_empty() {
            if need >= 64 * 1024 {
                // Large remainder: read straight into the body.
                let n = (&mut *io).take(need as u64).read_to_end(out).await?;
                return if n < need { Err(ReadError::Io) } else { Ok(()) };
            }
            if rb.fill(io).await? == 0 {
                return Err(ReadError::Io);
            }
        }
        let take = need.min(rb.data().len());
        out.extend_from_slice(&rb.data()[..take]);
        rb.consume(take);
        need -= take;
    }
    Ok(())
}

async fn read_line(io: &mut ConnIo, rb: &mut InBuf) -> Result<String, ReadError> {
    loop {
        if let Some(p) = rb.data().windows(2).position(|w| w == b"\r\n") {
            let line = String::from_utf8_lossy(&rb.data()[..p]).into_owned();
            rb.consume(p + 2);
            return Ok(line);
        }
        if rb.data().len() > 8192 {
            return Err(ReadError::Status(400, "line too long in chunked body"));
        }
        if rb.fill(io).await? == 0 {
            return Err(ReadError::Io);
        }
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

pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Payload Too Large",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Status",
    }
}

/// Response head. `content_length: None` means a chunked body (HTTP/1.1) or a close-delimited one (HTTP/1.0).
pub fn head(
    status: u16,
    content_type: &str,
    content_length: Option<usize>,
    keep_alive: bool,
    http10: bool,
) -> String {
    let mut h = format!(
        "HTTP/1.1 {} {}\r\nserver: engine-sim\r\n",
        status,
        reason(status)
    );
    if !content_type.is_empty() {
        h.push_str("content-type: ");
        h.push_str(content_type);
        h.push_str("\r\n");
    }
    match content_length {
        Some(n) => h.push_str(&format!("content-length: {n}\r\n")),
        None if !http10 => h.push_str("transfer-encoding: chunked\r\n"),
        None => {}
    }
    if !keep_alive {
        h.push_str("connection: close\r\n");
    } else if http10 {
        h.push_str("connection: keep-alive\r\n");
    }
    h.push_str("\r\n");
    h
}

/// One chunk of a chunked body.
pub fn chunk(data: &[u8]) -> Vec<u8> {
    let mut v = format!("{:x}\r\n", data.len()).into_bytes();
    v.extend_from_slice(data);
    v.extend_from_slice(b"\r\n");
    v
}
