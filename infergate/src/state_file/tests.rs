//! The state file against real router states: what survives a restart, what is dropped, what is ignored.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use super::format::{self, PoolState, Row, StateDoc};
use super::*;
use crate::config::{Config, StateFileConfig};

fn state(endpoints: &[u16], ttl: &str) -> Sessions {
    let eps: String = endpoints
        .iter()
        .map(|p| format!("      - http://127.0.0.1:{p}\n"))
        .collect();
    let text = format!(
        "pools:\n  - name: chat\n    sessions: {{ ttl: {ttl}, max_sessions: 10 }}\n    endpoints:\n{eps}\
         \x20 - name: plain\n    models: [other]\n    policy: round_robin\n    endpoints: [\"http://127.0.0.1:9\"]\n"
    );
    let cfg = Config::parse(Path::new("t.yaml"), &text).unwrap();
    Sessions {
        pools: crate::pool::Pools::new(&cfg, crate::metrics::Metrics::new()),
        cfg: Arc::new(cfg),
    }
}

fn path(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!(
        "infergate-state-test-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&p);
    p
}

fn file(path: &Path) -> StateFile {
    StateFile::new(&StateFileConfig {
        path: path.to_path_buf(),
        interval: Duration::from_secs(10),
    })
}

/// Endpoint id of `chat`'s endpoint on `port`.
fn id(s: &Sessions, port: u16) -> u64 {
    s.pools.pools[0]
        .endpoints()
        .iter()
        .find(|e| e.label == format!("127.0.0.1:{port}"))
        .unwrap()
        .id
}

fn bind(s: &Sessions, key: u64, port: u64, idle_s: u64) {
    let endpoint = id(s, port as u16);
    let sessions = s.pools.pools[0].policy.sessions().expect("a sessions pool");
    let out = sessions.import_sessions(
        vec![SavedSession {
            key,
            endpoint,
            idle: Duration::from_secs(idle_s),
            lineages: vec![(0xA, 1234)],
        }],
        Instant::now(),
    );
    assert_eq!(out.adopted, 1);
}

/// One binding as a test sees it: (key, endpoint label, lineages).
type Bound = (u64, String, Vec<(u64, u32)>);

/// `chat`'s bindings.
fn bindings(s: &Sessions) -> Vec<Bound> {
    let eps = s.pools.pools[0].endpoints();
    s.pools.pools[0]
        .policy
        .sessions()
        .map(|s| s.export_sessions(Instant::now()))
        .unwrap()
        .into_iter()
        .map(|b| {
            let label = eps
                .iter()
                .find(|e| e.id == b.endpoint)
                .unwrap()
                .label
                .clone();
            (b.key, label, b.lineages)
        })
        .collect()
}

#[test]
fn bindings_survive_by_endpoint_url_and_departed_endpoints_drop() {
    let p = path("restart");
    let a = state(&[8101, 8102], "1h");
    bind(&a, 1, 8101, 30);
    bind(&a, 2, 8102, 20);
    let fa = file(&p);
    assert_eq!(fa.save(&a).unwrap(), 2);
    // The next instance: 8101 left, 8103 joined; ids differ from the first process's.
    let b = state(&[8103, 8102], "1h");
    assert_ne!(id(&a, 8102), id(&b, 8102));
    let r = file(&p).load(&b).unwrap();
    assert_eq!(
        r,
        LoadReport {
            adopted: 1,
            gone: 1,
            ..LoadReport::default()
        }
    );
    assert_eq!(
        bindings(&b),
        vec![(2, "127.0.0.1:8102".to_string(), vec![(0xA, 1234)])]
    );
    let _ = std::fs::remove_file(&p);
}

#[test]
fn expired_bindings_and_unknown_pools_drop() {
    let p = path("expired");
    let now_ms = unix_ms(SystemTime::now());
    let row = |key, idle_ms: u64| Row {
        key,
        endpoint: 0,
        last_seen_ms: now_ms - idle_ms,
        lineages: vec![],
    };
    let doc = StateDoc {
        writer: 1,
        written_at_ms: now_ms - 1000,
        pools: vec![
            PoolState {
                name: "chat".into(),
                endpoints: vec!["HTTP://127.0.0.1:8101".into()],
                sessions: vec![row(1, 2 * 3_600_000), row(2, 60_000)],
            },
            PoolState {
                name: "renamed".into(),
                endpoints: vec!["http://127.0.0.1:8101".into()],
                sessions: vec![row(3, 1)],
            },
            PoolState {
                name: "plain".into(),
                endpoints: vec!["http://127.0.0.1:9".into()],
                sessions: vec![row(4, 1)],
            },
        ],
    };
    write_atomically(&p, format::encode(&doc).as_bytes()).unwrap();
    let s = state(&[8101], "1h");
    let r = file(&p).load(&s).unwrap();
    assert_eq!(
        r,
        LoadReport {
            adopted: 1,
            expired: 1,
            gone: 2,
            ..LoadReport::default()
        }
    );
    assert_eq!(bindings(&s).iter().map(|b| b.0).collect::<Vec<_>>(), [2]);
    let _ = std::fs::remove_file(&p);
}

#[test]
fn unusable_files_are_ignored_and_the_router_starts_unbound() {
    let p = path("bad");
    let s = state(&[8101], "1h");
    assert_eq!(file(&p).load(&s), None, "no file");
    let a = state(&[8101], "1h");
    bind(&a, 1, 8101, 1);
    file(&p).save(&a).unwrap();
    let good = std::fs::read(&p).unwrap();
    let cut = &good[..good.len() - 3];
    let v2 = String::from_utf8(good.clone())
        .unwrap()
        .replacen("\"version\":1", "\"version\":2", 1);
    for bytes in [cut, v2.as_bytes(), b"\x00\x01garbage", b""] {
        std::fs::write(&p, bytes).unwrap();
        assert_eq!(file(&p).load(&s), None);
        assert!(bindings(&s).is_empty());
    }
    // A directory where the file should be: unreadable, still no failure.
    let dir = path("bad-dir");
    std::fs::create_dir_all(&dir).unwrap();
    assert_eq!(file(&dir).load(&s), None);
    let _ = std::fs::remove_dir(&dir);
    let _ = std::fs::remove_file(&p);
}

#[test]
fn a_newer_file_from_another_instance_is_adopted_but_not_its_own() {
    let p = path("adopt");
    let new = state(&[8101, 8102], "1h");
    let fnew = file(&p);
    // The old instance's periodic write, loaded at start.
    let old = state(&[8101, 8102], "1h");
    let fold = file(&p);
    bind(&old, 1, 8101, 5);
    fold.save(&old).unwrap();
    assert_eq!(fnew.load(&new).unwrap().adopted, 1);
    // Nothing newer yet; then the new instance's own write is no reason to adopt.
    assert_eq!(fnew.adopt_newer(&new), None);
    std::thread::sleep(Duration::from_millis(5));
    fnew.save(&new).unwrap();
    assert_eq!(fnew.adopt_newer(&new), None);
    // The old instance's last write (it kept serving during the close timeout): adopted.
    std::thread::sleep(Duration::from_millis(5));
    bind(&old, 2, 8102, 0);
    fold.save(&old).unwrap();
    let r = fnew.adopt_newer(&new).unwrap();
    assert_eq!((r.adopted, r.older), (1, 1));
    assert_eq!(bindings(&new).len(), 2);
    assert_eq!(fnew.adopt_newer(&new), None, "once");
    // The old instance's write once its clients are gone happens only while the file is still its own.
    assert!(fold.last_written_by_us() && !fnew.last_written_by_us());
    fnew.save(&new).unwrap();
    assert!(!fold.last_written_by_us() && fnew.last_written_by_us());
    let _ = std::fs::remove_file(&p);
    assert!(!fnew.last_written_by_us(), "no file");
}

#[test]
fn writes_are_atomic_and_private() {
    let p = path("atomic");
    write_atomically(&p, b"one\n").unwrap();
    write_atomically(&p, b"two\n").unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), b"two\n");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let dir = p.parent().unwrap();
    let name = p.file_name().unwrap().to_string_lossy().into_owned();
    let leftovers = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.contains(&name) && n.ends_with(".tmp")
        })
        .count();
    assert_eq!(leftovers, 0);
    // A directory that does not exist: an error, nothing left behind.
    assert!(write_atomically(Path::new("/nonexistent-dir/x/state"), b"x").is_err());
    let _ = std::fs::remove_file(&p);
}

#[test]
fn limits_follow_the_configured_sessions() {
    let s = state(&[8101], "1h");
    let l = limits(&s);
    assert_eq!(l.max_sessions, 100_000, "10 sessions configured: the floor");
    assert_eq!(l.max_bytes, 100_000 * format::MAX_ROW_BYTES + SLACK_BYTES);
}

#[cfg(unix)]
#[test]
fn a_link_planted_where_the_temporary_file_went_is_never_written_through() {
    let p = path("planted");
    let victim = path("victim");
    std::fs::write(&victim, b"not the router's\n").unwrap();
    // The name the temporary file had before its name was random: `.{name}.{pid}.tmp`.
    let name = p.file_name().unwrap().to_string_lossy().into_owned();
    let planted = p
        .parent()
        .unwrap()
        .join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&planted);
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    write_atomically(&p, b"state\n").unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"not the router's\n");
    assert_eq!(std::fs::read(&p).unwrap(), b"state\n");
    for f in [&p, &victim, &planted] {
        let _ = std::fs::remove_file(f);
    }
}

#[cfg(unix)]
#[test]
fn a_fifo_at_the_state_file_path_is_refused_at_once_not_waited_on() {
    let p = path("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&p)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo (coreutils)");
    let (tx, rx) = std::sync::mpsc::channel();
    let sf = file(&p);
    let s = state(&[8101], "1h");
    std::thread::spawn(move || {
        let _ = tx.send((sf.read(limits(&s)), sf.peek()));
    });
    let (read, peek) = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("reading a FIFO state file returned at once");
    let err = read.expect_err("a FIFO is not a state file");
    assert!(err.contains("not a regular file"), "{err}");
    assert_eq!(peek, None);
    let _ = std::fs::remove_file(&p);
}
