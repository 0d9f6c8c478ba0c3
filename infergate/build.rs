//! Records the commit the binary is built from as `INFERGATE_COMMIT` (`infergate_build_info{commit}`): the
//! `INFERGATE_COMMIT` environment variable if set (a build without `.git`, e.g. a container build), else
//! `git rev-parse --short=12 HEAD`, else `unknown`. Uncommitted changes are not marked (watching the
//! sources for that would rebuild the crate on every edit).

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=INFERGATE_COMMIT");
    let commit = match std::env::var("INFERGATE_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => from_git().unwrap_or_else(|| "unknown".to_string()),
    };
    println!("cargo:rustc-env=INFERGATE_COMMIT={commit}");
}

fn from_git() -> Option<String> {
    let head = git(&["rev-parse", "--short=12", "HEAD"])?;
    // Rebuild when HEAD moves: the worktree's HEAD file and the branch ref it points to (loose or packed).
    let git_dir = git(&["rev-parse", "--git-dir"])?;
    let common = git(&["rev-parse", "--git-common-dir"]).unwrap_or_else(|| git_dir.clone());
    let mut watch = vec![Path::new(&git_dir).join("HEAD")];
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push(Path::new(&common).join(r));
    }
    watch.push(Path::new(&common).join("packed-refs"));
    for p in watch.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    Some(head)
}
