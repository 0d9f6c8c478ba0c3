#!/usr/bin/env python3
"""Reads loadgen traces (bench-out/<run>/<name>/trace.jsonl) and says where prefill work went and what the
slowest-5% decodes overlapped: the figures behind BENCHMARKS.md's "Where the slowest-5% decode is lost".

    python3 scripts/bench/tail.py bench-out/<run>/agent-4-*/trace.jsonl

Per trace: computed prompt tokens (prompt less cached) by kind of turn (first turn of a session, a follow-up on
the session's previous endpoint, a follow-up that moved), the first turns over 60k computed tokens per endpoint,
and, for the slowest 5% of requests by decode speed, the other requests' prefill tokens computed on the same
endpoint during their decode (each prefill spread evenly over its dispatch-to-first-token time), by kind.
A trace whose requests carry no endpoint (a peer's) is attributed from engine-sim's recorded requests that bench.sh
keeps beside it (sim-requests-<port>.json): each session's requests, in the order of their body length, are its
turns in order. Also: prefill tokens computed beside each request's decode (median, 95th and 99th percentile), how
many first turns over 20k computed tokens the slowest 5% decoded beside, and how many other streams decoded and how
many requests were in their prefill on the same engine during a decode (time-weighted), for the slowest 5% and for
all.
"""
import collections
import glob
import json
import os
import sys

GIANT = 60_000
KINDS = ("first", "stay", "moved")


def attribute(path, rows):
    """Sets each row's endpoint from engine-sim's records beside the trace; returns the rows it could attribute."""
    turns = collections.defaultdict(list)
    for f in glob.glob(os.path.join(os.path.dirname(path), "sim-requests-*.json")):
        port = f.rsplit("-", 1)[1].split(".")[0]
        with open(f) as fh:
            for rec in json.load(fh):
                session = dict(rec["headers"]).get("x-session-id")
                if "completions" in rec["path"] and session is not None:
                    turns[session].append((rec["body_len"], port))
    by_session = collections.defaultdict(list)
    for r in rows:
        by_session[r["session"]].append(r)
    kept = []
    for session, rs in by_session.items():
        ports = [p for _, p in sorted(turns.get(session, []))]
        if len(ports) == len(rs):
            for r, p in zip(sorted(rs, key=lambda r: r["turn"]), ports):
                r["endpoint"] = p
            kept += rs
    if len(kept) < len(rows):
        print(f"  ({len(rows) - len(kept)} of {len(rows)} requests not attributed to an engine: left out)")
    return kept


def load(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if r.get("error") is None]
    if any(r.get("endpoint") is None for r in rows):
        rows = attribute(path, rows)
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


def company(victim, others):
    """Other requests decoding, and in their prefill, during `victim`'s decode: time-weighted means."""
    span = victim["end"] - victim["first_byte"]
    if span <= 0:
        return 0.0, 0.0
    decoding = prefilling = 0.0
    for o in others:
        if o is victim:
            continue
        decoding += max(0.0, min(victim["end"], o["end"]) - max(victim["first_byte"], o["first_byte"]))
        prefilling += max(0.0, min(victim["end"], o["first_byte"]) - max(victim["first_byte"], o["sent_s"]))
    return decoding / span, prefilling / span


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
    beside = sorted(sum(overlap(r, by_endpoint[r["endpoint"]]).values()) for r in decoded)
    pct = lambda q: beside[int(q * (len(beside) - 1))] / 1e3
    big = [sum(1 for o in by_endpoint[r["endpoint"]] if o is not r and o["kind"] == "first"
               and o["computed"] > 20_000 and o["sent_s"] < r["end"] and o["first_byte"] > r["first_byte"])
           for r in slow]
    mean = lambda xs: sum(xs) / max(1, len(xs))
    slow_company = [company(r, by_endpoint[r["endpoint"]]) for r in slow]
    all_company = [company(r, by_endpoint[r["endpoint"]]) for r in decoded]
    name = path.rstrip("/").split("/")[-2]
    print(name)
    print("  computed tokens: " + ", ".join(
        f"{k} {by_kind[k] / 1e6:.2f}M ({turns[k]} turns)" for k in KINDS) + f"; total {sum(by_kind.values()) / 1e6:.2f}M")
    print(f"  first turns over {GIANT // 1000}k computed, per endpoint: "
          + ", ".join(f"{e.rsplit(':', 1)[-1]} {giants[e]}" for e in sorted(by_endpoint)))
    print(f"  slowest 5% ({len(slow)}, mean {sum(r['decode_tok_s'] for r in slow) / len(slow):.1f} tok/s) overlapped, "
          "per request: " + ", ".join(f"{k} {seen[k] / len(slow) / 1e3:.0f}k" for k in KINDS))
    print(f"  prefill computed beside a decode: median {pct(0.5):.0f}k, p95 {pct(0.95):.0f}k, p99 {pct(0.99):.0f}k; "
          f"the slowest 5% decoded beside {sum(big) / len(slow):.2f} first turns over 20k each")
    print(f"  the slowest 5% lasted {mean([r['end'] - r['first_byte'] for r in slow]):.2f} s ({mean([r['chunks'] for r in slow]):.0f} "
          f"chunks), beside {mean([d for d, _ in slow_company]):.1f} streams decoding and "
          f"{mean([p for _, p in slow_company]):.1f} requests in their prefill (all decodes: "
          f"{mean([d for d, _ in all_company]):.1f} and {mean([p for _, p in all_company]):.1f})")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        report(p)
