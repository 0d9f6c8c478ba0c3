//! The infergate binary: `infergate -c FILE` runs the router; `-t` validates the configuration and exits;
//! `--help` and `--version` are answered by `cli`.

use std::process::ExitCode;

use infergate::cli::{self, Command};
use pingora_core::server::RunArgs;

mod alloc;

/// mimalloc instead of glibc's malloc: a request allocates and frees a hundred small blocks (header maps, the
/// body, Pingora's tasks), and glibc's allocator spent about a fifth of the router's instructions on them.
#[global_allocator]
static ALLOCATOR: alloc::MiMalloc = alloc::MiMalloc;

fn main() -> ExitCode {
    let opt = match cli::parse(std::env::args_os().collect()) {
        Command::Help => {
            print!("{}", cli::help());
            return ExitCode::SUCCESS;
        }
        Command::Version => {
            println!("{}", cli::version_line());
            return ExitCode::SUCCESS;
        }
        Command::Run(opt) => opt,
    };
    // Pingora's crates are capped at info whatever RUST_LOG says: below it they log request headers (keys).
    infergate::logging::init();
    let Some(path) = opt.conf.clone() else {
        eprintln!(
            "infergate: no configuration file: run `infergate -c FILE` (see conf/infergate.yaml, `infergate --help`)"
        );
        return ExitCode::from(2);
    };
    // Validate everything before any port is bound (messages name the file as given).
    let mut cfg = match infergate::config::Config::load(path.as_ref()) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("infergate: configuration error: {e}");
            return ExitCode::from(1);
        }
    };
    // Every SIGHUP re-reads the file from here, and a daemon's working directory is /: keep it absolute.
    match std::path::absolute(&cfg.source) {
        Ok(p) => cfg.source = p,
        Err(e) => {
            eprintln!("infergate: configuration error: {path}: {e}");
            return ExitCode::from(1);
        }
    }
    if opt.test {
        // The shared store, briefly: refused credentials are a configuration error, an unreachable store a warning.
        match infergate::cluster::check_store(&cfg) {
            Ok(None) => {}
            Ok(Some(warning)) => eprintln!("infergate: warning: {path}: {warning}"),
            Err(e) => {
                eprintln!("infergate: configuration error: {e}");
                return ExitCode::from(1);
            }
        }
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
    log::info!("{} starting with {path}", cli::version_line());
    // Pingora's Unix signals, with a drain before a graceful upgrade or stop (lifecycle).
    server.run(RunArgs {
        shutdown_signal: Box::new(infergate::lifecycle::DrainingSignals),
    });
    ExitCode::SUCCESS
}
