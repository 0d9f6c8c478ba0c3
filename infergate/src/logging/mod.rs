//! The binary's logger: `env_logger` as `RUST_LOG` says, except that Pingora's crates (and the HTTP client
//! crates) never log below `info`, because at debug and trace they print request headers, engine keys included.
//!
//! Pingora logs every upstream request header (`authorization: Bearer <engine key>`) at debug, and the client's
//! request headers and its health-check requests at trace. The cap holds whatever `RUST_LOG` says, including
//! `RUST_LOG=pingora_proxy=trace`. Setting [`UNCAP_ENV`] to `1` lifts it for debugging, with a warning printed at
//! start; never in production.
//!
//! Some Pingora errors are logged at info, because nothing in the router failed when they appear (see
//! [`RECLASSIFIED`]): the retry notice of a new instance waiting for the old one's sockets in a graceful upgrade,
//! the connection pool losing a race with its own idle watcher (the request goes on over a new connection), and
//! a client that closed, reset or sent garbage. A client's failed TLS handshake is logged at warn.
//!
//! Warn and error lines that repeat are rate-limited with a count (`repeats`): an outage logs its line a few
//! times, then how many more there were.

use std::sync::LazyLock;
use std::time::Instant;

use log::{Level, LevelFilter, Log, Metadata, Record};

mod repeats;
pub use repeats::{Repeats, Summary, Verdict, BURST, WINDOW};

/// The installed logger's table of repeated warn and error lines (`repeats`).
static REPEATS: LazyLock<Repeats> = LazyLock::new(Repeats::default);

thread_local! {
    /// Set while `flush_repeats` writes its counts: they are written as they are, not counted again.
    static SUMMING_UP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `INFERGATE_UNSAFE_LOG_HEADERS=1` lifts the cap (prints a warning: keys and tokens will be logged).
pub const UNCAP_ENV: &str = "INFERGATE_UNSAFE_LOG_HEADERS";

/// Crates whose debug and trace logs can print request headers: Pingora's (`pingora_proxy`, `pingora_core`,
/// `pingora_load_balancing`, ...) and the HTTP stack the engine-stats scraper sends the engine key through.
const CAPPED: &[&str] = &["pingora", "reqwest", "hyper", "h2"];

/// The highest level a capped crate may log at.
const CAP: Level = Level::Info;

/// Whether a record from `target` at `level` is dropped by the cap.
pub fn is_capped(target: &str, level: Level) -> bool {
    level > CAP
        && CAPPED.iter().any(|c| {
            target == *c
                || target
                    .strip_prefix(c)
                    .is_some_and(|rest| rest.starts_with('_') || rest.starts_with("::"))
        })
}

/// Pingora's retry notice while a new instance (`-u`) waits for the old one's sockets: it logs it at error every
/// second, although waiting is the normal course of every upgrade (the old instance sends its sockets only when
/// it gets SIGQUIT, after the new one listens). Giving up is still an error.
const UPGRADE_WAIT_TARGET: &str = "pingora_core::server::transfer_fd";
const UPGRADE_WAIT_MESSAGE: &str = "No incoming socket transfer";

/// Pingora 0.9's connection pool takes an idle upstream connection back from the task watching it; when that task
/// has not yet dropped its handle the take fails, Pingora logs an error and the request simply opens a new
/// connection (seen under keep-alive load, about once in 17,000 requests). Nothing fails, so it is info.
const POOL_RACE_TARGET: &str = "pingora_core::connectors";
const POOL_RACE_MESSAGE: &str = "failed to acquire reusable stream";

/// Pingora logs a client that goes away or sends garbage (closed or reset while sending its header or body, a
/// malformed header, a write to a client that stopped reading) at error, once per connection: client behaviour, not
/// a router fault, and at error it buries real faults (nginx logs "client prematurely closed connection" at info).
/// Upstream failures stay errors.
const CLIENT_GONE_TARGET: &str = "pingora_proxy";
fn is_client_side(message: &str) -> bool {
    if message.starts_with("Fail to proxy: Downstream ") {
        return true;
    }
    message
        .strip_prefix("Fail to filter request:")
        .map(str::trim_start)
        .is_some_and(|rest| {
            rest.starts_with("ConnectionClosed")
                || rest.starts_with("ReadError")
                || rest.starts_with("Downstream ")
        })
}

/// A client's failed TLS handshake (plain HTTP on the TLS port, a scanner, no protocol or cipher in common, a
/// client that rejects the certificate) is logged by Pingora at error with the client's address. One is the
/// client's doing; many can be the router's (an expired certificate): warn, so they are seen, and since they are
/// alike but for digits, rate-limited with a count.
const HANDSHAKE_TARGET: &str = "pingora_core::services::listening";
fn is_handshake_failure(message: &str) -> bool {
    message.starts_with("Downstream handshake error")
        || message.starts_with("Downstream handshake timeout")
}

/// Whether a message of the rule's target is one of its benign errors.
type MessageTest = fn(&str) -> bool;

/// (target, message test, level): Pingora errors that are logged at a lower level instead.
const RECLASSIFIED: &[(&str, MessageTest, Level)] = &[
    (
        UPGRADE_WAIT_TARGET,
        |m| m.starts_with(UPGRADE_WAIT_MESSAGE),
        Level::Info,
    ),
    (
        POOL_RACE_TARGET,
        |m| m.starts_with(POOL_RACE_MESSAGE),
        Level::Info,
    ),
    (CLIENT_GONE_TARGET, is_client_side, Level::Info),
    (HANDSHAKE_TARGET, is_handshake_failure, Level::Warn),
];

/// The level a record is logged at instead of its own, for Pingora's messages that are not what their level says.
fn reclassified(r: &Record<'_>) -> Option<Level> {
    if r.level() != Level::Error {
        return None;
    }
    let mut rule = RECLASSIFIED
        .iter()
        .filter(|(target, _, _)| r.target() == *target)
        .peekable();
    rule.peek()?;
    let message = match r.args().as_str() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(r.args().to_string()),
    };
    rule.find(|(_, test, _)| test(&message))
        .map(|(_, _, level)| *level)
}

struct Capped {
    inner: env_logger::Logger,
    cap: bool,
}

impl Capped {
    /// Write `r` unless it repeats a warn or error line written too often lately (`repeats`).
    fn write(&self, r: &Record<'_>) {
        if !self.enabled(r.metadata()) {
            return;
        }
        if r.level() <= Level::Warn && !SUMMING_UP.get() {
            let line = r.args().to_string();
            let (verdict, summary) = REPEATS.admit(r.level(), r.target(), &line, Instant::now());
            if let Some(s) = summary {
                self.write_summary(&s);
            }
            if verdict == Verdict::Drop {
                return;
            }
        }
        self.inner.log(r);
    }

    fn write_summary(&self, s: &Summary) {
        self.inner.log(
            &Record::builder()
                .args(format_args!("{}", s.line))
                .level(s.level)
                .target(&s.target)
                .build(),
        );
    }
}

impl Log for Capped {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        !(self.cap && is_capped(m.target(), m.level())) && self.inner.enabled(m)
    }

    fn log(&self, r: &Record<'_>) {
        if let Some(level) = reclassified(r) {
            let args = *r.args();
            let r = Record::builder()
                .args(args)
                .level(level)
                .target(r.target())
                .module_path(r.module_path())
                .file(r.file())
                .line(r.line())
                .build();
            self.write(&r);
        } else {
            self.write(r);
        }
    }

    fn flush(&self) {
        self.inner.flush();
    }
}

/// Write the counts of repeated lines whose window has ended (the janitor calls this every second, so a count is
/// written even when no line of its kind comes again).
pub fn flush_repeats() {
    let summaries = REPEATS.flush(Instant::now());
    SUMMING_UP.set(true);
    for s in &summaries {
        log::log!(target: &s.target, s.level, "{}", s.line);
    }
    SUMMING_UP.set(false);
}

/// Install the logger (`RUST_LOG`, default `info`), capped unless [`UNCAP_ENV`] is `1`.
pub fn init() {
    let inner =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).build();
    let cap = std::env::var(UNCAP_ENV).map_or(true, |v| v != "1");
    let max: LevelFilter = inner.filter();
    if log::set_boxed_logger(Box::new(Capped { inner, cap })).is_ok() {
        log::set_max_level(max);
    }
    if !cap {
        eprintln!(
            "infergate: WARNING: {UNCAP_ENV}=1: Pingora's debug and trace logs are not capped; they print request \
             headers, including engine API keys and client tokens. Never run like this in production."
        );
        log::warn!("{UNCAP_ENV}=1: request headers (API keys, client tokens) may be logged");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn benign_pingora_errors_are_info_and_real_ones_stay_errors() {
        let level = |target: &str, level: Level, msg: &str| {
            reclassified(
                &Record::builder()
                    .args(format_args!("{msg}"))
                    .level(level)
                    .target(target)
                    .build(),
            )
        };
        let wait = "No incoming socket transfer, sleep 1s and try again";
        assert_eq!(
            level(UPGRADE_WAIT_TARGET, Level::Error, wait),
            Some(Level::Info)
        );
        let give_up = "Giving up reading socket from: /run/infergate/upgrade.sock";
        assert_eq!(level(UPGRADE_WAIT_TARGET, Level::Error, give_up), None);
        assert_eq!(level("infergate::server", Level::Error, wait), None);
        let race = "failed to acquire reusable stream";
        assert_eq!(
            level(POOL_RACE_TARGET, Level::Error, race),
            Some(Level::Info)
        );
        assert_eq!(level("pingora_core::server", Level::Error, race), None);
        // Messages as Pingora 0.9.1 prints them (seen with a client closing mid-header, mid-body, resetting).
        for client in [
            "Fail to proxy: Downstream ConnectionClosed context: while reading request headers, bytes already read: 55, downstream session type: h1",
            "Fail to filter request:  ConnectionClosed context: Peer prematurely closed connection with 95 bytes of body remaining to read, status: 500, POST /v1/chat/completions, Host: x",
            "Fail to proxy: Downstream ReadError context: while reading request headers cause: Connection reset by peer (os error 104), downstream session type: h1",
        ] {
            assert_eq!(level("pingora_proxy", Level::Error, client), Some(Level::Info), "{client}");
        }
        // Pingora 0.9.1's lines for a failed TLS handshake (plain HTTP on the TLS port, a client closing early).
        for handshake in [
            "Downstream handshake error from 127.0.0.1:40312: TLSHandshakeFailure context: TLS accept() failed cause: received corrupt message of type InvalidContentType",
            "Downstream handshake error: TLSHandshakeFailure context: TLS accept() failed",
            "Downstream handshake timeout",
        ] {
            assert_eq!(level(HANDSHAKE_TARGET, Level::Error, handshake), Some(Level::Warn), "{handshake}");
        }
        assert_eq!(
            level(
                HANDSHAKE_TARGET,
                Level::Error,
                "Accept() failed Too many open files"
            ),
            None
        );
        for upstream in [
            "Fail to proxy: Upstream ConnectRefused context: ...",
            "Fail to filter request:  InternalError context: ...",
        ] {
            assert_eq!(
                level("pingora_proxy", Level::Error, upstream),
                None,
                "{upstream}"
            );
        }
    }

    #[test]
    fn pingora_and_http_crates_are_capped_at_info() {
        for target in [
            "pingora",
            "pingora_proxy",
            "pingora_proxy::proxy_h1",
            "pingora_core::protocols::http::v1::client",
            "pingora_load_balancing::health_check",
            "reqwest::connect",
            "hyper::proto::h1::io",
            "hyper_util::client::legacy::pool",
            "h2::codec",
        ] {
            assert!(is_capped(target, Level::Debug), "{target}");
            assert!(is_capped(target, Level::Trace), "{target}");
            assert!(!is_capped(target, Level::Info), "{target}");
            assert!(!is_capped(target, Level::Error), "{target}");
        }
        for target in [
            "infergate",
            "infergate::proxy",
            "h2o",
            "pingoraish",
            "hyperx",
        ] {
            assert!(!is_capped(target, Level::Trace), "{target}");
        }
    }
}
