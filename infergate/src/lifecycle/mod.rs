//! The process around Pingora's server: the order services start in, the drain before a shutdown, and the exit.
//!
//! **Start-up order.** Pingora's `Bootstrap` does two things: it tells the parent of a daemon that it may exit
//! (`daemon_wait_for_ready`, SIGUSR1) and, in an upgrade (`-u`), it receives the listening sockets from the old
//! instance. Called before `run_forever` (as `bootstrap()`), it ran before the fork, when the parent's pid was not
//! yet known, so the parent never heard from the daemon and exited 1 after its whole timeout. It runs here as a
//! service instead, after the fork, in this order:
//!
//! - start: housekeeping (first health-check round) → proxy and metrics listeners → [`ListenGate`] (every
//!   address accepts a connection) → bootstrap, which releases the parent. The parent returns once the daemon
//!   serves.
//! - upgrade: housekeeping → bootstrap (releases the parent, then waits for the old instance's sockets) → proxy
//!   and metrics listeners on the inherited sockets. The parent has to return before the sockets arrive: the old
//!   instance sends them only when it gets SIGQUIT, which the unit's `ExecReload` sends after the parent returned.
//! - both: bootstrap also waits for [`ParentListens`]. Pingora's parent installs its SIGUSR1 handler only after
//!   the fork, and SIGUSR1's default action ends a process: a daemon that got ready first killed its parent, and
//!   `infergate -d` exited 138 (7 starts in 100 on a loaded 2-core machine) although the daemon ran.
//!
//! **Drain.** On SIGQUIT (upgrade) or SIGTERM, [`DrainingSignals`] sets a flag before handing the signal to
//! Pingora; from then on every response tells the client `Connection: close` ([`close_if_draining`]). In an
//! upgrade the old instance keeps serving for 5 s after handing its sockets over (Pingora's `CLOSE_TIMEOUT`), so
//! each keep-alive client finishes the request it has in flight, closes, and reconnects to the shared listening
//! socket, which the new instance serves. Without the flag, Pingora answers those requests with `keep-alive`
//! and then drops every idle connection at once when the grace period starts, while the clients are already
//! sending their next request on it: one failed request per keep-alive connection.
//!
//! **Exit.** Once the listeners stopped, the process exits as soon as nothing is left to serve ([`drained`]), not
//! at the end of the grace period.

mod drained;
pub use drained::{clients_drained, requests_done, ExitWhenDrained, ShutdownWork};

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora_core::server::configuration::ServerConf;
use pingora_core::server::{
    Server, ShutdownSignal, ShutdownSignalWatch, ShutdownWatch, UnixShutdownSignalWatch,
};
use pingora_core::services::background::{background_service, BackgroundService};
use pingora_core::services::{ServiceHandle, ServiceReadyNotifier};
use pingora_proxy::Session;

/// How long [`ListenGate`] waits for the listeners. Pingora retries a taken port for 30 s, then the bind-failure
/// hook (`listen`) ends the process; past this the gate gives up waiting and lets the start go on.
const GATE_LIMIT: Duration = Duration::from_secs(40);
const GATE_POLL: Duration = Duration::from_millis(20);

/// Set once a graceful upgrade or terminate was signalled (one server per process: the binary's).
static DRAINING: AtomicBool = AtomicBool::new(false);

/// Set with [`DRAINING`] when the drain is a graceful upgrade (SIGQUIT): a new instance serves meanwhile.
static UPGRADING: AtomicBool = AtomicBool::new(false);

/// Whether this process is draining: a new instance took over or a stop was requested.
pub fn draining() -> bool {
    DRAINING.load(Ordering::Acquire)
}

/// Whether this process is draining because a new instance took over (SIGQUIT), not for a stop.
pub fn upgrading() -> bool {
    UPGRADING.load(Ordering::Acquire)
}

/// Mark the process as draining (what [`DrainingSignals`] does on SIGQUIT and SIGTERM).
pub fn start_draining() {
    if !DRAINING.swap(true, Ordering::AcqRel) {
        log::info!("draining: every response from now on carries `Connection: close`");
    }
}

/// Whether every `listen` and `metrics_listen` address accepts connections: set once [`ListenGate`] passed, so
/// the metrics port's `/health` (which starts before the proxy's listeners) cannot say ready before clients can
/// connect. One per server; clones share it.
#[derive(Clone, Default)]
pub struct Serving(Arc<AtomicBool>);

impl Serving {
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    pub(crate) fn set(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// While draining, the response to this request closes its connection (`Connection: close`), so the client
/// reconnects, to the new instance in an upgrade, instead of reusing a connection about to be dropped.
pub fn close_if_draining(session: &mut Session) {
    if draining() {
        session.set_keepalive(None);
    }
}

/// Pingora's Unix signals (SIGQUIT upgrade, SIGTERM graceful stop, SIGINT fast stop), with the drain flag set
/// before Pingora acts on a graceful one.
pub struct DrainingSignals;

#[async_trait]
impl ShutdownSignalWatch for DrainingSignals {
    async fn recv(&self) -> ShutdownSignal {
        let signal = UnixShutdownSignalWatch.recv().await;
        if matches!(signal, ShutdownSignal::GracefulUpgrade) {
            UPGRADING.store(true, Ordering::Release);
        }
        if matches!(
            signal,
            ShutdownSignal::GracefulUpgrade | ShutdownSignal::GracefulTerminate
        ) {
            start_draining();
        }
        signal
    }
}

/// Order the services for a start (`upgrade` false) or an upgrade (see the module doc). `listening` are the
/// services with listeners (proxy, metrics), `addrs` their addresses; `serving` is set once they all accept.
pub fn order_startup(
    server: &mut Server,
    upgrade: bool,
    housekeeping: &ServiceHandle,
    listening: &[ServiceHandle],
    addrs: &[String],
    serving: &Serving,
) {
    let wait_for_parent = server.configuration.daemon && server.configuration.daemon_wait_for_ready;
    let bootstrap = server.bootstrap_as_a_service();
    if wait_for_parent {
        // Before the fork (this runs in `main`) this process is the parent the daemon will signal.
        let parent = std::process::id();
        let listens = server.add_service(background_service(
            "infergate parent listens",
            ParentListens { parent },
        ));
        bootstrap.add_dependency(&listens);
    }
    let gate = server.add_service(background_service(
        "infergate listen gate",
        ListenGate {
            addrs: addrs.iter().filter_map(|a| probe_addr(a)).collect(),
            serving: serving.clone(),
            limit: GATE_LIMIT,
        },
    ));
    gate.add_dependencies(listening);
    if upgrade {
        // The gate only marks the listeners serving: the inherited sockets accept from the start.
        bootstrap.add_dependency(housekeeping);
        for l in listening {
            l.add_dependency(&bootstrap);
        }
    } else {
        bootstrap.add_dependency(&gate);
    }
}

/// Where to connect to reach a listener on `addr`: its first resolved address (the one Pingora binds), with an
/// unspecified IP (`0.0.0.0`, `[::]`) replaced by the loopback of its family.
pub fn probe_addr(addr: &str) -> Option<SocketAddr> {
    let mut a = addr.to_socket_addrs().ok()?.next()?;
    if a.ip().is_unspecified() {
        a.set_ip(match a.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        });
    }
    Some(a)
}

/// Ready once every address accepts a TCP connection (the probe closes without sending anything, which the
/// listeners take silently), or after [`GATE_LIMIT`]; marks [`Serving`] when every address accepted, also when
/// that happens only after the gate gave up waiting (it keeps probing, slower), so `/health` on the metrics port
/// says "starting" while the client port refuses connections and not for the rest of the process's life.
struct ListenGate {
    addrs: Vec<SocketAddr>,
    serving: Serving,
    /// [`GATE_LIMIT`].
    limit: Duration,
}

/// How often the gate probes once it gave up waiting.
const GATE_LATE_POLL: Duration = Duration::from_secs(1);

/// Whether every one of `addrs` accepts a TCP connection, probing each every `poll` until it does; at `until`
/// (None: no limit) or once `shutdown` is set, the first address that did not.
async fn accepts_all(
    addrs: &[SocketAddr],
    shutdown: &ShutdownWatch,
    until: Option<Instant>,
    poll: Duration,
) -> Result<(), SocketAddr> {
    for addr in addrs {
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            if *shutdown.borrow() || until.is_some_and(|u| Instant::now() > u) {
                return Err(*addr);
            }
            tokio::time::sleep(poll).await;
        }
    }
    Ok(())
}

#[async_trait]
impl BackgroundService for ListenGate {
    async fn start_with_ready_notifier(
        &self,
        shutdown: ShutdownWatch,
        ready: ServiceReadyNotifier,
    ) {
        let limit = Instant::now() + self.limit;
        let all = accepts_all(&self.addrs, &shutdown, Some(limit), GATE_POLL).await;
        if *shutdown.borrow() {
            return;
        }
        match all {
            Ok(()) => self.serving.set(),
            Err(addr) => log::warn!(
                "{addr} does not accept connections after {:?}; starting anyway",
                self.limit
            ),
        }
        log::info!("listening on {} address(es)", self.addrs.len());
        ready.notify_ready();
        if all.is_err()
            && accepts_all(&self.addrs, &shutdown, None, GATE_LATE_POLL)
                .await
                .is_ok()
        {
            self.serving.set();
            log::info!("the client listeners accept connections now");
        }
    }
}

/// How long [`ParentListens`] waits. The parent installs its handler a moment after the fork; only a parent stopped
/// or starved of CPU takes longer, and past this the daemon signals anyway (as it always did).
const PARENT_LIMIT: Duration = Duration::from_secs(10);
const PARENT_POLL: Duration = Duration::from_millis(5);

/// Ready once the parent waiting for the daemon (`daemon_wait_for_ready`) catches SIGUSR1, so that Pingora's
/// readiness signal cannot arrive before the handler and kill it; also once the parent is gone (nothing to
/// kill), or after [`PARENT_LIMIT`].
struct ParentListens {
    parent: u32,
}

#[async_trait]
impl BackgroundService for ParentListens {
    async fn start_with_ready_notifier(
        &self,
        shutdown: ShutdownWatch,
        ready: ServiceReadyNotifier,
    ) {
        let start = Instant::now();
        let status = format!("/proc/{}/status", self.parent);
        loop {
            let catches = match std::fs::read_to_string(&status) {
                Ok(text) => catches_signal(&text, libc::SIGUSR1),
                Err(_) => None,
            };
            match catches {
                Some(true) => break,
                None => {
                    log::debug!(
                        "parent {} is gone or unreadable; not waiting for it",
                        self.parent
                    );
                    break;
                }
                Some(false) if start.elapsed() > PARENT_LIMIT => {
                    log::warn!(
                        "the parent process {} does not catch SIGUSR1 after {PARENT_LIMIT:?}; signalling \
                         readiness anyway",
                        self.parent
                    );
                    break;
                }
                Some(false) => {}
            }
            if *shutdown.borrow() {
                return;
            }
            tokio::time::sleep(PARENT_POLL).await;
        }
        ready.notify_ready();
    }
}

/// Whether the process whose `/proc/<pid>/status` is `status` has a handler for `signal` (its `SigCgt` mask);
/// None for an exited process (a zombie) or an unreadable status.
fn catches_signal(status: &str, signal: i32) -> Option<bool> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    if field("State:")?.starts_with('Z') {
        return None;
    }
    let caught = u64::from_str_radix(field("SigCgt:")?, 16).ok()?;
    let bit = u32::try_from(signal).ok()?.checked_sub(1)?;
    Some(caught.checked_shr(bit).is_some_and(|m| m & 1 == 1))
}

/// Paths in the `server` section that will not work where the process runs: relative ones in a daemon (it works
/// in `/`), and, under systemd with `RuntimeDirectory=` (`runtime_dir`, systemd's `$RUNTIME_DIRECTORY`), a pid
/// file or upgrade socket outside it (`PrivateTmp` hides `/tmp` from other units, and the unit's `PIDFile=` is in
/// the runtime directory).
pub fn path_warnings(conf: &ServerConf, daemon: bool, runtime_dir: Option<&str>) -> Vec<String> {
    let mut out = Vec::new();
    let paths = [
        ("pid_file", Some(conf.pid_file.as_str())),
        ("upgrade_sock", Some(conf.upgrade_sock.as_str())),
        ("error_log", conf.error_log.as_deref()),
    ];
    for (key, path) in paths {
        let Some(path) = path else { continue };
        if daemon && conf.working_directory.is_none() && Path::new(path).is_relative() {
            out.push(format!(
                "server.{key} `{path}` is relative, and a daemon works in `/`: use an absolute path"
            ));
        }
    }
    if let Some(dir) = runtime_dir.filter(|d| !d.is_empty()) {
        for (key, path) in &paths[..2] {
            let path = path.unwrap_or_default();
            if !Path::new(path).starts_with(dir) {
                out.push(format!(
                    "server.{key} `{path}` is outside the unit's RuntimeDirectory {dir}: set \
                     `{key}: {dir}/{}` (see conf/infergate.systemd.yaml)",
                    if *key == "pid_file" {
                        "infergate.pid"
                    } else {
                        "upgrade.sock"
                    }
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_gate_waits_for_a_listener_that_comes_late_and_stops_at_its_limit_or_shutdown() {
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        let free = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let addr = free.local_addr().expect("its address");
        drop(free);
        let soon = Some(Instant::now() + Duration::from_millis(100));
        assert_eq!(
            accepts_all(&[addr], &shutdown, soon, Duration::from_millis(10)).await,
            Err(addr)
        );
        // No limit: it keeps probing until the listener is there.
        let late = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { accepts_all(&[addr], &shutdown, None, Duration::from_millis(10)).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!late.is_finished());
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("the port again");
        let all = tokio::time::timeout(Duration::from_secs(10), late).await;
        assert!(matches!(all, Ok(Ok(Ok(())))), "{all:?}");
        drop(listener);
        // A stop ends the probing.
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        let stopped = tokio::spawn(async move {
            accepts_all(&[addr], &shutdown, None, Duration::from_millis(10)).await
        });
        stop.send(true).expect("the gate listens");
        let all = tokio::time::timeout(Duration::from_secs(10), stopped).await;
        assert!(matches!(all, Ok(Ok(Err(_)))), "{all:?}");
    }

    #[tokio::test]
    async fn health_says_serving_once_a_listener_late_past_the_gates_limit_accepts() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let addr = free.local_addr().expect("its address");
        drop(free);
        let serving = Serving::default();
        let gate = Arc::new(ListenGate {
            addrs: vec![addr],
            serving: serving.clone(),
            limit: Duration::from_millis(100),
        });
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        let (ready_tx, mut ready) = tokio::sync::watch::channel(false);
        let task = tokio::spawn({
            let gate = gate.clone();
            async move {
                gate.start_with_ready_notifier(shutdown, ServiceReadyNotifier::new(ready_tx))
                    .await
            }
        });
        // Past its limit the start goes on, and /health says starting: the client port refuses connections.
        tokio::time::timeout(Duration::from_secs(10), ready.wait_for(|r| *r))
            .await
            .expect("ready within the limit")
            .expect("the gate notifies");
        assert!(!serving.get());
        // The listener comes: /health follows it.
        let _listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("the port again");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !serving.get() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(serving.get(), "serving stays unset after the listener came");
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the gate ends once serving")
            .expect("no panic");
    }

    #[test]
    fn a_parent_catches_sigusr1_when_its_sigcgt_mask_says_so() {
        let status = |state: &str, caught: &str| {
            format!(
                "Name:\tinfergate\nState:\t{state}\nSigBlk:\t0000000000000000\nSigCgt:\t{caught}\n"
            )
        };
        assert_eq!(
            catches_signal(&status("S (sleeping)", "0000000000000200"), libc::SIGUSR1),
            Some(true)
        );
        // Rust's SIGSEGV and SIGBUS handlers (installed before the fork), not yet SIGUSR1.
        assert_eq!(
            catches_signal(&status("R (running)", "0000000000000440"), libc::SIGUSR1),
            Some(false)
        );
        assert_eq!(
            catches_signal(&status("Z (zombie)", "0000000000000200"), libc::SIGUSR1),
            None
        );
        assert_eq!(catches_signal("Name:\tx\n", libc::SIGUSR1), None);
        assert_eq!(catches_signal(&status("S", "zz"), libc::SIGUSR1), None);
        let own = std::fs::read_to_string("/proc/self/status").unwrap();
        assert!(catches_signal(&own, libc::SIGUSR1).is_some());
    }

    #[test]
    fn paths_that_cannot_work_under_a_daemon_or_systemd_are_named() {
        let conf = |pid: &str, sock: &str| ServerConf {
            pid_file: pid.to_string(),
            upgrade_sock: sock.to_string(),
            ..ServerConf::default()
        };
        let good = conf(
            "/run/infergate/infergate.pid",
            "/run/infergate/upgrade.sock",
        );
        assert!(path_warnings(&good, true, Some("/run/infergate")).is_empty());
        let tmp = conf("/tmp/infergate.pid", "/run/infergate/upgrade.sock");
        let w = path_warnings(&tmp, true, Some("/run/infergate"));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("server.pid_file `/tmp/infergate.pid` is outside"),
            "{w:?}"
        );
        assert!(path_warnings(&tmp, true, None).is_empty());
        let relative = conf("infergate.pid", "/tmp/u.sock");
        assert_eq!(path_warnings(&relative, true, None).len(), 1);
        assert!(path_warnings(&relative, false, None).is_empty());
    }

    #[test]
    fn probes_go_to_loopback_for_unspecified_addresses() {
        assert_eq!(
            probe_addr("0.0.0.0:8000"),
            Some("127.0.0.1:8000".parse().unwrap())
        );
        assert_eq!(probe_addr("[::]:8000"), Some("[::1]:8000".parse().unwrap()));
        assert_eq!(
            probe_addr("127.0.0.1:9"),
            Some("127.0.0.1:9".parse().unwrap())
        );
        assert_eq!(probe_addr("not an address"), None);
    }
}
