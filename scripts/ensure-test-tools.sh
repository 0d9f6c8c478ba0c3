#!/usr/bin/env bash
# Installs the tools the tests run on Debian: promtool (package `prometheus`) for the alert rules and headless
# Chromium (`chromium`, plus a font) for the status page (infergate/tests/it/observe.rs), and `redis-server` for the
# router replicas sharing state (infergate/tests/it/cluster/, which starts its own on a free loopback port), and
# `strace` to hold a daemon's parent after the fork (infergate/tests/it/lifecycle.rs), and `systemd-analyze`
# (package `systemd`) for the unit checks of scripts/check-deploy.sh (infergate/tests/it/deploy.rs), and `lintian`
# for the Debian package (scripts/check-deb.sh).
# Idempotent; quiet when all are present. Run as root or with sudo.
set -euo pipefail
missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v chromium >/dev/null 2>&1 || missing+=(chromium fonts-dejavu-core)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v strace >/dev/null 2>&1 || missing+=(strace)
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
command -v lintian >/dev/null 2>&1 || missing+=(lintian)
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Only promtool is wanted: on a host running systemd the package also starts a Prometheus server on :9090 (the
# demo's metrics port). Stop it again.
if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
  $SUDO systemctl disable --now prometheus.service >/dev/null 2>&1 || true
fi
# Likewise only the binary of redis-server is wanted (the tests start their own), not a server on :6379.
if [[ " ${missing[*]} " == *" redis-server "* ]] && [ -d /run/systemd/system ]; then
  $SUDO systemctl disable --now redis-server.service >/dev/null 2>&1 || true
fi
