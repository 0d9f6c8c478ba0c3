#!/usr/bin/env bash
# Conformance run: clients nobody on the project wrote (the official openai Python SDK, a 1.x and the current
# release; the official anthropic Python SDK, a 0.x and the current release; Codex CLI, a coding agent on the
# Responses API; curl) drive the router in front of simulated engines, with a client key required as in production.
#
# Builds the debug binaries if needed, creates or updates one venv per SDK version under .venv/, starts two
# engine-sim processes (pools m1 and m2, two engines each) and the router on free loopback ports, runs
# scripts/conformance/test_openai_sdk.py once per openai version and test_anthropic_sdk.py once per anthropic
# version and test_codex_cli.py once, stops everything it started, and exits non-zero if any test failed. Logs of
# the engines and the router: target/conformance/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

# openai 1.x serialises `messages` before `model` in the JSON body; 3.x puts `model` first.
OPENAI_VERSIONS=(1.109.1 3.57.0)
# Both put `model` after `messages`; 0.49 (March 2025) brings httpx, 2.x httpx2.
ANTHROPIC_VERSIONS=(0.49.0 2.15.0)
# OpenAI's coding agent (Apache-2.0), from npm: a native binary behind a node launcher.
CODEX_VERSION=0.171.0
PYTEST_VERSION=9.2.0
STARTUP_TIMEOUT=30   # seconds for the engines and the router to become ready
SUITE_TIMEOUT=300    # seconds for one pytest run
LOGS=$ROOT/target/conformance

log() { echo "== conformance: $*"; }

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

apt_install() {
  log "installing $* (apt-get)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# --- tools: curl, the venv module, the binaries, the SDK venvs -------------------------------------------------
command -v curl >/dev/null 2>&1 || apt_install curl
command -v openssl >/dev/null 2>&1 || apt_install openssl
python3 -c 'import ensurepip, venv' 2>/dev/null || apt_install python3-venv
scripts/ensure-deps.sh
log "cargo build --bins"
cargo build --bins --quiet

# sdk_venv SDK VERSION: .venv/conformance-SDK-VERSION with that release of the SDK and pytest, created or updated.
sdk_venv() {
  local sdk=$1 v=$2 venv=.venv/conformance-$1-$2
  if ! "$venv/bin/python" -c "import sys, $sdk, pytest
sys.exit($sdk.__version__ != '$v' or pytest.__version__ != '$PYTEST_VERSION')" 2>/dev/null; then
    log "preparing $venv ($sdk==$v, pytest==$PYTEST_VERSION)"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "$sdk==$v" "pytest==$PYTEST_VERSION"
  fi
}
for v in "${OPENAI_VERSIONS[@]}"; do sdk_venv openai "$v"; done
for v in "${ANTHROPIC_VERSIONS[@]}"; do sdk_venv anthropic "$v"; done
command -v npm >/dev/null 2>&1 || apt_install nodejs npm
CODEX_DIR=.venv/conformance-codex-$CODEX_VERSION
if [ ! -x "$CODEX_DIR/node_modules/.bin/codex" ]; then
  log "preparing $CODEX_DIR (@openai/codex@$CODEX_VERSION)"
  npm install --prefix "$CODEX_DIR" --no-audit --no-fund --loglevel=error "@openai/codex@$CODEX_VERSION"
fi

# --- processes ----------------------------------------------------------------------------------------------------
mkdir -p "$LOGS"
TMP=$(mktemp -d)
PIDS=()
cleanup() {
  local rc=$? pid i
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Ten distinct free loopback ports (below the ephemeral range, scripts/free-ports.py): six engines, the proxy and the
# metrics listener, and the same two of the router over TLS.
FREE=$(scripts/free-ports.py 10)
read -r E1 E2 E3 E4 E5 E6 PROXY METRICS PROXY_TLS METRICS_TLS <<<"$FREE"

# Fast simulated time: a 1 MiB prompt prefills in ~0.1 s. Responses kept as vLLM keeps them with
# VLLM_ENABLE_RESPONSES_API_STORE=1 (the SDK's stored-response calls need it).
SIM=(target/debug/engine-sim --time-scale 0.05 --responses-store)
"${SIM[@]}" --model m1 --ports "$E1,$E2" >"$LOGS/engine-sim-m1.log" 2>&1 &
PIDS+=($!)
"${SIM[@]}" --model m2 --ports "$E3,$E4" >"$LOGS/engine-sim-m2.log" 2>&1 &
PIDS+=($!)
# Pool pd, disaggregated: a prefill engine and a decode engine speaking NixlConnector's kv_transfer_params (one
# process: a decode engine takes only params a prefill engine of its process issued).
"${SIM[@]}" --model pd --kv-transfer --ports "$E5,$E6" >"$LOGS/engine-sim-pd.log" 2>&1 &
PIDS+=($!)

# The router requires a key (`auth`), as a production one would; the suites send it as each SDK does.
CLIENT_KEY=conformance-$(python3 -c 'import secrets; print(secrets.token_hex(12))')
export INFERGATE_CONFORMANCE_KEYS="conformance:$CLIENT_KEY"

cat >"$TMP/infergate.yaml" <<EOF
listen: "127.0.0.1:$PROXY"
metrics_listen: "127.0.0.1:$METRICS"
server:
  threads: 2
  grace_period_seconds: 0
  graceful_shutdown_timeout_seconds: 1
  pid_file: $TMP/infergate.pid
  upgrade_sock: $TMP/infergate_upgrade.sock
timeouts: { connect: 2s, response_header: 30s, stream_idle: 30s }
max_retries: 2
auth: { keys_env: INFERGATE_CONFORMANCE_KEYS }
# Sessions by the default headers: x-session-id (the openai suite) or Claude Code's own (the anthropic suite), or,
# without one, by the body's prompt_cache_key (the openai SDK's own parameter).
pools:
  - name: m1
    models: [m1]
    policy: load_aware
    endpoints: ["http://127.0.0.1:$E1", "http://127.0.0.1:$E2"]
    health_check: { path: /health, interval: 200ms, timeout: 500ms, healthy_after: 1, unhealthy_after: 1 }
    sessions: { prompt_cache_key: true }
  - name: m2
    models: [m2]
    # The shipped configurations' policy; m1 keeps the default (load_aware), so the SDK drives both.
    policy: predicted_ttft
    endpoints: ["http://127.0.0.1:$E3", "http://127.0.0.1:$E4"]
    # m2 refuses while it has no healthy endpoint (the suites' SDK retry of the router's 503); m1 keeps the
    # default health panic, placing across its engines when every one fails its check.
    health_check: { path: /health, interval: 200ms, timeout: 500ms, healthy_after: 1, unhealthy_after: 1, route_when_all_unhealthy: false }
    sessions: { prompt_cache_key: true }
  - name: pd
    models: [pd]
    endpoints: ["http://127.0.0.1:$E6"]
    health_check: { path: /health, interval: 200ms, timeout: 500ms, healthy_after: 1, unhealthy_after: 1 }
    disaggregation:
      connector: nixl
      prefill:
        policy: predicted_ttft
        endpoints: ["http://127.0.0.1:$E5"]
        health_check: { path: /health, interval: 200ms, timeout: 500ms, healthy_after: 1, unhealthy_after: 1 }
EOF
cp "$TMP/infergate.yaml" "$LOGS/infergate.yaml"

# wait_until DESCRIPTION COMMAND...: polls every 0.1 s for at most STARTUP_TIMEOUT seconds; every process started
# so far must stay alive meanwhile.
wait_until() {
  local what=$1 i pid
  shift
  for i in $(seq $((STARTUP_TIMEOUT * 10))); do
    "$@" && return 0
    for pid in "${PIDS[@]}"; do
      kill -0 "$pid" 2>/dev/null || { echo "conformance: a process died while waiting for $what (see $LOGS)" >&2; exit 1; }
    done
    sleep 0.1
  done
  echo "conformance: timed out after ${STARTUP_TIMEOUT}s waiting for $what (see $LOGS)" >&2
  exit 1
}
engines_up() {
  local p
  for p in "$E1" "$E2" "$E3" "$E4" "$E5" "$E6"; do curl -sf -o /dev/null "http://127.0.0.1:$p/health" || return 1; done
}
all_endpoints_healthy() {
  [ "$(curl -sf "http://127.0.0.1:$METRICS/metrics" | grep -c '^infergate_endpoint_healthy{.*} 1$')" = 6 ]
}

wait_until "the engines" engines_up
RUST_LOG=info,infergate::pool::learn=debug target/debug/infergate -c "$TMP/infergate.yaml" >"$LOGS/infergate.log" 2>&1 &
PIDS+=($!)
wait_until "the router's health" curl -sf -o /dev/null "http://127.0.0.1:$PROXY/health"
wait_until "all six endpoints healthy" all_endpoints_healthy
log "router on 127.0.0.1:$PROXY (metrics :$METRICS), pool m1: engines :$E1 :$E2, pool m2: engines :$E3 :$E4, pool pd: prefill :$E5, decode :$E6"

# The same router over TLS (`tls`) on the same engines, with a certificate for localhost and 127.0.0.1 from a CA
# made here; the openai suite's TLS tests trust that CA.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=conformance CA" \
  -keyout "$TMP/ca.key" -out "$TMP/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
  -keyout "$TMP/tls.key" -out "$TMP/tls.csr" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >"$TMP/tls.ext"
openssl x509 -req -in "$TMP/tls.csr" -CA "$TMP/ca.pem" -CAkey "$TMP/ca.key" -CAcreateserial -days 2 \
  -extfile "$TMP/tls.ext" -out "$TMP/tls.pem" 2>/dev/null
sed -e "s/127.0.0.1:$PROXY\"/127.0.0.1:$PROXY_TLS\"/" -e "s/127.0.0.1:$METRICS\"/127.0.0.1:$METRICS_TLS\"/" \
  -e "s#$TMP/infergate.pid#$TMP/infergate-tls.pid#" -e "s#$TMP/infergate_upgrade.sock#$TMP/infergate-tls_upgrade.sock#" \
  "$TMP/infergate.yaml" >"$TMP/infergate-tls.yaml"
printf 'tls: { cert_file: "%s", key_file: "%s" }\n' "$TMP/tls.pem" "$TMP/tls.key" >>"$TMP/infergate-tls.yaml"
cp "$TMP/infergate-tls.yaml" "$LOGS/infergate-tls.yaml"
RUST_LOG=info target/debug/infergate -c "$TMP/infergate-tls.yaml" >"$LOGS/infergate-tls.log" 2>&1 &
PIDS+=($!)
wait_until "the TLS router's health" curl -sf --cacert "$TMP/ca.pem" -o /dev/null "https://localhost:$PROXY_TLS/health"
log "router over TLS on localhost:$PROXY_TLS (metrics :$METRICS_TLS)"

# --- the suite, once per SDK version ------------------------------------------------------------------------------
export INFERGATE_URL=http://127.0.0.1:$PROXY
export INFERGATE_METRICS_URL=http://127.0.0.1:$METRICS/metrics
export INFERGATE_CLIENT_KEY=$CLIENT_KEY
export INFERGATE_TLS_URL=https://localhost:$PROXY_TLS
export INFERGATE_TLS_CA=$TMP/ca.pem
export ENGINES_M1=http://127.0.0.1:$E1,http://127.0.0.1:$E2
export ENGINES_M2=http://127.0.0.1:$E3,http://127.0.0.1:$E4
export ENGINES_PD_PREFILL=http://127.0.0.1:$E5 ENGINES_PD_DECODE=http://127.0.0.1:$E6
export PYTHONDONTWRITEBYTECODE=1
failed=0
# suite SDK VERSION: the SDK's test file under that release.
suite() {
  log "pytest with $1==$2"
  timeout "$SUITE_TIMEOUT" ".venv/conformance-$1-$2/bin/python" -m pytest "scripts/conformance/test_$1_sdk.py" \
    -p no:cacheprovider -v --tb=short -rfEP || failed=1
}
for v in "${OPENAI_VERSIONS[@]}"; do suite openai "$v"; done
for v in "${ANTHROPIC_VERSIONS[@]}"; do suite anthropic "$v"; done
log "pytest with @openai/codex@$CODEX_VERSION"
CODEX_BIN=$ROOT/$CODEX_DIR/node_modules/.bin/codex timeout "$SUITE_TIMEOUT" \
  ".venv/conformance-openai-${OPENAI_VERSIONS[-1]}/bin/python" -m pytest scripts/conformance/test_codex_cli.py \
  -p no:cacheprovider -v --tb=short -rfEP || failed=1
exit "$failed"
