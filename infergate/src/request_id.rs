//! Request ids: `x-request-id` is taken from the client when it is a sane token, generated otherwise, and then
//! travels with the request: it replaces the header the engine receives, comes back in the response (also in the
//! errors the router answers itself) and closes the request's access-log line.
//!
//! The router writes the id into the downstream request header as soon as the request head is read, so every
//! later hook (and Pingora's copy of the request sent upstream) sees one value. W3C `traceparent` and `tracestate`
//! are not touched: Pingora forwards every request header the router does not rewrite.

use crate::header_case::Headers;

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
fn generate() -> [u8; 32] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let n = fastrand::u128(..);
    // By hand: `format!` costs more than the rest of `assign` on every request.
    std::array::from_fn(|i| HEX[(n >> (4 * (31 - i))) as usize & 0xf])
}

/// Give the request its id: the client's single valid `x-request-id` is kept, anything else (none, invalid,
/// repeated) is replaced by a new one, so the header then holds exactly one valid id.
pub fn assign(req: &mut dyn Headers) {
    let mut values = req.map().get_all(&NAME).iter();
    if let (Some(v), None) = (values.next(), values.next()) {
        if is_valid(v.as_bytes()) {
            return;
        }
    }
    // Hex digits: always a valid header value.
    if let Ok(id) = http::HeaderValue::from_bytes(&generate()) {
        if req.set(&NAME, id).is_err() {
            req.remove(&NAME);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use pingora_http::RequestHeader;

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
        assert!(a
            .iter()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
    }

    #[test]
    fn a_sane_client_id_is_kept() {
        let mut r = req(&[b"client-42:abc/DEF"]);
        assign(&mut r);
        assert_eq!(header_values(&r), [b"client-42:abc/DEF".to_vec()]);
        let longest = "x".repeat(MAX_LEN);
        let mut r = req(&[longest.as_bytes()]);
        assign(&mut r);
        assert_eq!(header_values(&r), [longest.into_bytes()]);
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
            for direct in [false, true] {
                let mut r = req(&ids);
                if direct {
                    crate::header_case::edit_request(&mut r, assign);
                    assert!(!r.has_case());
                } else {
                    assign(&mut r);
                }
                let values = header_values(&r);
                assert_eq!(values.len(), 1, "{ids:?}");
                assert_eq!(values[0].len(), 32, "{ids:?}");
                assert!(is_valid(&values[0]), "{ids:?}");
            }
        }
    }
}
