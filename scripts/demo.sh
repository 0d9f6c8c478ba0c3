#!/usr/bin/env bash
# The demo: builds infergate, starts four simulated vLLM engines and the router (conf/demo.yaml, policy predicted_ttft
# with sessions) and drives agent sessions with two moments of real pressure (long cold prompts arriving at once;
# another tenant flooding one engine directly) while a live view shows each endpoint's load, the peak of prefill
# tokens in flight and the moves the router makes (migrate, rescue, spill, fallback). Then the same workload (same seed,
# fresh engines) runs once more under round_robin, the summary compares the two, and the router stays up on
# http://127.0.0.1:8000 until Ctrl-C. Every process it starts is stopped on exit or Ctrl-C; all on 127.0.0.1.
#
#   scripts/demo.sh                  # about 1.5 minutes after the build (two runs of about 40 s)
#   scripts/demo.sh --short          # about 1 minute (12 sessions instead of 24)
#   scripts/demo.sh --no-wait        # exit after the summary instead of leaving the router up
#   scripts/demo.sh --bin-dir DIR    # use infergate, engine-sim and loadgen from DIR, no cargo build
#   DEMO_SESSIONS=40 scripts/demo.sh # more sessions (each run is still bounded by DEMO_MAX_SECONDS: 75, short 40)
#   DEMO_ROUTER_PORT, DEMO_METRICS_PORT, DEMO_ENGINE_PORTS=a,b,c,d move the listeners (8000, 9090, 8101-8104)
set -euo pipefail
cd "$(dirname "$0")/.."

SHORT=0
WAIT=1
BIN=""
while [ $# -gt 0 ]; do
  case "$1" in
    --short) SHORT=1 ;;
    --no-wait) WAIT=0 ;;
    --bin-dir) BIN=${2:?--bin-dir needs a directory}; shift ;;
    -h | --help) sed -n '2,14p' "$0" | cut -c3-; exit 0 ;;
    *) echo "demo: unknown argument '$1' (see scripts/demo.sh --help)" >&2; exit 2 ;;
  esac
  shift
done

if [ "$SHORT" = 1 ]; then
  SESSIONS=${DEMO_SESSIONS:-12}; RATE=${DEMO_RATE:-1.5}; MAX_SECONDS=${DEMO_MAX_SECONDS:-40}; PRESSURE=("5 cold" "12 flood")
else
  SESSIONS=${DEMO_SESSIONS:-24}; RATE=${DEMO_RATE:-1.0}; MAX_SECONDS=${DEMO_MAX_SECONDS:-75}; PRESSURE=("10 cold" "22 flood")
fi
SEED=${DEMO_SEED:-1}
# The moments of pressure, at the given second of each run:
#  cold:  three new sessions through the router whose first prompts are 120k-140k tokens (3 s of prefill each), all
#         within half a second: the engines they land on are jammed, so the sessions bound there move (migrate);
#  flood: another tenant sends 8 requests of 20k-40k tokens straight to the first engine, around the router: its
#         queue grows, so the sessions bound there migrate.
pressure_text() {
  case $1 in
    cold) echo "3 new sessions with 120k-140k-token first prompts (3 s of prefill each)" ;;
    flood) echo "another tenant sends 8 requests of 20k-40k tokens straight to 127.0.0.1:${ENGINE_PORTS[0]}" ;;
  esac
}
pressure_args() {
  case $1 in
    cold) echo --url "$ROUTER" --sessions 3 --first-long 120000-140000 --output-tokens 16 ;;
    flood) echo --url "http://127.0.0.1:${ENGINE_PORTS[0]}" --no-session-header --sessions 8 \
      --first-long 20000-40000 --output-tokens 64 ;;
  esac
}
ROUTER_PORT=${DEMO_ROUTER_PORT:-8000}
METRICS_PORT=${DEMO_METRICS_PORT:-9090}
IFS=, read -r -a ENGINE_PORTS <<<"${DEMO_ENGINE_PORTS:-8101,8102,8103,8104}"
[ ${#ENGINE_PORTS[@]} = 4 ] || { echo "demo: DEMO_ENGINE_PORTS needs four ports" >&2; exit 2; }
ROUTER=http://127.0.0.1:$ROUTER_PORT
METRICS=http://127.0.0.1:$METRICS_PORT
LOGDIR=$(mktemp -d /tmp/infergate-demo.XXXXXX)

if [ -z "$BIN" ]; then scripts/ensure-deps.sh; fi
need() { # command, Debian package
  command -v "$1" >/dev/null 2>&1 && return
  echo "installing $2" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get install -y -qq "$2" >/dev/null 2>&1 || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "$2" >/dev/null; }
}
need curl curl
need python3 python3

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for p in "$ROUTER_PORT" "$METRICS_PORT" "${ENGINE_PORTS[@]}"; do
  if port_busy "$p"; then
    echo "demo: port $p on 127.0.0.1 is already in use; stop whatever listens there (ss -ltnp 'sport = :$p')" >&2
    exit 1
  fi
done

if [ -z "$BIN" ]; then
  echo "== building (release; the first build takes a few minutes)"
  cargo build --release --bins
  BIN=target/release
fi
for b in infergate engine-sim loadgen; do
  [ -x "$BIN/$b" ] || { echo "demo: $BIN/$b is missing (cargo build --bins)" >&2; exit 1; }
done

# conf/demo.yaml on this run's ports, with its pid file and upgrade socket in LOGDIR; the round_robin variant drops
# the sessions (they need load_aware or predicted_ttft) and keeps everything else.
sed_args=(-e "s/127\.0\.0\.1:8000/127.0.0.1:$ROUTER_PORT/" -e "s/127\.0\.0\.1:9090/127.0.0.1:$METRICS_PORT/"
  -e "s|/tmp/infergate-demo\.pid|$LOGDIR/infergate.pid|" -e "s|/tmp/infergate-demo_upgrade\.sock|$LOGDIR/upgrade.sock|")
for i in 1 2 3 4; do sed_args+=(-e "s/127\.0\.0\.1:810$i\"/127.0.0.1:@E$i@\"/"); done
for i in 1 2 3 4; do sed_args+=(-e "s/@E$i@/${ENGINE_PORTS[$((i - 1))]}/"); done
sed "${sed_args[@]}" conf/demo.yaml >"$LOGDIR/predicted_ttft.yaml"
sed -e 's/policy: predicted_ttft/policy: round_robin/' -e '/^ *sessions:/d' "$LOGDIR/predicted_ttft.yaml" >"$LOGDIR/round_robin.yaml"
"$BIN/infergate" -t -c "$LOGDIR/round_robin.yaml" >"$LOGDIR/config-check.log" 2>&1 ||
  { echo "demo: the round_robin config does not load; see $LOGDIR/config-check.log" >&2; exit 1; }

ENGINES_PID=""
ROUTER_PID=""
LOAD_PIDS=()
stop() { # pid...: TERM, then wait for each
  for pid in "$@"; do [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; done
  for pid in "$@"; do [ -n "$pid" ] && wait "$pid" 2>/dev/null || true; done
}
cleanup() {
  trap - EXIT INT TERM
  echo
  echo "== stopping the demo processes"
  stop ${LOAD_PIDS[@]+"${LOAD_PIDS[@]}"} "$ROUTER_PID" "$ENGINES_PID"
  echo "logs: $LOGDIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_engines() {
  local ports
  ports=$(IFS=,; echo "${ENGINE_PORTS[*]}")
  RUST_LOG=warn "$BIN/engine-sim" --ports "$ports" >>"$LOGDIR/engine-sim.log" 2>&1 &
  ENGINES_PID=$!
  for p in "${ENGINE_PORTS[@]}"; do
    for _ in $(seq 100); do port_busy "$p" && break; sleep 0.1; done
  done
}

start_router() { # config
  RUST_LOG=info "$BIN/infergate" -c "$1" >>"$LOGDIR/infergate.log" 2>&1 &
  ROUTER_PID=$!
  for _ in $(seq 100); do
    curl -sf "$ROUTER/health" >/dev/null 2>&1 && break
    sleep 0.1
  done
  curl -sf "$ROUTER/health" >/dev/null || { echo "infergate did not become healthy; see $LOGDIR/infergate.log" >&2; exit 1; }
  # Engine stats fresh before the first request (the scrape interval is 1 s).
  sleep 1.5
}

stats_urls=()
for p in "${ENGINE_PORTS[@]}"; do stats_urls+=(--engine-stats-url "http://127.0.0.1:$p"); done

# One run of the workload against the router: agent sessions, plus the moments of PRESSURE. $1 names the run's files; the live view (or one progress line) runs meanwhile.
run_workload() { # name, view mode (full|line)
  local name=$1 mode=$2 i=0
  LOAD_PIDS=()
  "$BIN/loadgen" --scenario agent --url "$ROUTER" --sessions "$SESSIONS" --rate "$RATE" --max-seconds "$MAX_SECONDS" \
    --size-scale 0.25 --turns 2-5 --output-tokens 16-128 --seed "$SEED" --label "$name" --json "$LOGDIR/$name.json" "${stats_urls[@]}" \
    >"$LOGDIR/$name.txt" 2>"$LOGDIR/$name.progress" &
  local main=$!
  LOAD_PIDS+=("$main")
  for p in "${PRESSURE[@]}"; do
    i=$((i + 1))
    read -r at kind <<<"$p"
    # shellcheck disable=SC2046 # pressure_args prints words without spaces inside
    (sleep "$at" && exec "$BIN/loadgen" --scenario agent $(pressure_args "$kind") --arrival burst \
      --burst-window-ms 500 --short-share 0 --long-share 1 --turns 0 --seed $((SEED * 100 + i)) --max-seconds 30 --quiet \
      --json "$LOGDIR/$name-pressure-$i.json") >"$LOGDIR/$name-pressure-$i.txt" 2>&1 &
    LOAD_PIDS+=($!)
  done
  local view=(--status "$METRICS/status.json" --metrics "$METRICS/metrics" --progress "$LOGDIR/$name.progress"
    --pid "$main" --max-seconds "$MAX_SECONDS" --label "$name" --totals-out "$LOGDIR/$name.totals.json"
    --report "$LOGDIR/$name.json")
  for p in "${PRESSURE[@]}"; do
    read -r at kind <<<"$p"
    view+=(--pressure "$at:$(pressure_text "$kind")")
  done
  python3 scripts/demo_view.py live "${view[@]}" --mode "$mode"
  wait "$main" || echo "loadgen exited with an error; see $LOGDIR/$name.txt" >&2
  stop "${LOAD_PIDS[@]}"
  LOAD_PIDS=()
}

echo "== run 1 of 2: policy predicted_ttft with sessions (conf/demo.yaml): $SESSIONS agent sessions, seed $SEED," \
  "pressure at $(printf '%s s, ' "${PRESSURE[@]}" | sed 's/, $//')"
start_engines
start_router "$LOGDIR/predicted_ttft.yaml"
run_workload predicted_ttft full
stop "$ROUTER_PID" "$ENGINES_PID"
ROUTER_PID=""; ENGINES_PID=""

echo
echo "== run 2 of 2: the same workload under round_robin (same seed, fresh engines)"
start_engines
start_router "$LOGDIR/round_robin.yaml"
run_workload round_robin line
stop "$ROUTER_PID" "$ENGINES_PID"
ROUTER_PID=""; ENGINES_PID=""

echo
echo "== summary: the agent sessions' requests under each policy (loadgen reports: $LOGDIR/*.txt)"
python3 scripts/demo_view.py summary --a "$LOGDIR/predicted_ttft.json" --totals-a "$LOGDIR/predicted_ttft.totals.json" \
  --b "$LOGDIR/round_robin.json"

if [ "$WAIT" = 0 ]; then exit 0; fi
start_engines
start_router "$LOGDIR/predicted_ttft.yaml"
cat <<EOF

== infergate is running on $ROUTER (status page: $METRICS/status, metrics: $METRICS/metrics). Try:
  curl -s $ROUTER/v1/chat/completions -H 'content-type: application/json' -H 'x-session-id: me' \\
    -d '{"model":"sim-model","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"hello"}]}'
  curl -s $ROUTER/v1/models
  OpenAI SDK: base_url="$ROUTER/v1", api_key="unused"
Press Ctrl-C to stop the router and the engines.
EOF
wait "$ROUTER_PID" "$ENGINES_PID"
