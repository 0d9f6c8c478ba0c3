#!/usr/bin/env bash
# Disaggregated prefill/decode benchmark: the agent and shared-prefix scenarios of scripts/bench.sh on a fleet of
# simulated engines speaking vLLM's NixlConnector round trip (engine-sim --kv-transfer: PREFILL prefill engines and
# DECODE decode engines in one process), through infergate's disaggregated pool and the peers' P/D modes where they
# run here (vllm-router and smg from PyPI in .venv/, as scripts/bench.sh installs them). Writes the section
# "Disaggregated prefill and decode" of BENCHMARKS.md (after the marker scripts/bench.sh keeps), raw JSON under
# bench-out/pd-STAMP/.
#
# Usage: scripts/bench-pd.sh [--md FILE] [--scenarios "agent shared-prefix"] [--only REGEX] [--no-peers]
#   --only RE    only the routers matching RE (infergate, vllm-router, smg)
# Knobs (environment), defaults as scripts/bench.sh: TIME_SCALE (0.2), SESSIONS_PER_ENGINE (40, per decode
# engine), RATE_PER_ENGINE (0.5), OUTPUT_TOKENS (16-160), SEED (7), AGENT_MAX_SECONDS (120), ENGINE_STATS_INTERVAL
# (200ms), SHARED_PREFIX_TOKENS (16000), PREFILL (2), DECODE (2), KV_TRANSFER_TOKENS_PER_SEC (200000),
# PREFILL_POLICY (predicted_ttft: infergate's prefill set).
#
# Every process it starts gets its own process group and is stopped after each run and on exit; only 127.0.0.1
# and free ports are used.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
MD=BENCHMARKS.md
SCENARIOS="agent shared-prefix"
ONLY=""
PEERS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --md) MD="$2"; shift ;;
    --scenarios) SCENARIOS="$2"; shift ;;
    --only) ONLY="$2"; shift ;;
    --no-peers) PEERS=0 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "bench-pd.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
TIME_SCALE=${TIME_SCALE:-0.2}
SESSIONS_PER_ENGINE=${SESSIONS_PER_ENGINE:-40}
RATE_PER_ENGINE=${RATE_PER_ENGINE:-0.5}
OUTPUT_TOKENS=${OUTPUT_TOKENS:-16-160}
SEED=${SEED:-7}
PREFILL_POLICY=${PREFILL_POLICY:-predicted_ttft}
AGENT_MAX_SECONDS=${AGENT_MAX_SECONDS:-120}
ENGINE_STATS_INTERVAL=${ENGINE_STATS_INTERVAL:-200ms}
SHARED_PREFIX_TOKENS=${SHARED_PREFIX_TOKENS:-16000}
PREFILL=${PREFILL:-2}
DECODE=${DECODE:-2}
KV_TRANSFER_TOKENS_PER_SEC=${KV_TRANSFER_TOKENS_PER_SEC:-200000}

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT="$ROOT/bench-out/pd-$STAMP"
mkdir -p "$OUT"
BIN="$ROOT/target/release"
START_EPOCH=$(date +%s)
log() { printf '%s [%4ss] %s\n' "$(date +%H:%M:%S)" "$(( $(date +%s) - START_EPOCH ))" "$*" >&2; }
# shellcheck source=scripts/bench/procs.sh
. scripts/bench/procs.sh

log "building infergate, engine-sim and loadgen (release)"
cargo build --release --bin infergate --bin engine-sim --bin loadgen 2>&1 | tail -n 1 >&2
: >"$OUT/peers.txt"
ROUTERS=(infergate)
if [ "$PEERS" = 1 ]; then
  [ -x .venv/bin/pip ] || python3 -m venv .venv >"$OUT/venv.log" 2>&1
  for pkg in vllm-router smg; do
    .venv/bin/pip show -q "$pkg" >/dev/null 2>&1 || .venv/bin/pip install -q "$pkg" >"$OUT/pip-$pkg.log" 2>&1 || true
    if [ -x ".venv/bin/$pkg" ]; then
      echo "$pkg $(.venv/bin/pip show "$pkg" | awk '/^Version:/{print $2}') installed" >>"$OUT/peers.txt"
      ROUTERS+=("$pkg")
    else
      echo "$pkg NOT installed" >>"$OUT/peers.txt"
    fi
  done
fi

# start_router ROUTER PREFILL_URLS DECODE_URLS DIR: the router in its P/D mode on free ports; sets ROUTER_URL,
# ROUTER_METRICS.
start_router() {
  local router=$1 dir=$4 port mport u
  read -r -a pre <<<"$2"
  read -r -a dec <<<"$3"
  free_port; port=$PORT
  free_port; mport=$PORT
  case "$router" in
    infergate)
      {
        echo "listen: \"127.0.0.1:$port\""
        echo "metrics_listen: \"127.0.0.1:$mport\""
        echo "server: { threads: 2, grace_period_seconds: 1, graceful_shutdown_timeout_seconds: 1,"
        echo "          pid_file: $dir/infergate.pid, upgrade_sock: $dir/infergate.sock }"
        echo "timeouts: { connect: 2s, response_header: 600s, stream_idle: 120s }"
        echo "pools:"
        echo "  - name: default"
        echo "    models: [\"*\"]"
        echo "    policy: load_aware"
        echo "    sessions: { header: x-session-id }"
        echo "    endpoints: [$(for u in "${dec[@]}"; do printf '"%s", ' "$u"; done | sed 's/, $//')]"
        echo "    health_check: { path: /health, interval: 1s, timeout: 1s, healthy_after: 1, unhealthy_after: 3 }"
        echo "    engine_stats: { kind: vllm, path: /metrics, interval: $ENGINE_STATS_INTERVAL }"
        echo "    disaggregation:"
        echo "      connector: nixl"
        echo "      prefill:"
        echo "        policy: $PREFILL_POLICY"
        echo "        sessions: { header: x-session-id }"
        echo "        endpoints: [$(for u in "${pre[@]}"; do printf '"%s", ' "$u"; done | sed 's/, $//')]"
        echo "        health_check: { path: /health, interval: 1s, timeout: 1s, healthy_after: 1, unhealthy_after: 3 }"
        echo "        engine_stats: { kind: vllm, path: /metrics, interval: $ENGINE_STATS_INTERVAL }"
      } >"$dir/infergate.yaml"
      start_bg "$dir/router.log" "$BIN/infergate" -c "$dir/infergate.yaml"
      ;;
    vllm-router)
      local args=()
      for u in "${pre[@]}"; do args+=(--prefill "$u"); done
      for u in "${dec[@]}"; do args+=(--decode "$u"); done
      start_bg "$dir/router.log" .venv/bin/vllm-router --host 127.0.0.1 --port "$port" --vllm-pd-disaggregation \
        "${args[@]}" --prefill-policy cache_aware --decode-policy power_of_two --prometheus-host 127.0.0.1 \
        --prometheus-port "$mport" --log-level warning --request-timeout-secs 600
      ;;
    smg)
      local args=()
      for u in "${pre[@]}"; do args+=(--prefill "$u"); done
      for u in "${dec[@]}"; do args+=(--decode "$u"); done
      start_bg "$dir/router.log" .venv/bin/smg launch --host 127.0.0.1 --port "$port" --pd-disaggregation \
        "${args[@]}" --prefill-policy cache_aware --decode-policy power_of_two --prometheus-host 127.0.0.1 \
        --prometheus-port "$mport" --log-level warn --request-timeout-secs 600
      ;;
  esac
  ROUTER_URL="http://127.0.0.1:$port"
  ROUTER_METRICS="http://127.0.0.1:$mport/metrics"
  wait_port "$port" && wait_ready "$ROUTER_URL"
}

for sc in $SCENARIOS; do
  sc_args=()
  [ "$sc" = shared-prefix ] && sc_args=(--system-prompt-tokens "$SHARED_PREFIX_TOKENS")
  for router in "${ROUTERS[@]}"; do
    [ -n "$ONLY" ] && ! echo "$router" | grep -Eq -- "$ONLY" && continue
    name="$sc-$router"
    dir="$OUT/$name"
    mkdir -p "$dir"
    ports=()
    for i in $(seq 1 $((PREFILL + DECODE))); do free_port; ports+=("$PORT"); done
    start_bg "$dir/engine-sim.log" "$BIN/engine-sim" --ports "$(IFS=,; echo "${ports[*]}")" --kv-transfer \
      --kv-transfer-tokens-per-sec "$KV_TRANSFER_TOKENS_PER_SEC" --time-scale "$TIME_SCALE" --max-recorded-requests 1
    urls=()
    for p in "${ports[@]}"; do wait_port "$p"; urls+=("http://127.0.0.1:$p"); done
    pre="${urls[*]:0:$PREFILL}" dec="${urls[*]:$PREFILL}"
    log "$sc: $router, $PREFILL prefill + $DECODE decode engines"
    if ! start_router "$router" "$pre" "$dec" "$dir"; then
      log "FAILED $name: the router did not serve (see $dir/router.log)"
      echo "{\"label\": \"$name\", \"failed\": \"$(tail -n 2 "$dir/router.log" | tr '\n"' '  ' | cut -c1-300)\"}" \
        >"$OUT/$name.failed.json"
      stop_all
      continue
    fi
    stats=()
    for u in "${urls[@]}"; do stats+=(--engine-stats-url "$u"); done
    sessions=$((DECODE * SESSIONS_PER_ENGINE))
    "$BIN/loadgen" --scenario "$sc" "${sc_args[@]+"${sc_args[@]}"}" --field-order messages-first --url "$ROUTER_URL" \
      "${stats[@]}" --sessions "$sessions" --rate "$(python3 -c "print($DECODE * $RATE_PER_ENGINE)")" \
      --time-scale "$TIME_SCALE" --output-tokens "$OUTPUT_TOKENS" --seed "$SEED" --max-seconds "$AGENT_MAX_SECONDS" \
      --request-timeout "$AGENT_MAX_SECONDS" --label "$name" --json "$OUT/$name.json" --quiet \
      >"$dir/loadgen.txt" 2>"$dir/loadgen.err" || log "loadgen failed: $(tail -n 1 "$dir/loadgen.err")"
    grep -E "TTFT ms|slowest" "$dir/loadgen.txt" | sed 's/^/    /' >&2 || true
    curl -s -m 5 "$ROUTER_METRICS" >"$dir/router-metrics.txt" || true
    for u in "${urls[@]}"; do curl -s -m 5 "$u/sim/stats"; echo; done >"$dir/engines.jsonl"
    stop_all
  done
done
ELAPSED=$(( $(date +%s) - START_EPOCH ))

python3 - "$OUT" "$MD" "$ELAPSED" "$PREFILL" "$DECODE" "$TIME_SCALE" "$SESSIONS_PER_ENGINE" "$RATE_PER_ENGINE" \
  "$OUTPUT_TOKENS" "$SEED" "$KV_TRANSFER_TOKENS_PER_SEC" "$(git rev-parse --short HEAD)" "$PREFILL_POLICY" <<'PY'
import glob, json, os, sys
out, md, elapsed, npre, ndec, ts, spe, rpe, otok, seed, kvtps, commit, prefill_policy = sys.argv[1:]
def hist(run, name):
    """(count, sum) of a router histogram over every label set."""
    c = s = 0.0
    path = os.path.join(out, run, "router-metrics.txt")
    for line in open(path) if os.path.exists(path) else []:
        if line.startswith(name + "_count"):
            c += float(line.rsplit(" ", 1)[1])
        elif line.startswith(name + "_sum"):
            s += float(line.rsplit(" ", 1)[1])
    return (c, s)
def legs(run):
    """Mean prefill-leg and KV-transfer (decode first token) times in ms, from infergate's own series."""
    figs = []
    for name in ("infergate_disagg_prefill_seconds", "infergate_disagg_kv_transfer_seconds"):
        c, s = hist(run, name)
        figs.append(f"{1000 * s / c:.1f}" if c else "-")
    return figs
def engines(run):
    rows = [json.loads(l) for l in open(os.path.join(out, run, "engines.jsonl")) if l.strip()]
    return rows[:int(npre)], rows[int(npre):]
lines = ["## Disaggregated prefill and decode", "",
    f"`scripts/bench-pd.sh` (release builds, commit {commit}, {elapsed} s in all, measured {os.path.basename(out)[3:]} "
    "on the 2-core machine that also runs the engines and the load generator): the agent and shared-prefix scenarios "
    f"of the main table (seed {seed}, {int(spe) * int(ndec)} sessions at {float(rpe) * int(ndec):g} per simulated "
    f"second, `max_tokens` {otok}, `--time-scale {ts}`) on {npre} prefill and {ndec} decode engine-sim engines "
    f"speaking NixlConnector's kv_transfer_params (`--kv-transfer`, {float(kvtps):g} tokens/s of KV transfer). "
    f"infergate: prefill set {prefill_policy} with sessions, decode pool load_aware with sessions, engine stats every "
    "200 ms. Per-leg times are infergate's own series (`infergate_disagg_prefill_seconds`, "
    "`infergate_disagg_kv_transfer_seconds`: a streamed decode leg's dispatch to its first token).", "",
    "| scenario | router | requests | errors | TTFT p95 ms | slowest-5% decode tok/s | prefill leg mean ms | KV transfer + first token mean ms | prompt tokens computed by prefill / by decode engines |",
    "|---|---|---:|---:|---:|---:|---:|---:|---|"]
for f in sorted(glob.glob(os.path.join(out, "*.json"))):
    run = os.path.basename(f)[:-5]
    sc, router = run.split("-", 1) if not run.startswith("shared-prefix") else ("shared-prefix", run[len("shared-prefix-"):])
    if run.endswith(".failed"):
        continue
    r = json.load(open(f))
    if "failed" in r:
        lines.append(f"| {sc} | {router} | - | - | - | - | - | - | did not run: {r['failed'][:120]} |")
        continue
    p, d = engines(run)
    comp = f"{sum(e['computed_prompt_tokens'] for e in p)} / {sum(e['computed_prompt_tokens'] for e in d)}"
    pl, kv = legs(run) if router == "infergate" else ("-", "-")
    lines.append(f"| {sc} | {router} | {r['requests']} | {r['errors']} | {r['ttft_ms']['p95']:.1f} | "
                 f"{r['decode']['slowest5_mean_tok_s']:.1f} | {pl} | {kv} | {comp} |")
for f in sorted(glob.glob(os.path.join(out, "*.failed.json"))):
    r = json.load(open(f))
    lines.append(f"| {r['label']} | | - | - | - | - | - | - | did not run: {r['failed'][:160]} |")
section = "\n".join(lines) + "\n"
sys.path.insert(0, "scripts/bench")
from section import put
put(md, "## Disaggregated prefill and decode", section)
print(section)
PY
log "done in ${ELAPSED}s: $MD (raw results in $OUT)"
