//! Request ids: `x-request-id` is taken from the client when it is a sane token, generated otherwise, and then
//! travels with the request: it replaces the header the engine receives, comes back in the response (also in the
//! errors the router answers itself) and closes the request's access-log line.
//!
//! The router writes the id into the downstream request header as soon as the request head is read, so every
//! later hook (and Pingora's copy of the request sent upstream) sees one value. W3C `traceparent` and `tracestate`
//! are not touched: Pingora forwards every request header the router does not rewrite.

use pingora_http::RequestHeader;

/// The header carrying the id, in both directions.
pub const HEADER: &str = "x-request-id";

/// [`HEADER`] as a parsed name, for lookups (a lookup by a `&str` parses the name each time).
pub static NAME: http::HeaderName = http::HeaderName::from_static(HEADER);

/// Longest id accepted from a client (bytes). Longer ones are replaced, not truncated: a truncated id would
/// silently stop matching the client's own records.
pub const MAX_LEN: usize = 128;

/// Whether a client's id is kept: 1 to [`MAX_LEN`] bytes of visible ASCII (no space, no control character), so it
/// is safe in a log line and in a header.
pub fn is_valid(v: &[u8]) -> bool {
    !v.is_empty() && v.len() <= MAX_LEN && v.iter().all(|b| b.is_ascii_graphic())
}

/// A new id: 128 random bits as 32 lower-case hex digits.
pub fn generate() -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let n = fastrand::u128(..);
    // By hand: `format!` costs more than the rest of `assign` on every request.
    let mut id = String::with_capacity(32);
    for i in 0..32 {
        id.push(char::from(HEX[(n >> (4 * (31 - i))) as usize & 0xf]));
    }
    id
}

/// The request's id: the client's single valid `x-request-id`, else a new one. The header is then set to exactly
/// that value (an invalid or repeated client header is replaced), and the id returned.
pub fn assign(req: &mut RequestHeader) -> String {
    let mut values = req.headers.get_all(&NAME).iter();
    let client = match (values.next(), values.next()) {
        (Some(v), None) if is_valid(v.as_bytes()) => v.to_str().ok().map(str::to_string),
        _ => None,
    };
    if let Some(id) = client {
        return id;
    }
    let id = generate();
    // A generated id is hex: always a valid header value.
    if req.insert_header(HEADER, id.as_str()).is_err() {
        req.remove_header(HEADER);
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(ids: &[&[u8]]) -> RequestHeader {
        let mut r = RequestHeader::build("POST", b"/v1/chat/completions", None).unwrap();
        for id in ids {
            r.append_header(HEADER, http::HeaderValue::from_bytes(id).unwrap())
                .unwrap();
        }
        r
    }

    fn header_values(r: &RequestHeader) -> Vec<Vec<u8>> {
        r.headers
            .get_all(HEADER)
            .iter()
            .map(|v| v.as_bytes().to_vec())
            .collect()
    }

    #[test]
    fn generated_ids_are_128_bit_hex_and_differ() {
        let a = generate();
        let b = generate();
        assert_eq!(a.len(), 32);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
    }

    #[test]
    fn a_sane_client_id_is_kept() {
        let mut r = req(&[b"client-42:abc/DEF"]);
        assert_eq!(assign(&mut r), "client-42:abc/DEF");
        assert_eq!(header_values(&r), [b"client-42:abc/DEF".to_vec()]);
        let longest = "x".repeat(MAX_LEN);
        let mut r = req(&[longest.as_bytes()]);
        assert_eq!(assign(&mut r), longest);
    }

    #[test]
    fn missing_invalid_or_repeated_ids_are_replaced() {
        let too_long = "x".repeat(MAX_LEN + 1);
        for ids in [
            vec![],
            vec![b"has space".as_slice()],
            vec![b"tab\there".as_slice()],
            vec![too_long.as_bytes()],
            vec!["caf\u{e9}".as_bytes()],
            vec![b"a".as_slice(), b"b".as_slice()],
        ] {
            let mut r = req(&ids);
            let id = assign(&mut r);
            assert_eq!(id.len(), 32, "{ids:?}");
            assert_eq!(header_values(&r), [id.into_bytes()], "{ids:?}");
        }
    }
}
