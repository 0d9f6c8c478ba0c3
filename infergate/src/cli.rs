//! The command line: infergate's own `--help` and `--version`, then Pingora's `Opt` (`-c`, `-t`, `-d`, `-u`).
//!
//! Pingora's `Opt` parser would print its generic help, which never names infergate (and swaps the texts of
//! `-u` and `-t`), and knows no `--version`; both are answered here before `Opt` sees the arguments.

use std::ffi::OsString;

use pingora_core::server::configuration::Opt;

/// The crate version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit the binary was built from (`build.rs`), "unknown" outside a git checkout.
pub const COMMIT: &str = env!("INFERGATE_GIT_COMMIT");

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    Help,
    Version,
    Run(Opt),
}

/// `infergate 0.1.0 (commit 0123456789ab)`.
pub fn version_line() -> String {
    format!("infergate {VERSION} (commit {COMMIT})")
}

/// The `--help` text.
pub fn help() -> String {
    format!(
        "{version}
A prefill-aware reverse proxy for OpenAI-compatible LLM engines (vLLM, SGLang), built on Pingora.

Usage: infergate -c FILE [-t | -d | -u]

infergate's options:
  -h, --help        Print this help and exit
  -V, --version     Print the version and the git commit it was built from, and exit

Pingora's server options (pingora_core's Opt), with what they mean for infergate:
  -c, --conf FILE   The infergate configuration (YAML, every key documented in conf/infergate.yaml); its `server`
                    section holds Pingora's ServerConf settings (pid_file, upgrade_sock, grace_period_seconds, ...)
  -t, --test        Validate the configuration and exit: 0 when valid, else 1 with file, key and reason. Binds
                    nothing; with `cluster`, tries Redis for at most 2 s (refused credentials: 1; unreachable: a
                    warning)
  -d, --daemon      Run in the background. With `server.daemon_wait_for_ready: true` the command returns (0)
                    once the daemon serves; the daemon's pid is in `server.pid_file`
  -u, --upgrade     Graceful upgrade: take over the listening sockets of the running instance through
                    `server.upgrade_sock`; send that instance SIGQUIT once this one is ready (with -d: when the
                    command returns), and it drains and exits

Signals:
  SIGHUP            Re-read the configuration file; apply in place what needs no restart: endpoints,
                    client keys and limits, timeouts, retries, health checks, policy parameters (README, 'What
                    SIGHUP applies'); every other change is logged, per setting, as needing a graceful upgrade
  SIGQUIT           Hand the listening sockets to a new instance started with -u, drain, exit
  SIGTERM           Stop accepting; in-flight requests get `server.grace_period_seconds` to finish; exit
  SIGINT            Exit at once

Environment:
  RUST_LOG                          Log filter, default `info` (Pingora's crates never log below info)
  INFERGATE_UNSAFE_LOG_HEADERS=1    Lift that cap: request headers, engine keys included, are logged. Never in
                                    production

Deploying with systemd: scripts/install.sh and conf/infergate.service (README, \"Deploying\").
",
        version = version_line()
    )
}

/// Read the command line (`args` includes the program name). `--help` and `--version` (also inside a cluster of
/// short flags, as in `-th`) win over everything else; the rest is Pingora's `Opt`, whose parser prints the
/// error and exits 2 on an unknown argument.
pub fn parse(args: Vec<OsString>) -> Command {
    let mut rest = args.iter().skip(1);
    while let Some(arg) = rest.next() {
        let Some(arg) = arg.to_str() else { continue };
        match arg {
            "--" => break,
            "--help" => return Command::Help,
            "--version" => return Command::Version,
            "--conf" => {
                rest.next();
            }
            a if a.starts_with("--") => {}
            a if a.starts_with('-') => {
                let flags = &a[1..];
                for (i, c) in flags.char_indices() {
                    match c {
                        'h' => return Command::Help,
                        'V' => return Command::Version,
                        // `-c FILE` or `-cFILE`: the rest is the file name.
                        'c' => {
                            if i + 1 == flags.len() {
                                rest.next();
                            }
                            break;
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Command::Run(Opt::parse_from_args(args))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(args: &[&str]) -> Command {
        parse(
            std::iter::once("infergate")
                .chain(args.iter().copied())
                .map(OsString::from)
                .collect(),
        )
    }

    #[test]
    fn help_and_version_are_infergate_s_own() {
        assert!(matches!(parse_str(&["--help"]), Command::Help));
        assert!(matches!(parse_str(&["-h"]), Command::Help));
        assert!(matches!(parse_str(&["-c", "x.yaml", "-th"]), Command::Help));
        assert!(matches!(parse_str(&["--version"]), Command::Version));
        assert!(matches!(parse_str(&["-V"]), Command::Version));
        assert!(matches!(parse_str(&["-d", "-V"]), Command::Version));
    }

    #[test]
    fn a_file_name_attached_to_c_is_not_a_flag() {
        // `-chv.yaml` is `-c hv.yaml`, not a request for help.
        match parse_str(&["-chv.yaml", "-t"]) {
            Command::Run(opt) => {
                assert_eq!(opt.conf.as_deref(), Some("hv.yaml"));
                assert!(opt.test);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_rest_is_pingora_s_opt() {
        match parse_str(&["-d", "-u", "-c", "/etc/infergate/infergate.yaml"]) {
            Command::Run(opt) => {
                assert!(opt.daemon && opt.upgrade && !opt.test);
                assert_eq!(opt.conf.as_deref(), Some("/etc/infergate/infergate.yaml"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn help_lists_infergate_s_flags_before_pingora_s() {
        let h = help();
        assert!(h.starts_with(&version_line()));
        let own = h.find("infergate's options").unwrap();
        let pingora = h.find("Pingora's server options").unwrap();
        assert!(own < pingora);
        for flag in ["--conf", "--test", "--daemon", "--upgrade"] {
            assert!(h[pingora..].contains(flag), "{flag}");
        }
    }
}
