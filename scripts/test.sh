#!/usr/bin/env bash
# The test command (README, .ci/run): formatting, lints, every unit and integration test, then the conformance
# run (the openai and anthropic SDKs, each an older and the current release, Codex CLI and curl against the router
# in front of engine-sim), the real-engine suite (real vLLM, its CPU build), the short demo, then the Debian package
# (built, installed with dpkg on this machine, checked and purged).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-deps.sh
# The tools the integration tests run (promtool and headless Chromium for the alert rules and the status page,
# redis-server, strace); the tests themselves install nothing and fail when one is missing.
scripts/ensure-test-tools.sh
rustup component add rustfmt clippy >/dev/null 2>&1 || true
echo "== cargo fmt --check"
cargo fmt --check
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings
echo "== scripts/check-msrv.sh"
scripts/check-msrv.sh
echo "== cargo test"
# Integration tests start engines and routers on loopback; two test threads suit a 2-core CI machine.
cargo test --all-targets -- --test-threads=2
echo "== scripts/conformance.sh"
scripts/conformance.sh
echo "== scripts/real-vllm.sh"
# Real vLLM engines (a ~6 GB venv under ~/.cache/infergate, built once, reused while its pins match).
scripts/real-vllm.sh
echo "== scripts/check-demo.sh"
# The README's demo, non-interactive: a move under pressure and the round_robin comparison.
scripts/check-demo.sh
echo "== scripts/check-deb.sh"
# The package of the binary the tests ran (cargo deb --profile dev --no-build): install, check, purge.
scripts/check-deb.sh
