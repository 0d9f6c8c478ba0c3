#!/usr/bin/env bash
# Router instructions per request, counted by callgrind (repeatable whatever else the machine does): one
# engine-sim engine answering at once, the router under valgrind with one worker thread, N tiny non-streaming
# chat requests on one keep-alive connection. Prints instructions per request (start-up and health checks are
# included; they are amortised over N).
# usage: scripts/bench/callgrind.sh [ROUTER_BIN] [N]   (needs valgrind; loopback only)
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-target/release/infergate}; N=${2:-3000}
command -v valgrind >/dev/null || { echo "callgrind.sh: needs valgrind (apt-get install valgrind)" >&2; exit 2; }
TMP=$(mktemp -d)
read -r PE PR < <(python3 -c 'import socket
ss=[socket.socket() for _ in range(2)]
[s.bind(("127.0.0.1",0)) for s in ss]
print(*[s.getsockname()[1] for s in ss])')
target/release/engine-sim --port "$PE" --time-scale 0 --max-recorded-requests 1 >/dev/null 2>&1 &
SIM=$!
trap 'kill $SIM 2>/dev/null; rm -rf "$TMP"' EXIT
cat >"$TMP/r.yaml" <<Y
listen: "127.0.0.1:$PR"
server: { threads: 1, grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 1, pid_file: $TMP/r.pid, upgrade_sock: $TMP/r.sock }
pools:
  - name: default
    models: ["*"]
    policy: load_aware
    endpoints: ["http://127.0.0.1:$PE"]
    health_check: { path: /health, interval: 10s, timeout: 2s }
Y
RUST_LOG=error valgrind --tool=callgrind --callgrind-out-file="$TMP/cg.out" "$BIN" -c "$TMP/r.yaml" >"$TMP/cg.log" 2>&1 &
CG=$!
python3 - "$PR" "$N" <<'PY'
import http.client, socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
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
for _ in range(n):
    c.request("POST", "/v1/chat/completions", body=b, headers={"content-type": "application/json"})
    r = c.getresponse(); r.read(); ok += r.status == 200
print(f"{ok} of {n} requests answered 200", file=sys.stderr)
PY
kill -INT $CG; wait $CG 2>/dev/null || true
[ -n "${CG_OUT:-}" ] && cp "$TMP/cg.out" "$CG_OUT"
TOTAL=$(callgrind_annotate "$TMP/cg.out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}')
echo "$BIN: $TOTAL instructions in all, $((TOTAL / N)) per request"
