#!/usr/bin/env bash
# Agent sessions on two real vLLM engines (the CPU build, scripts/ensure-vllm.sh) through infergate, vllm-router
# and smg side by side, a fresh pair of engines per router (scripts/bench/real.py). Prints a Markdown table;
# raw JSON and logs: bench-out/real/. About 1.5 minutes per run (nine runs) once the venvs exist.
#
# Usage: scripts/bench-real.sh [--only SUBSTRING] [--no-peers] [--sessions N] [--rate PER_SECOND] [--seed N]
#                              [--pin] [--move-margin M]
# (the load: 24 sessions at 0.8 a second, seed 7, unless given; a heavier one queues on the engines; --pin runs
# engine i on CPU i; --move-margin sets infergate's sessions.move_margin, default 0.1)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$ROOT/bench-out/real
ONLY="" PEERS=1 LOAD=()
while [ $# -gt 0 ]; do
  case "$1" in
    --only) ONLY=$2; shift ;;
    --sessions|--rate|--seed|--move-margin) LOAD+=("$1" "$2"); shift ;;
    --pin) LOAD+=("$1") ;;
    --no-peers) PEERS=0 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "bench-real.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT"
eval "$(scripts/ensure-vllm.sh)"
scripts/ensure-deps.sh
cargo build --release --bin infergate --bin loadgen 2>&1 | tail -n 1 >&2
args=()
if [ "$PEERS" = 1 ]; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  for pkg in vllm-router smg; do
    .venv/bin/pip show -q "$pkg" >/dev/null 2>&1 || .venv/bin/pip install -q "$pkg" >&2
  done
  args+=(--vllm-router "$ROOT/.venv/bin/vllm-router" --smg "$ROOT/.venv/bin/smg")
fi
python3 scripts/bench/real.py --python "$VLLM_PYTHON" --model-dir "$VLLM_MODEL" --bin "$ROOT/target/release" \
  --out "$OUT" --only "$ONLY" "${LOAD[@]+"${LOAD[@]}"}" "${args[@]+"${args[@]}"}"
