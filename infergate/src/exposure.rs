//! The runtime screen of the client port: each request checked against the path rules (`paths`) and the paths
//! `expose_paths` adds (for every pool or for one), and the pool a request to an exposed path goes to.
//!
//! Every request is screened before anything else happens to it; what is matched and forwarded is its normalised
//! target. Everything outside the inference API is a 404 from the router unless listed in `expose_paths` (any
//! method): at the top level for every pool, or in a pool for that pool only.

use http::Uri;
use pingora_error::{Error, ErrorType};
use pingora_http::RequestHeader;

use crate::config::Config;
use crate::errors::ApiError;
use crate::paths::{api_allows, normalize, stored_response_id, Target, MODEL_PREFIX};
use crate::request::{self, CallKind};

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
        if self.target.is_upstream(req.raw_path()) {
            return Ok(()); // already canonical: the common case
        }
        let upstream = self.target.upstream();
        if req.raw_path() == upstream.as_bytes() {
            return Ok(());
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
