//! The client of the router's own requests to one engine (stats scrapes, model lists, stored-response lookups, the
//! prefill legs of a disaggregated pool): plain HTTP, or TLS checked as the pool's `tls` says (its CA file or the
//! system's CAs, its server name), as proxied requests are.

use std::error::Error as StdError;
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION, HOST};
use http::Method;
use http_body_util::{BodyExt, Full};
use hyper_rustls::{FixedServerNameResolver, HttpsConnector};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::pki_types::ServerName;
use rustls::RootCertStore;

use crate::config::EngineTls;

/// The system's CA certificates, read once (an https pool without `tls.ca_file`).
static SYSTEM_ROOTS: LazyLock<Arc<RootCertStore>> = LazyLock::new(|| {
    let mut store = RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        log::warn!("engine TLS: reading the system's CA certificates: {e}");
    }
    let (added, ignored) = store.add_parsable_certificates(found.certs);
    if added == 0 {
        log::warn!(
            "engine TLS: no usable system CA certificate ({ignored} unusable); set the pool's `tls.ca_file`"
        );
    }
    Arc::new(store)
});

/// Idle connections to an `https://` engine are kept as long as the proxy's and the plain prefill legs' are: below
/// the engine's keep-alive, so a prefill leg (never resent once sent) seldom goes out on a connection the engine
/// is closing. A scrape less often than this opens a new connection (a handshake per interval).
const IDLE_TIMEOUT: Duration = crate::config::UPSTREAM_IDLE_TIMEOUT;

type TlsClient = hyper_util::client::legacy::Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// How the router's own requests reach one engine. Cheap to clone (pooled connections are shared).
#[derive(Clone)]
pub enum SideClient {
    /// `http://` + the endpoint's label, over the process's plain client for its connect timeout.
    Plain {
        client: reqwest::Client,
        base: String,
        /// Its TCP connect timeout, named by [`SideError::ConnectTimeout`].
        connect_timeout: Duration,
    },
    /// Connects to the endpoint's address; the pool's server name is sent as SNI (none for an IP address) and
    /// checked against the certificate. Not reqwest: its TLS features are process-wide (workspace Cargo.toml).
    Tls(Arc<TlsSide>),
}

/// One `https://` engine's pooled client (hyper-util over hyper-rustls) and what its requests carry.
pub struct TlsSide {
    client: TlsClient,
    /// Its TCP connect timeout, named by [`SideError::ConnectTimeout`].
    connect_timeout: Duration,
    /// "https://addr" (what is connected to).
    origin: String,
    /// The endpoint's label ("host:port" as configured), sent as Host like proxied requests.
    host: HeaderValue,
    /// "https://label", for logs.
    shown: String,
}

impl std::fmt::Debug for SideClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SideClient({})", self.url(""))
    }
}

/// Why a side request got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SideError {
    /// No whole answer within the request's timeout.
    Timeout(Duration),
    /// The body went past the caller's limit of this many bytes.
    TooLarge(usize),
    /// No connection (refused, unreachable, a name that does not resolve).
    Connect(String),
    /// The TCP connect did not complete within the client's connect timeout (an engine that is down, or one
    /// whose accept queue is full): nothing was sent, as for [`SideError::Connect`], but callers that count
    /// failures against the engine tell the two apart, as the proxied path does.
    ConnectTimeout(Duration),
    /// The TLS handshake failed: the reason (a certificate from another CA or for another name, a plain-HTTP
    /// engine, an alert the engine sent).
    Tls(String),
    /// Connected, then the connection failed or closed before the answer's head came (a pooled connection the
    /// engine closed as the request went out, an engine that died).
    NoAnswer(String),
    /// Connected, then the request or its answer failed.
    Failed(String),
}

impl std::fmt::Display for SideError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SideError::Timeout(t) => write!(f, "timed out after {t:?}"),
            SideError::TooLarge(n) => write!(f, "body larger than {n} bytes"),
            SideError::Connect(why) => write!(f, "connect failed: {why}"),
            SideError::ConnectTimeout(t) => write!(f, "connect timed out after {t:?}"),
            SideError::Tls(why) => write!(f, "TLS handshake failed: {why}"),
            SideError::NoAnswer(why) => write!(f, "no answer: {why}"),
            SideError::Failed(why) => write!(f, "request failed: {why}"),
        }
    }
}

impl SideClient {
    /// The client for the endpoint `label` ("host:port") at `addr`, over TLS when `tls` is set. A TCP connect
    /// gives up after `connect_timeout` (`timeouts.connect`, as proxied requests' and plain prefill legs'): an
    /// engine that never answers the connect is unreachable ([`SideError::ConnectTimeout`]), and a prefill leg goes
    /// to another engine instead of waiting out the whole request's time. An error names what is wrong (a server
    /// name rustls refuses).
    pub fn new(
        label: &str,
        addr: SocketAddr,
        tls: Option<&EngineTls>,
        connect_timeout: Duration,
    ) -> Result<SideClient, String> {
        let Some(tls) = tls else {
            return Ok(SideClient::plain(label, connect_timeout));
        };
        let roots = match &tls.roots {
            Some(roots) => roots.clone(),
            None => SYSTEM_ROOTS.clone(),
        };
        // Its own provider: nothing depends on a process-wide default being installed.
        let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
        // An IP address parses as one: checked against the certificate's IPs and not sent as SNI, as Pingora does.
        let name = ServerName::try_from(tls.server_name.clone())
            .map_err(|e| format!("server name `{}`: {e}", tls.server_name))?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect_timeout));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(cfg)
            .https_only()
            .with_server_name_resolver(FixedServerNameResolver::new(name))
            .enable_http1()
            .wrap_connector(http);
        let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(IDLE_TIMEOUT)
            .build(https);
        let host = HeaderValue::from_str(label).map_err(|e| format!("`{label}`: {e}"))?;
        Ok(SideClient::Tls(Arc::new(TlsSide {
            client,
            connect_timeout,
            origin: format!("https://{addr}"),
            host,
            shown: format!("https://{label}"),
        })))
    }

    /// Plain HTTP to `label` ("host:port"), connecting within `connect_timeout`.
    pub fn plain(label: &str, connect_timeout: Duration) -> SideClient {
        SideClient::Plain {
            client: plain_client(connect_timeout),
            base: format!("http://{label}"),
            connect_timeout,
        }
    }

    /// The URL of `path` as logs show it (the endpoint as configured).
    pub fn url(&self, path: &str) -> String {
        match self {
            SideClient::Plain { base, .. } => format!("{base}{path}"),
            SideClient::Tls(t) => format!("{}{path}", t.shown),
        }
    }

    /// GET `path` (`Accept: accept`, `Authorization: Bearer` if `bearer`): its status and whole body, within
    /// `timeout` and at most `max_bytes`. The error names no URL (the caller logs the endpoint) and no header.
    pub async fn get(
        &self,
        path: &str,
        accept: &'static str,
        bearer: Option<&str>,
        timeout: Duration,
        max_bytes: usize,
    ) -> Result<(u16, Bytes), SideError> {
        let req = SideRequest::get(path, accept, bearer);
        self.fetch(req, timeout, Limit::Fail(max_bytes)).await
    }

    /// GET `path` for its status alone, within `timeout`. A short body is read (the connection is kept for the
    /// next request); a longer one is not (its connection is closed).
    pub async fn status(
        &self,
        path: &str,
        accept: &'static str,
        bearer: Option<&str>,
        timeout: Duration,
    ) -> Result<u16, SideError> {
        let drain = Limit::Stop(STATUS_DRAIN_BYTES);
        let req = SideRequest::get(path, accept, bearer);
        let (status, _) = self.fetch(req, timeout, drain).await?;
        Ok(status)
    }

    /// POST `body` to `path` with `headers` (its content type, a request id, ...; over TLS the endpoint's label is
    /// the Host) and `Authorization: Bearer` if `bearer`: its status and body, cut at `max_bytes` (the rest is read
    /// and dropped, so the connection is kept), all within `timeout`. [`SideError::Connect`],
    /// [`SideError::ConnectTimeout`] and [`SideError::Tls`] mean nothing was sent; any other error may come after
    /// the engine took the request.
    pub async fn post(
        &self,
        path: &str,
        headers: HeaderMap,
        bearer: Option<&str>,
        body: Bytes,
        timeout: Duration,
        max_bytes: usize,
    ) -> Result<(u16, Bytes), SideError> {
        let req = SideRequest {
            method: Method::POST,
            path,
            headers,
            bearer,
            body,
        };
        self.fetch(req, timeout, Limit::Cut(max_bytes)).await
    }

    async fn fetch(
        &self,
        req: SideRequest<'_>,
        timeout: Duration,
        limit: Limit,
    ) -> Result<(u16, Bytes), SideError> {
        let answer = async {
            match self {
                SideClient::Plain {
                    client,
                    base,
                    connect_timeout,
                } => plain_send(client, base, *connect_timeout, req, limit).await,
                SideClient::Tls(t) => t.send(req, limit).await,
            }
        };
        tokio::time::timeout(timeout, answer)
            .await
            .unwrap_or(Err(SideError::Timeout(timeout)))
    }
}

/// The router's own plain-HTTP client to engines (side requests here, disaggregated prefill legs), connecting
/// within `connect`: one per distinct timeout in the process (the pools' endpoints share its connections; a reload
/// that changes `timeouts.connect` gets a new one). An idle connection is dropped before an engine's keep-alive
/// runs out (uvicorn's 5 s), so a request never lands on a connection the engine is closing.
pub fn plain_client(connect: Duration) -> reqwest::Client {
    static CLIENTS: LazyLock<parking_lot::Mutex<Vec<(Duration, reqwest::Client)>>> =
        LazyLock::new(Default::default);
    let mut clients = CLIENTS.lock();
    if let Some((_, c)) = clients.iter().find(|(t, _)| *t == connect) {
        return c.clone();
    }
    let client = reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(connect)
        .pool_idle_timeout(IDLE_TIMEOUT)
        .tcp_nodelay(true)
        .build()
        .unwrap_or_else(|_| reqwest::Client::new());
    clients.push((connect, client.clone()));
    client
}

/// Bytes of body [`SideClient::status`] reads at most (an error answer is well within).
const STATUS_DRAIN_BYTES: usize = 64 * 1024;

/// One side request: what [`SideClient::get`] and [`SideClient::post`] send.
struct SideRequest<'a> {
    method: Method,
    path: &'a str,
    headers: HeaderMap,
    bearer: Option<&'a str>,
    body: Bytes,
}

impl<'a> SideRequest<'a> {
    fn get(path: &'a str, accept: &'static str, bearer: Option<&'a str>) -> SideRequest<'a> {
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT, HeaderValue::from_static(accept));
        SideRequest {
            method: Method::GET,
            path,
            headers,
            bearer,
            body: Bytes::new(),
        }
    }
}

/// What a body longer than its limit is.
#[derive(Clone, Copy)]
enum Limit {
    /// An error ([`SideError::TooLarge`]).
    Fail(usize),
    /// Not read further: the answer is what came so far.
    Stop(usize),
    /// Read to its end, kept up to the limit.
    Cut(usize),
}

impl Limit {
    /// Add `chunk` to `body`; false when reading should stop here, an error when the limit makes it one.
    fn take(self, body: &mut BytesMut, chunk: &[u8]) -> Result<bool, SideError> {
        match self {
            Limit::Fail(n) if body.len() + chunk.len() > n => Err(SideError::TooLarge(n)),
            Limit::Stop(n) if body.len() + chunk.len() > n => Ok(false),
            Limit::Cut(n) => {
                let room = n.saturating_sub(body.len());
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                Ok(true)
            }
            _ => {
                body.extend_from_slice(chunk);
                Ok(true)
            }
        }
    }
}

async fn plain_send(
    client: &reqwest::Client,
    base: &str,
    connect_timeout: Duration,
    r: SideRequest<'_>,
    limit: Limit,
) -> Result<(u16, Bytes), SideError> {
    let mut req = client
        .request(r.method.clone(), format!("{base}{}", r.path))
        .headers(r.headers);
    if let Some(key) = r.bearer {
        req = req.bearer_auth(key);
    }
    if r.method != Method::GET {
        req = req.body(r.body);
    }
    let describe = |e| describe_reqwest(e, connect_timeout);
    let mut resp = req.send().await.map_err(describe)?;
    let status = resp.status().as_u16();
    let mut body = BytesMut::new();
    while let Some(chunk) = resp.chunk().await.map_err(describe)? {
        if !limit.take(&mut body, &chunk)? {
            break;
        }
    }
    Ok((status, body.freeze()))
}

impl TlsSide {
    async fn send(&self, r: SideRequest<'_>, limit: Limit) -> Result<(u16, Bytes), SideError> {
        let mut req = http::Request::builder()
            .method(r.method)
            .uri(format!("{}{}", self.origin, r.path))
            .body(Full::new(r.body))
            .map_err(|e| SideError::Failed(e.to_string()))?;
        let headers = req.headers_mut();
        *headers = r.headers;
        headers.insert(HOST, self.host.clone());
        if let Some(key) = r.bearer {
            // The error never shows the key.
            let mut v = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| {
                SideError::Failed("the endpoint's api key is not a valid header value".into())
            })?;
            v.set_sensitive(true);
            headers.insert(AUTHORIZATION, v);
        }
        let resp = self.client.request(req).await.map_err(|e| {
            if let Some(why) = tls_reason(&e) {
                SideError::Tls(why)
            } else if e.is_connect() && timed_out(&e) {
                SideError::ConnectTimeout(self.connect_timeout)
            } else if e.is_connect() {
                SideError::Connect(sources(&e))
            } else {
                SideError::NoAnswer(sources(&e))
            }
        })?;
        let status = resp.status().as_u16();
        let mut body = resp.into_body();
        let mut got = BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| SideError::Failed(chain(&e)))?;
            if let Ok(data) = frame.into_data() {
                if !limit.take(&mut got, &data)? {
                    break;
                }
            }
        }
        Ok((status, got.freeze()))
    }
}

/// A reqwest error without its URL (the caller logs the endpoint label) and never a header.
/// `connect_timeout`: the client's, named by a connect that timed out.
fn describe_reqwest(e: reqwest::Error, connect_timeout: Duration) -> SideError {
    if e.is_connect() && (e.is_timeout() || timed_out(&e)) {
        SideError::ConnectTimeout(connect_timeout)
    } else if e.is_connect() {
        SideError::Connect(sources(&e))
    } else {
        SideError::Failed(sources(&e))
    }
}

/// The rustls error somewhere in `e`'s chain, as text (io errors hide theirs behind `get_ref`, not `source`).
fn tls_reason(e: &(dyn StdError + 'static)) -> Option<String> {
    let mut cur = Some(e);
    while let Some(x) = cur {
        if let Some(r) = x.downcast_ref::<rustls::Error>() {
            return Some(r.to_string());
        }
        if let Some(inner) = x
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            if let Some(r) = tls_reason(inner) {
                return Some(r);
            }
        }
        cur = x.source();
    }
    None
}

/// Whether `e`'s chain holds a timed-out io error: hyper-util's connector gives its connect timeout as one (inside
/// its "tcp connect error"), as does the kernel's own (ETIMEDOUT). reqwest's `is_timeout` looks for the same.
fn timed_out(e: &(dyn StdError + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(x) = cur {
        if let Some(io) = x.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::TimedOut {
                return true;
            }
        }
        cur = x.source();
    }
    false
}

/// `e`'s sources, joined by ": " (the outermost, e.g. "client error (Connect)", says nothing more).
fn sources(e: &(dyn StdError + 'static)) -> String {
    e.source().map(chain).unwrap_or_else(|| e.to_string())
}

/// `e` and its sources, joined by ": ".
fn chain(e: &(dyn StdError + 'static)) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::mpsc;

    struct Ca {
        cert: rcgen::Certificate,
        key: rcgen::KeyPair,
    }

    fn ca(name: &str) -> Ca {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, name.to_string());
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        Ca {
            cert: p.self_signed(&key).unwrap(),
            key,
        }
    }

    fn write_ca(ca: &Ca, tag: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!(
            "infergate-side-{tag}-{}-{}.pem",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::write(&path, ca.cert.pem()).unwrap();
        path
    }

    /// A TLS server with a certificate `ca` issued for `names`, answering every request with `status` and `body`;
    /// each request head (and SNI) goes to the channel.
    async fn serve_tls(
        ca: &Ca,
        names: &[&str],
        status: &'static str,
        body: String,
    ) -> (
        SocketAddr,
        mpsc::UnboundedReceiver<(Option<String>, String)>,
    ) {
        let key = rcgen::KeyPair::generate().unwrap();
        let p =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        let cert = p.signed_by(&key, &ca.cert, &ca.key).unwrap();
        let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        )
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, tx, body) = (acceptor.clone(), tx.clone(), body.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let sni = tls.get_ref().1.server_name().map(str::to_string);
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let _ = tx.send((sni, String::from_utf8_lossy(&head).into_owned()));
                    let resp = format!(
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = tls.write_all(resp.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        (addr, rx)
    }

    fn tls(server_name: &str, ca_file: &std::path::Path) -> EngineTls {
        EngineTls::for_tests(server_name, ca_file)
    }

    const T: Duration = Duration::from_secs(5);
    /// A connect timeout (`timeouts.connect`'s default).
    const C: Duration = crate::config::DEFAULT_CONNECT_TIMEOUT;

    #[tokio::test]
    async fn tls_gets_by_name_and_by_ip_with_the_key_checked_against_the_ca() {
        let ca = ca("side CA");
        let file = write_ca(&ca, "ok");
        let (addr, mut heads) = serve_tls(
            &ca,
            &["engine.internal", "127.0.0.1"],
            "200 OK",
            "hi".into(),
        )
        .await;
        let label = format!("engine.example:{}", addr.port());

        let c = SideClient::new(&label, addr, Some(&tls("engine.internal", &file)), C).unwrap();
        assert_eq!(c.url("/metrics"), format!("https://{label}/metrics"));
        let (status, body) = c
            .get("/metrics", "text/plain", Some("s3cret"), T, 1024)
            .await
            .unwrap();
        assert_eq!((status, &body[..]), (200, &b"hi"[..]));
        let (sni, head) = heads.recv().await.unwrap();
        assert_eq!(sni.as_deref(), Some("engine.internal"));
        let head = head.to_ascii_lowercase();
        assert!(head.starts_with("get /metrics http/1.1\r\n"), "{head}");
        assert!(head.contains("authorization: bearer s3cret\r\n"), "{head}");
        assert!(head.contains(&format!("host: {label}\r\n")), "{head}");
        assert!(!format!("{c:?}").contains("s3cret"));

        // An IP address as the name: checked against the certificate's IPs, no SNI.
        let c = SideClient::new(&label, addr, Some(&tls("127.0.0.1", &file)), C).unwrap();
        assert_eq!(c.get("/", "*/*", None, T, 1024).await.unwrap().0, 200);
        assert_eq!(heads.recv().await.unwrap().0, None);

        // Too large a body.
        assert_eq!(
            c.get("/", "*/*", None, T, 1).await,
            Err(SideError::TooLarge(1))
        );
        let _ = std::fs::remove_file(file);
    }

    #[tokio::test]
    async fn a_post_sends_its_body_and_headers_over_tls_and_cuts_a_long_answer() {
        let ca = ca("side CA");
        let file = write_ca(&ca, "post");
        let (addr, mut heads) =
            serve_tls(&ca, &["engine.internal"], "200 OK", "hello world".into()).await;
        let label = format!("engine.example:{}", addr.port());
        let c = SideClient::new(&label, addr, Some(&tls("engine.internal", &file)), C).unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.insert("x-request-id", HeaderValue::from_static("req-1"));
        // A Host of the caller's is replaced by the endpoint's label.
        headers.insert(HOST, HeaderValue::from_static("elsewhere"));
        let body = Bytes::from_static(b"{\"max_tokens\":1}");
        let (status, answer) = c
            .post("/v1/completions", headers, Some("s3cret"), body, T, 5)
            .await
            .unwrap();
        assert_eq!((status, &answer[..]), (200, &b"hello"[..]));
        let (sni, head) = heads.recv().await.unwrap();
        assert_eq!(sni.as_deref(), Some("engine.internal"));
        let head = head.to_ascii_lowercase();
        assert!(
            head.starts_with("post /v1/completions http/1.1\r\n"),
            "{head}"
        );
        for h in [
            "content-type: application/json\r\n".to_string(),
            "x-request-id: req-1\r\n".to_string(),
            "authorization: bearer s3cret\r\n".to_string(),
            "content-length: 16\r\n".to_string(),
            format!("host: {label}\r\n"),
        ] {
            assert!(head.contains(&h), "{h}: {head}");
        }
        assert!(!head.contains("elsewhere"), "{head}");

        // Nothing listening: a connect error (nothing was sent), as for a GET.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let gone = l.local_addr().unwrap();
        drop(l);
        let c = SideClient::new(&label, gone, Some(&tls("engine.internal", &file)), C).unwrap();
        let e = c
            .post("/", HeaderMap::new(), None, Bytes::new(), T, 5)
            .await
            .unwrap_err();
        assert!(matches!(e, SideError::Connect(_)), "{e}");
        let _ = std::fs::remove_file(file);
    }

    #[tokio::test]
    async fn a_status_alone_does_not_read_a_long_body() {
        let ca = ca("side CA");
        let file = write_ca(&ca, "status");
        let long = "x".repeat(STATUS_DRAIN_BYTES * 4);
        let (addr, _heads) = serve_tls(&ca, &["engine.internal"], "200 OK", long).await;
        let c = SideClient::new("e:1", addr, Some(&tls("engine.internal", &file)), C).unwrap();
        assert_eq!(c.status("/", "*/*", None, T).await, Ok(200));
        assert_eq!(
            c.get("/", "*/*", None, T, STATUS_DRAIN_BYTES).await,
            Err(SideError::TooLarge(STATUS_DRAIN_BYTES))
        );
        let _ = std::fs::remove_file(file);
    }

    #[tokio::test]
    async fn tls_errors_name_the_reason_and_never_the_key() {
        let (ca, other) = (ca("side CA"), ca("another CA"));
        let (file, other_file) = (write_ca(&ca, "ca"), write_ca(&other, "other"));
        let (addr, _heads) = serve_tls(&ca, &["engine.internal"], "200 OK", String::new()).await;
        let label = format!("127.0.0.1:{}", addr.port());
        let get = |tls: EngineTls| {
            let c = SideClient::new(&label, addr, Some(&tls), C).unwrap();
            async move { c.get("/", "*/*", Some("k3y"), T, 1024).await }
        };

        let e = get(tls("engine.internal", &other_file)).await.unwrap_err();
        assert!(
            matches!(&e, SideError::Tls(why) if why.contains("UnknownIssuer")),
            "{e}"
        );
        assert!(e.to_string().starts_with("TLS handshake failed: "), "{e}");
        let e = get(tls("other.internal", &file)).await.unwrap_err();
        assert!(
            matches!(&e, SideError::Tls(why) if why.contains("not valid for name")),
            "{e}"
        );

        // A plain-HTTP engine behind an https:// URL.
        let (plain, _h) = plain_server().await;
        let c = SideClient::new(&label, plain, Some(&tls("engine.internal", &file)), C).unwrap();
        let e = c.get("/", "*/*", None, T, 1024).await.unwrap_err();
        assert!(matches!(e, SideError::Tls(_)), "{e}");

        // Nothing listening.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let gone = l.local_addr().unwrap();
        drop(l);
        let c = SideClient::new(&label, gone, Some(&tls("engine.internal", &file)), C).unwrap();
        let e = c.get("/", "*/*", Some("k3y"), T, 1024).await.unwrap_err();
        assert!(
            matches!(&e, SideError::Connect(why) if why.to_lowercase().contains("refused")),
            "{e}"
        );
        assert!(!e.to_string().contains("k3y"), "{e}");

        // Accepts, never answers.
        let hold = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = SideClient::new(
            &label,
            hold.local_addr().unwrap(),
            Some(&tls("engine.internal", &file)),
            C,
        )
        .unwrap();
        let t = Duration::from_millis(200);
        assert_eq!(
            c.get("/", "*/*", None, t, 1024).await,
            Err(SideError::Timeout(t))
        );
        drop(hold);

        let _ = std::fs::remove_file(file);
        let _ = std::fs::remove_file(other_file);
    }

    /// A listener that never accepts, its accept queue filled: the kernel drops further SYNs, so a connect to it
    /// hangs. Keep both while a connect should hang.
    async fn full_accept_queue() -> (std::net::TcpListener, Vec<tokio::net::TcpStream>) {
        let full = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = full.local_addr().unwrap();
        let mut queued = Vec::new();
        for _ in 0..4096 {
            match tokio::time::timeout(
                Duration::from_millis(200),
                tokio::net::TcpStream::connect(addr),
            )
            .await
            {
                Ok(Ok(s)) => queued.push(s),
                _ => break,
            }
        }
        (full, queued)
    }

    #[tokio::test]
    async fn a_connect_never_answered_is_a_connect_timeout_not_a_connect_failure() {
        let ca = ca("side CA");
        let file = write_ca(&ca, "hang");
        let (full, queued) = full_accept_queue().await;
        let addr = full.local_addr().unwrap();
        // The configured timeout (not the 2 s default).
        let connect = Duration::from_millis(300);
        let t = tls("engine.internal", &file);
        let c = SideClient::new("e:1", addr, Some(&t), connect).unwrap();
        let started = std::time::Instant::now();
        let e = c
            .get("/", "*/*", Some("k3y"), Duration::from_secs(20), 1024)
            .await
            .unwrap_err();
        let took = started.elapsed();
        // Nothing sent, and told apart from a refused connect (a prefill leg does not count it against the engine).
        assert_eq!(e, SideError::ConnectTimeout(connect), "{e}");
        assert_eq!(e.to_string(), "connect timed out after 300ms");
        assert!(took < Duration::from_millis(1500), "{took:?}");
        drop((queued, full));
        let _ = std::fs::remove_file(file);
    }

    #[tokio::test]
    async fn a_plain_connect_never_answered_is_a_connect_timeout() {
        let (full, queued) = full_accept_queue().await;
        let addr = full.local_addr().unwrap();
        let connect = Duration::from_millis(300);
        let c = SideClient::new(&addr.to_string(), addr, None, connect).unwrap();
        let started = std::time::Instant::now();
        let e = c
            .get("/", "*/*", None, Duration::from_secs(20), 1024)
            .await
            .unwrap_err();
        let took = started.elapsed();
        // Not the request's whole timeout, and named as what it is (was: "timed out after 20s").
        assert_eq!(e, SideError::ConnectTimeout(connect), "{e}");
        assert!(took < Duration::from_millis(1500), "{took:?}");
        drop((queued, full));
        // A refused connect is still a connect failure.
        let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let gone_addr = gone.local_addr().unwrap();
        drop(gone);
        let c = SideClient::new(&gone_addr.to_string(), gone_addr, None, connect).unwrap();
        let e = c
            .get("/", "*/*", None, Duration::from_secs(5), 1024)
            .await
            .unwrap_err();
        assert!(matches!(e, SideError::Connect(_)), "{e}");
    }

    /// Answers every connection with a plain HTTP 200.
    async fn plain_server() -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    .await;
            }
        });
        (addr, task)
    }

    /// A keep-alive server that never closes a connection: its connections so far.
    async fn keep_alive_server() -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conns = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = conns.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                        while let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                            head.drain(..i + 4);
                            let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                            if s.write_all(ok).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (addr, conns)
    }

    /// An engine closes a connection idle for its keep-alive (vLLM's uvicorn: 5 s); a side request sent on it just
    /// then fails. The plain client drops its idle connections first, as the proxied path does.
    #[tokio::test]
    async fn a_plain_connection_idle_past_the_upstream_idle_timeout_is_not_reused() {
        let (addr, conns) = keep_alive_server().await;
        // A connect timeout of its own: a client (and pool) no other test shares.
        let c = SideClient::plain(&addr.to_string(), Duration::from_millis(4_321));
        let get = || c.get("/", "*/*", None, Duration::from_secs(5), 1024);
        assert_eq!(get().await.unwrap().0, 200);
        assert_eq!(get().await.unwrap().0, 200);
        let count = || conns.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(count(), 1, "back to back, one kept connection");
        tokio::time::sleep(IDLE_TIMEOUT + Duration::from_millis(300)).await;
        assert_eq!(get().await.unwrap().0, 200);
        // Was: 1 (reqwest's default keeps an idle connection 90 s).
        assert_eq!(count(), 2, "a new connection after {IDLE_TIMEOUT:?} idle");
    }

    /// Run in a process of its own by the test below (nothing else there installs a crypto provider).
    #[test]
    fn in_a_fresh_process_reqwest_and_tls_side_clients_build() {
        if std::env::var_os("INFERGATE_FRESH_PROCESS").is_none() {
            return;
        }
        assert!(rustls::crypto::CryptoProvider::get_default().is_none());
        // With a reqwest rustls feature unified in, this panics: "No rustls crypto provider is configured".
        let _ = reqwest::Client::builder().build();
        let file = write_ca(&ca("fresh CA"), "fresh");
        let t = tls("engine.internal", &file);
        let _ = std::fs::remove_file(&file);
        assert!(SideClient::new("e:1", "127.0.0.1:1".parse().unwrap(), Some(&t), C).is_ok());
        let t = crate::config::EngineTls::for_tests_system("engine.internal");
        assert!(SideClient::new("e:1", "127.0.0.1:1".parse().unwrap(), Some(&t), C).is_ok());
    }

    #[test]
    fn no_client_needs_a_process_wide_crypto_provider() {
        let me = std::env::current_exe().unwrap();
        let out = std::process::Command::new(me)
            .args(["--exact", "--test-threads=1", "--nocapture"])
            .arg("engine_stats::client::tests::in_a_fresh_process_reqwest_and_tls_side_clients_build")
            .env("INFERGATE_FRESH_PROCESS", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
    }

    #[test]
    fn a_server_name_rustls_refuses_is_an_error_naming_it_and_the_ca_file_is_not_read_again() {
        let t = crate::config::EngineTls::for_tests_system("not a name!");
        let e = SideClient::new("e:1", "127.0.0.1:1".parse().unwrap(), Some(&t), C).unwrap_err();
        assert!(e.contains("not a name!"), "{e}");
        // The trust store read with the configuration is used: its file may be gone since.
        let ca = ca("side CA");
        let file = write_ca(&ca, "gone");
        let t = tls("engine.internal", &file);
        std::fs::remove_file(&file).unwrap();
        assert!(matches!(
            SideClient::new("e:1", "127.0.0.1:1".parse().unwrap(), Some(&t), C),
            Ok(SideClient::Tls(_))
        ));
    }
}
