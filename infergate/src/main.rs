//! The infergate binary: `infergate -c FILE` runs the router; `-t` validates the configuration and exits.

use std::path::PathBuf;
use std::process::ExitCode;

use pingora_core::server::configuration::Opt;
use pingora_core::server::RunArgs;

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
    // A taken port fails here, before anything listens. Not with -u: the old instance holds the ports and
    // hands its sockets over (a bind failure there is caught by the hook below).
    if !opt.upgrade {
        if let Err(e) = infergate::listen::check(&cfg) {
            eprintln!("infergate: {e}");
            return ExitCode::from(1);
        }
    }
    infergate::listen::exit_on_listener_failure();
    let runtime_dir = std::env::var("RUNTIME_DIRECTORY").ok();
    let conf = cfg.server_conf();
    for w in infergate::lifecycle::path_warnings(
        &conf,
        opt.daemon || conf.daemon,
        runtime_dir.as_deref(),
    ) {
        log::warn!("{w}");
    }
    let (server, _state) = match infergate::server::build_server(cfg, opt) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("infergate: configuration error: {e}");
            return ExitCode::from(1);
        }
    };
    log::info!("infergate starting with {path}");
    // Pingora's Unix signals, with a drain before a graceful upgrade or stop (lifecycle).
    server.run(RunArgs {
        shutdown_signal: Box::new(infergate::lifecycle::DrainingSignals),
    });
    ExitCode::SUCCESS
}
