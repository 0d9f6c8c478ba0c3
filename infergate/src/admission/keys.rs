//! Client key matching: which presented credentials a request carries and which configured key they are,
//! compared in constant time. Pure: header values in, an index out.

use subtle::ConstantTimeEq;

/// The credentials a request presents: `Authorization: Bearer KEY` (the OpenAI SDKs) and `x-api-key: KEY` (the
/// Anthropic SDK). Either may be absent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Presented<'a> {
    pub bearer: Option<&'a [u8]>,
    pub x_api_key: Option<&'a [u8]>,
}

impl<'a> Presented<'a> {
    /// From the raw header values (the first of each header).
    pub fn from_headers(authorization: Option<&'a [u8]>, x_api_key: Option<&'a [u8]>) -> Self {
        Presented {
            bearer: authorization.and_then(bearer_token),
            x_api_key: x_api_key.map(trim).filter(|k| !k.is_empty()),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.bearer.is_none() && self.x_api_key.is_none()
    }
}

/// The token of `Bearer TOKEN` (scheme case-insensitive, surrounding whitespace ignored); None for other schemes.
pub fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let v = trim(value);
    let scheme = v.get(..7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    Some(trim(&v[7..])).filter(|t| !t.is_empty())
}

fn trim(v: &[u8]) -> &[u8] {
    v.trim_ascii()
}

/// The index of the configured key equal to one of the presented credentials, if any. Every configured key is
/// compared with every presented credential, each comparison in constant time (`subtle`), with no early exit, so
/// the time taken says nothing about which key nearly matched. (A key's length is not hidden; keys are long.)
pub fn match_key(keys: &[&[u8]], presented: &Presented) -> Option<usize> {
    let mut found = None;
    for cand in [presented.bearer, presented.x_api_key]
        .into_iter()
        .flatten()
    {
        for (i, key) in keys.iter().enumerate() {
            if bool::from(key.ct_eq(cand)) && found.is_none() {
                found = Some(i);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_recognised() {
        assert_eq!(bearer_token(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"  bearer   abc  "), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"BEARER abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"Bearer "), None);
        assert_eq!(bearer_token(b"Basic abc"), None);
        assert_eq!(bearer_token(b"abc"), None);
        assert_eq!(bearer_token(b""), None);
    }

    #[test]
    fn presented_from_headers() {
        let p = Presented::from_headers(Some(b"Bearer k1"), Some(b" k2 "));
        assert_eq!(p.bearer, Some(&b"k1"[..]));
        assert_eq!(p.x_api_key, Some(&b"k2"[..]));
        assert!(Presented::from_headers(Some(b"Basic x"), Some(b"  ")).is_empty());
        assert!(Presented::from_headers(None, None).is_empty());
    }

    #[test]
    fn keys_match_exactly_through_either_header() {
        let keys: [&[u8]; 3] = [
            b"alpha-key-000000",
            b"beta-key-1111111",
            b"gamma-key-222222",
        ];
        let m = |bearer: Option<&[u8]>, x: Option<&[u8]>| {
            match_key(
                &keys,
                &Presented {
                    bearer,
                    x_api_key: x,
                },
            )
        };
        assert_eq!(m(Some(b"beta-key-1111111"), None), Some(1));
        assert_eq!(m(None, Some(b"gamma-key-222222")), Some(2));
        // A wrong bearer does not hide a right x-api-key (a client may send both), and the other way round.
        assert_eq!(m(Some(b"wrong"), Some(b"alpha-key-000000")), Some(0));
        assert_eq!(m(Some(b"alpha-key-000000"), Some(b"wrong")), Some(0));
        // Prefixes, extensions and case changes are different keys.
        assert_eq!(m(Some(b"beta-key-111111"), None), None);
        assert_eq!(m(Some(b"beta-key-11111111"), None), None);
        assert_eq!(m(Some(b"BETA-KEY-1111111"), None), None);
        assert_eq!(m(None, None), None);
        assert_eq!(
            match_key(&[], &Presented::from_headers(Some(b"Bearer x"), None)),
            None
        );
    }
}
