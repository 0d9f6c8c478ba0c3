//! Tools the tests run that nobody on the project wrote: a command on PATH (installed beforehand by
//! `scripts/ensure-test-tools.sh`, which the test command `scripts/test.sh` runs before the tests; the tests
//! themselves install nothing), run bounded; headless Chromium.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository's top directory.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// A command-line tool on PATH. None only when it is missing and `INFERGATE_SKIP_TOOL_TESTS` is set; missing
/// otherwise panics, saying to run `scripts/ensure-test-tools.sh` (the tests do not install anything).
pub fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    if found.is_some() {
        return found;
    }
    if std::env::var_os("INFERGATE_SKIP_TOOL_TESTS").is_some() {
        eprintln!("SKIPPED: {name} is not installed and INFERGATE_SKIP_TOOL_TESTS is set");
        return None;
    }
    panic!(
        "{name} is not on PATH: run {} first (it installs the Debian packages prometheus, chromium, \
         redis-server and strace; scripts/test.sh runs it before the tests), or set INFERGATE_SKIP_TOOL_TESTS=1",
        repo().join("scripts/ensure-test-tools.sh").display()
    )
}

/// strace, when it is installed and may trace here. A container without ptrace cannot run such a test at all:
/// None then, after saying so, rather than failing on the environment.
pub fn strace() -> Option<PathBuf> {
    let strace = tool("strace")?;
    let probe = Command::new(&strace)
        .args(["-o", "/dev/null", "-e", "trace=none", "true"])
        .output()
        .expect("strace runs");
    if !probe.status.success() {
        eprintln!(
            "SKIPPED: strace cannot trace here: {}",
            String::from_utf8_lossy(&probe.stderr)
        );
        return None;
    }
    Some(strace)
}

/// Run a command (bounded by `timeout`), panicking with its output when it fails; its stdout.
pub fn run(cmd: &mut Command, limit_secs: u32) -> String {
    let shown = format!("{cmd:?}");
    let mut bounded = Command::new("timeout");
    bounded
        .arg(limit_secs.to_string())
        .arg(cmd.get_program())
        .args(cmd.get_args());
    if let Some(dir) = cmd.get_current_dir() {
        bounded.current_dir(dir);
    }
    let out = bounded.output().expect("command starts");
    assert!(
        out.status.success(),
        "{shown} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Headless Chromium on `url` with the given mode arguments (`--dump-dom`, `--screenshot=...`), in a fresh
/// profile; its stdout.
pub fn chromium(chrome: &Path, url: &str, mode: &[&str]) -> String {
    let profile = std::env::temp_dir().join(format!(
        "infergate-chromium-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    let mut cmd = Command::new(chrome);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        // Let the page's 2 s refresh run once (virtual time waits for the fetch).
        "--virtual-time-budget=3000",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(mode)
    .arg(url);
    let out = run(&mut cmd, 90);
    let _ = std::fs::remove_dir_all(profile);
    out
}
