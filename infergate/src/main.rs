//! The infergate binary: `infergate -c FILE` runs the router; `-t` validates the configuration and exits.

use std::path::PathBuf;
use std::process::ExitCode;

use pingora_core::server::configuration::Opt;

fn main() -> ExitCode {
    // Pingora's crates are capped at info whatever RUST_LOG says: below it they log request headers (keys).
    infergate::logging::init();
    let opt = Opt::parse_args();
    let Some(path) = opt.conf.clone() else {
        eprintln!(
            "infergate: no configuration file: run `infergate -c FILE` (see conf/infergate.yaml)"
        );
        return ExitCode::from(2);
    };
    // Validate everything before any port is bound.
    let cfg = match infergate::config::Config::load(&PathBuf::from(&path)) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("infergate: configuration error: {e}");
            return ExitCode::from(1);
        }
    };
    if opt.test {
        println!("infergate: configuration {path} is valid");
        return ExitCode::SUCCESS;
    }
    let (server, _state) = match infergate::server::build_server(cfg, opt) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("infergate: configuration error: {e}");
            return ExitCode::from(1);
        }
    };
    log::info!("infergate starting with {path}");
    server.run_forever()
}
