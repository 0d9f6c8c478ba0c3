//! Session bindings that outlive the process (`state_file`): written to a file, loaded by the next instance.
//!
//! * **Start**: the file is read while the server is built, before anything is served. Bindings whose pool or
//!   endpoint URL is no longer configured are dropped, so are those idle past the pool's TTL. A missing file is
//!   normal; an unreadable, truncated, foreign or wrong-version file is ignored with one warning, never a failed
//!   start.
//! * **Running**: the bindings are written every `interval` (10 s by default), atomically (a temporary file in the
//!   same directory, fsync, rename), so a crash or `kill -9` loses at most one interval.
//! * **Graceful shutdown or upgrade**: when Pingora's shutdown watch fires (SIGTERM; SIGQUIT after the listening
//!   sockets were handed over), the bindings are written once more, and again once no client connection is open
//!   (turns in flight commit late), unless another instance wrote the file in between.
//! * **Graceful upgrade order**: the new instance starts *before* the old one hands over its sockets, and the old
//!   one keeps serving for Pingora's 5 s close timeout after that; only then does its shutdown watch fire and its
//!   last write happen. So the new instance loads what the old one wrote last (at most `interval` old) and, for
//!   [`ADOPT_WINDOW`] after it started, looks at the file's first line every second: a newer file written by
//!   another process is adopted too. A key both know keeps the more recently served binding.
//!
//! Endpoints are named by URL (`http://host:port`, the endpoint's identity across reloads), never by the
//! in-process id. The format is in [`format`].

pub mod format;

use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use parking_lot::Mutex;
use pingora_core::server::{Server, ShutdownWatch};
use pingora_core::services::background::BackgroundService;

use crate::config::Config;
use crate::config::StateFileConfig;
use crate::lifecycle::ShutdownWork;
use crate::placement::sessions::SavedSession;
use crate::pool::Endpoint;
use crate::pool::Pools;
use format::{Limits, PoolState, Row, StateDoc};

/// How long after start a newer file written by another instance (the old one of a graceful upgrade) is adopted.
/// Pingora's old instance writes its last bindings about 5 s after handing its sockets over.
pub const ADOPT_WINDOW: Duration = Duration::from_secs(30);

/// How often the file's first line is looked at during the adopt window.
const ADOPT_POLL: Duration = Duration::from_secs(1);

/// A file may hold this many times the configured sessions (a file from before a `max_sessions` cut still loads,
/// its most recent bindings first) and no more.
const ROWS_PER_SESSION: usize = 4;

/// Room in a file beyond its rows: header, pool and end lines, endpoint lists.
const SLACK_BYTES: usize = 4 << 20;

/// What a load adopted and dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadReport {
    pub adopted: usize,
    /// Idle past the pool's TTL.
    pub expired: usize,
    /// The pool or the endpoint URL is not configured now, or the pool keeps no sessions.
    pub gone: usize,
    /// This process has a binding for the key served at least as recently.
    pub older: usize,
    /// More than the pool's max_sessions.
    pub over_capacity: usize,
}

/// One router's state file.
pub struct StateFile {
    path: PathBuf,
    interval: Duration,
    /// This process's id in the files it writes (so it does not adopt its own).
    writer: u64,
    /// `written_at_ms` of the newest file loaded.
    loaded_at_ms: Mutex<u64>,
    last_save_warning: Mutex<Option<Instant>>,
}

/// An endpoint's identity in the file.
pub fn endpoint_url(ep: &Endpoint) -> String {
    format!("http://{}", ep.label)
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What the state file saves and restores: the pools' session tables, read against the start configuration.
#[derive(Clone)]
pub struct Sessions {
    pub pools: Arc<Pools>,
    pub cfg: Arc<Config>,
}

/// The live bindings of every pool that keeps sessions, endpoints by URL.
pub fn export(state: &Sessions, writer: u64, now: Instant, now_ms: u64) -> StateDoc {
    let mut pools = Vec::new();
    for pool in &state.pools.pools {
        let Some(saved) = pool.policy.sessions().map(|s| s.export_sessions(now)) else {
            continue;
        };
        let endpoints = pool.endpoints();
        let sessions = saved
            .into_iter()
            .filter_map(|s| {
                // A binding to an endpoint that has left the pool is worthless.
                let i = endpoints.iter().position(|e| e.id == s.endpoint)?;
                Some(Row {
                    key: s.key,
                    endpoint: u32::try_from(i).ok()?,
                    last_seen_ms: now_ms.saturating_sub(ms(s.idle)),
                    lineages: s.lineages,
                })
            })
            .collect();
        pools.push(PoolState {
            name: pool.name.to_string(),
            endpoints: endpoints.iter().map(|e| endpoint_url(e)).collect(),
            sessions,
        });
    }
    StateDoc {
        writer,
        written_at_ms: now_ms,
        pools,
    }
}

/// Hand a file's bindings to the pools: by pool name, endpoints by URL.
pub fn import(state: &Sessions, doc: StateDoc, now: Instant, now_ms: u64) -> LoadReport {
    let mut r = LoadReport::default();
    for ps in doc.pools {
        let Some(pool) = state.pools.pools.iter().find(|p| *p.name == ps.name) else {
            r.gone += ps.sessions.len();
            continue;
        };
        let endpoints = pool.endpoints();
        let ids: Vec<Option<u64>> = ps
            .endpoints
            .iter()
            .map(|url| {
                endpoints
                    .iter()
                    .find(|e| endpoint_url(e).eq_ignore_ascii_case(url))
                    .map(|e| e.id)
            })
            .collect();
        let mut saved = Vec::with_capacity(ps.sessions.len());
        for row in ps.sessions {
            match ids.get(row.endpoint as usize).copied().flatten() {
                Some(endpoint) => saved.push(SavedSession {
                    key: row.key,
                    endpoint,
                    idle: Duration::from_millis(now_ms.saturating_sub(row.last_seen_ms)),
                    lineages: row.lineages,
                }),
                None => r.gone += 1,
            }
        }
        let out = match pool.policy.sessions() {
            Some(s) => s.import_sessions(saved, now),
            None => crate::placement::sessions::ImportOutcome::no_sessions(saved.len()),
        };
        r.adopted += out.adopted;
        r.expired += out.expired;
        r.older += out.older;
        r.over_capacity += out.over_capacity;
        r.gone += out.no_sessions;
    }
    r
}

/// What a reader of this configuration accepts.
pub fn limits(state: &Sessions) -> Limits {
    let sessions: usize = state
        .cfg
        .pools
        .iter()
        .filter_map(|p| p.policy.sessions())
        .map(|s| s.max_sessions)
        .fold(0usize, usize::saturating_add);
    let max_sessions = sessions.saturating_mul(ROWS_PER_SESSION).max(100_000);
    Limits {
        max_sessions,
        max_bytes: max_sessions
            .saturating_mul(format::MAX_ROW_BYTES)
            .saturating_add(SLACK_BYTES),
    }
}

/// Write `bytes` to `path` atomically: a temporary file beside it (mode 0600), fsync, rename, fsync the directory.
/// The temporary file's name is random and it is created exclusively, never through a link: a file or symlink
/// planted at a name it might take makes it pick another, never write where the link points.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (tmp, mut f) = create_temporary(dir, &name)?;
    let written = (|| {
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        // The rename itself must survive a crash; some filesystems refuse to sync a directory, which is fine.
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// A new file `.{name}.{random}.tmp` in `dir`, created exclusively (O_EXCL, O_NOFOLLOW), mode 0600.
fn create_temporary(dir: &Path, name: &str) -> std::io::Result<(PathBuf, std::fs::File)> {
    let mut last = None;
    for _ in 0..8 {
        let tmp = dir.join(format!(".{name}.{:016x}.tmp", fastrand::u64(..)));
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600).custom_flags(libc::O_NOFOLLOW);
        }
        match opts.open(&tmp) {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no temporary name was free")))
}

/// Open the state file to read it without ever blocking: a FIFO or a device at the path is refused, not waited on.
fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut opts, libc::O_NONBLOCK);
    let f = opts.open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "is not a regular file",
        ));
    }
    Ok(f)
}

impl StateFile {
    pub fn new(cfg: &StateFileConfig) -> StateFile {
        StateFile {
            path: cfg.path.clone(),
            interval: cfg.interval,
            writer: fastrand::u64(..),
            loaded_at_ms: Mutex::new(0),
            last_save_warning: Mutex::new(None),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole file within `limits`; None when there is none.
    fn read(&self, limits: Limits) -> Result<Option<Vec<u8>>, String> {
        let f = match open_regular(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read: {e}")),
        };
        let mut bytes = Vec::new();
        // One byte more than allowed tells "too large" without reading a huge file.
        f.take(limits.max_bytes as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("cannot read: {e}"))?;
        Ok(Some(bytes))
    }

    /// The header of the file now: (writer, written_at_ms); None when there is no readable header.
    fn peek(&self) -> Option<(u64, u64)> {
        let f = open_regular(&self.path).ok()?;
        let mut first = Vec::new();
        std::io::BufReader::new(f.take(4096))
            .read_until(b'\n', &mut first)
            .ok()?;
        format::peek(&first).ok()
    }

    /// Whether the file's header names this instance as its writer.
    fn last_written_by_us(&self) -> bool {
        self.peek().is_some_and(|(writer, _)| writer == self.writer)
    }

    /// Load the file at start and adopt every binding still meaningful. Never fails: a file that cannot be used
    /// is one warning.
    pub fn load(&self, state: &Sessions) -> Option<LoadReport> {
        let bytes = match self.read(limits(state)) {
            Ok(Some(b)) => b,
            Ok(None) => {
                log::info!(
                    "state file {}: none yet; sessions start unbound",
                    self.path.display()
                );
                return None;
            }
            Err(e) => {
                self.ignored(&e);
                return None;
            }
        };
        self.adopt(state, &bytes)
    }

    /// During the adopt window: adopt the file if another process wrote it after the one loaded last.
    pub fn adopt_newer(&self, state: &Sessions) -> Option<LoadReport> {
        let (writer, at) = self.peek()?;
        if writer == self.writer || at <= *self.loaded_at_ms.lock() {
            return None;
        }
        match self.read(limits(state)) {
            Ok(Some(bytes)) => self.adopt(state, &bytes),
            Ok(None) => None,
            Err(e) => {
                self.ignored(&e);
                None
            }
        }
    }

    fn ignored(&self, why: &str) {
        log::warn!(
            "state file {} ignored, sessions start unbound: {why}",
            self.path.display()
        );
    }

    fn adopt(&self, state: &Sessions, bytes: &[u8]) -> Option<LoadReport> {
        let doc = match format::decode(bytes, limits(state)) {
            Ok(doc) => doc,
            Err(e) => {
                self.ignored(&e.to_string());
                return None;
            }
        };
        {
            let mut loaded = self.loaded_at_ms.lock();
            *loaded = (*loaded).max(doc.written_at_ms);
        }
        let now_ms = unix_ms(SystemTime::now());
        let age = Duration::from_millis(now_ms.saturating_sub(doc.written_at_ms));
        let writer = doc.writer;
        let r = import(state, doc, Instant::now(), now_ms);
        log::info!(
            "state file {}: adopted {} session bindings (written {} ago by instance {writer:016x}); dropped {} \
             whose pool or endpoint is gone, {} expired, {} over max_sessions; {} older than this instance's own",
            self.path.display(),
            r.adopted,
            humantime::format_duration(Duration::from_secs(age.as_secs())),
            r.gone,
            r.expired,
            r.over_capacity,
            r.older,
        );
        Some(r)
    }

    /// Write the bindings now; the number of bindings written.
    pub fn save(&self, state: &Sessions) -> std::io::Result<usize> {
        let doc = export(
            state,
            self.writer,
            Instant::now(),
            unix_ms(SystemTime::now()),
        );
        let n = doc.pools.iter().map(|p| p.sessions.len()).sum();
        write_atomically(&self.path, format::encode(&doc).as_bytes())?;
        Ok(n)
    }

    /// `save`, with a failure logged (at most once a minute while it keeps failing).
    pub fn save_logged(&self, state: &Sessions) -> Option<usize> {
        match self.save(state) {
            Ok(n) => {
                *self.last_save_warning.lock() = None;
                Some(n)
            }
            Err(e) => {
                let mut last = self.last_save_warning.lock();
                if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                    *last = Some(Instant::now());
                    log::warn!(
                        "state file {}: cannot write session bindings: {e}",
                        self.path.display()
                    );
                }
                None
            }
        }
    }
}

/// Load the state file (when configured and some pool keeps sessions) and add the service that writes it.
pub fn install(server: &mut Server, state: &Sessions) {
    let Some(cfg) = &state.cfg.state_file else {
        return;
    };
    if !state
        .cfg
        .pools
        .iter()
        .any(|p| p.policy.sessions().is_some())
    {
        log::warn!(
            "state_file {} is set but no pool keeps sessions (policy load_aware with `sessions`); nothing is saved",
            cfg.path.display()
        );
        return;
    }
    let file = Arc::new(StateFile::new(cfg));
    file.load(state);
    server.add_service(pingora_core::services::background::background_service(
        "infergate session state",
        StateService {
            state: state.clone(),
            file,
            last_write: Mutex::new(Some(ShutdownWork::expect())),
        },
    ));
}

/// Writes the state file every interval and at a graceful shutdown; adopts a newer foreign file early on.
pub struct StateService {
    state: Sessions,
    file: Arc<StateFile>,
    /// The write at shutdown, which the process's early exit waits for.
    last_write: Mutex<Option<ShutdownWork>>,
}

impl StateService {
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&StateFile, &Sessions) -> T + Send + 'static,
    ) -> Option<T> {
        let (file, state) = (self.file.clone(), self.state.clone());
        tokio::task::spawn_blocking(move || f(&file, &state))
            .await
            .ok()
    }
}

#[async_trait]
impl BackgroundService for StateService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let started = Instant::now();
        let mut next_save = started + self.file.interval;
        let mut tick = tokio::time::interval(ADOPT_POLL.min(self.file.interval));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => break,
            }
            let now = Instant::now();
            if now.duration_since(started) < ADOPT_WINDOW {
                self.blocking(|f, s| f.adopt_newer(s)).await;
            }
            if now >= next_save {
                next_save = now + self.file.interval;
                self.blocking(|f, s| f.save_logged(s)).await;
            }
        }
        // Graceful shutdown or upgrade. Written here, on this thread: the runtime may be shut down right after
        // the grace period, and a blocking task that never started would never write.
        if let Some(n) = self.file.save_logged(&self.state) {
            log::info!(
                "state file {}: wrote {n} session bindings for the next instance",
                self.file.path.display()
            );
        }
        // A turn still in flight commits its binding when its answer starts (a non-streamed one at its end):
        // once a signalled stop has no client left, write again, unless another instance (the new one of an
        // upgrade) wrote the file since. The new instance adopts it as it adopted the first.
        if crate::lifecycle::draining() {
            crate::lifecycle::clients_drained().await;
            if self.file.last_written_by_us() {
                if let Some(n) = self.file.save_logged(&self.state) {
                    log::info!(
                        "state file {}: wrote {n} session bindings once the clients were gone",
                        self.file.path.display()
                    );
                }
            } else {
                log::info!(
                    "state file {}: another instance wrote it since the stop began; not written again",
                    self.file.path.display()
                );
            }
        }
        drop(self.last_write.lock().take());
    }
}

#[cfg(test)]
mod tests;
