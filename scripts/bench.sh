#!/usr/bin/env bash
# Routing benchmark on simulated engines: every infergate policy and the peer routers (vllm-router, smg from
# PyPI, installed into .venv/) under the same agent-session traffic, a burst of new sessions, and a router
# overhead test. Writes BENCHMARKS.md (and raw JSON under bench-out/).
#
# Usage: scripts/bench.sh [--quick] [--no-peers] [--fleets "2 4 4-unequal 2-slowing"]
#                          [--scenarios "agent shared-prefix mixed burst overhead"] [--only REGEX] [--md FILE]
#                          [--matrix]
#   fleets: N equal engines; N-unequal: the second half at UNEQUAL_SPEED (0.5) of the others' speed; N-slowing:
#              the last engine drops to SLOW_SPEED (0.3) of its speed SLOW_AFTER (20) simulated seconds (4 wall
#              seconds at the default time scale, a fifth of an agent run) after it first has work
#   --matrix     issue 26's matrix: agent, shared-prefix and mixed on fleets 2 4 4-unequal 2-slowing, seeds 7 8 9,
#              infergate predicted_ttft with and without engine_stats beside vllm-router cache_aware and
#              consistent_hash and smg cache_aware, one table per scenario and fleet (about 1.5 hours on 2 cores)
#   scenarios: agent (default set: agent burst overhead), shared-prefix (every session opens with one shared
#              SHARED_PREFIX_TOKENS-token system prompt), mixed (agent plus single-turn chats without the session
#              header, 2 per session at twice the session rate)
#   an infergate policy ending in /nostats runs without engine_stats (e.g. 'infergate predicted_ttft/nostats')
#   --quick      a reduced matrix (2 engines only, fewer sessions, 2 burst seeds): ~5 minutes
#   --no-peers   infergate only (no virtualenv, no PyPI)
#   --only RE    only the router/policy pairs matching RE (e.g. 'infergate load_aware|vllm-router cache_aware')
# Knobs (environment): TIME_SCALE (0.2), SESSIONS_PER_ENGINE (40), RATE_PER_ENGINE (0.5 sessions per simulated
# second), OUTPUT_TOKENS (16-160), SEED (7), REPEAT_SEEDS ("8 9": the headline configurations REPEAT_ONLY run
# again with these seeds), AGENT_MAX_SECONDS (120), BURST_SEEDS ("1 2 3 4 5"),
# INFERGATE_BIN (the router binary to measure, default the release build; for A/B runs of two builds),
# INFERGATE_POOL_EXTRA (one more line of infergate's pool, e.g. 'ttft_budget: { default: 400ms, when_over: place }'),
# INFERGATE_SESSIONS_EXTRA (more keys of infergate's `sessions`, e.g. 'move_margin: 1'),
# INFERGATE_ACCESS_LOG=1 (infergate writes its JSON access log to each run's access.jsonl: reasons, estimates, predictions),
# OVERHEAD_REQUESTS (20000), OVERHEAD_CONCURRENCY (8), OVERHEAD_REPEAT (1: the overhead list runs this many times,
# each time with fresh processes, and the report gives each router's median and the median of the ratios to the
# floor of the same pass: a process's CPU per request moves by up to a fifth from one start to the next on a
# shared machine), ROUTER_THREADS (2: worker threads of infergate and of the floor; 1 shows what sharing state
# between two cores costs), ENGINE_STATS_INTERVAL (200ms), SHARED_PREFIX_TOKENS (16000),
# SCENARIO_TABLES (0; 1: one table per scenario and fleet with means over every seed run, ratios to the best peer
# per metric and issue 26's targets, instead of the single-seed matrix), SIM_ARGS (more engine-sim options for every
# fleet, e.g. '--attention-context-tokens 30000': prefill that grows faster than its length, as on real engines).
#
# Every process it starts gets its own process group and is stopped (TERM, then KILL) after each run and on
# exit. Only 127.0.0.1 is used; every port is a free one, and its owner is checked (ss -ltnp) against the
# process just started before anything is measured.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

QUICK=0
PEERS=${PEERS:-1}
FLEETS=${FLEETS:-"2 4"}
MD=${MD:-BENCHMARKS.md}
SCENARIOS=${SCENARIOS:-"agent burst overhead"}
ONLY=${ONLY:-}
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --no-peers) PEERS=0 ;;
    --fleets) FLEETS="$2"; shift ;;
    --scenarios) SCENARIOS="$2"; shift ;;
    --only) ONLY="$2"; shift ;;
    --md) MD="$2"; shift ;;
    --matrix)
      SCENARIOS="agent shared-prefix mixed"; FLEETS="2 4 4-unequal 2-slowing"; REPEAT_SEEDS="8 9"
      REPEAT_ONLY='.*'; SCENARIO_TABLES=1
      ONLY='^(infergate (predicted_ttft|predicted_ttft/nostats)|vllm-router (cache_aware|consistent_hash)|smg cache_aware)$' ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

TIME_SCALE=${TIME_SCALE:-0.2}
SESSIONS_PER_ENGINE=${SESSIONS_PER_ENGINE:-40}
RATE_PER_ENGINE=${RATE_PER_ENGINE:-0.5}
OUTPUT_TOKENS=${OUTPUT_TOKENS:-16-160}
SEED=${SEED:-7}
REPEAT_SEEDS=${REPEAT_SEEDS-"8 9"}
REPEAT_ONLY=${REPEAT_ONLY:-"^(infergate load_aware|vllm-router cache_aware|vllm-router consistent_hash)$"}
AGENT_MAX_SECONDS=${AGENT_MAX_SECONDS:-120}
BURST_SEEDS=${BURST_SEEDS:-"1 2 3 4 5"}
OVERHEAD_REQUESTS=${OVERHEAD_REQUESTS:-20000}
OVERHEAD_CONCURRENCY=${OVERHEAD_CONCURRENCY:-8}
OVERHEAD_REPEAT=${OVERHEAD_REPEAT:-1}
ENGINE_STATS_INTERVAL=${ENGINE_STATS_INTERVAL:-200ms}
SHARED_PREFIX_TOKENS=${SHARED_PREFIX_TOKENS:-16000}
UNEQUAL_SPEED=${UNEQUAL_SPEED:-0.5}
SLOW_SPEED=${SLOW_SPEED:-0.3}
SLOW_AFTER=${SLOW_AFTER:-20}
if [ "$QUICK" = 1 ]; then
  FLEETS="2"
  SESSIONS_PER_ENGINE=${QUICK_SESSIONS_PER_ENGINE:-20}
  BURST_SEEDS="1 2"
  REPEAT_SEEDS=""
  OVERHEAD_REQUESTS=10000
fi

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT="$ROOT/bench-out/$STAMP"
mkdir -p "$OUT"
BIN="$ROOT/target/release"
START_EPOCH=$(date +%s)

REASON=""
RUN_SEED=0
log() { printf '%s [%4ss] %s\n' "$(date +%H:%M:%S)" "$(( $(date +%s) - START_EPOCH ))" "$*" >&2; }

# ---------------------------------------------------------------- processes
PIDS=()
stop_pid() {
  local pid=$1 i
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
  local keep=() p
  for p in "${PIDS[@]}"; do [ "$p" = "$pid" ] || keep+=("$p"); done
  PIDS=("${keep[@]+"${keep[@]}"}")
}
cleanup() {
  local p
  for p in "${PIDS[@]+"${PIDS[@]}"}"; do stop_pid "$p"; done
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

# start_bg LOG CMD...: runs CMD in its own session/process group; sets LAST_PID.
start_bg() {
  local logf=$1; shift
  setsid "$@" >"$logf" 2>&1 </dev/null &
  LAST_PID=$!
  PIDS+=("$LAST_PID")
}

# free_port: sets PORT to a free loopback port not handed out before in this run. (Functions here set globals
# instead of printing, so that nothing they start runs in a subshell.)
USED_PORTS=" "
free_port() {
  local p i
  for i in $(seq 1 20); do
    p=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
    case "$USED_PORTS" in *" $p "*) continue ;; esac
    USED_PORTS="$USED_PORTS$p "
    PORT=$p
    return 0
  done
  REASON="no free port"
  return 1
}

port_owner() { ss -ltnpH "sport = :$1" 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2; }

# is_descendant PID ANCESTOR: PID is ANCESTOR or below it.
is_descendant() {
  local p=$1 i
  for i in $(seq 1 64); do
    [ "$p" = "$2" ] && return 0
    [ -z "$p" ] || [ "$p" -le 1 ] && return 1
    p=$(awk '/^PPid:/{print $2}' "/proc/$p/status" 2>/dev/null || echo "")
  done
  return 1
}

# wait_owned PORT PID SECONDS: the port is listening and owned by PID (or a child of it). Appends the finding
# to $RUN_DIR/owners.txt; on failure sets REASON.
wait_owned() {
  local port=$1 pid=$2 secs=$3 i owner
  for i in $(seq 1 $((secs * 10))); do
    if ! kill -0 "$pid" 2>/dev/null; then
      REASON="process $pid exited before listening on $port: $(tail -n 3 "$RUN_DIR"/*.log 2>/dev/null | tr '\n' ' ' | cut -c1-300)"
      echo "$REASON" >>"$RUN_DIR/owners.txt"
      return 1
    fi
    owner=$(port_owner "$port")
    if [ -n "$owner" ]; then
      if is_descendant "$owner" "$pid"; then
        echo "port $port owned by pid $owner ($(tr -d '\0' </proc/"$owner"/comm 2>/dev/null)), started as $pid" \
          >>"$RUN_DIR/owners.txt"
        return 0
      fi
      REASON="port $port is owned by pid $owner, not by $pid: refusing to measure"
      echo "$REASON" >>"$RUN_DIR/owners.txt"
      return 1
    fi
    sleep 0.1
  done
  REASON="nothing listens on $port after ${secs}s"
  echo "$REASON" >>"$RUN_DIR/owners.txt"
  return 1
}

# wait_ready URL SECONDS: a tiny chat request through URL succeeds.
wait_ready() {
  local url=$1 secs=$2 i
  for i in $(seq 1 $((secs * 4))); do
    if curl -sf -m 5 -o /dev/null -H 'content-type: application/json' \
      -d '{"model":"sim-model","messages":[{"role":"user","content":"ready"}],"max_tokens":1}' \
      "$url/v1/chat/completions"; then
      return 0
    fi
    sleep 0.25
  done
  return 1
}

# ---------------------------------------------------------------- build and peers
log "building infergate, engine-sim and loadgen (release)"
scripts/ensure-deps.sh
cargo build --release --bin infergate --bin engine-sim --bin loadgen --example floor 2>&1 | tail -n 3 >&2
FLOOR="$ROOT/target/release/examples/floor"

: >"$OUT/peers.txt"
VLLM_ROUTER=""
SMG=""
if [ "$PEERS" = 1 ]; then
  if [ ! -x .venv/bin/python ]; then
    log "creating .venv"
    python3 -m venv .venv >"$OUT/venv.log" 2>&1 || echo "venv: python3 -m venv failed (see venv.log)" >>"$OUT/peers.txt"
  fi
  for pkg in vllm-router smg; do
    if [ -x .venv/bin/pip ]; then
      if ! .venv/bin/pip show -q "$pkg" >/dev/null 2>&1; then
        log "pip install $pkg"
        .venv/bin/pip install -q "$pkg" >"$OUT/pip-$pkg.log" 2>&1 || true
      fi
      ver=$(.venv/bin/pip show "$pkg" 2>/dev/null | awk '/^Version:/{print $2}')
      if [ -n "$ver" ] && [ -x ".venv/bin/$pkg" ]; then
        echo "$pkg $ver installed" >>"$OUT/peers.txt"
        [ "$pkg" = vllm-router ] && VLLM_ROUTER="$ROOT/.venv/bin/vllm-router"
        [ "$pkg" = smg ] && SMG="$ROOT/.venv/bin/smg"
      else
        echo "$pkg NOT installed: $(tail -n 2 "$OUT/pip-$pkg.log" 2>/dev/null | tr '\n' ' ')" >>"$OUT/peers.txt"
      fi
    fi
  done
else
  echo "peers skipped (--no-peers)" >>"$OUT/peers.txt"
fi

# ---------------------------------------------------------------- engines and routers
SIM_PID=""
SIM_PORTS=""
SIM_URLS=()
# start_sim FLEET TIME_SCALE: FLEET is N, N-unequal or N-slowing (see the usage above).
start_sim() {
  local n=${1%%-*} kind="" ts=$2 ports=() i p speed_args=()
  case "$1" in *-*) kind=${1#*-} ;; esac
  case "$kind" in
    "") ;;
    unequal)
      local speeds=()
      for i in $(seq 1 "$n"); do
        if [ "$i" -gt $((n / 2)) ]; then speeds+=("$UNEQUAL_SPEED"); else speeds+=(1); fi
      done
      speed_args=(--speeds "$(IFS=,; echo "${speeds[*]}")") ;;
    slowing)
      # In simulated seconds, as engine-sim counts them: the slowdown comes at the same point of the traffic
      # whatever the time scale.
      speed_args=(--speed-change "$((n - 1)):$SLOW_AFTER:$SLOW_SPEED") ;;
    *) REASON="unknown fleet $1"; return 1 ;;
  esac
  for i in $(seq 1 "$n"); do
    free_port || return 1
    ports+=("$PORT")
  done
  local csv
  csv=$(IFS=,; echo "${ports[*]}")
  # SIM_ARGS is split on spaces on purpose: a list of engine-sim options.
  # shellcheck disable=SC2086
  start_bg "$RUN_DIR/engine-sim.log" "$BIN/engine-sim" --ports "$csv" --time-scale "$ts" --max-recorded-requests 100000 \
    "${speed_args[@]+"${speed_args[@]}"}" ${SIM_ARGS:-}
  SIM_PID=$LAST_PID
  SIM_PORTS="${ports[*]}"
  SIM_URLS=()
  for p in "${ports[@]}"; do
    wait_owned "$p" "$SIM_PID" 10 || return 1
    SIM_URLS+=("http://127.0.0.1:$p")
  done
}

ROUTER_PID=""
ROUTER_URL=""
ROUTER_METRICS=""
# start_router ROUTER POLICY: starts it over SIM_URLS on free ports; sets ROUTER_PID / ROUTER_URL.
start_router() {
  local router=$1 policy=$2 port mport
  free_port || return 1
  port=$PORT
  free_port || return 1
  mport=$PORT
  case "$router" in
    infergate)
      local pol=$policy extra="" fallback="" stats=1
      case "$pol" in
        */nostats) pol=${pol%/nostats}; stats=0 ;;
      esac
      case "$pol" in
        prefix_aware:*) fallback=${pol#prefix_aware:}; pol=prefix_aware ;;
      esac
      {
        echo "listen: \"127.0.0.1:$port\""
        echo "metrics_listen: \"127.0.0.1:$mport\""
        echo "server:"
        echo "  threads: ${ROUTER_THREADS:-2}"
        echo "  grace_period_seconds: 1"
        echo "  graceful_shutdown_timeout_seconds: 1"
        echo "  pid_file: $RUN_DIR/infergate.pid"
        echo "  upgrade_sock: $RUN_DIR/infergate_upgrade.sock"
        echo "timeouts: { connect: 2s, response_header: 600s, stream_idle: 120s }"
        [ "${INFERGATE_ACCESS_LOG:-0}" = 1 ] && echo "access_log: { format: json, path: $RUN_DIR/access.jsonl }"
        echo "pools:"
        echo "  - name: default"
        echo "    models: [\"*\"]"
        echo "    policy: $pol"
        echo "    endpoints:"
        for u in "${SIM_URLS[@]}"; do echo "      - url: \"$u\""; done
        echo "    health_check: { path: /health, interval: 1s, timeout: 1s, healthy_after: 1, unhealthy_after: 3 }"
        [ "$stats" = 1 ] && echo "    engine_stats: { kind: vllm, path: /metrics, interval: $ENGINE_STATS_INTERVAL }"
        case "$pol" in
          load_aware|predicted_ttft) echo "    sessions: { header: x-session-id${INFERGATE_SESSIONS_EXTRA:+, $INFERGATE_SESSIONS_EXTRA} }" ;;
        esac
        [ -n "$fallback" ] && echo "    prefix: { fallback: $fallback }"
        [ -n "${INFERGATE_POOL_EXTRA:-}" ] && echo "    $INFERGATE_POOL_EXTRA"
        true
      } >"$RUN_DIR/infergate.yaml"
      start_bg "$RUN_DIR/router.log" "${INFERGATE_BIN:-$BIN/infergate}" -c "$RUN_DIR/infergate.yaml"
      ;;
    vllm-router)
      [ -n "$VLLM_ROUTER" ] || { REASON="vllm-router is not installed"; return 1; }
      start_bg "$RUN_DIR/router.log" "$VLLM_ROUTER" --host 127.0.0.1 --port "$port" --worker-urls "${SIM_URLS[@]}" \
        --policy "$policy" --prometheus-host 127.0.0.1 --prometheus-port "$mport" --log-level warning \
        --request-timeout-secs 600
      ;;
    floor)
      # The floor: a bare Pingora pass-through to the first engine (no body scan, no placement).
      [ -x "$FLOOR" ] || { REASON="the floor example is not built"; return 1; }
      start_bg "$RUN_DIR/router.log" "$FLOOR" "127.0.0.1:$port" "${SIM_URLS[0]#http://}" "${ROUTER_THREADS:-2}"
      ;;
    smg)
      [ -n "$SMG" ] || { REASON="smg is not installed"; return 1; }
      start_bg "$RUN_DIR/router.log" "$SMG" launch --host 127.0.0.1 --port "$port" --worker-urls "${SIM_URLS[@]}" \
        --policy "$policy" --prometheus-host 127.0.0.1 --prometheus-port "$mport" --log-level warn \
        --request-timeout-secs 600
      ;;
    *) REASON="unknown router $router"; return 1 ;;
  esac
  ROUTER_PID=$LAST_PID
  ROUTER_METRICS="http://127.0.0.1:$mport/metrics"
  wait_owned "$port" "$ROUTER_PID" 60 || return 1
  ROUTER_URL="http://127.0.0.1:$port"
  wait_ready "$ROUTER_URL" 60 || { REASON="$router did not answer a chat request within 60 s"; return 1; }
  # Confirm again right before measuring: the port still belongs to the router just started.
  wait_owned "$port" "$ROUTER_PID" 1 || return 1
}

stop_all() {
  # Keep the router's own metrics (placement reasons, in-flight gauges) next to the run's report.
  if [ -n "$ROUTER_PID" ] && [ -n "$ROUTER_METRICS" ]; then
    curl -s -m 5 "$ROUTER_METRICS" >"$RUN_DIR/router-metrics.txt" 2>/dev/null || true
  fi
  ROUTER_METRICS=""
  # The engines' recorded requests (session header, body length): scripts/bench/tail.py attributes a peer's
  # requests to engines with them.
  for p in ${SIM_PORTS:-}; do
    curl -s -m 10 "http://127.0.0.1:$p/sim/requests" >"$RUN_DIR/sim-requests-$p.json" 2>/dev/null || true
  done
  SIM_PORTS=""
  [ -n "$ROUTER_PID" ] && stop_pid "$ROUTER_PID"
  [ -n "$SIM_PID" ] && stop_pid "$SIM_PID"
  ROUTER_PID=""
  SIM_PID=""
}

# record_failure REASON: writes $OUT/$NAME.failed.json with the run's LABEL (router|policy|fleet) and seed.
record_failure() {
  log "FAILED $NAME: $1"
  python3 -c 'import json,sys; print(json.dumps({"label": sys.argv[1], "failed": sys.argv[2], "seed": int(sys.argv[3])}))' \
    "$LABEL" "$1" "$RUN_SEED" >"$OUT/$NAME.failed.json"
}

MATRIX=(
  "infergate round_robin"
  "infergate least_request"
  "infergate load_aware"
  "infergate prefix_aware:least_inflight"
  "infergate prefix_aware:qps"
  "infergate predicted_ttft"
  "infergate predicted_ttft/nostats"
  "infergate load_aware/nostats"
  "vllm-router round_robin"
  "vllm-router power_of_two"
  "vllm-router cache_aware"
  "vllm-router consistent_hash"
  "smg round_robin"
  "smg power_of_two"
  "smg cache_aware"
)

# skipped ROUTER POLICY: peers are off, or --only does not select the pair.
skipped() {
  { [ "$PEERS" != 1 ] && [ "$1" != infergate ] && [ "$1" != floor ]; } && return 0
  [ -n "$ONLY" ] && ! echo "$1 $2" | grep -Eq -- "$ONLY" && return 0
  return 1
}
want() { case " $SCENARIOS " in *" $1 "*) return 0 ;; esac; return 1; }

# ---------------------------------------------------------------- agent, shared-prefix and mixed scenarios
AGENT_SCENARIOS=""
for sc in agent shared-prefix mixed; do want "$sc" && AGENT_SCENARIOS="$AGENT_SCENARIOS $sc"; done
[ -n "$AGENT_SCENARIOS" ] || FLEETS=""
for sc in $AGENT_SCENARIOS; do
case "$sc" in
  shared-prefix) sc_args=(--system-prompt-tokens "$SHARED_PREFIX_TOKENS") ;;
  mixed) sc_args=() ;;
  *) sc_args=() ;;
esac
for fleet in $FLEETS; do
  n=${fleet%%-*}
  sessions=$((n * SESSIONS_PER_ENGINE))
  rate=$(python3 -c "print($n * $RATE_PER_ENGINE)")
  # The whole matrix with SEED, then the headline configurations again with each of REPEAT_SEEDS.
  for seed in $SEED $REPEAT_SEEDS; do
    for entry in "${MATRIX[@]}"; do
      set -- $entry
      router=$1 policy=$2
      skipped "$router" "$policy" && continue
      NAME="$sc-$fleet-$router-$(echo "$policy" | tr ':/' '--')"
      if [ "$seed" != "$SEED" ]; then
        echo "$router $policy" | grep -Eq -- "$REPEAT_ONLY" || continue
        NAME="$NAME-seed$seed"
      fi
      LABEL="$router|$policy|$fleet"
      RUN_SEED=$seed
      RUN_DIR="$OUT/$NAME"
      mkdir -p "$RUN_DIR"
      log "$sc: fleet $fleet, $router $policy, seed $seed ($sessions sessions at $rate/s simulated)"
      extra_args=("${sc_args[@]+"${sc_args[@]}"}")
      if [ "$sc" = mixed ]; then
        extra_args+=(--chat-requests $((2 * sessions)) --chat-rate "$(python3 -c "print(2 * $rate)")")
      fi
      if ! start_sim "$fleet" "$TIME_SCALE"; then record_failure "engine-sim: $REASON"; stop_all; continue; fi
      if ! start_router "$router" "$policy"; then record_failure "$REASON"; stop_all; continue; fi
      stats_args=()
      for u in "${SIM_URLS[@]}"; do stats_args+=(--engine-stats-url "$u"); done
      # --field-order messages-first: bodies as openai-python 1.x (the most deployed client) sends them.
      if ! "$BIN/loadgen" --scenario "$sc" "${extra_args[@]+"${extra_args[@]}"}" --field-order messages-first \
        --url "$ROUTER_URL" "${stats_args[@]}" \
        --sessions "$sessions" --rate "$rate" --time-scale "$TIME_SCALE" --output-tokens "$OUTPUT_TOKENS" \
        --seed "$seed" --max-seconds "$AGENT_MAX_SECONDS" --request-timeout "$AGENT_MAX_SECONDS" --label "$LABEL" \
        --json "$OUT/$NAME.json" --trace "$RUN_DIR/trace.jsonl" >"$RUN_DIR/loadgen.txt" 2>"$RUN_DIR/loadgen.err"; then
        record_failure "loadgen failed: $(tail -n 1 "$RUN_DIR/loadgen.err")"
      else
        grep -E "TTFT ms|slowest|CV" "$RUN_DIR/loadgen.txt" | sed 's/^/    /' >&2 || true
      fi
      stop_all
    done
  done
done
done

# ---------------------------------------------------------------- burst scenario (2 engines)
want burst || BURST_SEEDS=""
for fb in least_inflight qps; do
  skipped infergate "prefix_aware:$fb" && continue
  for s in $BURST_SEEDS; do
    NAME="burst-infergate-$fb-seed$s"
    LABEL="infergate|prefix_aware:$fb|2"
    RUN_SEED=$s
    RUN_DIR="$OUT/$NAME"
    mkdir -p "$RUN_DIR"
    log "burst: infergate prefix_aware fallback $fb, seed $s"
    if ! start_sim 2 "$TIME_SCALE"; then record_failure "engine-sim: $REASON"; stop_all; continue; fi
    if ! start_router infergate "prefix_aware:$fb"; then record_failure "$REASON"; stop_all; continue; fi
    if ! "$BIN/loadgen" --scenario burst --field-order messages-first --url "$ROUTER_URL" \
      --engine-stats-url "${SIM_URLS[0]}" --engine-stats-url "${SIM_URLS[1]}" --time-scale "$TIME_SCALE" \
      --seed "$s" --max-seconds 120 --output-tokens 16-64 --label "$LABEL" --json "$OUT/$NAME.json" \
      >"$RUN_DIR/loadgen.txt" 2>"$RUN_DIR/loadgen.err"; then
      record_failure "loadgen failed: $(tail -n 1 "$RUN_DIR/loadgen.err")"
    else
      grep -E "^burst" "$RUN_DIR/loadgen.txt" | cut -c1-160 | sed 's/^/    /' >&2 || true
    fi
    stop_all
  done
done

# ---------------------------------------------------------------- overhead scenario (1 engine, no simulated time)
OVERHEAD=(
  "floor pass-through"
  "infergate load_aware"
  "infergate predicted_ttft"
  "infergate round_robin"
  "vllm-router round_robin"
  "vllm-router cache_aware"
  "smg round_robin"
  "smg cache_aware"
)
want overhead || OVERHEAD=()
for pass in $(seq 1 "$OVERHEAD_REPEAT"); do
for entry in "${OVERHEAD[@]+"${OVERHEAD[@]}"}"; do
  set -- $entry
  router=$1 policy=$2
  skipped "$router" "$policy" && continue
  NAME="overhead-$router-$policy"
  [ "$pass" -gt 1 ] && NAME="$NAME-pass$pass"
  LABEL="$router|$policy|1"
  RUN_SEED=0
  RUN_DIR="$OUT/$NAME"
  mkdir -p "$RUN_DIR"
  log "overhead: $router $policy (pass $pass of $OVERHEAD_REPEAT)"
  if ! start_sim 1 0; then record_failure "engine-sim: $REASON"; stop_all; continue; fi
  if ! start_router "$router" "$policy"; then record_failure "$REASON"; stop_all; continue; fi
  if ! "$BIN/loadgen" --scenario overhead --field-order messages-first --url "$ROUTER_URL" \
    --direct-url "${SIM_URLS[0]}" --router-pid "$ROUTER_PID" --concurrency "$OVERHEAD_CONCURRENCY" \
    --requests "$OVERHEAD_REQUESTS" --rounds 2 --max-seconds 120 --label "$LABEL" --json "$OUT/$NAME.json" \
    >"$RUN_DIR/loadgen.txt" 2>"$RUN_DIR/loadgen.err"; then
    record_failure "loadgen failed: $(tail -n 1 "$RUN_DIR/loadgen.err")"
  else
    grep -E "^(direct|router|added)" "$RUN_DIR/loadgen.txt" | sed 's/^/    /' >&2 || true
  fi
  stop_all
done
done

# ---------------------------------------------------------------- report
ELAPSED=$(( $(date +%s) - START_EPOCH ))
# Sections measured by other scripts (large bodies, attacks, queues) live after this marker and survive a re-run.
MARKER='<!-- measured by other scripts: kept by scripts/bench.sh -->'
KEEP=$(mktemp)
if [ -f "$MD" ]; then awk -v m="$MARKER" 'index($0, m) { keep = 1 } keep' "$MD" >"$KEEP"; fi
python3 scripts/bench/report.py --out-dir "$OUT" --md "$MD" --elapsed "$ELAPSED" --time-scale "$TIME_SCALE" \
  --sessions-per-engine "$SESSIONS_PER_ENGINE" --rate-per-engine "$RATE_PER_ENGINE" --output-tokens "$OUTPUT_TOKENS" \
  --seed "$SEED" --repeat-seeds "$REPEAT_SEEDS" --fleets "$FLEETS" --burst-seeds "$BURST_SEEDS" --overhead-requests "$OVERHEAD_REQUESTS" \
  --overhead-concurrency "$OVERHEAD_CONCURRENCY" --engine-stats-interval "$ENGINE_STATS_INTERVAL" \
  --quick "$QUICK" --scenario-tables "${SCENARIO_TABLES:-0}"
if [ -s "$KEEP" ]; then printf '\n' >>"$MD"; cat "$KEEP" >>"$MD"; fi
rm -f "$KEEP"
log "done in ${ELAPSED}s: $MD (raw results in $OUT)"
