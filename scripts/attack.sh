#!/usr/bin/env bash
# Slow and idle clients against a release build of infergate in front of engine-sim, on loopback only:
# a 1,000-connection slowloris (a header byte per second), 20,000 half-sent request headers, 1,000 stalled bodies
# and 1,000 idle keep-alive connections, while normal requests, /health and /metrics are probed every second and
# the router's resident set and descriptors are read from /proc (scripts/attack/slow_clients.py).
#
# Usage: scripts/attack.sh [--out DIR]
# Knobs (environment): SLOWLORIS (1000), HALF_SENT (20000), HALF_SENT_ROUNDS (2), STALLED (1000), IDLE (1000),
#   ROUTER_NOFILE (20000: the router's open-files limit), EXTRA_YAML (appended to the router's config).
# The router runs with the default timeouts (request_header 10s, request_body 60s, client_idle 60s) and the
# default max_client_connections (10000, lowered to what ROUTER_NOFILE holds). Takes about 2 minutes.
# Every process it starts gets its own process group and is stopped on exit; only 127.0.0.1 is used.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "attack.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
OUT=${OUT:-/tmp/infergate-attack-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
SLOWLORIS=${SLOWLORIS:-1000}
HALF_SENT=${HALF_SENT:-20000}
HALF_SENT_ROUNDS=${HALF_SENT_ROUNDS:-2}
STALLED=${STALLED:-1000}
IDLE=${IDLE:-1000}
ROUTER_NOFILE=${ROUTER_NOFILE:-20000}
BIN="$ROOT/target/release"
log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]+"${PIDS[@]}"}"; do
    kill -TERM -- "-$p" 2>/dev/null || true
  done
  sleep 0.5
  for p in "${PIDS[@]+"${PIDS[@]}"}"; do
    kill -KILL -- "-$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'; }
wait_http() { # URL SECONDS
  local i
  for i in $(seq 1 $(( $2 * 10 ))); do
    curl -sf -o /dev/null --max-time 1 "$1" && return 0
    sleep 0.1
  done
  echo "attack.sh: $1 did not answer within $2 s" >&2
  return 1
}

log "building infergate and engine-sim (release)"
cargo build --release -p infergate -p infergate-sim 2>&1 | tail -n 1 >&2

E1=$(free_port); E2=$(free_port); P=$(free_port); M=$(free_port)
setsid "$BIN/engine-sim" --ports "$E1,$E2" --max-recorded-requests 1 >"$OUT/engine-sim.log" 2>&1 </dev/null &
PIDS+=($!)
cat >"$OUT/router.yaml" <<EOF
listen: "127.0.0.1:$P"
metrics_listen: "127.0.0.1:$M"
server: { threads: 2, grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 1,
          pid_file: $OUT/infergate.pid, upgrade_sock: $OUT/upgrade.sock }
pools:
  - name: default
    endpoints: ["http://127.0.0.1:$E1", "http://127.0.0.1:$E2"]
${EXTRA_YAML:-}
EOF
"$BIN/infergate" -t -c "$OUT/router.yaml" >&2
# The router gets ROUTER_NOFILE open files (the limit of the earlier measurement); the attacking client more.
(ulimit -n "$ROUTER_NOFILE" && exec setsid env RUST_LOG=info "$BIN/infergate" -c "$OUT/router.yaml") \
  >"$OUT/router.log" 2>&1 </dev/null &
ROUTER=$!
PIDS+=("$ROUTER")
wait_http "http://127.0.0.1:$E1/health" 10
wait_http "http://127.0.0.1:$P/health" 20
wait_http "http://127.0.0.1:$M/metrics" 10
log "router pid $ROUTER on :$P (metrics :$M), engines :$E1 :$E2; open-files limit $(awk '/Max open files/{print $4}' /proc/$ROUTER/limits)"
grep -h "client connections\|max_client_connections" "$OUT/router.log" >&2 || true

# The attack runs in worker processes of at most 8,000 connections each (each needs its own open files).
(
  if [ "$(ulimit -Hn)" = unlimited ]; then ulimit -n 65536; else ulimit -n "$(ulimit -Hn)"; fi
  exec timeout 400 python3 scripts/attack/slow_clients.py --port "$P" --mport "$M" --pid "$ROUTER" \
    --slowloris "$SLOWLORIS" --half-sent "$HALF_SENT" --half-sent-rounds "$HALF_SENT_ROUNDS" \
    --stalled "$STALLED" --idle "$IDLE"
) >"$OUT/report.json"
kill -0 "$ROUTER" 2>/dev/null || { echo "attack.sh: the router exited" >&2; exit 1; }
log "errors and warnings in the router log:"
grep -c " ERROR " "$OUT/router.log" | sed 's/^/  ERROR lines: /' >&2 || true
grep " WARN " "$OUT/router.log" | sed 's/.*WARN *//' | cut -c1-160 | sort | uniq -c | sort -rn | head -n 8 >&2 || true
python3 - "$OUT/report.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
r.pop("probe_rows")
print(json.dumps(r, indent=1))
EOF
log "report: $OUT/report.json (per-second probes under probe_rows), logs in $OUT"
