"""Agent sessions on real vLLM engines (the CPU build) through each router, one fresh pair of engines per run:
TTFT, decode, vLLM's own prefix-cache hit share, and infergate's predicted-vs-measured TTFT error.

Run by scripts/bench-real.sh, which builds the binaries, the vLLM venv and the peers; arguments:
  real.py --python VLLM_PYTHON --model-dir DIR --bin DIR --out DIR [--vllm-router PATH] [--smg PATH]
          [--only SUBSTRING] [--sessions N] [--rate PER_SECOND] [--seed N] [--pin] [--move-margin M]
(--pin: engine i runs on CPU i (taskset); --move-margin: infergate's sessions.move_margin, default 0.1)
Only 127.0.0.1 is used; every process started gets its own process group and is stopped after its run."""
import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

# (scenario, router, policy); an infergate policy ending in +kv also counts exact tokens with the model's own
# tokenizer and reads each engine's KV-cache events (the engines then publish them).
RUNS = [
    ("agent", "infergate", "predicted_ttft"),
    ("agent", "infergate", "predicted_ttft+kv"),
    ("agent", "infergate", "load_aware"),
    ("agent", "vllm-router", "cache_aware"),
    ("agent", "smg", "cache_aware"),
    ("shared-prefix", "infergate", "predicted_ttft"),
    ("shared-prefix", "infergate", "predicted_ttft+kv"),
    ("shared-prefix", "vllm-router", "cache_aware"),
    ("shared-prefix", "smg", "cache_aware"),
]
# Every session of shared-prefix opens with one system prompt of this many (loadgen) tokens.
SHARED_PREFIX = ["--system-prompt-tokens", "1500"]
# A load two CPU engines take: short and medium first turns (the tiny model's context is 16,384 tokens and the
# real tokenizer counts loadgen's words at about twice loadgen's own rule), a few follow-ups each.
# `--sessions`, `--rate` and `--seed` (defaults 24, 0.8, 7) change the load: a heavier one queues on the engines.
LOADGEN = ["--scenario", "agent", "--time-scale", "1", "--max-seconds", "240",
           "--first-short", "300-1500", "--first-long", "2500-4000", "--short-share", "0.6", "--long-share", "0.25",
           "--turns", "2-4", "--append-tokens", "100-600", "--think-seconds", "0.5-2", "--output-tokens", "16-64",
           "--field-order", "messages-first"]
ENGINE_ENV = dict(VLLM_TARGET_DEVICE="cpu", VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS="1",
                  VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_HOST_IP="127.0.0.1", HF_HUB_OFFLINE="1",
                  VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")


FREE_PORTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "free-ports.py")
HANDED = []


def free_port():
    """A free port below the ephemeral range, none handed out before in this run: vLLM binds its KV-event port
    seconds after it is picked, and a port from bind(0) can go to an outgoing connection meanwhile
    (scripts/free-ports.py)."""
    out = subprocess.run([sys.executable, FREE_PORTS, "1", "--not", *map(str, HANDED)],
                         check=True, capture_output=True, text=True).stdout
    HANDED.append(int(out.split()[0]))
    return HANDED[-1]


def start(cmd, log, env=None):
    f = open(log, "w")
    return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **(env or {})})


def stop(procs):
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def get(url, timeout=2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait_up(url, limit, proc):
    t0 = time.time()
    while time.time() - t0 < limit:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited")
        try:
            get(url)
            return
        except Exception:
            time.sleep(0.5)
    raise RuntimeError(f"{url}: not up after {limit}s")


def metric(text, name, want=None):
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] == name and (want is None or want in head):
            total += float(value)
    return total


def vllm_counts(urls):
    out = []
    for u in urls:
        m = get(u + "/metrics")
        out.append((metric(m, "vllm:prefix_cache_hits_total"), metric(m, "vllm:prefix_cache_queries_total")))
    return out


def engine_cmd(a, port, core=None, extra=()):
    """One vLLM engine of the test model on `port` (`a.python`, `a.model_dir`), on CPU `core` if given."""
    pin = ["taskset", "-c", str(core)] if core is not None else []
    return [*pin, a.python, "scripts/vllm/serve.py", "serve", a.model_dir, "--load-format", "dummy",
            "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny",
            "--max-model-len", "16384", "--enforce-eager", "--kv-cache-memory-bytes", "512M",
            "--max-num-seqs", "8", "--enable-prompt-tokens-details", *extra]


def one_run(a, scenario, router, policy, run_dir):
    os.makedirs(run_dir, exist_ok=True)
    procs = []
    kv = policy.endswith("+kv")
    label = f"{router} {policy}"
    try:
        urls, kv_urls = [], []
        for i in range(2):
            port = free_port()
            urls.append(f"http://127.0.0.1:{port}")
            events = []
            if kv:
                kv_port = free_port()
                kv_urls.append(f"tcp://127.0.0.1:{kv_port}")
                events = ["--kv-events-config", json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                                                            "endpoint": f"tcp://*:{kv_port}", "topic": "kv"})]
            # --pin: engine i on core i, so that one engine's work does not slow the other.
            procs.append(start(engine_cmd(a, port, i if a.pin else None, events), f"{run_dir}/engine-{i}.log",
                               ENGINE_ENV))
        for u, p in zip(urls, procs):
            wait_up(u + "/health", 180, p)
        port, mport = free_port(), free_port()
        if router == "infergate":
            if kv:
                eps = ", ".join('{url: "%s", kv_events: "%s"}' % p for p in zip(urls, kv_urls))
                extra = f'    tokenizer: {{ path: "{a.model_dir}" }}\n'
            else:
                eps = ", ".join('{url: "%s"}' % u for u in urls)
                extra = ""
            cfg = f"""listen: "127.0.0.1:{port}"
metrics_listen: "127.0.0.1:{mport}"
server: {{ threads: 2, grace_period_seconds: 1, graceful_shutdown_timeout_seconds: 1,
          pid_file: {run_dir}/infergate.pid, upgrade_sock: {run_dir}/infergate.sock }}
timeouts: {{ connect: 2s, response_header: 600s, stream_idle: 120s }}
pools:
  - name: default
    models: ["*"]
    policy: {policy.removesuffix("+kv")}
    endpoints: [{eps}]
    health_check: {{ path: /health, interval: 1s, timeout: 1s, healthy_after: 1, unhealthy_after: 3 }}
    engine_stats: {{ kind: vllm, path: /metrics, interval: 200ms }}
    sessions: {{ header: x-session-id, move_margin: {a.move_margin} }}
{extra}"""
            with open(f"{run_dir}/infergate.yaml", "w") as f:
                f.write(cfg)
            cmd = [f"{a.bin}/infergate", "-c", f"{run_dir}/infergate.yaml"]
        else:
            exe = a.vllm_router if router == "vllm-router" else a.smg
            if not exe:
                return {"label": label, "scenario": scenario, "failed": f"{router} is not installed"}
            sub = [] if router == "vllm-router" else ["launch"]
            cmd = [exe, *sub, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls, "--policy", policy,
                   "--prometheus-host", "127.0.0.1", "--prometheus-port", str(mport), "--request-timeout-secs", "600"]
        procs.append(start(cmd, f"{run_dir}/router.log"))
        wait_up(f"http://127.0.0.1:{port}/health", 60, procs[-1])
        time.sleep(2)  # health checks see both engines
        before = vllm_counts(urls)
        out = f"{run_dir}/loadgen.json"
        extra = SHARED_PREFIX if scenario == "shared-prefix" else []
        load = ["--sessions", str(a.sessions), "--rate", str(a.rate), "--seed", str(a.seed)]
        subprocess.run([f"{a.bin}/loadgen", "--url", f"http://127.0.0.1:{port}", "--model", "tiny", *load,
                        "--label", label, "--json", out, "--quiet", *LOADGEN, *extra],
                       check=True, timeout=400, stdout=subprocess.DEVNULL)
        after = vllm_counts(urls)
        rep = json.load(open(out))
        hits = sum(b[0] - a_[0] for a_, b in zip(before, after))
        queries = sum(b[1] - a_[1] for a_, b in zip(before, after))
        row = {"label": label, "scenario": scenario, "report": rep,
               "vllm_hit_share": hits / queries if queries else None, "vllm_cached_tokens": hits}
        if router == "infergate":
            m = get(f"http://127.0.0.1:{mport}/metrics")
            n = metric(m, "infergate_ttft_prediction_error_seconds_count")
            s = metric(m, "infergate_ttft_prediction_error_seconds_sum")
            row["prediction"] = {"count": n, "mean_error_s": s / n if n else None}
            # Placements by reason (summed over pools): how many turns moved off their session's engine.
            row["placements"] = {r: metric(m, "infergate_placements_total", f'reason="{r}"')
                                 for r in ("new_session", "sticky", "migrate", "rescue", "spill", "fallback")}
            if kv:
                row["kv_predicted_cached"] = metric(m, "infergate_kv_predicted_cached_tokens_total")
                row["tokenizer_fallbacks"] = metric(m, "infergate_tokenizer_fallbacks_total")
        return row
    except Exception as e:  # a failed run is reported, not fatal
        return {"label": label, "scenario": scenario, "failed": str(e)}
    finally:
        stop(procs)


def fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def table(rows):
    out = []
    for sc in dict.fromkeys(r["scenario"] for r in rows):
        out += [f"**{sc}**", "", one_table([r for r in rows if r["scenario"] == sc]), ""]
    return "\n".join(out)


def one_table(rows):
    ok = [r for r in rows if "report" in r]
    ttft = lambda r: (r["report"].get("ttft_ms") or {}).get("p95")
    dec = lambda r: (r["report"].get("decode") or {}).get("slowest5_mean_tok_s")
    peers = [r for r in ok if not r["label"].startswith("infergate")]
    bt = min((ttft(r) for r in peers if ttft(r)), default=None)
    bd = max((dec(r) for r in peers if dec(r)), default=None)
    lines = ["| router | policy | requests ok / errors | TTFT p50 ms | TTFT p95 ms | TTFT p95 / best peer | "
             "decode slowest 5% tok/s | decode / best peer | vLLM prefix-hit share | infergate predictions: "
             "count, mean signed error s | KV index: predicted cached / vLLM cached tokens |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        router, policy = r["label"].split(" ", 1)
        if "failed" in r:
            lines.append(f"| {router} | {policy} | failed: {r['failed']} | | | | | | | | |")
            continue
        rep = r["report"]
        t, d = ttft(r), dec(r)
        p = r.get("prediction")
        pred = f"{p['count']:.0f}, {fmt(p['mean_error_s'], '.3f')}" if p else "-"
        kv = r.get("kv_predicted_cached")
        kv = f"{kv:.0f} / {r['vllm_cached_tokens']:.0f}" if kv is not None else "-"
        lines.append(
            f"| {router} | {policy} | {rep['ok']} / {rep['errors']} | {fmt((rep.get('ttft_ms') or {}).get('p50'))} | "
            f"{fmt(t)} | {fmt(t / bt if t and bt else None, '.2f')}× | {fmt(d)} | "
            f"{fmt(d / bd if d and bd else None, '.2f')}× | {fmt(r['vllm_hit_share'], '.3f')} | {pred} | {kv} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    for k in ("--python", "--model-dir", "--bin", "--out"):
        ap.add_argument(k, required=True)
    ap.add_argument("--vllm-router")
    ap.add_argument("--smg")
    ap.add_argument("--only", default="")
    ap.add_argument("--sessions", type=int, default=24)
    ap.add_argument("--rate", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--pin", action="store_true")
    ap.add_argument("--move-margin", type=float, default=0.1)
    a = ap.parse_args()
    rows = []
    for scenario, router, policy in RUNS:
        if a.only and a.only not in f"{scenario} {router} {policy}":
            continue
        print(f"== bench-real: {scenario}: {router} {policy}", file=sys.stderr, flush=True)
        rows.append(one_run(a, scenario, router, policy, f"{a.out}/{scenario}-{router}-{policy}"))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "report"}), file=sys.stderr, flush=True)
    json.dump(rows, open(f"{a.out}/real.json", "w"), indent=1)
    print(table(rows))


if __name__ == "__main__":
    main()
