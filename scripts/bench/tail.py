#!/usr/bin/env python3
"""Reads loadgen traces (bench-out/<run>/<name>/trace.jsonl) and says where prefill work went and what the
slowest-5% decodes overlapped: the figures behind BENCHMARKS.md's "Where the slowest-5% decode is lost".

    python3 scripts/bench/tail.py bench-out/<run>/agent-4-*/trace.jsonl

Per trace: computed prompt tokens (prompt less cached) by kind of turn (first turn of a session, a follow-up on
the session's previous endpoint, a follow-up that moved), the first turns over 60k computed tokens per endpoint,
and, for the slowest 5% of requests by decode speed, the other requests' prefill tokens computed on the same
endpoint during their decode (each prefill spread evenly over its dispatch-to-first-token time), by kind.
Needs traces whose requests carry their endpoint (infergate's); for a peer every request reads as one endpoint.
"""
import collections
import json
import sys

GIANT = 60_000
KINDS = ("first", "stay", "moved")


def load(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if r.get("error") is None]
    rows.sort(key=lambda r: r["sent_s"])
    last = {}
    for r in rows:
        r["computed"] = r["prompt_tokens"] - r["cached_tokens"]
        previous = last.get(r["session"], r["endpoint"])
        if r["turn"] == 0:
            r["kind"] = "first"
        else:
            r["kind"] = "stay" if previous == r["endpoint"] else "moved"
        last[r["session"]] = r["endpoint"]
        r["first_byte"] = r["sent_s"] + r["ttft_ms"] / 1000
        rate = r.get("decode_tok_s") or 0
        r["end"] = r["first_byte"] + (r["chunks"] / rate if rate > 0 else 0)
    return rows


def overlap(victim, others):
    """Prefill tokens of `others` computed during `victim`'s decode, by kind."""
    got = collections.Counter()
    for o in others:
        if o is victim or o["first_byte"] <= o["sent_s"]:
            continue
        a, b = max(o["sent_s"], victim["first_byte"]), min(o["first_byte"], victim["end"])
        if b > a:
            got[o["kind"]] += o["computed"] * (b - a) / (o["first_byte"] - o["sent_s"])
    return got


def report(path):
    rows = load(path)
    by_kind = collections.Counter()
    turns = collections.Counter()
    giants = collections.Counter()
    by_endpoint = collections.defaultdict(list)
    for r in rows:
        by_kind[r["kind"]] += r["computed"]
        turns[r["kind"]] += 1
        by_endpoint[r["endpoint"]].append(r)
        if r["kind"] == "first" and r["computed"] > GIANT:
            giants[r["endpoint"]] += 1
    decoded = sorted((r for r in rows if r.get("decode_tok_s")), key=lambda r: r["decode_tok_s"])
    slow = decoded[: max(1, len(decoded) // 20)]
    seen = collections.Counter()
    for r in slow:
        seen.update(overlap(r, by_endpoint[r["endpoint"]]))
    name = path.rstrip("/").split("/")[-2]
    print(name)
    print("  computed tokens: " + ", ".join(
        f"{k} {by_kind[k] / 1e6:.2f}M ({turns[k]} turns)" for k in KINDS) + f"; total {sum(by_kind.values()) / 1e6:.2f}M")
    print(f"  first turns over {GIANT // 1000}k computed, per endpoint: "
          + ", ".join(f"{e.rsplit(':', 1)[-1]} {giants[e]}" for e in sorted(by_endpoint)))
    print(f"  slowest 5% ({len(slow)}, mean {sum(r['decode_tok_s'] for r in slow) / len(slow):.1f} tok/s) overlapped, "
          "per request: " + ", ".join(f"{k} {seen[k] / len(slow) / 1e3:.0f}k" for k in KINDS))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        report(p)
