//! The end of a graceful stop or upgrade: the process exits once no client connection is open and the work
//! services do at shutdown is done, instead of always sleeping out Pingora's whole grace period.
//!
//! Pingora 0.9.1 `thread::sleep`s `grace_period_seconds` after a SIGTERM (or after an upgrade's hand-over window)
//! whether or not anything is still in flight, so `systemctl stop` or `restart` of an idle router took the full 30
//! s of the shipped config. [`ExitWhenDrained`] watches from the moment the listeners stop: while a client
//! connection is open (a stream in flight, a keep-alive connection Pingora still holds) or a [`ShutdownWork`] is
//! held (the state file's last write, the span exporter's flush, the cluster's load key), it waits; then it lets
//! the access log catch up and ends the process with status 0, as Pingora does after the grace period. The grace
//! period stays the longest a stop can take.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;

/// How often the drain is checked once the listeners stopped.
const POLL: Duration = Duration::from_millis(20);

/// Shutdown work still to do (one server per process: the binary's).
static PENDING: AtomicUsize = AtomicUsize::new(0);

/// Work a service does when the shutdown starts (taken when the service is built, dropped when that work is
/// done): the process does not exit before it. A service that never runs keeps the exit at the grace period's
/// end, as before.
#[must_use = "the early exit waits until this is dropped"]
pub struct ShutdownWork(());

impl ShutdownWork {
    pub fn expect() -> ShutdownWork {
        PENDING.fetch_add(1, Ordering::AcqRel);
        ShutdownWork(())
    }
}

impl Drop for ShutdownWork {
    fn drop(&mut self) {
        PENDING.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Ends the process once a graceful stop or upgrade has nothing left to serve (see the module doc).
pub struct ExitWhenDrained {
    /// Client connections open on the listen addresses.
    pub open_connections: Box<dyn Fn() -> usize + Send + Sync>,
    /// Run last, before the exit: let the access log write what it has queued.
    pub before_exit: Box<dyn Fn() + Send + Sync>,
    /// `grace_period_seconds`, for the log line.
    pub grace_seconds: u64,
}

impl ExitWhenDrained {
    fn drained(&self) -> bool {
        (self.open_connections)() == 0 && PENDING.load(Ordering::Acquire) == 0
    }
}

#[async_trait]
impl BackgroundService for ExitWhenDrained {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        // The listeners stop on the same broadcast (SIGTERM, or the end of an upgrade's hand-over window).
        while !*shutdown.borrow() {
            if shutdown.changed().await.is_err() {
                return;
            }
        }
        // Only a stop the process was signalled ([`super::DrainingSignals`] sets the flag before Pingora acts):
        // a server run in-process and stopped through a channel (tests, an embedding program) does not own the
        // process and leaves its end to its owner.
        if !super::draining() {
            return;
        }
        let since = Instant::now();
        while !self.drained() {
            tokio::time::sleep(POLL).await;
        }
        (self.before_exit)();
        log::info!(
            "graceful shutdown: no client connection open and the shutdown work done {:.1?} after the listeners \
             stopped; exiting (grace period {} s at most)",
            since.elapsed(),
            self.grace_seconds
        );
        std::process::exit(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shutdown_work_holds_the_exit_until_dropped() {
        let open = std::sync::Arc::new(AtomicUsize::new(1));
        let o = open.clone();
        let exit = ExitWhenDrained {
            open_connections: Box::new(move || o.load(Ordering::Relaxed)),
            before_exit: Box::new(|| {}),
            grace_seconds: 30,
        };
        let work = ShutdownWork::expect();
        assert!(!exit.drained(), "a connection is open");
        open.store(0, Ordering::Relaxed);
        assert!(!exit.drained(), "shutdown work is held");
        drop(work);
        assert!(exit.drained());
    }
}
