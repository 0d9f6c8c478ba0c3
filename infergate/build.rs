//! Records the git commit the binary is built from for `infergate --version` and `infergate_build_info`
//! (`INFERGATE_GIT_COMMIT`, `INFERGATE_COMMIT`).
//!
//! Taken from the environment when set (a packager building from a tarball), else from `git rev-parse HEAD`,
//! else "unknown" (no git, or not a checkout). Rebuilt when HEAD or the branch it points to moves.

use std::process::Command;

const VAR: &str = "INFERGATE_GIT_COMMIT";

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed={VAR}");
    println!("cargo:rerun-if-env-changed=INFERGATE_COMMIT");
    // INFERGATE_COMMIT is the same, under the name a container build passes (`--build-arg`).
    let given = std::env::var(VAR)
        .ok()
        .or_else(|| std::env::var("INFERGATE_COMMIT").ok())
        .filter(|c| !c.trim().is_empty());
    let source = if given.is_some() { "env" } else { "git" };
    let commit = given.or_else(|| git(&["rev-parse", "--short=12", "HEAD"]));
    // Rerun when HEAD moves: HEAD itself (a checkout), its reflog (every commit, reset or checkout in this
    // checkout, also when the branch is packed), the branch it points to. Only files that exist: cargo reruns a
    // build script on every build while one of its paths is missing.
    let mut watched = vec!["HEAD".to_string(), "logs/HEAD".to_string()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name]) {
            if std::path::Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    if commit.is_none() {
        // Not a checkout: nothing to watch but this file.
        println!("cargo:rerun-if-changed=build.rs");
    }
    let shown = commit.as_deref().unwrap_or("unknown");
    println!("cargo:rustc-env={VAR}={shown}");
    // The same value for `infergate_build_info{commit}`.
    println!("cargo:rustc-env=INFERGATE_COMMIT={shown}");
    // Where it came from (env, git, unknown): the tests compare a git commit with the checkout's HEAD.
    let source = if commit.is_some() { source } else { "unknown" };
    println!("cargo:rustc-env={VAR}_SOURCE={source}");
}
