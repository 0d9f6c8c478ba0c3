#!/usr/bin/env python3
"""Reads loadgen traces (bench-out/<run>/<name>/trace.jsonl) and says what the slowest 5% of first tokens were: the
figures behind BENCHMARKS.md's "Where the TTFT tail is".

    python3 scripts/bench/ttft_tail.py bench-out/<run>/agent-4-unequal-*/trace.jsonl

Per trace: TTFT p95; the slowest 5% by kind of turn (first, headerless requests included; a follow-up that stayed, one that moved) and by the
speed of the engine that served it (`4-unequal`: the second half of the engines at half speed; `2-slowing`: the
last one, at its slowed speed; bench.sh's default knobs assumed), each with its mean computed tokens, own prefill
(computed tokens at the engine's nominal speed) and wait (the rest); the context sizes of the follow-ups among them; and the TTFT p95 with every follow-up capped at
three times the run's median follow-up TTFT (what it would be if no follow-up queued behind another request's
prefill). A peer's trace is attributed to engines as scripts/bench/tail.py does.
"""
import collections
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tail  # noqa: E402

# Wall-clock prefill tokens per second of a full-speed engine-sim engine at bench.sh's time scale (44k / 0.2).
NOMINAL = 44_000 / 0.2
HALF = 0.5
# The slowing engine after it slows (bench.sh SLOW_SPEED); its turns before that are counted at this speed too.
SLOW = 0.3


def speeds(run_dir):
    """Engine port -> speed factor, from the order engine-sim listened in (its --ports order)."""
    try:
        with open(os.path.join(run_dir, "engine-sim.log")) as f:
            ports = re.findall(r"listening on http://127\.0\.0\.1:(\d+)", f.read())
    except OSError:
        return {}
    name = os.path.basename(run_dir)
    if "unequal" in name:
        return {p: (HALF if i >= len(ports) // 2 else 1.0) for i, p in enumerate(ports)}
    if "slowing" in name:
        return {p: (SLOW if i == len(ports) - 1 else 1.0) for i, p in enumerate(ports)}
    return {p: 1.0 for p in ports}


def p95(xs):
    xs = sorted(xs)
    return xs[int(0.95 * (len(xs) - 1))] if xs else float("nan")


def mean(xs):
    return sum(xs) / max(1, len(xs))


def report(path):
    run_dir = os.path.dirname(path)
    speed = speeds(run_dir)
    rows = [r for r in tail.load(path) if r.get("ttft_ms") is not None]
    if not rows:
        print(f"{os.path.basename(run_dir)}: no requests with a first token")
        return
    rows.sort(key=lambda r: r["ttft_ms"])
    top = rows[int(0.95 * (len(rows) - 1)):]
    port = lambda r: str(r["endpoint"]).rstrip("/").rsplit(":", 1)[-1]
    groups = collections.defaultdict(list)
    for r in top:
        s = speed.get(port(r), 1.0)
        own = r["computed"] / (NOMINAL * s) * 1000
        groups[(r["kind"], s)].append((r["computed"], own, r["ttft_ms"] - own))
    served = collections.Counter(speed.get(port(r), 1.0) for r in rows)
    follow = sorted(r["ttft_ms"] for r in rows if r["turn"] > 0)
    cap = 3 * follow[len(follow) // 2] if follow else float("inf")
    capped = p95([r["ttft_ms"] if r["turn"] == 0 else min(r["ttft_ms"], cap) for r in rows])
    print(f"{os.path.basename(run_dir)}: TTFT p95 {p95([r['ttft_ms'] for r in rows]):.0f} ms over {len(rows)} requests "
          f"(served per engine speed: {dict(sorted(served.items()))})")
    for (kind, s), g in sorted(groups.items()):
        print(f"  slowest 5%, {kind} at speed {s}: {len(g)}, computed {mean([x[0] for x in g]) / 1e3:.0f}k, "
              f"own prefill {mean([x[1] for x in g]):.0f} ms, wait {mean([x[2] for x in g]):.0f} ms")
    contexts = sorted(r["prompt_tokens"] // 1000 for r in top if r["turn"] > 0)
    print(f"  contexts of the follow-ups among them (k tokens): {contexts}")
    print(f"  TTFT p95 with follow-ups capped at 3x their median ({cap:.0f} ms): {capped:.0f} ms")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        report(p)
