#!/usr/bin/env bash
# Router instructions per request, counted by callgrind (repeatable whatever else the machine does): one
# engine-sim engine answering at once, the router under valgrind with one worker thread, N tiny non-streaming
# chat requests on one keep-alive connection. Prints instructions per request, the request phase only:
# valgrind starts with instrumentation off (--instr-atstart=no), so start-up (config, TLS root certificates for
# every Connector, the first health checks) is not counted; WARMUP (200) requests go through uncounted, then
# `callgrind_control -i on PID` switches counting on, the N requests run, `callgrind_control -i off PID` switches
# it off before the shutdown. What the other threads do meanwhile (health checks every 10 s, engine_stats scrapes
# every 200 ms with ENGINE_STATS=1) is counted and shown apart from the serving thread's: it is part of serving in
# that configuration, at valgrind's pace. FLOOR=1 is measured the same way.
# usage: scripts/bench/callgrind.sh [ROUTER_BIN] [N]   (needs valgrind; loopback only)
# Environment: POLICY (load_aware), SESSIONS (0; 1: `sessions` with the x-session-id header, the requests spread
# over 100 sessions), ENGINE_STATS (0; 1: engine_stats every 200ms), FLOOR (0; 1: measure target/release/examples/floor, the
# bare Pingora pass-through, instead of ROUTER_BIN), WARMUP (200: uncounted requests first), CG_OUT (keep the
# serving thread's callgrind output file there; read it with callgrind_annotate --inclusive=yes, or --tree=caller).
# Issue 26's overhead target, the recommended configuration against the floor:
#   FLOOR=1 scripts/bench/callgrind.sh; POLICY=predicted_ttft SESSIONS=1 ENGINE_STATS=1 scripts/bench/callgrind.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-target/release/infergate}; N=${2:-3000}
POLICY=${POLICY:-load_aware}; SESSIONS=${SESSIONS:-0}; ENGINE_STATS=${ENGINE_STATS:-0}; FLOOR=${FLOOR:-0}
WARMUP=${WARMUP:-200}
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
  RUST_LOG=error valgrind --tool=callgrind --separate-threads=yes --instr-atstart=no --callgrind-out-file="$TMP/cg.out" "$BIN" "127.0.0.1:$PR" "127.0.0.1:$PE" 1 \
    >"$TMP/cg.log" 2>&1 &
else
  RUST_LOG=error valgrind --tool=callgrind --separate-threads=yes --instr-atstart=no --callgrind-out-file="$TMP/cg.out" "$BIN" -c "$TMP/r.yaml" >"$TMP/cg.log" 2>&1 &
fi
CG=$!
trap 'kill $SIM 2>/dev/null; kill -INT $CG 2>/dev/null; rm -rf "$TMP"' EXIT
# The client sends WARMUP requests, then waits for a line on stdin (counting is on), sends N, prints "done".
coproc CLIENT { python3 - "$PR" "$N" "$SESSIONS" "$WARMUP" <<'PY'
import http.client, socket, sys, time
port, n, sessions, warmup = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
end = time.time() + 120
while True:
    try:
        socket.create_connection(("127.0.0.1", port), 0.5).close(); break
    except OSError:
        if time.time() > end: sys.exit("router did not start")
        time.sleep(0.2)
time.sleep(2)
b = b'{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":1}'
c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
def send(count):
    ok = 0
    for i in range(count):
        h = {"content-type": "application/json"}
        if sessions:
            h["x-session-id"] = "s%d" % (i % 100)
        c.request("POST", "/v1/chat/completions", body=b, headers=h)
        r = c.getresponse(); r.read(); ok += r.status == 200
    return ok
ok = send(warmup)
print(f"warm-up: {ok} of {warmup} requests answered 200", file=sys.stderr)
print("warm", flush=True)
sys.stdin.readline()
ok = send(n)
print(f"{ok} of {n} requests answered 200", file=sys.stderr)
print("done", flush=True)
PY
}
CPID=$CLIENT_PID
read -r _ <&"${CLIENT[0]}"
callgrind_control -i on $CG >/dev/null 2>&1
echo go >&"${CLIENT[1]}"
read -r _ <&"${CLIENT[0]}"
callgrind_control -i off $CG >/dev/null 2>&1
wait $CPID || true
kill -INT $CG; wait $CG 2>/dev/null || true
# One profile per thread: the one that counted the most is the worker serving the requests; the others are the
# time-driven threads (Pingora's timer, health checks, engine-stats scrapes, the janitor), whose work per request
# is about thirty times what it is natively because a request takes that much longer under valgrind.
# memcpy is shown apart: one 13 KB copy of Pingora's proxy future per request that valgrind counts byte by byte
# (BENCHMARKS.md, "What the instruction ratio leaves out").
SERVING="" MOST=0 OTHERS=0 MEMCPY=0
for f in "$TMP"/cg.out-*; do
  read -r n m < <(callgrind_annotate "$f" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); t=$1}
    /__memcpy_avx_unaligned_erms/ && /libc/ {gsub(",","",$1); m+=$1} END {print t+0, m+0}')
  if [ "$n" -gt "$MOST" ]; then
    [ -n "$SERVING" ] && OTHERS=$((OTHERS + MOST))
    SERVING=$f MOST=$n MEMCPY=$m
  else
    OTHERS=$((OTHERS + n))
  fi
done
[ -n "$SERVING" ] || { echo "callgrind.sh: no profile written (see $TMP/cg.log)" >&2; cat "$TMP/cg.log" >&2; exit 1; }
# CG_OUT keeps the serving thread's profile (read it with callgrind_annotate --inclusive=yes, or --tree=caller).
[ -n "${CG_OUT:-}" ] && cp "$SERVING" "$CG_OUT"
TOTAL=$((MOST + OTHERS))
echo "$BIN ($([ "$FLOOR" = 1 ] && echo floor || echo "$POLICY sessions=$SESSIONS engine_stats=$ENGINE_STATS")): $TOTAL instructions in all, $((TOTAL / N)) per request: the serving thread $((MOST / N)) (without memcpy $(((MOST - MEMCPY) / N))), other threads $((OTHERS / N))"
