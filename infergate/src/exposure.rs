//! What the client port serves: request-path normalisation, the inference API allowed by default, the paths
//! `expose_paths` adds (for every pool or for one), and the pool a request to an exposed path goes to.
//!
//! Every request is screened before anything else happens to it. Its target is normalised: percent-decoded once
//! (an encoded `/`, `\`, `%` or control character is refused: no decoding trick can reach an engine route that
//! the plain path would not), `.` and `..` segments refused, empty segments (`//`, a trailing `/`) dropped, the
//! query string kept aside. The normalised path is what is matched and what is forwarded (re-encoded
//! canonically), so the engine sees exactly the path that was allowed.
//!
//! Allowed by default: `POST` to the generation, embedding, Anthropic messages and tokenizer routes, `GET
//! /v1/models`, `GET /v1/models/{id}` and `GET /health` (the three GETs answered by the router), and a stored
//! response's `GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel` (to the engine holding it). Everything else is a 404
//! from the router unless listed in `expose_paths` (any method): at the top level for every pool, or in a pool
//! for that pool only.

use http::Uri;
use pingora_error::{Error, ErrorType};
use pingora_http::RequestHeader;

use crate::config::Config;
use crate::proxy::ApiError;
use crate::request::{self, CallKind};

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
const MODEL_PREFIX: &str = "/v1/models/";

/// `GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel`: a stored response, served by the engine that holds
/// it (stored_responses).
const RESPONSE_PREFIX: &str = "/v1/responses/";

/// The id in `/v1/responses/{id}` (`GET`) or `/v1/responses/{id}/cancel` (`POST`), if `path` is one of those.
fn stored_response_id<'p>(method: &str, path: &'p str) -> Option<&'p str> {
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
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/".contains(&b)
}

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
    let query = match query {
        None | Some([]) => None,
        Some(q) => {
            if q.iter().any(|&b| b < 0x20 || b == 0x7f) {
                return Err(PathError::ControlChar);
            }
            Some(String::from_utf8(q.to_vec()).map_err(|_| PathError::NotUtf8)?)
        }
    };
    Ok(Target { path, query })
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

/// How a screened request is allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The inference API: every pool serves it; the pool is chosen by the body's model.
    Api,
    /// Listed in the top-level `expose_paths`: every pool; chosen by the body's model as for the API.
    Everywhere,
    /// Listed in the `expose_paths` of one or more pools only.
    Pools,
}

/// A request that passed screening.
#[derive(Debug, Clone, PartialEq)]
pub struct Screened {
    pub method: String,
    pub target: Target,
    pub route: Route,
    /// How the request counts: an exposed path is always passive (no prefill tokens, no placement).
    pub kind: CallKind,
}

impl Screened {
    /// The id of a `GET /v1/models/{id}` (decoded), if this is one and it is not an exposed path.
    pub fn model_id(&self) -> Option<&str> {
        if self.method != "GET" || !matches!(self.route, Route::Api) {
            return None;
        }
        self.target
            .path
            .strip_prefix(MODEL_PREFIX)
            .filter(|id| !id.is_empty())
    }

    /// The id of a stored response this retrieves or cancels (decoded), if it is one and not an exposed path.
    pub fn stored_response_id(&self) -> Option<&str> {
        if !matches!(self.route, Route::Api) {
            return None;
        }
        stored_response_id(&self.method, &self.target.path)
    }

    /// Send the normalised target upstream instead of the one the client wrote.
    pub fn set_upstream_target(&self, req: &mut RequestHeader) -> pingora_error::Result<()> {
        let upstream = self.target.upstream();
        if req.raw_path() == upstream.as_bytes() {
            return Ok(()); // already canonical: the common case
        }
        let uri: Uri = upstream.parse().map_err(|_| {
            Error::explain(
                ErrorType::InternalError,
                "normalised path is not a valid URI",
            )
        })?;
        req.set_uri(uri);
        Ok(())
    }
}

/// What Pingora's warn and error lines show of a request: method, normalised path and Host, never the query
/// string (Pingora's default prints the target as written, and a query may carry a key).
pub fn request_summary(req: &RequestHeader, screened: Option<&Screened>) -> String {
    let path = match screened {
        Some(s) => s.target.path.clone(),
        None => normalize(req.raw_path()).map_or_else(|_| "(invalid path)".to_string(), |t| t.path),
    };
    let host = req
        .headers
        .get(http::header::HOST)
        .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
        .unwrap_or_default();
    format!("{} {path}, Host: {host}", req.method)
}

/// The exposure rules of one configuration.
#[derive(Debug, Clone, Default)]
pub struct Exposure {
    /// Top-level `expose_paths` (normalised).
    everywhere: Vec<String>,
    /// Each pool's `expose_paths`, by pool index.
    per_pool: Vec<Vec<String>>,
}

impl Exposure {
    pub fn new(cfg: &Config) -> Exposure {
        Exposure {
            everywhere: cfg.expose_paths.clone(),
            per_pool: cfg.pools.iter().map(|p| p.expose_paths.clone()).collect(),
        }
    }

    /// Screen a request: a 400 for a target that cannot be normalised, a 404 for a path not served.
    pub fn screen_request(&self, req: &RequestHeader) -> Result<Screened, ApiError> {
        self.screen(req.method.as_str(), req.raw_path())
    }

    pub fn screen(&self, method: &str, raw_target: &[u8]) -> Result<Screened, ApiError> {
        let target = normalize(raw_target).map_err(|e| ApiError::invalid_path(e.reason()))?;
        let (route, kind) = if api_allows(method, &target.path) {
            (Route::Api, request::classify(method, &target.path))
        } else if self.everywhere.contains(&target.path) {
            (Route::Everywhere, CallKind::Passive)
        } else if self.per_pool.iter().any(|p| p.contains(&target.path)) {
            (Route::Pools, CallKind::Passive)
        } else {
            return Err(ApiError::not_found(method, &target.path));
        };
        Ok(Screened {
            method: method.to_string(),
            target,
            route,
            kind,
        })
    }

    /// The pool (index into `cfg.pools`) a screened request goes to, given the body's model.
    ///
    /// API and top-level exposed paths: the model's pool (`Config::pool_for_model`). A path exposed by pools only:
    /// with a model, the model's pool, which must list the path (else 404); without one, the pool a model-less
    /// request would go to if it lists the path, else the first pool (in file order) that lists it.
    pub fn pool(&self, cfg: &Config, model: Option<&str>, s: &Screened) -> Result<usize, ApiError> {
        let by_model = cfg.pool_for_model(model);
        if s.route != Route::Pools {
            return by_model.ok_or_else(|| ApiError::model_not_found(model));
        }
        let lists = |i: &usize| {
            self.per_pool
                .get(*i)
                .is_some_and(|p| p.contains(&s.target.path))
        };
        let chosen = match model {
            Some(_) => {
                let i = by_model.ok_or_else(|| ApiError::model_not_found(model))?;
                Some(i).filter(lists)
            }
            None => by_model
                .filter(lists)
                .or_else(|| (0..self.per_pool.len()).find(lists)),
        };
        chosen.ok_or_else(|| ApiError::not_found(&s.method, &s.target.path))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

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

    fn config(text: &str) -> Config {
        Config::parse(Path::new("t.yaml"), text).unwrap_or_else(|e| panic!("{e}"))
    }

    const TWO_POOLS: &str = "expose_paths: [/metrics]\npools:\n\
        \x20 - name: a\n    models: [m1]\n    endpoints: [\"http://127.0.0.1:1\"]\n    expose_paths: [/v1/load_lora_adapter, /sleep]\n\
        \x20 - name: b\n    models: [\"*\"]\n    endpoints: [\"http://127.0.0.1:2\"]\n    expose_paths: [/v1/load_lora_adapter]\n\
        \x20 - name: c\n    models: [m3]\n    endpoints: [\"http://127.0.0.1:3\"]\n";

    #[test]
    fn screening_answers_400_404_or_a_route() {
        let cfg = config(TWO_POOLS);
        let x = Exposure::new(&cfg);
        let s = x.screen("POST", b"/v1/chat/completions/?a=1").unwrap();
        assert_eq!((s.route, s.kind), (Route::Api, CallKind::Generate));
        assert_eq!(s.target.upstream(), "/v1/chat/completions?a=1");
        let s = x.screen("POST", b"/v1/messages/count_tokens").unwrap();
        assert_eq!(s.kind, CallKind::Passive);
        let s = x.screen("GET", b"//health").unwrap();
        assert_eq!(s.kind, CallKind::RouterHealth);
        let s = x.screen("GET", b"/v1/models/").unwrap();
        assert_eq!(s.kind, CallKind::RouterModels);
        let s = x.screen("GET", b"/v1/models/m1").unwrap();
        assert_eq!((s.route, s.kind), (Route::Api, CallKind::Passive));
        // Exposed paths are passive whatever the method.
        let s = x.screen("GET", b"/metrics/").unwrap();
        assert_eq!((s.route, s.kind), (Route::Everywhere, CallKind::Passive));
        let s = x.screen("POST", b"/v1/load_lora_adapter").unwrap();
        assert_eq!((s.route, s.kind), (Route::Pools, CallKind::Passive));

        let e = x.screen("POST", b"/wake_up").unwrap_err();
        assert_eq!(
            (e.status, e.code, e.kind),
            (404, "not_found", "invalid_request_error")
        );
        assert!(e.message.contains("POST /wake_up"), "{}", e.message);
        let e = x.screen("GET", b"/../../etc/passwd").unwrap_err();
        assert_eq!((e.status, e.code), (400, "invalid_path"));
        let e = x.screen("GET", b"/v1/%2e%2e/metrics").unwrap_err();
        assert_eq!(e.status, 400);
        let e = x.screen("GET", b"http://engine/metrics").unwrap_err();
        assert_eq!(e.status, 400);

        // Nothing exposed: only the API.
        let bare = Exposure::default();
        assert_eq!(bare.screen("GET", b"/metrics").unwrap_err().status, 404);
        assert_eq!(bare.screen("POST", b"/sleep").unwrap_err().status, 404);
        assert!(bare.screen("POST", b"/v1/embeddings").is_ok());
    }

    #[test]
    fn pools_for_exposed_paths() {
        let cfg = config(TWO_POOLS);
        let x = Exposure::new(&cfg);
        let pool = |method: &str, path: &str, model: Option<&str>| {
            let s = x.screen(method, path.as_bytes()).unwrap();
            x.pool(&cfg, model, &s).map_err(|e| e.code)
        };
        // The API and top-level exposed paths: by model, as always.
        assert_eq!(pool("POST", "/v1/completions", Some("m1")), Ok(0));
        assert_eq!(pool("POST", "/v1/completions", Some("m3")), Ok(2));
        assert_eq!(pool("POST", "/v1/completions", None), Ok(1));
        assert_eq!(pool("GET", "/metrics", None), Ok(1));
        assert_eq!(pool("GET", "/metrics", Some("m3")), Ok(2));
        // Pool-level: the model's pool must list it.
        assert_eq!(pool("POST", "/v1/load_lora_adapter", Some("m1")), Ok(0));
        assert_eq!(pool("POST", "/v1/load_lora_adapter", Some("other")), Ok(1));
        assert_eq!(
            pool("POST", "/v1/load_lora_adapter", Some("m3")),
            Err("not_found")
        );
        assert_eq!(pool("POST", "/sleep", Some("other")), Err("not_found"));
        // Without a model: the model-less pool if it lists the path, else the first that does.
        assert_eq!(pool("POST", "/v1/load_lora_adapter", None), Ok(1));
        assert_eq!(pool("POST", "/sleep", None), Ok(0));

        // No "*" pool and several pools: a model-less request to a top-level path has no pool.
        let cfg = config(
            "expose_paths: [/metrics]\npools:\n\
             \x20 - name: a\n    models: [m1]\n    endpoints: [\"http://127.0.0.1:1\"]\n\
             \x20 - name: b\n    models: [m2]\n    endpoints: [\"http://127.0.0.1:2\"]\n",
        );
        let x = Exposure::new(&cfg);
        let s = x.screen("GET", b"/metrics").unwrap();
        assert_eq!(
            x.pool(&cfg, None, &s).map_err(|e| e.code),
            Err("model_not_found")
        );
        assert_eq!(x.pool(&cfg, Some("m2"), &s).map_err(|e| e.code), Ok(1));
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

    #[test]
    fn summaries_leave_the_query_out() {
        let mut req = RequestHeader::build("POST", b"/v1//completions/?key=secret", None).unwrap();
        req.insert_header("host", "router:8000").unwrap();
        assert_eq!(
            request_summary(&req, None),
            "POST /v1/completions, Host: router:8000"
        );
        let s = Exposure::default().screen_request(&req).unwrap();
        assert_eq!(
            request_summary(&req, Some(&s)),
            "POST /v1/completions, Host: router:8000"
        );
        let req = RequestHeader::build("GET", b"/a/../b?key=secret", None).unwrap();
        assert_eq!(request_summary(&req, None), "GET (invalid path), Host: ");
    }

    #[test]
    fn upstream_target_replaces_the_clients() {
        let x = Exposure::default();
        let s = x.screen("POST", b"//v1/%63hat/completions/?x=1").unwrap();
        let mut req = RequestHeader::build("POST", b"//v1/%63hat/completions/?x=1", None).unwrap();
        s.set_upstream_target(&mut req).unwrap();
        assert_eq!(req.raw_path(), b"/v1/chat/completions?x=1");
        assert_eq!(req.uri.path(), "/v1/chat/completions");
    }
}
