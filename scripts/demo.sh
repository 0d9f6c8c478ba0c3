#!/usr/bin/env bash
# The demo: builds infergate, starts four simulated vLLM engines and the router (conf/demo.yaml), drives a short
# agent-session workload while showing each endpoint's live load, prints the summary, then leaves the router
# running on http://127.0.0.1:8000 until Ctrl-C. Every process it starts is stopped on exit.
#
#   scripts/demo.sh                 # defaults: 16 sessions, about a minute of traffic
#   DEMO_SESSIONS=40 scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."

SESSIONS=${DEMO_SESSIONS:-16}
RATE=${DEMO_RATE:-0.5}
MAX_SECONDS=${DEMO_MAX_SECONDS:-90}
ROUTER=http://127.0.0.1:8000
METRICS=http://127.0.0.1:9090/metrics
ENGINE_PORTS=(8101 8102 8103 8104)
LOGDIR=$(mktemp -d /tmp/infergate-demo.XXXXXX)

scripts/ensure-deps.sh
command -v curl >/dev/null 2>&1 || { echo "installing curl" >&2; apt-get install -y -qq curl >/dev/null; }

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for p in 8000 9090 "${ENGINE_PORTS[@]}"; do
  if port_busy "$p"; then
    echo "demo: port $p on 127.0.0.1 is already in use; stop whatever listens there (ss -ltnp 'sport = :$p')" >&2
    exit 1
  fi
done

echo "== building (release; the first build takes a few minutes)"
cargo build --release --bins
BIN=target/release

PIDS=()
cleanup() {
  trap - EXIT INT TERM
  echo
  echo "== stopping the demo processes"
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  echo "logs: $LOGDIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== starting 4 simulated engines on ${ENGINE_PORTS[*]}"
ports=$(IFS=,; echo "${ENGINE_PORTS[*]}")
RUST_LOG=warn "$BIN/engine-sim" --ports "$ports" >"$LOGDIR/engine-sim.log" 2>&1 &
PIDS+=($!)
for p in "${ENGINE_PORTS[@]}"; do
  for _ in $(seq 100); do port_busy "$p" && break; sleep 0.1; done
done

echo "== starting infergate with conf/demo.yaml"
RUST_LOG=info "$BIN/infergate" -c conf/demo.yaml >"$LOGDIR/infergate.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do
  curl -sf "$ROUTER/health" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -sf "$ROUTER/health" >/dev/null || { echo "infergate did not become healthy; see $LOGDIR/infergate.log" >&2; exit 1; }

# One line per endpoint from the router's own metrics: requests and prefill tokens in flight, placements.
live_view() {
  printf "%-17s %9s %14s  %s\n" endpoint requests prefill_tok placements
  curl -s "$METRICS" | awk '
    /^infergate_endpoint_requests_in_flight\{/ { match($0, /endpoint="[^"]*"/); e=substr($0, RSTART+10, RLENGTH-11); req[e]=$NF; eps[e]=1 }
    /^infergate_endpoint_prefill_tokens\{/     { match($0, /endpoint="[^"]*"/); e=substr($0, RSTART+10, RLENGTH-11); pre[e]=$NF }
    /^infergate_placements_total\{/ {
      match($0, /endpoint="[^"]*"/); e=substr($0, RSTART+10, RLENGTH-11)
      match($0, /reason="[^"]*"/); r=substr($0, RSTART+8, RLENGTH-9)
      if ($NF > 0) pl[e]=pl[e] sprintf(" %s=%d", r, $NF) }
    END { for (e in eps) printf "%-17s %9d %14d %s\n", e, req[e], pre[e], pl[e] }' | sort
}

stats_urls=()
for p in "${ENGINE_PORTS[@]}"; do stats_urls+=(--engine-stats-url "http://127.0.0.1:$p"); done

echo "== driving $SESSIONS agent sessions (bimodal first turns, growing conversations, x-session-id)"
"$BIN/loadgen" --scenario agent --url "$ROUTER" --sessions "$SESSIONS" --rate "$RATE" --max-seconds "$MAX_SECONDS" \
  --size-scale 0.25 --seed 1 --quiet --json "$LOGDIR/loadgen.json" "${stats_urls[@]}" >"$LOGDIR/loadgen.txt" 2>&1 &
LOADGEN=$!
PIDS+=("$LOADGEN")
while kill -0 "$LOADGEN" 2>/dev/null; do
  echo
  echo "-- $(date +%T) live load per endpoint (from $METRICS)"
  live_view
  sleep 2
done
wait "$LOADGEN" || echo "loadgen exited with an error; see $LOGDIR/loadgen.txt" >&2

echo
echo "== summary"
cat "$LOGDIR/loadgen.txt"
echo
live_view
cat <<EOF

== infergate is running on $ROUTER (metrics: $METRICS). Try:
  curl -s $ROUTER/v1/chat/completions -H 'content-type: application/json' -H 'x-session-id: me' \\
    -d '{"model":"sim-model","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"hello"}]}'
  curl -s $ROUTER/v1/models
  OpenAI SDK: base_url="$ROUTER/v1", api_key="unused"
Press Ctrl-C to stop the router and the engines.
EOF
wait "${PIDS[0]}" "${PIDS[1]}"
