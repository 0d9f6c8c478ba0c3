//! Reading one request: its head, keep-alive, and a Content-Length or chunked body; a status for a bad one.

use std::io;
use std::time::Instant;

use tokio::io::AsyncReadExt;

use super::{ConnIo, InBuf};

/// Largest request head (request line + headers).
const MAX_HEAD: usize = 64 * 1024;

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
