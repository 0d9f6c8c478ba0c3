#!/usr/bin/env bash
# The real-engine suite: starts real vLLM engines (its CPU build, scripts/ensure-vllm.sh) on loopback and runs the
# integration tests that need them (`tests/it/real_vllm/`, ignored in a plain `cargo test`) through routers the
# tests start in front of them. Stops the engines on every exit. Logs: target/real-vllm/.
#
#   scripts/real-vllm.sh [FILTER]    (runs the tests whose path under real_vllm:: starts with FILTER)
#
# Two engines (2 GB and ~25 s to start each, both at once), serving model "tiny" with prefix caching,
# prompt-token details in usage and KV-cache events published on a ZMQ socket each (with a replay socket).
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

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

PIDS=()
stop() {
  for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  done
}
trap stop EXIT

urls=() kv=() replay=()
for i in $(seq "$ENGINES"); do
  port=$(free_port) kvport=$(free_port) replayport=$(free_port)
  urls+=("http://127.0.0.1:$port") kv+=("tcp://127.0.0.1:$kvport") replay+=("tcp://127.0.0.1:$replayport")
  log "starting engine $i on 127.0.0.1:$port (KV events on $kvport); log $LOGS/engine-$i.log"
  # One compute thread and the model inside the engine-core process (real-vllm-cpu.md): the 3-process layout
  # busy-waits and costs ~1.8 cores.
  VLLM_TARGET_DEVICE=cpu VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 \
  VLLM_HOST_IP=127.0.0.1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
    setsid "$VLLM_PYTHON" scripts/vllm/serve.py serve "$VLLM_MODEL" --load-format dummy \
      --host 127.0.0.1 --port "$port" --served-model-name tiny --max-model-len 16384 --enforce-eager \
      --kv-cache-memory-bytes 512M --max-num-seqs 8 --enable-prompt-tokens-details \
      --kv-events-config "{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:$kvport\",\"topic\":\"kv\",\"replay_endpoint\":\"tcp://*:$replayport\"}" \
      >"$LOGS/engine-$i.log" 2>&1 &
  PIDS+=($!)
done

log "cargo build --tests (while the engines start)"
cargo test -p infergate --test it --no-run --quiet 2>&1 | grep -v '^ *Executable' || true

start=$SECONDS
for i in "${!urls[@]}"; do
  until curl -sf "${urls[$i]}/health" >/dev/null; do
    if ! kill -0 "${PIDS[$i]}" 2>/dev/null; then
      log "engine $((i + 1)) exited; its log:"; tail -40 "$LOGS/engine-$((i + 1)).log"; exit 1
    fi
    if (( SECONDS - start > STARTUP_TIMEOUT )); then
      log "engine $((i + 1)) not healthy after ${STARTUP_TIMEOUT}s; its log:"; tail -40 "$LOGS/engine-$((i + 1)).log"; exit 1
    fi
    sleep 1
  done
done
log "engines healthy after $((SECONDS - start))s: ${urls[*]}"

export INFERGATE_VLLM_ENGINES=$(IFS=,; echo "${urls[*]}")
export INFERGATE_VLLM_KV_EVENTS=$(IFS=,; echo "${kv[*]}")
export INFERGATE_VLLM_KV_REPLAY=$(IFS=,; echo "${replay[*]}")
export INFERGATE_VLLM_MODEL_DIR=$VLLM_MODEL INFERGATE_VLLM_PYTHON=$VLLM_PYTHON INFERGATE_VLLM_MODEL=tiny
out=$LOGS/suite.log
set +e
timeout "$SUITE_TIMEOUT" cargo test -p infergate --test it "real_vllm::${1:-}" -- --ignored --test-threads=1 --nocapture 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then log "FAILED (exit $rc)"; exit "$rc"; fi
# A filter that matches nothing passes with 0 tests: that is not a pass.
passed=$(grep -oE 'test result: ok\. [0-9]+ passed' "$out" | awk '{ s += $4 } END { print s + 0 }')
if [ "${passed:-0}" -eq 0 ]; then log "no real-engine test ran"; exit 1; fi
log "$passed real-engine tests passed"
