#!/usr/bin/env python3
"""Large-body figures for BENCHMARKS.md: router RSS under a flood of 8 MiB uploads, and router CPU per request
for 1 MiB prompts. Loopback only; every loop is bounded.

usage: bodies.py ROUTER_BIN SIM_BIN [--uploads 200] [--upload-mib 8] [--cpu-requests 200]

Starts engine-sim (4 engines, fast prefill) and the router binary with a minimal config on free ports, runs
both measurements and prints one JSON object. The router config uses only keys every infergate version knows,
so an older binary can be measured the same way (its body budget is then whatever it does by default).
"""
import argparse, http.client, json, os, socket, subprocess, sys, tempfile, threading, time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, limit=20.0):
    end = time.time() + limit
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


def proc_stat(pid):
    """(rss bytes, cpu seconds) of a process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    return rss, cpu


def body(mib, model_last):
    content = ("lorem ipsum dolor sit amet " * (mib * 1024 * 1024 // 27 + 1))[: mib * 1024 * 1024]
    msgs = json.dumps([{"role": "user", "content": content}])
    if model_last:
        return f'{{"messages":{msgs},"model":"sim-model","stream":false,"max_tokens":1}}'.encode()
    return f'{{"model":"sim-model","stream":false,"max_tokens":1,"messages":{msgs}}}'.encode()


def post(port, data, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", "/v1/chat/completions", body=data, headers={"content-type": "application/json"})
        r = c.getresponse()
        r.read()
        return r.status
    except Exception as e:  # a refused or reset upload counts as a failure, reported by kind
        return type(e).__name__
    finally:
        c.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("router")
    ap.add_argument("sim")
    ap.add_argument("--uploads", type=int, default=200)
    ap.add_argument("--upload-mib", type=int, default=8)
    ap.add_argument("--cpu-requests", type=int, default=200)
    a = ap.parse_args()

    ports = [free_port() for _ in range(4)]
    listen, metrics = free_port(), free_port()
    procs = []
    tmp = tempfile.mkdtemp(prefix="infergate-bodies-")
    try:
        sim = subprocess.Popen(
            [a.sim, "--ports", ",".join(map(str, ports)), "--prefill-tokens-per-sec", "100000000",
             "--max-model-len", "100000000", "--time-scale", "0.01", "--max-recorded-requests", "1"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "sim.log"), "w"))
        procs.append(sim)
        for p in ports:
            wait_port(p)
        eps = "".join(f'      - url: "http://127.0.0.1:{p}"\n' for p in ports)
        conf = os.path.join(tmp, "router.yaml")
        with open(conf, "w") as f:
            f.write(f'listen: "127.0.0.1:{listen}"\nmetrics_listen: "127.0.0.1:{metrics}"\n'
                    f"server: {{ threads: 2, grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 1, "
                    f"pid_file: {tmp}/r.pid, upgrade_sock: {tmp}/r.sock }}\n"
                    f"pools:\n  - name: default\n    models: [\"*\"]\n    policy: load_aware\n    endpoints:\n{eps}"
                    f"    health_check: {{ path: /health, interval: 1s, timeout: 1s }}\n")
        router = subprocess.Popen([a.router, "-c", conf], stdout=subprocess.DEVNULL,
                                  stderr=open(os.path.join(tmp, "router.log"), "w"), env={**os.environ, "RUST_LOG": "warn"})
        procs.append(router)
        wait_port(listen)
        time.sleep(1.5)  # first health-check round
        rss_start, _ = proc_stat(router.pid)

        # 1. Router CPU per request, 1 MiB prompts with model first (routable by every version), sequential.
        one_mib = body(1, model_last=False)
        for _ in range(5):
            post(listen, one_mib)
        _, cpu0 = proc_stat(router.pid)
        t0 = time.time()
        statuses = [post(listen, one_mib) for _ in range(a.cpu_requests)]
        _, cpu1 = proc_stat(router.pid)
        cpu = {"requests": a.cpu_requests, "ok": statuses.count(200),
               "router_cpu_ms_per_request": round((cpu1 - cpu0) * 1000 / a.cpu_requests, 3),
               "wall_s": round(time.time() - t0, 2)}

        # 2. RSS under a flood of large uploads, model last.
        big = body(a.upload_mib, model_last=True)
        results, peak = [], [0]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], proc_stat(router.pid)[0])
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        threads = [threading.Thread(target=lambda: results.append(post(listen, big))) for _ in range(a.uploads)]
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        flood_s = time.time() - t0
        stop.set()
        sampler.join()
        time.sleep(2)
        rss_after, _ = proc_stat(router.pid)
        counts = {}
        for r in results:
            counts[str(r)] = counts.get(str(r), 0) + 1
        flood = {"uploads": a.uploads, "mib_each": a.upload_mib, "statuses": counts, "wall_s": round(flood_s, 1),
                 "rss_start_mib": round(rss_start / 2**20, 1), "rss_peak_mib": round(peak[0] / 2**20, 1),
                 "rss_after_mib": round(rss_after / 2**20, 1)}
        print(json.dumps({"cpu_1mib": cpu, "flood": flood}, indent=1))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
