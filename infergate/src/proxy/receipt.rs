//! The route of a request, as the router decided it: the `x-infergate-route` response header (`route_receipt`), and
//! the same facts for the access log and the request's span.

use std::fmt::Write as _;
use std::time::Duration;

use pingora_error::{Error, ErrorType, Result};

use crate::header_case::Headers;

use super::{Ctx, Router};
use crate::request::CallKind;

/// The response header carrying the route receipt.
pub const ROUTE_HEADER: &str = "x-infergate-route";

static ROUTE_NAME: http::HeaderName = http::HeaderName::from_static(ROUTE_HEADER);

/// Where a request went and why. Rendered as `pool=chat; endpoint=10.0.0.5:8000; reason=sticky;
/// predicted_ttft_ms=812; tokens=5120; attempts=1` (absent facts are left out).
#[derive(Debug, Clone, Copy)]
pub(super) struct Route<'a> {
    pub(super) pool: &'a str,
    /// `host:port` of the endpoint that served (or last failed) the request.
    pub(super) endpoint: Option<&'a str>,
    /// Why the policy chose it (`sticky`, `least_loaded`, ...).
    pub(super) reason: Option<&'static str>,
    /// `predicted_ttft`'s prediction for the endpoint at placement.
    pub(super) predicted_ttft: Option<Duration>,
    /// The prefill tokens the request held on the endpoint (0 for calls that hold none).
    pub(super) tokens: Option<u64>,
    /// Forwarding attempts (another endpoint after a failure, or a fresh connection to the same one).
    pub(super) attempts: u32,
}

impl Route<'_> {
    /// The header value: `key=value` pairs separated by `; `; a pool name is percent-encoded where it holds a byte
    /// outside visible ASCII or one of ` ;,="\`.
    pub(super) fn header_value(&self) -> String {
        let mut out = String::with_capacity(128);
        out.push_str("pool=");
        for b in self.pool.bytes() {
            if b.is_ascii_graphic() && !matches!(b, b';' | b',' | b'=' | b'"' | b'\\' | b'%') {
                out.push(char::from(b));
            } else {
                let _ = write!(out, "%{b:02X}");
            }
        }
        if let Some(ep) = self.endpoint {
            let _ = write!(out, "; endpoint={ep}");
        }
        if let Some(r) = self.reason {
            let _ = write!(out, "; reason={r}");
        }
        if let Some(p) = self.predicted_ttft {
            let _ = write!(out, "; predicted_ttft_ms={}", p.as_millis());
        }
        if let Some(t) = self.tokens {
            let _ = write!(out, "; tokens={t}");
        }
        let _ = write!(out, "; attempts={}", self.attempts);
        out
    }
}

impl Router {
    /// The request's route so far; None before a pool was chosen.
    pub(super) fn route<'a>(&self, ctx: &'a Ctx) -> Option<Route<'a>> {
        let pool = ctx.pool.as_ref()?;
        let placement = ctx.placement.as_ref();
        let tokens = placement.map(|p| {
            if ctx.kind == CallKind::Generate && pool.policy.counts_tokens() {
                self.placed_tokens(pool, p)
            } else {
                0
            }
        });
        let predicted = placement
            .and_then(|p| p.ticket.prediction())
            .and_then(|(secs, _)| secs)
            .and_then(|s| Duration::try_from_secs_f64(s).ok());
        let endpoint = ctx.endpoint.as_ref().or(ctx.last_endpoint.as_ref());
        let attempts = ctx.tried.len()
            + usize::from(ctx.fresh_retry_used)
            + usize::from(ctx.endpoint.is_some());
        Some(Route {
            pool: &pool.name,
            endpoint: endpoint.map(|e| e.label.as_str()),
            reason: placement.map(|p| p.reason.as_str()),
            predicted_ttft: predicted,
            tokens,
            attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
        })
    }

    /// Put the route receipt on a proxied answer when the client may see it (`route_receipt`); otherwise make sure
    /// the answer carries none (an engine's own header of that name included).
    pub(super) fn route_receipt(
        &self,
        ctx: &Ctx,
        resp: &mut dyn Headers,
        cfg: &crate::config::Config,
    ) -> Result<()> {
        let key = Some(ctx.admission.key()).filter(|k| *k != crate::admission::NO_KEY);
        let allowed = cfg.route_receipt.for_key(key);
        match allowed.then(|| self.route(ctx)).flatten() {
            Some(route) => {
                let v =
                    http::HeaderValue::from_maybe_shared(bytes::Bytes::from(route.header_value()))
                        .map_err(|_| {
                            Error::explain(ErrorType::InvalidHTTPHeader, "invalid route receipt")
                        })?;
                resp.set(&ROUTE_NAME, v)?;
            }
            None => resp.remove(&ROUTE_NAME),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_names_every_fact_and_leaves_out_the_absent_ones() {
        let r = Route {
            pool: "chat",
            endpoint: Some("10.0.0.5:8000"),
            reason: Some("sticky"),
            predicted_ttft: Some(Duration::from_micros(812_400)),
            tokens: Some(5120),
            attempts: 2,
        };
        assert_eq!(
            r.header_value(),
            "pool=chat; endpoint=10.0.0.5:8000; reason=sticky; predicted_ttft_ms=812; tokens=5120; attempts=2"
        );
        let bare = Route {
            pool: "big pool;é",
            endpoint: None,
            reason: None,
            predicted_ttft: None,
            tokens: None,
            attempts: 0,
        };
        assert_eq!(bare.header_value(), "pool=big%20pool%3B%C3%A9; attempts=0");
        assert!(http::HeaderValue::from_str(&bare.header_value()).is_ok());
    }
}
