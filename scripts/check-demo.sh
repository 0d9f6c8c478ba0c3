#!/usr/bin/env bash
# Runs the README's demo the way a user would, non-interactively: scripts/demo.sh --no-wait on this build's debug
# binaries, on free loopback ports (the full demo: --short's 12 sessions are too few to rank the decode tail). Checks
# that the output has no escape codes (stdout is not a terminal), that the live view printed frames with prefill
# peaks, that the router made a move (migrate, rescue, spill or fallback) under the pressure moment, that the summary
# compares predicted_ttft with round_robin (TTFT p95, slowest-5% decode, cache hit share; which is ahead is measured
# in BENCHMARKS.md, never asserted here), and that no demo process is left.
# scripts/test.sh runs it after the cargo tests (about a minute and a half).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --bins --quiet
FREE=$(scripts/free-ports.py 6)
read -r -a PORTS <<<"$FREE"
OUT=$(mktemp /tmp/infergate-check-demo.XXXXXX)
trap 'rm -f "$OUT"' EXIT
status=0
DEMO_ROUTER_PORT=${PORTS[0]} DEMO_METRICS_PORT=${PORTS[1]} DEMO_ENGINE_PORTS=$(IFS=,; echo "${PORTS[*]:2:4}") \
  timeout 300 scripts/demo.sh --no-wait --bin-dir target/debug >"$OUT" 2>&1 </dev/null || status=$?
fail() { cat "$OUT"; echo "check-demo: $*" >&2; exit 1; }
[ "$status" = 0 ] || fail "scripts/demo.sh exited with $status"
if grep -q $'\x1b' "$OUT"; then fail "escape codes in output that is not a terminal"; fi
grep -q '^predicted_ttft .* elapsed.*sessions [0-9]* of 24 done' "$OUT" || fail "no progress in the live view"
grep -Eq '^127\.0\.0\.1:[0-9]+ +[0-9]+ +([0-9]+\+[0-9]+|-) +[1-9][0-9]{4,} #' "$OUT" || fail "no prefill peak of 10k+ tokens in a frame"
grep -E '^moves {2,}migrate [0-9]+, rescue [0-9]+, spill [0-9]+, fallback [0-9]+ ' "$OUT" | grep -Eq '(migrate|rescue|spill|fallback) [1-9]' ||
  fail "the summary shows no move"
grep -Eq '^ +predicted_ttft \+ sessions +round_robin$' "$OUT" || fail "no round_robin comparison"
grep -Eq '^TTFT p95 \(lower is better\) +[0-9]+ ms +[0-9]+ ms$' "$OUT" || fail "no TTFT p95 of both runs"
grep -Eq '^prefix cache hit share +[0-9.]+% +[0-9.]+%$' "$OUT" || fail "no cache hit share of both runs"
grep -Eq '^slowest 5% decode, mean +[0-9.]+ tok/s +[0-9.]+ tok/s$' "$OUT" || fail "no slowest-5% decode of both runs"
grep -Eq "^predicted_ttft \+ sessions: TTFT p95 [0-9.]+x (lower|higher) than round_robin's, slowest 5% decode [+-][0-9.]+ tok/s, prefix cache hit share [+-][0-9.]+ points\.$" "$OUT" ||
  fail "no comparison sentence under the summary"
for p in "${PORTS[@]}"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then fail "port $p still listens after the demo"; fi
done
sed -n '/^== summary/,/points\.$/p' "$OUT"
echo "check-demo: all checks passed"
