#!/usr/bin/env python3
"""Slow and idle clients against a running infergate on loopback (driven by scripts/attack.sh).

Phases, each bounded in connections and time:
  baseline   probes only
  slowloris  N connections sending their request header one byte per second
  half-sent  M connections sending part of a request header, then nothing (R rounds: does memory get reused?)
  stalled    K connections sending a whole header and half the body, then nothing
  idle       K keep-alive connections idle after one request (runs together with `stalled`)
  after      probes only

Throughout, once a second: a chat completion on a keep-alive connection opened before the attack, one on a fresh
connection, GET /health on the proxy port, GET /metrics and GET /health on the metrics port (with the engines'
`infergate_endpoint_healthy`), and the router's resident set and open descriptors from /proc.
Prints a JSON report on stdout. Standard library only.
"""

import argparse
import asyncio
import json
import os
import resource
import sys
import time

CHAT = (
    b'{"model":"sim-model","max_tokens":4,"stream":false,'
    b'"messages":[{"role":"user","content":"hello from a normal client"}]}'
)


def now():
    return time.monotonic()


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def summary(xs):
    if not xs:
        return {"n": 0}
    return {
        "n": len(xs),
        "min": round(min(xs), 2),
        "p50": round(pct(xs, 50), 2),
        "p99": round(pct(xs, 99), 2),
        "max": round(max(xs), 2),
    }


async def read_response(reader, limit):
    """One HTTP/1.1 response (Content-Length or chunked): (status, body)."""

    async def go():
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        hdr = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                hdr[k.strip().lower()] = v.strip()
        if "content-length" in hdr:
            body = await reader.readexactly(int(hdr["content-length"]))
        elif hdr.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int((await reader.readuntil(b"\r\n")).strip().split(b";")[0], 16)
                chunk = await reader.readexactly(size + 2)
                if size == 0:
                    break
                body += chunk[:-2]
        else:
            body = await reader.read()
        return status, body, hdr

    return await asyncio.wait_for(go(), limit)


async def request(host, port, method, path, body=None, limit=5.0, conn=None):
    """(status or error string, seconds, body). `conn` = (reader, writer) reuses a keep-alive connection."""
    t0 = now()
    own = conn is None
    try:
        if own:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), limit)
        else:
            reader, writer = conn
        req = f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\n".encode()
        if body is not None:
            req += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        if own:
            req += b"Connection: close\r\n"
        req += b"\r\n" + (body or b"")
        writer.write(req)
        await writer.drain()
        status, rbody, _ = await read_response(reader, limit)
        if own:
            writer.close()
        return status, now() - t0, rbody
    except Exception as e:  # noqa: BLE001 - any failure is a probe result
        return type(e).__name__, now() - t0, b""


class Probes:
    def __init__(self, args):
        self.a = args
        self.phase = "baseline"
        self.rows = []
        self.keep = None

    async def keepalive_chat(self):
        """A chat completion on the connection opened before the attack (reopened next time if it broke)."""
        a = self.a
        if self.keep is None:
            try:
                self.keep = await asyncio.wait_for(asyncio.open_connection(a.host, a.port), 5)
            except Exception as e:  # noqa: BLE001
                return "connect:" + type(e).__name__, 0.0, b""
        res = await request(a.host, a.port, "POST", "/v1/chat/completions", CHAT, conn=self.keep)
        if res[0] != 200:
            self.keep[1].close()
            self.keep = None
        return res

    async def once(self):
        a = self.a
        keep, fresh, health, metrics, mhealth = await asyncio.gather(
            self.keepalive_chat(),
            request(a.host, a.port, "POST", "/v1/chat/completions", CHAT),
            request(a.host, a.port, "GET", "/health"),
            request(a.host, a.mport, "GET", "/metrics"),
            request(a.host, a.mport, "GET", "/health"),
        )
        healthy = []
        gauges = {}
        if metrics[0] == 200:
            for line in metrics[2].decode().splitlines():
                if line.startswith("infergate_endpoint_healthy{"):
                    healthy.append(float(line.rsplit(" ", 1)[1]))
                for name in (
                    "infergate_client_connections",
                    "infergate_client_connections_refused_total",
                    "infergate_client_connections_evicted_total",
                    "infergate_client_header_timeouts_total",
                ):
                    if line.startswith(name + " "):
                        gauges[name] = float(line.rsplit(" ", 1)[1])
                if line.startswith('infergate_router_responses_total{code="408"}'):
                    gauges["responses_408"] = float(line.rsplit(" ", 1)[1])
        self.rows.append(
            {
                "t": round(now() - self.a.t0, 2),
                "phase": self.phase,
                "keepalive_chat": [keep[0], round(keep[1] * 1000, 1)],
                "fresh_chat": [fresh[0], round(fresh[1] * 1000, 1)],
                "proxy_health": [health[0], round(health[1] * 1000, 1)],
                "metrics": [metrics[0], round(metrics[1] * 1000, 1)],
                "metrics_health": [mhealth[0], round(mhealth[1] * 1000, 1)],
                "engines_healthy": healthy,
                "rss_mb": rss_mb(self.a.pid),
                "fds": fd_count(self.a.pid),
                **gauges,
            }
        )

    async def run(self, stop):
        while not stop.is_set():
            t = now()
            await self.once()
            try:
                await asyncio.wait_for(stop.wait(), max(0.0, 1.0 - (now() - t)))
            except asyncio.TimeoutError:
                pass


def rss_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def fd_count(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


async def wait_closed(reader, limit):
    """Seconds until the peer closes (EOF or reset), None if still open at `limit`; and any bytes received."""
    t0 = now()
    got = b""
    try:
        while True:
            left = limit - (now() - t0)
            if left <= 0:
                return None, got
            data = await asyncio.wait_for(reader.read(4096), left)
            if not data:
                return now() - t0, got
            got += data
    except asyncio.TimeoutError:
        return None, got
    except (ConnectionError, OSError):
        return now() - t0, got


async def open_conn(a):
    t0 = now()
    reader, writer = await asyncio.wait_for(asyncio.open_connection(a.host, a.port), 10)
    return reader, writer, now() - t0


SLOW_HEADER = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Slow: "
    + b"a" * 400
    + b"\r\n\r\n"
)


async def slowloris_one(a, limit):
    try:
        reader, writer, _ = await open_conn(a)
    except Exception as e:  # noqa: BLE001
        return {"connect_error": type(e).__name__}

    async def trickle():
        for b in SLOW_HEADER:
            try:
                writer.write(bytes([b]))
                await writer.drain()
            except Exception:  # noqa: BLE001
                return
            await asyncio.sleep(1.0)

    t = asyncio.ensure_future(trickle())
    closed, got = await wait_closed(reader, limit)
    t.cancel()
    writer.close()
    return {"closed_after": closed, "answered": bool(got)}


HALF = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n"


async def half_sent_one(a, limit):
    try:
        reader, writer, _ = await open_conn(a)
    except Exception as e:  # noqa: BLE001
        return {"connect_error": type(e).__name__}
    try:
        writer.write(HALF)
        await writer.drain()
    except Exception:  # noqa: BLE001
        pass
    closed, got = await wait_closed(reader, limit)
    writer.close()
    return {"closed_after": closed, "answered": bool(got)}


async def stalled_one(a, limit):
    try:
        reader, writer, _ = await open_conn(a)
    except Exception as e:  # noqa: BLE001
        return {"connect_error": type(e).__name__}
    body = CHAT.ljust(1000, b" ")
    t0 = now()
    try:
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body[:500]
        )
        await writer.drain()
        status, _, _ = await read_response(reader, limit)
        out = {"status": status, "after": now() - t0}
    except Exception as e:  # noqa: BLE001
        out = {"status": type(e).__name__, "after": now() - t0}
    writer.close()
    return out


async def idle_one(a, limit):
    try:
        reader, writer, _ = await open_conn(a)
    except Exception as e:  # noqa: BLE001
        return {"connect_error": type(e).__name__}
    try:
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        status, _, _ = await read_response(reader, 10)
    except Exception as e:  # noqa: BLE001
        writer.close()
        return {"first": type(e).__name__}
    closed, got = await wait_closed(reader, limit)
    writer.close()
    return {"first": status, "closed_after": closed}


async def in_waves(make, n, wave, gap):
    tasks = []
    for i in range(0, n, wave):
        tasks += [asyncio.ensure_future(make()) for _ in range(min(wave, n - i))]
        await asyncio.sleep(gap)
    return await asyncio.gather(*tasks)


KINDS = {"slowloris": slowloris_one, "half-sent": half_sent_one, "stalled": stalled_one, "idle": idle_one}
PER_WORKER = 8000  # connections per worker process (each process has its own open-files limit)


async def worker(a):
    """--worker KIND --count N: run N connections of one kind in this process, print their results."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = a.count + 100
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            sys.exit(f"worker needs {need} open files, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    one = KINDS[a.worker]
    res = await in_waves(lambda: one(a, a.limit), a.count, a.wave, 0.1)
    print(json.dumps(res))


async def in_workers(a, kind, n, limit, wave):
    """Run n connections of `kind` in worker processes of at most PER_WORKER each, in parallel."""
    procs = []
    left = n
    while left > 0:
        k = min(PER_WORKER, left)
        left -= k
        procs.append(
            await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--worker", kind, "--count", str(k), "--limit", str(limit),
                "--wave", str(max(1, wave // max(1, -(-n // PER_WORKER)))),
                "--port", str(a.port), "--mport", str(a.mport), "--pid", str(a.pid),
                stdout=asyncio.subprocess.PIPE,
            )
        )
    out = []
    for p in procs:
        data, _ = await p.communicate()
        if p.returncode != 0:
            sys.exit(f"worker for {kind} failed ({p.returncode})")
        out += json.loads(data)
    return out


def closes(results, early_below):
    """Split connection results into closed early (within `early_below` s of connecting: refused at the cap, or
    closed to make room for a newer one), closed by the header deadline, still open at the phase limit, and
    connect errors."""
    refused, timed, still_open, errors, answered = [], [], 0, {}, 0
    for r in results:
        if "connect_error" in r:
            errors[r["connect_error"]] = errors.get(r["connect_error"], 0) + 1
            continue
        if r.get("answered"):
            answered += 1
        c = r.get("closed_after")
        if c is None:
            still_open += 1
        elif c < early_below:
            refused.append(c)
        else:
            timed.append(c)
    return {
        "connections": len(results),
        "closed_early_cap": summary(refused),
        "closed_by_timeout": summary(timed),
        "still_open_at_limit": still_open,
        "connect_errors": errors,
        "got_bytes": answered,
    }


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--mport", type=int, required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--slowloris", type=int, default=1000)
    p.add_argument("--half-sent", type=int, default=20000)
    p.add_argument("--half-sent-rounds", type=int, default=2)
    p.add_argument("--stalled", type=int, default=1000)
    p.add_argument("--idle", type=int, default=1000)
    p.add_argument("--header-timeout", type=float, default=10.0)
    p.add_argument("--body-timeout", type=float, default=60.0)
    p.add_argument("--idle-timeout", type=float, default=60.0)
    p.add_argument("--worker", choices=sorted(KINDS), help=argparse.SUPPRESS)
    p.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--limit", type=float, default=0, help=argparse.SUPPRESS)
    p.add_argument("--wave", type=int, default=500, help=argparse.SUPPRESS)
    a = p.parse_args()
    a.t0 = now()
    if a.host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("loopback only")
    if a.worker:
        await worker(a)
        return

    probes = Probes(a)
    stop = asyncio.Event()
    prober = asyncio.ensure_future(probes.run(stop))
    report = {"limits": vars(a).copy()}
    for k in ("t0", "worker", "count", "limit", "wave"):
        report["limits"].pop(k)
    phase_t = {}

    def begin(name):
        probes.phase = name
        phase_t[name] = round(now() - a.t0, 1)
        print(f"[{phase_t[name]:6.1f}s] {name}", file=sys.stderr)

    begin("baseline")
    await asyncio.sleep(5)

    begin("slowloris")
    limit = a.header_timeout * 3 + 10
    res = await in_workers(a, "slowloris", a.slowloris, limit, 500)
    report["slowloris"] = closes(res, a.header_timeout * 0.8)
    begin("settle-1")
    await asyncio.sleep(3)

    report["half_sent"] = []
    for i in range(1, a.half_sent_rounds + 1):
        begin(f"half-sent-{i}")
        res = await in_workers(a, "half-sent", a.half_sent, a.header_timeout * 3 + 10, 1000)
        report["half_sent"].append(closes(res, a.header_timeout * 0.8))
        begin(f"settle-{i + 1}")
        await asyncio.sleep(5)
        report["half_sent"][-1]["rss_mb_after_settle"] = rss_mb(a.pid)

    begin("stalled+idle")
    stalled, idle = await asyncio.gather(
        in_workers(a, "stalled", a.stalled, a.body_timeout * 1.5 + 10, 500),
        in_workers(a, "idle", a.idle, a.idle_timeout * 1.5 + 10, 500),
    )
    codes = {}
    for r in stalled:
        k = str(r.get("status", r.get("connect_error")))
        codes[k] = codes.get(k, 0) + 1
    report["stalled_body"] = {
        "connections": len(stalled),
        "status": codes,
        "answered_after": summary([r["after"] for r in stalled if r.get("status") == 408]),
    }
    report["idle_keepalive"] = {
        "connections": len(idle),
        "first_request": {
            str(k): sum(1 for r in idle if r.get("first", r.get("connect_error")) == k)
            for k in {r.get("first", r.get("connect_error")) for r in idle}
        },
        "closed_after": summary([r["closed_after"] for r in idle if r.get("closed_after") is not None]),
        "still_open_at_limit": sum(1 for r in idle if "first" in r and r.get("closed_after") is None),
    }

    begin("after")
    await asyncio.sleep(10)
    stop.set()
    await prober
    if probes.keep is not None:
        probes.keep[1].close()

    report["phase_start_s"] = phase_t
    by_phase = {}
    for row in probes.rows:
        ph = by_phase.setdefault(row["phase"], {"probes": 0, "rss_mb_max": 0, "fds_max": 0})
        ph["probes"] += 1
        for k in ("keepalive_chat", "fresh_chat", "proxy_health", "metrics", "metrics_health"):
            st = row[k][0]
            ok = ph.setdefault(k + "_ok", 0)
            ph[k + "_ok"] = ok + (st == 200)
            if st == 200:
                ph.setdefault(k + "_ms", []).append(row[k][1])
            else:
                fails = ph.setdefault(k + "_failed", {})
                fails[str(st)] = fails.get(str(st), 0) + 1
        ph["engines_all_healthy"] = ph.get("engines_all_healthy", 0) + (
            bool(row["engines_healthy"]) and all(v == 1.0 for v in row["engines_healthy"])
        )
        ph["rss_mb_max"] = max(ph["rss_mb_max"], row["rss_mb"] or 0)
        ph["fds_max"] = max(ph["fds_max"], row["fds"] or 0)
        ph["client_connections_max"] = max(
            ph.get("client_connections_max", 0), row.get("infergate_client_connections", 0)
        )
    for ph in by_phase.values():
        for k in list(ph):
            if k.endswith("_ms"):
                ph[k] = {"p50": pct(ph[k], 50), "max": max(ph[k])}
    report["probes_by_phase"] = by_phase
    report["rss_mb"] = {
        "baseline": probes.rows[0]["rss_mb"],
        "max": max(r["rss_mb"] or 0 for r in probes.rows),
        "after": probes.rows[-1]["rss_mb"],
    }
    last = probes.rows[-1]
    report["final_counters"] = {
        k: last.get(k)
        for k in (
            "infergate_client_connections",
            "infergate_client_connections_refused_total",
            "infergate_client_connections_evicted_total",
            "infergate_client_header_timeouts_total",
            "responses_408",
        )
    }
    report["probe_rows"] = probes.rows
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
