//! The systemd deployment path as the README describes it: scripts/check-deploy.sh stages scripts/install.sh
//! into a temporary root with this build's binary, checks that the service user can read what it installed, that
//! the shipped config uses the unit's paths, and that `systemd-analyze verify` and `security` accept the unit.

use std::path::Path;
use std::process::Command;

use crate::common::tools::tool;

/// check-deploy.sh's status when systemd-analyze is missing and cannot be installed (not root, no apt-get).
const SKIPPED: i32 = 77;

#[test]
fn install_script_unit_and_config_pass_the_deployment_checks() {
    // Found here, so that check-deploy.sh has nothing to install (the test command's scripts install it).
    if tool("systemd-analyze").is_none() {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("bash")
        .arg(root.join("scripts/check-deploy.sh"))
        .args(["--binary", env!("CARGO_BIN_EXE_infergate")])
        .output()
        .expect("bash runs scripts/check-deploy.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(SKIPPED) {
        eprintln!("SKIPPED: the deployment checks need systemd-analyze: {stderr}");
        return;
    }
    assert!(
        out.status.success(),
        "scripts/check-deploy.sh failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
    println!("{stdout}");
}
