#!/usr/bin/env bash
# NIXL for vLLM's NixlConnector (the disaggregated prefill/decode real-engine test): PyPI's nixl and its CUDA 13
# build, the one its loader picks beside vLLM's torch (it detects CUDA 13 from torch's wheels; no GPU is used: its
# UCX backend moves the KV cache between CPU buffers over loopback). Installed next to the vLLM venv, not in it, so
# the venv's pins and name stay as they are; the engines that need it get it on PYTHONPATH. ~230 MB, once.
# Prints one line for `eval`: VLLM_NIXL_PATH=...
set -euo pipefail
cd "$(dirname "$0")/../.."
NIXL_VERSION=1.5.1
eval "$(scripts/ensure-vllm.sh)"
DIR=$(dirname "$(dirname "$(dirname "$VLLM_PYTHON")")")/nixl-$NIXL_VERSION
if [ ! -f "$DIR/.complete" ]; then
  echo "== ensure-nixl: installing nixl==$NIXL_VERSION and nixl-cu13==$NIXL_VERSION into $DIR" >&2
  rm -rf "$DIR"
  "$(dirname "$VLLM_PYTHON")/pip" install -q --disable-pip-version-check --no-deps --target "$DIR" \
    "nixl==$NIXL_VERSION" "nixl-cu13==$NIXL_VERSION" >&2
  PYTHONPATH=$DIR "$VLLM_PYTHON" -c 'from nixl._api import nixl_agent' >&2
  touch "$DIR/.complete"
fi
echo "VLLM_NIXL_PATH=$DIR"
