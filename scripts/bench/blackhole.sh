#!/usr/bin/env bash
# The blackhole figure for BENCHMARKS.md: 3 engine-sim engines, one answering 503 at once (its /health still
# 200), wrk with 16 connections for 8 s through the router; prints what the client saw and what each engine got.
# usage: scripts/bench/blackhole.sh [ROUTER_BIN]   (needs wrk: apt-get install wrk; loopback only, bounded)
set -u
cd "$(dirname "$0")/../.."
BIN=${1:-target/release/infergate}
command -v wrk >/dev/null || { echo "blackhole.sh: needs wrk (apt-get install wrk)" >&2; exit 2; }
TMP=$(mktemp -d)
read -r P1 P2 P3 L M < <(python3 -c 'import socket
ss=[socket.socket() for _ in range(5)]
[s.bind(("127.0.0.1",0)) for s in ss]
print(*[s.getsockname()[1] for s in ss])')
target/release/engine-sim --ports $P1,$P2,$P3 --time-scale 0 --max-recorded-requests 1 >/dev/null 2>&1 &
SIM=$!
sleep 1
cat > $TMP/bh.yaml <<Y
listen: "127.0.0.1:$L"
metrics_listen: "127.0.0.1:$M"
server: { threads: 2, grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 1, pid_file: $TMP/bh.pid, upgrade_sock: $TMP/bh.sock }
pools:
  - name: default
    models: ["*"]
    policy: load_aware
    endpoints: ["http://127.0.0.1:$P1", "http://127.0.0.1:$P2", "http://127.0.0.1:$P3"]
    health_check: { path: /health, interval: 1s, timeout: 1s }
Y
RUST_LOG=error $BIN -c $TMP/bh.yaml >/dev/null 2>&1 &
R=$!
sleep 2
curl -s -XPOST localhost:$P1/sim/control -d '{"fail_status":503}' >/dev/null
cat > $TMP/bh.lua <<'L'
wrk.method = "POST"
wrk.body = '{"messages":[{"role":"user","content":"hi"}],"model":"sim-model","max_tokens":1}'
wrk.headers["Content-Type"] = "application/json"
L
wrk -t2 -c16 -d8s -s $TMP/bh.lua http://127.0.0.1:$L/v1/chat/completions 2>&1 | grep -E "requests in|Non-2xx|Requests/sec"
for p in $P1 $P2 $P3; do printf "engine %s: " $p; curl -s localhost:$p/sim/stats | python3 -c "import json,sys; d=json.load(sys.stdin); d=d[0] if isinstance(d,list) else d; print({k:d.get(k) for k in ('received','requests','rejected','refused_injected')})"; done
kill $R $SIM; wait 2>/dev/null; rm -rf "$TMP"
