#!/usr/bin/env bash
# Coding agents nobody on the project wrote, through the router in front of engine-sim: Claude Code (Anthropic
# Messages API), Codex CLI (Responses API) and opencode (chat completions), each from npm at a pinned version,
# installed on demand under .venv/agents/. Each agent answers one prompt, then continues its conversation; the
# script prints the requests the router placed for it (from the access log) and fails unless all of them were
# answered and placed as one session on one engine (one `new_session`, the rest `sticky`).
#
# Not part of the test command: Claude Code is proprietary (installing it means accepting Anthropic's terms), and
# each agent is a ~400 MB download. Codex CLI also runs in scripts/conformance.sh. Needs node and npm (installed
# with apt when missing). Only 127.0.0.1 and free ports are used; everything started is stopped on exit.
#
# Usage: scripts/try-agents.sh [claude-code] [codex] [opencode]      (default: all three)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

CLAUDE_CODE_VERSION=2.1.332
CODEX_VERSION=0.171.0
OPENCODE_VERSION=1.18.33
MODEL=agent-model
AGENT_TIMEOUT=120   # seconds for one agent invocation

log() { echo "== try-agents: $*"; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

agents=("$@")
[ ${#agents[@]} -gt 0 ] || agents=(claude-code codex opencode)
for a in "${agents[@]}"; do
  case "$a" in claude-code|codex|opencode) ;; *) echo "usage: $0 [claude-code] [codex] [opencode]" >&2; exit 2 ;; esac
done

apt_install() {
  log "installing $* (apt-get)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
command -v npm >/dev/null 2>&1 || apt_install nodejs npm
command -v curl >/dev/null 2>&1 || apt_install curl
scripts/ensure-deps.sh
cargo build --bins --quiet

# npm_bin PACKAGE VERSION BIN: the path of BIN from PACKAGE@VERSION, installed under .venv/agents/ if missing.
npm_bin() {
  local dir=.venv/agents/${1//\//_}-$2
  if [ ! -x "$dir/node_modules/.bin/$3" ]; then
    log "installing $1@$2 into $dir" >&2
    npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "$1@$2" >&2
  fi
  echo "$ROOT/$dir/node_modules/.bin/$3"
}

TMP=$(mktemp -d)
PIDS=()
cleanup() {
  local rc=$? pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

read -r E1 E2 PROXY METRICS < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
for s in socks:
    s.close()')
KEY=try-agents-$(python3 -c 'import secrets; print(secrets.token_hex(12))')
export INFERGATE_TRY_AGENTS_KEYS="agents:$KEY"

# Answers end on their own after 24 tokens, as a model's would; agents ask for up to 32,000.
target/debug/engine-sim --time-scale 0.05 --stop-after 24 --model "$MODEL" --ports "$E1,$E2" >"$TMP/engine-sim.log" 2>&1 &
PIDS+=($!)
cat >"$TMP/infergate.yaml" <<EOF
listen: "127.0.0.1:$PROXY"
metrics_listen: "127.0.0.1:$METRICS"
server: { threads: 2, grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 1, pid_file: $TMP/ig.pid, upgrade_sock: $TMP/ig.sock }
auth: { keys_env: INFERGATE_TRY_AGENTS_KEYS }
access_log: { format: json, path: $TMP/access.log }
pools:
  - name: agents
    models: ["*"]
    policy: predicted_ttft
    endpoints: ["http://127.0.0.1:$E1", "http://127.0.0.1:$E2"]
    health_check: { path: /health, interval: 200ms, timeout: 500ms, healthy_after: 1, unhealthy_after: 1 }
    sessions: {}
EOF
for i in $(seq 100); do
  curl -sf -o /dev/null "http://127.0.0.1:$E1/health" && curl -sf -o /dev/null "http://127.0.0.1:$E2/health" && break
  sleep 0.1
done
RUST_LOG=info target/debug/infergate -c "$TMP/infergate.yaml" >"$TMP/infergate.log" 2>&1 &
PIDS+=($!)
for i in $(seq 100); do
  [ "$(curl -sf "http://127.0.0.1:$METRICS/metrics" | grep -c '^infergate_endpoint_healthy{.*} 1$')" = 2 ] && break
  sleep 0.1
done
log "router on 127.0.0.1:$PROXY in front of engines :$E1 :$E2 (model $MODEL)"

# run_agent NAME COMMAND...: runs one agent invocation in its own home under $TMP.
run_agent() {
  local name=$1
  shift
  (cd "$TMP/$name" && HOME=$TMP/$name timeout "$AGENT_TIMEOUT" "$@") >>"$TMP/$name.out" 2>>"$TMP/$name.err" || {
    echo "try-agents: $name exited $? (stderr: $TMP/$name.err)" >&2
    tail -20 "$TMP/$name.err" >&2
    return 1
  }
}

failed=0
for agent in "${agents[@]}"; do
  mkdir -p "$TMP/$agent"
  case "$agent" in
    claude-code)
      bin=$(npm_bin @anthropic-ai/claude-code "$CLAUDE_CODE_VERSION" claude)
      export ANTHROPIC_BASE_URL=http://127.0.0.1:$PROXY ANTHROPIC_AUTH_TOKEN=$KEY ANTHROPIC_MODEL=$MODEL \
        ANTHROPIC_SMALL_FAST_MODEL=$MODEL ANTHROPIC_DEFAULT_HAIKU_MODEL=$MODEL \
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_TELEMETRY=1 DISABLE_AUTOUPDATER=1
      run_agent "$agent" "$bin" -p "say hi" || failed=1
      run_agent "$agent" "$bin" -p "and again" --continue || failed=1
      ua=claude-cli
      ;;
    codex)
      bin=$(npm_bin @openai/codex "$CODEX_VERSION" codex)
      cat >"$TMP/$agent/config.toml" <<EOF
model = "$MODEL"
model_provider = "infergate"
[model_providers.infergate]
name = "infergate"
base_url = "http://127.0.0.1:$PROXY/v1"
env_key = "INFERGATE_KEY"
wire_api = "responses"
EOF
      export CODEX_HOME=$TMP/$agent INFERGATE_KEY=$KEY
      run_agent "$agent" "$bin" exec --skip-git-repo-check "say hi" || failed=1
      run_agent "$agent" "$bin" exec --skip-git-repo-check resume --last "and again" || failed=1
      ua=codex_exec
      ;;
    opencode)
      bin=$(npm_bin opencode-ai "$OPENCODE_VERSION" opencode)
      cat >"$TMP/$agent/opencode.json" <<EOF
{"provider": {"infergate": {"npm": "@ai-sdk/openai-compatible", "name": "infergate",
  "options": {"baseURL": "http://127.0.0.1:$PROXY/v1", "apiKey": "$KEY"},
  "models": {"$MODEL": {"name": "$MODEL"}}}}}
EOF
      export OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_SHARE=1
      run_agent "$agent" "$bin" run -m "infergate/$MODEL" "say hi" || failed=1
      run_agent "$agent" "$bin" run -m "infergate/$MODEL" --continue "and again" || failed=1
      ua=opencode
      ;;
  esac
  sleep 0.5   # the access log writer flushes when its queue runs empty
  python3 - "$TMP/access.log" "$agent" "$ua" <<'EOF' || failed=1
import json, sys
path, agent, ua = sys.argv[1:]
lines = [json.loads(l) for l in open(path)]
mine = [l for l in lines if (l.get("user_agent") or "").startswith(ua) and l["method"] == "POST"]
print(f"{agent}: {len(mine)} requests")
for l in mine:
    print(f"  {l['path']:<22} status {l['status']}  {l['reason'] or '-':<12} endpoint {l['endpoint']}  "
          f"tokens {l['tokens']}  session {l['session']}  ttfb {l['ttfb_ms']} ms")
generate = [l for l in mine if l["reason"] not in (None, "least_request")]
problems = []
if len(generate) < 2:
    problems.append("fewer than two generation requests reached the router")
if any(l["status"] != 200 for l in mine):
    problems.append("a request was not answered 200")
if len({l["session"] for l in generate}) != 1 or len({l["endpoint"] for l in generate}) != 1:
    problems.append("the requests were not one session on one engine")
if [l["reason"] for l in generate].count("new_session") != 1 or any(
        l["reason"] not in ("new_session", "sticky") for l in generate):
    problems.append("expected one new_session and the rest sticky")
for p in problems:
    print(f"  FAILED: {p}")
sys.exit(1 if problems else 0)
EOF
done
[ "$failed" = 0 ] && log "every agent's conversation stayed one session on one engine" || log "FAILED (logs in $TMP are removed on exit; rerun one agent to look)"
exit "$failed"
