//! `infergate --help` is infergate's own text (its flags first, Pingora's marked as such); `--version` prints the
//! version and the git commit the binary was built from.

use std::process::Command;

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .args(args)
        .output()
        .expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn help_names_infergate_and_lists_its_flags_before_pingora_s() {
    for flag in ["--help", "-h"] {
        let (code, out) = run(&[flag]);
        assert_eq!(code, 0);
        assert!(out.starts_with("infergate "), "{out}");
        let own = out.find("infergate's options:").expect("own options");
        let pingora = out
            .find("Pingora's server options")
            .expect("Pingora's options");
        assert!(own < pingora);
        assert!(out[own..pingora].contains("--version"));
        for f in ["-c, --conf", "-t, --test", "-d, --daemon", "-u, --upgrade"] {
            assert!(out[pingora..].contains(f), "{f} under Pingora's options");
        }
        assert!(out.contains("SIGHUP"));
    }
}

#[test]
fn version_prints_the_version_and_the_commit() {
    let (code, out) = run(&["--version"]);
    assert_eq!(code, 0);
    let want = format!("infergate {} (commit ", env!("CARGO_PKG_VERSION"));
    assert!(out.starts_with(&want), "{out}");
    let commit = out
        .trim_end()
        .trim_start_matches(&want)
        .trim_end_matches(')');
    assert!(
        commit == "unknown"
            || (commit.len() == 12 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "{out}"
    );
    assert_eq!(commit, env!("INFERGATE_GIT_COMMIT"));
    // Taken from git at build time: the checkout's HEAD (build.rs reruns when HEAD moves).
    if env!("INFERGATE_GIT_COMMIT_SOURCE") == "git" {
        let head = Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("git");
        assert_eq!(commit, String::from_utf8_lossy(&head.stdout).trim());
    }
}
