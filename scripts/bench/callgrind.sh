#!/usr/bin/env bash
# Router instructions per request, counted by callgrind (repeatable whatever else the machine does): one
# engine-sim engine answering at once, the router under valgrind with one worker thread, N tiny non-streaming
# chat requests on one keep-alive connection. Prints instructions per request (start-up and health checks are
# included; they are amortised over N).
# usage: scripts/bench/callgrind.sh [ROUTER_BIN] [N]   (needs valgrind; loopback only)
# Environment: POLICY (load_aware), SESSIONS (0; 1: `sessions` with the x-session-id header, the requests spread
# over 100 sessions), ENGINE_STATS (0; 1: engine_stats every 200ms), FLOOR (0; 1: measure target/release/examples/floor, the
# bare Pingora pass-through, instead of ROUTER_BIN), CG_OUT (keep the callgrind output file there).
# Issue 26's overhead target, the recommended configuration against the floor:
#   FLOOR=1 scripts/bench/callgrind.sh; POLICY=predicted_ttft SESSIONS=1 ENGINE_STATS=1 scripts/bench/callgrind.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-target/release/infergate}; N=${2:-3000}
POLICY=${POLICY:-load_aware}; SESSIONS=${SESSIONS:-0}; ENGINE_STATS=${ENGINE_STATS:-0}; FLOOR=${FLOOR:-0}
command -v valgrind >/dev/null || { echo "callgrind.sh: needs valgrind (apt-get install valgrind)" >&2; exit 2; }
TMP=$(mktemp -d)
read -r PE PR < <(python3 -c 'import socket
ss=[socket.socket() for _ in range(2)]
[s.bind(("127.0.0.1",0)) for s in ss]
print(*[s.getsockname()[1] for s in ss])')
target/release/engine-sim --port "$PE" --time-scale 0 --max-recorded-requests 1 >/dev/null 2>&1 &
SIM=$!
trap 'kill $SIM 2>/dev/null; rm -rf "$TMP"' EXIT
{
  echo "listen: \"127.0.0.1:$PR\""
  echo "server: { threads: 1, grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 1, pid_file: $TMP/r.pid, upgrade_sock: $TMP/r.sock }"
  echo "pools:"
  echo "  - name: default"
  echo "    models: [\"*\"]"
  echo "    policy: $POLICY"
  echo "    endpoints: [\"http://127.0.0.1:$PE\"]"
  echo "    health_check: { path: /health, interval: 10s, timeout: 2s }"
  [ "$SESSIONS" = 1 ] && echo "    sessions: { header: x-session-id }"
  [ "$ENGINE_STATS" = 1 ] && echo "    engine_stats: { path: /metrics, interval: 200ms }"
  true
} >"$TMP/r.yaml"
if [ "$FLOOR" = 1 ]; then
  BIN=target/release/examples/floor
  RUST_LOG=error valgrind --tool=callgrind --callgrind-out-file="$TMP/cg.out" "$BIN" "127.0.0.1:$PR" "127.0.0.1:$PE" 1 \
    >"$TMP/cg.log" 2>&1 &
else
  RUST_LOG=error valgrind --tool=callgrind --callgrind-out-file="$TMP/cg.out" "$BIN" -c "$TMP/r.yaml" >"$TMP/cg.log" 2>&1 &
fi
CG=$!
python3 - "$PR" "$N" "$SESSIONS" <<'PY'
import http.client, socket, sys, time
port, n, sessions = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
end = time.time() + 60
while True:
    try:
        socket.create_connection(("127.0.0.1", port), 0.5).close(); break
    except OSError:
        if time.time() > end: sys.exit("router did not start")
        time.sleep(0.2)
time.sleep(2)
b = b'{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":1}'
c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
ok = 0
for i in range(n):
    h = {"content-type": "application/json"}
    if sessions:
        h["x-session-id"] = "s%d" % (i % 100)
    c.request("POST", "/v1/chat/completions", body=b, headers=h)
    r = c.getresponse(); r.read(); ok += r.status == 200
print(f"{ok} of {n} requests answered 200", file=sys.stderr)
PY
kill -INT $CG; wait $CG 2>/dev/null || true
[ -n "${CG_OUT:-}" ] && cp "$TMP/cg.out" "$CG_OUT"
TOTAL=$(callgrind_annotate "$TMP/cg.out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}')
echo "$BIN ($([ "$FLOOR" = 1 ] && echo floor || echo "$POLICY sessions=$SESSIONS engine_stats=$ENGINE_STATS")): $TOTAL instructions in all, $((TOTAL / N)) per request"
