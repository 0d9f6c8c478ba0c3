#!/usr/bin/env python3
"""The demo's live view and summary (Python 3 standard library only; scripts/demo.sh runs it).

live:    polls the router's /status.json and /metrics once a second while loadgen runs and draws a frame: progress
         (sessions done of total, elapsed, time left), per endpoint the router's requests in flight, the engine's
         running+waiting (its busiest sample since the last frame; other tenants' requests included), the PEAK of
         prefill tokens in flight since the last frame (status.json's prefill_tokens_peak, a 2 s window polled
         every second, so nothing between frames is missed) and the placements by reason since the last frame;
         moves (migrate, rescue, spill, fallback) are listed as they happen. On a terminal the frame is redrawn in place
         every 2 s; otherwise (piped, in a test) a compact frame is printed every 6 s, without escape codes.
         --mode line: one progress line per frame instead (the comparison run).
summary: the same workload under predicted_ttft with sessions and under round_robin, side by side.
"""

import argparse
import json
import os
import re
import sys
import time
import urllib.request

MOVES = ("migrate", "rescue", "spill", "fallback")
REASONS = ("new_session", "sticky") + MOVES
PLACEMENT = re.compile(r'^infergate_placements_total\{([^}]*)\}\s+(\S+)', re.M)
LABEL = re.compile(r'(\w+)="([^"]*)"')
PROGRESS = re.compile(r'sessions (\d+)/(\d+) done (\d+)')


def fetch(url, timeout=2.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None


def placements(metrics_text):
    """(endpoint, reason) -> count, from infergate_placements_total."""
    out = {}
    for labels, value in PLACEMENT.findall(metrics_text or ""):
        lab = dict(LABEL.findall(labels))
        try:
            out[(lab.get("endpoint", "?"), lab.get("reason", "?"))] = float(value)
        except ValueError:
            pass
    return out


def last_progress(path):
    """(started, planned, done) from the last progress line loadgen wrote to `path`."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    found = PROGRESS.findall(tail)
    return tuple(int(x) for x in found[-1]) if found else None


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def mmss(s):
    s = max(0, int(round(s)))
    return f"{s // 60}:{s % 60:02d}"


def short(ep):
    return ep.rsplit(":", 1)[-1] if ep.startswith("127.") else ep


class Live:
    def __init__(self, a):
        self.a = a
        self.tty = sys.stdout.isatty() if a.tty == "auto" else a.tty == "yes"
        self.every = a.frame_seconds or (2.0 if self.tty else 6.0)
        self.start = time.monotonic()
        self.base = placements(fetch(a.metrics))
        self.prev = dict(self.base)
        self.peak = {}        # endpoint -> peak since the last frame
        self.peak_run = {}    # endpoint -> peak over the run
        self.engine = {}      # endpoint -> (running, waiting) of the engine's busiest sample since the last frame
        self.delta = {}       # (endpoint, reason) -> placements since the last frame
        self.events = []      # (elapsed, text) of moves, newest last
        self.shown = 0        # events already printed (frames without a terminal)
        self.status = None
        self.scale = 16384

    def poll(self):
        st = fetch(self.a.status)
        if st:
            try:
                self.status = json.loads(st)
            except ValueError:
                pass
        if self.status:
            for pool in self.status.get("pools", []):
                for e in pool.get("endpoints", []):
                    ep, p = e["endpoint"], e.get("prefill_tokens_peak", e.get("prefill_tokens", 0))
                    self.peak[ep] = max(self.peak.get(ep, 0), p)
                    self.peak_run[ep] = max(self.peak_run.get(ep, 0), p)
                    eng = e.get("engine_stats") or {}
                    if eng.get("running") is not None:
                        seen = (eng["running"], eng.get("waiting") or 0)
                        self.engine[ep] = max(self.engine.get(ep, (0, 0)), seen, key=lambda x: (x[1], x[0]))
        now = placements(fetch(self.a.metrics))
        moved = {}
        for k, v in now.items():
            d = v - self.prev.get(k, 0)
            if d > 0:
                self.delta[k] = self.delta.get(k, 0) + d
                if k[1] in MOVES:
                    moved[k] = d
        if now:
            self.prev = now
        if moved:
            t = time.monotonic() - self.start
            text = ", ".join(f"{r} x{int(n)} -> {short(ep)}" for (ep, r), n in sorted(moved.items()))
            self.events.append((t, text))
            if len(self.events) > self.a.events:
                self.shown = max(0, self.shown - (len(self.events) - self.a.events))
                del self.events[:-self.a.events]

    def totals(self):
        out = {r: 0 for r in REASONS}
        for (ep, r), v in self.prev.items():
            out[r] = out.get(r, 0) + int(v - self.base.get((ep, r), 0))
        return out

    def progress(self, final):
        """(started, planned, done): loadgen's report once written, else its last progress line."""
        r = load(self.a.report) if final and self.a.report else None
        if r and r.get("sessions"):
            c = r["sessions"]
            return c.get("started", 0), c.get("planned", 0), c.get("completed", 0) + c.get("failed", 0)
        return last_progress(self.a.progress)

    def frame(self, final=False):
        t = time.monotonic() - self.start
        prog = self.progress(final)
        head = f"{self.a.label}  {mmss(t)} elapsed"
        if final:
            head += ", finished"
        else:
            limit = self.a.max_seconds - t
            if prog and prog[2] >= max(2, prog[1] // 8):
                left = min(limit, t * (prog[1] - prog[2]) / prog[2])
                head += f", ~{mmss(left)} left (at most {mmss(limit)})"
            else:
                head += f", at most {mmss(limit)} left"
        if prog:
            head += f"  |  sessions {prog[2]} of {prog[1]} done, {prog[0]} started"
        lines = [head]
        if self.a.mode == "line":
            return lines
        for p in self.a.pressure:
            at, _, text = p.partition(":")
            if float(at) <= t < float(at) + self.a.pressure_seconds:
                lines.append(f">>> pressure: {text}")
        eps = []
        if self.status:
            for pool in self.status.get("pools", []):
                eps += pool.get("endpoints", [])
        self.scale = max([self.scale] + list(self.peak.values()))
        bar_char = "\u2588" if self.tty else "#"
        width = 16
        lines.append(f"{'endpoint':<16}{'reqs':>5}{'engine':>10}  {'prefill peak':<{width + 9}} "
                     "placements since last frame")
        for e in eps:
            ep = e["endpoint"]
            queued = "%d+%d" % self.engine[ep] if ep in self.engine else "-"
            peak = self.peak.get(ep, 0)
            bar = bar_char * int(round(width * peak / self.scale)) if peak else ""
            by = {r: int(n) for (x, r), n in self.delta.items() if x == ep}
            order = sorted(by.items(), key=lambda x: REASONS.index(x[0]) if x[0] in REASONS else 99)
            placed = " ".join(f"{r} {n}" for r, n in order)
            lines.append(f"{ep:<16}{e.get('requests_in_flight', 0):>5}{queued:>10}  {peak:>8} {bar:<{width}} {placed}")
        tot = self.totals()
        lines.append("moves so far: " + ", ".join(f"{r} {tot.get(r, 0)}" for r in MOVES)
                     + "  (new_session " + str(tot.get("new_session", 0)) + ", sticky " + str(tot.get("sticky", 0))
                     + ")")
        if self.tty:
            lines.append("latest moves:" + ("" if self.events else " none yet"))
            for at, text in reversed(self.events):
                lines.append(f"  {mmss(at)}  {text}")
        else:
            new = self.events[self.shown:]
            if new:
                lines.append("moves: " + "; ".join(f"{mmss(at)} {x}" for at, x in new))
        self.shown = len(self.events)
        self.peak = {}
        self.delta = {}
        self.engine = {}
        return lines

    def draw(self, lines):
        if self.a.mode == "line" and self.tty:
            sys.stdout.write("\r" + lines[0] + "\x1b[K")
        elif self.tty:
            sys.stdout.write("\x1b[H" + "".join(l + "\x1b[K\n" for l in lines) + "\x1b[J")
        else:
            sys.stdout.write("\n".join(lines) + ("\n" if self.a.mode == "line" else "\n\n"))
        sys.stdout.flush()

    def run(self):
        if self.tty and self.a.mode == "full":
            sys.stdout.write("\x1b[2J")
        next_frame = time.monotonic() + self.every
        deadline = time.monotonic() + self.a.max_seconds + 30
        while alive(self.a.pid) and time.monotonic() < deadline:
            time.sleep(1.0)
            self.poll()
            if time.monotonic() >= next_frame:
                self.draw(self.frame())
                next_frame += self.every
        self.poll()
        lines = self.frame(final=True)
        if self.tty:
            self.draw(lines)
            if self.a.mode == "line":
                sys.stdout.write("\n")
        else:
            sys.stdout.write("\n".join(lines) + "\n")
        if self.a.totals_out:
            with open(self.a.totals_out, "w") as f:
                json.dump({"moves": self.totals(), "prefill_peak": self.peak_run}, f)


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def summary(a):
    runs = [(a.label_a, load(a.a), load(a.totals_a)), (a.label_b, load(a.b), None)]

    def ttft(r):
        p = (r or {}).get("ttft_ms") or {}
        return f"{p['p95']:.0f} ms" if "p95" in p else "-"

    def decode(r):
        d = (r or {}).get("decode") or {}
        return f"{d['slowest5_mean_tok_s']:.1f} tok/s" if "slowest5_mean_tok_s" in d else "-"

    def hits(r):
        # From the usage the engines reported to these requests (the pressure prompts are not in it).
        prompt, cached = (r or {}).get("usage_prompt_tokens", 0), (r or {}).get("usage_cached_tokens", 0)
        return f"{100 * cached / prompt:.1f}%" if prompt else "-"

    def done(r):
        s = (r or {}).get("sessions") or {}
        return f"{s.get('completed', 0)}/{s.get('planned', 0)}" + (" (stopped)" if (r or {}).get("timed_out") else "")

    def moves(t):
        if not t:
            return "none (no sessions to move)"
        m = t.get("moves", {})
        return ", ".join(f"{r} {m.get(r, 0)}" for r in MOVES)

    w = max(34, max(len(l) for l, _, _ in runs) + 2, max(len(moves(t)) for _, _, t in runs) + 2)
    rows = [("", [l for l, _, _ in runs]), ("sessions completed", [done(r) for _, r, _ in runs]),
            ("TTFT p95 (lower is better)", [ttft(r) for _, r, _ in runs]),
            ("slowest 5% decode, mean", [decode(r) for _, r, _ in runs]),
            ("prefix cache hit share", [hits(r) for _, r, _ in runs]),
            ("moves", [moves(t) for _, _, t in runs])]
    for name, cells in rows:
        print(f"{name:<28}" + "".join(f"{c:<{w}}" for c in cells).rstrip())
    try:
        (a_ttft, b_ttft) = (r["ttft_ms"]["p95"] for _, r, _ in runs)
        (a_dec, b_dec) = (r["decode"]["slowest5_mean_tok_s"] for _, r, _ in runs)
        (a_hit, b_hit) = (r["usage_cached_tokens"] / r["usage_prompt_tokens"] for _, r, _ in runs)
        ratio = (f"{b_ttft / a_ttft:.1f}x lower" if b_ttft >= a_ttft else f"{a_ttft / b_ttft:.1f}x higher")
        print(f"{runs[0][0]}: TTFT p95 {ratio} than {runs[1][0]}'s, slowest 5% decode {a_dec - b_dec:+.1f} tok/s, "
              f"prefix cache hit share {100 * (a_hit - b_hit):+.1f} points.")
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        pass


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    lv = sub.add_parser("live")
    lv.add_argument("--status", required=True, help="the router's /status.json URL")
    lv.add_argument("--metrics", required=True, help="the router's /metrics URL")
    lv.add_argument("--progress", required=True, help="loadgen's stderr (its progress lines)")
    lv.add_argument("--pid", type=int, required=True, help="draw while this process (loadgen) runs")
    lv.add_argument("--max-seconds", type=float, required=True, help="loadgen's --max-seconds")
    lv.add_argument("--report", help="loadgen's --json file (read for the final frame)")
    lv.add_argument("--label", default="predicted_ttft")
    lv.add_argument("--mode", choices=("full", "line"), default="full", help="full view or one progress line")
    lv.add_argument("--tty", choices=("auto", "yes", "no"), default="auto")
    lv.add_argument("--frame-seconds", type=float, default=0.0)
    lv.add_argument("--events", type=int, default=6, help="latest moves listed")
    lv.add_argument("--pressure", action="append", default=[], metavar="SECONDS:TEXT",
                    help="a moment of pressure starts SECONDS into the run (repeatable)")
    lv.add_argument("--pressure-seconds", type=float, default=5.0, help="how long its banner shows")
    lv.add_argument("--totals-out", help="write the run's placement counts here (JSON)")
    sm = sub.add_parser("summary")
    sm.add_argument("--a", required=True, help="loadgen JSON of the first run")
    sm.add_argument("--totals-a", help="live --totals-out of the first run")
    sm.add_argument("--label-a", default="predicted_ttft + sessions")
    sm.add_argument("--b", required=True, help="loadgen JSON of the second run")
    sm.add_argument("--label-b", default="round_robin")
    a = p.parse_args()
    try:
        if a.cmd == "live":
            Live(a).run()
        else:
            summary(a)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
