//! Writing a response: status reason phrases, the response head, and the framing of one body chunk.

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
