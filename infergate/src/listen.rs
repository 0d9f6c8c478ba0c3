//! Listening addresses before Pingora starts: every `listen` and `metrics_listen` address is bound and released,
//! so a taken port stops the start with a clear message; a panic hook turns a later bind failure inside Pingora
//! into an exit instead of a half-serving process.
//!
//! Pingora binds each service's listeners on that service's own thread, retries a taken port for 30 seconds,
//! then panics that thread while the rest of the process goes on serving. The check cannot close the window
//! between its release and Pingora's bind; the hook covers that window, and the upgrade case (`-u`), where the
//! check is skipped because the old instance still holds the ports by design and hands its sockets over.

use std::net::{TcpListener, ToSocketAddrs};

use crate::config::Config;

/// An address that cannot be listened on.
#[derive(Debug)]
pub struct ListenError {
    pub addr: String,
    pub reason: String,
}

impl std::fmt::Display for ListenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot listen on {}: {}", self.addr, self.reason)
    }
}

impl std::error::Error for ListenError {}

/// Bind and release `addr` the way Pingora will bind it (its first resolved address, `SO_REUSEADDR`, as std sets
/// it on Unix).
pub fn check_addr(addr: &str) -> Result<(), ListenError> {
    let err = |reason: String| ListenError {
        addr: addr.to_string(),
        reason,
    };
    let first = addr
        .to_socket_addrs()
        .map_err(|e| err(e.to_string()))?
        .next()
        .ok_or_else(|| err("the host has no addresses".to_string()))?;
    TcpListener::bind(first)
        .map(drop)
        .map_err(|e| err(e.to_string()))
}

/// Check every `listen` address, then `metrics_listen`; the first that fails is the error.
pub fn check(cfg: &Config) -> Result<(), ListenError> {
    cfg.listen
        .iter()
        .chain(cfg.metrics_listen.as_ref())
        .try_for_each(|a| check_addr(a))
}

/// Pingora's panic message when a service cannot bind its listeners (pingora-core 0.9 `services/listening.rs`).
const PINGORA_BIND_PANIC: &str = "Failed to build listeners";

/// Whether a panic message is Pingora failing to bind a listener.
pub fn is_listener_failure(message: &str) -> bool {
    message.starts_with(PINGORA_BIND_PANIC)
}

/// Exit the process (status 1, with a message) when a Pingora service panics because it cannot bind; every other
/// panic goes to the previous hook as before.
pub fn exit_on_listener_failure() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if is_listener_failure(message) {
            eprintln!("infergate: cannot listen: {message}; exiting");
            std::process::exit(1);
        }
        previous(info);
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_port_is_reported_and_a_free_one_passes() {
        let held = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap().to_string();
        let e = check_addr(&addr).unwrap_err();
        assert_eq!(e.addr, addr);
        assert!(
            e.to_string()
                .starts_with(&format!("cannot listen on {addr}: ")),
            "{e}"
        );
        assert!(e.reason.to_lowercase().contains("in use"), "{e}");
        drop(held);
        assert!(check_addr(&addr).is_ok());
        // Released again: the router can bind it.
        assert!(TcpListener::bind(&addr).is_ok());
    }

    #[test]
    fn recognises_pingoras_bind_panic() {
        assert!(is_listener_failure(
            "Failed to build listeners: BindError context: bind() failed, after retries, 127.0.0.1:8000 still in use"
        ));
        assert!(!is_listener_failure(
            "called `Option::unwrap()` on a `None` value"
        ));
    }
}
