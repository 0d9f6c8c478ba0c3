//! The path rules, pure: request-target normalisation, the inference API's routes, and what `expose_paths` may
//! list.
//!
//! A target is percent-decoded once (an encoded `/`, `\`, `%` or control character is refused: no decoding trick
//! can reach an engine route that the plain path would not), `.` and `..` segments refused, empty segments (`//`,
//! a trailing `/`) dropped, the query string kept aside. The normalised path is what is matched and what is
//! forwarded (re-encoded canonically), so the engine sees exactly the path that was allowed.
//!
//! Allowed by default: `POST` to the generation, embedding, Anthropic messages and tokenizer routes, `GET
//! /v1/models`, `GET /v1/models/{id}` and `GET /health` (the three GETs answered by the router), and a stored
//! response's `GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel` (to the engine holding it).

/// `POST` routes of the inference API (vLLM's OpenAI and Anthropic front ends and its tokenizer).
const API_POST: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/tokenize",
    "/detokenize",
    "/v1/tokenize",
    "/v1/detokenize",
];

/// `GET` routes the router answers itself.
const ROUTER_GET: &[&str] = &["/health", "/v1/models"];

/// `GET /v1/models/{id}` (the id may contain `/`, as model names do).
pub(crate) const MODEL_PREFIX: &str = "/v1/models/";

/// `GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel`: a stored response, served by the engine that holds
/// it (stored_responses).
const RESPONSE_PREFIX: &str = "/v1/responses/";

/// The id in `/v1/responses/{id}` (`GET`) or `/v1/responses/{id}/cancel` (`POST`), if `path` is one of those.
pub(crate) fn stored_response_id<'p>(method: &str, path: &'p str) -> Option<&'p str> {
    let rest = path.strip_prefix(RESPONSE_PREFIX)?;
    let id = match method {
        "GET" => rest,
        "POST" => rest.strip_suffix("/cancel")?,
        _ => return None,
    };
    Some(id).filter(|id| !id.is_empty() && !id.contains('/'))
}

/// Bytes kept as they are in a forwarded path (RFC 3986 `pchar` without `%`, plus `/`); all else is encoded.
fn is_path_safe(b: u8) -> bool {
    PATH_SAFE[usize::from(b)]
}

/// [`is_path_safe`] as a table: it is asked for every byte of every request's path.
static PATH_SAFE: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric();
        b += 1;
    }
    let extra = b"-._~!$&'()*+,;=:@/";
    let mut i = 0;
    while i < extra.len() {
        t[extra[i] as usize] = true;
        i += 1;
    }
    t
};

/// Why a request target cannot be normalised; the client gets a 400.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathError {
    /// Not a path (absolute-form `http://host/...`, `*`, empty).
    NotOriginForm,
    /// `%` not followed by two hex digits.
    BadEscape,
    /// `%2F` or `%5C`: a separator smuggled past the segment checks.
    EncodedSeparator,
    /// `%25`: a second layer of encoding.
    EncodedPercent,
    /// A literal `\`, which some servers read as `/`.
    Backslash,
    /// A control character (NUL included), literal or encoded.
    ControlChar,
    /// A `.` or `..` segment (also when encoded as `%2e`).
    DotSegment,
    /// The decoded path or the query is not UTF-8.
    NotUtf8,
}

impl PathError {
    pub fn reason(self) -> &'static str {
        match self {
            PathError::NotOriginForm => "the request target must be a path starting with `/`",
            PathError::BadEscape => "`%` must be followed by two hex digits",
            PathError::EncodedSeparator => "an encoded `/` or `\\` is not allowed",
            PathError::EncodedPercent => "an encoded `%` (double encoding) is not allowed",
            PathError::Backslash => "`\\` is not allowed",
            PathError::ControlChar => "control characters are not allowed",
            PathError::DotSegment => "`.` and `..` segments are not allowed",
            PathError::NotUtf8 => "the path and query must be UTF-8",
        }
    }
}

/// A normalised request target: the decoded path (starting with `/`, no empty, `.` or `..` segment, no trailing
/// `/` except the root itself) and the query as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub path: String,
    pub query: Option<String>,
}

impl Target {
    /// The path re-encoded canonically, with the query: what goes upstream.
    pub fn upstream(&self) -> String {
        let mut out = String::with_capacity(self.path.len() + 8);
        for &b in self.path.as_bytes() {
            if is_path_safe(b) {
                out.push(char::from(b));
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
        if let Some(q) = &self.query {
            out.push('?');
            out.push_str(q);
        }
        out
    }

    /// Whether `raw` is exactly what [`Target::upstream`] gives, without building it: true for the common case (a
    /// path that needs no encoding, received as it goes upstream); false may also mean "not without building it".
    pub fn is_upstream(&self, raw: &[u8]) -> bool {
        let Some(rest) = raw.strip_prefix(self.path.as_bytes()) else {
            return false;
        };
        let query_same = match &self.query {
            Some(q) => rest.first() == Some(&b'?') && &rest[1..] == q.as_bytes(),
            None => rest.is_empty(),
        };
        query_same && self.path.bytes().all(is_path_safe)
    }
}

/// Whether `path` is already normal: path-safe bytes only (so nothing to decode and nothing to re-encode), no
/// empty, `.` or `..` segment, no trailing `/` but the root's. Every request target an SDK sends is.
fn is_normal(path: &[u8]) -> bool {
    if path == b"/" {
        return true;
    }
    let Some(rest) = path.strip_prefix(b"/") else {
        return false;
    };
    // One pass over the bytes: it runs on every request.
    let bad_segment = |seg: &[u8]| matches!(seg, b"" | b"." | b"..");
    let mut start = 0;
    for (i, &b) in rest.iter().enumerate() {
        if b == b'/' {
            if bad_segment(&rest[start..i]) {
                return false;
            }
            start = i + 1;
        } else if !is_path_safe(b) {
            return false;
        }
    }
    !bad_segment(&rest[start..])
}

/// Normalise a raw request target (`/v1/chat/completions?x=1`).
pub fn normalize(raw: &[u8]) -> Result<Target, PathError> {
    let (path, query) = match raw.iter().position(|&b| b == b'?') {
        Some(i) => (&raw[..i], Some(&raw[i + 1..])),
        None => (raw, None),
    };
    if path.first() != Some(&b'/') {
        return Err(PathError::NotOriginForm);
    }
    let path = if is_normal(path) {
        // Path-safe bytes are ASCII.
        String::from_utf8(path.to_vec()).map_err(|_| PathError::NotUtf8)?
    } else {
        normal_path(path)?
    };
    Ok(Target {
        path,
        query: normal_query(query)?,
    })
}

/// Decode `path` (it starts with `/`) and drop its empty segments, or say why it cannot be.
fn normal_path(path: &[u8]) -> Result<String, PathError> {
    let mut decoded = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        let b = path[i];
        match b {
            b'%' => {
                let hex = |j: usize| path.get(j).and_then(|&c| char::from(c).to_digit(16));
                let (Some(hi), Some(lo)) = (hex(i + 1), hex(i + 2)) else {
                    return Err(PathError::BadEscape);
                };
                let c = u8::try_from(hi * 16 + lo).map_err(|_| PathError::BadEscape)?;
                match c {
                    b'/' | b'\\' => return Err(PathError::EncodedSeparator),
                    b'%' => return Err(PathError::EncodedPercent),
                    c if c < 0x20 || c == 0x7f => return Err(PathError::ControlChar),
                    c => decoded.push(c),
                }
                i += 3;
            }
            b'\\' => return Err(PathError::Backslash),
            b if b < 0x20 || b == 0x7f => return Err(PathError::ControlChar),
            b => {
                decoded.push(b);
                i += 1;
            }
        }
    }
    let decoded = String::from_utf8(decoded).map_err(|_| PathError::NotUtf8)?;
    let mut path = String::with_capacity(decoded.len());
    for segment in decoded.split('/').filter(|s| !s.is_empty()) {
        if segment == "." || segment == ".." {
            return Err(PathError::DotSegment);
        }
        path.push('/');
        path.push_str(segment);
    }
    if path.is_empty() {
        path.push('/');
    }
    Ok(path)
}

/// The query as received (none when empty): no control character, UTF-8.
fn normal_query(query: Option<&[u8]>) -> Result<Option<String>, PathError> {
    match query {
        None | Some([]) => Ok(None),
        Some(q) => {
            if q.iter().any(|&b| b < 0x20 || b == 0x7f) {
                return Err(PathError::ControlChar);
            }
            String::from_utf8(q.to_vec())
                .map(Some)
                .map_err(|_| PathError::NotUtf8)
        }
    }
}

/// Whether the inference API serves `method path` (a normalised path) without any `expose_paths`.
pub fn api_allows(method: &str, path: &str) -> bool {
    match method {
        "POST" => API_POST.contains(&path) || stored_response_id(method, path).is_some(),
        "GET" => {
            ROUTER_GET.contains(&path)
                || path
                    .strip_prefix(MODEL_PREFIX)
                    .is_some_and(|id| !id.is_empty())
                || stored_response_id(method, path).is_some()
        }
        _ => false,
    }
}

/// An `expose_paths` entry as written, normalised; or why it cannot be listed.
pub fn check_exposable(path: &str) -> Result<String, String> {
    if path.contains(['%', '?', '#']) {
        return Err(format!(
            "`{path}` must be a plain path: no `%`, `?` or `#` (the query string is ignored for matching)"
        ));
    }
    let t = normalize(path.as_bytes()).map_err(|e| format!("`{path}`: {}", e.reason()))?;
    if !t.path.bytes().all(is_path_safe) {
        return Err(format!(
            "`{path}` may contain only letters, digits, `/` and - . _ ~ ! $ & ' ( ) * + , ; = : @"
        ));
    }
    if ROUTER_GET.contains(&t.path.as_str()) {
        return Err(format!(
            "`{}` is answered by the router itself and is never forwarded",
            t.path
        ));
    }
    if API_POST.contains(&t.path.as_str()) {
        return Err(format!(
            "`{}` is part of the inference API, which is always served; remove it",
            t.path
        ));
    }
    Ok(t.path)
}

/// Longest id accepted (vLLM's are `resp_` and 32 hex digits).
const MAX_RESPONSE_ID_LEN: usize = 128;

/// Whether `id` can name a stored response: 1 to 128 letters, digits, `_`, `-` or `.` (what is echoed in an
/// error message or kept in the map is never anything else).
pub fn is_valid_response_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_RESPONSE_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(raw: &str) -> Result<String, PathError> {
        normalize(raw.as_bytes()).map(|t| t.upstream())
    }

    #[test]
    fn normalises_paths() {
        for (raw, want) in [
            ("/v1/chat/completions", "/v1/chat/completions"),
            ("/v1/chat/completions/", "/v1/chat/completions"),
            ("//v1///chat//completions//", "/v1/chat/completions"),
            (
                "/v1/chat/completions?api-version=2&x=%2F",
                "/v1/chat/completions?api-version=2&x=%2F",
            ),
            ("/v1/chat/completions?", "/v1/chat/completions"),
            ("/v1/%63hat/completions", "/v1/chat/completions"),
            (
                "/v1/models/meta-llama/Llama-3-8B",
                "/v1/models/meta-llama/Llama-3-8B",
            ),
            ("/v1/models/a%20b", "/v1/models/a%20b"),
            ("/v1/models/caf%C3%A9", "/v1/models/caf%C3%A9"),
            ("/v1/models/a%3Fb%23c", "/v1/models/a%3Fb%23c"),
            ("/v1/models/...", "/v1/models/..."),
            ("/v1/models/.hidden", "/v1/models/.hidden"),
            ("/", "/"),
            ("//", "/"),
            ("/?x", "/?x"),
        ] {
            assert_eq!(norm(raw), Ok(want.to_string()), "{raw}");
        }
        let t = normalize(b"/v1/models/a%20b/?q=1").unwrap();
        assert_eq!(t.path, "/v1/models/a b");
        assert_eq!(t.query.as_deref(), Some("q=1"));
    }

    #[test]
    fn the_fast_path_agrees_with_the_general_one() {
        // Every path over a small alphabet up to 5 bytes: whatever `is_normal` lets through, `normal_path`
        // leaves as it is.
        let alphabet = b"/a.%2F\\~ ";
        let mut paths: Vec<Vec<u8>> = vec![b"/".to_vec()];
        let mut frontier = paths.clone();
        for _ in 0..4 {
            let mut next = Vec::new();
            for p in &frontier {
                for &c in alphabet {
                    let mut q = p.clone();
                    q.push(c);
                    next.push(q);
                }
            }
            paths.extend(next.iter().cloned());
            frontier = next;
        }
        let mut fast = 0;
        for p in &paths {
            if is_normal(p) {
                fast += 1;
                assert_eq!(
                    normal_path(p).as_deref(),
                    Ok(std::str::from_utf8(p).unwrap()),
                    "{}",
                    String::from_utf8_lossy(p)
                );
            }
        }
        assert!(fast > 50, "{fast}");
        for slow in ["/a/", "//a", "/a/./b", "/a/..", "/%61", "/a b", "/a\\b"] {
            assert!(!is_normal(slow.as_bytes()), "{slow}");
        }
    }

    #[test]
    fn a_canonical_target_is_recognised_without_rebuilding_it() {
        for raw in [
            "/v1/chat/completions",
            "/v1/chat/completions?x=1",
            "/v1/chat/completions/",
            "/v1/chat/completions?",
            "/v1/%63hat/completions",
            "/v1/models/a%20b",
            "/v1/models/a%20b?q",
            "//v1/models",
        ] {
            let t = normalize(raw.as_bytes()).unwrap();
            let same = t.upstream() == raw;
            let needs_no_encoding = t.path.bytes().all(is_path_safe);
            assert_eq!(
                t.is_upstream(raw.as_bytes()),
                same && needs_no_encoding,
                "{raw}"
            );
        }
    }

    #[test]
    fn refuses_traversal_and_smuggling() {
        use PathError::*;
        for (raw, want) in [
            ("/../../etc/passwd", DotSegment),
            ("/v1/../metrics", DotSegment),
            ("/v1/./chat/completions", DotSegment),
            ("/v1/chat/completions/..", DotSegment),
            ("/.", DotSegment),
            ("/%2e%2e/%2e%2e/etc/passwd", DotSegment),
            ("/v1/%2E%2E/metrics", DotSegment),
            ("/v1/%2e/chat/completions", DotSegment),
            ("/v1/.%2e/metrics", DotSegment),
            ("/v1%2fchat%2fcompletions", EncodedSeparator),
            ("/v1%2Fchat/completions", EncodedSeparator),
            ("/v1/chat%5ccompletions", EncodedSeparator),
            ("/v1\\chat\\completions", Backslash),
            ("/..\\metrics", Backslash),
            ("/v1/chat/completions%00", ControlChar),
            ("/v1/chat/completions%0d%0aX: y", ControlChar),
            ("/v1/chat/completions\0", ControlChar),
            ("/v1/chat/completions?a\x01", ControlChar),
            ("/%252e%252e/metrics", EncodedPercent),
            ("/v1/%25", EncodedPercent),
            ("/v1/%", BadEscape),
            ("/v1/%2", BadEscape),
            ("/v1/%zz", BadEscape),
            ("/v1/%ff", NotUtf8),
            ("http://engine/metrics", NotOriginForm),
            ("*", NotOriginForm),
            ("", NotOriginForm),
            ("v1/chat/completions", NotOriginForm),
        ] {
            assert_eq!(norm(raw), Err(want), "{raw:?}");
        }
        assert_eq!(normalize(b"/v1/\xff"), Err(NotUtf8));
        assert_eq!(normalize(b"/v1?\xff"), Err(NotUtf8));
    }

    #[test]
    fn the_inference_api_is_allowed_by_default() {
        for p in API_POST {
            assert!(api_allows("POST", p), "{p}");
            assert!(!api_allows("GET", p), "GET {p}");
        }
        assert!(api_allows("GET", "/v1/models"));
        assert!(api_allows("GET", "/health"));
        assert!(api_allows("GET", "/v1/models/meta-llama/Llama-3-8B"));
        assert!(api_allows("GET", "/v1/responses/resp_1"));
        assert!(api_allows("POST", "/v1/responses/resp_1/cancel"));
        for (m, p) in [
            ("GET", "/v1/responses"),
            ("GET", "/v1/responses/a/b"),
            ("GET", "/v1/responses/resp_1/input_items"),
            ("DELETE", "/v1/responses/resp_1"),
            ("POST", "/v1/responses/resp_1"),
            ("POST", "/v1/responses//cancel"),
            ("POST", "/sleep"),
            ("POST", "/wake_up"),
            ("POST", "/collective_rpc"),
            ("POST", "/reset_prefix_cache"),
            ("POST", "/v1/load_lora_adapter"),
            ("POST", "/v1/models"),
            ("GET", "/metrics"),
            ("GET", "/ping"),
            ("GET", "/"),
            ("GET", "/v1/chat/completions"),
            ("PUT", "/v1/chat/completions"),
            ("DELETE", "/v1/models/x"),
            ("HEAD", "/health"),
            ("post", "/v1/completions"),
            ("POST", "/V1/completions"),
            ("POST", "/v1/completions2"),
            ("POST", "/v1/chat"),
        ] {
            assert!(!api_allows(m, p), "{m} {p}");
        }
    }

    #[test]
    fn exposable_entries() {
        assert_eq!(check_exposable("/metrics"), Ok("/metrics".to_string()));
        assert_eq!(check_exposable("/metrics/"), Ok("/metrics".to_string()));
        assert_eq!(
            check_exposable("/v1/load_lora_adapter"),
            Ok("/v1/load_lora_adapter".to_string())
        );
        for (entry, needle) in [
            ("metrics", "starting with `/`"),
            ("/a/../b", "`..` segments"),
            ("/a%2fb", "plain path"),
            ("/metrics?x=1", "plain path"),
            ("/a b", "only letters"),
            ("/health", "answered by the router"),
            ("/v1/models/", "answered by the router"),
            ("/v1/chat/completions", "always served"),
        ] {
            let e = check_exposable(entry).unwrap_err();
            assert!(e.contains(needle), "{entry}: {e}");
        }
    }
}
