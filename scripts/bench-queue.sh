#!/usr/bin/env bash
# The router-side wait queue under overload: TTFT of the requests that are served, with and without a pool `queue`,
# on simulated engines whose capacity is set by max_num_seqs = max_in_flight_per_endpoint, offered about twice what
# they can serve. Arrivals are open-loop (Poisson, single-turn chats), so a refused request does not slow the
# arrivals down. Prints a Markdown table; raw loadgen JSON, configs and logs go to bench-out/queue-STAMP/.
#
# Usage: scripts/bench-queue.sh                     (about 6 minutes on 2 cores; every step is bounded)
# Knobs (environment): BIN (target/release), ENGINES (2), SEQS (8), TIME_SCALE (1), LOAD (2.0: offered / capacity),
#   RUN_SECONDS (60: arrivals last this long), REQUEST_TIMEOUT (60: the client's limit, s), QUEUES ("64:5s 16:1s":
#   the queue settings measured, max_length:max_wait each), ENGINE_WAITING (32; "" skips that run), SEED (7),
#   CAPACITY (requests/s; skips the calibration).
#
# Runs, each with fresh engines and a fresh router on free loopback ports, stopped afterwards:
#   calibrate  the queue at ~4x load for 20 s: the served rate, with every engine at SEQS all the time, is the
#              fleet's capacity (requests/s)
#   no-queue   max_in_flight_per_endpoint set, no queue: the router places everything, engines queue the rest
#   engine-waiting-N  no router queue, but each engine refuses (429) beyond N waiting requests (engine-sim
#              --max-waiting, vLLM PR #49330); the router retries a 429 on the other engine
#   queue-L-W  the same plus `queue: {max_length: L, max_wait: W}`, for each of QUEUES
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

BIN=${BIN:-target/release}
ENGINES=${ENGINES:-2}
SEQS=${SEQS:-8}
TIME_SCALE=${TIME_SCALE:-1}
LOAD=${LOAD:-2.0}
RUN_SECONDS=${RUN_SECONDS:-60}
REQUEST_TIMEOUT=${REQUEST_TIMEOUT:-60}
QUEUES=${QUEUES:-"64:5s 16:1s"}
ENGINE_WAITING=${ENGINE_WAITING-32}
ENGINE_ARGS=()
SEED=${SEED:-7}
CAPACITY=${CAPACITY:-}
# The requests: 500-2000 prompt tokens, 16-48 output tokens, streamed, one turn each.
SHAPE=(--turns 0-0 --short-share 1 --long-share 0 --first-short 500-2000 --output-tokens 16-48 --no-session-header)

for b in infergate engine-sim loadgen; do
  [ -x "$BIN/$b" ] || { echo "bench-queue.sh: $BIN/$b missing (cargo build --release)" >&2; exit 2; }
done
OUT="$ROOT/bench-out/queue-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$OUT"
log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

PIDS=()
start_bg() { # LOG CMD...: own process group
  local logf=$1; shift
  setsid "$@" >"$logf" 2>&1 </dev/null &
  LAST_PID=$!
  PIDS+=("$LAST_PID")
}
stop_pid() {
  local pid=$1 i
  kill -TERM -- "-$pid" 2>/dev/null || true
  for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
cleanup() { local p; for p in "${PIDS[@]+"${PIDS[@]}"}"; do stop_pid "$p"; done; PIDS=(); }
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'; }
wait_port() { # PORT SECONDS
  local i
  for i in $(seq 1 $(($2 * 10))); do
    ss -ltnH "sport = :$1" 2>/dev/null | grep -q . && return 0
    sleep 0.1
  done
  echo "bench-queue.sh: nothing listens on $1" >&2
  return 1
}
wait_ready() { # URL
  local i
  for i in $(seq 1 120); do
    curl -sf -m 5 -o /dev/null -H 'content-type: application/json' \
      -d '{"model":"sim-model","messages":[{"role":"user","content":"ready"}],"max_tokens":1}' \
      "$1/v1/chat/completions" && return 0
    sleep 0.25
  done
  echo "bench-queue.sh: $1 not ready" >&2
  return 1
}

# run NAME QUEUE(no|max_length:max_wait) RATE_PER_S SECONDS: one measured run; the loadgen JSON lands in
# $OUT/NAME.json.
run() {
  local name=$1 queue=$2 rate=$3 secs=$4 dir="$OUT/$1" ports=() i p
  mkdir -p "$dir"
  for i in $(seq 1 "$ENGINES"); do ports+=("$(free_port)"); done
  start_bg "$dir/engine-sim.log" "$BIN/engine-sim" --ports "$(IFS=,; echo "${ports[*]}")" \
    --time-scale "$TIME_SCALE" --max-num-seqs "$SEQS" --max-recorded-requests 1 "${ENGINE_ARGS[@]+"${ENGINE_ARGS[@]}"}"
  for p in "${ports[@]}"; do wait_port "$p" 10; done
  local lport mport
  lport=$(free_port); mport=$(free_port)
  {
    echo "listen: \"127.0.0.1:$lport\""
    echo "metrics_listen: \"127.0.0.1:$mport\""
    echo "server: { threads: 2, grace_period_seconds: 1, graceful_shutdown_timeout_seconds: 1,"
    echo "          pid_file: $dir/infergate.pid, upgrade_sock: $dir/infergate.sock }"
    echo "timeouts: { connect: 2s, response_header: 600s, stream_idle: 120s }"
    echo "pools:"
    echo "  - name: default"
    echo "    policy: load_aware"
    echo "    max_in_flight_per_endpoint: $SEQS"
    [ "$queue" = no ] || echo "    queue: { max_length: ${queue%%:*}, max_wait: ${queue#*:} }"
    echo "    endpoints:"
    for p in "${ports[@]}"; do echo "      - \"http://127.0.0.1:$p\""; done
    echo "    health_check: { interval: 1s, timeout: 1s, healthy_after: 1, unhealthy_after: 3 }"
  } >"$dir/infergate.yaml"
  start_bg "$dir/router.log" "$BIN/infergate" -c "$dir/infergate.yaml"
  local router_pid=$LAST_PID
  wait_port "$lport" 30
  wait_ready "http://127.0.0.1:$lport"
  # Sessions = rate x seconds (one request each); rate in loadgen is per simulated second.
  local sessions sim_rate
  sessions=$(python3 -c "print(max(1, round($rate * $secs)))")
  sim_rate=$(python3 -c "print($rate * $TIME_SCALE)")
  log "$name: $sessions requests at $rate/s over ${secs}s (queue: $queue)"
  timeout $((secs + REQUEST_TIMEOUT + 60)) "$BIN/loadgen" --scenario agent --url "http://127.0.0.1:$lport" \
    --sessions "$sessions" --rate "$sim_rate" --time-scale "$TIME_SCALE" --seed "$SEED" "${SHAPE[@]}" \
    --request-timeout "$REQUEST_TIMEOUT" --max-seconds $((secs + REQUEST_TIMEOUT + 30)) \
    --label "$name" --quiet --json "$OUT/$name.json" >"$dir/loadgen.txt" 2>"$dir/loadgen.log" || true
  curl -s -m 5 "http://127.0.0.1:$mport/metrics" >"$dir/router-metrics.txt" || true
  cleanup
}

HOW=given
if [ -z "$CAPACITY" ]; then
  HOW=calibrated
  # 4x a rough estimate (about 12 requests/s per engine of 8 at time scale 1); the queue keeps every engine full.
  guess=$(python3 -c "print(4 * 12 * $ENGINES * $SEQS / 8 / $TIME_SCALE)")
  run calibrate 64:2s "$guess" 20
  CAPACITY=$(python3 - "$OUT/calibrate.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
# Served requests over the arrival window plus the tail: ok requests / wall seconds.
print(round(r["ok"] / r["wall_seconds"], 2))
EOF
)
fi
RATE=$(python3 -c "print(round($LOAD * $CAPACITY, 2))")
log "capacity $CAPACITY requests/s; offering $RATE requests/s"
NAMES=(no-queue)
run no-queue no "$RATE" "$RUN_SECONDS"
if [ -n "$ENGINE_WAITING" ]; then
  NAMES+=("engine-waiting-$ENGINE_WAITING")
  ENGINE_ARGS=(--max-waiting "$ENGINE_WAITING")
  run "engine-waiting-$ENGINE_WAITING" no "$RATE" "$RUN_SECONDS"
  ENGINE_ARGS=()
fi
for q in $QUEUES; do
  NAMES+=("queue-${q%%:*}-${q#*:}")
  run "queue-${q%%:*}-${q#*:}" "$q" "$RATE" "$RUN_SECONDS"
done

python3 - "$OUT" "$CAPACITY" "$RATE" "$HOW" "${NAMES[@]}" <<'EOF'
import json, os, sys
out, cap, rate, how = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
print(f"capacity {cap} requests/s ({how}), offered {rate} requests/s; raw: {os.path.relpath(out)}\n")
print("| router | requests | served | refused (503/429) | client timeouts | other errors | served / wall s | TTFT p50 ms | TTFT p95 ms | TTFT p99 ms | TTFT max ms |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for name in sys.argv[5:]:
    r = json.load(open(os.path.join(out, name + ".json")))
    k = r.get("error_kinds", {})
    refused = k.get("http_503", 0) + k.get("http_429", 0)
    timeouts = k.get("timeout", 0)
    other = r["errors"] - refused - timeouts
    t = r.get("ttft_ms") or {}
    f = lambda x: "-" if x is None else f"{x:.0f}"
    print(f"| {name} | {r['requests']} | {r['ok']} | {refused} | {timeouts} | {other} | {r['ok'] / r['wall_seconds']:.1f} "
          f"| {f(t.get('p50'))} | {f(t.get('p95'))} | {f(t.get('p99'))} | {f(t.get('max'))} |")
EOF
