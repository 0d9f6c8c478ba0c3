#!/usr/bin/env bash
# The real-engine suite: starts real vLLM engines (its CPU build, scripts/ensure-vllm.sh) on loopback and runs the
# integration tests that need them (`tests/it/real_vllm/`, ignored in a plain `cargo test`) through routers the
# tests start in front of them. Stops the engines on every exit. Logs: target/real-vllm/.
#
#   scripts/real-vllm.sh [FILTER]    (runs the tests whose path under real_vllm:: starts with FILTER)
#
# Two engines (2 GB and ~25 s to start each, both at once), serving model "tiny" with prefix caching,
# prompt-token details in usage and KV-cache events published on a ZMQ socket each (with a replay socket). Then,
# those stopped, a prefill and a decode engine speaking vLLM's NixlConnector over CPU buffers for the disaggregated
# test (real_vllm::disagg; scripts/vllm/ensure-nixl.sh installs nixl beside the venv).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ENGINES=${INFERGATE_VLLM_ENGINES_N:-2}
STARTUP_TIMEOUT=180   # seconds for every engine to answer /health (both start at once on 2 cores)
SUITE_TIMEOUT=900     # seconds for the whole cargo test run
LOGS=$ROOT/target/real-vllm
mkdir -p "$LOGS"
log() { echo "== real-vllm: $*"; }

eval "$(scripts/ensure-vllm.sh)"
scripts/ensure-deps.sh

# Ports below the kernel's ephemeral range: one picked by binding port 0 can be handed to a health-check curl or to
# vLLM's own get_open_port() before the engine binds it, and the engine core then dies at start.
# TAKEN: every port handed out in this run, so that no two engines are given the same one before either binds it.
TAKEN=()
ports() {
  local got
  got=$(scripts/free-ports.py "$1" --not "${TAKEN[@]}") || exit 1
  read -r -a PORTS <<<"$got"
  TAKEN+=("${PORTS[@]}")
}

FILTER=${1:-}
# The disaggregated test (real_vllm::disagg) runs last, on a pair of engines of its own speaking NixlConnector.
MAIN=1 PD=1
case "$FILTER" in "") ;; disagg*) MAIN=0 ;; *) PD=0 ;; esac

PIDS=()
stop() {
  for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  done
}
trap stop EXIT

# One compute thread and the model inside the engine-core process (real-vllm-cpu.md): the 3-process layout
# busy-waits and costs ~1.8 cores.
VLLM_ENV=(VLLM_TARGET_DEVICE=cpu VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS=1 VLLM_ENABLE_V1_MULTIPROCESSING=0
  VLLM_HOST_IP=127.0.0.1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1)

# start_main I: starts main engine I (0-based) on fresh ports; sets urls[I], kv[I], replay[I], PIDS[I].
start_main() {
  local i=$1 port kvport replayport
  ports 3
  read -r port kvport replayport <<<"${PORTS[*]}"
  urls[i]="http://127.0.0.1:$port" kv[i]="tcp://127.0.0.1:$kvport" replay[i]="tcp://127.0.0.1:$replayport"
  log "starting engine $((i + 1)) on 127.0.0.1:$port (KV events on $kvport); log $LOGS/engine-$((i + 1)).log"
  env "${VLLM_ENV[@]}" setsid "$VLLM_PYTHON" scripts/vllm/serve.py serve "$VLLM_MODEL" --load-format dummy \
    --host 127.0.0.1 --port "$port" --served-model-name tiny --max-model-len 16384 --enforce-eager \
    --kv-cache-memory-bytes 512M --max-num-seqs 8 --enable-prompt-tokens-details \
    --kv-events-config "{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:$kvport\",\"topic\":\"kv\",\"replay_endpoint\":\"tcp://*:$replayport\"}" \
    >"$LOGS/engine-$((i + 1)).log" 2>&1 &
  PIDS[i]=$!
}

urls=() kv=() replay=()
for i in $(seq 0 "$((ENGINES * MAIN - 1))"); do start_main "$i"; done

# The spare engine: real_vllm::dead kills its engine core mid-stream, so it is an engine of its own, started
# beside the main ones when that test runs. Its slot in PIDS is past theirs.
SPARE=0 SPARE_I=9
case "$FILTER" in "" | dead*) SPARE=$MAIN ;; esac
start_spare() {
  ports 1
  spare_url="http://127.0.0.1:${PORTS[0]}"
  log "starting the spare engine on ${spare_url#http://}; log $LOGS/spare.log"
  env "${VLLM_ENV[@]}" setsid "$VLLM_PYTHON" scripts/vllm/serve.py serve "$VLLM_MODEL" --load-format dummy \
    --host 127.0.0.1 --port "${PORTS[0]}" --served-model-name tiny --max-model-len 16384 --enforce-eager \
    --kv-cache-memory-bytes 256M --max-num-seqs 8 >"$LOGS/spare.log" 2>&1 &
  PIDS[SPARE_I]=$!
}
if [ "$SPARE" = 1 ]; then start_spare; fi

log "cargo build --tests (while the engines start)"
cargo test -p infergate --test it --no-run --quiet 2>&1 | grep -v '^ *Executable' || true

# root_cause NAME: the error lines of an engine's log (the engine core's own traceback ends in them; the API
# server's traceback after it only says that the core failed).
root_cause() {
  grep -E "Error|ERROR|Exception" "$LOGS/$1.log" | grep -vE "See root cause above|^ *raise " | tail -8 | cut -c1-400 \
    || true
}

# wait_healthy START NAME...: every engine started (urls[i] logged to $LOGS/NAME[i].log) answers /health. An engine
# that exits while starting is started once more by `START i` (fresh ports), its first log kept as NAME.failed.log
# and its errors shown: the engine's start is not what these tests test, and one failed start should not hide them.
wait_healthy() {
  local start=$SECONDS restart=$1 names=("${@:2}") i retried=()
  for i in "${!urls[@]}"; do
    until curl -sf "${urls[$i]}/health" >/dev/null; do
      if ! kill -0 "${PIDS[$i]}" 2>/dev/null; then
        if [ -z "${retried[i]:-}" ]; then
          retried[i]=1
          log "${names[$i]} exited while starting; its errors:"; root_cause "${names[$i]}"
          mv "$LOGS/${names[$i]}.log" "$LOGS/${names[$i]}.failed.log"
          kill -KILL -- "-${PIDS[$i]}" 2>/dev/null || true
          log "starting ${names[$i]} once more (its first log: $LOGS/${names[$i]}.failed.log)"
          "$restart" "$i"
          start=$SECONDS
          continue
        fi
        log "${names[$i]} exited; its log:"; tail -40 "$LOGS/${names[$i]}.log"
        log "${names[$i]} exited twice while starting; its errors:"; root_cause "${names[$i]}"; exit 1
      fi
      if (( SECONDS - start > STARTUP_TIMEOUT )); then
        log "${names[$i]} not healthy after ${STARTUP_TIMEOUT}s; its log:"; tail -40 "$LOGS/${names[$i]}.log"; exit 1
      fi
      sleep 1
    done
  done
  log "engines healthy after $((SECONDS - start))s: ${urls[*]}"
}

export INFERGATE_VLLM_MODEL_DIR=$VLLM_MODEL INFERGATE_VLLM_PYTHON=$VLLM_PYTHON INFERGATE_VLLM_MODEL=tiny
passed=0 STAGE=()
# failed OUT RC: repeats what a failed suite said and what the engines logged as errors, last, where a truncated
# CI log still shows it; exits RC.
failed() {
  log "FAILED (exit $2); the failures again:"
  grep -A12 "panicked at" "$1" | head -60 || true
  local name
  for name in "${STAGE[@]}"; do
    log "the last errors and KV-transfer lines in $name.log:"
    grep -E "ERROR|Error|NIXL|UCX|ucx|KV Transfer" "$LOGS/$name.log" \
      | grep -vE "GET /|is available|Initializ|instantiated|UCX_RCACHE" | tail -12 | cut -c1-400 || true
  done
  log "FAILED (exit $2)"
  exit "$2"
}
# suite FILTER [ARGS...]: the real-engine tests under real_vllm::FILTER; counts the passed into $passed.
suite() {
  local out=$LOGS/suite-${1:-all}.log rc n
  set +e
  # No backtraces: a CI log keeps its head and tail, and a backtrace would push the panic's message out of both.
  RUST_BACKTRACE=0 timeout "$SUITE_TIMEOUT" cargo test -p infergate --test it "real_vllm::$1" -- --ignored \
    --test-threads=1 --nocapture "${@:2}" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" -ne 0 ]; then failed "$out" "$rc"; fi
  n=$(grep -oE 'test result: ok\. [0-9]+ passed' "$out" | awk '{ s += $4 } END { print s + 0 }')
  passed=$((passed + n))
}

if [ "$MAIN" = 1 ]; then
  names=(); for i in "${!urls[@]}"; do names+=("engine-$((i + 1))"); done
  wait_healthy start_main "${names[@]}"
  STAGE=("${names[@]}")
  export INFERGATE_VLLM_ENGINES=$(IFS=,; echo "${urls[*]}")
  export INFERGATE_VLLM_KV_EVENTS=$(IFS=,; echo "${kv[*]}")
  export INFERGATE_VLLM_KV_REPLAY=$(IFS=,; echo "${replay[*]}")
  # The API servers' process ids: real_vllm::wedged stops an engine core (their child) for a while.
  pids=(); for i in "${!urls[@]}"; do pids+=("${PIDS[$i]}"); done
  export INFERGATE_VLLM_PIDS=$(IFS=,; echo "${pids[*]}")
  if [ "$SPARE" = 1 ]; then
    start=$SECONDS
    until curl -sf "$spare_url/health" >/dev/null; do
      if ! kill -0 "${PIDS[SPARE_I]}" 2>/dev/null || (( SECONDS - start > STARTUP_TIMEOUT )); then
        log "the spare engine did not start; its log:"; tail -40 "$LOGS/spare.log"; root_cause spare; exit 1
      fi
      sleep 1
    done
    export INFERGATE_VLLM_SPARE=$spare_url INFERGATE_VLLM_SPARE_PID=${PIDS[SPARE_I]}
  fi
  suite "$FILTER" --skip real_vllm::disagg
  stop; PIDS=()
fi

if [ "$PD" = 1 ]; then
  # A prefill and a decode engine with vLLM's NixlConnector over CPU buffers (nixl from PyPI, beside the venv).
  eval "$(scripts/vllm/ensure-nixl.sh)"
  # start_pd I: starts the prefill (I=0) or decode (I=1) engine on fresh ports; sets urls[I], PIDS[I].
  start_pd() {
    local i=$1 role port side
    role=$([ "$i" = 0 ] && echo prefill || echo decode)
    ports 2
    read -r port side <<<"${PORTS[*]}"
    urls[i]="http://127.0.0.1:$port"
    log "starting the $role engine on 127.0.0.1:$port (NixlConnector, side channel $side); log $LOGS/pd-$role.log"
    env PYTHONPATH="$VLLM_NIXL_PATH" VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1 VLLM_NIXL_SIDE_CHANNEL_PORT="$side" \
      "${VLLM_ENV[@]}" setsid "$VLLM_PYTHON" scripts/vllm/serve.py serve "$VLLM_MODEL" --load-format dummy \
        --host 127.0.0.1 --port "$port" --served-model-name tiny --max-model-len 4096 --enforce-eager \
        --kv-cache-memory-bytes 256M --max-num-seqs 4 \
        --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_buffer_device":"cpu"}' \
        >"$LOGS/pd-$role.log" 2>&1 &
    PIDS[i]=$!
  }
  urls=()
  start_pd 0
  start_pd 1
  wait_healthy start_pd pd-prefill pd-decode
  STAGE=(pd-prefill pd-decode)
  export INFERGATE_VLLM_PD_PREFILL=${urls[0]} INFERGATE_VLLM_PD_DECODE=${urls[1]}
  suite disagg
fi
# A filter that matches nothing passes with 0 tests: that is not a pass.
if [ "${passed:-0}" -eq 0 ]; then log "no real-engine test ran"; exit 1; fi
log "$passed real-engine tests passed"
