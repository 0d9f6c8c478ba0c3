#!/usr/bin/env python3
"""Turns the JSON reports of one scripts/bench.sh run (bench-out/STAMP/) into BENCHMARKS.md.

Usage: report.py --out-dir DIR --md FILE [--elapsed S --time-scale F ...] (bench.sh passes everything).
Standard library only.
"""

import argparse
import datetime
import glob
import json
import os
import platform
import re
import statistics
import subprocess

PEERS = ("vllm-router", "smg")
# Placement reasons that send a session's turn off its bound endpoint.
MOVES = ("spill", "migrate", "rescue")


def sh(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:  # noqa: BLE001 - best effort machine facts
        return ""


def machine():
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = "%.1f GiB" % (int(line.split()[1]) / 1024 / 1024)
                    break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu or platform.processor() or "unknown",
        "memory": mem or "unknown",
        "kernel": platform.release(),
        "rustc": sh("rustc", "--version"),
        "commit": sh("git", "rev-parse", "--short", "HEAD"),
        "dirty": bool(sh("git", "status", "--porcelain", "--untracked-files=no")),
    }


def load(out_dir, prefix):
    runs = []
    for path in sorted(glob.glob(os.path.join(out_dir, prefix + "*.json"))):
        with open(path) as f:
            try:
                d = json.load(f)
            except json.JSONDecodeError as e:
                d = {"label": os.path.basename(path), "failed": "unreadable report: %s" % e}
        d["_file"] = os.path.basename(path)
        label = d.get("label", "")
        parts = label.split("|")
        if len(parts) == 3:
            d["_router"], d["_policy"], d["_fleet"] = parts
        else:
            d["_router"], d["_policy"], d["_fleet"] = d["_file"], "", ""
        runs.append(d)
    return runs


def f(x, nd=1):
    if x is None:
        return "-"
    return ("%%.%df" % nd) % x


def pct(d, key, field):
    p = d.get(key) or {}
    return p.get(field)


POLICY_ORDER = [
    "pass-through",
    "round_robin",
    "least_request",
    "load_aware",
    "load_aware/nostats",
    "predicted_ttft",
    "predicted_ttft/nostats",
    "prefix_aware:least_inflight",
    "prefix_aware:qps",
    "power_of_two",
    "cache_aware",
    "consistent_hash",
]


def order_key(d):
    routers = {"floor": -1, "infergate": 0, "vllm-router": 1, "smg": 2}
    pol = d["_policy"]
    return (routers.get(d["_router"], 9), POLICY_ORDER.index(pol) if pol in POLICY_ORDER else 99, pol)


def agent_section(runs, fleet, seed):
    rows = sorted(
        [d for d in runs if d["_fleet"] == str(fleet) and str(d.get("seed")) == str(seed)], key=order_key
    )
    out = []
    out.append("### %s engines (seed %s)\n" % (fleet, seed))
    out.append(
        "| router | policy | requests | errors | TTFT p50 ms | TTFT p95 ms | TTFT p99 ms | slowest-5% decode tok/s "
        "| decode p5 tok/s | request-share CV | computed-token-share CV | cache hit % | TTFT p95 / best peer "
        "| slowest-5% decode / best peer |"
    )
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    bp_t = best_peer(rows, p95, True)
    bp_d = best_peer(rows, slow, False)

    def ratio(d, val, bp):
        if bp is None or not val(bp) or val(d) is None:
            return "-"
        return "%.2f" % (val(d) / val(bp))

    for d in rows:
        if "failed" in d:
            out.append("| %s | %s | failed: %s |||||||||||" % (d["_router"], d["_policy"], d["failed"].replace("|", "/")))
            continue
        eng = d.get("engines") or {}
        dec = d.get("decode") or {}
        errs = d.get("errors", 0) + d.get("unfinished", 0)
        err_txt = str(errs)
        if d.get("error_kinds"):
            err_txt += " " + ", ".join("%s×%d" % (k, v) for k, v in sorted(d["error_kinds"].items()))
        if d.get("unfinished"):
            err_txt += " (%d unfinished)" % d["unfinished"]
        if d.get("timed_out"):
            err_txt += " TIMED OUT"
        out.append(
            "| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |"
            % (
                d["_router"],
                d["_policy"],
                d.get("requests", 0),
                err_txt,
                f(pct(d, "ttft_ms", "p50")),
                f(pct(d, "ttft_ms", "p95")),
                f(pct(d, "ttft_ms", "p99")),
                f(dec.get("slowest5_mean_tok_s")),
                f(dec.get("p5_tok_s")),
                f(eng.get("request_cv"), 3),
                f(eng.get("computed_cv"), 3),
                f((eng.get("cache_hit_share") or 0) * 100, 1) if eng else "-",
                ratio(d, p95, bp_t),
                ratio(d, slow, bp_d),
            )
        )
    out.append("")
    return out, rows


def placements(out_dir, d):
    """infergate's placements_total by reason, from the router metrics saved next to the run (or None)."""
    path = os.path.join(out_dir, d["_file"][: -len(".json")], "router-metrics.txt")
    counts = {}
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith("infergate_placements_total{") and 'reason="' in line:
                    reason = line.split('reason="', 1)[1].split('"', 1)[0]
                    counts[reason] = counts.get(reason, 0) + float(line.rsplit(" ", 1)[1])
    except (OSError, ValueError, IndexError):
        return None
    return counts or None


def placement_section(out_dir, runs, fleet, seed):
    rows = [
        d
        for d in sorted(runs, key=order_key)
        if d["_router"] == "infergate" and d["_fleet"] == str(fleet) and str(d.get("seed")) == str(seed) and "failed" not in d
    ]
    table = []
    reasons = []
    for d in rows:
        c = placements(out_dir, d)
        if c:
            table.append((d, c))
            reasons.extend(r for r in c if r not in reasons)
    if not table:
        return []
    out = ["infergate placement reasons (`infergate_placements_total`, %s engines, seed %s):\n" % (fleet, seed)]
    out.append("| policy | " + " | ".join(reasons) + " | moved (spill + migrate + rescue) |")
    out.append("|---|" + "---:|" * (len(reasons) + 1))
    for d, c in table:
        total = sum(c.values())
        moved = sum(c.get(r, 0) for r in MOVES)
        out.append(
            "| %s | %s | %s |"
            % (
                d["_policy"],
                " | ".join("%d" % c.get(r, 0) for r in reasons),
                "%d (%.1f%% of placements)" % (moved, 100.0 * moved / total) if total and any(r in c for r in MOVES) else "-",
            )
        )
    out.append("")
    return out


def best_peer(rows, value, lower_is_better):
    cands = [d for d in rows if d["_router"] in PEERS and "failed" not in d and value(d) is not None]
    if not cands:
        return None
    return (min if lower_is_better else max)(cands, key=value)


def diagnose(la_runs, peer_runs):
    """Measured differences (means over the runs) that bear on a miss: cache reuse, evenness of the work."""

    def m(runs, key):
        return mean([(d.get("engines") or {}).get(key) for d in runs])

    hints = []
    lh, ph = m(la_runs, "cache_hit_share"), m(peer_runs, "cache_hit_share")
    if lh is not None and ph is not None and lh < ph - 0.02:
        hints.append("fewer prefix-cache hits (%.1f%% vs %.1f%%)" % (lh * 100, ph * 100))
    lc, pc = m(la_runs, "computed_cv"), m(peer_runs, "computed_cv")
    if lc is not None and pc is not None and lc > pc + 0.05:
        hints.append("less even uncached prefill across engines (computed-token CV %.3f vs %.3f)" % (lc, pc))
    lr, pr = m(la_runs, "request_cv"), m(peer_runs, "request_cv")
    if lr is not None and pr is not None and lr > pr + 0.05:
        hints.append("less even request counts (CV %.3f vs %.3f)" % (lr, pr))
    if not hints:
        return "; not explained by cache reuse or evenness (both match the peer's within the margins used here)"
    return "; measured differences from the peer: " + "; ".join(hints)


def p95(d):
    return pct(d, "ttft_ms", "p95")


def slow(d):
    return (d.get("decode") or {}).get("slowest5_mean_tok_s")


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def compare_section(runs, fleet, targets):
    """load_aware against the best peer, per metric, averaged over every seed each configuration ran with."""
    groups = {}
    for d in runs:
        if d["_fleet"] == str(fleet) and "failed" not in d:
            groups.setdefault((d["_router"], d["_policy"]), []).append(d)
    out = []
    nseeds = max((len(v) for v in groups.values()), default=0)
    # Configurations measured with every seed take part; with a single seed, every configuration does.
    full = {k: v for k, v in groups.items() if len(v) == nseeds}
    seeds = sorted({str(d.get("seed")) for v in full.values() for d in v}, key=lambda x: int(x) if x.isdigit() else 0)
    if nseeds > 1:
        out.append("#### Repeated seeds (%s engines): seeds %s\n" % (fleet, ", ".join(seeds)))
        out.append(
            "| router | policy | "
            + " | ".join("TTFT p95 s%s" % x for x in seeds)
            + " | TTFT p95 mean | "
            + " | ".join("slowest-5%% s%s" % x for x in seeds)
            + " | slowest-5% mean |"
        )
        out.append("|---|---|" + "---:|" * (2 * len(seeds) + 2))
        for (router, policy), v in sorted(full.items(), key=lambda kv: order_key(kv[1][0])):
            by_seed = {str(d.get("seed")): d for d in v}
            out.append(
                "| %s | %s | %s | %s | %s | %s |"
                % (
                    router,
                    policy,
                    " | ".join(f(p95(by_seed[x])) if x in by_seed else "-" for x in seeds),
                    f(mean([p95(d) for d in v])),
                    " | ".join(f(slow(by_seed[x])) if x in by_seed else "-" for x in seeds),
                    f(mean([slow(d) for d in v])),
                )
            )
        out.append("")
    basis = "mean of seeds %s" % ", ".join(seeds) if nseeds > 1 else "one seed"
    out.append("#### infergate load_aware against the best peer (%s engines, %s)\n" % (fleet, basis))
    out.append("| metric | infergate load_aware | best peer | ratio | target | result |")
    out.append("|---|---:|---|---:|---|---|")
    la = full.get(("infergate", "load_aware"))
    if not la:
        out.append("| - | load_aware did not run with every seed | | | | not measured |")
        targets.append(("load_aware against the best peer (%s engines)" % fleet, "not measured", "load_aware run missing"))
        out.append("")
        return out
    peers = {k: v for k, v in full.items() if k[0] in PEERS}
    for name, val, lower, cmp_txt, ok_fn in (
        ("TTFT p95 (ms)", p95, True, "≤ 0.80", lambda r: r <= 0.8),
        ("slowest-5% decode (tok/s)", slow, False, "≥ 1.00", lambda r: r >= 1.0),
    ):
        label = "load_aware %s %s× best peer (%s engines)" % (name, cmp_txt, fleet)
        scored = [(k, mean([val(d) for d in v])) for k, v in peers.items()]
        scored = [x for x in scored if x[1] is not None]
        if not scored:
            out.append("| %s | %s | no peer measured | | %s | not measured |" % (name, f(mean([val(d) for d in la])), cmp_txt))
            targets.append((label, "not measured", "no peer ran"))
            continue
        (br, bpol), bval = (min if lower else max)(scored, key=lambda x: x[1])
        lval = mean([val(d) for d in la])
        ratio = lval / bval if bval else None
        errors = sum(d.get("errors", 0) + d.get("unfinished", 0) for d in la) > 0
        res = "met" if ratio is not None and ok_fn(ratio) and not errors else "missed"
        out.append("| %s | %s | %s %s: %s | %s | %s | %s |" % (name, f(lval), br, bpol, f(bval), f(ratio, 2), cmp_txt, res))
        why = "ratio %s over %s (load_aware %s vs %s %s %s)" % (f(ratio, 2), basis, f(lval), br, bpol, f(bval))
        if nseeds > 1:
            per_seed = []
            la_by = {str(d.get("seed")): d for d in la}
            bp_by = {str(d.get("seed")): d for d in full[(br, bpol)]}
            for x in seeds:
                if x in la_by and x in bp_by and val(la_by[x]) and val(bp_by[x]):
                    per_seed.append("%s" % f(val(la_by[x]) / val(bp_by[x]), 2))
            why += "; per seed %s" % ", ".join(per_seed)
        if errors:
            why += "; load_aware had errors"
        if res == "missed":
            why += diagnose(la, full[(br, bpol)])
        targets.append((label, res, why))
    out.append("")
    return out


def followup(d):
    return pct(d, "ttft_followup_ms", "p95")


def cache_hit(d):
    return (d.get("engines") or {}).get("cache_hit_share")


def computed_spread(d):
    """Largest over smallest per-engine computed (uncached) prompt tokens."""
    eng = (d.get("engines") or {}).get("engines") or []
    xs = [e.get("computed_prompt_tokens") for e in eng if e.get("computed_prompt_tokens") is not None]
    if len(xs) < 2 or min(xs) <= 0:
        return None
    return max(xs) / min(xs)


def goals(fleet):
    """Issue 26's targets against the best peer for one fleet: (name, value, lower is better, target, met(ratio),
    goal). Fleets of unequal or changing speed (`4-unequal`, `2-slowing`) have tighter TTFT and decode targets."""
    changing = "-" in str(fleet)
    ttft, decode = (0.5, 1.1) if changing else (0.75, 1.0)
    return (
        ("TTFT p95", p95, True, "≤ %.2f×" % ttft, lambda r: r <= ttft, ttft),
        ("follow-up TTFT p95", followup, True, "≤ 0.75×", lambda r: r <= 0.75, 0.75),
        ("slowest-5% decode", slow, False, "≥ %.2f×" % decode, lambda r: r >= decode, decode),
        ("cache hit share", cache_hit, False, "≥ 0.98×", lambda r: r >= 0.98, 0.98),
    )


# The equal-fleet targets, for the tables that name no fleet.
ISSUE13 = goals(2)


def scenario_section(out_dir, scenario, runs, fleet, targets):
    """Every configuration of one scenario and fleet, means over the seeds it ran with, ratios to the best peer
    per metric (best by mean), per-seed ratios, and issue 26's targets for each infergate configuration."""
    ISSUE13 = goals(fleet)
    groups = {}
    for d in runs:
        if d["_fleet"] == str(fleet) and "failed" not in d:
            groups.setdefault((d["_router"], d["_policy"]), []).append(d)
    failed = [d for d in runs if d["_fleet"] == str(fleet) and "failed" in d]
    if not groups:
        return []
    seeds = sorted({str(d.get("seed")) for v in groups.values() for d in v}, key=lambda x: int(x) if x.isdigit() else 0)
    out = ["### %s, fleet %s (seeds %s)\n" % (scenario, fleet, ", ".join(seeds))]
    out.append(
        "| router | policy | runs | errors | TTFT p95 ms | follow-up TTFT p95 ms | slowest-5% decode tok/s "
        "| cache hit % | computed tokens max/min engine | TTFT p95 / best peer | follow-up / best peer "
        "| decode / best peer |"
    )
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    peers = {k: v for k, v in groups.items() if k[0] in PEERS}

    def best(val, lower):
        scored = [(k, mean([val(d) for d in v])) for k, v in peers.items()]
        scored = [x for x in scored if x[1] is not None]
        if not scored:
            return None
        return (min if lower else max)(scored, key=lambda x: x[1])

    bests = {name: best(val, lower) for name, val, lower, *_ in ISSUE13}

    def ratio(v, name, val):
        b = bests.get(name)
        m = mean([val(d) for d in v])
        if b is None or not b[1] or m is None:
            return None
        return m / b[1]

    for key, v in sorted(groups.items(), key=lambda kv: order_key(kv[1][0])):
        errs = sum(d.get("errors", 0) + d.get("unfinished", 0) for d in v)
        out.append(
            "| %s | %s | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s |"
            % (
                key[0],
                key[1],
                len(v),
                errs,
                f(mean([p95(d) for d in v])),
                f(mean([followup(d) for d in v])),
                f(mean([slow(d) for d in v])),
                f((mean([cache_hit(d) for d in v]) or 0) * 100, 1),
                f(mean([computed_spread(d) for d in v]), 2),
                f(ratio(v, "TTFT p95", p95), 2),
                f(ratio(v, "follow-up TTFT p95", followup), 2),
                f(ratio(v, "slowest-5% decode", slow), 2),
            )
        )
    for d in failed:
        out.append("| %s | %s | failed: %s |||||||||||" % (d["_router"], d["_policy"], d["failed"].replace("|", "/")))
    out.append("")
    out.append(
        "Best peer per metric (mean over the seeds): "
        + "; ".join(
            "%s %s %s %s" % (name, b[0][0], b[0][1], f(b[1] * (100 if name == "cache hit share" else 1)))
            for name, b in bests.items()
            if b
        )
        + ".\n"
    )
    # Per-seed ratios of each infergate configuration against the best peer of that metric.
    out.append("| infergate policy | metric | " + " | ".join("s%s" % x for x in seeds) + " | mean ratio | target | result |")
    out.append("|---|---|" + "---:|" * len(seeds) + "---:|---|---|")
    for key, v in sorted(groups.items(), key=lambda kv: order_key(kv[1][0])):
        if key[0] != "infergate":
            continue
        by = {str(d.get("seed")): d for d in v}
        for name, val, lower, txt, ok, goal in ISSUE13:
            b = bests.get(name)
            if not b:
                continue
            bby = {str(d.get("seed")): d for d in peers[b[0]]}
            per = []
            for x in seeds:
                if x in by and x in bby and val(by[x]) is not None and val(bby[x]):
                    per.append(val(by[x]) / val(bby[x]))
                else:
                    per.append(None)
            r = ratio(v, name, val)
            worst_ok = all(
                p is None or (p <= goal + 0.1 if lower else p >= goal - 0.1) for p in per
            )
            res = "met" if r is not None and ok(r) and worst_ok else "missed"
            out.append(
                "| %s | %s | %s | %s | %s | %s |"
                % (key[1], name, " | ".join(f(p, 2) for p in per), f(r, 2), txt, res)
            )
            targets.append(
                (
                    "%s %s: %s %s best peer (fleet %s)" % (scenario, key[1], name, txt, fleet),
                    res,
                    "mean ratio %s vs %s %s; per seed %s" % (f(r, 2), b[0][0], b[0][1], ", ".join(f(p, 2) for p in per)),
                )
            )
    out.append("")
    # Placement reasons and the share of turns that moved, summed over the seeds.
    rows = []
    reasons = []
    for key, v in sorted(groups.items(), key=lambda kv: order_key(kv[1][0])):
        if key[0] != "infergate":
            continue
        total = {}
        for d in v:
            for r, n in (placements(out_dir, d) or {}).items():
                total[r] = total.get(r, 0) + n
        if total:
            rows.append((key[1], total))
            reasons.extend(r for r in total if r not in reasons)
    if rows:
        out.append(
            "infergate placement reasons (`infergate_placements_total`, summed over the seeds); turns moved: spills "
            "migrations and rescues over the follow-up turns (sticky + spill + migrate + rescue):\n"
        )
        out.append("| policy | " + " | ".join(reasons) + " | turns moved |")
        out.append("|---|" + "---:|" * (len(reasons) + 1))
        for pol, c in rows:
            moved = sum(c.get(r, 0) for r in MOVES)
            follow = moved + c.get("sticky", 0)
            out.append(
                "| %s | %s | %s |"
                % (
                    pol,
                    " | ".join("%d" % c.get(r, 0) for r in reasons),
                    "%d of %d (%.1f%%)" % (moved, follow, 100.0 * moved / follow) if follow else "-",
                )
            )
        out.append("")
    return out


def in_flight_after(b):
    bg, burst = b.get("background_split", []), b.get("burst_split", [])
    return [x + y for x, y in zip(bg, burst)]


def burst_section(runs, targets):
    out = ["## Burst: 8 new long sessions in 100 ms on 2 busy engines (infergate prefix_aware)\n"]
    if not runs:
        out.append("Not run.\n")
        return out
    out.append(
        "Each run: fresh engines; 4 long-running background streams started one by one through the router; one "
        "warm-up session of 12 short turns (it sticks to one engine, so that engine gets a high recent request "
        "count); then 8 new sessions with 60k–100k-token first turns within 100 ms. Splits are per engine, read "
        "from each engine's `/sim/stats` request-count deltas around each phase.\n"
    )
    out.append(
        "| fallback | seed | background split | warm-up split | burst split | in flight after the burst "
        "(background + burst) | burst TTFT p50 ms | burst TTFT max ms |"
    )
    out.append("|---|---:|---|---|---|---|---:|---:|")
    by_fb = {}
    for d in sorted(runs, key=lambda d: d["_file"]):
        fb = d["_policy"].split(":")[-1] if d["_policy"] else d["_file"]
        seed = d.get("seed", "-")
        if "failed" in d:
            out.append("| %s | | failed: %s | | | | | |" % (fb, d["failed"].replace("|", "/")))
            continue
        b = d.get("burst") or {}
        by_fb.setdefault(fb, []).append(b)
        out.append(
            "| %s | %s | %s | %s | **%s** | %s | %s | %s |"
            % (
                fb,
                seed,
                "/".join(map(str, b.get("background_split", []))),
                "/".join(map(str, b.get("warm_split", []))),
                b.get("split", "-"),
                "/".join(map(str, in_flight_after(b))),
                f(pct(b, "burst_ttft_ms", "p50")),
                f(pct(b, "burst_ttft_ms", "max")),
            )
        )
    out.append("")
    li = by_fb.get("least_inflight", [])
    qps = by_fb.get("qps", [])
    even = sum(1 for b in li if b.get("split") == "4/4")
    if li:
        res = "met" if even == len(li) else "missed"
        worst = max(li, key=lambda b: b.get("max_share", 0))
        totals_even = sum(1 for b in li if in_flight_after(b) and max(in_flight_after(b)) - min(in_flight_after(b)) <= 2)
        detail = "4/4 in %d of %d seeds (worst %s, after a %s background split)" % (
            even,
            len(li),
            worst.get("split"),
            "/".join(map(str, worst.get("background_split", []))),
        )
        if res == "missed":
            detail += (
                ". The fallback picks at random among endpoints within +1 request of the least loaded, so it evens "
                "the total in flight (background + burst: within 2 in %d of %d seeds), not the burst alone; the "
                "same slack had already split the 4 background streams unevenly in some seeds" % (totals_even, len(li))
            )
        targets.append(("burst splits 4/4 with prefix_aware + least_inflight", res, detail))
    if qps:
        skewed = sum(1 for b in qps if b.get("max_share", 0) > 0.5)
        targets.append(
            (
                "qps fallback shows the skew",
                "met" if skewed == len(qps) else ("partly" if skewed else "missed"),
                "skewed in %d of %d seeds (splits %s)" % (skewed, len(qps), ", ".join(b.get("split", "-") for b in qps)),
            )
        )
    return out


def overhead_pass(d):
    """Which pass of the overhead list a run belongs to (OVERHEAD_REPEAT): 1 unless its file says `-passN`."""
    m = re.search(r"-pass(\d+)\.json$", d.get("_file", ""))
    return int(m.group(1)) if m else 1


def floor_ratios(runs, targets, cpu):
    """Each infergate policy's router CPU per request over the floor's of the same pass: the median and range over
    the passes, and issue 26's target for the recommended policy (at most 1.2x)."""
    floors = {overhead_pass(d): cpu(d) for d in runs if d["_router"] == "floor" and "failed" not in d and cpu(d)}
    out = []
    for policy in sorted({d["_policy"] for d in runs if d["_router"] == "infergate"}):
        ratios = sorted(
            cpu(d) / floors[overhead_pass(d)]
            for d in runs
            if d["_router"] == "infergate" and d["_policy"] == policy and "failed" not in d and cpu(d)
            and overhead_pass(d) in floors
        )
        if not ratios:
            continue
        mid = statistics.median(ratios)
        out.append(
            "- infergate %s over the floor of the same pass, router CPU per request: median **%s×** over %d pass%s (%s)"
            % (policy, f(mid, 2), len(ratios), "" if len(ratios) == 1 else "es", ", ".join(f(r, 2) for r in ratios))
        )
        if policy == "predicted_ttft":
            res = "met" if mid <= 1.2 else "missed"
            targets.append(
                (
                    "overhead: infergate predicted_ttft router CPU ≤ 1.2× the floor's",
                    res,
                    "median %s× over %d pass%s" % (f(mid, 2), len(ratios), "" if len(ratios) == 1 else "es"),
                )
            )
    if out:
        out.append("")
    return out


def overhead_section(runs, targets, args):
    out = ["## Router overhead: tiny non-streaming requests, 1 engine, no simulated time\n"]
    if not runs:
        out.append("Not run.\n")
        return out
    out.append(
        "One engine-sim engine with `--time-scale 0` (answers at once), `max_tokens: 1`, %s concurrent workers, "
        "%s requests per target split into 2 rounds that alternate direct → router. Router CPU is user+system time "
        "of the router's process tree from `/proc/PID/stat` during the router phases. Everything (load generator, "
        "router, engine) shares the same %s cores, so requests/s is a CPU-bound figure.\n"
        % (args.overhead_concurrency, args.overhead_requests, os.cpu_count())
    )
    cpu = lambda d: (d.get("overhead") or {}).get("router_cpu_us_per_request")  # noqa: E731
    groups = {}
    for d in runs:
        groups.setdefault((d["_router"], d["_policy"]), []).append(d)
    passes = max(len(g) for g in groups.values())
    if passes > 1:
        out.append(
            "The list ran %d times, each time with fresh processes (`OVERHEAD_REPEAT`): a row is the pass with the "
            "median router CPU per request, and the CPU range spans every pass.\n" % passes
        )
    out.append(
        "| router | policy | direct req/s | router req/s | router/direct | direct p50 ms | router p50 ms | added p50 ms "
        "| added p99 ms | router CPU µs/request | router CPU cores | errors |" + (" CPU µs range |" if passes > 1 else "")
    )
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if passes > 1 else ""))
    for key in sorted(groups, key=lambda k: order_key(groups[k][0])):
        g = groups[key]
        ok_runs = sorted((d for d in g if "failed" not in d and cpu(d) is not None), key=cpu)
        if not ok_runs:
            d = g[0]
            out.append("| %s | %s | failed: %s ||||||||||" % (d["_router"], d["_policy"], d.get("failed", "no figure").replace("|", "/")))
            continue
        d = ok_runs[(len(ok_runs) - 1) // 2]
        o = d.get("overhead") or {}
        dr = o.get("direct") or {}
        rr = o.get("router") or {}
        row = "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d |" % (
            d["_router"],
            d["_policy"],
            f(dr.get("requests_per_s"), 0),
            f(rr.get("requests_per_s"), 0),
            f(o.get("rps_ratio"), 2),
            f(pct(dr, "latency_ms", "p50"), 3),
            f(pct(rr, "latency_ms", "p50"), 3),
            f(o.get("added_p50_ms"), 3),
            f(o.get("added_p99_ms"), 3),
            f(o.get("router_cpu_us_per_request"), 1),
            f(o.get("router_cpu_cores"), 2),
            (dr.get("errors") or 0) + (rr.get("errors") or 0),
        )
        if passes > 1:
            row += " %s–%s (%d of %d) |" % (f(cpu(ok_runs[0]), 1), f(cpu(ok_runs[-1]), 1), len(ok_runs), len(g))
        out.append(row)
    out.append("")
    out.extend(floor_ratios(runs, targets, cpu))
    ok = [d for d in runs if "failed" not in d]
    ig = next((d for d in ok if d["_router"] == "infergate" and d["_policy"] == "load_aware"), None)
    vr = [d for d in ok if d["_router"] == "vllm-router"]
    rps = lambda d: ((d.get("overhead") or {}).get("router") or {}).get("requests_per_s") or 0  # noqa: E731
    if ig and vr:
        best_vr = max(vr, key=rps)
        ratio = rps(ig) / rps(best_vr) if rps(best_vr) else None
        res = "met" if ratio is not None and ratio >= 1.3 else "missed"
        detail = "infergate load_aware %s req/s vs vllm-router %s %s req/s: %s×" % (
            f(rps(ig), 0),
            best_vr["_policy"],
            f(rps(best_vr), 0),
            f(ratio, 2),
        )
        if cpu(ig) and cpu(best_vr):
            detail += "; router CPU per request %s µs vs %s µs (%s× less)" % (
                f(cpu(ig), 1),
                f(cpu(best_vr), 1),
                f(cpu(best_vr) / cpu(ig), 2),
            )
            if res == "missed":
                detail += (
                    ". The load generator and the engine share the same cores and cost the same per request behind "
                    "either router, which compresses the requests/s ratio below the CPU ratio"
                )
        targets.append(("overhead: infergate req/s ≥ 1.3× vllm-router's", res, detail))
    else:
        targets.append(("overhead: infergate req/s ≥ 1.3× vllm-router's", "not measured", "a run is missing"))
    if ig:
        added = (ig.get("overhead") or {}).get("added_p50_ms")
        res = "met" if added is not None and added < 0.5 else "missed"
        targets.append(("overhead: infergate added p50 < 0.5 ms", res, "added p50 %s ms (load_aware)" % f(added, 3)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--md", required=True)
    ap.add_argument("--elapsed", type=int, default=0)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--sessions-per-engine", default="?")
    ap.add_argument("--rate-per-engine", default="?")
    ap.add_argument("--output-tokens", default="?")
    ap.add_argument("--seed", default="?")
    ap.add_argument("--repeat-seeds", default="")
    ap.add_argument("--fleets", default="2 4")
    ap.add_argument("--burst-seeds", default="")
    ap.add_argument("--overhead-requests", default="?")
    ap.add_argument("--overhead-concurrency", default="?")
    ap.add_argument("--engine-stats-interval", default="?")
    ap.add_argument("--quick", default="0")
    ap.add_argument("--scenario-tables", default="0", help="1: per-scenario means over seeds against the peers")
    args = ap.parse_args()

    m = machine()
    peers = ""
    try:
        with open(os.path.join(args.out_dir, "peers.txt")) as fh:
            peers = fh.read().strip()
    except OSError:
        pass
    ts = args.time_scale
    agent = load(args.out_dir, "agent-")
    burst = load(args.out_dir, "burst-")
    overhead = load(args.out_dir, "overhead-")
    targets = []

    L = []
    L.append("# Benchmarks\n")
    L.append(
        "Generated by `scripts/bench.sh`%s on %s (the matrix took %d min %d s). Raw JSON reports and logs: "
        "`bench-out/%s/` (not committed). Re-run with `scripts/bench.sh`; this file is overwritten.\n"
        % (
            " --quick (reduced matrix)" if args.quick == "1" else "",
            datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            args.elapsed // 60,
            args.elapsed % 60,
            os.path.basename(os.path.normpath(args.out_dir)),
        )
    )
    L.append("## Machine\n")
    L.append("- %s cores: %s" % (m["nproc"], m["cpu"]))
    L.append("- memory %s, Linux %s" % (m["memory"], m["kernel"]))
    L.append("- %s; infergate at commit %s%s" % (m["rustc"], m["commit"], " with uncommitted changes" if m["dirty"] else ""))
    L.append("- peers (PyPI, `.venv/`): %s\n" % ("; ".join(peers.splitlines()) if peers else "none"))

    L.append("## Setup\n")
    L.append(
        "- **Engines**: `engine-sim` (one process, one simulated vLLM engine per port; vLLM V1 scheduler timing: "
        "8,192-token step budget, 44k prefill tokens/s, 18 ms per step + 0.25 ms per decoding sequence, prefix "
        "cache) with `--time-scale %s`: every simulated duration is multiplied by %s. **All figures below are "
        "wall-clock**: divide a time by %s (multiply a rate by %s) to get the simulated engine's own time base."
        % (ts, ts, ts, ts)
    )
    L.append(
        "- **Agent traffic** (`loadgen --scenario agent`, seed %s; the headline configurations again with seeds "
        "%s): %s sessions per engine arriving as a Poisson "
        "process at %s sessions per simulated second per engine; first turns bimodal (64%% of 1k–5k tokens, 16%% of "
        "50k–140k, the rest log-uniform between); 3–8 later turns each append 200–3,000 tokens after a 0.5–3 s "
        "(simulated) think time; `max_tokens` %s per request; streamed; every request carries `x-session-id`; the "
        "text is unique per session (prefix caches hit only within a session)."
        % (args.seed, args.repeat_seeds or "none", args.sessions_per_engine, args.rate_per_engine, args.output_tokens)
    )
    L.append(
        "- **Routers**: infergate release build (2 worker threads, `engine_stats` every %s; `load_aware` with "
        "`sessions: {header: x-session-id}`; `least_request` is load_aware without prefill tokens or sessions). "
        "vllm-router and smg with their CLI defaults apart from `--policy` (vllm-router `consistent_hash` keys on "
        "`X-Session-ID`)." % args.engine_stats_interval
    )
    L.append(
        "- **Isolation**: each run gets fresh engines (empty prefix caches) and a fresh router on free loopback "
        "ports; before measuring, `ss -ltnp` confirmed the port belonged to the process just started (see each "
        "run's `owners.txt`); everything is stopped after each run."
    )
    L.append(
        "- **Columns**: TTFT = send to first SSE `data:` chunk; slowest-5% decode = mean per-request decode rate "
        "((chunks−1)/(last−first chunk time)) of the slowest 5% of requests; CV = coefficient of variation "
        "(σ/mean) of per-engine request counts and of per-engine computed (uncached) prompt tokens from each "
        "engine's `/sim/stats`; cache hit % = cached / prompt tokens over all engines.\n"
    )

    fleets = [x for x in args.fleets.split() if x]
    if args.scenario_tables == "1":
        # Issue 13's comparison: each scenario against the peers, means over the seeds.
        for sc in ("agent", "shared-prefix", "mixed"):
            runs = load(args.out_dir, sc + "-")
            for fl in fleets:
                L.extend(scenario_section(args.out_dir, sc, runs, fl, targets))
    else:
        L.append("## Agent scenario\n")
        for fl in fleets:
            sec, rows = agent_section(agent, fl, args.seed)
            L.extend(sec)
            L.extend(placement_section(args.out_dir, agent, fl, args.seed))
            L.extend(compare_section(agent, fl, targets))
    L.extend(burst_section(burst, targets))
    L.extend(overhead_section(overhead, targets, args))

    L.append("## Targets\n")
    L.append("| target | result | detail |")
    L.append("|---|---|---|")
    for name, res, why in targets:
        L.append("| %s | **%s** | %s |" % (name, res, why))
    L.append("")
    L.append("## Caveats\n")
    L.append(
        "- Two cores run the engines, the router and the load generator together. Streaming tokens cost CPU in all "
        "three, so a router that spends more CPU per chunk also slows the simulated engines a little; the time "
        "scale and output lengths are chosen to keep the machine below saturation, but it is not idle."
    )
    L.append(
        "- The engines are simulated: timing follows vLLM's V1 scheduler (chunked prefill, prefix cache), not a "
        "GPU. Ratios between routers under identical traffic are the point, not absolute numbers."
    )
    L.append(
        "- Session mixes differ between seeds (where the few 50k–140k-token first turns fall matters most), so "
        "one seed's TTFT p95 or slowest-5% figure moves by 10–20% from seed to seed. The single-seed tables show "
        "the whole matrix; the targets are judged on the repeated seeds where they exist. The burst scenario is "
        "repeated over several seeds.\n"
    )
    L.append("## Reproduce\n")
    L.append("```sh")
    L.append("scripts/bench.sh                      # full matrix, writes BENCHMARKS.md (about 18 minutes on 2 cores)")
    L.append("scripts/bench.sh --quick              # 2 engines, fewer sessions (about 5 minutes)")
    L.append("SEED=8 scripts/bench.sh --scenarios agent --only 'infergate load_aware|vllm-router cache_aware' --md /tmp/b.md")
    L.append("")
    L.append("# one run by hand: engines, a router, then the load generator")
    L.append("target/release/engine-sim --engines 4 --base-port 8101 --time-scale 0.2 &")
    L.append("target/release/infergate -c conf/demo.yaml &   # or any OpenAI-compatible router on :8000")
    L.append("target/release/loadgen --scenario agent --url http://127.0.0.1:8000 \\")
    L.append("    --engine-stats-url http://127.0.0.1:8101 --engine-stats-url http://127.0.0.1:8102 \\")
    L.append("    --engine-stats-url http://127.0.0.1:8103 --engine-stats-url http://127.0.0.1:8104 \\")
    L.append("    --sessions 192 --rate 2 --time-scale 0.2 --output-tokens 16-160 --seed 7 --json agent.json")
    L.append("```\n")
    with open(args.md, "w") as fh:
        fh.write("\n".join(L))


if __name__ == "__main__":
    main()
