# Process and port helpers of the benchmark scripts that start their own engines and routers (sourced by
# scripts/bench-replicas.sh and scripts/bench-pd.sh). Every process gets its own process group and is stopped
# (TERM, then KILL) by stop_all; only 127.0.0.1 and free ports are used. Needs `log` defined by the caller.

PIDS=()
stop_pid() {
  local pid=$1 i
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
stop_all() {
  local p
  for p in "${PIDS[@]+"${PIDS[@]}"}"; do stop_pid "$p"; done
  PIDS=()
}
trap stop_all EXIT
trap 'log "interrupted"; exit 130' INT TERM
# start_bg LOG CMD...: runs CMD in its own session/process group; sets LAST_PID.
start_bg() {
  local logf=$1; shift
  setsid "$@" >"$logf" 2>&1 </dev/null &
  LAST_PID=$!
  PIDS+=("$LAST_PID")
}
# free_port: sets PORT to a free loopback port.
free_port() { PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'); }
# wait_port PORT: something listens on it (10 s at most).
wait_port() {
  local i
  for i in $(seq 1 100); do
    ss -ltnH "sport = :$1" 2>/dev/null | grep -q . && return 0
    sleep 0.1
  done
  echo "nothing listens on $1" >&2
  return 1
}
# wait_ready URL: a one-token chat request through URL succeeds (30 s at most).
wait_ready() {
  local i
  for i in $(seq 1 120); do
    curl -sf -m 5 -o /dev/null -H 'content-type: application/json' \
      -d '{"model":"sim-model","messages":[{"role":"user","content":"ready"}],"max_tokens":1}' \
      "$1/v1/chat/completions" && return 0
    sleep 0.25
  done
  echo "$1 did not answer" >&2
  return 1
}
