//! The metrics listener (`metrics_listen`): `/metrics`, the status page (`status`) and `/health`, and the token
//! that guards every path but `/health` (`metrics_auth`), read from the configuration in effect so that a reload's
//! new token holds from the next request on.

use async_trait::async_trait;
use base64::Engine as _;
use pingora_core::apps::http_app::ServeHttp;
use pingora_core::protocols::http::ServerSession;
use subtle::ConstantTimeEq;

use crate::admission::keys::bearer_token;
use crate::clients;
use crate::state::RouterState;

/// The realm both challenges name: a browser shows it in its login prompt.
const REALM: &str = "infergate metrics";

/// Serves `GET /metrics` in the Prometheus text format, `GET /health` as the proxy does (this listener is not
/// under the client connection cap, so it answers while the proxy port is full), and the status page.
pub struct MetricsApp {
    state: RouterState,
}

impl MetricsApp {
    pub fn new(state: RouterState) -> MetricsApp {
        MetricsApp { state }
    }

    /// (status, content type, body) for `path`; `authorization` is the request's header, if any.
    fn answer(&self, path: &str, authorization: Option<&[u8]>) -> (u16, &'static str, Vec<u8>) {
        let (pools, metrics) = (&self.state.pools, &self.state.metrics);
        if path == "/health" {
            let (status, body) = health(self.state.serving.get(), pools);
            return (status, "application/json", body.as_bytes().to_vec());
        }
        // Every other path, known or not, needs the token: a 404 would tell what exists.
        if let Some(token) = &self.state.current().metrics_auth.token {
            if !authorized(authorization, token.as_bytes()) {
                return (
                    401,
                    "text/plain",
                    b"unauthorized: this path needs the metrics token (metrics_auth.token_file) as \
                      `Authorization: Bearer TOKEN`, or as the password of HTTP basic authentication\n"
                        .to_vec(),
                );
            }
        }
        if path == "/metrics" {
            (200, "text/plain; version=0.0.4", metrics.render())
        } else if let Some(status) = crate::status::respond(path, pools, metrics) {
            status
        } else {
            (
                404,
                "text/plain",
                b"not found: metrics are on /metrics, the status page on /status\n".to_vec(),
            )
        }
    }
}

#[async_trait]
impl ServeHttp for MetricsApp {
    async fn response(&self, session: &mut ServerSession) -> http::Response<Vec<u8>> {
        let req = session.req_header();
        let authorization = req.headers.get(http::header::AUTHORIZATION);
        let (status, ctype, body) =
            self.answer(req.uri.path(), authorization.map(|v| v.as_bytes()));
        let mut resp = http::Response::builder()
            .status(status)
            .header("content-type", ctype)
            .header("content-length", body.len());
        if status == 401 {
            // Prometheus and curl send a bearer token; a browser opening /status asks for basic credentials.
            resp = resp
                .header("www-authenticate", format!("Bearer realm=\"{REALM}\""))
                .header(
                    "www-authenticate",
                    format!("Basic realm=\"{REALM}\", charset=\"UTF-8\""),
                );
        }
        resp.body(body).unwrap_or_default()
    }
}

/// `/health` here: the proxy's answer once its listeners accept connections, 503 before. This listener starts
/// before the first health-check round ends and the proxy's after it, so without the first case a probe here
/// would say ready while the client port still refuses connections.
fn health(serving: bool, pools: &crate::pool::Pools) -> (u16, &'static str) {
    if serving {
        clients::health(pools)
    } else {
        (
            503,
            r#"{"status":"starting","reason":"the client listeners do not accept connections yet"}"#,
        )
    }
}

/// Whether the `Authorization` header carries `token`: `Bearer TOKEN`, or `Basic` credentials whose password is
/// TOKEN, whatever the user name (a browser's login prompt). Compared in constant time (`subtle`).
fn authorized(authorization: Option<&[u8]>, token: &[u8]) -> bool {
    let Some(value) = authorization else {
        return false;
    };
    if let Some(bearer) = bearer_token(value) {
        return bool::from(bearer.ct_eq(token));
    }
    let value = value.trim_ascii();
    let Some(encoded) = value
        .get(..6)
        .filter(|s| s.eq_ignore_ascii_case(b"basic "))
        .map(|_| value[6..].trim_ascii())
    else {
        return false;
    };
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded) else {
        return false;
    };
    match decoded.iter().position(|&b| b == b':') {
        Some(colon) => bool::from(decoded[colon + 1..].ct_eq(token)),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn basic(user_pass: &str) -> Vec<u8> {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(user_pass)
        )
        .into_bytes()
    }

    #[test]
    fn health_says_starting_until_the_client_listeners_accept_then_what_the_proxy_says() {
        let text = "metrics_listen: 127.0.0.1:9100\npools:\n  - name: a\n    endpoints:\n      \
                    - url: http://127.0.0.1:8101\n";
        let cfg = crate::config::Config::parse(std::path::Path::new("t.yaml"), text).unwrap();
        let state = RouterState::new(cfg);
        let app = MetricsApp::new(state.clone());
        let ep = state.pools.pools[0].endpoints()[0].clone();
        ep.health.record(true, 2, 2);
        assert!(state.pools.any_healthy());
        // The first health round is over (the proxy would say 200) but its listeners are not up yet.
        let (status, _, body) = app.answer("/health", None);
        assert_eq!(status, 503);
        assert!(String::from_utf8_lossy(&body).contains(r#""status":"starting""#));
        state.serving.set();
        assert_eq!(app.answer("/health", None).0, 200);
        ep.health.record(false, 2, 1);
        assert_eq!(app.answer("/health", None).0, 503, "no healthy endpoint");
    }

    #[test]
    fn a_bearer_token_or_a_basic_password_is_the_token() {
        let ok = |h: &[u8]| authorized(Some(h), TOKEN);
        assert!(ok(b"Bearer 0123456789abcdef0123456789abcdef"));
        assert!(ok(b"bearer   0123456789abcdef0123456789abcdef "));
        assert!(ok(&basic("prometheus:0123456789abcdef0123456789abcdef")));
        assert!(ok(&basic(":0123456789abcdef0123456789abcdef")));
        assert!(ok(&basic("infergate:0123456789abcdef0123456789abcdef")));
        assert!(!authorized(None, TOKEN));
        for bad in [
            &b"Bearer 0123456789abcdef0123456789abcdee"[..],
            b"Bearer 0123456789abcdef0123456789abcdef0",
            b"Bearer 0123456789abcdef",
            b"Bearer ",
            b"0123456789abcdef0123456789abcdef",
            b"Token 0123456789abcdef0123456789abcdef",
            b"Basic not-base64!",
            b"Basic ",
        ] {
            assert!(!ok(bad), "{}", String::from_utf8_lossy(bad));
        }
        // The token as the user name, or with no colon, is not a password.
        assert!(!ok(&basic("0123456789abcdef0123456789abcdef:")));
        assert!(!ok(&basic("0123456789abcdef0123456789abcdef")));
        assert!(!ok(&basic("user:0123456789abcdef0123456789abcdef:x")));
    }
}
