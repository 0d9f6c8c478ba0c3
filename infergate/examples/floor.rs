//! The benchmark floor: a bare Pingora pass-through proxy to one upstream, with no body scan, no placement and
//! no metrics. `scripts/bench.sh` runs it in the overhead section beside infergate and the peer routers, so the
//! cost of Pingora itself is separated from what infergate adds. Built as an example so that the router crate
//! gains no dependency for it: `cargo build --release --example floor`.
//!
//! Usage: floor LISTEN_ADDR UPSTREAM_ADDR [THREADS]   e.g. floor 127.0.0.1:9000 127.0.0.1:8101 2

use async_trait::async_trait;
use pingora_core::server::configuration::{Opt, ServerConf};
use pingora_core::server::Server;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::Result;
use pingora_proxy::{ProxyHttp, Session};

struct Floor {
    upstream: String,
}

#[async_trait]
impl ProxyHttp for Floor {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(
            self.upstream.as_str(),
            false,
            String::new(),
        )))
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: floor LISTEN_ADDR UPSTREAM_ADDR [THREADS]");
        std::process::exit(2);
    }
    let threads = args.get(3).and_then(|t| t.parse().ok()).unwrap_or(2usize);
    let conf = ServerConf {
        threads,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(0),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();
    let mut proxy = pingora_proxy::http_proxy_service(
        &server.configuration,
        Floor {
            upstream: args[2].clone(),
        },
    );
    proxy.add_tcp(&args[1]);
    server.add_service(proxy);
    server.run_forever();
}
