//! The end of a graceful stop or upgrade: the process exits once no client connection is open and the work
//! services do at shutdown is done, instead of always sleeping out Pingora's whole grace period.
//!
//! Pingora 0.9.1 `thread::sleep`s `grace_period_seconds` after a SIGTERM (or after an upgrade's hand-over window)
//! whether or not anything is still in flight, so `systemctl stop` or `restart` of an idle router took the full 30
//! s of the shipped config. [`ExitWhenDrained`] watches from the moment the listeners stop: while a client
//! connection is open (a stream in flight, a keep-alive connection Pingora still holds) it waits; then
//! [`clients_drained`] resolves, and it waits while a [`ShutdownWork`] is held (the work that waits for the clients
//! so that it carries what their requests did: the state file's last write, the span exporter's last flush, the
//! cluster's load key, published until then and removed after); then it lets the access log catch up and ends the
//! process with status 0, as Pingora does after the grace period. The grace period stays the longest a stop can
//! take.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;

/// How often the drain is checked once the listeners stopped.
const POLL: Duration = Duration::from_millis(20);

/// Shutdown work still to do (one server per process: the binary's).
static PENDING: AtomicUsize = AtomicUsize::new(0);

/// Set once a signalled stop has no client connection open: no request can end after it.
static CLIENTS_DRAINED: AtomicBool = AtomicBool::new(false);

/// Resolves when no request can end any more: at once for a stop the process was not signalled (the caller's
/// shutdown work runs when the shutdown starts, as Pingora's own does); for a signalled one, once no client
/// connection is open. Shutdown work that must see every request (the span exporter's last flush) awaits this
/// while holding its [`ShutdownWork`]; if the grace period ends first, Pingora stops the runtime as before.
pub async fn clients_drained() {
    while super::draining() && !CLIENTS_DRAINED.load(Ordering::Acquire) {
        tokio::time::sleep(POLL).await;
    }
}

/// Resolves once the shutdown began and no request can end any more ([`clients_drained`]): work that stands for
/// this process's requests in flight (publishing their load to the other replicas) goes on until then.
pub async fn requests_done(mut shutdown: ShutdownWatch) {
    while !*shutdown.borrow() {
        if shutdown.changed().await.is_err() {
            break;
        }
    }
    clients_drained().await;
}

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

/// Whether shutdown work is still held.
fn work_pending() -> bool {
    PENDING.load(Ordering::Acquire) > 0
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
        while (self.open_connections)() > 0 {
            tokio::time::sleep(POLL).await;
        }
        CLIENTS_DRAINED.store(true, Ordering::Release);
        while work_pending() {
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
    fn shutdown_work_is_pending_until_dropped() {
        // The only test in the crate that takes shutdown work (services take it when they are installed).
        let work = ShutdownWork::expect();
        assert!(work_pending());
        drop(work);
        assert!(!work_pending());
    }

    #[tokio::test]
    async fn a_stop_not_signalled_to_the_process_does_not_wait_for_clients() {
        assert!(!super::super::draining());
        tokio::time::timeout(Duration::from_secs(5), clients_drained())
            .await
            .expect("at once");
    }
}
